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

/// The second property: bits flipped in a recording railtrace wrote (the input says
/// where: 4 bytes of position and 1 of bit, again and again) lose only what they
/// damage, and every sample a reader skips is in a gap row. Of the 400 samples written
/// in 4 batches, those read and those the gap rows count add up to 400, unless a gap row
/// of unknown length (a damaged last batch) ends the recording.
pub fn check_flips(data: &[u8]) {
    use railtrace::store::recording::{self, Meta, Writer};
    static WRITTEN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let dir = std::env::temp_dir();
    let path = dir.join(format!("railtrace-fuzz-flips-{}.arrow", std::process::id()));
    let original = WRITTEN.get_or_init(|| {
        let meta = Meta::new("fuzz", &["a"]);
        let _ = std::fs::remove_file(&path);
        let mut w = Writer::create(&path, &meta).expect("the temp dir is writable");
        for k in 0..400u64 {
            w.sample(k as f64 * 1e-5, Some(k), None, &[(12.0, 1.0)], &[]);
            if k % 100 == 99 {
                w.flush().expect("the temp dir is writable");
            }
        }
        w.finish().expect("the temp dir is writable");
        let bytes = std::fs::read(&path).expect("just written");
        let _ = std::fs::remove_file(&path);
        bytes
    });
    let mut bytes = original.clone();
    for flip in data.chunks_exact(5) {
        let at = u32::from_le_bytes([flip[0], flip[1], flip[2], flip[3]]) as usize % bytes.len();
        bytes[at] ^= 1 << (flip[4] % 8);
    }
    std::fs::write(&path, &bytes).expect("the temp dir is writable");
    if let Ok(r) = recording::read(&path) {
        let (samples, gaps, open_ended) = r.accounted();
        assert!(
            open_ended || samples + gaps == 400,
            "{samples} samples read and {gaps} in gap rows of 400 written ({:?})",
            r.damage
        );
    }
    let _ = std::fs::remove_file(&path);
}
