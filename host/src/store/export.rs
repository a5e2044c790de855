//! A recording as Parquet or CSV (for pandas and polars), or as a Perfetto / Chrome
//! trace-event JSON trace (to lay over a profiler's timeline). `host/EXPORT.md`
//! documents the outputs.
//!
//! The output is written beside `OUT` (`run.partial.parquet` for `run.parquet`) and renamed
//! to `OUT` at the end, so an export that fails or is interrupted never leaves a half file
//! under the real name.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
#[cfg(feature = "parquet")]
use std::sync::Arc;

use arrow_array::{BooleanArray, RecordBatch, UInt8Array};
#[cfg(feature = "parquet")]
use parquet::{
    arrow::ArrowWriter, basic::Compression, file::metadata::KeyValue,
    file::properties::WriterProperties,
};

use crate::store::recording::{Kind, RecordingError, Rows, Source};

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Parquet, snappy-compressed, the recording's columns and metadata.
    Parquet,
    /// CSV with a header row of the recording's column names.
    Csv,
    /// Chrome trace-event JSON, as Perfetto UI and chrome://tracing open it.
    Perfetto,
}

impl Format {
    /// The extension of the default output file.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Csv => "csv",
            Format::Perfetto => "json",
        }
    }
}

/// How to export.
#[derive(Debug, Clone)]
pub struct Options {
    /// What to write.
    pub format: Format,
    /// Parquet and CSV: only rows of these kinds; every row when empty.
    pub kinds: Vec<Kind>,
    /// Perfetto: samples are averaged into bins this many µs wide (a bin never spans a
    /// gap row); 0 writes every sample.
    pub bin_us: u64,
    /// Perfetto: `ts` in µs since the Unix epoch rather than since the recording's
    /// `time_s = 0`.
    pub absolute_time: bool,
}

impl Options {
    /// Every row; for Perfetto, 100 µs bins and time relative to the recording.
    pub fn new(format: Format) -> Options {
        Options {
            format,
            kinds: Vec::new(),
            bin_us: 100,
            absolute_time: false,
        }
    }
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// The file written.
    pub path: PathBuf,
    /// Rows of the recording written (Parquet, CSV) or read (Perfetto).
    pub rows: u64,
    /// Perfetto: trace events written; 0 for the other formats.
    pub trace_events: u64,
    /// Size of the file.
    pub bytes: u64,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The recording could not be read to its end (the output is not written).
    #[error(transparent)]
    Read(#[from] RecordingError),
    /// The output is the recording itself.
    #[error("{path}: is the recording being exported; choose another output (-o)")]
    SameAsInput {
        /// The file.
        path: PathBuf,
    },
    /// The output could not be written.
    #[error("{path}: {error}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// What happened.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The default output: the recording's path with the format's extension.
pub fn default_output(recording: &Path, format: Format) -> PathBuf {
    recording.with_extension(format.extension())
}

pub use crate::store::partial_path;

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// Writes `rec` to `out` (whole or not at all, [`crate::store::through_partial`]; `out` is
/// replaced if it exists, unless it is the recording itself). The recording is read a record batch
/// at a time: a file opened with [`crate::store::recording::open`] is exported in bounded
/// memory, however long it is.
pub fn export(rec: &impl Source, out: &Path, opts: &Options) -> Result<Exported, ExportError> {
    let partial = partial_path(out);
    if same_file(out, rec.path()) || same_file(&partial, rec.path()) {
        return Err(ExportError::SameAsInput {
            path: out.to_path_buf(),
        });
    }
    let fail = |error: BoxError| ExportError::Write {
        path: out.to_path_buf(),
        error,
    };
    let written = crate::store::through_partial(out, |partial| -> Result<_, BoxError> {
        let file = crate::store::create_output(partial)?;
        let (rows, events, file) = match opts.format {
            Format::Parquet => write_parquet(rec, &opts.kinds, file),
            Format::Csv => write_csv(rec, &opts.kinds, file),
            Format::Perfetto => write_perfetto(rec, opts, file),
        }?;
        file.sync_all()?;
        Ok((rows, events))
    });
    let (rows, trace_events) = written.map_err(|e| match e.downcast::<RecordingError>() {
        Ok(e) => ExportError::Read(*e),
        Err(e) => fail(e),
    })?;
    let bytes = std::fs::metadata(out).map_err(|e| fail(e.into()))?.len();
    Ok(Exported {
        path: out.to_path_buf(),
        rows,
        trace_events,
        bytes,
    })
}

/// Calls `f` with every run of consecutive rows whose kind is in `kinds` (whole batches
/// when `kinds` is empty); returns the number of rows.
fn runs(
    rec: &impl Source,
    kinds: &[Kind],
    mut f: impl FnMut(&RecordBatch) -> Result<(), BoxError>,
) -> Result<u64, BoxError> {
    let mut rows = 0u64;
    for batch in rec.batches(None)? {
        let batch = &batch?;
        if kinds.is_empty() {
            f(batch)?;
            rows += batch.num_rows() as u64;
            continue;
        }
        let r = Rows::new(batch);
        let mut start = None;
        for i in 0..=r.len() {
            let keep = i < r.len() && kinds.contains(&r.kind(i));
            match (keep, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    f(&batch.slice(s, i - s))?;
                    rows += (i - s) as u64;
                    start = None;
                }
                _ => {}
            }
        }
    }
    Ok(rows)
}

type Written = (u64, u64, File);

#[cfg(not(feature = "parquet"))]
fn write_parquet(_: &impl Source, _: &[Kind], _: File) -> Result<Written, BoxError> {
    Err(
        "this build of railtrace writes no Parquet (it was built without its `parquet` feature)"
            .into(),
    )
}

#[cfg(feature = "parquet")]
fn write_parquet(rec: &impl Source, kinds: &[Kind], file: File) -> Result<Written, BoxError> {
    // The Arrow schema (with the per-field `unit` metadata and the schema's `railtrace`
    // key) travels in the file as `ARROW:schema`; the schema's keys are repeated as plain
    // Parquet key-value metadata for readers that do not decode that.
    let mut md = rec.schema().metadata().clone();
    md.insert("railtrace.export".to_string(), export_note(rec, kinds));
    let schema = Arc::new(rec.schema().as_ref().clone().with_metadata(md));
    let mut kv: Vec<KeyValue> = schema
        .metadata()
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    kv.sort_by(|a, b| a.key.cmp(&b.key));
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_key_value_metadata(Some(kv))
        .build();
    let mut w = ArrowWriter::try_new(BufWriter::new(file), schema, Some(props))?;
    let rows = runs(rec, kinds, |b| Ok(w.write(b)?))?;
    let file = w.into_inner()?.into_inner().map_err(|e| e.into_error())?;
    Ok((rows, 0, file))
}

#[cfg(feature = "parquet")]
/// JSON saying where the export came from and which kinds of rows it holds.
fn export_note(rec: &impl Source, kinds: &[Kind]) -> String {
    let all = kinds.is_empty();
    let names: Vec<&str> = Kind::TABLE
        .iter()
        .filter(|k| all || kinds.contains(k))
        .map(|k| k.name())
        .collect();
    serde_json::json!({
        "recording": rec.path().display().to_string(),
        "kinds": names,
    })
    .to_string()
}

fn write_csv(rec: &impl Source, kinds: &[Kind], file: File) -> Result<Written, BoxError> {
    let mut w = arrow_csv::WriterBuilder::new()
        .with_header(true)
        .build(BufWriter::new(file));
    // The header, even when no row is written.
    w.write(&RecordBatch::new_empty(rec.schema().clone()))?;
    let rows = runs(rec, kinds, |b| Ok(w.write(b)?))?;
    let file = w.into_inner().into_inner().map_err(|e| e.into_error())?;
    Ok((rows, 0, file))
}

/// A time in ns, written as µs with three decimals.
#[derive(Debug, Clone, Copy)]
struct Us(i64);

impl fmt::Display for Us {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let ns = self.0.unsigned_abs();
        write!(f, "{sign}{}.{:03}", ns / 1000, ns % 1000)
    }
}

/// The trace's one process; its counter tracks are the process's own.
const PID: u32 = 1;
/// Thread (track) of the gap slices.
const TID_GAPS: u32 = 2;
/// Thread (track) of the trigger edges' instant events.
const TID_EDGES: u32 = 3;
/// Thread (track) of the kernel executions' slices.
const TID_KERNELS: u32 = 4;
/// Thread (track) of the slices of line `n` is `TID_LINES + n`.
const TID_LINES: u32 = 100;

/// A trace being written: one event per line.
struct Trace<W: Write> {
    w: W,
    events: u64,
    /// Added to `time_s` in ns: 0, or the epoch for absolute time.
    origin_ns: i64,
    named: BTreeSet<u32>,
}

impl<W: Write> Trace<W> {
    fn ns(&self, time_s: f64) -> i64 {
        self.origin_ns.saturating_add((time_s * 1e9).round() as i64)
    }

    fn ts(&self, time_s: f64) -> Us {
        Us(self.ns(time_s))
    }

    /// Writes one event, `{` and `}` added.
    fn event(&mut self, body: fmt::Arguments<'_>) -> std::io::Result<()> {
        let sep = if self.events == 0 { "\n" } else { ",\n" };
        self.w.write_fmt(format_args!("{sep}{{{body}}}"))?;
        self.events += 1;
        Ok(())
    }

    /// Names a thread (track) the first time it is used, sorted by its id.
    fn thread(&mut self, tid: u32, name: &str) -> std::io::Result<()> {
        if self.named.insert(tid) {
            let name = json_str(name);
            self.event(format_args!(
                r#""ph":"M","pid":{PID},"tid":{tid},"name":"thread_name","args":{{"name":{name}}}"#
            ))?;
            self.event(format_args!(
                r#""ph":"M","pid":{PID},"tid":{tid},"name":"thread_sort_index","args":{{"sort_index":{tid}}}"#
            ))?;
        }
        Ok(())
    }

    /// A counter value: track `name` (already JSON), series `W`.
    fn counter(&mut self, name: &str, time_s: f64, watts: f64) -> std::io::Result<()> {
        self.counter_in(name, "W", time_s, watts)
    }

    /// A counter value: track `name` (already JSON), series `unit` (plain ASCII).
    fn counter_in(
        &mut self,
        name: &str,
        unit: &str,
        time_s: f64,
        value: f64,
    ) -> std::io::Result<()> {
        if !value.is_finite() {
            return Ok(());
        }
        let ts = self.ts(time_s);
        // The data are f32 (or readings that f32 holds to far better than they are
        // known): its shortest form is short.
        let v = value as f32;
        self.event(format_args!(
            r#""ph":"C","pid":{PID},"name":{name},"ts":{ts},"args":{{"{unit}":{v}}}"#
        ))
    }

    /// A complete slice from `t0` to `t1` on thread `tid`.
    fn slice(
        &mut self,
        tid: u32,
        name: &str,
        t0: f64,
        t1_ns: i64,
        args: &serde_json::Value,
    ) -> std::io::Result<()> {
        let (ts, name) = (self.ns(t0), json_str(name));
        let dur = Us(t1_ns.saturating_sub(ts).max(0));
        let ts = Us(ts);
        self.event(format_args!(
            r#""ph":"X","pid":{PID},"tid":{tid},"name":{name},"ts":{ts},"dur":{dur},"args":{args}"#
        ))
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// Samples averaged into one counter value per series.
#[derive(Debug)]
struct Bin {
    /// The bin (`ns / bin_ns`) of the samples in it, while it holds any.
    key: Option<i64>,
    /// Time of its first sample, s.
    t0: f64,
    sums: Vec<(f64, u32)>,
}

impl Bin {
    fn flush<W: Write>(&mut self, t: &mut Trace<W>, names: &[String]) -> std::io::Result<()> {
        if self.key.take().is_some() {
            for (name, s) in names.iter().zip(&mut self.sums) {
                if s.1 > 0 {
                    t.counter(name, self.t0, s.0 / f64::from(s.1))?;
                }
                *s = (0.0, 0);
            }
        }
        Ok(())
    }
}

fn line_name(line: u8) -> String {
    if line & 0x80 != 0 {
        format!("line {} (output)", line & 0x7f)
    } else {
        format!("line {line}")
    }
}

/// The columns the Perfetto trace is made of (the rails' watts are added).
const PERFETTO_COLUMNS: [&str; 14] = [
    "time_s",
    "kernel",
    "train",
    "index_in_train",
    "total_w",
    "text",
    "line",
    "rising",
    "duration_s",
    "count",
    "logger_w",
    "logger_instant_w",
    "logger_temp_c",
    "logger_average_w",
];

fn write_perfetto(rec: &impl Source, opts: &Options, file: File) -> Result<Written, BoxError> {
    let meta = rec.meta();
    let absolute = opts.absolute_time;
    let mut t = Trace {
        w: BufWriter::new(file),
        events: 0,
        origin_ns: if absolute { meta.epoch_utc_ns } else { 0 },
        named: BTreeSet::new(),
    };
    let other = serde_json::json!({
        "source": "railtrace export",
        "recording": rec.path().display().to_string(),
        "recording_source": meta.source,
        "epoch_utc": crate::store::recording::iso_utc(meta.epoch_utc_ns),
        "epoch_utc_ns": meta.epoch_utc_ns.to_string(),
        "ts": if absolute {
            "microseconds since the Unix epoch (UTC)"
        } else {
            "microseconds since epoch_utc (time_s = 0 of the recording)"
        },
        "rails": meta.rails.join(","),
        "bin_us": opts.bin_us.to_string(),
    });
    // Perfetto reads only the keys it knows, and displayTimeUnit only near the start.
    write!(
        t.w,
        r#"{{"displayTimeUnit":"ns","otherData":{other},"traceEvents":["#
    )?;
    let rig = json_str("railtrace rig");
    t.event(format_args!(
        r#""ph":"M","pid":{PID},"name":"process_name","args":{{"name":{rig}}}"#
    ))?;
    // Counter tracks: "<rail> W", "total W" in Perfetto (name, then the args key).
    let mut columns: Vec<String> = meta.rails.iter().map(|r| format!("{r}_w")).collect();
    columns.push("total_w".into());
    let mut names: Vec<String> = meta.rails.iter().map(|r| json_str(r)).collect();
    names.push(json_str("total"));
    let (logger, logger_instant) = (json_str("GPU logger"), json_str("GPU logger instant"));
    let logger_temp = json_str("GPU logger temperature");
    let logger_average = json_str("GPU logger average");
    let bin_ns = opts.bin_us.saturating_mul(1000) as i64;
    let mut bin = Bin {
        key: None,
        t0: 0.0,
        sums: vec![(0.0, 0); columns.len()],
    };
    // Per line: the open rising edge's time and slice name.
    let mut open: BTreeMap<u8, (f64, String)> = BTreeMap::new();
    let mut last_s = f64::NEG_INFINITY;
    let mut rows = 0u64;
    let wanted: Vec<&str> = PERFETTO_COLUMNS
        .into_iter()
        .chain(columns.iter().map(String::as_str))
        .collect();
    for batch in rec.batches(Some(&wanted))? {
        let batch = batch?;
        let r = Rows::new(&batch);
        rows += r.len() as u64;
        let time = r.f64("time_s");
        let cols: Vec<_> = columns.iter().map(|c| r.f32(c)).collect();
        let (text, line, rising) = (
            r.text(),
            r.column::<UInt8Array>("line"),
            r.column::<BooleanArray>("rising"),
        );
        for i in 0..r.len() {
            let ts = time.value(i);
            if ts.is_finite() {
                last_s = last_s.max(ts);
            }
            match r.kind(i) {
                Kind::Sample => {
                    let key = ((ts * 1e9).round() as i64).div_euclid(bin_ns.max(1));
                    if bin_ns == 0 || bin.key != Some(key) {
                        bin.flush(&mut t, &names)?;
                        bin.key = Some(key);
                        bin.t0 = ts;
                    }
                    for (s, c) in bin.sums.iter_mut().zip(&cols) {
                        if let Some(v) = Rows::get(c, i).filter(|v| v.is_finite()) {
                            s.0 += f64::from(v);
                            s.1 += 1;
                        }
                    }
                }
                Kind::Gap => {
                    bin.flush(&mut t, &names)?;
                    t.thread(TID_GAPS, "gaps")?;
                    let dur =
                        Rows::get(r.f64("duration_s"), i).filter(|d| d.is_finite() && *d >= 0.0);
                    let end = t.ns(ts) + (dur.unwrap_or(0.0) * 1e9).round() as i64;
                    let args = serde_json::json!({
                        "cause": text.value(i),
                        "samples": Rows::get(r.u64("count"), i),
                        "duration_s": dur,
                    });
                    t.slice(TID_GAPS, "gap", ts, end, &args)?;
                }
                Kind::Edge => {
                    let (n, up) = (line.value(i), rising.value(i));
                    let label = text.value(i);
                    let what = if label.is_empty() {
                        line_name(n)
                    } else {
                        label.to_string()
                    };
                    t.thread(TID_EDGES, "trigger edges")?;
                    let name =
                        json_str(&format!("{what} {}", if up { "rising" } else { "falling" }));
                    let args = serde_json::json!({
                        "line": n & 0x7f,
                        "output": n & 0x80 != 0,
                        "rising": up,
                        "count": Rows::get(r.u64("count"), i),
                        "label": label,
                    });
                    let at = t.ts(ts);
                    t.event(format_args!(
                        r#""ph":"i","s":"t","pid":{PID},"tid":{TID_EDGES},"name":{name},"ts":{at},"args":{args}"#
                    ))?;
                    if up {
                        open.entry(n).or_insert((ts, what));
                    } else if let Some((t0, what)) = open.remove(&n) {
                        let tid = TID_LINES + u32::from(n);
                        t.thread(tid, &line_name(n))?;
                        let end = t.ns(ts);
                        t.slice(
                            tid,
                            &what,
                            t0,
                            end,
                            &serde_json::json!({ "line": n & 0x7f }),
                        )?;
                    }
                }
                Kind::Execution if ts.is_finite() => {
                    t.thread(TID_KERNELS, "kernels")?;
                    let dur = Rows::get(r.f64("duration_s"), i).unwrap_or(0.0).max(0.0);
                    let end = t.ns(ts) + (dur * 1e9).round() as i64;
                    let train = r.u64("train");
                    let index = r.column::<arrow_array::UInt32Array>("index_in_train");
                    let args = serde_json::json!({
                        "train": Rows::get(train, i),
                        "index_in_train": Rows::get(index, i),
                    });
                    let kernel = r.column::<arrow_array::StringArray>("kernel");
                    t.slice(TID_KERNELS, kernel.value(i), ts, end, &args)?;
                }
                Kind::Logger => {
                    if let Some(w) = Rows::get(r.f64("logger_w"), i) {
                        t.counter(&logger, ts, w)?;
                    }
                    if let Some(w) = Rows::get(r.f64("logger_instant_w"), i) {
                        t.counter(&logger_instant, ts, w)?;
                    }
                    if let Some(w) = Rows::get(r.f64("logger_average_w"), i) {
                        t.counter(&logger_average, ts, w)?;
                    }
                    if let Some(c) = Rows::get(r.f64("logger_temp_c"), i) {
                        t.counter_in(&logger_temp, "degC", ts, c)?;
                    }
                }
                _ => {}
            }
        }
    }
    bin.flush(&mut t, &names)?;
    // A rising edge without its falling edge: a slice to the end of the recording.
    let end = t.ns(last_s.max(0.0));
    for (n, (t0, what)) in std::mem::take(&mut open) {
        let tid = TID_LINES + u32::from(n);
        t.thread(tid, &line_name(n))?;
        let args = serde_json::json!({ "line": n & 0x7f, "unfinished": true });
        t.slice(tid, &what, t0, end, &args)?;
    }
    t.w.write_all(b"\n]}\n")?;
    let file = t.w.into_inner().map_err(|e| e.into_error())?;
    Ok((rows, t.events, file))
}
