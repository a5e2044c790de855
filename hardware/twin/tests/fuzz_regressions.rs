//! Replays every input in `fuzz/regressions/` (crashes the fuzzer found, and seeds)
//! through the fuzz target's own check, so a fixed bug stays fixed.
include!("../fuzz/check.rs");

#[test]
fn fuzz_regressions_pass() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/regressions exists") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "regression input {} fails", path.display());
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}
