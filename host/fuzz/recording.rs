// The property the `recording` fuzz target checks, shared with
// `tests/fuzz_regressions.rs` by `include!`: any bytes, read as a recording, are read or
// refused with an error, never a panic or an abort (its overview too); every row of what is read has a kind
// and its columns as the format documents them.

pub fn check_recording(data: &[u8]) {
    use railtrace::store::recording::{self, Kind, Rows};
    let path = std::env::temp_dir().join(format!("railtrace-fuzz-{}.arrow", std::process::id()));
    std::fs::write(&path, data).expect("the temp dir is writable");
    if let Ok(r) = recording::read(&path) {
        for rows in r.rows() {
            for i in 0..rows.len() {
                if rows.kind(i) == Kind::Sample {
                    let _ = Rows::get(rows.f64("time_s"), i);
                    let _ = Rows::get(rows.f32("total_w"), i);
                }
            }
        }
        let _ = r.counts();
    }
    if let Ok(r) = recording::open_columns(&path, &["time_s", "total_w"]) {
        for b in r.flatten() {
            let _ = Rows::new(&b).len();
        }
    }
    if let Ok(Some(o)) = recording::overview(&path) {
        let _ = o.recording.counts();
        if let Ok(Some(fine)) = o.finer() {
            let _ = fine.recording.counts();
        }
    }
    let _ = std::fs::remove_file(&path);
}
