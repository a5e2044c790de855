//! One subcommand per file.
pub mod calibrate;
pub mod capture;
pub mod correct;
pub mod demo;
pub mod devices;
pub mod dvfs;
pub mod export;
pub mod import;
pub mod info;
pub mod inspect;
pub mod model;
pub mod plot;
pub mod profile;
pub mod report;
pub mod twin;
