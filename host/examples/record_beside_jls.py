#!/usr/bin/env python3
"""railtrace's recorder beside Joulescope's JLS writer (pyjls), in one run.

railtrace: `record_throughput` (this folder) decodes a stored stream of 8 channels at
100 kS/s, as the rig's firmware sends it (COBS frames, CRC-32C each), and records it: codes,
per-block volts, amperes and watts summaries (min/max/mean), chunks sealed with CRC-32C.
pyjls: the same number of samples of 8 signals, handed to its writer as ready arrays
(it decodes nothing), once as float32 (what Joulescope's own files hold) and once as int16
codes (the bytes railtrace keeps). The three take turns, ROUNDS times; the medians and
their ratios are printed.

pyjls comes from PyPI: where `import pyjls` fails, a virtual environment is made in
target/pyjls-venv with pyjls and numpy, and the script runs again in it.

Usage: python3 host/examples/record_beside_jls.py [SECONDS] [ROUNDS]   (default 20, 3)
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
RATE = 100_000
CHANNELS = 8

try:
    import numpy as np
    import pyjls
except ImportError:
    env = ROOT / "target" / "pyjls-venv"
    python = env / "bin" / "python"
    if os.environ.get("RAILTRACE_JLS_VENV"):
        sys.exit(f"pyjls is not importable even in {env}")
    if not python.exists():
        print(f"pyjls not found: installing it from PyPI into {env}", flush=True)
        venv.create(env, with_pip=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "pyjls", "numpy"], check=True)
    os.environ["RAILTRACE_JLS_VENV"] = "1"
    os.execv(python, [str(python), *sys.argv])


def railtrace_once(seconds):
    """One run of record_throughput: (samples a second, bytes a sample)."""
    out = subprocess.run(
        [TARGET / "release" / "examples" / "record_throughput", str(seconds)],
        check=True, capture_output=True, text=True,
    ).stdout
    m = re.search(r"decode \+ record: .*= ([\d.]+) M samples/s .*\(([\d.]+) B/sample\)", out)
    if not m:
        sys.exit(f"record_throughput printed no figures:\n{out}")
    return float(m.group(1)) * 1e6, float(m.group(2))


def jls_once(data, path):
    """pyjls writes `data` (channels x samples) as 8 signals: (samples a second, bytes a sample)."""
    n = data.shape[1]
    kind = {np.float32: pyjls.DataType.F32, np.int16: pyjls.DataType.I16}[data.dtype.type]
    start = time.perf_counter()
    with pyjls.Writer(str(path)) as w:
        w.source_def(source_id=1, name="bench", vendor="-", model="-", version="-",
                     serial_number="-")
        for c in range(CHANNELS):
            w.signal_def(c + 1, source_id=1, sample_rate=RATE, data_type=kind,
                         name=f"ch{c}", units="A" if c % 2 == 0 else "V")
        for at in range(0, n, RATE):  # a second at a time, as a recorder gets it
            for c in range(CHANNELS):
                w.fsr(c + 1, at, data[c, at:at + RATE])
    rate = n / (time.perf_counter() - start)
    size = path.stat().st_size
    path.unlink()
    return rate, size / n


def main():
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print("building record_throughput (release)...", flush=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "railtrace", "--example",
                    "record_throughput"], cwd=ROOT, check=True)
    n = seconds * RATE
    # Codes in the range the stored stream's are (1 000 .. 5 095), and those codes scaled.
    codes = np.random.default_rng(1).integers(1000, 5096, size=(CHANNELS, n)).astype(np.int16)
    floats = codes.astype(np.float32) * np.float32(0.0061)
    runs = {"railtrace: decode + record": [], "pyjls: float32 arrays": [],
            "pyjls: int16 arrays": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jls"
        for r in range(rounds):
            runs["railtrace: decode + record"].append(railtrace_once(seconds))
            runs["pyjls: float32 arrays"].append(jls_once(floats, path))
            runs["pyjls: int16 arrays"].append(jls_once(codes, path))
            print(f"round {r + 1} of {rounds}: " + ", ".join(
                f"{k.split(':')[0]} {v[-1][0] / 1e6:.1f}" for k, v in runs.items()) + " M/s",
                flush=True)
    print(f"\n{seconds} s of {CHANNELS} channels at {RATE // 1000} kS/s ({n} samples), "
          f"median of {rounds} rounds, pyjls {pyjls.__version__}:")
    ours = statistics.median(r for r, _ in runs["railtrace: decode + record"])
    for name, v in runs.items():
        rate = statistics.median(r for r, _ in v)
        size = statistics.median(b for _, b in v)
        print(f"  {name:28} {rate / 1e6:6.1f} M samples/s  {size:5.1f} B/sample  "
              f"railtrace / this {ours / rate:4.2f}")


if __name__ == "__main__":
    main()
