#!/usr/bin/env bash
# Counts the firmware core's instructions per sample on the host with callgrind:
# runs examples/hotpath.rs at two sample counts and divides the difference in each
# function's inclusive instruction count by the difference in samples, so start-up,
# the decode after the run and other fixed costs drop out.
#
#   firmware/hotpath-callgrind.sh [N1 N2 [noise]]   (default 20000 120000, test signal)
#
# `noise`: uniformly random codes instead of the test signal (see examples/hotpath.rs).
#
# Needs valgrind. Builds into $CARGO_TARGET_DIR (default target/ at the repository root).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
n1="${1:-20000}"
n2="${2:-120000}"
signal="${3:-test}"
target="${CARGO_TARGET_DIR:-$root/target}"
(cd "$root" && cargo build --release --quiet -p railtrace-firmware --example hotpath)
work="$(mktemp -d "${TMPDIR:-/tmp}/railtrace-hotpath.XXXXXX")"
trap 'rm -rf "$work"' EXIT
for n in "$n1" "$n2"; do
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.$n" \
        "$target/release/examples/hotpath" "$n" "$signal" >"$work/out.$n" 2>"$work/err.$n"
    callgrind_annotate --inclusive=yes --threshold=100 "$work/cg.$n" >"$work/ann.$n" 2>/dev/null
done
cat "$work/out.$n2"
python3 - "$work/ann.$n1" "$work/ann.$n2" "$n1" "$n2" "$signal" <<'PY'
import re, sys
def inclusive(path):
    d = {}
    for line in open(path):
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(?:\?\?\?:)?(\S.*?) \[", line)
        if m:
            d.setdefault(m.group(2), int(m.group(1).replace(",", "")))
    return d
a, b = inclusive(sys.argv[1]), inclusive(sys.argv[2])
dn = int(sys.argv[4]) - int(sys.argv[3])
def per(pattern):
    keys = [k for k in b if re.search(pattern, k)]
    return sum(b[k] - a.get(k, 0) for k in keys) / dn if keys else 0.0
tick = per(r"Sampler<.*>::on_tick$")
poll = per(r"device::Device<.*>::poll$")
enc = per(r"^railtrace_protocol::frame::(FrameEncoder::encode|encode_frame)$")
# FrameEncoder::encode calls encode_frame unless inlined: count the outermost.
enc_outer = per(r"^railtrace_protocol::frame::FrameEncoder::encode$") or enc
collect = per(r"Device<.*>::collect_samples$")
print(f"instructions per sample (callgrind, host build, {sys.argv[5]} signal, difference over {dn} samples of 8 channels):")
print(f"  core total (on_tick + poll) {tick + poll:7.1f}")
print(f"  sampler interrupt (on_tick) {tick:7.1f}")
print(f"  main loop (poll)            {poll:7.1f}")
print(f"    of which frame encoding   {enc_outer:7.1f}")
print(f"    of which collect_samples  {collect:7.1f}")
print(f"    rest of the main loop     {poll - enc_outer - collect:7.1f}")
PY
