#!/usr/bin/env python3
"""The live view in a real browser: `railtrace view --twin` opened in headless Chromium.

Checks what a person would see: every rail and the total plotted, trigger marks and the
twin's kernels and GPU logger readings present, the status numbers moving; then that the
recording written meanwhile holds every sample the status counted (viewing costs no data),
and that the server refused a page of another site. Keeps a screenshot.

Usage: view_browser.py RAILTRACE SCREENSHOT.png   (needs selenium, Chromium and its driver)
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service


def main():
    railtrace, screenshot = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="railtrace-view-")
    recording = os.path.join(tmp, "view.arrow")
    view = subprocess.Popen(
        [railtrace, "view", "--twin", "--listen", "127.0.0.1:0", "--seconds", "40", "-o", recording],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = view.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url

    # Another site's page reaching it by a name that resolves here is refused.
    req = urllib.request.Request(url, headers={"Host": "attacker.example"})
    try:
        urllib.request.urlopen(req)
        raise AssertionError("a foreign Host was served")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code

    opts = Options()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={tmp}/chromium", "--window-size=1400,850"]:
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")),
                              options=opts)
    try:
        driver.get(url)
        state = lambda: driver.execute_script(
            "const S = window.railtraceView; return JSON.stringify({drawn: S.drawn, names: S.names,"
            " messages: S.messages, samples: document.getElementById('samples').textContent,"
            " rate: document.getElementById('rate').textContent,"
            " link: document.getElementById('link').textContent})")
        deadline = time.time() + 25
        s = None
        while time.time() < deadline:
            s = json.loads(state())
            d = s["drawn"] or {}
            if (d.get("series", 0) == len(s["names"]) > 1 and d.get("points", 0) > 1000 and d.get("edges", 0) > 0
                    and d.get("logger", 0) > 0 and d.get("executions", 0) > 0 and s["rate"] != "–"):
                break
            time.sleep(0.5)
        print("page:", json.dumps(s))
        d = s["drawn"]
        assert d["series"] == len(s["names"]) > 1, f"series plotted: {d}"
        assert d["points"] > 1000, f"points plotted: {d}"
        assert d["edges"] > 0, f"no trigger marks: {d}"
        assert d["logger"] > 0 and d["executions"] > 0, f"no GPU side: {d}"
        assert s["link"] == "connected", s["link"]
        # The status numbers move.
        first = s["samples"]
        time.sleep(1.5)
        later = json.loads(state())
        assert later["samples"] != first, f"samples still {first}"
        assert later["rate"].endswith("S/s") and later["rate"] != "0S/s", later["rate"]
        # What a person sees: the total's dark line and the rails' colours on the canvas.
        colours = driver.execute_script("""
            const c = document.getElementById('plot'), x = c.getContext('2d');
            const d = x.getImageData(0, 0, c.width, c.height).data;
            const want = {total: [0x20, 0x20, 0x20], rail0: [0x4e, 0x79, 0xa7], logger: [0x8e, 0x3b, 0xa0]};
            const n = {};
            for (const k in want) n[k] = 0;
            for (let i = 0; i < d.length; i += 4)
              for (const k in want) {
                const w = want[k];
                if (Math.abs(d[i] - w[0]) < 12 && Math.abs(d[i+1] - w[1]) < 12 && Math.abs(d[i+2] - w[2]) < 12) n[k]++;
              }
            return n;""")
        print("pixels:", colours)
        assert all(v > 200 for v in colours.values()), colours
        driver.save_screenshot(screenshot)
        print("screenshot:", screenshot)
    finally:
        driver.quit()
    view.terminate()
    out, err = view.communicate(timeout=30)
    print(err.strip())
    assert view.returncode in (0, -15), view.returncode

    # Viewing costs no data: the recording holds a gapless stream.
    info = json.loads(subprocess.run([railtrace, "inspect", recording, "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    assert info["rows"]["sample"] > 0 or info["rows"].get("block", 0) > 0, info["rows"]
    assert not info["gaps"], info["gaps"]
    print("recording:", info["rows"], "gaps none")

    # The recording browsed: its whole length, then zoomed in with the wheel.
    view = subprocess.Popen([railtrace, "view", recording, "--listen", "127.0.0.1:0", "--seconds", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = view.stdout.readline().strip()
    driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")),
                              options=opts)
    try:
        driver.get(url)
        drawn = lambda: driver.execute_script("return window.railtraceView.drawn")
        wait(lambda: (drawn() or {}).get("points", 0) > 1000, "the whole recording drawn")
        whole = drawn()
        print("whole:", whole)
        assert whole["series"] == 5, whole
        driver.execute_script("""
            const c = document.getElementById('plot'), r = c.getBoundingClientRect();
            for (let i = 0; i < 12; i++)
              c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width / 2,
                                                       clientY: r.top + r.height / 2, bubbles: true}));""")
        span = whole["t1"] - whole["t0"]
        wait(lambda: drawn()["t1"] - drawn()["t0"] < span / 5 and drawn()["points"] > 500
             and driver.execute_script("return window.railtraceView.file.t1 - window.railtraceView.file.t0") < span / 5,
             "the zoomed window drawn")
        zoomed = drawn()
        print("zoomed:", zoomed)
        assert zoomed["edges"] > 0, f"no trigger marks zoomed in: {zoomed}"
        driver.save_screenshot(screenshot.replace(".png", "-recording.png"))
    finally:
        driver.quit()
        view.terminate()
        view.wait()


def wait(ok, what, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if ok():
            return
        time.sleep(0.3)
    raise AssertionError(f"not within {seconds} s: {what}")


if __name__ == "__main__":
    main()
