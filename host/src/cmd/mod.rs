//! One subcommand per file.
pub mod devices;
pub mod info;
pub mod twin;
