#!/usr/bin/env python3
"""Check SPEC.md against an independent implementation (railtrace_wire).

- §7's test vectors: expected values typed from the §7 prose (not from the hex), compared
  with the raw-frame and wire columns both ways;
- the §3.2 / §7.1 worked examples, the §3.1 and §6 size formulas;
- the receiving rules of §3.4 (each step, and exactly the step-8 "malformed" list), the
  sequence rules of §3.3 and robustness to corrupted, inserted and dropped bytes;
- the CommandResult rules of §4.6 and the command rules of §5, end to end against the
  `Device` model (duplicates answered, counters and their scopes, default configuration,
  result precedence, DriveTrigger pulses, WriteCalibration storage).

Run from anywhere: python3 protocol/spec/check_vectors.py
Prints one line per check, then "N passed, M failed"; exits 1 on any failure.
"""
from __future__ import annotations

import random
import re
import struct
import sys
from pathlib import Path

sys.dont_write_bytecode = True  # leave nothing behind in protocol/spec/
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import railtrace_wire as w  # noqa: E402

SPEC = HERE.parent / "SPEC.md"
SEED = 20240601
ALL_ONES_64 = 0xFFFFFFFFFFFFFFFF

# Expected content of each row, transcribed from the prose of SPEC.md §7 (not from the hex).
# The Log text uses U+0394 GREEK CAPITAL LETTER DELTA and U+00B5 MICRO SIGN, the code
# points the prose names.
LONG_LOG_TEXT = "\u0394t = 5 \u00b5s" + "x" * 290
EXPECTED = {
    "DeviceInfo": (0x01, {
        "fw_major": 0, "fw_minor": 1, "fw_patch": 0, "protocol_version": 1,
        "tick_hz": 84_000_000, "adc_bits": 16, "flags": w.FLAG_TEST_SIGNAL,
        "trigger_inputs": 4, "trigger_outputs": 2, "board": "F405", "serial": "SN1",
        "rates": [10_000, 100_000],
        "channels": [
            {"index": 0, "quantity": w.QUANTITY_CURRENT, "name": "I0", "scale": 0.001, "offset": 0.0},
            {"index": 1, "quantity": w.QUANTITY_VOLTAGE, "name": "V0", "scale": 0.0005, "offset": 0.0},
        ]}),
    "SampleBlock": (0x02, {
        "first_index": 256, "first_tick": 1_000_000, "period_ticks": 840, "channel_mask": 0b11,
        "averaging": 1, "sample_count": 2, "codes": [256, 4660, -1, -32768]}),
    "TriggerEdge": (0x03, {"line": 1, "polarity": 1, "edge_count": 3, "tick": 123456789,
                           "sample_index": 146972}),
    "SampleBlock (averaged)": (0x02, {
        "first_index": 7, "first_tick": 23520, "period_ticks": 840 * 4, "channel_mask": 0x84,
        "averaging": 4, "sample_count": 2, "codes": [-5, 12000, 7, 11990]}),
    "TriggerEdge (output line)": (0x03, {"line": 0x80, "polarity": 1, "edge_count": 1, "tick": 42,
                                         "sample_index": ALL_ONES_64}),
    "Status": (0x04, {
        "uptime_ticks": 840_000_000, "samples_acquired": 1_000_000, "dropped_queue_full": 0,
        "dropped_link": 62, "dropped_adc": 0, "frames_sent": 5, "frames_rejected": 1,
        "edges_dropped": 0, "queue_high_water": 17, "queue_capacity": 256, "state": w.STATE_RUNNING}),
    "TimeSyncReply": (0x05, {"nonce": 0xDEADBEEF, "rx_tick": 1000, "tx_tick": 1090}),
    "CommandResult (ok)": (0x06, {"request_id": 7, "command": 0x82, "code": w.OK}),
    "CommandResult (error)": (0x06, {"request_id": 8, "command": 0x82, "code": w.UNSUPPORTED_RATE}),
    "Log": (0x07, {"level": 2, "text": "boot ok"}),
    "Log (long, UTF-8)": (0x07, {"level": 1, "text": LONG_LOG_TEXT}),
    "GetInfo": (0x81, {"request_id": 1}),
    "Configure": (0x82, {"request_id": 2, "sample_rate_hz": 100_000, "channel_mask": 0xFF,
                         "averaging": 1}),
    "Start": (0x83, {"request_id": 3}),
    "Stop": (0x84, {"request_id": 4}),
    "TimeSync": (0x85, {"request_id": 5, "nonce": 0xDEADBEEF}),
    "DriveTrigger": (0x86, {"request_id": 6, "line": 0, "level": 1, "pulse_ticks": 8400}),
    "WriteCalibration": (0x87, {"request_id": 7, "channel": 2, "scale": 0.00125, "offset": -0.5}),
    "ResetCounters": (0x88, {"request_id": 8}),
    "GetStatus": (0x89, {"request_id": 9}),
    "Unknown type 0x40": (0x40, bytes([0x00, 0x01, 0x02])),
}

passed = failed = 0


def check(name: str, ok: bool, why: str = "") -> bool:
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS  {name}")
    else:
        failed += 1
        print(f"FAIL  {name}: {why}")
    return ok


def f32(x):
    """Round floats (recursively) to binary32, so prose decimals compare with wire values."""
    if isinstance(x, float):
        return struct.unpack("<f", struct.pack("<f", x))[0]
    if isinstance(x, dict):
        return {k: f32(v) for k, v in x.items()}
    if isinstance(x, list):
        return [f32(v) for v in x]
    return x


def hexbytes(cell: str) -> bytes:
    m = re.fullmatch(r"`([0-9a-fA-F ]*)`", cell.strip())
    if not m:
        raise ValueError(f"not a backticked hex cell: {cell!r}")
    return bytes.fromhex(m.group(1))


def parse_vectors(text: str) -> list[tuple[str, int, bytes, bytes]]:
    block = text.split("<!-- vectors:begin -->", 1)[1].split("<!-- vectors:end -->", 1)[0]
    rows = []
    for line in block.strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("name", "---"):
            continue
        rows.append((cells[0], int(cells[1]), hexbytes(cells[2]), hexbytes(cells[3])))
    return rows


def chunks(data: bytes, rng: random.Random, hi: int = 7) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, hi)
        out.append(data[i:i + n])
        i += n
    return out


def feed_chunked(data: bytes, rng: random.Random, dec=None):
    dec = dec or w.Decoder()
    events = []
    for c in chunks(data, rng):
        events += dec.feed(c)
    return events, dec


def summary(ev) -> tuple:
    return (ev.kind, ev.seq, ev.type, ev.fields, ev.payload)


def frame(seq: int, t: int, payload: bytes, version: int = 1) -> bytes:
    """Wire bytes of a frame with an arbitrary (possibly malformed) payload."""
    return w.cobs_encode(w.encode_raw_frame(seq, t, payload, version)) + b"\x00"


def kinds(events) -> list[str]:
    return [e.kind for e in events]


def show(events) -> str:
    return str([(e.kind, e.seq, e.seq_note, e.detail) for e in events])


# ---------------------------------------------------------------- primitive checks

def check_primitives():
    check("CRC-32C check value of '123456789' is 0xE3069283", w.crc32c(b"123456789") == 0xE3069283,
          hex(w.crc32c(b"123456789")))
    for raw, enc in [(b"", "01"), (b"\x00", "01 01"), (bytes.fromhex("11220033"), "03 11 22 02 33"),
                     (b"\x07" * 254, "ff" + "07" * 254 + "01")]:
        e = bytes.fromhex(enc)
        check(f"§3.2 COBS example {raw[:4].hex() or '[]'}{'...' if len(raw) > 4 else ''} -> {e[:4].hex()}"
              f"{'...' if len(e) > 4 else ''}",
              w.cobs_encode(raw) == e and w.cobs_decode(e) == raw, w.cobs_encode(raw).hex())
    # §3.2 decoder: zero code byte, code past the end; non-canonical accepted (§3.4 step 3 MAY)
    for bad in ("00", "05 11 22", "03 11 22 02"):
        try:
            w.cobs_decode(bytes.fromhex(bad))
            ok = False
        except w.CobsError:
            ok = True
        check(f"§3.2 COBS decode rejects {bad}", ok)
    check("§3.4 step 3 non-canonical COBS (last block 0xFF without 01) decodes to the same bytes",
          w.cobs_decode(b"\xff" + b"\x07" * 254) == b"\x07" * 254)
    # §7.1 by hand
    head = bytes.fromhex("0183020000000300")
    check("§7.1 CRC-32C of Start frame is 0x6714BC5B", w.crc32c(head) == 0x6714BC5B, hex(w.crc32c(head)))
    check("§7.1 Start frame COBS by hand",
          w.encode_frame(2, "Start", {"request_id": 3}) ==
          bytes.fromhex("04 01 83 02 01 01 02 03 05 5b bc 14 67 00"))
    # §3.1 size bound n + n/254 + 1, checked on worst-case (all non-zero) inputs
    ok = all(len(w.cobs_encode(b"\x01" * n)) <= n + n // 254 + 1 for n in range(0, 1035))
    check("§3.1 COBS length bound holds for 0..1034 non-zero bytes; 1034 -> 1039",
          ok and len(w.cobs_encode(b"\x01" * 1034)) == 1039)
    # §6: samples per block = floor(999 / (2 x channels)) fits the 1024-byte payload exactly
    ok = all(25 + 2 * (999 // (2 * c)) * c <= 1024 < 25 + 2 * (999 // (2 * c) + 1) * c for c in range(1, 9))
    check("§6 samples-per-block limit is the largest count fitting 1024 payload bytes "
          "(62 with 8 channels, 499 with 1)", ok and 999 // 16 == 62 and 999 // 2 == 499)
    check("§7 prose names the Log code points U+0394 and U+00B5 used in LONG_LOG_TEXT",
          "U+0394" in SPEC_TEXT and "U+00B5" in SPEC_TEXT and LONG_LOG_TEXT[0] == "\u0394"
          and "\u00b5" in LONG_LOG_TEXT)
    for conv, want in [([1, 2], 2), ([-1, -2], -2), ([1, 2, 3, 4], 3), ([-1, -2, -3, -4], -3),
                       ([0, 1, 1], 1), ([0, 0, 1], 0), ([-32768, -32768], -32768), ([5], 5)]:
        check(f"§4.2 averaged code of {conv} rounds to nearest, ties away from zero: {want}",
              w.average_code(conv) == want, str(w.average_code(conv)))
    check("§8 reserved types are exactly 0x00, 0x08-0x7F, 0x80, 0x8A-0xFF",
          w.RESERVED == {0x00, 0x80} | set(range(0x08, 0x80)) | set(range(0x8A, 0x100)))


# ---------------------------------------------------------------- per-vector checks

def check_vector(name, seq, raw, wire, rng):
    if name not in EXPECTED:
        check(f"[{name}] known row", False, "row not described in §7 prose / not in EXPECTED")
        return
    t, fields = EXPECTED[name]
    p = f"[{name}]"
    check(f"{p} wire ends with the only 0x00", wire.endswith(b"\x00") and wire.count(0) == 1)
    check(f"{p} COBS-decoded wire equals raw frame column", w.cobs_decode(wire[:-1]) == raw,
          w.cobs_decode(wire[:-1]).hex(" "))
    check(f"{p} COBS-encoded raw frame equals wire column", w.cobs_encode(raw) + b"\x00" == wire)
    check(f"{p} CRC-32C of raw frame", w.crc32c(raw[:-4]) == int.from_bytes(raw[-4:], "little"),
          f"computed 0x{w.crc32c(raw[:-4]):08x}")
    check(f"{p} header: version 1, type 0x{t:02x}, seq {seq}",
          raw[0] == 1 and raw[1] == t and int.from_bytes(raw[2:6], "little") == seq,
          raw[:6].hex(" "))

    whole = w.Decoder().feed(wire)
    split, _ = feed_chunked(wire, rng)
    check(f"{p} streaming decode: one event, same whole and in random chunks",
          len(whole) == 1 and [summary(e) for e in split] == [summary(e) for e in whole],
          f"whole={whole} split={split}")
    if len(whole) != 1:
        return
    ev = whole[0]
    want_kind = "unknown_type" if isinstance(fields, bytes) else "frame"
    if not check(f"{p} decoder outcome is {want_kind!r}", ev.kind == want_kind, f"{ev.kind}: {ev.detail}"):
        return
    check(f"{p} decoder raw frame and seq", ev.raw == raw and ev.seq == seq, f"seq {ev.seq}")
    if isinstance(fields, bytes):
        check(f"{p} type is reserved in §8", t in w.RESERVED)
        check(f"{p} payload as described", ev.payload == fields, ev.payload.hex(" ") if ev.payload else "")
        again = w.cobs_encode(w.encode_raw_frame(ev.seq, ev.type, ev.payload)) + b"\x00"
        check(f"{p} re-encoded frame identical", again == wire, again.hex(" "))
        return
    got = f32(ev.fields) if ev.fields is not None else None
    diffs = [k for k in set(fields) | set(got or {}) if (got or {}).get(k) != f32(fields).get(k)]
    check(f"{p} parsed fields equal the §7 prose", got == f32(fields),
          f"VECTOR CONTRADICTS PROSE in {sorted(diffs)}: bytes say "
          f"{ {k: (got or {}).get(k) for k in sorted(diffs)} }, prose says "
          f"{ {k: fields.get(k) for k in sorted(diffs)} }")
    again = w.encode_frame(ev.seq, ev.type, ev.fields)
    check(f"{p} re-encoding the parsed message gives identical wire bytes", again == wire,
          again.hex(" "))
    from_prose = w.encode_frame(seq, t, fields)
    check(f"{p} encoding the §7 prose values gives the wire bytes", from_prose == wire,
          from_prose.hex(" "))
    check_claims(name, seq, ev.fields, raw, wire, p)


def check_claims(name, seq, f, raw, wire, p):
    """Statements the prose makes about a row beyond its field values."""
    if name == "Status":
        check(f"{p} frames_sent equals this frame's seq + 1 (§4.4)",
              f["frames_sent"] == (seq + 1) & 0xFFFFFFFF,
              f"VECTOR CONTRADICTS §4.4: frames_sent {f['frames_sent']}, seq {seq}")
        check(f"{p} dropped counters in table order queue_full/link/adc = 0/62/0",
              (f["dropped_queue_full"], f["dropped_link"], f["dropped_adc"]) == (0, 62, 0))
    if name == "TriggerEdge (output line)":
        check(f"{p} output line (bit 7) driven while idle has sample_index all ones (§4.3)",
              f["line"] & w.OUTPUT_LINE and f["sample_index"] == w.NO_SAMPLE,
              f"sample_index 0x{f['sample_index']:x}")
        check(f"{p} rising edge with edge_count 1 fits §5 (output lines low at power-on): "
              "the first edge a line can have is a rise",
              f["polarity"] == 1 and f["edge_count"] == 1, str(f))
    if name.startswith("SampleBlock"):
        check(f"{p} codes are 2 x sample_count x popcount(mask) bytes (§4.2)",
              len(raw) - 10 == 25 + 2 * f["sample_count"] * w.popcount(f["channel_mask"]))
        check(f"{p} averaging >= 1 (§4.2)", f["averaging"] >= 1)
    if name == "SampleBlock (averaged)":
        check(f"{p} period_ticks = conversion period 840 x averaging 4 (§4.2)",
              f["period_ticks"] == 840 * f["averaging"])
        check(f"{p} mask 0x84 enables channels 2 and 7, codes sample-major ascending",
              [i for i in range(8) if f["channel_mask"] >> i & 1] == [2, 7]
              and w.samples(f) == [(-5, 12000), (7, 11990)], str(w.samples(f)))
    if name == "Log (long, UTF-8)":
        text = f["text"].encode("utf-8")
        check(f"{p} text is 301 bytes of UTF-8 (§7)", len(text) == 301, f"{len(text)} bytes")
        enc = wire[:-1]
        blocks, i = [], 0
        while i < len(enc):
            blocks.append(enc[i])
            i += enc[i]
        check(f"{p} the frame holds a COBS block of 254 non-zero bytes (code 0xFF)",
              0xFF in blocks, str(blocks))


# ---------------------------------------------------------------- §3.3 sequence numbers

def check_sequence():
    def seqs(*frames, dec=None):
        dec = dec or w.Decoder()
        out = dec.feed(b"".join(frames))
        return [(e.seq, e.seq_note) for e in out if e.seq is not None], dec

    start = lambda s, rid=1: w.encode_frame(s, "Start", {"request_id": rid})  # noqa: E731
    got, dec = seqs(start(1000), start(1001))
    check("§3.3 first frame after attaching only sets last (seq 1000 is no loss)",
          got == [(1000, "first"), (1001, "in_order")] and dec.seq.lost == 0, str(got))
    got, dec = seqs(start(5), start(9))
    check("§3.3 d = 3 frames lost", got[1] == (9, "lost 3") and dec.seq.lost == 3, str(got))
    got, dec = seqs(start(5), start(5, 2), start(6))
    check("§3.3 duplicate seq is dropped and counted",
          got == [(5, "first"), (6, "in_order")] and dec.seq.duplicates == 1
          and dec.counts["duplicate"] == 1 and dec.counts["frame"] == 2, str(got))
    dec = w.Decoder(keep_duplicates=True)
    got, _ = seqs(start(5), start(5), dec=dec)
    check("§3.3 duplicate kept on request is marked 'duplicate'", got == [(5, "first"), (5, "duplicate")])
    got, dec = seqs(start(0xFFFFFFFF), start(0))
    check("§3.3 wrap 0xFFFFFFFF -> 0 is in order", got[1] == (0, "in_order"), str(got))
    got, dec = seqs(start(100), start(100 + 2**31))                  # d = 2^31 - 1
    check("§3.3 d = 2^31 - 1 is a loss", got[1][1] == f"lost {2**31 - 1}", str(got))
    got, dec = seqs(start(100), start(101 + 2**31), start(102 + 2**31))   # d = 2^31
    check("§3.3 d = 2^31 is a restart, counting continues from seq",
          [n for _, n in got] == ["first", "restart", "in_order"] and dec.seq.lost == 0, str(got))
    got, dec = seqs(start(100), start(3), start(4))
    check("§3.3 seq going back (device reset) is a restart, then in order",
          [n for _, n in got] == ["first", "restart", "in_order"] and dec.seq.restarts == 1, str(got))
    tx = w.Sender(0xFFFFFFFF)
    got, dec = seqs(tx.frame("Start", {"request_id": 1}), tx.frame("Stop", {"request_id": 2}))
    check("Sender wraps seq 0xFFFFFFFF -> 0", got == [(0xFFFFFFFF, "first"), (0, "in_order")], str(got))
    # frames whose seq could be read: decoded, unknown type, step 6, step 8 all set last
    mixed = [start(10), frame(11, 0x40, b"\x00\x01"), frame(12, 0x01, b"\x01", version=2),
             frame(13, 0x03, bytes(3)), start(14)]
    got, dec = seqs(*mixed)
    check("§3.3 unknown type, unsupported version and malformed frames count as received",
          [n for _, n in got] == ["first"] + ["in_order"] * 4 and dec.seq.lost == 0, str(got))
    # frames rejected at steps 2-5 do not: the gap shows in the next good frame
    bad_crc = bytearray(w.encode_raw_frame(11, 0x83, b"\x01\x00"))
    bad_crc[-1] ^= 1
    got, dec = seqs(start(10), w.cobs_encode(bytes(bad_crc)) + b"\x00", start(12))
    check("§3.3 a CRC-rejected frame shows as 1 lost at the next frame",
          got == [(10, "first"), (12, "lost 1")], str(got))
    got, dec = seqs(start(10), start(11))
    check("§3.3 a loss at the end of a stream shows nothing until the next frame",
          dec.seq.lost == 0 and dec.seq.last == 11)
    # device frames of §7 re-sequenced: dropping one shows exactly
    names = ["DeviceInfo", "SampleBlock", "TriggerEdge", "Status", "Log"]
    frames = [w.encode_frame(i, EXPECTED[n][0], EXPECTED[n][1]) for i, n in enumerate(names)]
    got, dec = seqs(*(frames[:2] + frames[3:]))
    check("§3.3 dropping one of five frames shows as exactly 1 lost",
          dec.seq.lost == 1 and dec.seq.restarts == 0, str(got))


# ---------------------------------------------------------------- §3.4 receiving steps

def check_receiving(rows, rng):
    wires = [r[3] for r in rows]
    kinds_want = ["unknown_type" if isinstance(EXPECTED.get(r[0], (0, {}))[1], bytes) else "frame"
                  for r in rows]
    stream = b"".join(wires)
    base = [summary(e) for e in w.Decoder().feed(stream)]
    evs, _ = feed_chunked(stream, rng)
    check(f"concatenated stream of {len(rows)} vectors decodes, chunked == whole",
          kinds(evs) == kinds_want and [summary(e) for e in evs] == base)
    check("§3.4 step 7: both sides parse every defined type (a host parses commands too)",
          sum(k == "frame" for k in kinds(evs)) == len(rows) - 1)

    # step 1: empty frames are ignored, not a rejection
    dec = w.Decoder()
    out = dec.feed(b"\x00\x00" + wires[0] + b"\x00\x00\x00" + wires[1])
    check("§3.4 step 1: empty frames ignored, counted apart, not rejections",
          kinds(out) == ["frame", "frame"] and dec.counts["empty"] == 5 and dec.rejected == 0,
          str(dec.counts))
    # step 2: encoded > 1039 bytes
    dec = w.Decoder()
    out = dec.feed(b"\x41" * 1040 + b"\x00" + wires[1])
    check("§3.4 step 2: 1040 encoded bytes is 'oversized', next frame decodes",
          [(e.kind, e.step) for e in out] == [("oversized", 2), ("frame", 8)])
    dec = w.Decoder()
    for _ in range(100):
        dec.feed(b"\x41" * 1000)
    stored = len(dec._buf)
    out = dec.feed(b"\x00" + wires[1])
    check("§3.4 step 2: 100000-byte run: at most 1040 bytes stored, one 'oversized', next decodes",
          stored <= 1040 and kinds(out) == ["oversized", "frame"], f"stored {stored}")
    big = frame(10, 0x40, b"\x5a" * 1024)
    out = w.Decoder().feed(big)
    check("payload of 1024 non-zero bytes: 1039 encoded bytes, accepted (unknown type skipped)",
          len(big) == 1040 and kinds(out) == ["unknown_type"])
    # step 3: invalid COBS
    out = w.Decoder().feed(bytes.fromhex("05 11 22 00") + wires[1])
    check("§3.4 step 3: code byte pointing past the end is 'invalid_cobs'",
          [(e.kind, e.step) for e in out] == [("invalid_cobs", 3), ("frame", 8)], show(out))
    raw = w.encode_raw_frame(3, 0x07, b"\x02" + b"a" * 249)      # ends in 254 non-zero bytes
    enc = w.cobs_encode(raw)
    check("(test setup) canonical encoding ends with a lone 01 block", enc[-1] == 1 and enc[-256] == 0xFF)
    out = w.Decoder().feed(enc[:-1] + b"\x00")
    check("§3.4 step 3: non-canonical encoding (no trailing 01) accepted",
          kinds(out) == ["frame"] and out[0].raw == raw, show(out))
    # step 4: too short, oversized raw (an encoded frame <= 1039 bytes can decode to 1035-1038)
    out = w.Decoder().feed(w.cobs_encode(bytes.fromhex("010100000000ffffff")) + b"\x00")
    check("§3.4 step 4: 9-byte raw frame is 'too_short'", [(e.kind, e.step) for e in out] == [("too_short", 4)])
    raw = w.encode_raw_frame(11, 0x40, b"\x00" * 1024)
    raw = raw[:-4] + b"\x00" * 4
    raw += w.crc32c(raw).to_bytes(4, "little")
    enc = w.cobs_encode(raw)
    out = w.Decoder().feed(enc + b"\x00")
    check("§3.4 step 4: 1039 encoded bytes -> 1038-byte raw frame (CRC ok) is 'oversized'",
          len(enc) == 1039 and len(raw) == 1038 and [(e.kind, e.step) for e in out] == [("oversized", 4)],
          f"{len(enc)} {len(raw)} {show(out)}")
    raw1035 = bytes(w.encode_raw_frame(11, 0x40, b"\x00" * 1024)) + b"\x00"   # 1035 bytes, bad CRC
    out = w.Decoder().feed(w.cobs_encode(raw1035) + b"\x00")
    check("§3.4 step 4 precedes step 5: 1035-byte raw frame with a bad CRC is 'oversized'",
          [(e.kind, e.step) for e in out] == [("oversized", 4)], show(out))
    # step 5
    raw = bytearray(rows[1][2])
    raw[-1] ^= 0xFF
    out = w.Decoder().feed(w.cobs_encode(bytes(raw)) + b"\x00")
    check("§3.4 step 5: wrong CRC is 'crc_mismatch', seq not read",
          [(e.kind, e.step, e.seq) for e in out] == [("crc_mismatch", 5, None)])
    # step 6
    v2 = frame(77, 0x01, b"\x01\x02\x03", version=2)
    dec = w.Decoder()
    out = dec.feed(wires[0] + v2 + wires[1])
    check("§3.4 step 6: version-2 frame with correct CRC: 'unsupported_version', version and seq reported",
          kinds(out) == ["frame", "unsupported_version", "frame"]
          and out[1].version == 2 and out[1].seq == 77, show(out))
    v2 = frame(78, 0xEE, b"", version=0xFF)
    out = w.Decoder().feed(v2)
    check("§3.4 step 6 precedes step 7: unknown type in version 255 is 'unsupported_version'",
          kinds(out) == ["unsupported_version"])
    # step 7: every reserved type (§8) is skipped, every defined type is parsed
    bad = [t for t in range(256)
           if kinds(w.Decoder().feed(frame(1, t, b"\x00\x01\x02")))
           != (["unknown_type"] if t in w.RESERVED else ["malformed" if t != 0x07 else "frame"])]
    check("§3.4 step 7 / §8: all 256 type bytes: reserved skipped (0x00 and 0x80 included), "
          "defined parsed", not bad, str([hex(t) for t in bad]))
    out = w.Decoder().feed(frame(1, 0x00, b"") + frame(2, 0x80, b"\x05"))
    check("§3.4 step 7: unknown types carry seq and payload",
          [(e.kind, e.seq, e.type, e.payload) for e in out]
          == [("unknown_type", 1, 0x00, b""), ("unknown_type", 2, 0x80, b"\x05")])

    # counters per reason over one mixed stream
    dec = w.Decoder()
    mixed = (b"\x00" + wires[0] + b"\x01\x05\x00" + b"\x41" * 2000 + b"\x00"
             + frame(77, 0x01, b"", version=2) + frame(5, 0x07, b"\x09")
             + w.cobs_encode(raw1035) + b"\x00"
             + w.cobs_encode(bytes.fromhex("0101000000")) + b"\x00"
             + frame(1, 0x83, b"\x01\x00")[:-5] + b"\x01\x01\x01\x01\x00" + stream)
    for c in chunks(mixed, rng, 50):
        dec.feed(c)
    want = {"frame": 1 + len(rows) - 1, "unknown_type": 1, "empty": 1, "duplicate": 0,
            "oversized": 2, "invalid_cobs": 1, "too_short": 1, "crc_mismatch": 1,
            "unsupported_version": 1, "malformed": 1}
    check("counters per reason over a mixed stream; 'rejected' = steps 2-6 and 8",
          dec.counts == want and dec.rejected == 7, str(dec.counts))


# ---------------------------------------------------------------- §3.4 step 8: malformed

def device_info(**over) -> dict:
    f = dict(EXPECTED["DeviceInfo"][1])
    f["channels"] = [dict(c) for c in f["channels"]]
    f.update(over)
    return f


def devinfo_payload(board=b"F405", serial=b"SN1", rates=(10000,), channels=((0, 1, b"I0"),),
                    head=None) -> bytes:
    """DeviceInfo payload built by hand, so that out-of-list values can be written."""
    out = bytearray(head if head is not None else struct.pack("<BBBBIBBBB", 0, 1, 0, 1, 84_000_000, 16, 1, 4, 2))
    out += bytes([len(board)]) + board + bytes([len(serial)]) + serial
    out += bytes([len(rates)]) + b"".join(struct.pack("<I", r) for r in rates)
    out += bytes([len(channels)])
    for index, quantity, name in channels:
        out += bytes([index, quantity, len(name)]) + name + struct.pack("<ff", 0.001, 0.0)
    return bytes(out)


def sample_block(first=0, mask=0b11, averaging=1, count=1, codes=None) -> bytes:
    k = count * w.popcount(mask)
    codes = list(range(k)) if codes is None else codes
    return struct.pack(f"<QQIBHH{len(codes)}h", first, 0, 840, mask, averaging, count, *codes)


def check_malformed(rows):
    payload_of = {r[0]: r[2][6:-4] for r in rows}
    # 1. a length other than the layout's: every fixed-layout row, one byte less and one more
    fixed = [n for n, (t, f) in EXPECTED.items()
             if isinstance(f, dict) and t not in (0x01, 0x02, 0x07)]
    bad = []
    for n in fixed:
        t = EXPECTED[n][0]
        for p in (payload_of[n][:-1], payload_of[n] + b"\x00", b""):
            out = w.Decoder().feed(frame(5, t, p))
            if kinds(out) != ["malformed"]:
                bad.append(f"{n} len {len(p)}: {kinds(out)}")
    check(f"§3.4 step 8 length: {len(fixed)} fixed layouts, one byte short / left over / empty",
          not bad, "; ".join(bad))
    cases = [
        ("DeviceInfo truncated (last byte)", 0x01, payload_of["DeviceInfo"][:-1]),
        ("DeviceInfo one byte left over", 0x01, payload_of["DeviceInfo"] + b"\x00"),
        ("DeviceInfo string length past the end", 0x01, devinfo_payload()[:12] + b"\x20F405"),
        ("SampleBlock header only 24 bytes", 0x02, sample_block()[:24]),
        ("SampleBlock one code missing", 0x02, sample_block()[:-2]),
        ("SampleBlock odd byte left over", 0x02, sample_block() + b"\x00"),
        ("SampleBlock one code too many", 0x02, sample_block() + b"\x00\x00"),
        ("SampleBlock mask 0 with a code", 0x02, sample_block(mask=0, count=3, codes=[1])),
        ("SampleBlock channel_mask 0, sample_count 5, no codes", 0x02, sample_block(mask=0, count=5)),
        ("SampleBlock channel_mask 0, 0 samples", 0x02, sample_block(mask=0, count=0)),
        ("SampleBlock channel_mask 0 and averaging 0 (two defects)", 0x02,
         sample_block(mask=0, count=0, averaging=0)),
        ("Log empty payload (no level)", 0x07, b""),
        # 2. invalid UTF-8
        ("board invalid UTF-8 (0xFF)", 0x01, devinfo_payload(board=b"F4\xff5")),
        ("serial invalid UTF-8 (truncated sequence)", 0x01, devinfo_payload(serial=b"SN\xc2")),
        ("channel name invalid UTF-8 (overlong NUL)", 0x01, devinfo_payload(channels=((0, 1, b"\xc0\x80"),))),
        ("channel name invalid UTF-8 (surrogate)", 0x01, devinfo_payload(channels=((0, 1, b"\xed\xa0\x80"),))),
        ("Log text invalid UTF-8", 0x07, b"\x02ok\xfe"),
        ("Log text invalid UTF-8 (above U+10FFFF)", 0x07, b"\x02\xf4\x90\x80\x80"),
        ("Log text invalid UTF-8 (lead byte F5)", 0x07, b"\x02\xf5\x80\x80\x80"),
        ("Log text RFC 3629 overlong 3-byte '/' (E0 80 AF)", 0x07, b"\x02\xe0\x80\xaf"),
        ("Log text RFC 3629 overlong 4-byte '/' (F0 80 80 AF)", 0x07, b"\x02\xf0\x80\x80\xaf"),
        ("Log text RFC 3629 low surrogate (ED B0 80)", 0x07, b"\x02\xed\xb0\x80"),
        ("Log text CESU-8 surrogate pair for U+1F600", 0x07, b"\x02\xed\xa0\xbd\xed\xb8\x80"),
        ("board: a lone continuation byte", 0x01, devinfo_payload(board=b"\x80")),
        # 3. strings over their §6 limits
        ("board of 33 bytes", 0x01, devinfo_payload(board=b"B" * 33)),
        ("serial of 33 bytes", 0x01, devinfo_payload(serial=b"S" * 33)),
        ("channel name of 17 bytes", 0x01, devinfo_payload(channels=((0, 1, b"N" * 17),))),
        # 4. enums
        ("TriggerEdge polarity 2", 0x03, bytes.fromhex("01 02") + bytes(20)),
        ("TriggerEdge polarity 255", 0x03, bytes.fromhex("81 ff") + bytes(20)),
        ("DriveTrigger level 2", 0x86, bytes.fromhex("0600 00 02 00000000")),
        ("DriveTrigger level 255", 0x86, bytes.fromhex("0600 00 ff 10000000")),
        ("Log level 4", 0x07, b"\x04hi"),
        ("Log level 255", 0x07, b"\xff"),
        # 5. DeviceInfo counts and channel index
        ("DeviceInfo rate_count 9", 0x01, devinfo_payload(rates=tuple(range(1, 10)))),
        ("DeviceInfo channel_count 9", 0x01,
         devinfo_payload(channels=tuple((i % 8, 0, b"C") for i in range(9)))),
        ("DeviceInfo channel index 8", 0x01, devinfo_payload(channels=((8, 0, b"C8"),))),
        ("DeviceInfo channel index 255", 0x01, devinfo_payload(channels=((255, 0, b"C"),))),
        # 6. SampleBlock averaging 0
        ("SampleBlock averaging 0", 0x02, sample_block(averaging=0)),
        ("SampleBlock averaging 0, 0 samples", 0x02, sample_block(averaging=0, count=0)),
    ]
    for label, t, payload in cases:
        dec = w.Decoder()
        out = dec.feed(frame(4, 0x83, b"\x01\x00") + frame(5, t, payload) + frame(6, 0x83, b"\x02\x00"))
        check(f"§3.4 step 8 malformed: {label}",
              [(e.kind, e.seq, e.seq_note) for e in out]
              == [("frame", 4, "first"), ("malformed", 5, "in_order"), ("frame", 6, "in_order")]
              and dec.rejected == 1, show(out))


def check_not_malformed():
    """Values outside a documented range but not on the step-8 list pass the decoder."""
    nan = struct.pack("<f", float("nan"))
    inf = struct.pack("<f", float("inf"))
    cases = [
        ("Configure channel_mask 0", 0x82, struct.pack("<HIBH", 2, 100000, 0, 1)),
        ("Configure averaging 0", 0x82, struct.pack("<HIBH", 2, 100000, 1, 0)),
        ("Configure rate 0", 0x82, struct.pack("<HIBH", 2, 0, 1, 1)),
        ("WriteCalibration channel 9", 0x87, struct.pack("<HBff", 7, 9, 0.5, 0.0)),
        ("WriteCalibration channel 255, NaN scale, inf offset", 0x87,
         struct.pack("<HB", 7, 255) + nan + inf),
        ("DriveTrigger line with bit 7 set (0x85)", 0x86, struct.pack("<HBBI", 6, 0x85, 1, 0)),
        ("TriggerEdge line 0xFF", 0x03, struct.pack("<BBIQQ", 0xFF, 1, 0, 0, 0)),
        ("DeviceInfo protocol_version 2, flags 0xFF, 200 trigger inputs, 255 outputs", 0x01,
         devinfo_payload(head=struct.pack("<BBBBIBBBB", 9, 9, 9, 2, 0, 0, 0xFF, 200, 255))),
        ("DeviceInfo channel quantity 7, index 7", 0x01, devinfo_payload(channels=((7, 7, b"X"),))),
        ("DeviceInfo channels descending and duplicated", 0x01,
         devinfo_payload(channels=((3, 0, b"A"), (1, 0, b"B"), (1, 1, b"C")))),
        ("DeviceInfo 0 rates, 0 channels, empty strings", 0x01,
         devinfo_payload(board=b"", serial=b"", rates=(), channels=())),
        ("DeviceInfo 8 rates, 8 channels, 32/32/16-byte strings", 0x01,
         devinfo_payload(board=b"B" * 32, serial="\u00e9".encode() * 16, rates=tuple(range(8)),
                         channels=tuple((i, 0, b"N" * 16) for i in range(8)))),
        ("DeviceInfo strings holding U+0000 and a BOM", 0x01, devinfo_payload(board=b"a\x00b", serial=b"\xef\xbb\xbfS")),
        ("SampleBlock of 0 samples", 0x02, sample_block(count=0)),
        ("Log text U+10FFFF and noncharacter U+FFFF (well-formed under RFC 3629)", 0x07,
         b"\x02\xf4\x8f\xbf\xbf\xef\xbf\xbf"),
        ("SampleBlock averaging 65535", 0x02, sample_block(averaging=65535)),
        ("SampleBlock 499 samples of 1 channel (payload 1023)", 0x02, sample_block(mask=1, count=499)),
        ("Status state 9", 0x04, bytes(56) + b"\x09"),
        ("CommandResult code 200 for type 0x40", 0x06, struct.pack("<HBB", 1, 0x40, 200)),
        ("Log level 3 with empty text", 0x07, b"\x03"),
        ("Log 1023 bytes of text", 0x07, b"\x00" + "\u20ac".encode() * 341),
        ("TimeSyncReply tx_tick < rx_tick", 0x05, struct.pack("<IQQ", 1, 10, 5)),
    ]
    for label, t, payload in cases:
        out = w.Decoder().feed(frame(5, t, payload))
        check(f"§3.4 step 8 passes (not on the list): {label}", kinds(out) == ["frame"], show(out))


# ---------------------------------------------------------------- §4.6 CommandResult rules

def check_command_results(rows):
    def answer(data: bytes):
        out = w.Decoder(report_empty=True).feed(data)
        return [w.protocol_answer(e) for e in out]

    cr = lambda rid, t, code: ("answer", {"request_id": rid, "command": t, "code": code})  # noqa: E731
    check("§4.6 well-formed command is executed", answer(frame(1, 0x83, b"\x03\x00")) == [("execute", None)])
    check("§4.6 unknown type 0x40 -> UnknownCommand, request id from its first two bytes",
          answer(dict((r[0], r[3]) for r in rows)["Unknown type 0x40"])
          == [cr(0x0100, 0x40, w.UNKNOWN_COMMAND)])
    check("§4.6 reserved 0x8A with a 1-byte payload -> UnknownCommand, request id 0",
          answer(frame(1, 0x8A, b"\x07")) == [cr(0, 0x8A, w.UNKNOWN_COMMAND)])
    check("§4.6 device -> host type (CommandResult 0x06) sent to a device -> UnknownCommand",
          answer(frame(1, 0x06, struct.pack("<HBB", 9, 0x81, 0))) == [cr(9, 0x06, w.UNKNOWN_COMMAND)])
    check("§4.6 device -> host type with a malformed payload (TriggerEdge polarity 2) -> UnknownCommand, "
          "request id from its first two payload bytes",
          answer(frame(1, 0x03, bytes.fromhex("05 02") + bytes(20))) == [cr(0x0205, 0x03, w.UNKNOWN_COMMAND)])
    check("§4.6 device -> host type malformed by length (Status of 3 bytes) -> UnknownCommand",
          answer(frame(1, 0x04, b"\x11\x22\x33")) == [cr(0x2211, 0x04, w.UNKNOWN_COMMAND)])
    check("§4.6 device -> host type, 1-byte malformed payload (Log level 9) -> UnknownCommand, request id 0",
          answer(frame(1, 0x07, b"\x09")) == [cr(0, 0x07, w.UNKNOWN_COMMAND)])
    check("§4.6 defined command the device does not implement, malformed -> UnknownCommand",
          [w.protocol_answer(e, implemented=w.HOST_TO_DEVICE - {0x87})
           for e in w.Decoder().feed(frame(1, 0x87, b"\x07\x00\x01"))] == [cr(7, 0x87, w.UNKNOWN_COMMAND)])
    out = w.Decoder().feed(frame(1, 0x82, b"\x02\x00\x39\x30\x00\x00\x03\x01"))   # rate 12345, 1 byte short
    check("§4.6 malformed Configure (unlisted rate readable) -> InvalidArgument, not UnsupportedRate",
          [w.protocol_answer(e) for e in out] == [cr(2, 0x82, w.INVALID_ARGUMENT)])
    check("§4.6 malformed command (Stop with 3 bytes) -> InvalidArgument with its request id",
          answer(frame(1, 0x84, b"\x34\x12\x00")) == [cr(0x1234, 0x84, w.INVALID_ARGUMENT)])
    check("§4.6 malformed command of 1 byte -> InvalidArgument, request id 0",
          answer(frame(1, 0x85, b"\x34")) == [cr(0, 0x85, w.INVALID_ARGUMENT)])
    check("§4.6 DriveTrigger level 2 -> InvalidArgument",
          answer(frame(1, 0x86, struct.pack("<HBBI", 6, 0, 2, 0))) == [cr(6, 0x86, w.INVALID_ARGUMENT)])
    bad_crc = bytearray(w.encode_raw_frame(1, 0x83, b"\x01\x00"))
    bad_crc[-2] ^= 4
    check("§4.6 frames rejected at steps 2-6 are not answered; empty frames ignored",
          answer(b"\x00" + b"\x41" * 1100 + b"\x00" + b"\x05\x01\x00" + w.cobs_encode(b"\x01" * 9) + b"\x00"
                 + w.cobs_encode(bytes(bad_crc)) + b"\x00" + frame(1, 0x83, b"\x01\x00", version=2))
          == [("ignore", None)] + [("silent", None)] * 5)
    # range checks the device makes itself (§3.4 step 8 last sentence, §4.6, §5)
    info = device_info()
    conf = lambda rate, mask, avg: {"request_id": 1, "sample_rate_hz": rate, "channel_mask": mask,  # noqa: E731
                                    "averaging": avg}
    cal = lambda ch, s=0.5, o=0.0: {"request_id": 1, "channel": ch, "scale": s, "offset": o}  # noqa: E731
    results = {
        "Configure mask 0 -> InvalidArgument": (w.device_check("Configure", conf(100000, 0, 1), info, False), 2),
        "Configure averaging 0 -> InvalidArgument": (w.device_check("Configure", conf(100000, 3, 0), info, False), 2),
        "Configure rate 12345 -> UnsupportedRate": (w.device_check("Configure", conf(12345, 3, 1), info, False), 4),
        "Configure rate 12345 and mask 0 -> UnsupportedRate (before InvalidArgument)":
            (w.device_check("Configure", conf(12345, 0, 1), info, False), 4),
        "Configure rate 12345, averaging 2000 -> UnsupportedRate":
            (w.device_check("Configure", conf(12345, 3, 2000), info, False), 4),
        "Configure rate 12345 and mask 0 while running -> Busy (first)":
            (w.device_check("Configure", conf(12345, 0, 1), info, True), 3),
        "Configure mask 0x04 (channel 2 not listed) -> InvalidArgument":
            (w.device_check("Configure", conf(100000, 0x04, 1), info, False), 2),
        "Configure averaging 1024 -> Ok (railtrace limit)":
            (w.device_check("Configure", conf(100000, 3, 1024), info, False), 0),
        "Configure averaging 1025 -> InvalidArgument (railtrace limit)":
            (w.device_check("Configure", conf(100000, 3, 1025), info, False), 2),
        "Configure averaging 65535 on a device without a limit -> Ok":
            (w.device_check("Configure", conf(10000, 3, 65535), info, False, max_averaging=65535), 0),
        "Configure period_ticks over u32 (1 Hz x 1024 at 84 MHz) -> InvalidArgument (§5)":
            (w.device_check("Configure", conf(1, 3, 1024), device_info(rates=[1]), False), 2),
        "Configure period_ticks 84000 x 51130 = 4294920000 fits a u32 (no averaging limit) -> Ok":
            (w.device_check("Configure", conf(1000, 3, 51130), device_info(rates=[1000]), False,
                            max_averaging=65535), 0),
        "Configure period_ticks 84000 x 51131 over u32 (no averaging limit) -> InvalidArgument (§5)":
            (w.device_check("Configure", conf(1000, 3, 51131), device_info(rates=[1000]), False,
                            max_averaging=65535), 2),
        "Configure unlisted rate with period_ticks over u32 -> UnsupportedRate (first)":
            (w.device_check("Configure", conf(1, 3, 1024), info, False), 4),
        "Configure period_ticks over u32 while running -> Busy (first)":
            (w.device_check("Configure", conf(1, 3, 1024), device_info(rates=[1]), True), 3),
        "WriteCalibration channel 9 while running -> Busy (first)":
            (w.device_check("WriteCalibration", cal(9), info, True), 3),
        "Configure while running -> Busy": (w.device_check("Configure", conf(100000, 3, 1), info, True), 3),
        "Configure 100000 Hz mask 3 -> Ok": (w.device_check("Configure", conf(100000, 3, 1), info, False), 0),
        "WriteCalibration channel 9 -> InvalidArgument": (w.device_check("WriteCalibration", cal(9), info, False), 2),
        "WriteCalibration NaN scale -> InvalidArgument":
            (w.device_check("WriteCalibration", cal(1, float("nan")), info, False), 2),
        "WriteCalibration channel 1 -> Ok": (w.device_check("WriteCalibration", cal(1), info, False), 0),
        "DriveTrigger line 0x80 -> InvalidArgument":
            (w.device_check("DriveTrigger", {"line": 0x80, "level": 1, "pulse_ticks": 0}, info, False), 2),
        "DriveTrigger line 2 of 2 outputs -> InvalidArgument":
            (w.device_check("DriveTrigger", {"line": 2, "level": 1, "pulse_ticks": 0}, info, False), 2),
        "DriveTrigger line 1 of 2 outputs -> Ok":
            (w.device_check("DriveTrigger", {"line": 1, "level": 1, "pulse_ticks": 0}, info, True), 0),
    }
    for label, (got, want) in results.items():
        check(f"§4.6 device range check: {label}", got == want, f"got {got}")
    # out-of-range values that pass the decoder (§3.4 step 8, last sentence); the device refuses them
    out = w.Decoder().feed(frame(1, 0x82, struct.pack("<HIBH", 2, 100000, 0, 1))
                           + frame(2, 0x87, struct.pack("<HBff", 7, 9, 1.0, 0.0)))
    check("Configure mask 0 and WriteCalibration channel 9 decode, then a device answers InvalidArgument",
          kinds(out) == ["frame", "frame"]
          and [w.protocol_answer(e)[0] for e in out] == ["execute", "execute"]
          and [w.device_check(e.name, e.fields, info, False) for e in out] == [2, 2], show(out))


# ---------------------------------------------------------------- device model, end to end

class Rig:
    """A Device model with a host on the other end: a Sender for commands and a host
    Decoder (which tracks the device's seq) for what comes back."""

    def __init__(self, **info_over):
        self.dev = w.Device(device_info(**info_over))
        self.tx = w.Sender()
        self.host = w.Decoder()
        self.rid = 0

    def parse(self, data: bytes) -> list[tuple]:
        out = []
        for e in self.host.feed(data):
            out.append((e.name, e.fields) if e.kind == "frame" else (e.kind, None))
        return out

    def cmd(self, name, **f) -> list[tuple]:
        self.rid += 1
        return self.parse(self.dev.receive(self.tx.frame(name, {"request_id": self.rid, **f})))

    def raw(self, data: bytes) -> list[tuple]:
        return self.parse(self.dev.receive(data))

    def wait(self, ticks) -> list[tuple]:
        return self.parse(self.dev.advance(ticks))

    def clean(self) -> bool:
        s = self.host.seq
        return s.lost == 0 and s.restarts == 0 and s.duplicates == 0 and self.host.rejected == 0


def names(msgs) -> list:
    return [n for n, _ in msgs]


def result(msgs):
    """(request_id, command, code) of the last message, which must be the CommandResult."""
    n, f = msgs[-1]
    return (f["request_id"], f["command"], f["code"]) if n == "CommandResult" else None


def check_device():
    info = device_info()
    # ---- §3.3: a device does not track the host's seq; it answers every intact frame
    dec = w.Decoder(track_seq=False)
    start = w.encode_frame(5, "Start", {"request_id": 1})
    out = dec.feed(start + start + w.encode_frame(0, "Stop", {"request_id": 2}))
    check("§3.3 device-side decoder: duplicates and a seq going back all come out, unclassified",
          [(e.kind, e.seq, e.seq_note) for e in out] == [("frame", 5, ""), ("frame", 5, ""), ("frame", 0, "")]
          and dec.counts["duplicate"] == 0, show(out))
    r = Rig()
    gs = r.tx.frame("GetStatus", {"request_id": 77})
    got = r.raw(gs + gs)
    check("§3.3/§4.6 device answers a duplicated command twice (Status + CommandResult each)",
          names(got) == ["Status", "CommandResult"] * 2
          and [f["request_id"] for n, f in got if n == "CommandResult"] == [77, 77], str(names(got)))
    r = Rig()
    a = r.raw(w.Sender().frame("GetInfo", {"request_id": 1}))
    b = r.raw(w.Sender().frame("GetInfo", {"request_id": 1}))     # restarted host: seq 0 again
    check("§3.3 a restarted host program (seq 0 again) is answered normally",
          names(a) == names(b) == ["DeviceInfo", "CommandResult"] and r.clean(), f"{names(a)} {names(b)}")
    r = Rig()
    st = r.tx.frame("Start", {"request_id": 3})
    got = r.raw(st) + r.raw(st)
    check("§3.3/§5 duplicated Start: both answered Ok, the second changes nothing",
          names(got) == ["CommandResult"] * 2 and [f["code"] for _, f in got] == [w.OK, w.OK]
          and r.dev.running, str(got))
    # host side still drops a duplicated device frame
    r = Rig()
    sent = [f + b"\x00" for f in r.dev.receive(r.tx.frame("GetStatus", {"request_id": 1})).split(b"\x00")[:-1]]
    got = r.parse(b"".join(f + f for f in sent))                   # each device frame twice
    check("§3.3 a host drops and counts a duplicated device frame",
          names(got) == ["Status", "CommandResult"] and r.host.counts["duplicate"] == 2, str(names(got)))

    # ---- §4.6: exactly one CommandResult per intact version-1 frame, whatever its type
    r = Rig()
    rng = random.Random(SEED + 1)
    stream, intact = bytearray(), 0
    for t in range(256):
        payload = bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 12)))
        if t == 0x86:
            payload = payload[:2] + b"\x00\x01\x00\x00\x00\x00"   # keep DriveTrigger on line 0
        stream += frame(t, t, payload)
        intact += 1
    stream += frame(1, 0x83, b"\x01\x00", version=2) + b"\x05\x01\x02\x00"
    got = r.raw(bytes(stream))
    res = [f for n, f in got if n == "CommandResult"]
    check("§4.6 256 intact version-1 frames of every type get exactly 256 CommandResults, in order, "
          "request id = first two payload bytes or 0; rejected frames none",
          len(res) == intact and [f["command"] for f in res] == list(range(256)), f"{len(res)} results")
    kinds_by_type = {f["command"]: f["code"] for f in res}
    check("§4.6 every non-command type (reserved and device -> host) is answered UnknownCommand",
          all(kinds_by_type[t] == w.UNKNOWN_COMMAND for t in range(256) if t not in w.HOST_TO_DEVICE))

    # ---- §4.6 / §4.4 frames_rejected counts the pieces of steps 2-6 and 8
    r = Rig()
    gs = bytearray(r.tx.frame("GetStatus", {"request_id": 9}))
    gs[6] = 0                                                        # split in two pieces
    pieces = [p for p in bytes(gs).split(b"\x00") if p]
    bad_crc = bytearray(w.encode_raw_frame(0, 0x89, b"\x01\x00"))
    bad_crc[-1] ^= 1
    got = r.raw(bytes(gs) + b"\x41\x42\x00" + w.cobs_encode(bytes(bad_crc)) + b"\x00"
                + frame(0, 0x89, b"\x01\x00", version=2) + b"\x00\x00")
    n_silent = len(got)
    got = r.raw(frame(0, 0x84, b"\x0a\x00\x00")                       # malformed command
                + frame(0, 0x03, bytes.fromhex("0b 07") + bytes(20))    # malformed device type
                + frame(0, 0x06, struct.pack("<HBB", 12, 0x81, 0)))     # well-formed device type
    check("§4.6 malformed command -> InvalidArgument; device-type frames -> UnknownCommand "
          "(polarity 7 too, request id from its first bytes)",
          [result([m]) for m in got] == [(10, 0x84, w.INVALID_ARGUMENT), (0x070B, 0x03, w.UNKNOWN_COMMAND),
                                         (12, 0x06, w.UNKNOWN_COMMAND)], str(got))
    st = r.cmd("GetStatus")[0][1]
    check("§4.6 frames_rejected: a frame split by a stray 0x00 counts 2, line noise 1, CRC 1, "
          "version 1, malformed command 1, malformed device-type frame 1; not answered at steps 2-6",
          n_silent == 0 and len(pieces) == 2 and st["frames_rejected"] == 2 + 1 + 1 + 1 + 1 + 1,
          f"answers {n_silent}, frames_rejected {st['frames_rejected']}")

    # ---- §5 default configuration before the first Configure, Stop's output
    r = Rig()
    got = r.cmd("Start") + r.wait(8400 * 10 + 5)
    check("§5 Start before any Configure: Ok, no data", names(got) == ["CommandResult"]
          and result(got)[2] == w.OK, str(got))
    got = r.cmd("Stop")
    blk = got[0][1] if got else {}
    check("§5 Stop while sampling: last partial SampleBlock, then Status, then CommandResult",
          names(got) == ["SampleBlock", "Status", "CommandResult"], str(names(got)))
    check("§5 default configuration: first listed rate (10000 Hz -> period 8400 ticks at 84 MHz), "
          "all listed channels (mask 0x03), averaging 1",
          (blk.get("period_ticks"), blk.get("channel_mask"), blk.get("averaging"), blk.get("sample_count"),
           blk.get("first_index")) == (8400, 0x03, 1, 11, 0), str({k: v for k, v in blk.items() if k != "codes"}))
    stat = got[1][1]
    check("§5 Stop row / §4.4: the Status sent by Stop has state idle; samples_acquired = samples "
          "received + drops",
          stat["state"] == w.STATE_IDLE and stat["samples_acquired"] == 11 + stat["dropped_queue_full"]
          + stat["dropped_link"] + stat["dropped_adc"], str(stat))
    got = r.cmd("Stop")
    check("§5 Stop while idle: Ok, nothing else (no Status)",
          names(got) == ["CommandResult"] and result(got)[2] == w.OK, str(got))

    # ---- conversion rate, averaging, period_ticks, blocks and periodic Status
    r = Rig()
    got = r.cmd("Configure", sample_rate_hz=100000, channel_mask=0x03, averaging=4) + r.cmd("Start")
    t0 = r.dev.tick
    got += r.wait(2 * 84_000_000 + 1) + r.cmd("Start")     # Start while running: nothing changes
    got += r.wait(3360 * 100) + r.cmd("Stop")
    blocks = [f for n, f in got if n == "SampleBlock"]
    stats = [f for n, f in got if n == "Status"]
    total = sum(b["sample_count"] for b in blocks)
    check("§5 sample rate is the conversion rate: 100000 Hz x averaging 4 -> period_ticks 3360 (§7 vector)",
          blocks and all(b["period_ticks"] == 3360 and b["averaging"] == 4 for b in blocks))
    check("§4.2 blocks contiguous from index 0, first_tick = start + index x period_ticks, "
          "at most 249 samples with 2 channels",
          all(b["first_index"] == sum(x["sample_count"] for x in blocks[:i])
              and b["first_tick"] == t0 + b["first_index"] * 3360 and 0 < b["sample_count"] <= 249
              for i, b in enumerate(blocks)), str([(b["first_index"], b["sample_count"]) for b in blocks[:4]]))
    check("§5 Start while running: Ok, indices not restarted, no Status",
          names(got).count("CommandResult") == 4 and total == 2 * 84_000_000 // 3360 + 1 + 100, str(total))
    check("§4.4 at least one Status a second while sampling, state running, frames_sent = seq + 1",
          len(stats) == 3 and [s["state"] for s in stats] == [1, 1, 0]
          and stats[0]["uptime_ticks"] == t0 + 84_000_000, str([s["uptime_ticks"] for s in stats]))
    check("§4.4 after Stop: samples_acquired equals the samples received plus the drops",
          stats[-1]["samples_acquired"] == total and r.clean(), f"{stats[-1]['samples_acquired']} vs {total}")
    conv = [w.test_signal(m, ch) for m in range(4) for ch in (0, 1)]
    check("§4.2 averaged codes of the model's test signal (mean of 4, rounded half away from zero)",
          w.samples(blocks[0])[0] == (w.average_code(conv[0::2]), w.average_code(conv[1::2])))

    # ---- §5 result precedence and Busy, end to end
    r = Rig()
    got = [result(r.cmd("Configure", sample_rate_hz=12345, channel_mask=0, averaging=0))[2],
           result(r.cmd("Configure", sample_rate_hz=100000, channel_mask=0, averaging=1))[2],
           result(r.cmd("Configure", sample_rate_hz=100000, channel_mask=3, averaging=1025))[2]]
    r.cmd("Start")
    got += [result(r.cmd("Configure", sample_rate_hz=12345, channel_mask=0, averaging=0))[2],
            result(r.cmd("WriteCalibration", channel=1, scale=1.0, offset=0.0))[2],
            result(r.raw(frame(r.tx.seq, 0x82, b"\x31\x00\x00")))[2],
            result(r.raw(frame(r.tx.seq, 0x87, b"\x32\x00\x01\x00\x00\x80\x3f")))[2]]
    check("§5 precedence Busy > UnsupportedRate > InvalidArgument for well-formed commands, Busy "
          "while running; §4.6 malformed Configure / WriteCalibration while running -> InvalidArgument",
          got == [w.UNSUPPORTED_RATE, w.INVALID_ARGUMENT, w.INVALID_ARGUMENT, w.BUSY, w.BUSY,
                  w.INVALID_ARGUMENT, w.INVALID_ARGUMENT] and r.dev.running, str(got))

    # ---- §5 a device that lists no rate; a refused Configure keeps the default
    r = Rig(rates=[])
    got = [result(r.cmd("Start"))[2],
           result(r.cmd("Configure", sample_rate_hz=10000, channel_mask=3, averaging=1))[2],
           result(r.cmd("Start"))[2]]
    st = r.cmd("GetStatus")[0][1]
    check("§5 a device that lists no rate answers Start UnsupportedRate (before and after a Configure, "
          "which is UnsupportedRate too); it stays idle",
          got == [w.UNSUPPORTED_RATE] * 3 and st["state"] == w.STATE_IDLE and r.clean(), str(got))
    r = Rig(channels=[])
    got = [result(r.cmd("Configure", sample_rate_hz=10000, channel_mask=1, averaging=1))[2],
           result(r.cmd("Start"))[2]]
    check("§5 a device that lists rates but no channel: Configure InvalidArgument, Start InvalidArgument "
          "(assumption, NOTES.md)", got == [w.INVALID_ARGUMENT] * 2 and not r.dev.running, str(got))
    r = Rig()
    got = [result(r.cmd("Configure", sample_rate_hz=12345, channel_mask=1, averaging=4))[2],
           result(r.cmd("Configure", sample_rate_hz=100000, channel_mask=0x04, averaging=4))[2]]
    got += r.cmd("Start") + r.wait(8400 * 2) + r.cmd("Stop")
    blk = got[2 + 1][1] if len(got) > 3 else {}
    check("§5 Configures answered with an error change nothing: Start uses the default configuration "
          "(assumption, NOTES.md)",
          got[:2] == [w.UNSUPPORTED_RATE, w.INVALID_ARGUMENT]
          and (blk.get("period_ticks"), blk.get("channel_mask"), blk.get("averaging")) == (8400, 0x03, 1),
          str(got))

    # ---- §7 "TriggerEdge (output line)" reproduced from power-on by the model
    r = Rig()
    got = r.wait(42) + r.cmd("DriveTrigger", line=0, level=1, pulse_ticks=0)
    check("§7 row 'TriggerEdge (output line)' is what a device sends when output line 0 is driven high "
          "at tick 42 after power-on, while idle",
          names(got) == ["TriggerEdge", "CommandResult"] and got[0][1] == EXPECTED["TriggerEdge (output line)"][1],
          str(got))

    # ---- counter scopes (§4.4) under Start and ResetCounters
    r = Rig()
    r.raw(b"\x41\x42\x00")                                   # frames_rejected = 1
    r.cmd("Start")
    r.wait(8400 * 5)
    edge1 = r.cmd("DriveTrigger", line=0, level=1, pulse_ticks=0)[0][1]
    before = r.cmd("GetStatus")[0][1]
    r.cmd("Stop")
    r.cmd("Start")
    after_start = r.cmd("GetStatus")[0][1]
    edge2 = r.cmd("DriveTrigger", line=0, level=0, pulse_ticks=0)[0][1]
    r.wait(8400 * 3)
    r.cmd("ResetCounters")
    after_reset = r.cmd("GetStatus")[0][1]
    edge3 = r.cmd("DriveTrigger", line=0, level=1, pulse_ticks=0)[0][1]
    check("§4.4 Start zeroes samples_acquired and edge_count, not frames_rejected; "
          "uptime_ticks and frames_sent never",
          before["samples_acquired"] == 6 and before["frames_rejected"] == 1
          and after_start["samples_acquired"] == 0 and after_start["frames_rejected"] == 1
          and edge1["edge_count"] == 1 and edge2["edge_count"] == 1
          and after_start["frames_sent"] > before["frames_sent"]
          and after_start["uptime_ticks"] >= before["uptime_ticks"],
          f"{before} {after_start} {edge1} {edge2}")
    check("§4.4 ResetCounters zeroes sample, edge, frames_rejected and high-water counters only",
          after_reset["samples_acquired"] == 0 and after_reset["frames_rejected"] == 0
          and after_reset["queue_high_water"] == 0 and edge3["edge_count"] == 1
          and after_reset["frames_sent"] > after_start["frames_sent"]
          and after_reset["uptime_ticks"] > after_start["uptime_ticks"]
          and after_reset["state"] == w.STATE_RUNNING and r.clean(), str(after_reset))
    check("§4.3 an output edge while sampling carries the last sample at or before its tick",
          edge1["sample_index"] == 5 and edge2["sample_index"] == 0
          and edge3["sample_index"] == 3, f"{edge1} {edge2} {edge3}")

    # ---- §5 DriveTrigger: power-on low, pulses, cancelling
    r = Rig()
    got = r.cmd("DriveTrigger", line=0, level=0, pulse_ticks=0)
    check("§5 output lines are low at power-on: driving line 0 low gives no edge",
          names(got) == ["CommandResult"] and result(got)[2] == w.OK, str(got))
    got = r.cmd("DriveTrigger", line=1, level=1, pulse_ticks=100)
    t = r.dev.tick
    got2 = r.wait(99)
    got3 = r.wait(1)
    check("§5 pulse from low: rising edge before the CommandResult, falling edge pulse_ticks later, after it",
          names(got) == ["TriggerEdge", "CommandResult"] and got[0][1]["polarity"] == 1
          and got[0][1]["line"] == 0x81 and got[0][1]["sample_index"] == w.NO_SAMPLE and got2 == []
          and names(got3) == ["TriggerEdge"] and got3[0][1]["polarity"] == 0
          and got3[0][1]["tick"] == t + 100 and got3[0][1]["edge_count"] == 2, f"{got} {got3}")
    r.cmd("DriveTrigger", line=0, level=1, pulse_ticks=0)
    got = r.cmd("DriveTrigger", line=0, level=1, pulse_ticks=50) + r.wait(50)
    check("§5 pulse on a line already at level: one edge (the return), line left at the opposite level",
          names(got) == ["CommandResult", "TriggerEdge"] and got[1][1]["polarity"] == 0
          and r.dev.level[0] == 0, str(got))
    got = (r.cmd("DriveTrigger", line=1, level=1, pulse_ticks=100) + r.wait(10)
           + r.cmd("DriveTrigger", line=1, level=1, pulse_ticks=0) + r.wait(500))
    check("§5 a new DriveTrigger on the line cancels its pending return",
          names(got) == ["TriggerEdge", "CommandResult", "CommandResult"] and r.dev.level[1] == 1, str(got))
    got = r.cmd("DriveTrigger", line=0, level=1, pulse_ticks=100)
    for c in ("ResetCounters", "Start", "Stop", "GetStatus", "GetInfo"):
        got += r.cmd(c)
    got += r.cmd("DriveTrigger", line=1, level=0, pulse_ticks=0)          # another line
    got += r.wait(200)
    edges = [f for n, f in got if n == "TriggerEdge"]
    check("§5 nothing else cancels a pending return (ResetCounters, Start, Stop, other lines); "
          "edge_count restarts after the reset",
          [(e["line"], e["polarity"], e["edge_count"]) for e in edges]
          == [(0x80, 1, 3), (0x81, 0, 1), (0x80, 0, 1)], str(edges))
    got = [result(r.cmd("DriveTrigger", line=ln, level=1, pulse_ticks=0))[2] for ln in (2, 0x80, 0x81)]
    check("§5 DriveTrigger line must be below trigger_outputs, bit 7 clear -> else InvalidArgument",
          got == [w.INVALID_ARGUMENT] * 3 and r.clean(), str(got))

    # ---- §5 WriteCalibration and storage
    r = Rig()
    r.dev.storage_ok = False
    got = r.cmd("WriteCalibration", channel=1, scale=0.002, offset=-0.25)
    di = r.cmd("GetInfo")[0][1]
    check("§5 WriteCalibration with failing storage: StorageFault, old value stays, flag not set",
          result(got)[2] == w.STORAGE_FAULT and f32(di["channels"][1]["scale"]) == f32(0.0005)
          and not di["flags"] & w.FLAG_CALIBRATION_STORED, str(di))
    r.dev.storage_ok = True
    got = r.cmd("WriteCalibration", channel=1, scale=0.002, offset=-0.25)
    di = r.cmd("GetInfo")[0][1]
    check("§5 WriteCalibration stored: next DeviceInfo shows the values and CALIBRATION_STORED",
          result(got)[2] == w.OK and f32(di["channels"][1]) == f32({"index": 1, "quantity": 0, "name": "V0",
                                                                    "scale": 0.002, "offset": -0.25})
          and di["flags"] == w.FLAG_TEST_SIGNAL | w.FLAG_CALIBRATION_STORED, str(di))
    got = [result(r.cmd("WriteCalibration", channel=2, scale=1.0, offset=0.0))[2],
           result(r.cmd("WriteCalibration", channel=0, scale=float("inf"), offset=0.0))[2]]
    check("§5 WriteCalibration of an unlisted channel or a non-finite value -> InvalidArgument",
          got == [w.INVALID_ARGUMENT] * 2, str(got))
    got = r.cmd("TimeSync", nonce=0xDEADBEEF) + r.cmd("GetStatus")
    check("§4.5 TimeSync echoes the nonce; §4.4 Status frames_sent = seq + 1",
          names(got) == ["TimeSyncReply", "CommandResult", "Status", "CommandResult"]
          and got[0][1]["nonce"] == 0xDEADBEEF and got[2][1]["frames_sent"] == r.host.seq.last
          and r.clean(), str(got))


# ---------------------------------------------------------------- robustness to byte errors

def check_byte_errors(rng):
    """§3.4 last paragraph: a corrupted, dropped or inserted byte loses only its frame
    (two when it removes the delimiter between two frames), and the loss shows in seq."""
    msgs = [(n, EXPECTED[n]) for n in EXPECTED if isinstance(EXPECTED[n][1], dict)]
    wires = [w.encode_frame(i, t, f) for i, (n, (t, f)) in enumerate(msgs)]
    fails = {"corrupt": [], "zero": [], "insert": [], "delete": [], "delimiter": []}
    tried = dict.fromkeys(fails, 0)

    def run(kind, i, mutated, lost):
        # window: frame i-1 (sets last), the mutated bytes, then frames i+1+lost_extra...
        tail = b"".join(wires[i + 1:i + 3])
        dec = w.Decoder()
        out = dec.feed(wires[i - 1] + mutated + tail)
        good = [(e.seq, e.seq_note) for e in out if e.kind == "frame"]
        want = [(i - 1, "first"), (i + lost, f"lost {lost}")] + ([(i + lost + 1, "in_order")] if lost == 1 else [])
        rejected = [e for e in out if e.kind != "frame"]
        ok = good == want and 1 <= len(rejected) <= 2 and all(e.kind in w.REJECTIONS for e in rejected)
        tried[kind] += 1
        if not ok:
            fails[kind].append(f"frame {i} {show(out)}")

    for i in range(1, len(wires) - 2):
        wire = wires[i]
        for pos in range(len(wire) - 1):
            b = wire[pos]
            for v in {b ^ 0x01, b ^ 0x80, rng.randint(1, 255)} - {0, b}:
                run("corrupt", i, wire[:pos] + bytes([v]) + wire[pos + 1:], 1)
            run("zero", i, wire[:pos] + b"\x00" + wire[pos + 1:], 1)
            run("insert", i, wire[:pos] + bytes([rng.randint(1, 255)]) + wire[pos:], 1)
            if pos:                 # a 0x00 inserted before the first byte is only an empty frame
                run("insert", i, wire[:pos] + b"\x00" + wire[pos:], 1)
            run("delete", i, wire[:pos] + wire[pos + 1:], 1)
        # the delimiter itself: changed or dropped, frames i and i+1 merge and both are lost
        run("delimiter", i, wire[:-1] + bytes([rng.randint(1, 255)]), 2)
        run("delimiter", i, wire[:-1], 2)
    for kind, bad in fails.items():
        check(f"one {kind} byte error per position in {len(wires) - 3} frames ({tried[kind]} cases): "
              f"only the frame(s) it falls in lost, loss shows in seq", not bad and tried[kind] > 0,
              "; ".join(bad[:3]))

    garbage = bytes(rng.randint(1, 255) for _ in range(9))
    out = w.Decoder().feed(wires[0] + garbage + b"\x00" + wires[1])
    check(f"garbage {garbage.hex()} + 0x00 between frames: rejected alone, neighbours in order",
          [(e.kind, e.seq_note) for e in out][0::2] == [("frame", "first"), ("frame", "in_order")]
          and len(out) == 3 and out[1].kind in w.REJECTIONS, show(out))
    dec = w.Decoder()
    out = dec.feed(wires[0][5:] + b"\x00\x00" + wires[1])
    check("attach mid-frame: partial frame rejected, extra 0x00 ignored, next frame sets last",
          len(out) == 2 and out[0].kind in w.REJECTIONS and (out[1].seq, out[1].seq_note) == (1, "first")
          and dec.counts["empty"] == 2, show(out))


SPEC_TEXT = ""


def main() -> int:
    global SPEC_TEXT
    text = SPEC_TEXT = SPEC.read_text(encoding="utf-8")
    rows = parse_vectors(text)
    check(f"parsed {len(rows)} vector rows from {SPEC.name} §7", len(rows) == len(EXPECTED),
          f"expected {len(EXPECTED)} rows: {[r[0] for r in rows]}")
    check_primitives()
    rng = random.Random(SEED)
    for row in rows:
        try:
            check_vector(*row, rng)
        except Exception as e:  # a broken row must not hide the others
            check(f"[{row[0]}] checks ran", False, f"{type(e).__name__}: {e}")
    missing = set(EXPECTED) - {r[0] for r in rows}
    check("every message described in §7 prose has a vector row", not missing, str(sorted(missing)))
    for part in (check_sequence, lambda: check_receiving(rows, rng),
                 lambda: check_malformed(rows), check_not_malformed,
                 lambda: check_command_results(rows), check_device, lambda: check_byte_errors(rng)):
        try:
            part()
        except Exception as e:  # report, do not hide the summary line
            check("check group ran", False, f"{type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
