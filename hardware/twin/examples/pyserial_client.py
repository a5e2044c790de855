#!/usr/bin/env python3
"""A small independent railtrace client: pyserial + protocol/SPEC.md, nothing else.

    python3 hardware/twin/examples/pyserial_client.py [--railtrace BINARY] [--port PATH]

Without --port it starts `railtrace twin serve --seconds 60` and talks to the virtual rig
on the pseudo-terminal whose path the twin prints on its first stdout line.  It then:
GetInfo, Configure (10 kHz, every listed channel, averaging 1), Start, one second of
device time (10 000 samples), Stop, TimeSync -- checking the protocol's promises along
the way (contiguous indices, period_ticks, sequence numbers, Status counters).

Frames are encoded and decoded with protocol/spec/railtrace_wire.py, an implementation of
SPEC.md written from the specification alone.  Prints OK and exits 0 on success; prints
one line saying why and exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "protocol" / "spec"))

import railtrace_wire as wire  # noqa: E402  (SPEC.md §2-§5)

try:
    import serial  # pyserial
except ImportError:  # pragma: no cover
    print("FAIL: pyserial is not installed (pip install pyserial)")
    sys.exit(1)

RATE_HZ = 10_000
SAMPLES = 10_000                # one second of device time at 10 kHz
BAUD = 921_600                  # ignored by a pseudo-terminal, honoured by a USB-UART
UNITS = {wire.QUANTITY_VOLTAGE: "V", wire.QUANTITY_CURRENT: "A"}


class Failure(Exception):
    """A check failed; the message is the one-line reason."""


# ---------------------------------------------------------------------------- the twin

class Twin:
    """`railtrace twin serve --seconds 60` as a child process."""

    def __init__(self, binary: str):
        self.proc = subprocess.Popen(
            [binary, "twin", "serve", "--seconds", "60"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put),
                         daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append),
                         daemon=True).start()

    @staticmethod
    def _pump(stream, sink):
        for line in stream:
            sink(line.rstrip("\n"))
        sink(None)

    def port(self, timeout: float = 30.0) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise Failure(f"the twin printed no port path within {timeout:.0f} s") from None
        if not line:
            time.sleep(0.2)
            err = " | ".join(s for s in self.stderr if s)
            raise Failure(f"the twin exited (status {self.proc.poll()}) without a port path"
                          + (f": {err}" if err else ""))
        return line.strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def find_binary(arg: str | None) -> str:
    if arg:
        if not (os.path.isfile(arg) and os.access(arg, os.X_OK)):
            raise Failure(f"--railtrace {arg}: not an executable file")
        return arg
    default = REPO / "target" / "debug" / "railtrace"
    if default.is_file() and os.access(default, os.X_OK):
        return str(default)
    on_path = shutil.which("railtrace")
    if on_path:
        return on_path
    raise Failure(f"no railtrace binary: neither {default} nor `railtrace` on PATH "
                  "(build it with `cargo build -p railtrace`, or pass --railtrace)")


# ---------------------------------------------------------------------------- the link

class Client:
    """Frames over a pyserial port; commands matched to results by request id (§4.6)."""

    def __init__(self, ser: serial.Serial):
        self.ser = ser
        self.tx = wire.Sender()                  # our seq numbers (§3.3)
        self.dec = wire.Decoder()                # host side: tracks the device's seq
        self.next_rid = 1
        self.synced = False                      # a good frame seen since attaching
        self.on_frame = self.default_frame       # handler for frames that are not results
        self.last_status: dict | None = None
        self.last_status_seq: int | None = None
        self.edges = 0
        self.logs = 0

    # ---- sending
    def send(self, name: str, **fields) -> tuple[int, float]:
        rid = self.next_rid
        self.next_rid = (self.next_rid + 1) & 0xFFFF
        data = self.tx.frame(name, {"request_id": rid, **fields})
        if self.tx.seq == 1:
            data = b"\x00" + data                # §3.1: resynchronise a receiver mid-stream
        t0 = time.perf_counter()
        self.ser.write(data)
        self.ser.flush()
        return rid, t0

    # ---- receiving
    def frames(self, deadline: float, what: str):
        """Yield (event, t_read) for every decoded frame until the caller stops."""
        while True:
            if time.perf_counter() > deadline:
                raise Failure(f"timed out waiting for {what}")
            chunk = self.ser.read(max(1, self.ser.in_waiting))
            t_read = time.perf_counter()
            if not chunk:
                continue
            for ev in self.dec.feed(chunk):
                self.check_event(ev)
                if ev.kind == "frame":
                    yield ev, t_read

    def check_event(self, ev):
        if ev.kind == "unsupported_version":
            raise Failure(f"the device speaks protocol version {ev.version}, this client 1")
        if ev.kind in wire.REJECTIONS:
            if not self.synced and ev.kind != "malformed":
                return                           # a partial frame from before we attached
            raise Failure(f"received a bad frame ({ev.kind}: {ev.detail})")
        self.synced = True
        note = ev.seq_note
        if note.startswith("lost"):
            raise Failure(f"sequence gap before device frame seq {ev.seq}: {note} frame(s)")
        if note == "restart":
            raise Failure(f"device sequence number jumped to {ev.seq}: the device restarted")
        if self.dec.counts["duplicate"]:
            raise Failure(f"received a duplicate device frame (seq {self.dec.seq.last})")
        # unknown_type: §3.4 step 7, skipped without error

    def default_frame(self, ev):
        if ev.name == "Log":
            self.logs += 1
            level = wire.LOG_LEVELS[ev.fields["level"]]
            print(f"  device log [{level}]: {ev.fields['text']}")
        elif ev.name == "Status":
            st = ev.fields
            if st["frames_sent"] != (ev.seq + 1) & 0xFFFFFFFF:
                raise Failure(f"Status frames_sent {st['frames_sent']} is not its seq + 1 "
                              f"({ev.seq + 1})")
            self.last_status, self.last_status_seq = st, ev.seq
        elif ev.name == "TriggerEdge":
            self.edges += 1
        elif ev.name == "SampleBlock":
            raise Failure("received a SampleBlock while not sampling "
                          "(was the device already running?)")
        elif ev.name in ("DeviceInfo", "TimeSyncReply"):
            raise Failure(f"unexpected {ev.name}")
        elif ev.type in wire.HOST_TO_DEVICE:
            raise Failure(f"the device sent a host command ({ev.name})")

    def command(self, name: str, timeout: float = 5.0, expect: str | None = None, **fields):
        """Send a command; return (data frame `expect` or None, t0, t_read of it).

        Frames before the CommandResult go to self.on_frame, except `expect`.  Fails
        unless the result is Ok.
        """
        rid, t0 = self.send(name, **fields)
        deadline = time.perf_counter() + timeout
        data, t_data = None, None
        for ev, t_read in self.frames(deadline, f"the result of {name}"):
            if ev.name == "CommandResult":
                r = ev.fields
                if r["request_id"] != rid or r["command"] != wire.TYPES[name]:
                    raise Failure(f"unexpected CommandResult {r} while waiting for {name} "
                                  f"request {rid}")
                if r["code"] != wire.OK:
                    code = wire.RESULT_CODES.get(r["code"], f"code {r['code']}")
                    raise Failure(f"{name} was answered {code}")
                if expect and data is None:
                    raise Failure(f"{name} answered Ok without sending a {expect}")
                return data, t0, t_data
            if expect and ev.name == expect:
                if data is not None:
                    raise Failure(f"{name}: more than one {expect}")
                data, t_data = ev.fields, t_read
            else:
                self.on_frame(ev)


# ---------------------------------------------------------------------------- the run

def print_info(info: dict):
    flags = [n for bit, n in ((wire.FLAG_TEST_SIGNAL, "TEST_SIGNAL"),
                              (wire.FLAG_CALIBRATION_STORED, "CALIBRATION_STORED"))
             if info["flags"] & bit]
    print("DeviceInfo:")
    print(f"  board        {info['board']}")
    print(f"  serial       {info['serial']}")
    print(f"  firmware     {info['fw_major']}.{info['fw_minor']}.{info['fw_patch']}, "
          f"protocol {info['protocol_version']}")
    print(f"  tick rate    {info['tick_hz']} Hz")
    print(f"  ADC          {info['adc_bits']} bits; flags 0x{info['flags']:02x} "
          f"{' '.join(flags) or '-'}; triggers {info['trigger_inputs']} in, "
          f"{info['trigger_outputs']} out")
    print(f"  sample rates {', '.join(f'{r} Hz' for r in info['rates']) or '(none)'}")
    print(f"  channels     {len(info['channels'])}")
    for ch in info["channels"]:
        q = {0: "voltage", 1: "current"}.get(ch["quantity"], f"quantity {ch['quantity']}")
        print(f"    [{ch['index']}] {ch['name']:<12} {q:<8} scale {ch['scale']:.9g} "
              f"{UNITS.get(ch['quantity'], 'units')}/code, offset {ch['offset']:.9g} "
              f"{UNITS.get(ch['quantity'], 'units')}")


def pair_rails(channels: list[dict]):
    """Pair `<rail>_I` (current) with `<rail>_V` (voltage); None if not every one pairs."""
    by_name = {ch["name"]: ch for ch in channels}
    pairs = []
    for ch in channels:
        if ch["quantity"] != wire.QUANTITY_CURRENT:
            continue
        if not ch["name"].endswith("_I"):
            return None, f"current channel {ch['name']!r} is not named <rail>_I"
        rail = ch["name"][:-2]
        v = by_name.get(rail + "_V")
        if v is None or v["quantity"] != wire.QUANTITY_VOLTAGE:
            return None, f"no voltage channel {rail + '_V'!r} for current channel {ch['name']!r}"
        pairs.append((rail, ch, v))
    if not pairs:
        return None, "the device lists no current channel"
    return pairs, ""


def run(port: str) -> None:
    try:
        ser = serial.Serial(port, BAUD, timeout=0.05)
    except (serial.SerialException, OSError) as e:
        raise Failure(f"cannot open {port}: {e}") from None
    with ser:
        ser.reset_input_buffer()
        c = Client(ser)
        print(f"port {port}")

        # ---- GetInfo (§5 0x81 -> DeviceInfo, §4.1)
        info, _, _ = c.command("GetInfo", expect="DeviceInfo")
        print_info(info)
        print("GetInfo: CommandResult Ok")
        if info["protocol_version"] != wire.VERSION:
            raise Failure(f"DeviceInfo reports protocol version {info['protocol_version']}")
        if RATE_HZ not in info["rates"]:
            raise Failure(f"the device does not list {RATE_HZ} Hz (rates: {info['rates']})")
        channels = info["channels"]
        if not channels:
            raise Failure("the device lists no channel")
        mask = wire.listed_mask(info)
        tick_hz = info["tick_hz"]
        if tick_hz % RATE_HZ == 0:
            periods = {tick_hz // RATE_HZ}
        else:  # §5: "the conversion timer's period in whole ticks": rounding unspecified
            periods = {tick_hz // RATE_HZ, -(-tick_hz // RATE_HZ)}

        # ---- Configure, Start (§5)
        c.command("Configure", sample_rate_hz=RATE_HZ, channel_mask=mask, averaging=1)
        print(f"Configure {RATE_HZ} Hz, mask 0x{mask:02x}, averaging 1: Ok")

        n_ch = len(channels)
        order = sorted(channels, key=lambda ch: ch["index"])   # codes in ascending index (§4.2)
        pairs, why_unpaired = pair_rails(order)
        sums = [0] * n_ch                         # code sums over the first SAMPLES samples
        power_sums = [0.0] * len(pairs or [])
        pos = {ch["index"]: k for k, ch in enumerate(order)}
        state = {"next": 0, "blocks": 0, "first_tick": None, "last_tick": None}

        def on_block(ev):
            if ev.name != "SampleBlock":
                return c.default_frame(ev)
            b = ev.fields
            if b["first_index"] != state["next"]:
                raise Failure(f"SampleBlock starts at index {b['first_index']}, "
                              f"expected {state['next']} (samples missing or repeated)")
            if b["period_ticks"] not in periods:
                raise Failure(f"SampleBlock period_ticks {b['period_ticks']}, expected "
                              f"tick_hz / rate = {tick_hz} / {RATE_HZ} = {tick_hz / RATE_HZ:g}")
            if b["channel_mask"] != mask or b["averaging"] != 1:
                raise Failure(f"SampleBlock mask 0x{b['channel_mask']:02x} averaging "
                              f"{b['averaging']}, configured 0x{mask:02x} averaging 1")
            if b["sample_count"] == 0:
                raise Failure("the device sent a SampleBlock of 0 samples")
            if state["first_tick"] is None:
                state["first_tick"] = b["first_tick"]
            take = min(b["sample_count"], SAMPLES - b["first_index"])
            codes = b["codes"]
            for j in range(max(take, 0)):
                s = codes[j * n_ch:(j + 1) * n_ch]
                for k in range(n_ch):
                    sums[k] += s[k]
                for p, (_, i_ch, v_ch) in enumerate(pairs or []):
                    amps = s[pos[i_ch["index"]]] * i_ch["scale"] + i_ch["offset"]
                    volts = s[pos[v_ch["index"]]] * v_ch["scale"] + v_ch["offset"]
                    power_sums[p] += amps * volts
            if take > 0 and b["first_index"] + take == SAMPLES:
                state["last_tick"] = b["first_tick"] + (take - 1) * b["period_ticks"]
            state["next"] = b["first_index"] + b["sample_count"]
            state["blocks"] += 1

        c.on_frame = on_block
        c.last_status = None
        c.command("Start")
        print("Start: Ok")
        deadline = time.perf_counter() + 15.0
        t_start = time.perf_counter()
        for ev, _ in c.frames(deadline, f"{SAMPLES} samples"):
            if ev.name == "CommandResult":
                raise Failure(f"unexpected CommandResult {ev.fields} while sampling")
            on_block(ev)
            if state["next"] >= SAMPLES:
                break
        t_sampled = time.perf_counter() - t_start

        # ---- Stop: the last partial block, a Status (idle), the result (§5)
        c.last_status = None
        c.command("Stop")
        st = c.last_status
        if st is None:
            raise Failure("Stop answered Ok without a Status before it")
        received = state["next"]
        print(f"Stop: Ok; received {received} samples in {state['blocks']} blocks, "
              f"indices contiguous from 0, period_ticks {sorted(periods)[0]}"
              f"{'' if len(periods) == 1 else ' or ' + str(sorted(periods)[1])}")
        print(f"Status: state {st['state']}, samples_acquired {st['samples_acquired']}, "
              f"dropped queue/link/adc {st['dropped_queue_full']}/{st['dropped_link']}/"
              f"{st['dropped_adc']}, frames_sent {st['frames_sent']}, "
              f"frames_rejected {st['frames_rejected']}, queue high water "
              f"{st['queue_high_water']}/{st['queue_capacity']}")
        if st["state"] != wire.STATE_IDLE:
            raise Failure(f"the Status after Stop reports state {st['state']}, not idle")
        dropped = st["dropped_queue_full"] + st["dropped_link"] + st["dropped_adc"]
        if dropped:
            raise Failure(f"the device dropped {dropped} samples (queue {st['dropped_queue_full']},"
                          f" link {st['dropped_link']}, adc {st['dropped_adc']})")
        if st["samples_acquired"] != received:
            raise Failure(f"Status samples_acquired {st['samples_acquired']} != "
                          f"{received} samples received")
        if st["frames_rejected"]:
            raise Failure(f"the device rejected {st['frames_rejected']} of our frames")

        # ---- results over the first second of device time
        span = (state["last_tick"] - state["first_tick"]) / tick_hz
        print(f"Means over samples 0..{SAMPLES - 1} (device time {span * 1e3:.3f} ms first "
              f"to last, {t_sampled:.3f} s wall):")
        means = {}
        for k, ch in enumerate(order):
            mean = sums[k] / SAMPLES * ch["scale"] + ch["offset"]
            means[ch["index"]] = mean
            print(f"  {ch['name']:<12} {mean:12.6f} {UNITS.get(ch['quantity'], '(unknown unit)')}")
        if pairs is None:
            print(f"  total power: not computed: cannot pair channels from DeviceInfo alone "
                  f"({why_unpaired}); per-channel values only")
        else:
            total = 0.0
            for p, (rail, i_ch, v_ch) in enumerate(pairs):
                watts = power_sums[p] / SAMPLES
                total += watts
                print(f"  power {rail:<10} {watts:12.6f} W  ({i_ch['name']} x {v_ch['name']}, "
                      f"mean of per-sample products)")
            print(f"  total power  {total:12.6f} W  (sum over {len(pairs)} rails)")

        # ---- TimeSync (§4.5)
        nonce = random.getrandbits(32)
        reply, t0, t3 = c.command("TimeSync", expect="TimeSyncReply", nonce=nonce)
        if reply["nonce"] != nonce:
            raise Failure(f"TimeSyncReply nonce 0x{reply['nonce']:08x}, sent 0x{nonce:08x}")
        if reply["tx_tick"] < reply["rx_tick"]:
            raise Failure("TimeSyncReply tx_tick is before rx_tick")
        rtt = t3 - t0
        turn = (reply["tx_tick"] - reply["rx_tick"]) / tick_hz
        print(f"TimeSync: nonce 0x{nonce:08x}, round trip {rtt * 1e6:.1f} us, device "
              f"turnaround {turn * 1e6:.1f} us, device tick "
              f"{(reply['rx_tick'] + reply['tx_tick']) // 2} at host midpoint, "
              f"+/- {max(rtt - turn, 0) / 2 * 1e6:.1f} us")
        d = c.dec.counts
        print(f"link: {d['frame']} frames received, {d['unknown_type']} of unknown type, "
              f"{sum(d[k] for k in wire.REJECTIONS)} rejected, no sequence gaps; "
              f"{c.edges} trigger edges and {c.logs} logs seen; {c.tx.seq} frames sent")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--railtrace", help="railtrace binary (default: target/debug/railtrace "
                    "in the repository, else `railtrace` on PATH)")
    ap.add_argument("--port", help="serial port of a running rig or twin; the twin is "
                    "not started when given")
    args = ap.parse_args()
    twin = None
    try:
        port = args.port
        if not port:
            twin = Twin(find_binary(args.railtrace))
            port = twin.port()
        run(port)
    except Failure as e:
        print(f"FAIL: {e}")
        return 1
    except (serial.SerialException, OSError) as e:
        print(f"FAIL: serial port error: {e}")
        return 1
    except KeyboardInterrupt:
        print("FAIL: interrupted")
        return 1
    finally:
        if twin is not None:
            twin.stop()
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
