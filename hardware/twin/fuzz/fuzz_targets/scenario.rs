#![no_main]
//! `cargo +nightly fuzz run scenario` (from `hardware/twin/`). Crashes found go into
//! `fuzz/regressions/`, which `tests/fuzz_regressions.rs` replays on every test run.
use libfuzzer_sys::fuzz_target;

include!("../check.rs");

fuzz_target!(|data: &[u8]| check(data));
