#!/usr/bin/env bash
# Builds the STM32F405 bring-up image for QEMU (release, feature `qemu`) and boots it on
# qemu-system-arm's netduinoplus2 machine with USART1 on a new pseudo-terminal.
#
#   ./run-qemu.sh [--paused] [--no-build] [EXTRA QEMU ARGS...]
#
#   --paused    start the VM stopped, with a monitor on a unix socket, and print
#               "monitor: PATH". Open the pty, wait a second, then send "cont" to that
#               socket (e.g. `echo cont | socat - UNIX-CONNECT:PATH`). Needed to see the
#               boot messages: QEMU throws away what the guest writes to a pty that nobody
#               has open, and notices an opened pty only by polling it once a second.
#   --no-build  boot the image as last built.
#
# Environment:
#   ICOUNT               QEMU -icount setting (default shift=3,sleep=off: 8 ns of virtual
#                        time per instruction, repeatable timing, no idle sleeping)
#   QEMU                 the emulator (default qemu-system-arm)
#
# Prints "pty: /dev/pts/N" (and "monitor: PATH") on stdout once QEMU has started, then
# runs until QEMU exits; Ctrl-C or SIGTERM stops it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
paused=0
build=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --paused) paused=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) break ;;
    esac
done

elf="$here/target/thumbv7em-none-eabihf/release/railtrace-stm32f405"
if [[ $build -eq 1 ]]; then
    (cd "$here" && cargo build --release --features qemu --quiet)
fi

workdir="$(mktemp -d "${TMPDIR:-/tmp}/railtrace-qemu.XXXXXX")"
args=(-M netduinoplus2 -display none -serial pty -icount "${ICOUNT:-shift=3,sleep=off}" -kernel "$elf")
if [[ $paused -eq 1 ]]; then
    args+=(-S -monitor "unix:$workdir/monitor.sock,server=on,wait=off")
else
    args+=(-monitor none)
fi

qemu_pid=
cleanup() {
    if [[ -n "$qemu_pid" ]]; then kill "$qemu_pid" 2>/dev/null || true; wait "$qemu_pid" 2>/dev/null || true; fi
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

: >"$workdir/qemu.out" # exists before QEMU starts, for the polling below
"${QEMU:-qemu-system-arm}" "${args[@]}" "$@" </dev/null >>"$workdir/qemu.out" 2>&1 &
qemu_pid=$!

# QEMU prints "char device redirected to /dev/pts/N (label serial0)" when it opens the pty.
pty=
for _ in $(seq 100); do
    pty="$(sed -n 's/^char device redirected to \(\/dev\/[^ ]*\) .*/\1/p' "$workdir/qemu.out" | head -n1)"
    [[ -n "$pty" ]] && break
    kill -0 "$qemu_pid" 2>/dev/null || break
    sleep 0.05
done
if [[ -z "$pty" ]]; then
    echo "run-qemu.sh: QEMU did not report a pty:" >&2
    cat "$workdir/qemu.out" >&2
    exit 1
fi
echo "pty: $pty"
[[ $paused -eq 1 ]] && echo "monitor: $workdir/monitor.sock"

# Pass on what QEMU says from now on (errors, or a guest error), and wait for it to end.
tail -n +1 -f --pid="$qemu_pid" "$workdir/qemu.out" | grep --line-buffered -v '^char device redirected' >&2 &
status=0
wait "$qemu_pid" || status=$?
qemu_pid=
exit "$status"
