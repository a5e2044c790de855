//! One subcommand per file.
pub mod twin;
