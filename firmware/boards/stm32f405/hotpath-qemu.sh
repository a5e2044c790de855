#!/usr/bin/env bash
# Counts the firmware core's instructions per sample on the target build (thumbv7em,
# this board's release profile) under QEMU: builds examples/hotpath.rs, boots it on
# netduinoplus2 with `-icount shift=0,sleep=off` (one instruction = 1 ns of virtual time,
# which QEMU's TIM5 counts) and prints what it measured. See the example's doc comment.
#
#   firmware/boards/stm32f405/hotpath-qemu.sh
#
# Environment: QEMU (default qemu-system-arm), CARGO_TARGET_DIR (default target/ here).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
target="${CARGO_TARGET_DIR:-$here/target}"
(cd "$here" && cargo build --release --locked --quiet --features qemu --example hotpath)
elf="$target/thumbv7em-none-eabihf/release/examples/hotpath"
out="$(mktemp "${TMPDIR:-/tmp}/railtrace-hotpath-qemu.XXXXXX")"
trap 'rm -f "$out"; [[ -n "${qemu_pid:-}" ]] && kill "$qemu_pid" 2>/dev/null || true' EXIT
"${QEMU:-qemu-system-arm}" -M netduinoplus2 -display none -monitor none \
    -serial "file:$out" -icount shift=0,sleep=off -kernel "$elf" </dev/null &
qemu_pid=$!
# The image prints its figures and "done", then idles: stop QEMU then (60 s at most).
for _ in $(seq 600); do
    grep -qx done "$out" 2>/dev/null && break
    kill -0 "$qemu_pid" 2>/dev/null || break
    sleep 0.1
done
kill "$qemu_pid" 2>/dev/null || true
wait "$qemu_pid" 2>/dev/null || true
qemu_pid=
grep -qx done "$out" || { echo "hotpath-qemu.sh: no result from QEMU" >&2; cat "$out" >&2; exit 1; }
grep -vx done "$out"
