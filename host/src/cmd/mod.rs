//! One subcommand per file.
pub mod capture;
pub mod devices;
pub mod info;
pub mod inspect;
pub mod twin;
