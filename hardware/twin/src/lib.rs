//! The digital twin of the bench: the GPU, its power logger, the rig's rails, sensors and
//! ADC, the microcontroller running the real firmware core, and the serial link, on a real
//! pseudo-terminal, from a scenario file; and the truth it knows, written as Arrow files.
//!
//! Start one with [`Twin::start`] on a [`Loaded`] scenario ([`default_scenario`] or
//! [`load_scenario`]); `railtrace twin serve` does that from the command line.
#![warn(missing_docs)]
pub mod adc;
pub mod clock;
pub mod mcu;
pub mod pty;
pub mod random;
pub mod rig;
pub mod scenario;
pub mod twin;

pub use scenario::{default_scenario, load as load_scenario, Loaded, Scenario, ScenarioError};
pub use twin::Twin;
pub mod gpu;
pub mod logger;
pub mod trace;
pub mod truth;
