// The property the `scenario` fuzz target checks, shared with `tests/fuzz_regressions.rs`
// by `include!`. Byte 0 picks what the rest is: (even) a scenario's text on the built-in
// fast rig, or (odd) a rig file's text under the built-in scenario. Either is loaded or
// refused with a one-line error naming the file, never a panic, an abort or a hang (a
// scenario that loads has every size, rate and duration within its bounds).

pub fn check(data: &[u8]) {
    use railtrace_twin::scenario::{parse, DEFAULT_RIG, DEFAULT_SCENARIO};
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (scenario, rig) = if first % 2 == 0 {
        (text.as_ref(), DEFAULT_RIG)
    } else {
        (DEFAULT_SCENARIO, text.as_ref())
    };
    match parse("fuzz.toml", scenario, |_| {
        Ok(("rig.toml".into(), rig.to_string()))
    }) {
        Ok(_) => {}
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(
                line.starts_with("fuzz.toml") || line.starts_with("rig.toml"),
                "{line}"
            );
        }
    }
}
