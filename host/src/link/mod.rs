//! The device link and capture: talking to a rig over its serial port ([`transport`]),
//! capturing its stream into a recording ([`capture`]), a capture in the background read
//! as it goes, with energy windows, marks and trigger outputs ([`meter`]), stopping on
//! Ctrl-C ([`stop`]), the trigger outputs a host drives into the rig ([`trigger`]), and
//! the live view in a browser ([`view`]).
pub mod capture;
pub mod meter;
pub mod stop;
pub mod transport;
pub mod trigger;
#[cfg(feature = "view")]
pub mod view;
