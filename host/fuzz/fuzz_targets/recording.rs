#![no_main]
//! `cargo +nightly fuzz run recording` (from `host/`). Crashes found go into
//! `fuzz/regressions/recording/`, which `tests/fuzz_regressions.rs` replays on every test
//! run.
use libfuzzer_sys::fuzz_target;

include!("../recording.rs");

fuzz_target!(|data: &[u8]| {
    check_recording(data);
    check_flips(data);
});
