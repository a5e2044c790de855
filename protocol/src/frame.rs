//! Frames: header, payload and CRC-32C, COBS-encoded and ended by 0x00 (SPEC.md §2-§3).

use crate::cobs;
use crate::crc::crc32c;
use crate::message::Message;
use crate::wire::{Reader, Writer};

/// The protocol version this crate speaks, the first byte of every frame.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes before the payload: version, message type, sequence number.
pub const HEADER_LEN: usize = 6;
/// Bytes of the CRC after the payload.
pub const CRC_LEN: usize = 4;
/// Longest payload of any message.
pub const MAX_PAYLOAD: usize = 1024;
/// Longest frame before COBS encoding.
pub const MAX_RAW_FRAME: usize = HEADER_LEN + MAX_PAYLOAD + CRC_LEN;
/// Longest COBS-encoded frame, delimiter excluded: the buffer a [`Decoder`] needs.
pub const MAX_ENCODED_FRAME: usize = cobs::max_encoded_len(MAX_RAW_FRAME);
/// Longest frame on the wire, delimiter included.
pub const MAX_WIRE_FRAME: usize = MAX_ENCODED_FRAME + 1;
/// Most samples a [`crate::SampleBlock`] of `channels` channels can hold.
pub const fn max_block_samples(channels: usize) -> usize {
    if channels == 0 {
        0
    } else {
        (MAX_PAYLOAD - 25) / (2 * channels)
    }
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The output buffer is too short for the encoded frame.
    #[error("output buffer too short for the frame")]
    BufferTooShort,
    /// The message breaks its own layout's limits (payload over 1024 bytes, a string over
    /// its maximum, too many channels or rates, codes not matching the sample count).
    #[error("message does not fit its wire layout (a field over its limit)")]
    InvalidMessage,
}

/// Why a received frame was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Bytes between two delimiters that are not valid COBS.
    #[error("invalid COBS encoding ({len} bytes)")]
    Cobs {
        /// Encoded length.
        len: usize,
    },
    /// Decoded frame shorter than header plus CRC.
    #[error("frame too short ({len} bytes, at least 10 needed)")]
    TooShort {
        /// Decoded length.
        len: usize,
    },
    /// More bytes than the longest frame arrived before a delimiter (encoded length over
    /// [`MAX_ENCODED_FRAME`]), or the frame decoded to more than [`MAX_RAW_FRAME`] bytes.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    Oversized {
        /// Bytes dropped.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The CRC does not match: the frame was corrupted.
    #[error("CRC mismatch: frame says {received:#010x}, contents give {computed:#010x}")]
    Crc {
        /// CRC carried by the frame.
        received: u32,
        /// CRC computed over its contents.
        computed: u32,
    },
    /// The frame is intact but speaks a protocol version this crate does not.
    #[error("peer speaks protocol version {found}; this build speaks version {supported}")]
    UnsupportedVersion {
        /// The version byte received.
        found: u8,
        /// [`PROTOCOL_VERSION`].
        supported: u8,
        /// The frame's sequence number.
        seq: u32,
    },
    /// The frame is intact but its payload does not match its type's layout.
    #[error("malformed payload for message type {msg_type:#04x} (frame {seq}, {len} bytes)")]
    Malformed {
        /// The type byte.
        msg_type: u8,
        /// The frame's sequence number.
        seq: u32,
        /// Payload length.
        len: usize,
        /// The payload's first two bytes, if it has two: for a command, the request id
        /// every command begins with, so the device can answer it (SPEC.md §4.6).
        request_id: Option<u16>,
    },
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame<'a> {
    /// The sender's frame counter: +1 per frame, wrapping at 2^32.
    pub seq: u32,
    /// The message.
    pub message: Message<'a>,
}

/// Encodes `message` as frame `seq` into `out`: COBS bytes followed by the 0x00
/// delimiter. Returns the number of bytes written. Never allocates. The payload is
/// written once, into the raw frame after its header; the CRC is computed there and the
/// raw frame COBS-encoded into `out`.
pub fn encode_frame(seq: u32, message: &Message<'_>, out: &mut [u8]) -> Result<usize, EncodeError> {
    let mut raw = [0u8; MAX_RAW_FRAME];
    let payload = raw
        .get_mut(HEADER_LEN..HEADER_LEN + MAX_PAYLOAD)
        .ok_or(EncodeError::InvalidMessage)?;
    let len = message.encode_payload(payload)?;
    finish_frame(seq, message.type_byte(), &mut raw, len, out)
}

/// Encodes a frame from a payload already laid out (see [`Message::encode_payload`]), for
/// senders that build payloads ahead of time and number frames when they send them.
pub fn encode_raw_frame(
    seq: u32,
    msg_type: u8,
    payload: &[u8],
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let mut raw = [0u8; MAX_RAW_FRAME];
    raw.get_mut(HEADER_LEN..HEADER_LEN + payload.len())
        .filter(|_| payload.len() <= MAX_PAYLOAD)
        .ok_or(EncodeError::InvalidMessage)?
        .copy_from_slice(payload);
    finish_frame(seq, msg_type, &mut raw, payload.len(), out)
}

/// With `len` payload bytes in `raw` after the header's place: writes the header before
/// them and the CRC after, COBS-encodes the raw frame into `out` and appends the delimiter.
fn finish_frame(
    seq: u32,
    msg_type: u8,
    raw: &mut [u8; MAX_RAW_FRAME],
    len: usize,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let body_len = HEADER_LEN + len;
    let raw_len = body_len + CRC_LEN;
    let mut w = Writer::new(raw);
    w.u8(PROTOCOL_VERSION)
        .and_then(|_| w.u8(msg_type))
        .and_then(|_| w.u32(seq))
        .map_err(|_| EncodeError::InvalidMessage)?;
    let crc = crc32c(raw.get(..body_len).ok_or(EncodeError::InvalidMessage)?);
    raw.get_mut(body_len..raw_len)
        .ok_or(EncodeError::InvalidMessage)?
        .copy_from_slice(&crc.to_le_bytes());
    let raw = raw.get(..raw_len).ok_or(EncodeError::InvalidMessage)?;
    let n = cobs::encode(raw, out).map_err(|_| EncodeError::BufferTooShort)?;
    *out.get_mut(n).ok_or(EncodeError::BufferTooShort)? = 0;
    Ok(n + 1)
}

/// [`encode_frame`] into a new `Vec`.
#[cfg(feature = "std")]
pub fn encode_frame_vec(seq: u32, message: &Message<'_>) -> Result<Vec<u8>, EncodeError> {
    let mut out = vec![0u8; MAX_WIRE_FRAME];
    let n = encode_frame(seq, message, &mut out)?;
    out.truncate(n);
    Ok(out)
}

/// A sender's frame counter.
#[derive(Debug, Clone, Default)]
pub struct FrameEncoder {
    next_seq: u32,
}

impl FrameEncoder {
    /// Starts at sequence number 0.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sequence number the next frame will carry.
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }
    /// Encodes `message` with the next sequence number; the number advances only on success.
    pub fn encode(&mut self, message: &Message<'_>, out: &mut [u8]) -> Result<usize, EncodeError> {
        let n = encode_frame(self.next_seq, message, out)?;
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(n)
    }
}

/// What a [`Decoder`] accepted and rejected, and why. Every byte it was fed is in exactly
/// one of `bytes_accepted`, `bytes_rejected`, `bytes_pending` (not yet delimited) or
/// is a delimiter (`delimiters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Frames decoded (known and unknown types).
    pub frames: u64,
    /// Of those, frames of a type this version does not define (skipped).
    pub unknown_type: u64,
    /// Rejected: not valid COBS.
    pub cobs_errors: u64,
    /// Rejected: shorter than header plus CRC.
    pub too_short: u64,
    /// Rejected: longer than the longest frame.
    pub oversized: u64,
    /// Rejected: CRC mismatch.
    pub crc_errors: u64,
    /// Rejected: another protocol version.
    pub bad_version: u64,
    /// Rejected: payload does not match its type's layout.
    pub malformed: u64,
    /// Encoded bytes of decoded frames (delimiters excluded).
    pub bytes_accepted: u64,
    /// Encoded bytes of rejected frames (delimiters excluded).
    pub bytes_rejected: u64,
    /// 0x00 delimiters seen, including empty frames (idle fill).
    pub delimiters: u64,
}

impl DecodeStats {
    /// All rejected frames, for whatever reason.
    pub fn rejected(&self) -> u64 {
        self.cobs_errors
            + self.too_short
            + self.oversized
            + self.crc_errors
            + self.bad_version
            + self.malformed
    }
}

/// A streaming frame decoder: feed it bytes in any pieces, get frames out. Holds at most
/// one frame (`N` bytes); never allocates, never panics; after a bad frame it
/// resynchronises at the next 0x00.
///
/// ```
/// use railtrace_protocol::{encode_frame_vec, Decoder, Message};
/// let wire = encode_frame_vec(7, &Message::Start { request_id: 1 }).unwrap();
/// let mut dec: Decoder = Decoder::new();
/// let mut input = &wire[..];
/// let frame = dec.next(&mut input).unwrap().unwrap();
/// assert_eq!((frame.seq, frame.message), (7, Message::Start { request_id: 1 }));
/// ```
#[derive(Debug)]
pub struct Decoder<const N: usize = MAX_ENCODED_FRAME> {
    buf: [u8; N],
    len: usize,
    overflow: usize,
    consumed: bool,
    stats: DecodeStats,
}

impl<const N: usize> Default for Decoder<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Decoder<N> {
    /// An empty decoder.
    pub const fn new() -> Self {
        Decoder {
            buf: [0; N],
            len: 0,
            overflow: 0,
            consumed: false,
            stats: DecodeStats {
                frames: 0,
                unknown_type: 0,
                cobs_errors: 0,
                too_short: 0,
                oversized: 0,
                crc_errors: 0,
                bad_version: 0,
                malformed: 0,
                bytes_accepted: 0,
                bytes_rejected: 0,
                delimiters: 0,
            },
        }
    }

    /// Counters since creation.
    pub fn stats(&self) -> DecodeStats {
        self.stats
    }

    /// Bytes held of a frame whose delimiter has not arrived yet.
    pub fn pending(&self) -> usize {
        if self.consumed {
            0
        } else {
            self.len + self.overflow
        }
    }

    /// Consumes bytes from the front of `input` up to and including the next delimiter
    /// that ends a non-empty frame, and returns that frame or why it was rejected. Returns
    /// `None` once `input` is used up without completing a frame; the partial frame is kept
    /// for the next call.
    pub fn next(&mut self, input: &mut &[u8]) -> Option<Result<Frame<'_>, FrameError>> {
        if self.consumed {
            self.len = 0;
            self.consumed = false;
        }
        loop {
            let p = cobs::zero_or_len(input);
            let (chunk, ended) = match (p < input.len()).then_some(p) {
                Some(p) => {
                    let (chunk, rest) = input.split_at(p);
                    *input = rest.get(1..).unwrap_or(&[]);
                    (chunk, true)
                }
                None => (core::mem::take(input), false),
            };
            self.push(chunk);
            if !ended {
                return None;
            }
            self.stats.delimiters += 1;
            if self.overflow > 0 {
                let len = self.len + self.overflow;
                self.stats.oversized += 1;
                self.stats.bytes_rejected += len as u64;
                self.len = 0;
                self.overflow = 0;
                return Some(Err(FrameError::Oversized { len, max: N }));
            }
            if self.len == 0 {
                continue; // empty frame: idle fill between delimiters
            }
            self.consumed = true;
            return Some(self.finish());
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        if self.overflow == 0 {
            if let Some(dst) = self.buf.get_mut(self.len..self.len + chunk.len()) {
                dst.copy_from_slice(chunk);
                self.len += chunk.len();
                return;
            }
        }
        self.overflow += chunk.len();
    }

    fn finish(&mut self) -> Result<Frame<'_>, FrameError> {
        let encoded_len = self.len;
        let result = parse(self.buf.get_mut(..encoded_len).unwrap_or(&mut []));
        let s = &mut self.stats;
        match &result {
            Ok(f) => {
                s.frames += 1;
                s.bytes_accepted += encoded_len as u64;
                if matches!(f.message, Message::Unknown { .. }) {
                    s.unknown_type += 1;
                }
            }
            Err(e) => {
                s.bytes_rejected += encoded_len as u64;
                *match e {
                    FrameError::Cobs { .. } => &mut s.cobs_errors,
                    FrameError::TooShort { .. } => &mut s.too_short,
                    FrameError::Oversized { .. } => &mut s.oversized,
                    FrameError::Crc { .. } => &mut s.crc_errors,
                    FrameError::UnsupportedVersion { .. } => &mut s.bad_version,
                    FrameError::Malformed { .. } => &mut s.malformed,
                } += 1;
            }
        }
        result
    }
}

/// Decodes one COBS frame (delimiter removed) in place.
fn parse(encoded: &mut [u8]) -> Result<Frame<'_>, FrameError> {
    let encoded_len = encoded.len();
    let len = cobs::decode_in_place(encoded).map_err(|_| FrameError::Cobs { len: encoded_len })?;
    let raw: &[u8] = encoded.get(..len).unwrap_or(&[]);
    if len < HEADER_LEN + CRC_LEN {
        return Err(FrameError::TooShort { len });
    }
    // COBS of a frame with zeros is shorter than the worst case, so an encoded frame that
    // fits the buffer can still decode to more than the longest raw frame.
    if len > MAX_RAW_FRAME {
        return Err(FrameError::Oversized {
            len,
            max: MAX_RAW_FRAME,
        });
    }
    let (body, crc) = raw.split_at(len - CRC_LEN);
    let received = u32::from_le_bytes(crc.try_into().map_err(|_| FrameError::TooShort { len })?);
    let computed = crc32c(body);
    if received != computed {
        return Err(FrameError::Crc { received, computed });
    }
    let mut r = Reader::new(body);
    let (Ok(version), Ok(msg_type), Ok(seq)) = (r.u8(), r.u8(), r.u32()) else {
        return Err(FrameError::TooShort { len });
    };
    if version != PROTOCOL_VERSION {
        return Err(FrameError::UnsupportedVersion {
            found: version,
            supported: PROTOCOL_VERSION,
            seq,
        });
    }
    let payload = r.rest();
    let message = Message::decode(msg_type, payload).map_err(|_| FrameError::Malformed {
        msg_type,
        seq,
        len: payload.len(),
        request_id: match payload {
            [a, b, ..] => Some(u16::from_le_bytes([*a, *b])),
            _ => None,
        },
    })?;
    Ok(Frame { seq, message })
}

/// What one sequence number says about the frames before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEvent {
    /// The first frame seen.
    First,
    /// The frame after the previous one.
    InOrder,
    /// `lost` frames are missing before this one.
    Gap {
        /// Frames missing.
        lost: u32,
    },
    /// The same sequence number as the previous frame.
    Duplicate,
    /// A number far behind the previous one: the sender restarted (or frames were
    /// reordered). Counting goes on from this frame.
    Restart {
        /// The sequence number expected.
        expected: u32,
    },
}

/// Follows a sender's sequence numbers and counts lost and duplicated frames exactly.
/// Numbers wrap at 2^32; a jump forward of less than 2^31 is a gap, anything else a
/// restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqTracker {
    last: Option<u32>,
    /// Frames received in order or after a gap (not duplicates).
    pub received: u64,
    /// Frames missing, summed over all gaps.
    pub lost: u64,
    /// Frames that repeated the previous number.
    pub duplicates: u64,
    /// Restarts seen.
    pub restarts: u64,
}

impl SeqTracker {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// The last sequence number seen.
    pub fn last(&self) -> Option<u32> {
        self.last
    }
    /// Records a received frame's sequence number.
    pub fn observe(&mut self, seq: u32) -> SeqEvent {
        let Some(last) = self.last else {
            self.last = Some(seq);
            self.received += 1;
            return SeqEvent::First;
        };
        if seq == last {
            self.duplicates += 1;
            return SeqEvent::Duplicate;
        }
        let expected = last.wrapping_add(1);
        let ahead = seq.wrapping_sub(expected);
        self.last = Some(seq);
        self.received += 1;
        if ahead == 0 {
            SeqEvent::InOrder
        } else if ahead < 1 << 31 {
            self.lost += u64::from(ahead);
            SeqEvent::Gap { lost: ahead }
        } else {
            self.restarts += 1;
            SeqEvent::Restart { expected }
        }
    }
}
