#!/usr/bin/env python3
"""CPU of `railtrace view` against `railtrace capture`, from a twin in its own process.

The twin serves 8 channels at RATE (default 100 kS/s); the same rig is then captured for
SECONDS three ways, one after the other: `capture` alone, `view --port` with no page open,
and `view --port` with the page open in headless Chromium. Prints each one's CPU (user +
system, from /proc) as a share of one core, and the ratios measured in this one run.

Usage: view_cpu.py RAILTRACE [SECONDS] [RATE]   (selenium, Chromium and its driver)
"""
import os
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK  # utime, stime


def measure(cmd, seconds, page=False):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    driver = None
    if page:
        url = p.stdout.readline().strip()
        opts = Options()
        opts.binary_location = "/usr/bin/chromium"
        for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", f"--user-data-dir={tempfile.mkdtemp()}", "--window-size=1400,850"]:
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
        driver.get(url)
    time.sleep(3)  # past the start
    c0, t0 = cpu_s(p.pid), time.time()
    time.sleep(seconds)
    c1, t1 = cpu_s(p.pid), time.time()
    if driver:
        drawn = driver.execute_script("return window.railtraceView.drawn")
        driver.quit()
    else:
        drawn = None
    p.terminate()
    p.wait()
    return (c1 - c0) / (t1 - t0), drawn


def main():
    rt = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20
    rate = sys.argv[3] if len(sys.argv) > 3 else "100000"
    work = tempfile.mkdtemp()
    twin = subprocess.Popen([rt, "twin", "serve"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = twin.stdout.readline().strip()
    try:
        base = ["--port", port, "--rate", rate]
        cap, _ = measure([rt, "capture", *base, "-o", f"{work}/c.arrow", "--force"], seconds)
        bare, _ = measure([rt, "view", *base, "--listen", "127.0.0.1:0", "-o", f"{work}/v.arrow", "--force"], seconds)
        shown, drawn = measure([rt, "view", *base, "--listen", "127.0.0.1:0", "-o", f"{work}/p.arrow", "--force"],
                               seconds, page=True)
    finally:
        twin.terminate()
        twin.wait()
    print(f"8 channels at {rate} S/s, {seconds:.0f} s each, CPU as a share of one core:")
    print(f"  capture            {cap:.3f}")
    print(f"  view, no page      {bare:.3f}  ({bare / cap:.2f} x capture)")
    print(f"  view, page open    {shown:.3f}  ({shown / cap:.2f} x capture)")
    print(f"  the page drew: {drawn}")


if __name__ == "__main__":
    main()
