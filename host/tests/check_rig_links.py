#!/usr/bin/env python3
"""Each rig at its top 8-channel rate, as a user captures it, held against the twin's
truth.

    python3 host/tests/check_rig_links.py path/to/railtrace [SECONDS]

SECONDS is each capture's length (default 60; CI runs 15: the checks below are counts,
exact at any length, and rates, whose start and stop take well under 2 % of 15 s).

For each rig file in hardware/rigs/: `railtrace twin serve --rig FILE --truth DIR`, then
`railtrace capture --duration SECONDS` at the highest rate the rig's board offers (50 kS/s
on the STM32F405 rigs, 200 kS/s on the fast rig), then the recording and the truth are read
with pyarrow:

- every conversion the twin ran (its truth's `rails.arrow`, one row each) is the device's
  count at Stop (`samples_acquired` of the last status row), and every one of them is in
  the recording as a sample or inside a gap row of exactly its samples;
- the fast rig (USB high speed) loses nothing: no gap, no frame lost;
- a rig whose link cannot carry the stream (the F405's UART and USB full speed at 50 kS/s
  of 8 channels) loses whole blocks, each one a gap row caused by the device, and receives
  what its link carries.

Exits non-zero with a message on the first failure.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pyarrow.compute as pc
import pyarrow.ipc as ipc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# The rig's name, its top rate, and the samples a second its link carries with 8
# channels (hardware/README.md: 16.66 bytes a sample on the wire); None: all of them.
RIGS = [
    ("pcie-2x8pin-hs", 200_000, None),
    ("pcie-2x8pin-f405-usb", 50_000, 800_000 / 16.66),
    ("pcie-2x8pin", 50_000, 92_160 / 16.66),
]


def check(railtrace, rig, rate, carried, seconds, work):
    truth = os.path.join(work, rig + "-truth")
    out = os.path.join(work, rig + ".arrow")
    twin = subprocess.Popen(
        [railtrace, "twin", "serve", "--rig", os.path.join(ROOT, "hardware", "rigs", rig + ".toml"),
         "--truth", truth, "--seconds", str(seconds + 30)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = twin.stdout.readline().strip()
    assert port, f"{rig}: the twin printed no port"
    cap = subprocess.run(
        [railtrace, "capture", "--port", port, "--rate", str(rate), "--duration", str(seconds),
         "-o", out], capture_output=True, text=True)
    twin.send_signal(signal.SIGINT)
    twin.wait(timeout=60)
    assert cap.returncode == 0, f"{rig}: capture failed: {cap.stderr[-2000:]}"

    table = ipc.open_stream(out).read_all()
    kind = table["kind"]
    # A capture keeps its samples in block rows, `count` samples each (RECORDING.md).
    samples = table.filter(pc.equal(kind, "sample")).num_rows
    samples += pc.sum(table.filter(pc.equal(kind, "block"))["count"]).as_py() or 0
    gaps = table.filter(pc.equal(kind, "gap"))
    causes = set(gaps["text"].to_pylist())
    missing = pc.sum(gaps["count"]).as_py() or 0
    status = table.filter(pc.equal(kind, "status"))["text"].to_pylist()
    acquired = json.loads(status[-1])["samples_acquired"]
    conversions = ipc.open_stream(os.path.join(truth, "rails.arrow")).read_all().num_rows
    got = samples / seconds
    print(f"{rig}: {rate} S/s asked for {seconds} s: {samples} samples received ({got:.0f} a second), "
          f"{missing} in {gaps.num_rows} gaps, {acquired} acquired, {conversions} conversions in the truth"
          + (f"; gaps: {sorted(causes)}" if causes else ""))
    assert acquired == conversions, f"{rig}: the device counted {acquired}, the twin ran {conversions}"
    assert samples + missing == acquired, f"{rig}: {samples} + {missing} != {acquired}"
    if carried is None:
        assert gaps.num_rows == 0, f"{rig}: {gaps.num_rows} gaps: {causes}"
        assert got > 0.98 * rate, f"{rig}: {got} samples a second"
    else:
        assert gaps.num_rows > 0, f"{rig}: no block lost, though the link cannot carry {rate} S/s"
        assert all(c.startswith("device: ") for c in causes), causes
        assert 0.9 * carried < got < 1.02 * carried, f"{rig}: {got} a second, the link carries {carried:.0f}"


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    seconds = float(argv[2]) if len(argv) > 2 else 60.0
    with tempfile.TemporaryDirectory() as work:
        for rig, rate, carried in RIGS:
            check(argv[1], rig, rate, carried, seconds, work)
    print(f"{len(RIGS)} rigs checked")


if __name__ == "__main__":
    main(sys.argv)
