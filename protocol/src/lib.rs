//! The wire format between a railtrace rig and its host, as specified in `SPEC.md`.
//!
//! Every message travels in a frame: a version byte, a type byte, a 32-bit sequence
//! number, the payload and a CRC-32C, COBS-encoded and ended by a 0x00 byte. The crate is
//! `no_std` and never allocates; the `std` feature adds `Vec`-returning conveniences.
//!
//! - [`encode_frame`] / [`FrameEncoder`] write frames;
//! - [`Decoder`] reassembles frames from bytes read in any pieces, rejects and counts bad
//!   ones ([`DecodeStats`]) and resynchronises at the next delimiter;
//! - [`SeqTracker`] turns sequence numbers into exact counts of lost and duplicated frames.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]
#![warn(missing_docs)]

pub mod cobs;
mod crc;
mod frame;
mod message;
mod wire;

pub use crc::{crc32c, crc32c_continue};
#[cfg(feature = "std")]
pub use frame::encode_frame_vec;
pub use frame::{
    encode_frame, encode_raw_frame, max_block_samples, DecodeStats, Decoder, EncodeError, Frame,
    FrameEncoder, FrameError, SeqEvent, SeqTracker, CRC_LEN, HEADER_LEN, MAX_ENCODED_FRAME,
    MAX_PAYLOAD, MAX_RAW_FRAME, MAX_WIRE_FRAME, PROTOCOL_VERSION,
};
pub use message::*;
