//! The rig's portable firmware core: `no_std`, no heap, generic over embedded-hal 1.0 and
//! embedded-io, so the same code runs on a board, in the digital twin and in host tests.
//!
//! - [`ad7606`]: the ADC driver (8 simultaneous 16-bit channels over SPI).
//! - [`ad7606_parallel`]: the same ADC on its 16-bit parallel interface, with the
//!   AD7606C's software-mode register writes (analog bandwidth).
//! - [`sampler`]: the interrupt side: a conversion per sample-timer tick, on-device
//!   averaging, and trigger-edge capture, handed over through lock-free queues with every
//!   loss counted.
//! - [`device`]: the main loop: commands, sample blocks, edges, status, the link.
//! - [`hw`]: the hardware traits a board implements.
//! - [`test_signal`]: a built-in signal for boards without an ADC (emulation).
#![cfg_attr(not(test), no_std)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![warn(missing_docs)]

pub mod ad7606;
pub mod ad7606_parallel;
pub mod device;
pub mod hw;
pub mod sampler;
pub mod test_signal;

pub use device::{ChannelSpec, Description, Device};
pub use hw::{Board, Calibration, ErrorKind, SampleSource, CHANNELS};
pub use sampler::{Edge, EdgeCapture, Queues, Sample, Sampler, Shared};
