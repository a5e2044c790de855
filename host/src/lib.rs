//! The railtrace host library: talking to a rig ([`transport`]). Capture, recording,
//! exports and importers come with the rest of issue 5.
pub mod import;
pub mod transport;
