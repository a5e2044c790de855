#![no_main]
//! `cargo +nightly fuzz run logger_model` (from `host/`). Crashes found go into
//! `fuzz/regressions/logger_model/`, which `tests/fuzz_regressions.rs` replays on every
//! test run.
use libfuzzer_sys::fuzz_target;

include!("../logger_model.rs");

fuzz_target!(|data: &[u8]| check_logger_model(data));
