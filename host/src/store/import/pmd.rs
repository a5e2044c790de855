//! The paired traces of `shared/data/gpu-power-benchmark/` (Yang, Adamek and Armour,
//! SC24): an ElmorLabs PMD external meter beside `nvidia-smi`'s own readings, and the
//! host's times of the load's edges. Formats as that folder's README gives them:
//!
//! - `PMD_data.bin`: 18-byte little-endian records of nine `u16`: a tick counter at
//!   2934.5 ticks/ms wrapping at 65536, then four (voltage, current) pairs of 12-bit codes
//!   in bits 4..15 (a code with bit 11 set reads 0); current × 48.8 mA, voltage ×
//!   7.568 mV (the third pair's voltage × 7.5 mV). Power is Σ V·I.
//! - `PMD_start_ts.txt`: host time (µs since the Unix epoch) at which the stream
//!   started; the first record is 50 ms before it.
//! - `gpudata.csv`: `nvidia-smi --query-gpu=... --format=csv`, timestamps in the host's
//!   local time (the offset to UTC must be given: +1 h for the A100 runs).
//! - `timestamps.csv`: `timestamp` then µs since the Unix epoch (UTC).

use std::path::{Path, PathBuf};

/// Why a folder could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What happened.
        error: std::io::Error,
    },
    /// A file is not in the expected format.
    #[error("{}:{line}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// Line (1-based), or 0 for a binary file.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// PMD ticks per millisecond.
pub const PMD_TICKS_PER_MS: f64 = 2934.5;
const RECORD: usize = 18;

/// The external meter's trace.
#[derive(Debug, Clone, PartialEq)]
pub struct PmdTrace {
    /// Time of each record, µs since the Unix epoch (UTC).
    pub time_us: Vec<f64>,
    /// Per record, the four (voltage V, current A) pairs.
    pub pairs: Vec<[(f64, f64); 4]>,
}

impl PmdTrace {
    /// Total power of record `i`, W.
    pub fn power_w(&self, i: usize) -> f64 {
        self.pairs
            .get(i)
            .map_or(f64::NAN, |p| p.iter().map(|(v, a)| v * a).sum())
    }
}

fn code(word: u16) -> f64 {
    let c = (word >> 4) & 0x0FFF;
    if c & 0x0800 != 0 {
        0.0
    } else {
        f64::from(c)
    }
}

/// Parses `PMD_data.bin` (`bytes`) whose stream started at `start_us`.
pub fn parse_pmd(path: &Path, bytes: &[u8], start_us: f64) -> Result<PmdTrace, ImportError> {
    if bytes.is_empty() || bytes.len() % RECORD != 0 {
        return Err(ImportError::Format {
            path: path.to_path_buf(),
            line: 0,
            message: format!(
                "{} bytes is not a whole number of 18-byte records",
                bytes.len()
            ),
        });
    }
    let mut trace = PmdTrace {
        time_us: Vec::with_capacity(bytes.len() / RECORD),
        pairs: Vec::with_capacity(bytes.len() / RECORD),
    };
    let t0 = start_us - 50_000.0;
    let (mut ticks, mut last) = (0u64, None::<u16>);
    for rec in bytes.chunks_exact(RECORD) {
        let w: Vec<u16> = rec
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let tick = w[0];
        if let Some(prev) = last {
            ticks += u64::from(tick.wrapping_sub(prev));
        }
        last = Some(tick);
        trace
            .time_us
            .push(t0 + ticks as f64 / PMD_TICKS_PER_MS * 1000.0);
        let mut pairs = [(0.0, 0.0); 4];
        for (k, pair) in pairs.iter_mut().enumerate() {
            let volts_per_code = if k == 2 { 7.5e-3 } else { 7.568e-3 };
            *pair = (
                code(w[1 + 2 * k]) * volts_per_code,
                code(w[2 + 2 * k]) * 48.8e-3,
            );
        }
        trace.pairs.push(pairs);
    }
    Ok(trace)
}

/// One `nvidia-smi` reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmiReading {
    /// Time, µs since the Unix epoch (UTC).
    pub time_us: f64,
    /// `power.draw [W]`.
    pub power_draw_w: f64,
    /// `power.draw.instant [W]`, where logged.
    pub power_instant_w: Option<f64>,
    /// `power.draw.average [W]`, where logged.
    pub power_average_w: Option<f64>,
    /// `temperature.gpu` (°C), where logged.
    pub temperature_c: Option<f64>,
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian; Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses `YYYY/MM/DD HH:MM:SS.fff` in local time `utc_offset_h` hours east of UTC.
fn parse_time(s: &str, utc_offset_h: f64) -> Option<f64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('/').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    let local_s = (days_from_civil(y, m, day) * 86_400 + h * 3600 + min * 60) as f64 + sec;
    Some((local_s - utc_offset_h * 3600.0) * 1e6)
}

/// Parses `gpudata.csv` (`text`), its times `utc_offset_h` hours east of UTC.
pub fn parse_smi(
    path: &Path,
    text: &str,
    utc_offset_h: f64,
) -> Result<Vec<SmiReading>, ImportError> {
    let bad = |line: usize, message: String| ImportError::Format {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| bad(1, "empty file".into()))?
        .split(',')
        .map(str::trim)
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let t_col = col("timestamp").ok_or_else(|| bad(1, "no `timestamp` column".into()))?;
    let p_col = col("power.draw [W]").ok_or_else(|| bad(1, "no `power.draw [W]` column".into()))?;
    let i_col = col("power.draw.instant [W]");
    let a_col = col("power.draw.average [W]");
    let temp_col = col("temperature.gpu").or_else(|| col("temperature.gpu [C]"));
    let mut out = Vec::new();
    for (n, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |c: usize| f.get(c).copied().unwrap_or("");
        let time_us = parse_time(field(t_col), utc_offset_h)
            .ok_or_else(|| bad(n + 2, format!("bad timestamp {:?}", field(t_col))))?;
        let power_draw_w = field(p_col)
            .parse()
            .map_err(|_| bad(n + 2, format!("bad power.draw {:?}", field(p_col))))?;
        let power_instant_w = i_col.and_then(|c| field(c).parse().ok());
        let power_average_w = a_col.and_then(|c| field(c).parse().ok());
        let temperature_c = temp_col.and_then(|c| field(c).parse().ok());
        out.push(SmiReading {
            time_us,
            power_draw_w,
            power_instant_w,
            power_average_w,
            temperature_c,
        });
    }
    Ok(out)
}

/// A whole run folder.
#[derive(Debug, Clone, PartialEq)]
pub struct PmdRun {
    /// The external meter.
    pub pmd: PmdTrace,
    /// The GPU's own readings.
    pub smi: Vec<SmiReading>,
    /// The load's edges, µs since the Unix epoch, each once.
    pub edges_us: Vec<f64>,
    /// The lines of `timestamps.csv`: the bench lists each edge twice (its start and end
    /// marks land on the same µs), counted once in `edges_us`.
    pub edges_listed: usize,
}

/// The most bytes of a run's file read: 8 GiB, a PMD streaming for more than a day.
const MAX_RUN_FILE_BYTES: u64 = 8 << 30;

fn read(path: &Path) -> Result<Vec<u8>, ImportError> {
    railtrace_twin::scenario::read_file(path, MAX_RUN_FILE_BYTES, "a run's file").map_err(|error| {
        ImportError::Io {
            path: path.to_path_buf(),
            error,
        }
    })
}

fn text(path: &Path) -> Result<String, ImportError> {
    String::from_utf8(read(path)?).map_err(|_| ImportError::Format {
        path: path.to_path_buf(),
        line: 0,
        message: "not UTF-8 text".into(),
    })
}

/// A PMD sensing 12 V rails (the PCIe connectors, the slot, EPS): each pair reads 12 V
/// within 10 % (ATX allows 8 %) or, unconnected, under half a volt, in all but 1 % of its
/// records; and its records come every 50 µs to 2 ms (about 209 µs as it streams). Bytes
/// that are not such a recording (another file renamed, random data: volts spread over
/// 0-15.5 V, records hundreds of ms apart) are refused rather than imported as power.
fn check_plausible(path: &Path, t: &PmdTrace) -> Result<(), ImportError> {
    let bad = |message: String| ImportError::Format {
        path: path.to_path_buf(),
        line: 0,
        message,
    };
    let n = t.pairs.len();
    for k in 0..4 {
        let off = t
            .pairs
            .iter()
            .filter(|p| !(p[k].0 < 0.5 || (10.8..=13.2).contains(&p[k].0)))
            .count();
        if off * 100 > n {
            let mut v: Vec<f64> = t.pairs.iter().map(|p| p[k].0).collect();
            v.sort_by(f64::total_cmp);
            return Err(bad(format!(
                "pair {}'s voltage is off a 12 V rail (10.8-13.2 V, or under 0.5 V unconnected) in {:.1} % of its {n} records (median {:.2} V): not a PMD recording of a GPU's rails",
                k + 1,
                off as f64 * 100.0 / n as f64,
                v[n / 2]
            )));
        }
    }
    if n > 1 {
        let mut dt: Vec<f64> = t.time_us.windows(2).map(|w| w[1] - w[0]).collect();
        dt.sort_by(f64::total_cmp);
        let median = dt[dt.len() / 2];
        if !(50.0..=2000.0).contains(&median) {
            return Err(bad(format!(
                "its records are {median:.0} µs apart (median; a PMD streams one every ~209 µs): not a PMD recording"
            )));
        }
    }
    Ok(())
}

/// Reads a run folder; `utc_offset_h` is the local time of `gpudata.csv`.
pub fn read_run(dir: &Path, utc_offset_h: f64) -> Result<PmdRun, ImportError> {
    let start_path = dir.join("PMD_start_ts.txt");
    let start_text = text(&start_path)?;
    // µs since the Unix epoch, from 2000 to 2100.
    let start_us: f64 = (start_text.trim().parse().ok())
        .filter(|t: &f64| (946_684_800e6..4_102_444_800e6).contains(t))
        .ok_or_else(|| ImportError::Format {
            path: start_path.clone(),
            line: 1,
            message: format!(
                "not a time in µs since the Unix epoch (2000 to 2100): {:?}",
                start_text.trim()
            ),
        })?;
    let bin = dir.join("PMD_data.bin");
    let pmd = parse_pmd(&bin, &read(&bin)?, start_us)?;
    check_plausible(&bin, &pmd)?;
    let smi_path = dir.join("gpudata.csv");
    let smi = parse_smi(&smi_path, &text(&smi_path)?, utc_offset_h)?;
    if let Some(i) = smi
        .windows(2)
        .position(|w| w[1].time_us < w[0].time_us - 1e6)
    {
        return Err(ImportError::Format {
            path: smi_path,
            line: i + 3,
            message: "its time goes back by more than a second: not one run's log".into(),
        });
    }
    let ts_path = dir.join("timestamps.csv");
    let mut edges_us = Vec::new();
    // A load edge lies within the meter's recording (give or take a second).
    let (first, last) = (
        pmd.time_us.first().copied().unwrap_or(start_us),
        pmd.time_us.last().copied().unwrap_or(start_us),
    );
    let span = first - 1e6..=last + 1e6;
    for (n, line) in text(&ts_path)?.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| ImportError::Format {
            path: ts_path.clone(),
            line: n + 1,
            message,
        };
        let t: f64 = (line.trim().parse().ok())
            .filter(|t: &f64| t.is_finite())
            .ok_or_else(|| bad(format!("not a time in µs: {line:?}")))?;
        if !span.contains(&t) {
            return Err(bad(format!(
                "a load edge at {t} µs since the Unix epoch, outside the meter's recording ({first:.0} to {last:.0} µs): not this run's"
            )));
        }
        edges_us.push(t);
    }
    let edges_listed = edges_us.len();
    edges_us.sort_by(f64::total_cmp);
    edges_us.dedup();
    Ok(PmdRun {
        pmd,
        smi,
        edges_us,
        edges_listed,
    })
}

/// The UTC offset (hours east, in half hours from -12 h to +14 h) at which the most
/// `nvidia-smi` readings, parsed as if in UTC, fall within the meter's span; None when
/// none does at any offset.
pub fn guess_utc_offset_h(pmd: &PmdTrace, smi_as_utc: &[SmiReading]) -> Option<f64> {
    let (first, last) = (*pmd.time_us.first()?, *pmd.time_us.last()?);
    (-24..=28)
        .map(|half_hours| {
            let h = f64::from(half_hours) / 2.0;
            let shift = h * 3600e6;
            let n = smi_as_utc
                .iter()
                .filter(|r| (first..=last).contains(&(r.time_us - shift)))
                .count();
            (n, h)
        })
        .filter(|(n, _)| *n > 0)
        .max_by_key(|(n, _)| *n)
        .map(|(_, h)| h)
}

/// Rail names of the PMD's four pairs (the original analysis calls pairs 1, 2 and 4
/// PCIe and pair 3 EPS).
pub const PMD_RAILS: [&str; 4] = ["pair1_pcie", "pair2_pcie", "pair3_eps", "pair4_pcie"];

/// Writes a run as a railtrace recording: the meter's records as samples of four rails,
/// `nvidia-smi`'s readings as logger rows, the load's edges as edge rows (rising or
/// falling as the meter's power steps up or down across them), and gaps where the meter's
/// records stop for more than ten record periods. Returns the rows written.
pub fn write_recording(
    run: &PmdRun,
    source: &str,
    settings: serde_json::Value,
    out: &Path,
) -> Result<u64, crate::store::recording::RecordingError> {
    use crate::store::recording::{Event, Meta, Writer, FORMAT_VERSION};
    let t = &run.pmd.time_us;
    let epoch_us = t.first().copied().unwrap_or(0.0);
    let s = |us: f64| (us - epoch_us) * 1e-6;
    let meta = Meta {
        version: FORMAT_VERSION,
        source: source.to_string(),
        epoch_utc_ns: (epoch_us * 1e3).round() as i64,
        timebase: "the host's clock of the paired-trace bench: the meter's ticks from PMD_start_ts.txt, nvidia-smi's local time shifted to UTC".into(),
        rails: PMD_RAILS.iter().map(|r| r.to_string()).collect(),
        code_channels: Vec::new(),
        device: Some(serde_json::json!({"board": "ElmorLabs PMD", "serial": "", "firmware": ""})),
        rig: None,
        settings: Some(settings),
        derive: None,
    };
    let mut w = Writer::create(out, &meta)?;
    let mut spacing: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
    spacing.sort_by(f64::total_cmp);
    let median = spacing
        .get(spacing.len() / 2)
        .copied()
        .unwrap_or(f64::INFINITY);
    // The meter's mean power just before and after an instant, to tell an edge's sense.
    let mean_power = |from: f64, to: f64| {
        let (a, b) = (
            t.partition_point(|&x| x < from),
            t.partition_point(|&x| x < to),
        );
        (a..b).map(|i| run.pmd.power_w(i)).sum::<f64>() / (b - a).max(1) as f64
    };
    // nvidia-smi's readings carry the host's clock (local time made UTC).
    let logger = |r: &SmiReading| Event::Logger {
        time_s: s(r.time_us),
        power_w: r.power_draw_w,
        instant_w: r.power_instant_w,
        average_w: r.power_average_w,
        temperature_c: r.temperature_c,
        energy_j: None,
        source: None,
        gpu_ticks: None,
        host_ns: Some((r.time_us * 1e3).round() as i64),
        own_s: None,
        polled_ns: None,
    };
    let mut edges = run.edges_us.iter().peekable();
    let mut smi = run.smi.iter().peekable();
    for (i, (&us, pairs)) in t.iter().zip(&run.pmd.pairs).enumerate() {
        while let Some(&&e) = edges.peek().filter(|&&&e| e <= us) {
            edges.next();
            let rising = mean_power(e, e + 20e3) > mean_power(e - 20e3, e);
            w.event(&Event::Edge {
                time_s: s(e),
                tick: None,
                index: None,
                line: 0,
                rising,
                count: None,
                label: "load edge (timestamps.csv)".into(),
            });
        }
        while let Some(r) = smi.next_if(|r| r.time_us <= us) {
            w.event(&logger(r));
        }
        if let Some(&prev) = i.checked_sub(1).and_then(|p| t.get(p)) {
            if us - prev > 10.0 * median {
                w.event(&Event::Gap {
                    time_s: s(prev + median),
                    index: Some(i as u64),
                    samples: None,
                    duration_s: (us - prev - median) * 1e-6,
                    cause: format!("meter: no records for {:.1} ms", (us - prev) * 1e-3),
                });
            }
        }
        let rails: Vec<(f32, f32)> = pairs.iter().map(|&(v, a)| (v as f32, a as f32)).collect();
        w.sample(s(us), Some(i as u64), None, &rails, &[]);
        w.maybe_flush()?;
    }
    // Readings after the meter's last record are kept too (their times tell).
    for r in smi {
        w.event(&logger(r));
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_refused_and_a_real_run_is_not() {
        // Random bytes, a whole number of records: volts spread over 0-15.5 V.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let bytes: Vec<u8> = (0..18 * 5000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let t = parse_pmd(Path::new("PMD_data.bin"), &bytes, 0.0).unwrap();
        let e = check_plausible(Path::new("PMD_data.bin"), &t).unwrap_err();
        assert!(e.to_string().contains("off a 12 V rail"), "{e}");
        let run = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/gpu-power-benchmark/Transient_Response/A100_TR");
        if run.is_dir() {
            read_run(&run, 1.0).unwrap();
        }
    }

    /// Lines of `timestamps.csv` that parse as numbers but are no load edge of the run (a
    /// count, a negative, NaN, a time centuries off) are refused with the file and line.
    #[test]
    fn junk_load_edges_are_refused_with_file_and_line() {
        let run = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/gpu-power-benchmark/Transient_Response/A100_TR");
        if !run.is_dir() {
            eprintln!("SKIPPED: {} is not there", run.display());
            return;
        }
        let dir = std::env::temp_dir().join(format!("railtrace-pmd-junk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["PMD_data.bin", "PMD_start_ts.txt", "gpudata.csv"] {
            std::fs::copy(run.join(f), dir.join(f)).unwrap();
        }
        let real = std::fs::read_to_string(run.join("timestamps.csv")).unwrap();
        std::fs::write(dir.join("timestamps.csv"), &real).unwrap();
        read_run(&dir, 1.0).unwrap();
        for junk in ["1", "-5", "nan", "inf", "1e20", "abc"] {
            std::fs::write(dir.join("timestamps.csv"), format!("{real}{junk}\n")).unwrap();
            let e = read_run(&dir, 1.0).unwrap_err().to_string();
            let line = real.lines().count() + 1;
            assert!(
                e.contains(&format!("timestamps.csv:{line}: ")),
                "{junk}: {e}"
            );
        }
        for junk in ["0", "-1", "nan", "1e20"] {
            std::fs::write(dir.join("timestamps.csv"), &real).unwrap();
            std::fs::write(dir.join("PMD_start_ts.txt"), junk).unwrap();
            let e = read_run(&dir, 1.0).unwrap_err().to_string();
            assert!(e.contains("PMD_start_ts.txt:1: "), "{junk}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn civil_dates_and_local_times() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        // 2023-07-14 10:10:26.905 at UTC+1 is 09:10:26.905 UTC.
        let t = parse_time("2023/07/14 10:10:26.905", 1.0).unwrap();
        assert_eq!(t, 1_689_325_826_905_000.0);
    }

    #[test]
    fn pmd_records_decode_as_documented() {
        // Two records, the tick wrapping between them; pair 3 on the 7.5 mV scale; a
        // code with bit 11 set reads 0.
        let rec = |tick: u16, codes: [u16; 8]| {
            let mut b = tick.to_le_bytes().to_vec();
            for c in codes {
                b.extend((c << 4).to_le_bytes());
            }
            b
        };
        let mut bytes = rec(65_000, [1600, 100, 1600, 0, 1600, 0x0801, 1600, 10]);
        bytes.extend(rec(1_000 - 64, [0; 8]));
        let t = parse_pmd(Path::new("x"), &bytes, 1_000_000.0).unwrap();
        assert_eq!(t.time_us[0], 950_000.0);
        let dt = t.time_us[1] - t.time_us[0];
        assert!(
            (dt - 1_472.0 / PMD_TICKS_PER_MS * 1000.0).abs() < 1e-6,
            "{dt}"
        );
        let p = t.pairs[0];
        assert!(
            (p[0].0 - 1600.0 * 7.568e-3).abs() < 1e-9 && (p[0].1 - 100.0 * 48.8e-3).abs() < 1e-9
        );
        assert!((p[2].0 - 1600.0 * 7.5e-3).abs() < 1e-9 && p[2].1 == 0.0);
        assert!(parse_pmd(Path::new("x"), &bytes[..20], 0.0).is_err());
    }

    #[test]
    fn nvidia_smis_temperature_where_logged() {
        let text = "timestamp, power.draw [W], temperature.gpu\n\
                    2023/07/14 10:10:26.905, 61.25, 47\n\
                    2023/07/14 10:10:26.915, 62.00, [N/A]\n";
        let r = parse_smi(Path::new("gpudata.csv"), text, 0.0).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].power_draw_w, r[0].temperature_c), (61.25, Some(47.0)));
        assert_eq!(r[1].temperature_c, None);
        let text = "timestamp, power.draw [W]\n2023/07/14 10:10:26.905, 61.25\n";
        let r = parse_smi(Path::new("gpudata.csv"), text, 0.0).unwrap();
        assert_eq!(r[0].temperature_c, None);
    }
}
