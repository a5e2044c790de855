"""railtrace wire protocol, version 1 -- independent implementation from SPEC.md only.

Python 3.11 standard library only.

    frame = encode_frame(seq, "Configure", {"request_id": 2, "sample_rate_hz": 100000,
                                             "channel_mask": 0xFF, "averaging": 1})
    dec = Decoder()
    for ev in dec.feed(data_from_serial):
        if ev.kind == "frame":
            print(ev.seq, ev.name, ev.fields)
        elif ev.kind == "unknown_type":
            pass                        # §3.4 step 7: a host skips it (a device answers it)
        else:
            print("rejected:", ev.kind, ev.detail)

Field dicts use the field names of SPEC.md §4/§5.  Counts that are implied by a list are
not stored (DeviceInfo: `rates` and `channels` are lists, rate_count/channel_count are
their lengths).  SampleBlock keeps `sample_count` and `codes` as one flat sample-major
list; see `samples()`.
Strings are `str`, floats are Python floats holding the f32 value.  Frames of an unknown
type carry their payload as `bytes` in `ev.payload`.

The decoder enforces exactly the "malformed" list of §3.4 step 8 and nothing else: any
other out-of-range value (a Configure mask of 0, a WriteCalibration channel of 9, a NaN
scale, ...) passes it.  `device_check()` is the separate range check a device makes
before executing a command (§3.4 step 8, last sentence; §4.6, §5).

Host and device differ in one receiving rule (§3.3): a host tracks the device's sequence
numbers and drops duplicates (`Decoder()`); a device does not track the host's and
answers every intact frame (`Decoder(track_seq=False)`).  `Device` is a model of a
device's protocol behaviour (§4.4 counters, §4.6 answers, §5 commands) used to check
those rules end to end; its sampling is a deterministic test signal.
"""
from __future__ import annotations

import copy
import math
import struct
from dataclasses import dataclass

VERSION = 1
MAX_PAYLOAD = 1024
MIN_RAW = 10                      # version + type + seq + crc
MAX_RAW = 6 + MAX_PAYLOAD + 4     # 1034
MAX_ENCODED = 1039                # COBS of 1034 bytes, delimiter excluded (§3.1)

# ---------------------------------------------------------------- CRC-32C (§2)


def _make_crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _make_crc_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), reflected, init and final XOR 0xFFFFFFFF."""
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# ---------------------------------------------------------------- COBS (§3.2)


class CobsError(ValueError):
    pass


def cobs_encode(data: bytes) -> bytes:
    out = bytearray([0])
    code_at, code = 0, 1
    for b in data:
        if b == 0:
            out[code_at] = code
            code_at = len(out)
            out.append(0)
            code = 1
        else:
            out.append(b)
            code += 1
            if code == 255:
                out[code_at] = code
                code_at = len(out)
                out.append(0)
                code = 1
    out[code_at] = code
    return bytes(out)


def cobs_decode(data: bytes) -> bytes:
    """§3.2 decode. Invalid (§3.4 step 3): a zero code byte, a code pointing past the end.

    A zero *data* byte cannot occur in a delimited frame; the §3.2 pseudocode calls it
    invalid too, so a standalone call raises for it.  Non-canonical encodings (a last
    block of code 255 without a following 01) are accepted, as §3.4 step 3 allows.
    """
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        i += 1
        if c == 0:
            raise CobsError(f"zero code byte at offset {i - 1}")
        end = i + c - 1
        if end > n:
            raise CobsError(f"code byte 0x{c:02x} at offset {i - 1} points past the end")
        block = data[i:end]
        if 0 in block:
            raise CobsError("zero data byte")
        out += block
        i = end
        if c != 255 and i < n:
            out.append(0)
    return bytes(out)


# ---------------------------------------------------------------- payload reader


class Malformed(ValueError):
    """§3.4 step 8: one of the listed malformed conditions."""


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise Malformed(f"payload too short: need {self.pos + n} bytes, have {len(self.data)}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str):
        v = struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))
        return v[0] if len(v) == 1 else v

    def string(self, limit: int, what: str) -> str:
        n = self.unpack("B")
        if n > limit:
            raise Malformed(f"{what}: {n} bytes, at most {limit}")
        return _utf8(self.take(n), what)

    def end(self):
        if self.pos != len(self.data):
            raise Malformed(f"payload has {len(self.data) - self.pos} bytes left over")


def _utf8(b: bytes, what: str) -> str:
    try:
        return b.decode("utf-8")      # strict: rejects overlongs, surrogates, > U+10FFFF
    except UnicodeDecodeError as e:
        raise Malformed(f"{what}: invalid UTF-8 ({e.reason})") from None


def _string(s: str, limit: int, what: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > limit:
        raise ValueError(f"{what}: {len(b)} bytes, at most {limit}")
    return bytes([len(b)]) + b


def _enum(value: int, allowed, what: str) -> int:
    if value not in allowed:
        raise Malformed(f"{what}: value {value} is not one of the values listed")
    return value


# ---------------------------------------------------------------- device -> host (§4)

QUANTITY_VOLTAGE, QUANTITY_CURRENT = 0, 1
FLAG_TEST_SIGNAL, FLAG_CALIBRATION_STORED = 0x01, 0x02
STATE_IDLE, STATE_RUNNING = 0, 1
NO_SAMPLE = 0xFFFFFFFFFFFFFFFF        # TriggerEdge.sample_index when there is none (§4.3)
OUTPUT_LINE = 0x80                    # TriggerEdge.line bit 7
OK, UNKNOWN_COMMAND, INVALID_ARGUMENT, BUSY, UNSUPPORTED_RATE, HARDWARE_FAULT, STORAGE_FAULT = range(7)
RESULT_CODES = {0: "Ok", 1: "UnknownCommand", 2: "InvalidArgument", 3: "Busy",
                4: "UnsupportedRate", 5: "HardwareFault", 6: "StorageFault"}
LOG_LEVELS = {0: "error", 1: "warn", 2: "info", 3: "debug"}
MAX_CHANNELS = 8
MAX_RATES = 8

_DEVINFO_HEAD = ("fw_major", "fw_minor", "fw_patch", "protocol_version", "tick_hz",
                 "adc_bits", "flags", "trigger_inputs", "trigger_outputs")


def _enc_device_info(f: dict) -> bytes:
    out = bytearray(struct.pack("<BBBBIBBBB", *(f[k] for k in _DEVINFO_HEAD)))
    out += _string(f["board"], 32, "board") + _string(f["serial"], 32, "serial")
    if len(f["rates"]) > MAX_RATES or len(f["channels"]) > MAX_CHANNELS:
        raise ValueError("at most 8 rates and 8 channels")
    out += struct.pack("<B", len(f["rates"])) + b"".join(struct.pack("<I", r) for r in f["rates"])
    out += struct.pack("<B", len(f["channels"]))
    for ch in f["channels"]:
        if not 0 <= ch["index"] <= 7:
            raise ValueError(f"channel index {ch['index']} > 7")
        out += struct.pack("<BB", ch["index"], ch["quantity"]) + _string(ch["name"], 16, "name")
        out += struct.pack("<ff", ch["scale"], ch["offset"])
    return bytes(out)


def _dec_device_info(r: _Reader) -> dict:
    f = dict(zip(_DEVINFO_HEAD, r.unpack("BBBBIBBBB")))
    f["board"] = r.string(32, "board")
    f["serial"] = r.string(32, "serial")
    n = r.unpack("B")
    if n > MAX_RATES:
        raise Malformed(f"rate_count {n} > 8")
    f["rates"] = [r.unpack("I") for _ in range(n)]
    n = r.unpack("B")
    if n > MAX_CHANNELS:
        raise Malformed(f"channel_count {n} > 8")
    f["channels"] = []
    for _ in range(n):
        index, quantity = r.unpack("BB")
        if index > 7:
            raise Malformed(f"channel index {index} > 7")
        name = r.string(16, "channel name")
        scale, offset = r.unpack("ff")
        # not checked (passes, §3.4 step 8): ascending order, duplicates, quantity values
        f["channels"].append({"index": index, "quantity": quantity, "name": name,
                              "scale": scale, "offset": offset})
    return f


def popcount(x: int) -> int:
    return bin(x).count("1")


def _enc_sample_block(f: dict) -> bytes:
    if f["channel_mask"] == 0:
        raise ValueError("channel_mask must be non-zero")
    k = f["sample_count"] * popcount(f["channel_mask"])
    if len(f["codes"]) != k:
        raise ValueError(f"need {k} codes, got {len(f['codes'])}")
    if f["averaging"] < 1:
        raise ValueError("averaging must be >= 1")
    return struct.pack(f"<QQIBHH{k}h", f["first_index"], f["first_tick"], f["period_ticks"],
                       f["channel_mask"], f["averaging"], f["sample_count"], *f["codes"])


def _dec_sample_block(r: _Reader) -> dict:
    keys = ("first_index", "first_tick", "period_ticks", "channel_mask", "averaging", "sample_count")
    f = dict(zip(keys, r.unpack("QQIBHH")))
    if f["channel_mask"] == 0:
        raise Malformed("channel_mask 0")
    k = f["sample_count"] * popcount(f["channel_mask"])
    if len(r.data) != 25 + 2 * k:   # checked up front: a huge count must not allocate
        raise Malformed(f"codes must be 2 x {f['sample_count']} x {popcount(f['channel_mask'])}"
                        f" = {2 * k} bytes, are {len(r.data) - 25}")
    if f["averaging"] == 0:
        raise Malformed("averaging 0")
    f["codes"] = list(struct.unpack(f"<{k}h", r.take(2 * k)))
    return f


def samples_per_block(channels: int) -> int:
    """§6: most samples a SampleBlock of `channels` enabled channels can hold."""
    return 999 // (2 * channels)


def average_code(conversions) -> int:
    """§4.2: mean of the conversions, rounded to nearest, ties away from zero."""
    total, n = sum(conversions), len(conversions)
    q, r = divmod(abs(total), n)
    q += 2 * r >= n
    return q if total >= 0 else -q


def samples(block: dict) -> list[tuple[int, ...]]:
    """SampleBlock codes as one tuple per sample (ascending channel order)."""
    n = popcount(block["channel_mask"])
    c = block["codes"]
    return [tuple(c[j * n:(j + 1) * n]) for j in range(block["sample_count"])]


def _fixed(keys: tuple, fmt: str, checks: dict | None = None):
    """Encoder/decoder pair for a fixed layout; `checks` maps field -> allowed values."""
    def enc(f: dict) -> bytes:
        return struct.pack("<" + fmt, *(f[k] for k in keys))

    def dec(r: _Reader) -> dict:
        f = dict(zip(keys, r.unpack(fmt) if len(keys) > 1 else (r.unpack(fmt),)))
        r.end()                      # length first: a wrong length is malformed whatever the values
        for k, allowed in (checks or {}).items():
            _enum(f[k], allowed, k)
        return f
    return enc, dec


def _enc_log(f: dict) -> bytes:
    text = f["text"].encode("utf-8")
    if len(text) > 1023:
        raise ValueError("log text longer than 1023 bytes")
    return struct.pack("<B", f["level"]) + text


def _dec_log(r: _Reader) -> dict:
    level = _enum(r.unpack("B"), LOG_LEVELS, "level")
    return {"level": level, "text": _utf8(r.take(len(r.data) - 1), "text")}


_STATUS_KEYS = ("uptime_ticks", "samples_acquired", "dropped_queue_full", "dropped_link",
                "dropped_adc", "frames_sent", "frames_rejected", "edges_dropped",
                "queue_high_water", "queue_capacity", "state")

# ---------------------------------------------------------------- message table

# type -> (name, encoder(fields)->payload, decoder(_Reader)->fields)
MESSAGES: dict[int, tuple[str, object, object]] = {
    0x01: ("DeviceInfo", _enc_device_info, _dec_device_info),
    0x02: ("SampleBlock", _enc_sample_block, _dec_sample_block),
    0x03: ("TriggerEdge", *_fixed(("line", "polarity", "edge_count", "tick", "sample_index"),
                                  "BBIQQ", {"polarity": (0, 1)})),
    0x04: ("Status", *_fixed(_STATUS_KEYS, "QQQQQIIIHHB")),
    0x05: ("TimeSyncReply", *_fixed(("nonce", "rx_tick", "tx_tick"), "IQQ")),
    0x06: ("CommandResult", *_fixed(("request_id", "command", "code"), "HBB")),
    0x07: ("Log", _enc_log, _dec_log),
    # host -> device (§5); every payload begins with u16 request_id
    0x81: ("GetInfo", *_fixed(("request_id",), "H")),
    0x82: ("Configure", *_fixed(("request_id", "sample_rate_hz", "channel_mask", "averaging"), "HIBH")),
    0x83: ("Start", *_fixed(("request_id",), "H")),
    0x84: ("Stop", *_fixed(("request_id",), "H")),
    0x85: ("TimeSync", *_fixed(("request_id", "nonce"), "HI")),
    0x86: ("DriveTrigger", *_fixed(("request_id", "line", "level", "pulse_ticks"), "HBBI",
                                   {"level": (0, 1)})),
    0x87: ("WriteCalibration", *_fixed(("request_id", "channel", "scale", "offset"), "HBff")),
    0x88: ("ResetCounters", *_fixed(("request_id",), "H")),
    0x89: ("GetStatus", *_fixed(("request_id",), "H")),
}
TYPES = {name: t for t, (name, _, _) in MESSAGES.items()}       # name -> type byte
DEVICE_TO_HOST = frozenset(t for t in MESSAGES if t < 0x80)
HOST_TO_DEVICE = frozenset(t for t in MESSAGES if t >= 0x80)
# §8: every other type byte is reserved: 0x00, 0x08-0x7F, 0x80, 0x8A-0xFF
RESERVED = frozenset(range(256)) - set(MESSAGES)


def type_of(msg_type) -> int:
    return TYPES[msg_type] if isinstance(msg_type, str) else int(msg_type)


def encode_payload(msg_type, fields) -> bytes:
    """Payload bytes of a message; for a type not in MESSAGES, `fields` is the payload."""
    t = type_of(msg_type)
    if t not in MESSAGES:
        return bytes(fields)
    return MESSAGES[t][1](fields)


def decode_payload(msg_type, payload: bytes) -> dict:
    """Parse a payload of a defined type; raises Malformed (§3.4 step 8)."""
    r = _Reader(payload)
    f = MESSAGES[type_of(msg_type)][2](r)
    r.end()
    return f


# ---------------------------------------------------------------- frames (§2, §3.1)


def encode_raw_frame(seq: int, msg_type: int, payload: bytes, version: int = VERSION) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes > {MAX_PAYLOAD}")
    head = struct.pack("<BBI", version, msg_type, seq & 0xFFFFFFFF) + payload
    return head + struct.pack("<I", crc32c(head))


def encode_frame(seq: int, msg_type, fields) -> bytes:
    """Wire bytes of one frame: COBS(raw frame) + 0x00."""
    t = type_of(msg_type)
    return cobs_encode(encode_raw_frame(seq, t, encode_payload(t, fields))) + b"\x00"


class Sender:
    """Numbers outgoing frames (§3.3): seq starts at 0, +1 per frame, wraps at 2^32."""

    def __init__(self, seq: int = 0):
        self.seq = seq

    def frame(self, msg_type, fields) -> bytes:
        data = encode_frame(self.seq, msg_type, fields)
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        return data


# ---------------------------------------------------------------- receiving (§3.3, §3.4)

# §3.4 rejection reasons, in step order.  "empty" (step 1) and "unknown_type" (step 7) are
# outcomes, not rejections.
REJECTIONS = ("oversized", "invalid_cobs", "too_short", "crc_mismatch",
              "unsupported_version", "malformed")
SEQ_VALID = ("frame", "unknown_type", "unsupported_version", "malformed")   # §3.3


@dataclass
class Event:
    kind: str                  # "frame", "unknown_type", "empty" or one of REJECTIONS
    seq: int | None = None     # set when the seq is valid (SEQ_VALID kinds)
    type: int | None = None
    name: str | None = None
    fields: dict | None = None
    version: int | None = None
    payload: bytes | None = None
    raw: bytes | None = None   # COBS-decoded raw frame, when it could be decoded
    step: int = 0              # §3.4 step that decided the outcome
    detail: str = ""
    seq_note: str = ""         # from SeqTracker: first/in_order/duplicate/lost N/restart


class SeqTracker:
    """§3.3: classify each readable seq against `last`."""

    def __init__(self):
        self.last: int | None = None
        self.lost = self.duplicates = self.restarts = 0

    def update(self, seq: int) -> str:
        last = self.last
        if last is None:                  # first frame after attaching: only sets last
            self.last = seq
            return "first"
        if seq == (last + 1) & 0xFFFFFFFF:
            self.last = seq
            return "in_order"
        if seq == last:
            self.duplicates += 1
            return "duplicate"
        self.last = seq
        d = (seq - last - 1) & 0xFFFFFFFF
        if 0 < d < 2**31:
            self.lost += d
            return f"lost {d}"
        self.restarts += 1                # counting continues from seq
        return "restart"


class Decoder:
    """Streaming receiver (§3.4) with sequence tracking (§3.3).

    feed() takes bytes in any chunking and returns a list of Events.  Every type defined
    in §4 and §5 is parsed, whatever its direction (step 7); other types come out as
    "unknown_type".  Empty frames are counted but only reported when report_empty.

    Host (default): duplicates (§3.3) are counted and dropped from the output unless
    keep_duplicates; a dropped duplicate is counted only under "duplicate" (not under
    its own outcome; host counters are local, so this choice does not reach the wire).
    Device (track_seq=False): §3.3 "a device does not track the host's sequence
    numbers": no seq classification, nothing dropped, every intact frame comes out.
    """

    def __init__(self, keep_duplicates=False, report_empty=False, track_seq=True):
        self.keep_duplicates, self.report_empty = keep_duplicates, report_empty
        self.track_seq = track_seq
        self.counts = {k: 0 for k in ("frame", "unknown_type", "empty", "duplicate") + REJECTIONS}
        self.seq = SeqTracker()
        self._buf = bytearray()
        self._n = 0   # bytes of the current encoded frame, including those not stored

    @property
    def rejected(self) -> int:
        """Frames rejected at §3.4 steps 2-6 and 8 (what a device reports as frames_rejected)."""
        return sum(self.counts[k] for k in REJECTIONS)

    def feed(self, data: bytes) -> list[Event]:
        events = []
        data = bytes(data)
        pos = 0
        while pos < len(data):
            z = data.find(0, pos)
            end = len(data) if z < 0 else z
            room = MAX_ENCODED + 1 - len(self._buf)   # store one byte past the limit at most
            self._buf += data[pos:min(end, pos + max(room, 0))]
            self._n += end - pos
            if z < 0:
                break
            ev = self._frame(bytes(self._buf), self._n)
            self._buf.clear()
            self._n = 0
            pos = z + 1
            if ev.seq is not None and self.track_seq:
                ev.seq_note = self.seq.update(ev.seq)
                if ev.seq_note == "duplicate":
                    self.counts["duplicate"] += 1
                    if not self.keep_duplicates:
                        continue
            self.counts[ev.kind] += 1
            if ev.kind == "empty" and not self.report_empty:
                continue
            events.append(ev)
        return events

    def _frame(self, enc: bytes, n: int) -> Event:
        if n == 0:
            return Event("empty", step=1)
        if n > MAX_ENCODED:
            return Event("oversized", step=2, detail=f"{n} encoded bytes > {MAX_ENCODED}")
        try:
            raw = cobs_decode(enc)
        except CobsError as e:
            return Event("invalid_cobs", step=3, detail=str(e))
        if len(raw) < MIN_RAW:
            return Event("too_short", step=4, raw=raw, detail=f"raw frame of {len(raw)} bytes")
        if len(raw) > MAX_RAW:
            return Event("oversized", step=4, raw=raw,
                         detail=f"raw frame of {len(raw)} bytes > {MAX_RAW}")
        want, got = crc32c(raw[:-4]), int.from_bytes(raw[-4:], "little")
        if want != got:
            return Event("crc_mismatch", step=5, raw=raw,
                         detail=f"crc 0x{got:08x}, computed 0x{want:08x}")
        version, t, seq = struct.unpack_from("<BBI", raw)
        payload = raw[6:-4]
        ev = Event("frame", seq=seq, type=t, version=version, payload=payload, raw=raw)
        if version != VERSION:
            ev.kind, ev.step, ev.detail = "unsupported_version", 6, f"peer speaks version {version}"
        elif t not in MESSAGES:
            ev.kind, ev.step, ev.detail = "unknown_type", 7, f"type 0x{t:02x} skipped"
        else:
            ev.name, ev.step = MESSAGES[t][0], 8
            try:
                ev.fields = decode_payload(t, payload)
            except Malformed as e:
                ev.kind, ev.detail = "malformed", f"{ev.name}: {e}"
        return ev


# ---------------------------------------------------------------- device side (§4.6, §5)

RAILTRACE_MAX_AVERAGING = 1024          # §5: "railtrace firmware accepts 1 to 1024"
BUSY_WHILE_RUNNING = ("Configure", "WriteCalibration")     # §5


def request_id_of(payload: bytes) -> int:
    """§4.6: the payload's first two bytes when present, else 0."""
    return int.from_bytes(payload[:2], "little") if len(payload) >= 2 else 0


def protocol_answer(ev: Event, implemented=HOST_TO_DEVICE):
    """What a device does with one received frame, before looking at argument ranges (§4.6).

    Returns ("ignore", None) for an empty frame, ("silent", None) for a frame rejected at
    steps 2-6 (not answered; counted in frames_rejected), ("answer", CommandResult fields)
    for a type that is not a command the device implements (UnknownCommand, whether its
    payload parses or not) or a malformed command (InvalidArgument, "whatever the
    device's state", §4.6: a malformed Configure while running is InvalidArgument, not
    Busy; §5's precedence covers well-formed commands only), and ("execute", None) for a
    well-formed command to run.  The device's state is therefore not an input here.
    """
    if ev.kind == "empty":
        return "ignore", None
    if ev.kind in REJECTIONS and ev.kind != "malformed":
        return "silent", None
    rid = request_id_of(ev.payload)
    if ev.kind == "unknown_type" or ev.type not in implemented:
        return "answer", {"request_id": rid, "command": ev.type, "code": UNKNOWN_COMMAND}
    if ev.kind == "malformed":
        return "answer", {"request_id": rid, "command": ev.type, "code": INVALID_ARGUMENT}
    return "execute", None


def listed_mask(info: dict) -> int:
    """Mask of the channels DeviceInfo lists."""
    return sum(1 << ch["index"] for ch in info["channels"])


def conversion_period(tick_hz: int, rate: int) -> int:
    """Conversion timer period in whole ticks (§5).  How a device rounds tick_hz / rate is
    its own choice (the host reads period_ticks); this model truncates."""
    return tick_hz // rate


def device_check(name: str, f: dict, info: dict, running: bool,
                 max_averaging: int = RAILTRACE_MAX_AVERAGING) -> int:
    """Range checks a device makes on a well-formed command (§4.6, §5); returns a code.

    §5: when several results apply to a well-formed command, the first of Busy,
    UnsupportedRate, InvalidArgument.  "In range" is relative to DeviceInfo: channels it
    lists, lines below trigger_outputs.  An averaging above the device's limit, and a
    Configure whose period_ticks would not fit a u32, are answered InvalidArgument (§5).
    Start's checks depend on the configuration and are made by `Device` (§5: a device that
    lists no rate answers Start UnsupportedRate).
    """
    present = {ch["index"] for ch in info["channels"]}
    if name in BUSY_WHILE_RUNNING and running:
        return BUSY
    if name == "Configure":
        if f["sample_rate_hz"] not in info["rates"]:
            return UNSUPPORTED_RATE
        mask, avg = f["channel_mask"], f["averaging"]
        if mask == 0 or any(mask >> i & 1 and i not in present for i in range(8)):
            return INVALID_ARGUMENT
        if not 1 <= avg <= max_averaging:
            return INVALID_ARGUMENT
        if f["sample_rate_hz"] == 0 or \
                conversion_period(info["tick_hz"], f["sample_rate_hz"]) * avg > 0xFFFFFFFF:
            return INVALID_ARGUMENT
    elif name == "WriteCalibration":
        if f["channel"] not in present or not (math.isfinite(f["scale"]) and math.isfinite(f["offset"])):
            return INVALID_ARGUMENT
    elif name == "DriveTrigger":
        if f["line"] & OUTPUT_LINE or f["line"] >= info["trigger_outputs"]:
            return INVALID_ARGUMENT
    return OK


def test_signal(conversion: int, channel: int) -> int:
    """The model's built-in test signal: one i16 code per conversion and channel."""
    return (conversion * 37 + channel * 1000) % 65536 - 32768


class Device:
    """Model of a device's protocol behaviour, for checking the rules end to end.

    receive(bytes) feeds host bytes and returns the device's answer bytes; advance(ticks)
    moves the clock (samples, pulse returns, periodic Status) and returns what was sent.
    Rules modelled: §3.3 (no host seq tracking), §4.2 SampleBlocks, §4.3 edges, §4.4
    counter scopes and Status, §4.6 answers and frames_rejected, §5 commands, default
    configuration, precedence, DriveTrigger pulses, WriteCalibration storage.
    Nothing is ever dropped (no queue, an infinitely fast link): the drop counters stay 0.
    """

    def __init__(self, info: dict, max_averaging: int = RAILTRACE_MAX_AVERAGING,
                 queue_capacity: int = 256):
        self.info = copy.deepcopy(info)
        self.max_averaging, self.queue_capacity = max_averaging, queue_capacity
        self.storage_ok = True                       # set False to make storage fail
        self.tx = Sender()
        self.dec = Decoder(track_seq=False)
        self.tick = 0
        self.running = False
        # §5: until the first Configure: the first listed rate, all listed channels, averaging 1
        self.config = {"sample_rate_hz": (self.info["rates"] or [None])[0],
                       "channel_mask": listed_mask(self.info), "averaging": 1}
        self.level = [0] * self.info["trigger_outputs"]     # §5: output lines low at power-on
        self.pending: dict[int, tuple[int, int]] = {}        # line -> (due tick, level)
        self.frames_rejected = self.queue_high_water = 0
        self._zero_run_counters()
        self._out = bytearray()
        self._block: dict | None = None

    # ---- counters (§4.4)
    def _zero_run_counters(self):
        self.samples_acquired = self.dropped_queue_full = self.dropped_link = self.dropped_adc = 0
        self.edges_dropped = 0
        self.edge_count: dict[int, int] = {}       # TriggerEdge.line byte -> count

    def status_fields(self) -> dict:
        return {"uptime_ticks": self.tick, "samples_acquired": self.samples_acquired,
                "dropped_queue_full": self.dropped_queue_full, "dropped_link": self.dropped_link,
                "dropped_adc": self.dropped_adc, "frames_sent": (self.tx.seq + 1) & 0xFFFFFFFF,
                "frames_rejected": self.frames_rejected, "edges_dropped": self.edges_dropped,
                "queue_high_water": self.queue_high_water, "queue_capacity": self.queue_capacity,
                "state": STATE_RUNNING if self.running else STATE_IDLE}

    # ---- output
    def _send(self, name: str, fields: dict):
        self._out += self.tx.frame(name, fields)

    def _take(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    # ---- input
    def receive(self, data: bytes) -> bytes:
        for ev in self.dec.feed(data):
            if ev.kind in REJECTIONS:                       # steps 2-6 and 8, pieces
                self.frames_rejected = (self.frames_rejected + 1) & 0xFFFFFFFF
            action, result = protocol_answer(ev)
            if action == "answer":
                self._send("CommandResult", result)
            elif action == "execute":
                f = ev.fields
                code = device_check(ev.name, f, self.info, self.running, self.max_averaging)
                if code == OK:
                    code = getattr(self, "_cmd_" + ev.name)(f)
                self._send("CommandResult", {"request_id": f["request_id"], "command": ev.type,
                                             "code": code})
        return self._take()

    # ---- commands (§5)
    def _cmd_GetInfo(self, f):
        self._send("DeviceInfo", self.info)
        return OK

    def _cmd_Configure(self, f):
        self.config = {k: f[k] for k in ("sample_rate_hz", "channel_mask", "averaging")}
        return OK

    def period_ticks(self) -> int:
        c = self.config
        return conversion_period(self.info["tick_hz"], c["sample_rate_hz"]) * c["averaging"]

    def _cmd_Start(self, f):
        if self.running:
            return OK                                 # changes nothing
        if self.config["sample_rate_hz"] is None:
            return UNSUPPORTED_RATE                   # §5: a device that lists no rate
        if self.config["channel_mask"] == 0:
            return INVALID_ARGUMENT                   # no channel listed: assumption, NOTES.md
        self.running, self.t0, self.next_index = True, self.tick, 0
        self._zero_run_counters()
        self.next_status = self.tick + self.info["tick_hz"]
        self._block = None
        return OK

    def _cmd_Stop(self, f):
        if not self.running:
            return OK                                 # changes nothing, no Status
        self._flush()
        self.running = False
        self._send("Status", self.status_fields())     # §5: "then a Status (state idle)"
        return OK

    def _cmd_TimeSync(self, f):
        self._send("TimeSyncReply", {"nonce": f["nonce"], "rx_tick": self.tick, "tx_tick": self.tick})
        return OK

    def _cmd_DriveTrigger(self, f):
        line, level = f["line"], f["level"]
        self.pending.pop(line, None)                  # a new DriveTrigger cancels the return
        self._drive(line, level)
        if f["pulse_ticks"]:
            self.pending[line] = (self.tick + f["pulse_ticks"], 1 - level)
        return OK

    def _cmd_WriteCalibration(self, f):
        if not self.storage_ok:
            return STORAGE_FAULT                      # the old value stays
        for ch in self.info["channels"]:
            if ch["index"] == f["channel"]:
                ch["scale"], ch["offset"] = f["scale"], f["offset"]
        self.info["flags"] |= FLAG_CALIBRATION_STORED
        return OK

    def _cmd_ResetCounters(self, f):
        self._zero_run_counters()
        self.frames_rejected = self.queue_high_water = 0
        return OK

    def _cmd_GetStatus(self, f):
        self._send("Status", self.status_fields())
        return OK

    # ---- time
    def _drive(self, line: int, level: int):
        if self.level[line] == level:
            return                                    # an edge only when the level changes
        self.level[line] = level
        key = OUTPUT_LINE | line
        self.edge_count[key] = (self.edge_count.get(key, 0) + 1) & 0xFFFFFFFF
        # §4.3: the last sample of the current run taken at or before the edge's tick
        idx = (self.tick - self.t0) // self.period_ticks() if self.running else NO_SAMPLE
        self._send("TriggerEdge", {"line": key, "polarity": level, "edge_count": self.edge_count[key],
                                   "tick": self.tick, "sample_index": idx})

    def _sample(self):
        c = self.config
        chans = [i for i in range(8) if c["channel_mask"] >> i & 1]
        j, avg = self.next_index, c["averaging"]
        codes = [average_code([test_signal(j * avg + m, ch) for m in range(avg)]) for ch in chans]
        if self._block is None:
            self._block = {"first_index": j, "first_tick": self.tick,
                           "period_ticks": self.period_ticks(), "channel_mask": c["channel_mask"],
                           "averaging": avg, "sample_count": 0, "codes": []}
        self._block["codes"] += codes
        self._block["sample_count"] += 1
        self.next_index += 1
        self.samples_acquired += 1
        if self._block["sample_count"] == samples_per_block(len(chans)):
            self._flush()

    def _flush(self):
        if self._block and self._block["sample_count"]:
            self._send("SampleBlock", self._block)
        self._block = None

    def advance(self, ticks: int) -> bytes:
        target = self.tick + ticks
        while True:
            due = [(t, 1, line) for line, (t, _) in self.pending.items()]
            if self.running:
                due += [(self.t0 + self.next_index * self.period_ticks(), 0, -1),
                        (self.next_status, 2, -1)]
            if not due or min(due)[0] > target:
                break
            self.tick, what, line = min(due)
            if what == 0:
                self._sample()
            elif what == 1:
                self._drive(line, self.pending.pop(line)[1])
            else:
                self._send("Status", self.status_fields())
                self.next_status += self.info["tick_hz"]
        self.tick = target
        return self._take()
