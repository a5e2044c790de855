//! The device link and capture: stopping on Ctrl-C ([`stop`]), the trigger outputs a host
//! drives into the rig ([`trigger`]), and the live view in a browser ([`view`]).
pub mod stop;
pub mod trigger;
pub mod view;
