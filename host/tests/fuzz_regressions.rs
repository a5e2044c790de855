//! Replays every input in `fuzz/regressions/<target>/` (crashes the fuzzers found, and
//! seeds) through the fuzz targets' own checks, so a fixed bug stays fixed.
include!("../fuzz/recording.rs");
include!("../fuzz/logger_model.rs");

fn replay(target: &str, check: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the regressions folder exists") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "regression input {} fails", path.display());
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}

#[test]
fn recording_regressions_pass() {
    replay("recording", check_recording);
    replay("recording", check_flips);
}

#[test]
fn logger_model_regressions_pass() {
    replay("logger_model", check_logger_model);
}
