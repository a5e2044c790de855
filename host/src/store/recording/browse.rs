//! A closed recording browsed at any span without reading it whole: its overview's
//! levels kept in memory (the coarse one read when opened, the fine one when first
//! wanted: the live view reads it, and walks the file's record batches, while its page
//! first paints from the coarse one), each window's summaries taken from the finest level that has enough of them
//! in it by a binary search over their times, and where none has, the record batches
//! that hold the window found by a binary search over their first times (each step
//! reads one batch's times) and read by seeking, each checked against its seal as it is
//! read. An hour at 100 kS/s of 8 channels is about 5 500 record batches: a search takes
//! about 13 of them, and their first times are kept for the next.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use arrow_array::{Array, Float64Array, RecordBatch};

use super::{open_scanned, scan, stream_head, Meta, Overview, Reader, Recording, RecordingError};

/// A closed recording opened for browsing: see the module's documentation.
#[derive(Debug)]
pub struct Browse {
    /// The file.
    pub path: PathBuf,
    /// Its length when opened.
    len: u64,
    coarse: Overview,
    fine: OnceLock<Option<Overview>>,
    /// The record batches, found when first wanted; `None` where the messages do not
    /// follow one another cleanly (the whole file is then read for a window's samples).
    index: OnceLock<Option<Index>>,
}

/// A recording's record batches of rows, from a walk over its messages' framing and
/// headers (their bodies are checked when read).
#[derive(Debug)]
struct Index {
    /// Their messages' byte ranges, in order.
    batches: Vec<(u64, u64)>,
    /// Each one's first row's time, once read.
    firsts: Mutex<Vec<Option<f64>>>,
    /// Where the fine level's message starts.
    fine_at: Option<u64>,
}

impl Browse {
    /// Opens `path` for browsing: its coarse summaries read. `None` where it has no
    /// overview (not closed, or written before format 5): such a file is read whole.
    pub fn open(path: &Path) -> Result<Option<Browse>, RecordingError> {
        let Some(coarse) = super::overview(path)? else {
            return Ok(None);
        };
        let len = file(path)?
            .metadata()
            .map_err(|error| RecordingError::Io {
                path: path.to_path_buf(),
                error,
            })?
            .len();
        Ok(Some(Browse {
            path: path.to_path_buf(),
            len,
            coarse,
            fine: OnceLock::new(),
            index: OnceLock::new(),
        }))
    }

    /// The record batches, walked the first time they are wanted (5 500 messages' headers
    /// for an hour at 100 kS/s: 11-21 ms from the page cache, 0.4-0.5 s from the disk).
    fn index(&self) -> Option<&Index> {
        let walk = || {
            let mut file = file(&self.path).ok()?;
            let (head, _) = stream_head(&mut file, self.len)?;
            // The fine level, the last message before the coarse one, is not rows.
            let (batches, fine_at) = scan::walk(&mut file, head, self.coarse.at)?;
            Some(Index {
                firsts: Mutex::new(vec![None; batches.len()]),
                batches,
                fine_at,
            })
        };
        self.index.get_or_init(walk).as_ref()
    }

    /// The recording's metadata.
    pub fn meta(&self) -> &Meta {
        &self.coarse.recording.meta
    }

    /// The coarse level's summaries (the whole recording, one row per 65 536 samples or
    /// fewer).
    pub fn coarse(&self) -> &Recording {
        &self.coarse.recording
    }

    /// The summaries of the coarsest level that has at least `want` of them starting in
    /// `[t0, t1]`: its rows there and one either side (a summary that straddles an end,
    /// and what tells a gap there). `None` where neither level has enough.
    pub fn summaries(
        &self,
        t0: f64,
        t1: f64,
        want: usize,
    ) -> Result<Option<Recording>, RecordingError> {
        let coarse = window(&self.coarse.recording, t0, t1);
        if coarse.1 >= want {
            return Ok(Some(coarse.0));
        }
        Ok(self
            .fine()
            .map(|fine| window(&fine.recording, t0, t1))
            .filter(|w| w.1 >= want)
            .map(|w| w.0))
    }

    /// The fine level (about 100 bytes per 1 024 samples: 35 MB for an hour at 100 kS/s),
    /// read the first time it is wanted; where it does not read, windows are drawn from
    /// the samples instead.
    pub fn fine(&self) -> Option<&Overview> {
        self.fine
            .get_or_init(|| {
                let hint = self.index().and_then(|i| i.fine_at);
                self.coarse.finer_at(hint).ok().flatten()
            })
            .as_ref()
    }

    /// A reader of the record batches that hold `[t0, t1]` and one either side, read by
    /// seeking and each checked as it is read (a damaged one is named and its samples
    /// given out as a gap, as [`super::open`] does); block rows are given out as they are
    /// ([`super::open_blocks`]).
    pub fn samples(&self, t0: f64, t1: f64) -> Result<Reader, RecordingError> {
        let Some(index) = self.index() else {
            return super::open_at(&self.path, Some(self.len), None, true);
        };
        let n = index.batches.len();
        // The first batch starting after t0, and after t1: the window lies in the batches
        // from the one before the first to the second.
        let after = |t: f64| -> Result<usize, RecordingError> {
            let (mut lo, mut hi) = (0, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if self.first(index, mid)? <= t {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            Ok(lo)
        };
        let from = after(t0)?.saturating_sub(2);
        let to = (after(t1)? + 1).min(n);
        open_window(&self.path, self.len, &index.batches[from..to], None, true)
    }

    /// Record batch `i`'s first row's time (a block's is its first sample's).
    fn first(&self, index: &Index, i: usize) -> Result<f64, RecordingError> {
        if let Some(t) = index.firsts.lock().unwrap_or_else(|e| e.into_inner())[i] {
            return Ok(t);
        }
        let mut r = open_window(
            &self.path,
            self.len,
            &index.batches[i..=i],
            Some(&["time_s"]),
            true,
        )?;
        let batch = r.next().transpose()?;
        let t = batch
            .as_ref()
            .and_then(|b| b.column_by_name("time_s"))
            .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
            .filter(|c| !c.is_empty() && c.is_valid(0))
            .map_or(f64::NEG_INFINITY, |c| c.value(0));
        index.firsts.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(t);
        Ok(t)
    }
}

fn file(path: &Path) -> Result<File, RecordingError> {
    railtrace_twin::scenario::open_regular(path).map_err(|error| RecordingError::Io {
        path: path.to_path_buf(),
        error,
    })
}

/// The rows of an overview level that start in `[t0, t1]`, with one either side, and
/// how many start inside.
fn window(level: &Recording, t0: f64, t1: f64) -> (Recording, usize) {
    let mut inside = 0;
    let mut batches: Vec<RecordBatch> = Vec::new();
    for b in &level.batches {
        let Some(time) = b
            .column_by_name("time_s")
            .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
        else {
            continue;
        };
        // A level's rows are in time order.
        let v = time.values();
        let a = v.partition_point(|&t| t < t0);
        let z = v.partition_point(|&t| t <= t1);
        inside += z - a;
        let (a, z) = (a.saturating_sub(1), (z + 1).min(v.len()));
        if z > a {
            batches.push(b.slice(a, z - a));
        }
    }
    let rec = Recording {
        path: level.path.clone(),
        meta: level.meta.clone(),
        schema: level.schema.clone(),
        batches,
        finalised: level.finalised,
        damage: level.damage.clone(),
    };
    (rec, inside)
}

/// A reader of the record batches of rows `window` (their messages' byte ranges) of the
/// recording at `path`, `len` bytes long when opened; each checked against its seal
/// first, a damaged one named and left out (its samples a gap, as [`super::open`] gives
/// them). `columns` and `raw` as for [`super::open_blocks`].
pub(super) fn open_window(
    path: &Path,
    len: u64,
    window: &[(u64, u64)],
    columns: Option<&[&str]>,
    raw: bool,
) -> Result<Reader, RecordingError> {
    let mut file = file(path)?;
    let Some((head, top)) = stream_head(&mut file, len) else {
        return Err(RecordingError::Foreign {
            path: path.to_path_buf(),
            why: "its schema no longer reads (was it replaced?)".into(),
        });
    };
    let mut s = scan::Scan {
        ranges: vec![(0, head)],
        sealed: true,
        ..Default::default()
    };
    for &(at, end) in window {
        match scan::message(&mut file, at, len, false, true, &top) {
            Ok(Some(m)) if m.end == end && m.is_batch && m.content == scan::ROWS => {
                s.ranges.push((at, end));
            }
            other => {
                let why = match other {
                    Err(scan::Bad::Damaged(why)) => why,
                    Err(scan::Bad::Cut) => "the file ends inside it".into(),
                    Ok(_) => "another message than was there".into(),
                };
                s.damage.push(format!(
                    "a record batch is damaged ({why}, at byte {at}); skipped up to byte {end}"
                ));
                s.holes.push(s.ranges.len() - 1);
            }
        }
    }
    open_scanned(
        path,
        file,
        (len, true),
        s,
        columns,
        raw,
        Some(window.to_vec()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::decimate::{window_json, window_of};
    use crate::store::recording::{Event, Writer};

    /// 300 000 samples of 2 rails (codes from a fixed seed) at 10 µs in blocks of 50, a gap
    /// of 1 000 samples after the first 123 450, a trigger edge every 10 000: five record
    /// batches of rows, then the overview.
    fn write(path: &Path) {
        let meta = Meta {
            code_channels: vec![0, 1, 2, 3],
            derive: Some(super::super::Derive {
                tick_hz: 1e6,
                channels: vec![0, 1, 2, 3],
                cal: vec![(0.01, 0.1), (0.001, 0.0), (0.02, -0.5), (0.0005, 0.0)],
                rails: vec![(Some(1), Some(0)), (Some(3), Some(2))],
            }),
            ..Meta::new("test", &["a", "b"])
        };
        let mut w = Writer::create(path, &meta).unwrap();
        let mut x: u32 = 11;
        let (mut index, mut time) = (0u64, 1.0f64);
        while index < 301_000 {
            if index == 123_450 {
                w.event(&Event::Gap {
                    time_s: time,
                    index: Some(index),
                    samples: Some(1000),
                    duration_s: 1000.0 * 1e-5,
                    cause: "test".into(),
                });
                (index, time) = (index + 1000, time + 1000.0 * 1e-5);
            }
            if index % 10_000 == 0 {
                w.event(&Event::Edge {
                    time_s: time,
                    tick: None,
                    index: Some(index),
                    line: 1,
                    rising: index % 20_000 == 0,
                    count: None,
                    label: "kernel".into(),
                });
            }
            let codes: Vec<i16> = (0..50 * 4)
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (x >> 20) as i16
                })
                .collect();
            w.block(time, index, index * 10, 10, 1e-5, &codes);
            (index, time) = (index + 50, time + 50.0 * 1e-5);
            w.maybe_flush().unwrap();
        }
        w.finish().unwrap();
    }

    /// A window drawn from the samples reads only the record batches that hold it and
    /// draws what reading the whole file draws; one drawn from summaries draws what the
    /// whole level draws; a damaged batch in a window is named and its samples a gap, as
    /// reading the whole file gives them.
    #[test]
    fn a_browsed_window_is_what_the_whole_file_draws() {
        let path = std::env::temp_dir().join(format!("railtrace-browse-{}", std::process::id()));
        write(&path);
        let b = Browse::open(&path).unwrap().expect("a closed recording");
        let batches = b.index().expect("its messages walk").batches.clone();
        assert!(batches.len() >= 5, "{} record batches", batches.len());
        let columns = 200;
        // Spans from a millisecond to the whole, at the start, across the gap and at the end.
        let samples = [
            (1.0, 1.001),
            (1.5, 1.6),
            (2.2, 2.3),
            (2.2, 2.25),
            (3.9, 4.02),
            (1.0, 1.3),
        ];
        for (t0, t1) in samples {
            let got = window_json(&path, Some(&b), t0, t1, columns).unwrap();
            assert_eq!(got["summaries"], false, "{t0}..{t1}");
            assert_eq!(
                got,
                window_json(&path, None, t0, t1, columns).unwrap(),
                "{t0}..{t1}"
            );
        }
        assert!(
            (b.index().unwrap().firsts.lock().unwrap().iter()).any(Option::is_none),
            "a window's batches are found without reading every batch's times"
        );
        let coarse = super::super::overview(&path).unwrap().unwrap();
        let fine = coarse.finer().unwrap().unwrap();
        for (t0, t1, level) in [(0.0, 5.0, &fine), (1.2, 3.8, &fine)] {
            let got = window_json(&path, Some(&b), t0, t1, 100).unwrap();
            assert_eq!(got["summaries"], true, "{t0}..{t1}");
            assert_eq!(got, window_of(&level.recording, t0, t1, 100).unwrap());
        }
        // A bit flipped inside the third batch's body.
        let (at, end) = batches[2];
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[(at + (end - at) / 2) as usize] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let b = Browse::open(&path).unwrap().expect("a closed recording");
        let ix = b.index().expect("its framing is whole");
        let first = |i| b.first(ix, i);
        let (t0, t1) = (first(1).unwrap(), first(3).unwrap() + 0.01);
        let got = window_json(&path, Some(&b), t0, t1, columns).unwrap();
        assert_eq!(got, window_json(&path, None, t0, t1, columns).unwrap());
        let gaps = got["gaps"].as_array().unwrap();
        assert!(
            gaps.iter()
                .any(|g| g[0].as_f64().unwrap() <= first(3).unwrap()
                    && g[1].as_f64().unwrap() >= first(3).unwrap() - 0.1),
            "the damaged batch's samples are a gap: {gaps:?} (its first time read as {:?})",
            first(2).ok()
        );
        let r = b.samples(t0, t1).unwrap();
        assert!(
            r.damage().iter().any(|d| d.contains("checksum")),
            "{:?}",
            r.damage()
        );
        std::fs::remove_file(&path).unwrap();
    }
}
