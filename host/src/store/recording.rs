//! The recording: one Arrow IPC *stream* file per capture or import, readable as it is by
//! pyarrow (`pyarrow.ipc.open_stream`) and polars (`pl.read_ipc_stream`).
//!
//! One table, one row per sample or event, told apart by the `kind` column. Sample rows
//! fill the measurement columns; event rows (gaps, trigger edges, time-sync exchanges,
//! the GPU's own logger readings, device status, device info, log lines) fill theirs and
//! leave the rest null. Gaps are rows of their own, never interpolated samples. The
//! schema's metadata key `railtrace` holds a JSON [`Meta`]: where the data came from, the
//! time origin, the device's info and calibration, the rig description.
//!
//! Recordings of older format versions ([`OLDEST_READABLE`] on) are read as if written by
//! this version: a column they lack is added to their schema and batches, all null (the
//! `logger_temp_c` of versions 2 and 3); [`Meta::version`] still says what the file is.
//!
//! The writer buffers rows and writes a whole record batch with one `write` at least once
//! a second ([`FLUSH_INTERVAL`]), so a capture killed at any moment leaves a stream that
//! readers open, holding everything up to the last flush. The stream's end marker is
//! written only by [`Writer::finish`]: [`Recording::finalised`] tells the two apart.
//! `host/RECORDING.md` documents the columns.

mod browse;
mod scan;
pub use browse::Browse;

use nix::fcntl::{Flock, FlockArg};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int16Builder, Int64Builder,
    Int8Builder, ListBuilder, StringBuilder, UInt64Builder, UInt8Builder,
};
use arrow_array::{
    Array, ArrayRef, DictionaryArray, Float32Array, Float64Array, Int8Array, RecordBatch,
    StringArray, UInt32Array, UInt64Array,
};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_ipc::CompressionType;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

/// The value of the metadata key `railtrace.format`.
pub const FORMAT: &str = "railtrace-recording";
/// The format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 7;

/// The oldest format version this railtrace reads. Version 3 lacks only the
/// `logger_temp_c` column ([`LOGGER_TEMP_SINCE`]), which reads as null; version 2 also
/// the `dvfs_request` kind.
pub const OLDEST_READABLE: u32 = 2;

/// The first format version with the `logger_temp_c` column.
pub const LOGGER_TEMP_SINCE: u32 = 4;
/// The first format version with the `logger_average_w` column (a logger's power
/// averaged over its longer window, where it reports one beside `logger_w`).
pub const LOGGER_AVERAGE_SINCE: u32 = 6;
/// The first format version with the `logger_energy_j` column (a logger's cumulative
/// energy counter, where it has one, as NVML's total energy consumption).
pub const LOGGER_ENERGY_SINCE: u32 = 7;
/// The first format version that may keep samples in `block` rows: one row per run of
/// consecutive samples, their raw codes in its `codes` list, turned into volts, amperes
/// and watts by [`Meta::derive`] when read. The reader gives out their sample rows.
pub const BLOCKS_SINCE: u32 = 5;
/// The `kind` of a block row (on disk only: readers give out its samples).
const BLOCK: &str = "block";
/// A summary row of the fine level covers at most this many samples (and never a gap or
/// a jump of the clock).
pub const SUMMARY_SAMPLES: u64 = 1024;
/// A summary row of the coarse level gathers at most this many of the fine level's.
pub const SUMMARY_LEVEL: u64 = 64;
/// The columns a block row fills, which expanding it needs.
const BLOCK_COLUMNS: [&str; 7] = [
    "time_s",
    "index",
    "tick",
    "count",
    "duration_s",
    "period_ticks",
    "codes",
];
/// A record batch is written at least this often.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// ... or when it has this many rows.
pub const BATCH_ROWS: usize = 65_536;

/// What a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A measurement: every rail's volts, amperes and watts, the total, the raw codes.
    Sample,
    /// Samples that are missing, with the cause in `text`.
    Gap,
    /// A trigger edge seen (or driven) by the rig, or a load edge of an import.
    Edge,
    /// One time-sync exchange: host send/receive times and the device's ticks.
    TimeSync,
    /// A reading of the GPU's own power logger.
    Logger,
    /// The device's counters (JSON in `text`).
    Status,
    /// The device's DeviceInfo (JSON in `text`), at every (re)connection.
    Info,
    /// A log line from the device or the host.
    Log,
    /// A kernel execution as the GPU recorded it (a profiling run).
    Execution,
    /// A read of the GPU's clock, bracketed by host clock reads.
    ClockRead,
    /// A trigger edge the host drove, bracketed by host clock reads.
    Driven,
    /// A DVFS level the host requested (its name in `text`), bracketed by host clock
    /// reads.
    DvfsRequest,
    /// The power over a stretch of samples: per rail and in total, the mean (in
    /// `<rail>_w`, `total_w`), the least and the most (`_w_min`, `_w_max`). Format 5 on;
    /// only in the recording's overview ([`overview`]): a reader's table leaves them out.
    Summary,
}

/// Number of kinds.
pub const KINDS: usize = 13;

impl Kind {
    /// The kinds of the table a reader gives out (every kind but [`Kind::Summary`]).
    pub const TABLE: [Kind; KINDS - 1] = [
        Kind::Sample,
        Kind::Gap,
        Kind::Edge,
        Kind::TimeSync,
        Kind::Logger,
        Kind::Status,
        Kind::Info,
        Kind::Log,
        Kind::Execution,
        Kind::ClockRead,
        Kind::Driven,
        Kind::DvfsRequest,
    ];

    /// Every kind, in the order of the `kind` column's dictionary.
    pub const ALL: [Kind; KINDS] = [
        Kind::Sample,
        Kind::Gap,
        Kind::Edge,
        Kind::TimeSync,
        Kind::Logger,
        Kind::Status,
        Kind::Info,
        Kind::Log,
        Kind::Execution,
        Kind::ClockRead,
        Kind::Driven,
        Kind::DvfsRequest,
        Kind::Summary,
    ];

    /// The name in the `kind` column.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sample => "sample",
            Kind::Gap => "gap",
            Kind::Edge => "edge",
            Kind::TimeSync => "time_sync",
            Kind::Logger => "logger",
            Kind::Status => "status",
            Kind::Info => "info",
            Kind::Log => "log",
            Kind::Execution => "execution",
            Kind::ClockRead => "clock_read",
            Kind::Driven => "driven",
            Kind::DvfsRequest => "dvfs_request",
            Kind::Summary => "summary",
        }
    }

    fn code(self) -> i8 {
        Kind::ALL.iter().position(|k| *k == self).unwrap_or(0) as i8
    }

    /// The kind of this name in the `kind` column.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The recording's metadata (the schema's `railtrace` key, as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Format version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// Where the data came from, e.g. `capture /dev/ttyACM0` or `import pmd DIR`.
    pub source: String,
    /// The instant `time_s = 0`, ns since the Unix epoch (UTC).
    pub epoch_utc_ns: i64,
    /// How `time_s` was made, for people.
    pub timebase: String,
    /// The rails, in column order: each has `<rail>_v`, `<rail>_a` and `<rail>_w`.
    pub rails: Vec<String>,
    /// The ADC channels that have a raw `code<N>` column.
    pub code_channels: Vec<u8>,
    /// The device's DeviceInfo at the start (channels, calibration, clock), if any.
    #[serde(default)]
    pub device: Option<serde_json::Value>,
    /// The rig description (TOML text), if one was given.
    #[serde(default)]
    pub rig: Option<String>,
    /// The acquisition settings (rate, channels, averaging), if any.
    #[serde(default)]
    pub settings: Option<serde_json::Value>,
    /// How the codes of `block` rows become volts and amperes (format 5 on; a recording
    /// without it has no block rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derive: Option<Derive>,
}

impl Meta {
    /// The metadata of a recording of this format version from `source` with `rails`,
    /// nothing else known (no device, rig, settings, raw codes or block rows).
    pub fn new(source: &str, rails: &[&str]) -> Meta {
        Meta {
            version: FORMAT_VERSION,
            source: source.into(),
            epoch_utc_ns: 0,
            timebase: String::new(),
            rails: rails.iter().map(|r| r.to_string()).collect(),
            code_channels: vec![],
            device: None,
            rig: None,
            settings: None,
            derive: None,
        }
    }
}

/// How a block row's codes become each sample's volts, amperes and watts: what the
/// capture did to every sample before format 5, done by the reader instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Derive {
    /// The device's clock, ticks per second: sample `k` of a block is at
    /// `time_s + k × period_ticks / tick_hz`.
    pub tick_hz: f64,
    /// The ADC channels of each sample's codes, in order (the device's slot order).
    pub channels: Vec<u8>,
    /// Per channel of `channels`: units per code and offset (value = code × scale +
    /// offset, in f32 as the capture computes it).
    pub cal: Vec<(f32, f32)>,
    /// Per rail of [`Meta::rails`]: the positions in `channels` of its voltage and its
    /// current (none where the rig does not measure it: that value is null).
    pub rails: Vec<(Option<usize>, Option<usize>)>,
}

/// A sample's total power from its rails' (volts, amperes): see [`total_w`].
fn total_of(rails: impl Iterator<Item = (f32, f32)>) -> f32 {
    total_w(rails.map(|(v, a)| v * a))
}

/// A sample's total power from its rails' watts: the sum of the finite ones, in f32 in
/// rail order, as every sample row's `total_w` is made (and the live view and the meter
/// take it).
pub fn total_w(rails_w: impl Iterator<Item = f32>) -> f32 {
    rails_w.filter(|w| w.is_finite()).fold(0.0f32, |t, w| t + w)
}

impl Derive {
    /// Whether it fits a recording with these rails.
    fn fits(&self, rails: usize) -> bool {
        let n = self.channels.len();
        self.tick_hz.is_finite()
            && self.tick_hz > 0.0
            && n > 0
            && self.cal.len() == n
            && self.rails.len() == rails
            && self
                .rails
                .iter()
                .all(|&(v, a)| v.is_none_or(|v| v < n) && a.is_none_or(|a| a < n))
    }

    /// A block's codes (`channels.len()` a sample) as per-rail watts, sample by sample
    /// (NaN where a rail's voltage or current is not measured).
    pub fn watts(&self, codes: &[i16]) -> Vec<f32> {
        let n = self.channels.len();
        let mut vi = vec![(f32::NAN, f32::NAN); self.rails.len()];
        let mut out = Vec::with_capacity(codes.len() / n.max(1) * self.rails.len());
        for row in codes.chunks_exact(n.max(1)) {
            self.values(row, &mut vi);
            out.extend(vi.iter().map(|(v, a)| v * a));
        }
        out
    }

    /// Sample `row` of codes as per-rail (volts, amperes), NaN where not measured.
    fn values(&self, row: &[i16], out: &mut [(f32, f32)]) {
        let at = |p: Option<usize>| {
            p.map_or(f32::NAN, |p| {
                let (scale, offset) = self.cal[p];
                f32::from(row[p]) * scale + offset
            })
        };
        for (o, &(v, a)) in out.iter_mut().zip(&self.rails) {
            *o = (at(v), at(a));
        }
    }
}

/// Why a recording cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// The file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What happened.
        error: std::io::Error,
    },
    /// Not an Arrow IPC stream.
    #[error("{path}: not a railtrace recording ({why})")]
    Foreign {
        /// The file.
        path: PathBuf,
        /// What it looks like instead.
        why: String,
    },
    /// A recording of another format version.
    #[error("{path}: recording format version {found}; this railtrace reads versions {oldest} to {supported}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The file's version.
        found: u32,
        /// The oldest we read.
        oldest: u32,
        /// Ours.
        supported: u32,
    },
    /// The output exists and replacing it was not asked for.
    #[error("{path}: already exists; give --force to replace it, or another output")]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// Another program (or another railtrace) is writing the output.
    #[error("{path}: another program is writing it (it holds the file's lock)")]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// Arrow refused to encode.
    #[error("{path}: {error}")]
    Arrow {
        /// The file.
        path: PathBuf,
        /// Arrow's words.
        error: ArrowError,
    },
}

/// Which of a logger's readings: a column of the recording's logger rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum LoggerColumn {
    /// `logger_w`: the power the logger reports (nvidia-smi's `power.draw`).
    #[default]
    #[serde(rename = "logger_w")]
    Power,
    /// `logger_instant_w`: its instantaneous power (`power.draw.instant`).
    #[serde(rename = "logger_instant_w")]
    Instant,
    /// `logger_average_w`: its power averaged over a longer window (`power.draw.average`).
    #[serde(rename = "logger_average_w")]
    Average,
}

impl LoggerColumn {
    /// Every column, in the recording's order.
    pub const ALL: [LoggerColumn; 3] = [Self::Power, Self::Instant, Self::Average];

    /// The recording's column.
    pub fn column(self) -> &'static str {
        match self {
            Self::Power => "logger_w",
            Self::Instant => "logger_instant_w",
            Self::Average => "logger_average_w",
        }
    }

    /// nvidia-smi's name of the same reading.
    pub fn smi_name(self) -> &'static str {
        match self {
            Self::Power => "power.draw",
            Self::Instant => "power.draw.instant",
            Self::Average => "power.draw.average",
        }
    }
}

impl std::fmt::Display for LoggerColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.smi_name(), self.column())
    }
}

impl std::str::FromStr for LoggerColumn {
    type Err = String;

    /// nvidia-smi's name or the recording's (`power.draw.instant` or `logger_instant_w`).
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| s == c.smi_name() || s == c.column())
            .ok_or_else(|| {
                let names: Vec<String> = Self::ALL.iter().map(ToString::to_string).collect();
                format!("{s:?} is not a logger column; one of {}", names.join(", "))
            })
    }
}

fn unit_field(name: &str, data_type: DataType, unit: &str) -> Field {
    let f = Field::new(name, data_type, true);
    if unit.is_empty() {
        f
    } else {
        f.with_metadata(HashMap::from([("unit".to_string(), unit.to_string())]))
    }
}

/// The schema of a recording with these rails and code channels, of format version
/// `meta.version` (before [`LOGGER_TEMP_SINCE`], without `logger_temp_c`; before
/// [`BLOCKS_SINCE`], without the columns of block and summary rows), as it is on disk.
pub fn schema(meta: &Meta) -> Schema {
    let v5 = meta.version >= BLOCKS_SINCE;
    columns(meta, v5, v5)
}

/// The schema of the table a reader gives out: the one on disk without the columns of
/// block rows (it expands them into sample rows) and of summary rows (it leaves them out).
pub fn table_schema(meta: &Meta) -> Schema {
    columns(meta, false, false)
}

/// The schema of a recording's overview ([`overview`]): the table's and the summaries'.
pub fn overview_schema(meta: &Meta) -> Schema {
    columns(meta, false, true)
}

/// The least and most watts of a summary row: `<rail>_w_min`, `<rail>_w_max` per rail,
/// then `total_w_min`, `total_w_max`.
fn extreme_columns(meta: &Meta) -> Vec<String> {
    meta.rails
        .iter()
        .map(String::as_str)
        .chain(["total"])
        .flat_map(|r| [format!("{r}_w_min"), format!("{r}_w_max")])
        .collect()
}

fn columns(meta: &Meta, blocks: bool, summaries: bool) -> Schema {
    use DataType as D;
    let mut fields = vec![
        Field::new(
            "kind",
            D::Dictionary(Box::new(D::Int8), Box::new(D::Utf8)),
            false,
        ),
        unit_field("time_s", D::Float64, "s"),
        unit_field("index", D::UInt64, ""),
        unit_field("tick", D::UInt64, "tick"),
    ];
    for r in &meta.rails {
        fields.push(unit_field(&format!("{r}_v"), D::Float32, "V"));
        fields.push(unit_field(&format!("{r}_a"), D::Float32, "A"));
        fields.push(unit_field(&format!("{r}_w"), D::Float32, "W"));
    }
    fields.push(unit_field("total_w", D::Float32, "W"));
    for c in &meta.code_channels {
        fields.push(unit_field(&format!("code{c}"), D::Int16, "code"));
    }
    fields.extend([
        unit_field("line", D::UInt8, ""),
        unit_field("rising", D::Boolean, ""),
        unit_field("count", D::UInt64, ""),
        unit_field("duration_s", D::Float64, "s"),
        unit_field("host_send_ns", D::Int64, "ns"),
        unit_field("host_recv_ns", D::Int64, "ns"),
        unit_field("tx_tick", D::UInt64, "tick"),
        unit_field("logger_w", D::Float64, "W"),
        unit_field("logger_instant_w", D::Float64, "W"),
    ]);
    if meta.version >= LOGGER_TEMP_SINCE {
        fields.push(unit_field("logger_temp_c", D::Float64, "degC"));
    }
    if meta.version >= LOGGER_AVERAGE_SINCE {
        fields.push(unit_field("logger_average_w", D::Float64, "W"));
    }
    if meta.version >= LOGGER_ENERGY_SINCE {
        fields.push(unit_field("logger_energy_j", D::Float64, "J"));
    }
    fields.extend([
        unit_field("text", D::Utf8, ""),
        unit_field("gpu_ticks", D::UInt64, "gpu tick"),
        unit_field("gpu_end_ticks", D::UInt64, "gpu tick"),
        unit_field("train", D::UInt64, ""),
        unit_field("index_in_train", D::UInt32, ""),
        unit_field("kernel", D::Utf8, ""),
        unit_field("own_s", D::Float64, "s"),
    ]);
    if blocks {
        fields.extend([
            unit_field("period_ticks", D::UInt32, "tick"),
            unit_field(
                "codes",
                D::List(Arc::new(Field::new_list_field(D::Int16, false))),
                "code",
            ),
        ]);
    }
    if summaries {
        for name in extreme_columns(meta) {
            fields.push(unit_field(&name, D::Float32, "W"));
        }
    }
    let json = serde_json::to_string(meta).unwrap_or_default();
    Schema::new(fields).with_metadata(HashMap::from([
        ("railtrace.format".to_string(), FORMAT.to_string()),
        ("railtrace".to_string(), json),
    ]))
}

/// An event row.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Missing samples.
    Gap {
        /// Time of the first missing sample, s.
        time_s: f64,
        /// Index of the first missing sample, where known.
        index: Option<u64>,
        /// How many samples are missing, where known.
        samples: Option<u64>,
        /// How long the gap lasts, s.
        duration_s: f64,
        /// Why.
        cause: String,
    },
    /// A trigger or load edge.
    Edge {
        /// When, s.
        time_s: f64,
        /// The device's tick, where there is one.
        tick: Option<u64>,
        /// The sample whose period holds the edge, where known.
        index: Option<u64>,
        /// Line number (bit 7 set: an output the rig drove).
        line: u8,
        /// Rising or falling.
        rising: bool,
        /// Edges on this line so far, this one included, where known.
        count: Option<u64>,
        /// What the line is, for people.
        label: String,
    },
    /// A time-sync exchange.
    TimeSync {
        /// The reply's transmit time on the recording's timeline, s.
        time_s: f64,
        /// Host time of the request, ns since the Unix epoch.
        host_send_ns: i64,
        /// Host time the reply was read, ns since the Unix epoch.
        host_recv_ns: i64,
        /// Device tick when the request arrived.
        rx_tick: u64,
        /// Device tick when the reply left.
        tx_tick: u64,
    },
    /// A reading of the GPU's own logger.
    Logger {
        /// When the reading was taken, s.
        time_s: f64,
        /// The reported (averaged) power, W.
        power_w: f64,
        /// The instantaneous power, W, where the logger reports one.
        instant_w: Option<f64>,
        /// The power averaged over a longer window, W, where the logger reports one
        /// beside `power_w` (nvidia-smi's `power.draw.average`).
        average_w: Option<f64>,
        /// The GPU's temperature the logger reported with the reading, °C, where it
        /// reports one.
        temperature_c: Option<f64>,
        /// The GPU's cumulative energy counter, J, read when the host got the reading
        /// (`polled_ns`, else its host timestamp), where the logger has one.
        energy_j: Option<f64>,
        /// Where the reading came from (e.g. `nvml-samples`), where the logger says;
        /// kept in the row's `text`.
        source: Option<String>,
        /// Its timestamp on the GPU's clock, where it has one.
        gpu_ticks: Option<u64>,
        /// Its timestamp on the host's clock (ns since the Unix epoch), where it has one.
        host_ns: Option<i64>,
        /// Its timestamp on the logger's own clock, s, where it has one (then `host_ns`
        /// is None and `polled_ns` tells when the host got it).
        own_s: Option<f64>,
        /// When the host got the reading, ns since the Unix epoch.
        polled_ns: Option<i64>,
    },
    /// A kernel execution (profiling runs).
    Execution {
        /// Its start on the recording's timeline, s (NaN until aligned).
        time_s: f64,
        /// The kernel.
        kernel: String,
        /// Train number.
        train: u64,
        /// Position in the train, 0-based.
        index_in_train: u32,
        /// Start, GPU clock ticks.
        start_ticks: u64,
        /// End, GPU clock ticks.
        end_ticks: u64,
        /// Duration by the GPU's nominal clock rate, s.
        duration_s: f64,
    },
    /// A read of the GPU's clock.
    ClockRead {
        /// When, on the recording's timeline, s (the brackets' midpoint).
        time_s: f64,
        /// Host time before the read, ns since the Unix epoch.
        host_before_ns: i64,
        /// Host time after it, ns since the Unix epoch.
        host_after_ns: i64,
        /// The GPU clock's value.
        gpu_ticks: u64,
    },
    /// A trigger edge the host drove.
    Driven {
        /// When, on the recording's timeline, s (the brackets' midpoint).
        time_s: f64,
        /// The line (of the rig's inputs).
        line: u8,
        /// Rising or falling.
        rising: bool,
        /// Host time before setting the line, ns since the Unix epoch.
        host_before_ns: i64,
        /// Host time after, ns since the Unix epoch.
        host_after_ns: i64,
    },
    /// A DVFS level the host asked for.
    DvfsRequest {
        /// When, on the recording's timeline, s (the brackets' midpoint).
        time_s: f64,
        /// The level's name.
        level: String,
        /// Host time before the request, ns since the Unix epoch.
        host_before_ns: i64,
        /// Host time after, ns since the Unix epoch.
        host_after_ns: i64,
    },
    /// Status, info or log text.
    Text {
        /// [`Kind::Status`], [`Kind::Info`] or [`Kind::Log`].
        kind: Kind,
        /// When, s.
        time_s: f64,
        /// The text (JSON for status and info).
        text: String,
    },
}

/// A column builder that can be brought to a row with nulls.
trait Pad {
    /// Appends nulls until the column has `row` values; returns it for the next append.
    fn at(&mut self, row: usize) -> &mut Self;
}

fn grow<B: ArrayBuilder>(b: &mut B, row: usize, nulls: impl FnOnce(&mut B, usize)) -> &mut B {
    let len = b.len();
    if len < row {
        nulls(b, row - len);
    }
    b
}

impl<T: arrow_array::ArrowPrimitiveType> Pad for arrow_array::builder::PrimitiveBuilder<T> {
    fn at(&mut self, row: usize) -> &mut Self {
        grow(self, row, Self::append_nulls)
    }
}

impl Pad for BooleanBuilder {
    fn at(&mut self, row: usize) -> &mut Self {
        grow(self, row, Self::append_nulls)
    }
}

impl Pad for StringBuilder {
    fn at(&mut self, row: usize) -> &mut Self {
        grow(self, row, Self::append_nulls)
    }
}

impl Pad for ListBuilder<Int16Builder> {
    fn at(&mut self, row: usize) -> &mut Self {
        grow(self, row, Self::append_nulls)
    }
}

#[derive(Debug)]
struct Columns {
    kind: Int8Builder,
    time_s: Float64Builder,
    index: UInt64Builder,
    tick: UInt64Builder,
    rails: Vec<[Float32Builder; 3]>,
    total_w: Float32Builder,
    codes: Vec<Int16Builder>,
    line: UInt8Builder,
    rising: BooleanBuilder,
    count: UInt64Builder,
    duration_s: Float64Builder,
    host_send_ns: Int64Builder,
    host_recv_ns: Int64Builder,
    tx_tick: UInt64Builder,
    logger_w: Float64Builder,
    logger_instant_w: Float64Builder,
    logger_temp_c: Float64Builder,
    logger_average_w: Float64Builder,
    logger_energy_j: Float64Builder,
    text: StringBuilder,
    gpu_ticks: UInt64Builder,
    gpu_end_ticks: UInt64Builder,
    train: UInt64Builder,
    index_in_train: arrow_array::builder::UInt32Builder,
    kernel: StringBuilder,
    own_s: Float64Builder,
    period_ticks: arrow_array::builder::UInt32Builder,
    /// Each block row's codes, sample after sample.
    block_codes: ListBuilder<Int16Builder>,
    /// A summary row's least and most watts: per rail, then the total.
    extremes: Vec<[Float32Builder; 2]>,
}

impl Columns {
    fn new(rails: usize, codes: usize) -> Columns {
        Columns {
            kind: Int8Builder::new(),
            time_s: Float64Builder::new(),
            index: UInt64Builder::new(),
            tick: UInt64Builder::new(),
            rails: (0..rails).map(|_| Default::default()).collect(),
            total_w: Float32Builder::new(),
            codes: (0..codes).map(|_| Int16Builder::new()).collect(),
            line: UInt8Builder::new(),
            rising: BooleanBuilder::new(),
            count: UInt64Builder::new(),
            duration_s: Float64Builder::new(),
            host_send_ns: Int64Builder::new(),
            host_recv_ns: Int64Builder::new(),
            tx_tick: UInt64Builder::new(),
            logger_w: Float64Builder::new(),
            logger_instant_w: Float64Builder::new(),
            logger_temp_c: Float64Builder::new(),
            logger_average_w: Float64Builder::new(),
            logger_energy_j: Float64Builder::new(),
            text: StringBuilder::new(),
            gpu_ticks: UInt64Builder::new(),
            gpu_end_ticks: UInt64Builder::new(),
            train: UInt64Builder::new(),
            index_in_train: arrow_array::builder::UInt32Builder::new(),
            kernel: StringBuilder::new(),
            own_s: Float64Builder::new(),
            period_ticks: arrow_array::builder::UInt32Builder::new(),
            block_codes: ListBuilder::new(Int16Builder::new())
                .with_field(Arc::new(Field::new_list_field(DataType::Int16, false))),
            extremes: (0..=rails).map(|_| Default::default()).collect(),
        }
    }

    /// Starts a row and returns its number. A column the row fills is brought to that
    /// number first with [`Pad::at`]; the ones it leaves get their nulls in bulk, later.
    fn begin(&mut self, kind: Kind, time_s: f64) -> usize {
        let row = self.kind.len();
        self.kind.append_value(kind.code());
        self.time_s.append_value(time_s);
        row
    }

    /// Adds an event row.
    fn event(&mut self, e: &Event) {
        let c = self;
        match e {
            Event::Gap {
                time_s,
                index,
                samples,
                duration_s,
                cause,
            } => {
                let r = c.begin(Kind::Gap, *time_s);
                c.index.at(r).append_option(*index);
                c.count.at(r).append_option(*samples);
                c.duration_s.at(r).append_value(*duration_s);
                c.text.at(r).append_value(cause);
            }
            Event::Edge {
                time_s,
                tick,
                index,
                line,
                rising,
                count,
                label,
            } => {
                let r = c.begin(Kind::Edge, *time_s);
                c.index.at(r).append_option(*index);
                c.tick.at(r).append_option(*tick);
                c.line.at(r).append_value(*line);
                c.rising.at(r).append_value(*rising);
                c.count.at(r).append_option(*count);
                c.text.at(r).append_value(label);
            }
            Event::TimeSync {
                time_s,
                host_send_ns,
                host_recv_ns,
                rx_tick,
                tx_tick,
            } => {
                let r = c.begin(Kind::TimeSync, *time_s);
                c.tick.at(r).append_value(*rx_tick);
                c.tx_tick.at(r).append_value(*tx_tick);
                c.host_send_ns.at(r).append_value(*host_send_ns);
                c.host_recv_ns.at(r).append_value(*host_recv_ns);
            }
            Event::Logger {
                time_s,
                power_w,
                instant_w,
                average_w,
                temperature_c,
                energy_j,
                source,
                gpu_ticks,
                host_ns,
                own_s,
                polled_ns,
            } => {
                let r = c.begin(Kind::Logger, *time_s);
                c.logger_w.at(r).append_value(*power_w);
                c.logger_instant_w.at(r).append_option(*instant_w);
                c.logger_temp_c.at(r).append_option(*temperature_c);
                c.logger_average_w.at(r).append_option(*average_w);
                c.logger_energy_j.at(r).append_option(*energy_j);
                c.text.at(r).append_option(source.as_deref());
                c.gpu_ticks.at(r).append_option(*gpu_ticks);
                c.host_recv_ns.at(r).append_option(*host_ns);
                c.own_s.at(r).append_option(*own_s);
                c.host_send_ns.at(r).append_option(*polled_ns);
            }
            Event::Execution {
                time_s,
                kernel,
                train,
                index_in_train,
                start_ticks,
                end_ticks,
                duration_s,
            } => {
                let r = c.begin(Kind::Execution, *time_s);
                c.kernel.at(r).append_value(kernel);
                c.train.at(r).append_value(*train);
                c.index_in_train.at(r).append_value(*index_in_train);
                c.gpu_ticks.at(r).append_value(*start_ticks);
                c.gpu_end_ticks.at(r).append_value(*end_ticks);
                c.duration_s.at(r).append_value(*duration_s);
            }
            Event::ClockRead {
                time_s,
                host_before_ns,
                host_after_ns,
                gpu_ticks,
            } => {
                let r = c.begin(Kind::ClockRead, *time_s);
                c.host_send_ns.at(r).append_value(*host_before_ns);
                c.host_recv_ns.at(r).append_value(*host_after_ns);
                c.gpu_ticks.at(r).append_value(*gpu_ticks);
            }
            Event::Driven {
                time_s,
                line,
                rising,
                host_before_ns,
                host_after_ns,
            } => {
                let r = c.begin(Kind::Driven, *time_s);
                c.line.at(r).append_value(*line);
                c.rising.at(r).append_value(*rising);
                c.host_send_ns.at(r).append_value(*host_before_ns);
                c.host_recv_ns.at(r).append_value(*host_after_ns);
            }
            Event::DvfsRequest {
                time_s,
                level,
                host_before_ns,
                host_after_ns,
            } => {
                let r = c.begin(Kind::DvfsRequest, *time_s);
                c.text.at(r).append_value(level);
                c.host_send_ns.at(r).append_value(*host_before_ns);
                c.host_recv_ns.at(r).append_value(*host_after_ns);
            }
            Event::Text { kind, time_s, text } => {
                let r = c.begin(*kind, *time_s);
                c.text.at(r).append_value(text);
            }
        }
    }

    /// Pads every column to the row count with nulls.
    fn pad_all(&mut self) {
        let n = self.kind.len();
        self.index.at(n);
        self.tick.at(n);
        for r in &mut self.rails {
            for b in r {
                b.at(n);
            }
        }
        self.total_w.at(n);
        for b in &mut self.codes {
            b.at(n);
        }
        self.line.at(n);
        self.rising.at(n);
        self.count.at(n);
        self.duration_s.at(n);
        self.host_send_ns.at(n);
        self.host_recv_ns.at(n);
        self.tx_tick.at(n);
        self.logger_w.at(n);
        self.logger_instant_w.at(n);
        self.logger_temp_c.at(n);
        self.logger_average_w.at(n);
        self.logger_energy_j.at(n);
        self.text.at(n);
        self.gpu_ticks.at(n);
        self.gpu_end_ticks.at(n);
        self.train.at(n);
        self.index_in_train.at(n);
        self.kernel.at(n);
        self.own_s.at(n);
        self.period_ticks.at(n);
        self.block_codes.at(n);
        for b in self.extremes.iter_mut().flatten() {
            b.at(n);
        }
    }

    fn finish(&mut self, kinds: &ArrayRef) -> Result<Vec<ArrayRef>, ArrowError> {
        self.pad_all();
        let keys = self.kind.finish();
        let mut out: Vec<ArrayRef> = vec![
            Arc::new(DictionaryArray::try_new(keys, kinds.clone())?),
            Arc::new(self.time_s.finish()),
            Arc::new(self.index.finish()),
            Arc::new(self.tick.finish()),
        ];
        for r in &mut self.rails {
            for b in r {
                out.push(Arc::new(b.finish()));
            }
        }
        out.push(Arc::new(self.total_w.finish()));
        for b in &mut self.codes {
            out.push(Arc::new(b.finish()));
        }
        out.extend::<[ArrayRef; 13]>([
            Arc::new(self.line.finish()),
            Arc::new(self.rising.finish()),
            Arc::new(self.count.finish()),
            Arc::new(self.duration_s.finish()),
            Arc::new(self.host_send_ns.finish()),
            Arc::new(self.host_recv_ns.finish()),
            Arc::new(self.tx_tick.finish()),
            Arc::new(self.logger_w.finish()),
            Arc::new(self.logger_instant_w.finish()),
            Arc::new(self.logger_temp_c.finish()),
            Arc::new(self.logger_average_w.finish()),
            Arc::new(self.logger_energy_j.finish()),
            Arc::new(self.text.finish()),
        ]);
        out.extend::<[ArrayRef; 8]>([
            Arc::new(self.gpu_ticks.finish()),
            Arc::new(self.gpu_end_ticks.finish()),
            Arc::new(self.train.finish()),
            Arc::new(self.index_in_train.finish()),
            Arc::new(self.kernel.finish()),
            Arc::new(self.own_s.finish()),
            Arc::new(self.period_ticks.finish()),
            Arc::new(self.block_codes.finish()),
        ]);
        for b in self.extremes.iter_mut().flatten() {
            out.push(Arc::new(b.finish()));
        }
        Ok(out)
    }
}

/// An output file taken for writing: opened, and locked against every other writer that
/// locks it (every railtrace command does) for as long as it is held. An existing file
/// is only emptied once the writer starts, so a run that fails before it leaves the file
/// as it was; a file the claim created is removed again by [`Claim::abandon`].
#[derive(Debug)]
pub struct Claim {
    path: PathBuf,
    file: Flock<File>,
    created: bool,
}

impl Claim {
    /// Takes `path` for writing: refused if it exists (unless `replace`), if another
    /// program holds its lock, or if it cannot be written (its folder missing, no
    /// permission), so that all of that is found before a device starts.
    pub fn new(path: &Path, replace: bool) -> Result<Claim, RecordingError> {
        let io = |error| RecordingError::Io {
            path: path.to_path_buf(),
            error,
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true);
        // A new file is never made through a link (O_EXCL); an existing one is not
        // opened through one either (see `store::refuse_link`).
        let (file, created) = match options.clone().create_new(true).open(path) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                crate::store::refuse_link(path).map_err(io)?;
                if !replace {
                    return Err(RecordingError::Exists {
                        path: path.to_path_buf(),
                    });
                }
                (
                    crate::store::open_no_link(&mut options, path).map_err(io)?,
                    false,
                )
            }
            Err(e) => return Err(io(e)),
        };
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(f) => f,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                if created {
                    let _ = std::fs::remove_file(path);
                }
                return Err(RecordingError::Locked {
                    path: path.to_path_buf(),
                });
            }
            Err((_, e)) => return Err(io(e.into())),
        };
        Ok(Claim {
            path: path.to_path_buf(),
            file,
            created,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives the file up unwritten: removed if this claim created it, else left as it was.
    pub fn abandon(self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Refuses an output that exists (unless `replace`), that another program is writing,
/// or that cannot be written, leaving it as it was: for a command to check what it will
/// write before it starts a device or a long run.
pub fn check_output(path: &Path, replace: bool) -> Result<(), RecordingError> {
    Claim::new(path, replace).map(Claim::abandon)
}

/// Writes a recording.
pub struct Writer {
    path: PathBuf,
    file: Flock<File>,
    /// The stream's messages as written, each sealed with its CRC-32C (RECORDING.md).
    sealed: Vec<u8>,
    schema: SchemaRef,
    ipc: StreamWriter<Vec<u8>>,
    kinds: ArrayRef,
    cols: Columns,
    /// The block row being filled, if the last row is one.
    open: Option<OpenBlock>,
    /// Channels per sample of a block ([`Meta::derive`]), 0 without it.
    block_channels: usize,
    /// Samples in the buffered block rows beyond one row each.
    block_extra: usize,
    /// How block rows become watts, for their summaries.
    derive: Option<Derive>,
    /// The summaries being gathered: the fine level's, and the coarse level's of those.
    summary: Summary,
    coarse: Summary,
    /// The overview written at the end, the fine level's summaries then the coarse's, and the gaps, edges and logger
    overview: [Columns; 2],
    last_flush: Instant,
    rows_written: u64,
    bytes_written: u64,
}

/// The power over a stretch of samples, gathered sample by sample: per rail and the
/// total, the least, the most, the sum and how many.
#[derive(Debug, Default)]
struct Summary {
    first_s: f64,
    last_s: f64,
    samples: u64,
    /// The next sample's index and time, where the samples come in runs (blocks).
    next: Option<(u64, f64)>,
    min: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f64>,
    n: Vec<u64>,
    /// Summaries merged into it (the coarse level).
    parts: u64,
}

impl Summary {
    /// Adds a finer summary's samples.
    fn merge(&mut self, f: &Summary) {
        if self.samples == 0 {
            self.first_s = f.first_s;
        }
        self.last_s = f.last_s;
        self.samples += f.samples;
        self.parts += 1;
        for i in 0..self.min.len() {
            self.min[i] = self.min[i].min(f.min[i]);
            self.max[i] = self.max[i].max(f.max[i]);
            self.sum[i] += f.sum[i];
            self.n[i] += f.n[i];
        }
    }

    fn new(series: usize) -> Summary {
        Summary {
            min: vec![f32::INFINITY; series],
            max: vec![f32::NEG_INFINITY; series],
            sum: vec![0.0; series],
            n: vec![0; series],
            ..Default::default()
        }
    }

    /// Adds a sample at `t`: per rail (volts, amperes), watts and the total as a sample
    /// row has them.
    fn add(&mut self, t: f64, rails: &[(f32, f32)]) {
        if self.samples == 0 {
            self.first_s = t;
        }
        self.last_s = t;
        self.samples += 1;
        let mut total = 0.0f32;
        let last = self.min.len() - 1;
        for (i, &(v, a)) in rails.iter().enumerate() {
            let w = v * a;
            if w.is_finite() {
                total += w;
                self.put(i, w);
            }
        }
        self.put(last, total);
    }

    /// Adds a block's samples `rows` (codes, [`Derive::channels`] a sample) as [`add`]
    /// would one by one, sample `j` of them at `time_s + (k + j) × period_s`; returns how
    /// many. Each rail's watts are `values`' volts times amperes, the same arithmetic.
    ///
    /// [`add`]: Summary::add
    fn add_rows(
        &mut self,
        d: &Derive,
        (time_s, k, period_s): (f64, usize, f64),
        rows: &[i16],
    ) -> usize {
        let n = rows.len() / d.channels.len();
        if n == 0 {
            return 0;
        }
        if self.samples == 0 {
            self.first_s = time_s + k as f64 * period_s;
        }
        self.last_s = time_s + (k + n - 1) as f64 * period_s;
        self.samples += n as u64;
        // Each rail measured both ways: its (position, scale, offset) of volts and amperes.
        let cal = |p: usize| (p, d.cal[p].0, d.cal[p].1);
        let rails: Vec<_> = (d.rails.iter().enumerate())
            .filter_map(|(i, &(v, a))| Some((i, cal(v?), cal(a?))))
            .collect();
        // A series at a time (its figures in registers), each row's total gathered in
        // rail order as `add` sums it.
        let mut totals = vec![0.0f32; n];
        let last = self.min.len() - 1;
        for &(i, (pv, sv, ov), (pa, sa, oa)) in &rails {
            let mut s = (self.min[i], self.max[i], self.sum[i], self.n[i]);
            for (row, total) in rows.chunks_exact(d.channels.len()).zip(&mut totals) {
                let w = (f32::from(row[pv]) * sv + ov) * (f32::from(row[pa]) * sa + oa);
                if w.is_finite() {
                    // `w` is a number, so plain comparisons do what `f32::min` does.
                    *total += w;
                    s = (
                        if w < s.0 { w } else { s.0 },
                        if w > s.1 { w } else { s.1 },
                        s.2 + f64::from(w),
                        s.3 + 1,
                    );
                }
            }
            (self.min[i], self.max[i], self.sum[i], self.n[i]) = s;
        }
        for &w in &totals {
            self.put(last, w);
        }
        n
    }

    fn put(&mut self, i: usize, w: f32) {
        self.min[i] = self.min[i].min(w);
        self.max[i] = self.max[i].max(w);
        self.sum[i] += f64::from(w);
        self.n[i] += 1;
    }

    /// Writes it as a summary row of `c` (nothing if it holds no sample).
    fn write(&self, c: &mut Columns) {
        if self.samples == 0 {
            return;
        }
        let r = c.begin(Kind::Summary, self.first_s);
        c.count.at(r).append_value(self.samples);
        c.duration_s.at(r).append_value(self.last_s - self.first_s);
        let means = c.rails.iter_mut().map(|b| &mut b[2]);
        for (i, b) in means.chain([&mut c.total_w]).enumerate() {
            let mean = (self.n[i] > 0).then(|| (self.sum[i] / self.n[i] as f64) as f32);
            b.at(r).append_option(mean);
            let [lo, hi] = &mut c.extremes[i];
            lo.at(r).append_option(mean.map(|_| self.min[i]));
            hi.at(r).append_option(mean.map(|_| self.max[i]));
        }
    }
}

/// A block row still taking samples.
#[derive(Debug)]
struct OpenBlock {
    row: usize,
    time_s: f64,
    next_index: u64,
    next_tick: u64,
    period_ticks: u32,
    period_s: f64,
    samples: u64,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("path", &self.path)
            .field("pending", &self.pending())
            .field("rows_written", &self.rows_written)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// Creates (or replaces) `path`, locked, and writes the schema at once, so that even
    /// a recording killed before its first batch opens. The recording is of this format
    /// version ([`FORMAT_VERSION`]), whatever `meta.version` says.
    pub fn create(path: &Path, meta: &Meta) -> Result<Writer, RecordingError> {
        Writer::start(Claim::new(path, true)?, meta)
    }

    /// Starts writing the claimed file (emptied first), as [`Writer::create`] does.
    pub fn start(claim: Claim, meta: &Meta) -> Result<Writer, RecordingError> {
        let path = &claim.path;
        let io = |error| RecordingError::Io {
            path: path.to_path_buf(),
            error,
        };
        let arrow = |error| RecordingError::Arrow {
            path: path.to_path_buf(),
            error,
        };
        let meta = Meta {
            version: FORMAT_VERSION,
            ..meta.clone()
        };
        let schema = Arc::new(schema(&meta));
        let file = claim.file;
        file.set_len(0).map_err(io)?;
        // A capture's bulk is its block rows' codes, which LZ4 hardly shortens (noise in
        // their low bits) at a third of the writer's time: its batches are not compressed.
        // Everything else is (rows of floats, mostly null columns).
        let compression = meta.derive.is_none().then_some(CompressionType::LZ4_FRAME);
        let options = IpcWriteOptions::default()
            .try_with_compression(compression)
            .map_err(arrow)?;
        let ipc =
            StreamWriter::try_new_with_options(Vec::new(), &schema, options).map_err(arrow)?;
        let names: StringArray = Kind::ALL
            .iter()
            .map(|k| Some(k.name()))
            .chain([Some(BLOCK)])
            .collect();
        let mut w = Writer {
            path: path.to_path_buf(),
            file,
            sealed: Vec::new(),
            cols: Columns::new(meta.rails.len(), meta.code_channels.len()),
            schema,
            ipc,
            kinds: Arc::new(names),
            open: None,
            block_channels: meta.derive.as_ref().map_or(0, |d| d.channels.len()),
            block_extra: 0,
            derive: meta.derive.clone(),
            summary: Summary::new(meta.rails.len() + 1),
            coarse: Summary::new(meta.rails.len() + 1),
            overview: [0, 1].map(|_| Columns::new(meta.rails.len(), meta.code_channels.len())),
            last_flush: Instant::now(),
            rows_written: 0,
            bytes_written: 0,
        };
        w.write_out(scan::ROWS)?;
        Ok(w)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rows written to the file so far (not counting those still buffered).
    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// Bytes written to the file so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Adds a sample row: per rail (volts, amperes) in [`Meta::rails`] order (NaN where
    /// the rig does not measure it), and the raw codes in [`Meta::code_channels`] order.
    pub fn sample(
        &mut self,
        time_s: f64,
        index: Option<u64>,
        tick: Option<u64>,
        rails: &[(f32, f32)],
        codes: &[i16],
    ) {
        self.close_block();
        self.summary.next = None;
        self.summary.add(time_s, rails);
        if self.summary.samples >= SUMMARY_SAMPLES {
            self.close_summary_at(false);
        }
        let c = &mut self.cols;
        let r = c.begin(Kind::Sample, time_s);
        c.index.at(r).append_option(index);
        c.tick.at(r).append_option(tick);
        let mut total = 0.0f32;
        for (b, &(v, a)) in c.rails.iter_mut().zip(rails) {
            let w = v * a;
            for (b, x) in b.iter_mut().zip([v, a, w]) {
                b.at(r).append_option(x.is_finite().then_some(x));
            }
            if w.is_finite() {
                total += w;
            }
        }
        c.total_w.at(r).append_value(total);
        for (b, &code) in c.codes.iter_mut().zip(codes) {
            b.at(r).append_value(code);
        }
    }

    /// Adds `codes.len() / channels` consecutive samples, numbered from `first_index`,
    /// the first at `time_s` and tick `first_tick`, one every `period_ticks` ticks
    /// (`period_s`): their raw codes in [`Derive::channels`] order, sample after sample.
    /// They are read back as sample rows, with volts, amperes and watts made by
    /// [`Meta::derive`] exactly as [`Writer::sample`] makes them. A run that goes on
    /// where the last one ended (the next index and tick, the same clock, nothing in
    /// between) grows the same block row.
    ///
    /// # Panics
    /// If the recording's [`Meta`] has no `derive`.
    pub fn block(
        &mut self,
        time_s: f64,
        first_index: u64,
        first_tick: u64,
        period_ticks: u32,
        period_s: f64,
        codes: &[i16],
    ) {
        assert!(
            self.block_channels > 0,
            "block rows need the recording's derive"
        );
        let n = (codes.len() / self.block_channels) as u64;
        if n == 0 {
            return;
        }
        let codes = &codes[..n as usize * self.block_channels];
        self.summarize(time_s, first_index, period_s, codes);
        let last = self.cols.kind.len().checked_sub(1);
        if let Some(o) = self.open.as_mut().filter(|o| {
            Some(o.row) == last
                && o.next_index == first_index
                && o.next_tick == first_tick
                && o.period_ticks == period_ticks
                && (o.time_s + o.samples as f64 * o.period_s - time_s).abs() <= 1e-9
        }) {
            o.samples += n;
            o.next_index += n;
            o.next_tick += n * u64::from(period_ticks);
            self.cols.block_codes.values().append_slice(codes);
            self.block_extra += n as usize;
            return;
        }
        self.close_block();
        let c = &mut self.cols;
        let row = c.kind.len();
        c.kind.append_value(KINDS as i8);
        c.time_s.append_value(time_s);
        c.index.at(row).append_value(first_index);
        c.tick.at(row).append_value(first_tick);
        c.period_ticks.at(row).append_value(period_ticks);
        c.block_codes.at(row).values().append_slice(codes);
        self.block_extra += n as usize - 1;
        self.open = Some(OpenBlock {
            row,
            time_s,
            next_index: first_index + n,
            next_tick: first_tick + n * u64::from(period_ticks),
            period_ticks,
            period_s,
            samples: n,
        });
    }

    /// Adds a block's samples to the summaries, starting a new one where the block does
    /// not follow on from the last (a reconnect, a new clock anchor).
    fn summarize(&mut self, time_s: f64, first_index: u64, period_s: f64, codes: &[i16]) {
        let Some(d) = self.derive.take() else {
            return;
        };
        let follows = self
            .summary
            .next
            .is_some_and(|(i, t)| i == first_index && (t - time_s).abs() <= 1e-9);
        if !follows {
            self.close_summary();
        }
        let ch = d.channels.len();
        let (mut k, mut rest) = (0usize, codes);
        while rest.len() >= ch {
            let room = (SUMMARY_SAMPLES - self.summary.samples) as usize;
            let (now, later) = rest.split_at((rest.len() / ch).min(room) * ch);
            k += self.summary.add_rows(&d, (time_s, k, period_s), now);
            rest = later;
            if self.summary.samples >= SUMMARY_SAMPLES {
                self.close_summary_at(false);
            }
        }
        self.summary.next = Some((first_index + k as u64, time_s + k as f64 * period_s));
        self.derive = Some(d);
    }

    /// Writes the summary being gathered, if it holds samples, and starts the next; the
    /// coarse level's too where it is full or `coarse`.
    fn close_summary_at(&mut self, coarse: bool) {
        let series = self.summary.min.len();
        if self.summary.samples > 0 {
            self.summary.write(&mut self.overview[0]);
            self.coarse.merge(&self.summary);
        }
        if coarse || self.coarse.parts >= SUMMARY_LEVEL {
            self.coarse.write(&mut self.overview[1]);
            self.coarse = Summary::new(series);
        }
        let next = self.summary.next;
        self.summary = Summary::new(series);
        self.summary.next = next;
    }

    /// Ends the summaries at a gap or a jump of the clock.
    fn close_summary(&mut self) {
        self.close_summary_at(true);
    }

    /// Ends the block row being filled, if any.
    fn close_block(&mut self) {
        if let Some(o) = self.open.take() {
            let c = &mut self.cols;
            c.block_codes.append(true);
            c.count.at(o.row).append_value(o.samples);
            c.duration_s
                .at(o.row)
                .append_value(o.samples as f64 * o.period_s);
        }
    }

    /// Adds an event row.
    pub fn event(&mut self, e: &Event) {
        self.close_block();
        if matches!(e, Event::Gap { .. }) {
            self.close_summary(); // a summary never spans a gap
        }
        self.cols.event(e);
    }

    /// Rows buffered, not yet written (each sample of a block counted as a row).
    pub fn pending(&self) -> usize {
        self.cols.kind.len() + self.block_extra
    }

    /// Writes the buffered rows if a batch is full or [`FLUSH_INTERVAL`] has passed.
    pub fn maybe_flush(&mut self) -> Result<(), RecordingError> {
        if self.pending() >= BATCH_ROWS || self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the buffered rows as one record batch, with one `write` to the file.
    pub fn flush(&mut self) -> Result<(), RecordingError> {
        self.last_flush = Instant::now();
        self.close_block();
        let rows = self.pending();
        if rows == 0 {
            return Ok(());
        }
        let arrow = |error| RecordingError::Arrow {
            path: self.path.clone(),
            error,
        };
        let columns = self.cols.finish(&self.kinds).map_err(arrow)?;
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(arrow)?;
        self.ipc.write(&batch).map_err(arrow)?;
        self.write_out(scan::ROWS)?;
        self.rows_written += rows as u64;
        self.block_extra = 0;
        Ok(())
    }

    /// Writes the messages Arrow wrote, sealed, as holding `content` (see scan::seal).
    fn write_out(&mut self, content: u8) -> Result<(), RecordingError> {
        let bytes = self.ipc.get_mut();
        self.sealed.clear();
        scan::seal(bytes, &mut self.sealed, content).map_err(|e| RecordingError::Io {
            path: self.path.clone(),
            error: std::io::Error::other(format!(
                "Arrow wrote a message railtrace cannot seal: {e}"
            )),
        })?;
        bytes.clear();
        self.file
            .write_all(&self.sealed)
            .map_err(|error| RecordingError::Io {
                path: self.path.clone(),
                error,
            })?;
        self.bytes_written += self.sealed.len() as u64;
        Ok(())
    }

    /// Writes what is buffered, the overview (every summary) and the stream's end marker,
    /// and syncs the file to disk.
    pub fn finish(mut self) -> Result<u64, RecordingError> {
        self.close_summary();
        self.flush()?;
        let path = self.path.clone();
        let arrow = |error| RecordingError::Arrow {
            path: path.clone(),
            error,
        };
        // The fine level, then the coarse: a reader finds the coarse one at the end and
        // the fine one ending where it starts.
        for (level, content) in [(0, scan::OVERVIEW_FINE), (1, scan::OVERVIEW)] {
            if self.overview[level].kind.is_empty() {
                continue;
            }
            let columns = self.overview[level].finish(&self.kinds).map_err(arrow)?;
            let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(arrow)?;
            // LZ4 whatever the rest is (mostly null columns): an Arrow writer of its own
            // encodes it, and its record batch message is the one kept.
            let options = IpcWriteOptions::default()
                .try_with_compression(Some(CompressionType::LZ4_FRAME))
                .map_err(arrow)?;
            let mut own = StreamWriter::try_new_with_options(Vec::new(), &self.schema, options)
                .map_err(arrow)?;
            own.write(&batch).map_err(arrow)?;
            let bytes = own.get_ref();
            let last = scan::last_message(bytes).unwrap_or(0);
            self.ipc.get_mut().extend_from_slice(&bytes[last..]);
            self.write_out(content)?;
        }
        self.ipc.finish().map_err(arrow)?;
        self.write_out(scan::ROWS)?;
        self.file.sync_all().map_err(|error| RecordingError::Io {
            path: self.path.clone(),
            error,
        })?;
        Ok(self.rows_written)
    }
}

/// A recording read back whole (see [`open`] to read it a batch at a time instead).
#[derive(Debug, Clone)]
pub struct Recording {
    /// The file.
    pub path: PathBuf,
    /// Its metadata.
    pub meta: Meta,
    /// Its schema.
    pub schema: SchemaRef,
    /// Its rows.
    pub batches: Vec<RecordBatch>,
    /// The writer closed it (the end-of-stream marker is there); false for a capture that
    /// was killed or lost power, whose rows up to its last flush are all here.
    pub finalised: bool,
    /// What is cut or damaged, one line each (also said on stderr, see [`warn`]); the
    /// batches hold everything else.
    pub damage: Vec<String>,
}

/// The end-of-stream marker of the Arrow IPC stream format.
const END_OF_STREAM: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];

/// Reads a whole recording into memory: [`open`] and every batch collected. A long
/// recording is better read with [`open`], a batch at a time.
pub fn read(path: &Path) -> Result<Recording, RecordingError> {
    let mut r = open(path)?;
    let batches = r.by_ref().collect::<Result<Vec<_>, _>>()?;
    Ok(Recording {
        path: r.path,
        meta: r.meta,
        schema: r.schema,
        batches,
        finalised: r.finalised,
        damage: r.damage,
    })
}

/// A recording being read a record batch at a time, in the order written: an iterator of
/// batches that holds one batch in memory at a time, whatever the recording's length.
///
/// [`open`] checks the framing and the lengths of every message (reading their headers,
/// not their bodies) and reads the schema; each batch is read when the iterator gets to
/// it. A file cut inside a batch (a disk that filled, a machine that lost power) yields
/// every complete batch before the cut; a damaged batch is skipped; each is one line of
/// [`Reader::damage`], said on stderr once the batches are read ([`warn`]).
/// The reader reads the bytes the file had when it was opened: rows a running capture
/// appends afterwards are not read, and [`Reader::finalised`] describes the file as it
/// was then.
#[derive(Debug)]
pub struct Reader {
    /// The file.
    pub path: PathBuf,
    /// Its metadata.
    pub meta: Meta,
    /// Its schema (every column, whatever columns the batches hold), as this version
    /// writes it: the columns an older file lacks are there (see [`Reader::upgrading`]).
    pub schema: SchemaRef,
    /// The writer closed it (the end-of-stream marker is the last 8 bytes); see
    /// [`Recording::finalised`].
    pub finalised: bool,
    /// The file's length when it was opened: the bytes read.
    len: u64,
    stream: StreamReader<BufReader<scan::Ranges>>,
    /// For an older file: the schema of the batches given out, the columns the file
    /// lacks among them (all null); for one with block rows, the batches' columns after
    /// expanding them.
    upgrade: Option<SchemaRef>,
    /// The file may hold block rows (format 5 on).
    blocks: bool,
    /// Block rows are given out as they are ([`open_blocks`]).
    raw: bool,
    batches: usize,
    rows: usize,
    done: bool,
    /// What is damaged or cut, one line each, found when opened or while reading.
    damage: Vec<String>,
    /// Where the scan found damaged stretches: the record batches that check out before
    /// each (see `scan::Scan::holes`).
    holes: Vec<usize>,
    /// Record batches taken from the stream so far, whether they decoded or not.
    taken: usize,
    /// A damaged batch was skipped since the last batch given out.
    hole: bool,
    /// Where the samples of the batches given out so far end: the next one expected.
    next: Option<SpanEnd>,
    /// A batch to give out next (the one after the gap row that marks a hole).
    queued: Option<RecordBatch>,
    /// The schema of the batches given out and their kind dictionary (those of a gap
    /// row the reader adds).
    schema_out: (SchemaRef, ArrayRef),
    /// The record batches it reads where it reads only some ([`browse`]), by their
    /// messages' byte ranges; `None`: all.
    window: Option<Vec<(u64, u64)>>,
}

/// Opens a recording to read it a record batch at a time (see [`Reader`]), with the same
/// checks and one-line errors as [`read`].
pub fn open(path: &Path) -> Result<Reader, RecordingError> {
    open_at(path, None, None, false)
}

/// Like [`open`], but the batches hold only the `kind` column and `columns` (in the
/// recording's order; names it does not have are left out): the others are skipped
/// without being decompressed, which saves most of the time of a pass that needs few.
pub fn open_columns(path: &Path, columns: &[&str]) -> Result<Reader, RecordingError> {
    open_at(path, None, Some(columns), false)
}

/// Like [`open_columns`], but a capture's block rows are given out as they are on disk,
/// not as the sample rows they hold ([`Rows::is_block`], [`Rows::block_samples`]): the
/// fast way through every sample of a long capture. The batches hold `columns` and the
/// block columns among them (`count`, `codes`, `period_ticks`, `tick` for
/// [`Rows::block_samples`]), in the file's own schema.
pub fn open_blocks(path: &Path, columns: &[&str]) -> Result<Reader, RecordingError> {
    open_at(path, None, Some(columns), true)
}

/// The indices of the `kind` column and of `columns` in `schema`, in the schema's order.
fn projection(schema: &Schema, columns: &[&str]) -> Vec<usize> {
    let mut p: Vec<usize> = std::iter::once(0)
        .chain(columns.iter().filter_map(|c| schema.index_of(c).ok()))
        .collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// Opens `path` and reads its first `len` bytes (its length now when `None`).
fn open_at(
    path: &Path,
    len: Option<u64>,
    columns: Option<&[&str]>,
    raw: bool,
) -> Result<Reader, RecordingError> {
    let io = |error| RecordingError::Io {
        path: path.to_path_buf(),
        error,
    };
    let foreign = |why: &str| RecordingError::Foreign {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    let mut file = railtrace_twin::scenario::open_regular(path).map_err(io)?;
    let len = match len {
        Some(len) => len,
        None => file.metadata().map_err(io)?.len(),
    };
    let mut head = Vec::with_capacity(8);
    (&mut file).take(8).read_to_end(&mut head).map_err(io)?;
    if head.starts_with(b"ARROW1") {
        return Err(foreign(
            "an Arrow IPC file (random-access format), not the stream format",
        ));
    }
    if head.starts_with(b"PAR1") {
        return Err(foreign("a Parquet file"));
    }
    if !head.starts_with(&[0xFF, 0xFF, 0xFF, 0xFF]) {
        return Err(foreign(if head.is_empty() {
            "the file is empty"
        } else {
            "not an Arrow IPC stream"
        }));
    }
    let mut tail = [0u8; 8];
    let finalised = len >= 8 && {
        file.seek(SeekFrom::Start(len - 8)).map_err(io)?;
        file.read_exact(&mut tail).map_err(io)?;
        tail == END_OF_STREAM
    };
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    // Every message checked before Arrow sees it; the damaged ones are left out.
    let scanned = scan::scan(&mut file, len).map_err(io)?;
    open_scanned(path, file, (len, finalised), scanned, columns, raw, None)
}

/// A reader of the messages `scanned` found in the first `len` bytes of `file` (at
/// `path`), which the writer closed or not (`finalised`); `window`: where it reads only
/// some of the file's record batches, those (see [`browse`]).
fn open_scanned(
    path: &Path,
    file: File,
    (len, finalised): (u64, bool),
    scanned: scan::Scan,
    columns: Option<&[&str]>,
    raw: bool,
    window: Option<Vec<(u64, u64)>>,
) -> Result<Reader, RecordingError> {
    let io = |error| RecordingError::Io {
        path: path.to_path_buf(),
        error,
    };
    let foreign = |why: &str| RecordingError::Foreign {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    let header_error =
        |e: ArrowError| foreign(&format!("not a readable Arrow IPC stream header: {e}"));
    let stream_of = |file: File| {
        BufReader::with_capacity(1 << 20, scan::Ranges::new(file, scanned.ranges.clone()))
    };
    let file_schema = StreamReader::try_new(stream_of(file.try_clone().map_err(io)?), None)
        .map_err(header_error)?
        .schema();
    let meta = check_schema(path, &file_schema)?;
    let blocks = meta.version >= BLOCKS_SINCE;
    // The table as read: this version's columns (the file's own fields where it has them,
    // with their metadata), those an older file lacks added, a block row's own left out.
    let table = table_schema(&Meta {
        version: FORMAT_VERSION,
        ..meta.clone()
    });
    let fields: Vec<Field> = table
        .fields()
        .iter()
        .map(|f| match file_schema.field_with_name(f.name()) {
            Ok(have) => have.clone(),
            Err(_) => f.as_ref().clone(),
        })
        .collect();
    let schema = Arc::new(Schema::new(fields).with_metadata(file_schema.metadata().clone()));
    let given = match columns {
        Some(c) => projection(&schema, c),
        None => (0..schema.fields().len()).collect(),
    };
    // The indices are the schema's own: projecting cannot fail.
    let out = Arc::new(
        schema
            .project(&given)
            .unwrap_or_else(|_| schema.as_ref().clone()),
    );
    // What to read of the file: the columns asked for, and what expanding blocks needs.
    let read = columns.map(|c| {
        let mut c = c.to_vec();
        c.extend(SPAN_COLUMNS);
        if blocks && !raw {
            c.extend(BLOCK_COLUMNS);
        }
        projection(&file_schema, &c)
    });
    let read_fields = read
        .as_ref()
        .map_or(file_schema.fields().len(), |r| r.len());
    let upgrade = (blocks || out.fields().len() != read_fields).then_some(out);
    // The stream proper, from the start again (the schema message is small).
    let stream = StreamReader::try_new(stream_of(file), read).map_err(header_error)?;
    // The batches given out, until the first says otherwise: their schema and kinds.
    let given_schema = match &upgrade {
        Some(s) if !raw => s.clone(),
        _ => stream.schema(),
    };
    let kinds: StringArray = (Kind::ALL.iter().map(|k| Some(k.name())))
        .chain(raw.then_some(Some(BLOCK)))
        .collect();
    Ok(Reader {
        path: path.to_path_buf(),
        meta,
        schema,
        finalised,
        len,
        stream,
        upgrade,
        blocks,
        raw,
        batches: 0,
        rows: 0,
        done: false,
        damage: scanned.damage,
        holes: scanned.holes,
        taken: 0,
        hole: false,
        next: None,
        queued: None,
        schema_out: (given_schema, Arc::new(kinds)),
        window,
    })
}

/// `batch`, read from an older file, with the columns of `schema` it lacks added, all
/// null.
fn upgrade_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let n = batch.num_rows();
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| {
            batch
                .column_by_name(f.name())
                .cloned()
                .unwrap_or_else(|| arrow_array::new_null_array(f.data_type(), n))
        })
        .collect();
    RecordBatch::try_new(schema.clone(), columns)
}

/// A batch of a file of format 5 or later, given out in `out`'s columns: each block row
/// made the sample rows it holds (their time, index and tick counted on from the
/// block's, their volts, amperes, watts and codes from its codes by `meta.derive`), the
/// other rows as they are, and the `kind` column in [`Kind::ALL`]'s order.
fn expand(batch: &RecordBatch, out: &SchemaRef, meta: &Meta) -> Result<RecordBatch, String> {
    use arrow_array::types::{Float32Type, Float64Type, Int16Type, UInt64Type};
    let dictionary = batch
        .column(0)
        .as_any()
        .downcast_ref::<DictionaryArray<arrow_array::types::Int8Type>>()
        .ok_or("its first column is not the kind dictionary")?;
    let of_key: Vec<Option<Kind>> = dictionary
        .values()
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or("the kind dictionary does not hold strings")?
        .iter()
        .map(|n| n.and_then(Kind::from_name))
        .collect();
    let keys = dictionary.keys();
    let kind = |i: usize| of_key.get(keys.value(i) as usize).copied().flatten();
    let n_in = batch.num_rows();
    let column = |name: &str| batch.column_by_name(name);
    fn typed<T: Array + 'static>(c: Option<&ArrayRef>) -> Option<&T> {
        c.and_then(|c| c.as_any().downcast_ref::<T>())
    }
    // The source row of every row given out, and which sample of its block it is.
    const ROW: u32 = u32::MAX;
    let (mut src, mut within) = (Vec::with_capacity(n_in), Vec::with_capacity(n_in));
    let mut block = None;
    for i in 0..n_in {
        match kind(i) {
            Some(Kind::Summary) => continue, // in the overview, not the table
            Some(_) => {
                src.push(i as u32);
                within.push(ROW);
                continue;
            }
            None => {}
        }
        let b = match block {
            Some(b) => b,
            None => {
                let d = meta
                    .derive
                    .as_ref()
                    .ok_or("block rows, and no derive in the metadata")?;
                let parts = (
                    typed::<UInt64Array>(column("count")),
                    typed::<arrow_array::ListArray>(column("codes")),
                    typed::<Float64Array>(column("time_s")),
                    typed::<UInt64Array>(column("index")),
                    typed::<UInt64Array>(column("tick")),
                    typed::<UInt32Array>(column("period_ticks")),
                );
                let (Some(count), Some(codes), Some(time), Some(index), Some(tick), Some(period)) =
                    parts
                else {
                    return Err("block rows without their columns".into());
                };
                let values = codes
                    .values()
                    .as_any()
                    .downcast_ref::<arrow_array::Int16Array>()
                    .ok_or("block codes that are not 16-bit")?;
                *block.insert((d, count, codes, values, time, index, tick, period))
            }
        };
        let (d, count, codes, _, time, index, tick, period) = b;
        let filled = [time.is_valid(i), index.is_valid(i), tick.is_valid(i)];
        if !count.is_valid(i)
            || !codes.is_valid(i)
            || !period.is_valid(i)
            || filled.contains(&false)
        {
            return Err("a block row with a field missing".into());
        }
        let n = count.value(i);
        if codes.value_length(i) as u64 != n.saturating_mul(d.channels.len() as u64) {
            return Err(format!(
                "a block of {n} samples holding {} codes",
                codes.value_length(i)
            ));
        }
        src.extend(std::iter::repeat_n(i as u32, n as usize));
        within.extend(0..n as u32);
    }
    let n_out = src.len();
    let derive = block.map(|b| b.0);
    // Sample `o` (given out) of a block: its source row and place in it.
    let sample = |o: usize| (within[o] != ROW).then(|| (src[o] as usize, within[o] as usize));
    let codes_of = |s: usize, k: usize| -> &[i16] {
        let Some((d, _, codes, values, ..)) = block else {
            return &[];
        };
        let ch = d.channels.len();
        let start = codes.value_offsets()[s] as usize + k * ch;
        &values.values()[start..start + ch]
    };
    // Each sample's per-rail (volts, amperes), where a rail column is asked for.
    let rails = meta.rails.len();
    let wants_rails = out.fields().iter().any(|f| {
        f.name() == "total_w" || meta.rails.iter().any(|r| f.name().starts_with(r.as_str()))
    });
    let mut values = Vec::new();
    if let (Some(d), true) = (derive, wants_rails) {
        values = vec![(f32::NAN, f32::NAN); n_out * rails];
        for o in 0..n_out {
            if let Some((s, k)) = sample(o) {
                d.values(codes_of(s, k), &mut values[o * rails..(o + 1) * rails]);
            }
        }
    }
    let finite = |x: f32| x.is_finite().then_some(x);
    let rail_value = |o: usize, r: usize, which: usize| {
        let (v, a) = values[o * rails + r];
        finite([v, a, v * a][which])
    };
    let total = |o: usize| Some(total_of(values[o * rails..(o + 1) * rails].iter().copied()));
    // A column given out: the source row's value, or the sample's.
    fn fill<T: arrow_array::ArrowPrimitiveType>(
        from: Option<&ArrayRef>,
        src: &[u32],
        within: &[u32],
        mut sample: impl FnMut(usize, usize, usize) -> Option<T::Native>,
    ) -> ArrayRef {
        let from = from.and_then(|c| c.as_any().downcast_ref::<arrow_array::PrimitiveArray<T>>());
        let a: arrow_array::PrimitiveArray<T> = (0..src.len())
            .map(|o| {
                let s = src[o] as usize;
                if within[o] == u32::MAX {
                    from.and_then(|c| Rows::get(c, s))
                } else {
                    sample(o, s, within[o] as usize)
                }
            })
            .collect();
        Arc::new(a)
    }
    let time = typed::<Float64Array>(column("time_s"));
    // The block columns, found once (above) rather than by name for every sample.
    let period = |s: usize| block.map_or(0, |b| b.7.value(s));
    let tick_hz = derive.map_or(1.0, |d| d.tick_hz);
    let key_of = |o: usize| match sample(o) {
        Some(_) => Kind::Sample.code(),
        None => kind(src[o] as usize).unwrap_or(Kind::Log).code(),
    };
    let names: StringArray = Kind::ALL.iter().map(|k| Some(k.name())).collect();
    let kinds = DictionaryArray::try_new(
        (0..n_out).map(key_of).collect::<Int8Array>(),
        Arc::new(names),
    )
    .map_err(|e| e.to_string())?;
    let take = UInt32Array::from(src.clone());
    let mut given: Vec<ArrayRef> = Vec::with_capacity(out.fields().len());
    for f in out.fields() {
        let name = f.name().as_str();
        let from = column(name);
        let rail = meta.rails.iter().enumerate().find_map(|(r, rail)| {
            let which = ["_v", "_a", "_w"]
                .iter()
                .position(|x| name.strip_prefix(rail.as_str()) == Some(x))?;
            Some((r, which))
        });
        let code = name
            .strip_prefix("code")
            .and_then(|c| c.parse::<u8>().ok())
            .filter(|c| meta.code_channels.contains(c));
        let c: ArrayRef = match (name, rail, code) {
            ("kind", ..) => Arc::new(kinds.clone()),
            ("time_s", ..) => fill::<Float64Type>(from, &src, &within, |_, s, k| {
                Some(time?.value(s) + k as f64 * (f64::from(period(s)) / tick_hz))
            }),
            ("index", ..) => fill::<UInt64Type>(from, &src, &within, |_, s, k| {
                Some(block?.5.value(s) + k as u64)
            }),
            ("tick", ..) => fill::<UInt64Type>(from, &src, &within, |_, s, k| {
                Some(block?.6.value(s) + k as u64 * u64::from(period(s)))
            }),
            ("count", ..) => fill::<UInt64Type>(from, &src, &within, |_, _, _| None),
            ("duration_s", ..) => fill::<Float64Type>(from, &src, &within, |_, _, _| None),
            ("total_w", ..) if derive.is_some() => {
                fill::<Float32Type>(from, &src, &within, |o, _, _| total(o))
            }
            (_, Some((r, which)), _) if derive.is_some() => {
                fill::<Float32Type>(from, &src, &within, |o, _, _| rail_value(o, r, which))
            }
            (_, _, Some(c)) => fill::<Int16Type>(from, &src, &within, |_, s, k| {
                let d = derive?;
                let p = d.channels.iter().position(|&x| x == c);
                Some(p.map_or(0, |p| codes_of(s, k)[p]))
            }),
            _ => match from {
                Some(c) if c.null_count() < c.len() => {
                    arrow_select::take::take(c.as_ref(), &take, None).map_err(|e| e.to_string())?
                }
                _ => arrow_array::new_null_array(f.data_type(), n_out),
            },
        };
        given.push(c);
    }
    RecordBatch::try_new(out.clone(), given).map_err(|e| e.to_string())
}

/// A recording's overview: what a plot of its whole length needs, without its samples.
#[derive(Debug)]
pub struct Overview {
    /// Its summary rows of one level, in order (a fine one per [`SUMMARY_SAMPLES`]
    /// samples or fewer, a coarse one per [`SUMMARY_LEVEL`] fine ones or fewer; never
    /// across a gap or a jump of the clock), in the columns of [`overview_schema`].
    pub recording: Recording,
    /// The bytes read to get it.
    pub bytes_read: u64,
    /// The coarse level (the file's last batch); false for the fine one.
    pub coarse: bool,
    /// Where it starts in the file (the fine level ends there), and the schema's and
    /// dictionary's messages with their column nodes.
    at: u64,
    head: (u64, Vec<bool>),
}

/// How far from its end a recording's overview is looked for.
const OVERVIEW_SEARCH: u64 = 1 << 30;

/// The overview of a recording that its writer closed (format 5 on), read from its end
/// without reading its samples: its schema and kind dictionary, then its last record
/// batch, the coarse level's summaries (sealed as such, and checked against its
/// CRC-32C); [`Overview::finer`] reads the fine level's. `None` where the file has none
/// (not closed, an older format, or damaged there): its samples are then read instead.
pub fn overview(path: &Path) -> Result<Option<Overview>, RecordingError> {
    let io = |error| RecordingError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut file = railtrace_twin::scenario::open_regular(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut tail = [0u8; 8];
    if len < 16 {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(len - 8)).map_err(io)?;
    file.read_exact(&mut tail).map_err(io)?;
    if tail != END_OF_STREAM {
        return Ok(None);
    }
    let Some(head) = stream_head(&mut file, len) else {
        return Ok(None);
    };
    let bytes_read = head.0 + 8;
    level(
        path,
        file,
        head,
        (len - 8, None),
        scan::OVERVIEW,
        bytes_read,
    )
}

/// A sealed stream's schema and kind dictionary, checked: where they end, and the
/// column nodes of its record batches (see `scan::Message::top`).
fn stream_head(file: &mut File, len: u64) -> Option<(u64, Vec<bool>)> {
    let schema = scan::message(file, 0, len, true, false, &[]).ok()??;
    // The kind dictionary follows the schema (the writer sends it once).
    let dictionary = scan::message(file, schema.end, len, false, true, &schema.top).ok()??;
    (!dictionary.is_batch).then_some((dictionary.end, schema.top))
}

impl Overview {
    /// The fine level's summaries, from the batch that ends where this (coarse) one
    /// starts; `None` for the fine level itself, or where there is none.
    pub fn finer(&self) -> Result<Option<Overview>, RecordingError> {
        self.finer_at(None)
    }

    /// [`Overview::finer`], where the fine level's message may start at `hint` (checked
    /// there first, and looked for only if it is not there).
    fn finer_at(&self, hint: Option<u64>) -> Result<Option<Overview>, RecordingError> {
        if !self.coarse {
            return Ok(None);
        }
        let path = &self.recording.path;
        let file =
            railtrace_twin::scenario::open_regular(path).map_err(|error| RecordingError::Io {
                path: path.clone(),
                error,
            })?;
        let head = self.head.clone();
        level(path, file, head, (self.at, hint), scan::OVERVIEW_FINE, 0)
    }
}

/// The overview level `content` that ends at `end` of `file` (after `head`, the schema's
/// and dictionary's messages), found by looking back from `end` in growing stretches
/// (a small overview costs a small read), or at `hint` where it checks out there.
fn level(
    path: &Path,
    mut file: File,
    head: (u64, Vec<bool>),
    (end, hint): (u64, Option<u64>),
    content: u8,
    mut bytes_read: u64,
) -> Result<Option<Overview>, RecordingError> {
    let io = |error| RecordingError::Io {
        path: path.to_path_buf(),
        error,
    };
    let lowest = end.saturating_sub(OVERVIEW_SEARCH).max(head.0);
    let mut upto = end;
    let mut found = hint.filter(|&at| {
        matches!(scan::message(&mut file, at, end, false, true, &head.1),
            Ok(Some(m)) if m.end == end && m.content == content)
    });
    bytes_read += found.map_or(0, |at| end - at);
    let mut buf = vec![0u8; 1 << 14];
    'search: while upto > lowest && found.is_none() {
        if buf.len() < 1 << 24 && upto < end {
            buf = vec![0u8; buf.len() * 4];
        }
        let from = upto.saturating_sub(buf.len() as u64 - 3).max(lowest);
        let n = (upto - from) as usize + 3.min((end - upto) as usize);
        file.seek(SeekFrom::Start(from)).map_err(io)?;
        file.read_exact(&mut buf[..n]).map_err(io)?;
        bytes_read += n as u64;
        for i in (0..n.saturating_sub(3)).rev() {
            if buf[i..i + 4] != [0xFF; 4] {
                continue;
            }
            let at = from + i as u64;
            if let Ok(Some(m)) = scan::message(&mut file, at, end, false, true, &head.1) {
                if m.end == end && m.content == content {
                    bytes_read += end - at;
                    found = Some(at);
                    break 'search;
                }
            }
        }
        upto = from;
    }
    let Some(at) = found else {
        return Ok(None);
    };
    let ranges = vec![(0, head.0), (at, end)];
    let stream = BufReader::new(scan::Ranges::new(file, ranges));
    let Ok(reader) = StreamReader::try_new(stream, None) else {
        return Ok(None);
    };
    let meta = check_schema(path, &reader.schema())?;
    if meta.version < BLOCKS_SINCE {
        return Ok(None);
    }
    let schema = Arc::new(overview_schema(&meta).with_metadata(reader.schema().metadata().clone()));
    let mut batches = Vec::new();
    for b in reader {
        let b = b.map_err(|error| RecordingError::Arrow {
            path: path.to_path_buf(),
            error,
        })?;
        check_kinds(&b, true).map_err(|why| RecordingError::Foreign {
            path: path.to_path_buf(),
            why,
        })?;
        batches.push(
            upgrade_batch(&b, &schema).map_err(|error| RecordingError::Arrow {
                path: path.to_path_buf(),
                error,
            })?,
        );
    }
    Ok(Some(Overview {
        recording: Recording {
            path: path.to_path_buf(),
            meta,
            schema,
            batches,
            finalised: true,
            damage: Vec::new(),
        },
        bytes_read,
        coarse: content == scan::OVERVIEW,
        at,
        head,
    }))
}

/// The recording's metadata, if `schema` is that of a recording this code reads.
fn check_schema(path: &Path, schema: &Schema) -> Result<Meta, RecordingError> {
    let foreign = |why: &str| RecordingError::Foreign {
        path: path.to_path_buf(),
        why: why.to_string(),
    };
    let md = schema.metadata();
    if md.get("railtrace.format").map(String::as_str) != Some(FORMAT) {
        return Err(foreign(
            "an Arrow stream without railtrace's metadata (railtrace.format)",
        ));
    }
    let meta_json = md.get("railtrace").map(String::as_str).unwrap_or("");
    let version = serde_json::from_str::<serde_json::Value>(meta_json)
        .ok()
        .and_then(|v| v.get("version")?.as_u64())
        .unwrap_or(0);
    if !(u64::from(OLDEST_READABLE)..=u64::from(FORMAT_VERSION)).contains(&version) {
        return Err(RecordingError::Version {
            path: path.to_path_buf(),
            found: version as u32,
            oldest: OLDEST_READABLE,
            supported: FORMAT_VERSION,
        });
    }
    let meta: Meta = serde_json::from_str(meta_json)
        .map_err(|e| foreign(&format!("its railtrace metadata does not parse: {e}")))?;
    // A table of format 5 or later may also come without the block columns (another
    // Arrow writer's copy of what railtrace reads): it has no block rows.
    let same = |a: &Field, b: &Field| a.name() == b.name() && a.data_type() == b.data_type();
    let fits = |expected: Schema| {
        expected.fields().len() == schema.fields().len()
            && expected
                .fields()
                .iter()
                .zip(schema.fields())
                .all(|(a, b)| same(a, b))
    };
    let blockless = meta.version >= BLOCKS_SINCE && fits(table_schema(&meta));
    if !fits(self::schema(&meta)) && !blockless {
        return Err(foreign(
            "its columns are not the ones its railtrace metadata describes",
        ));
    }
    if meta
        .derive
        .as_ref()
        .is_some_and(|d| !d.fits(meta.rails.len()))
    {
        return Err(foreign(
            "its railtrace metadata's derive does not fit its rails and channels",
        ));
    }
    Ok(meta)
}

impl Reader {
    /// Opens the same recording again, to read it from the start (the bytes this reader
    /// reads, no more), with every column (`None`) or the `kind` column and `columns`
    /// (see [`open_columns`]). Fails if the file is no longer that recording.
    pub fn reopen(&self, columns: Option<&[&str]>) -> Result<Reader, RecordingError> {
        let r = match &self.window {
            Some(w) => browse::open_window(&self.path, self.len, w, columns, self.raw)?,
            None => open_at(&self.path, Some(self.len), columns, self.raw)?,
        };
        if r.schema != self.schema {
            return Err(RecordingError::Foreign {
                path: self.path.clone(),
                why: "it was replaced while being read".into(),
            });
        }
        Ok(r)
    }

    /// Whether the file is of an older format version that lacks columns this version
    /// has: its batches are given out with them added, all null.
    pub fn upgrading(&self) -> bool {
        self.upgrade.is_some() && !self.blocks
    }

    /// What is cut or damaged, one line each: what the scan at opening found, and what
    /// reading has found so far.
    pub fn damage(&self) -> &[String] {
        &self.damage
    }

    /// Record batches read so far.
    pub fn batches_read(&self) -> usize {
        self.batches
    }

    /// Rows in them.
    pub fn rows_read(&self) -> usize {
        self.rows
    }

    /// The batches read on a thread of their own, two ahead of their use: the file's
    /// reading, decompression and checks overlap the caller's work on the batch before
    /// (reading a capture was half of `correct`'s time on a long one). The same batches
    /// in the same order; a panic while reading is raised again in the caller.
    pub fn read_ahead(self) -> ReadAhead {
        let (tx, rx) = std::sync::mpsc::sync_channel(2);
        let reading = std::thread::spawn(move || {
            for batch in self {
                if tx.send(batch).is_err() {
                    break; // the caller stopped reading
                }
            }
        });
        ReadAhead {
            rx,
            reading: Some(reading),
        }
    }
}

/// A [`Reader`]'s batches read ahead on a thread of their own ([`Reader::read_ahead`]).
#[derive(Debug)]
pub struct ReadAhead {
    rx: std::sync::mpsc::Receiver<Result<RecordBatch, RecordingError>>,
    reading: Option<std::thread::JoinHandle<()>>,
}

impl Iterator for ReadAhead {
    type Item = Result<RecordBatch, RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Ok(batch) = self.rx.recv() {
            return Some(batch);
        }
        // The reader is done, or it panicked: never a capture cut short in silence.
        if let Some(Err(panic)) = self.reading.take().map(std::thread::JoinHandle::join) {
            std::panic::resume_unwind(panic);
        }
        None
    }
}

impl Iterator for Reader {
    type Item = Result<RecordBatch, RecordingError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(b) = self.queued.take() {
            return Some(Ok(b));
        }
        while !self.done {
            if self.holes.first() == Some(&self.taken) {
                self.holes.remove(0);
                self.hole = true;
                continue;
            }
            // Arrow is given only messages whose lengths check out; what it still finds
            // wrong (or panics on) is one damaged batch, named and skipped.
            let next = decoding(|| self.stream.next());
            self.taken += usize::from(matches!(next, Ok(Some(_))));
            match next {
                Ok(None) => self.done = true,
                Ok(Some(Ok(b))) => {
                    let checked = check_kinds(&b, self.blocks);
                    let span = checked.is_ok().then(|| sample_span(&Rows::new(&b)));
                    let given = checked.and_then(|()| match &self.upgrade {
                        None => Ok(b),
                        Some(_) if self.blocks && self.raw => Ok(b),
                        Some(schema) if self.blocks => expand(&b, schema, &self.meta),
                        Some(schema) => upgrade_batch(&b, schema).map_err(|e| e.to_string()),
                    });
                    match given {
                        Ok(b) => {
                            let gap = self.hole_before(span.as_ref(), &b);
                            if let Some(end) = span.and_then(|s| s.end) {
                                self.next = Some(end);
                            }
                            self.batches += 1;
                            self.rows += b.num_rows();
                            let Some(gap) = gap else {
                                return Some(Ok(b));
                            };
                            self.rows += 1;
                            self.queued = Some(b);
                            return Some(Ok(gap));
                        }
                        Err(why) => self.skipped(&why, "skipped"),
                    }
                }
                Ok(Some(Err(e))) => self.skipped(&e.to_string(), "skipped"),
                Err(panic) => {
                    self.skipped(&panic, "nothing after it is read");
                    self.done = true;
                }
            }
            if self.damage.len() > MAX_DAMAGE {
                self.damage
                    .push("too much damage: nothing after it is read".into());
                self.done = true;
            }
        }
        // Damage after the last batch given out: what it held, up to the end, is a gap
        // of unknown length (from the recording's start where no sample was read).
        if self.hole || !self.holes.is_empty() {
            self.hole = false;
            self.holes.clear();
            let from = self.next.unwrap_or(SpanEnd {
                index: 0,
                time_s: 0.0,
            });
            let gap = Gap {
                time_s: from.time_s,
                index: Some(from.index),
                samples: None,
                duration_s: None,
            };
            if let Some(b) = self.gap_batch(&gap) {
                self.rows += 1;
                return Some(Ok(b));
            }
        }
        for d in &self.damage {
            warn(&self.path, d);
        }
        None
    }
}

impl Reader {
    /// A damaged record batch skipped (`why`, and what follows): named, and its samples
    /// a hole that the next batch given out marks.
    fn skipped(&mut self, why: &str, then: &str) {
        self.hole = true;
        self.damage.push(format!(
            "a record batch after row {} is damaged ({}); {then}",
            self.rows,
            one_line(why)
        ));
    }

    /// The gap row to give out before `b`, whose samples span `span`, where a damaged
    /// batch was skipped before it and the samples it held are missing.
    fn hole_before(&mut self, span: Option<&Span>, b: &RecordBatch) -> Option<RecordBatch> {
        if let Some(d) =
            (b.column(0).as_any()).downcast_ref::<DictionaryArray<arrow_array::types::Int8Type>>()
        {
            self.schema_out = (b.schema(), d.values().clone());
        }
        if !std::mem::take(&mut self.hole) {
            return None;
        }
        let span = span?;
        let (prev, (index, time_s)) = (self.next, span.first?);
        let gap = match prev {
            Some(p) if index > p.index => Gap {
                time_s: p.time_s,
                index: Some(p.index),
                samples: Some(index - p.index),
                duration_s: Some(time_s - p.time_s),
            },
            // The first batch was damaged: the device numbers samples from 0.
            None if index > 0 => {
                let period = span.period_s?;
                Gap {
                    time_s: time_s - index as f64 * period,
                    index: Some(0),
                    samples: Some(index),
                    duration_s: Some(index as f64 * period),
                }
            }
            _ => return None,
        };
        self.gap_batch(&gap)
    }

    /// A one-row batch of the batches' schema: the gap row of a damaged batch.
    fn gap_batch(&self, gap: &Gap) -> Option<RecordBatch> {
        let (schema, kinds) = self.schema_out.clone();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                let t = f.data_type();
                match f.name().as_str() {
                    "kind" => Arc::new(gap_kind(&kinds)),
                    "time_s" if *t == DataType::Float64 => {
                        Arc::new(Float64Array::from(vec![gap.time_s]))
                    }
                    "index" if *t == DataType::UInt64 => {
                        Arc::new(UInt64Array::from(vec![gap.index]))
                    }
                    "count" if *t == DataType::UInt64 => {
                        Arc::new(UInt64Array::from(vec![gap.samples]))
                    }
                    "duration_s" if *t == DataType::Float64 => {
                        Arc::new(Float64Array::from(vec![gap.duration_s]))
                    }
                    "text" if *t == DataType::Utf8 => {
                        Arc::new(StringArray::from(vec![DAMAGED_BATCH]))
                    }
                    _ => arrow_array::new_null_array(t, 1),
                }
            })
            .collect();
        RecordBatch::try_new(schema, columns).ok()
    }
}

/// The cause of a gap row a reader gives out where a damaged batch was skipped.
pub const DAMAGED_BATCH: &str =
    "damaged batch: the recording's bytes there are damaged, its samples are left out";

/// A gap a reader found: the samples of a damaged batch.
#[derive(Debug, Clone, Copy)]
struct Gap {
    time_s: f64,
    index: Option<u64>,
    samples: Option<u64>,
    duration_s: Option<f64>,
}

/// The kind column of a one-row gap batch: the dictionary of the batches around it
/// (`kinds`), where it names the gap kind, the key of `gap`.
fn gap_kind(kinds: &ArrayRef) -> DictionaryArray<arrow_array::types::Int8Type> {
    let at = (kinds.as_any().downcast_ref::<StringArray>())
        .and_then(|n| n.iter().position(|n| n == Some(Kind::Gap.name())));
    match at {
        Some(at) => DictionaryArray::new(Int8Array::from(vec![at as i8]), kinds.clone()),
        None => DictionaryArray::new(
            Int8Array::from(vec![0]),
            Arc::new(StringArray::from(vec![Kind::Gap.name()])),
        ),
    }
}

/// The columns a reader reads whatever it is asked for: where each batch's samples
/// start and end, so that a damaged batch between two is a gap of exactly its samples.
const SPAN_COLUMNS: [&str; 4] = ["time_s", "index", "count", "duration_s"];

/// The sample (or gap) after the last of a batch.
#[derive(Debug, Clone, Copy)]
struct SpanEnd {
    index: u64,
    time_s: f64,
}

/// Where a batch's samples start and end (its sample, block and gap rows that have an
/// index), and their period.
#[derive(Debug, Clone, Copy)]
struct Span {
    first: Option<(u64, f64)>,
    end: Option<SpanEnd>,
    period_s: Option<f64>,
}

/// The samples a batch as read from the file holds (`rows`, its kinds checked): see
/// [`Span`].
fn sample_span(rows: &Rows<'_>) -> Span {
    let col = |n: &str| rows.batch.column_by_name(n);
    let time = col("time_s").and_then(|c| c.as_any().downcast_ref::<Float64Array>());
    let index = col("index").and_then(|c| c.as_any().downcast_ref::<UInt64Array>());
    let count = col("count").and_then(|c| c.as_any().downcast_ref::<UInt64Array>());
    let duration = col("duration_s").and_then(|c| c.as_any().downcast_ref::<Float64Array>());
    let mut span = Span {
        first: None,
        end: None,
        period_s: None,
    };
    let (Some(time), Some(index)) = (time, index) else {
        return span;
    };
    let mut last_sample: Option<(u64, f64)> = None;
    for i in 0..rows.len() {
        let (Some(at), Some(t)) = (Rows::get(index, i), Rows::get(time, i)) else {
            continue;
        };
        let block = rows.is_block(i);
        let (n, d) = match rows.kind(i) {
            Kind::Sample => {
                if let Some((_, u)) = last_sample.filter(|&(j, _)| at == j + 1) {
                    span.period_s = Some(t - u).filter(|p| *p > 0.0).or(span.period_s);
                }
                last_sample = Some((at, t));
                (1, None)
            }
            _ if !(block || rows.kind(i) == Kind::Gap) => continue,
            _ => match count.and_then(|c| Rows::get(c, i)) {
                Some(n) if n > 0 => {
                    let d = (duration.and_then(|c| Rows::get(c, i)))
                        .filter(|d| d.is_finite() && *d >= 0.0);
                    if block {
                        span.period_s = d.map(|d| d / n as f64).or(span.period_s);
                        last_sample = None;
                    }
                    (n, d)
                }
                _ => continue,
            },
        };
        span.first.get_or_insert((at, t));
        let end_t = d.map(|d| t + d).or(span.period_s.map(|p| t + n as f64 * p));
        span.end = Some(SpanEnd {
            index: at + n,
            time_s: end_t.unwrap_or(t),
        });
    }
    span
}

/// The first line of `text`.
fn one_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// Damaged batches after which a reader gives up on the rest of the file.
const MAX_DAMAGE: usize = 1000;

/// Runs an Arrow decode, turning a panic into its message (and keeping it off stderr).
fn decoding<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    thread_local!(static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    r.map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "the decoder failed".into())
    })
}

/// The `kind` column is a dictionary of kinds this code knows (block rows only where the
/// format has them), with keys inside it.
fn check_kinds(b: &RecordBatch, blocks: bool) -> Result<(), String> {
    let d = b
        .column(0)
        .as_any()
        .downcast_ref::<DictionaryArray<arrow_array::types::Int8Type>>()
        .ok_or("its first column is not the kind dictionary")?;
    let names = d
        .values()
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or("the kind dictionary does not hold strings")?;
    let known = |n: &str| Kind::from_name(n).is_some() || n == BLOCK;
    if let Some(n) = names.iter().find(|n| !n.is_some_and(known)) {
        return Err(format!("a kind {n:?} that no recording has"));
    }
    // Allowed: the key of a kind, or of a block where the format has them.
    let allowed: Vec<bool> = names.iter().map(|n| n != Some(BLOCK) || blocks).collect();
    if d.keys()
        .iter()
        .any(|k| k.is_none_or(|k| allowed.get(k as usize) != Some(&true)))
    {
        return Err("a kind outside its dictionary".into());
    }
    Ok(())
}

/// Prints a warning about a recording on stderr, once per process for each file and
/// words: a reader that reads a file several times (a plot, an export) says it once.
pub fn warn(path: &Path, words: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let line = format!("railtrace: warning: {}: {words}", path.display());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.contains(&line) {
        eprintln!("{line}");
        said.push(line);
    }
}

/// Record batches of a recording, in order; an error ends them.
pub type Batches<'a> = Box<dyn Iterator<Item = Result<RecordBatch, RecordingError>> + 'a>;

/// A recording that its consumers (export, plot) read batch by batch, from the start, as
/// many times as they need: a [`Recording`] in memory or a file being read ([`Reader`]).
pub trait Source {
    /// The file.
    fn path(&self) -> &Path;
    /// Its metadata.
    fn meta(&self) -> &Meta;
    /// Its schema.
    fn schema(&self) -> &SchemaRef;
    /// The writer closed it (see [`Recording::finalised`]).
    fn finalised(&self) -> bool;
    /// Every record batch from the first, with every column (`None`) or only the `kind`
    /// column and `columns` (for a file, the others are not even decompressed). A file is
    /// opened again for each call and read a batch at a time.
    fn batches(&self, columns: Option<&[&str]>) -> Result<Batches<'_>, RecordingError>;
}

impl Source for Recording {
    fn path(&self) -> &Path {
        &self.path
    }
    fn meta(&self) -> &Meta {
        &self.meta
    }
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }
    fn finalised(&self) -> bool {
        self.finalised
    }
    fn batches(&self, columns: Option<&[&str]>) -> Result<Batches<'_>, RecordingError> {
        let Some(columns) = columns else {
            return Ok(Box::new(self.batches.iter().cloned().map(Ok)));
        };
        // The same columns as a file would give, so that the callers' choice is tested.
        let p = projection(&self.schema, columns);
        Ok(Box::new(self.batches.iter().map(move |b| {
            b.project(&p).map_err(|error| RecordingError::Arrow {
                path: self.path.clone(),
                error,
            })
        })))
    }
}

impl Source for Reader {
    fn path(&self) -> &Path {
        &self.path
    }
    fn meta(&self) -> &Meta {
        &self.meta
    }
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }
    fn finalised(&self) -> bool {
        self.finalised
    }
    /// Reads the file again from the start ([`Reader::reopen`]); this reader's own place
    /// in it is left as it is.
    fn batches(&self, columns: Option<&[&str]>) -> Result<Batches<'_>, RecordingError> {
        Ok(Box::new(self.reopen(columns)?))
    }
}

/// Typed access to one record batch of a recording.
#[derive(Debug)]
pub struct Rows<'a> {
    batch: &'a RecordBatch,
    kinds: &'a Int8Array,
    /// The kind of each dictionary key (the dictionary may list the kinds in any order).
    of_key: Vec<Kind>,
    /// Which keys are block rows (batches of [`open_blocks`]).
    block_key: Vec<bool>,
}

impl<'a> Rows<'a> {
    /// Wraps a batch of a recording.
    pub fn new(batch: &'a RecordBatch) -> Rows<'a> {
        let dictionary = batch
            .column(0)
            .as_any()
            .downcast_ref::<DictionaryArray<arrow_array::types::Int8Type>>()
            .expect("the kind column, the first of a recording's batch");
        // A reader checks every batch's names and keys (check_kinds); a name it does not
        // know cannot reach here, and is read as a log row if it did.
        let names = dictionary.values().as_any().downcast_ref::<StringArray>();
        let of_key = names
            .map(|names| {
                names
                    .iter()
                    .map(|n| n.and_then(Kind::from_name).unwrap_or(Kind::Log))
                    .collect()
            })
            .unwrap_or_default();
        let block_key = names
            .map(|names| names.iter().map(|n| n == Some(BLOCK)).collect())
            .unwrap_or_default();
        Rows {
            batch,
            kinds: dictionary.keys(),
            of_key,
            block_key,
        }
    }

    /// Whether row `i` is a block row (only batches of [`open_blocks`] have them).
    pub fn is_block(&self, i: usize) -> bool {
        self.block_key
            .get(self.kinds.value(i) as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Each sample of block row `i` as `(tick, total_w)`, the values its sample row has,
    /// made by `derive` (the recording's [`Meta::derive`]); false (and nothing given) if
    /// the row is not a whole block.
    pub fn block_samples(&self, i: usize, derive: &Derive, mut f: impl FnMut(u64, f32)) -> bool {
        let (Some(step), Some(first)) = (
            (self.batch.column_by_name("period_ticks"))
                .and_then(|c| c.as_any().downcast_ref::<UInt32Array>())
                .and_then(|p| Rows::get(p, i)),
            (self.batch.column_by_name("tick"))
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
                .and_then(|t| Rows::get(t, i)),
        ) else {
            return false;
        };
        self.block_watts(i, derive, |k, w| {
            f(first + k as u64 * u64::from(step), w[w.len() - 1]);
        })
    }

    /// Each sample `k` of block row `i` as its watts per rail (NaN where a rail's volts or
    /// amperes are not measured) and then in total, the values its sample row has, made by
    /// `derive`; false (and nothing given) if the row is not a whole block. Sample `k` is
    /// at `time_s + k × period_ticks / tick_hz`.
    pub fn block_watts(&self, i: usize, derive: &Derive, mut f: impl FnMut(usize, &[f32])) -> bool {
        let (Some(count), Some(codes), Some(tick), Some(period)) = (
            self.batch
                .column_by_name("count")
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>()),
            (self.batch.column_by_name("codes"))
                .and_then(|c| c.as_any().downcast_ref::<arrow_array::ListArray>()),
            self.batch
                .column_by_name("tick")
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>()),
            (self.batch.column_by_name("period_ticks"))
                .and_then(|c| c.as_any().downcast_ref::<UInt32Array>()),
        ) else {
            return false;
        };
        let Some(values) = codes
            .values()
            .as_any()
            .downcast_ref::<arrow_array::Int16Array>()
        else {
            return false;
        };
        let ch = derive.channels.len();
        let n = count.value(i) as usize;
        let whole = [
            count.is_valid(i),
            codes.is_valid(i),
            tick.is_valid(i),
            period.is_valid(i),
        ];
        if whole.contains(&false) || codes.value_length(i) as usize != n * ch {
            return false;
        }
        let start = codes.value_offsets()[i] as usize;
        // Per rail measured both ways: where its volts and amperes are, and how they are
        // made (a rail missing either has no watts, and adds nothing to the total).
        let cal = |p: usize| (p, derive.cal[p].0, derive.cal[p].1);
        let rails: Vec<_> = (derive.rails.iter())
            .map(|&(v, a)| Some((cal(v?), cal(a?))))
            .collect();
        let mut watts = vec![f32::NAN; rails.len() + 1];
        for (k, row) in values.values()[start..start + n * ch]
            .chunks_exact(ch)
            .enumerate()
        {
            for (w, r) in watts.iter_mut().zip(&rails) {
                *w = r.map_or(f32::NAN, |((v, vs, vo), (a, as_, ao))| {
                    (f32::from(row[v]) * vs + vo) * (f32::from(row[a]) * as_ + ao)
                });
            }
            if let Some((total, rails)) = watts.split_last_mut() {
                *total = total_w(rails.iter().copied());
            }
            f(k, &watts);
        }
        true
    }

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    /// True when the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the number of rows of each kind, in [`Kind::ALL`] order, to `n`.
    pub fn count_kinds(&self, n: &mut [u64; KINDS]) {
        for i in 0..self.len() {
            n[self.kind(i).code() as usize] += 1;
        }
    }

    /// The kind of row `i`.
    pub fn kind(&self, i: usize) -> Kind {
        self.of_key
            .get(self.kinds.value(i) as usize)
            .copied()
            .unwrap_or(Kind::Log)
    }

    /// A Float64 column (`time_s`, `duration_s`, `logger_w`, ...).
    pub fn f64(&self, name: &str) -> &'a Float64Array {
        self.column(name)
    }

    /// A Float32 column (`<rail>_w`, `total_w`, ...).
    pub fn f32(&self, name: &str) -> &'a Float32Array {
        self.column(name)
    }

    /// A UInt64 column (`index`, `tick`, `count`, `tx_tick`).
    pub fn u64(&self, name: &str) -> &'a UInt64Array {
        self.column(name)
    }

    /// The `text` column.
    pub fn text(&self) -> &'a StringArray {
        self.column("text")
    }

    /// Any column by name and type.
    pub fn column<T: Array + 'static>(&self, name: &str) -> &'a T {
        self.batch
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<T>())
            .unwrap_or_else(|| panic!("a recording has a column {name} of the documented type"))
    }

    /// Value of row `i` of a nullable column.
    pub fn get<T: arrow_array::ArrowPrimitiveType>(
        a: &arrow_array::PrimitiveArray<T>,
        i: usize,
    ) -> Option<T::Native> {
        a.is_valid(i).then(|| a.value(i))
    }
}

impl Recording {
    /// Rows of every batch.
    pub fn rows(&self) -> impl Iterator<Item = Rows<'_>> {
        self.batches.iter().map(Rows::new)
    }

    /// Samples read, samples the gap rows count as missing, and whether a gap row of
    /// unknown length is there (a disconnection the capture could not count, a damaged
    /// last batch): with none, the first two add up to every sample taken.
    pub fn accounted(&self) -> (u64, u64, bool) {
        let (mut samples, mut gaps, mut open_ended) = (0, 0, false);
        for rows in self.rows() {
            for i in 0..rows.len() {
                match rows.kind(i) {
                    Kind::Sample => samples += 1,
                    Kind::Gap => match Rows::get(rows.u64("count"), i) {
                        Some(n) => gaps += n,
                        None => open_ended = true,
                    },
                    _ => {}
                }
            }
        }
        (samples, gaps, open_ended)
    }

    /// Number of rows of each kind, in [`Kind::ALL`] order.
    pub fn counts(&self) -> [u64; KINDS] {
        let mut n = [0u64; KINDS];
        for r in self.rows() {
            r.count_kinds(&mut n);
        }
        n
    }
}

/// The rig's recording beside a profile's: `profile.arrow` → `profile.rig.arrow`.
pub fn rig_path(profile: &Path) -> PathBuf {
    profile.with_extension("rig.arrow")
}

/// Host time now, ns since the Unix epoch: the host clock every bracket, every window and
/// every recording's epoch is on.
pub fn host_now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Civil UTC date and time of ns since the Unix epoch, ISO 8601.
pub fn iso_utc(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let (days, s) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in the temporary directory, removed when dropped.
    struct Temp(PathBuf);

    impl Temp {
        fn new(name: &str) -> Temp {
            let p = std::env::temp_dir().join(format!(
                "railtrace-recording-{}-{name}.arrow",
                std::process::id()
            ));
            Temp(p)
        }
    }

    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn meta() -> Meta {
        Meta {
            version: FORMAT_VERSION,
            source: "test".into(),
            epoch_utc_ns: 0,
            timebase: String::new(),
            rails: vec!["a".into(), "b".into()],
            code_channels: vec![0],
            device: None,
            rig: None,
            settings: None,
            derive: None,
        }
    }

    #[test]
    fn an_output_is_never_clobbered_nor_written_twice() {
        let t = Temp::new("claim");
        write(&t.0, 1, true);
        let before = std::fs::read(&t.0).unwrap();
        // Existing: refused, untouched.
        let e = Claim::new(&t.0, false).unwrap_err();
        assert!(matches!(e, RecordingError::Exists { .. }), "{e}");
        assert!(
            e.to_string().contains("already exists; give --force"),
            "{e}"
        );
        // Replacing is asked for, but another writer holds it: refused, untouched.
        let held = Claim::new(&t.0, true).unwrap();
        let e = Claim::new(&t.0, true).unwrap_err();
        assert!(matches!(e, RecordingError::Locked { .. }), "{e}");
        // A claim given up leaves an existing file as it was.
        held.abandon();
        assert_eq!(std::fs::read(&t.0).unwrap(), before);
        // A new file claimed and given up is gone again.
        let fresh = Temp::new("claim-fresh");
        Claim::new(&fresh.0, false).unwrap().abandon();
        assert!(!fresh.0.exists());
        // An output in a folder that does not exist is refused before anything starts.
        let e = check_output(Path::new("/nonexistent-railtrace/x.arrow"), true).unwrap_err();
        assert!(e.to_string().contains("No such file or directory"), "{e}");
        // A writer holds the lock for as long as it writes.
        let w = Writer::create(&fresh.0, &meta()).unwrap();
        assert!(matches!(
            Claim::new(&fresh.0, true),
            Err(RecordingError::Locked { .. })
        ));
        w.finish().unwrap();
        Claim::new(&fresh.0, true).unwrap();
    }

    /// Writes `batches` record batches of 100 samples each (and an event in the first);
    /// returns the file's length after each batch.
    fn write(path: &Path, batches: usize, finish: bool) -> Vec<u64> {
        let mut w = Writer::create(path, &meta()).unwrap();
        let mut ends = Vec::new();
        for b in 0..batches {
            if b == 0 {
                w.event(&Event::Text {
                    kind: Kind::Log,
                    time_s: 0.0,
                    text: "start".into(),
                });
            }
            for i in 0..100 {
                let k = (b * 100 + i) as u64;
                w.sample(
                    k as f64 * 1e-5,
                    Some(k),
                    None,
                    &[(12.0, 1.0), (3.3, 2.0)],
                    &[7],
                );
            }
            w.flush().unwrap();
            ends.push(w.bytes_written());
        }
        if finish {
            w.finish().unwrap();
        }
        ends
    }

    #[test]
    fn open_yields_the_good_batches_then_the_damage() {
        let f = Temp::new("damaged");
        let ends = write(&f.0, 3, true);
        // Cut the file in the middle of the last batch.
        let bytes = std::fs::read(&f.0).unwrap();
        let cut = (ends[1] + (ends[2] - ends[1]) / 2) as usize;
        std::fs::write(&f.0, &bytes[..cut]).unwrap();

        // The cut is found at opening; every complete batch before it is read.
        let mut r = open(&f.0).unwrap();
        assert!(!r.finalised);
        assert_eq!(r.meta, meta());
        let line = format!(
            "the file ends inside record batch 3 (at byte {} of {cut}); read up to the batch before",
            ends[1]
        );
        assert_eq!(r.damage(), std::slice::from_ref(&line));
        assert_eq!(r.next().unwrap().unwrap().num_rows(), 101);
        assert_eq!((r.batches_read(), r.rows_read()), (1, 101));
        assert_eq!(r.next().unwrap().unwrap().num_rows(), 100);
        assert!(r.next().is_none(), "nothing after the cut");
        // `read` reads the same, saying the same.
        let rec = read(&f.0).unwrap();
        assert_eq!(rec.counts()[0], 200);
        assert_eq!(rec.damage, [line]);
    }

    /// Samples and events of every batch, as one comparable list.
    fn rows_of(r: &Recording) -> Vec<(Kind, u64, String)> {
        let mut v = Vec::new();
        for rows in r.rows() {
            for i in 0..rows.len() {
                let index = Rows::get(rows.u64("index"), i).unwrap_or(u64::MAX);
                let t = rows.text();
                let text = if t.is_null(i) {
                    String::new()
                } else {
                    t.value(i).to_string()
                };
                v.push((rows.kind(i), index, text));
            }
        }
        v
    }

    #[test]
    fn a_file_cut_at_any_byte_of_its_last_batch_reads_every_batch_before() {
        let f = Temp::new("cut-everywhere");
        let ends = write(&f.0, 3, false);
        let bytes = std::fs::read(&f.0).unwrap();
        let whole = rows_of(&read(&f.0).unwrap());
        let cut = Temp::new("cut-everywhere-cut");
        for at in ends[1]..ends[2] {
            std::fs::write(&cut.0, &bytes[..at as usize]).unwrap();
            let r = read(&cut.0).unwrap_or_else(|e| panic!("cut at {at}: {e}"));
            assert_eq!(rows_of(&r), whole[..201], "cut at {at}");
            if at > ends[1] {
                assert_eq!(r.damage.len(), 1, "cut at {at}");
                assert!(
                    r.damage[0].contains("ends inside record batch 3"),
                    "{:?}",
                    r.damage
                );
            }
        }
    }

    #[test]
    fn a_damaged_batch_is_a_gap_row_of_exactly_its_samples() {
        let f = Temp::new("hole");
        let ends = write(&f.0, 3, true);
        // One bit flipped inside the middle batch's samples.
        let mut bytes = std::fs::read(&f.0).unwrap();
        bytes[(ends[0] + (ends[1] - ends[0]) / 2) as usize] ^= 0x10;
        std::fs::write(&f.0, &bytes).unwrap();
        let gap_columns = ["total_w", "time_s", "index", "count", "duration_s", "text"];
        for columns in [None, Some(&gap_columns[..])] {
            let r = match columns {
                None => open(&f.0).unwrap(),
                Some(c) => open_columns(&f.0, c).unwrap(),
            };
            let batches = r.collect::<Result<Vec<_>, _>>().unwrap();
            let rec = Recording {
                batches,
                ..read(&f.0).unwrap()
            };
            assert_eq!(rec.damage.len(), 1, "{:?}", rec.damage);
            type GapRow = (f64, Option<u64>, Option<u64>, Option<f64>, String);
            let gaps: Vec<GapRow> = rec
                .rows()
                .flat_map(|rows| {
                    (0..rows.len())
                        .filter(|&i| rows.kind(i) == Kind::Gap)
                        .map(|i| {
                            (
                                rows.f64("time_s").value(i),
                                Rows::get(rows.u64("index"), i),
                                Rows::get(rows.u64("count"), i),
                                Rows::get(rows.f64("duration_s"), i),
                                rows.text().value(i).to_string(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(gaps.len(), 1, "{gaps:?}");
            let (t, index, count, duration, cause) = &gaps[0];
            assert_eq!((*index, *count), (Some(100), Some(100)), "{gaps:?}");
            assert!((t - 100e-5).abs() < 1e-12 && (duration.unwrap() - 100e-5).abs() < 1e-12);
            assert_eq!(cause, DAMAGED_BATCH);
            assert_eq!(rec.accounted(), (200, 100, false));
        }
        // The same with the samples in block rows: every one of them is read or in a gap.
        write_blocks(&f.0, false);
        let whole = read(&f.0).unwrap().accounted();
        let bytes = std::fs::read(&f.0).unwrap();
        let (mut holes, mut open_ended) = (0, 0);
        for i in (0..bytes.len()).step_by(37) {
            let mut b = bytes.clone();
            b[i] ^= 1 << (i % 8);
            std::fs::write(&f.0, &b).unwrap();
            let Ok(r) = read(&f.0) else { continue };
            let (samples, gaps, unknown) = r.accounted();
            if unknown {
                open_ended += 1;
                continue;
            }
            assert_eq!(
                samples + gaps,
                whole.0 + whole.1,
                "flip at byte {i}: {:?}",
                r.damage
            );
            holes += usize::from(samples < whole.0);
        }
        assert!(
            holes > 0 && open_ended > 0,
            "{holes} holes, {open_ended} open-ended"
        );
    }

    #[test]
    fn a_flipped_bit_anywhere_never_panics_and_a_damaged_batch_is_named() {
        let f = Temp::new("flips");
        write(&f.0, 2, true);
        flips(&f);
        // And one whose samples are in block rows (the list of codes, the derive).
        write_blocks(&f.0, false);
        flips(&f);
    }

    fn flips(f: &Temp) {
        let bytes = std::fs::read(&f.0).unwrap();
        let whole = read(&f.0).unwrap().batches;
        let flipped = Temp::new("flips-flipped");
        let (mut refused, mut named, mut same, mut differ) = (0, 0, 0, 0);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1 << (i % 8);
            std::fs::write(&flipped.0, &b).unwrap();
            match read(&flipped.0) {
                Err(e) => {
                    assert!(!e.to_string().contains('\n'), "{e}");
                    refused += 1;
                }
                Ok(r) if !r.damage.is_empty() => named += 1,
                Ok(r) if r.batches == whole => same += 1,
                Ok(_) => differ += 1,
            }
        }
        eprintln!(
            "{} flips: {refused} refused (the schema), {named} named as damage, {same} read the same, {differ} read otherwise",
            bytes.len()
        );
        // Every message is sealed: no flip is read as other data.
        assert_eq!(differ, 0);
        assert!(named > 0 && refused > 0);
    }

    /// Per-rail (volts, amperes) of one sample's codes, worked out here from the
    /// calibration of [`blocks_meta`], as a capture did for every sample before blocks.
    fn by_hand(codes: &[i16]) -> [(f32, f32); 3] {
        let v = |i: usize, scale: f32, offset: f32| f32::from(codes[i]) * scale + offset;
        [
            (v(1, 0.001, 0.0), v(0, 0.01, 0.1)),
            (v(3, 0.0005, 0.0), v(2, 0.02, -0.5)),
            (f32::NAN, v(0, 0.01, 0.1)),
        ]
    }

    fn blocks_meta() -> Meta {
        Meta {
            rails: vec!["a".into(), "b".into(), "c".into()],
            code_channels: vec![0, 1, 2, 3, 5],
            derive: Some(Derive {
                tick_hz: 1e6,
                channels: vec![0, 1, 2, 3],
                cal: vec![(0.01, 0.1), (0.001, 0.0), (0.02, -0.5), (0.0005, 0.0)],
                rails: vec![(Some(1), Some(0)), (Some(3), Some(2)), (None, Some(0))],
            }),
            ..meta()
        }
    }

    /// Runs of samples (codes from a fixed seed) and events between them, written as
    /// block rows or (`as_rows`) one sample row each with the values worked out by hand.
    fn write_blocks(path: &Path, as_rows: bool) {
        let mut w = Writer::create(path, &blocks_meta()).unwrap();
        let mut x: u32 = 2024;
        let mut next = || {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 16) as i16
        };
        // (first index, first tick, first time): a run goes on, is cut by an event, by a
        // flush, by a jump of the clock (a new anchor), and by a gap.
        let runs = [
            (0u64, 1000u64, 0.5f64, false),
            (40, 1400, 0.5 + 40e-5, false),
            (80, 1800, 0.5 + 80e-5, true),
            (120, 2200, 0.5 + 120e-5 + 3e-6, false),
            (200, 3000, 0.5 + 200e-5 + 3e-6, false),
        ];
        for (r, &(index, tick, time_s, event)) in runs.iter().enumerate() {
            let codes: Vec<i16> = (0..40 * 4).map(|_| next()).collect();
            if as_rows {
                for k in 0..40 {
                    let c = &codes[k * 4..k * 4 + 4];
                    w.sample(
                        time_s + k as f64 * (10.0 / 1e6),
                        Some(index + k as u64),
                        Some(tick + 10 * k as u64),
                        &by_hand(c),
                        &[c[0], c[1], c[2], c[3], 0],
                    );
                }
            } else {
                w.block(time_s, index, tick, 10, 10.0 / 1e6, &codes);
            }
            if event {
                w.event(&Event::Text {
                    kind: Kind::Log,
                    time_s,
                    text: format!("after run {r}"),
                });
            }
            if r == 1 {
                w.flush().unwrap();
            }
        }
        w.finish().unwrap();
    }

    #[test]
    fn block_rows_read_back_as_the_sample_rows_they_hold() {
        let (blocks, rows) = (Temp::new("blocks"), Temp::new("blocks-as-rows"));
        write_blocks(&blocks.0, false);
        write_blocks(&rows.0, true);
        let (a, b) = (read(&blocks.0).unwrap(), read(&rows.0).unwrap());
        assert!(a.damage.is_empty() && b.damage.is_empty());
        assert_eq!(a.schema.fields(), b.schema.fields());
        assert_eq!(a.counts(), b.counts());
        assert_eq!(a.counts()[0], 200);
        assert_eq!(a.batches.len(), b.batches.len());
        for (x, y) in a.batches.iter().zip(&b.batches) {
            for (f, (cx, cy)) in a
                .schema
                .fields()
                .iter()
                .zip(x.columns().iter().zip(y.columns()))
            {
                if f.name() != "time_s" {
                    assert_eq!(cx, cy, "{}", f.name());
                    continue;
                }
                // Counted on from the block's first sample, here as by the writer of rows:
                // equal to a few ulps of 0.5 s.
                let (tx, ty) = (Rows::new(x).f64("time_s"), Rows::new(y).f64("time_s"));
                for i in 0..x.num_rows() {
                    assert!((tx.value(i) - ty.value(i)).abs() < 1e-12, "row {i}");
                }
            }
        }
        // Read a few columns at a time, the same.
        let some = open_columns(&blocks.0, &["c_a", "total_w", "code5"]).unwrap();
        let names: Vec<String> = some
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let all = read(&blocks.0).unwrap();
        let mut n = 0;
        for (got, whole) in some.zip(&all.batches) {
            let got = got.unwrap();
            let want = whole
                .project(&projection(&all.schema, &["c_a", "total_w", "code5"]))
                .unwrap();
            assert_eq!(got, want);
            n += got.num_rows();
        }
        assert_eq!(n, 201);
        assert_eq!(names.len(), table_schema(&blocks_meta()).fields().len());
    }

    /// The largest `total_w_max` of the fine summaries from the one at `t` up to `k`.
    fn samples_max_between(fine: &Recording, t: f64, k: usize) -> f32 {
        let mut all = Vec::new();
        for r in fine.rows() {
            for i in 0..r.len() {
                all.push((r.f64("time_s").value(i), r.f32("total_w_max").value(i)));
            }
        }
        let from = all.iter().position(|x| x.0 == t).unwrap();
        all[from..k]
            .iter()
            .map(|x| x.1)
            .fold(f32::NEG_INFINITY, f32::max)
    }

    #[test]
    fn the_overview_summarises_every_sample_never_across_a_gap_without_reading_the_samples() {
        let f = Temp::new("overview");
        let mut w = Writer::create(&f.0, &blocks_meta()).unwrap();
        let mut x: u32 = 7;
        let mut next = || {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 20) as i16
        };
        // 400 000 samples in blocks of 50, a gap of 1 000 after the first 123 450, and
        // events every 10 000 samples.
        let (mut index, mut time) = (0u64, 1.0f64);
        while index < 401_000 {
            if index == 123_450 {
                w.event(&Event::Gap {
                    time_s: time,
                    index: Some(index),
                    samples: Some(1000),
                    duration_s: 1000.0 * 1e-5,
                    cause: "test".into(),
                });
                index += 1000;
                time += 1000.0 * 1e-5;
            }
            if index % 10_000 == 0 {
                w.event(&Event::Text {
                    kind: Kind::Status,
                    time_s: time,
                    text: "{}".into(),
                });
            }
            let codes: Vec<i16> = (0..50 * 4).map(|_| next()).collect();
            w.block(time, index, index * 10, 10, 1e-5, &codes);
            index += 50;
            time += 50.0 * 1e-5;
            w.maybe_flush().unwrap();
        }
        w.finish().unwrap();
        let len = std::fs::metadata(&f.0).unwrap().len();
        let coarse = overview(&f.0)
            .unwrap()
            .expect("a closed recording has an overview");
        assert!(coarse.coarse, "the last batch is the coarse level");
        assert!(
            coarse.bytes_read * 100 < len,
            "{} of {len} bytes",
            coarse.bytes_read
        );
        let ov = coarse.finer().unwrap().expect("and a fine level");
        assert!(
            !ov.coarse && ov.bytes_read * 10 < len,
            "{} of {len} bytes",
            ov.bytes_read
        );
        assert!(ov.finer().unwrap().is_none());
        // The coarse level: each of its rows the fine ones it gathers.
        let fine: Vec<(f64, u64)> = ov
            .recording
            .rows()
            .flat_map(|r| {
                (0..r.len())
                    .map(|i| (r.f64("time_s").value(i), r.u64("count").value(i)))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut k = 0;
        for r in coarse.recording.rows() {
            for i in 0..r.len() {
                let (t, n) = (r.f64("time_s").value(i), r.u64("count").value(i));
                assert_eq!(fine[k].0, t);
                let (mut m, mut parts) = (0, 0);
                while m < n {
                    m += fine[k].1;
                    k += 1;
                    parts += 1;
                }
                assert_eq!(m, n);
                assert!(parts <= SUMMARY_LEVEL);
                assert_eq!(
                    r.f32("total_w_max").value(i),
                    samples_max_between(&ov.recording, t, k)
                );
            }
        }
        assert_eq!(k, fine.len());
        // The table leaves the summaries out; its samples, in order, against them.
        let table = read(&f.0).unwrap();
        assert!(table.damage.is_empty(), "{:?}", table.damage);
        let mut samples = Vec::new(); // (time, watts per rail and total)
        let mut gaps = Vec::new();
        for rows in table.rows() {
            assert!((0..rows.len()).all(|i| rows.kind(i) != Kind::Summary));
            for i in 0..rows.len() {
                let t = rows.f64("time_s").value(i);
                match rows.kind(i) {
                    Kind::Sample => {
                        let w: Vec<Option<f32>> = ["a_w", "b_w", "c_w", "total_w"]
                            .iter()
                            .map(|c| Rows::get(rows.f32(c), i))
                            .collect();
                        samples.push((t, w));
                    }
                    Kind::Gap => gaps.push(t),
                    _ => {}
                }
            }
        }
        assert_eq!(samples.len(), 400_000);
        let mut at = 0;
        let mut apart = Vec::new(); // where one summary ends and the next starts later
        let mut end: Option<f64> = None;
        for rows in ov.recording.rows() {
            for i in 0..rows.len() {
                let t = rows.f64("time_s").value(i);
                assert_eq!(rows.kind(i), Kind::Summary);
                let n = rows.u64("count").value(i) as usize;
                assert!(n as u64 <= SUMMARY_SAMPLES);
                let covered = &samples[at..at + n];
                // Its time is the first sample's, to the rounding of counting on from a block's
                // first (the writer from each block's, the reader from the row's).
                assert!(
                    (covered[0].0 - t).abs() < 1e-9,
                    "a summary starts at its first sample"
                );
                let last = covered[n - 1].0;
                assert!((t + rows.f64("duration_s").value(i) - last).abs() < 1e-9);
                assert!(
                    gaps.iter().all(|&g| !(t < g && g < last)),
                    "never across a gap"
                );
                for (s, name) in ["a", "b", "c", "total"].iter().enumerate() {
                    let values: Vec<f32> = covered.iter().filter_map(|c| c.1[s]).collect();
                    let col = |suffix: &str| Rows::get(rows.f32(&format!("{name}_w{suffix}")), i);
                    if values.is_empty() {
                        assert_eq!((col(""), col("_min"), col("_max")), (None, None, None));
                        continue;
                    }
                    let min = values.iter().copied().fold(f32::INFINITY, f32::min);
                    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mean =
                        values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
                    assert_eq!((col("_min"), col("_max")), (Some(min), Some(max)), "{name}");
                    // The mean is summed in f64 and stored as f32: within an f32's rounding.
                    let got = f64::from(col("").unwrap());
                    assert!(
                        (got - mean).abs() <= 1e-6 * mean.abs().max(1.0),
                        "{name}: {got} against {mean}"
                    );
                }
                if end.is_some_and(|e| t - e > 1.5e-5) {
                    apart.push(end.unwrap_or(0.0));
                }
                end = Some(last);
                at += n;
            }
        }
        assert_eq!(at, samples.len(), "every sample is in one summary");
        // The gap is where the summaries are apart: it starts one period after the last.
        assert_eq!(apart.len(), gaps.len());
        assert!(
            (apart[0] + 1e-5 - gaps[0]).abs() < 1e-9,
            "{apart:?} {gaps:?}"
        );
        // A file not closed has none (its samples are read instead).
        let cut = Temp::new("overview-cut");
        std::fs::write(&cut.0, &std::fs::read(&f.0).unwrap()[..len as usize - 8]).unwrap();
        assert!(overview(&cut.0).unwrap().is_none());
    }

    #[test]
    fn a_kind_dictionary_in_another_order_reads_the_same() {
        let f = Temp::new("dictionary");
        write(&f.0, 2, true);
        let original = read(&f.0).unwrap();
        // The same rows, with the dictionary's names reversed and the keys to match, as
        // another Arrow writer may order them.
        let other = Temp::new("dictionary-reversed");
        {
            let mut w =
                StreamWriter::try_new(File::create(&other.0).unwrap(), &original.schema).unwrap();
            for b in &original.batches {
                let d = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<DictionaryArray<arrow_array::types::Int8Type>>()
                    .unwrap();
                let n = d.values().len() as i8;
                let names: StringArray = (0..n)
                    .rev()
                    .map(|k| Some(Kind::ALL[k as usize].name()))
                    .collect();
                let keys: Int8Array = d.keys().iter().map(|k| k.map(|k| n - 1 - k)).collect();
                let kind = DictionaryArray::try_new(keys, Arc::new(names)).unwrap();
                let mut columns = b.columns().to_vec();
                columns[0] = Arc::new(kind);
                w.write(&RecordBatch::try_new(b.schema(), columns).unwrap())
                    .unwrap();
            }
            w.finish().unwrap();
        }
        let reordered = read(&other.0).unwrap();
        assert_eq!(reordered.counts(), original.counts());
        assert_eq!(rows_of(&reordered), rows_of(&original));
        assert_eq!(reordered.counts()[0], 200);
    }

    #[test]
    fn a_whole_recording_reads_the_same_either_way() {
        let f = Temp::new("whole");
        write(&f.0, 3, true);
        let rec = read(&f.0).unwrap();
        assert!(rec.finalised);
        assert_eq!(rec.batches.len(), 3);
        assert_eq!(rec.counts()[0], 300);
        assert_eq!(rec.counts()[Kind::Log.code() as usize], 1);
        let r = open(&f.0).unwrap();
        assert!(r.finalised);
        assert_eq!(r.schema, rec.schema);
        let batches: Vec<RecordBatch> = r.map(Result::unwrap).collect();
        assert_eq!(batches, rec.batches);
        // Read ahead on a thread of its own: the same batches in the same order.
        let ahead: Vec<RecordBatch> = (open(&f.0).unwrap().read_ahead())
            .map(Result::unwrap)
            .collect();
        assert_eq!(ahead, rec.batches);
    }

    /// A file cut inside its last batch reads ahead as it reads: the batches before the
    /// cut, then the end; a caller that stops early drops the reader ahead without
    /// waiting on it (its thread's next send fails and it ends).
    #[test]
    fn reading_ahead_gives_what_reading_gives_and_stops_when_the_caller_does() {
        let f = Temp::new("ahead");
        let ends = write(&f.0, 3, true);
        let bytes = std::fs::read(&f.0).unwrap();
        std::fs::write(&f.0, &bytes[..(ends[1] + 5) as usize]).unwrap();
        let plain: Vec<usize> = open(&f.0).unwrap().map(|b| b.unwrap().num_rows()).collect();
        let ahead: Vec<usize> = (open(&f.0).unwrap().read_ahead())
            .map(|b| b.unwrap().num_rows())
            .collect();
        assert_eq!(plain, [101, 100]);
        assert_eq!(ahead, plain);
        let mut first = open(&f.0).unwrap().read_ahead();
        assert_eq!(first.next().unwrap().unwrap().num_rows(), 101);
        drop(first);
    }

    #[test]
    fn a_reader_reads_what_the_file_held_when_opened() {
        let f = Temp::new("growing");
        let ends = write(&f.0, 2, false);
        let r = open(&f.0).unwrap();
        assert!(!r.finalised);
        // A writer appends half a batch after the reader opened the file.
        let bytes = std::fs::read(&f.0).unwrap();
        let half = &bytes[ends[0] as usize..(ends[0] + (ends[1] - ends[0]) / 2) as usize];
        let mut file = std::fs::OpenOptions::new().append(true).open(&f.0).unwrap();
        file.write_all(half).unwrap();
        drop(file);
        let again = r.reopen(None).unwrap();
        let rows: usize = r.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 201);
        let rows: usize = again.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 201);
        // Opened now, it holds the half batch: read up to it, and said.
        let rec = read(&f.0).unwrap();
        assert_eq!(rec.counts()[0], 200);
        assert_eq!(rec.damage.len(), 1, "{:?}", rec.damage);
    }

    #[test]
    fn only_the_columns_asked_for_are_read() {
        let f = Temp::new("columns");
        write(&f.0, 2, true);
        let names = |b: &RecordBatch| -> Vec<String> {
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect()
        };
        let r = open_columns(&f.0, &["b_w", "time_s", "no_such_column"]).unwrap();
        assert_eq!(
            r.schema.fields().len(),
            table_schema(&meta()).fields().len()
        );
        let batches: Vec<RecordBatch> = r.map(Result::unwrap).collect();
        assert_eq!(batches.len(), 2);
        assert_eq!(names(&batches[0]), ["kind", "time_s", "b_w"]);
        let rows = Rows::new(&batches[0]);
        assert_eq!(rows.kind(0), Kind::Log);
        assert_eq!(rows.kind(1), Kind::Sample);
        assert_eq!(rows.f32("b_w").value(1), 6.6);
        // A recording in memory gives the same columns.
        let rec = read(&f.0).unwrap();
        let same: Vec<RecordBatch> = rec
            .batches(Some(&["b_w", "time_s", "no_such_column"]))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(same, batches);
    }

    /// Rewrites the recording at `from` into `to` as format `version` would have written
    /// it: without the columns `drop`, its metadata saying `version`.
    fn rewrite_as(from: &Path, to: &Path, version: u32, drop: &[&str]) {
        let r = StreamReader::try_new(BufReader::new(File::open(from).unwrap()), None).unwrap();
        let schema = r.schema();
        let blocks: &[&str] = if version < BLOCKS_SINCE {
            &["period_ticks", "codes"]
        } else {
            &[]
        };
        let summaries =
            |n: &str| version < BLOCKS_SINCE && (n.ends_with("_w_min") || n.ends_with("_w_max"));
        let keep: Vec<usize> = (0..schema.fields().len())
            .map(|i| schema.field(i).name().as_str())
            .enumerate()
            .filter(|(_, n)| !drop.contains(n) && !blocks.contains(n) && !summaries(n))
            .filter(|(_, n)| version >= LOGGER_AVERAGE_SINCE || *n != "logger_average_w")
            .filter(|(_, n)| version >= LOGGER_ENERGY_SINCE || *n != "logger_energy_j")
            .map(|(i, _)| i)
            .collect();
        let mut md = schema.metadata().clone();
        let mut meta: Meta = serde_json::from_str(md.get("railtrace").unwrap()).unwrap();
        meta.version = version;
        md.insert("railtrace", serde_json::to_string(&meta).unwrap());
        let old = Arc::new(schema.project(&keep).unwrap().with_metadata(md));
        let mut w = StreamWriter::try_new(File::create(to).unwrap(), &old).unwrap();
        for b in r {
            let b = b.unwrap();
            // Before version 5, no summary rows.
            let rows = Rows::new(&b);
            let keep_row: arrow_array::BooleanArray = (0..rows.len())
                .map(|i| Some(version >= BLOCKS_SINCE || rows.kind(i) != Kind::Summary))
                .collect();
            let b = arrow_select::filter::filter_record_batch(&b, &keep_row).unwrap();
            let b = b.project(&keep).unwrap();
            w.write(&RecordBatch::try_new(old.clone(), b.columns().to_vec()).unwrap())
                .unwrap();
        }
        w.finish().unwrap();
    }

    /// A recording of this version with two logger readings (the first with a
    /// temperature, an average and a source, the second with an energy counter).
    fn write_with_logger(path: &Path) {
        let mut w = Writer::create(path, &meta()).unwrap();
        w.sample(0.0, Some(0), None, &[(12.0, 1.0), (3.3, 2.0)], &[7]);
        for (k, temperature_c) in [(0u32, Some(61.5)), (1, None)] {
            w.event(&Event::Logger {
                time_s: f64::from(k) * 1e-3,
                power_w: 300.0 + f64::from(k),
                instant_w: None,
                average_w: temperature_c.map(|_| 290.5),
                temperature_c,
                energy_j: temperature_c.is_none().then_some(12_345.678),
                source: temperature_c.map(|_| "nvml-fields".to_string()),
                gpu_ticks: Some(u64::from(k)),
                host_ns: None,
                own_s: None,
                polled_ns: None,
            });
        }
        w.finish().unwrap();
    }

    #[test]
    fn the_logger_temperature_is_written_and_read_back() {
        let f = Temp::new("temperature");
        write_with_logger(&f.0);
        let rec = read(&f.0).unwrap();
        assert_eq!(rec.meta.version, FORMAT_VERSION);
        let field = rec.schema.field_with_name("logger_temp_c").unwrap();
        assert_eq!(field.data_type(), &DataType::Float64);
        assert_eq!(field.metadata()["unit"], "degC");
        // Right after logger_instant_w.
        let at = |name: &str| rec.schema.index_of(name).unwrap();
        assert_eq!(at("logger_temp_c"), at("logger_instant_w") + 1);
        let rows = Rows::new(&rec.batches[0]);
        let t = rows.f64("logger_temp_c");
        assert_eq!((rows.kind(1), Rows::get(t, 1)), (Kind::Logger, Some(61.5)));
        assert_eq!(Rows::get(t, 2), None);
        assert_eq!(Rows::get(t, 0), None, "a sample row");
        assert!(!open(&f.0).unwrap().upgrading());
    }

    #[test]
    fn the_loggers_average_is_kept_and_reads_null_before_version_6() {
        let f = Temp::new("average");
        write_with_logger(&f.0);
        let rec = read(&f.0).unwrap();
        let field = rec.schema.field_with_name("logger_average_w").unwrap();
        assert_eq!(field.metadata()["unit"], "W");
        let at = |name: &str| rec.schema.index_of(name).unwrap();
        assert_eq!(at("logger_average_w"), at("logger_temp_c") + 1);
        let rows = Rows::new(&rec.batches[0]);
        let a = rows.f64(LoggerColumn::Average.column());
        assert_eq!((Rows::get(a, 1), Rows::get(a, 2)), (Some(290.5), None));
        // A version 5 file has no such column: read, it is there, all null.
        let v5 = Temp::new("average-v5");
        rewrite_as(&f.0, &v5.0, 5, &[]);
        let rec5 = read(&v5.0).unwrap();
        assert_eq!(rec5.schema.fields().len(), rec.schema.fields().len());
        let rows = Rows::new(&rec5.batches[0]);
        assert_eq!(rows.f64("logger_average_w").null_count(), rows.len());
        assert_eq!(Rows::get(rows.f64("logger_w"), 1), Some(300.0));
        // But a version 6 file must have it.
        let bad = Temp::new("average-missing");
        rewrite_as(&f.0, &bad.0, 6, &["logger_average_w"]);
        let e = open(&bad.0).unwrap_err().to_string();
        assert!(e.contains("its columns are not the ones"), "{e}");
    }

    #[test]
    fn the_loggers_energy_counter_and_source_are_kept_and_read_null_before_version_7() {
        let f = Temp::new("energy");
        write_with_logger(&f.0);
        let rec = read(&f.0).unwrap();
        let field = rec.schema.field_with_name("logger_energy_j").unwrap();
        assert_eq!(field.data_type(), &DataType::Float64);
        assert_eq!(field.metadata()["unit"], "J");
        let at = |name: &str| rec.schema.index_of(name).unwrap();
        assert_eq!(at("logger_energy_j"), at("logger_average_w") + 1);
        let rows = Rows::new(&rec.batches[0]);
        let e = rows.f64("logger_energy_j");
        assert_eq!((Rows::get(e, 1), Rows::get(e, 2)), (None, Some(12_345.678)));
        assert_eq!(Rows::get(e, 0), None, "a sample row");
        let text = rows.text();
        assert_eq!((text.is_valid(1), text.value(1)), (true, "nvml-fields"));
        assert!(text.is_null(2), "a reading that names no source");
        // A version 6 file has no such column: read, it is there, all null.
        let v6 = Temp::new("energy-v6");
        rewrite_as(&f.0, &v6.0, 6, &[]);
        let rec6 = read(&v6.0).unwrap();
        assert_eq!(rec6.meta.version, 6);
        assert_eq!(rec6.schema.fields().len(), rec.schema.fields().len());
        let rows = Rows::new(&rec6.batches[0]);
        assert_eq!(rows.f64("logger_energy_j").null_count(), rows.len());
        assert_eq!(Rows::get(rows.f64("logger_average_w"), 1), Some(290.5));
        // But a version 7 file must have it.
        let bad = Temp::new("energy-missing");
        rewrite_as(&f.0, &bad.0, 7, &["logger_energy_j"]);
        let e = open(&bad.0).unwrap_err().to_string();
        assert!(e.contains("its columns are not the ones"), "{e}");
    }

    #[test]
    fn logger_columns_are_named_either_way() {
        for c in LoggerColumn::ALL {
            assert_eq!(c.smi_name().parse::<LoggerColumn>(), Ok(c));
            assert_eq!(c.column().parse::<LoggerColumn>(), Ok(c));
        }
        let e = "power".parse::<LoggerColumn>().unwrap_err();
        assert!(e.contains("power.draw.instant (logger_instant_w)"), "{e}");
    }

    #[test]
    fn versions_2_and_3_still_read_their_temperature_null() {
        let v4 = Temp::new("v4");
        write_with_logger(&v4.0);
        for version in [2, 3] {
            let f = Temp::new(&format!("v{version}"));
            rewrite_as(&v4.0, &f.0, version, &["logger_temp_c"]);
            let rec = read(&f.0).unwrap();
            assert_eq!(rec.meta.version, version, "the file's version, as it is");
            assert!(rec.finalised);
            // This version's columns, the missing one added.
            let now = table_schema(&meta());
            let names = |s: &Schema| -> Vec<String> {
                s.fields().iter().map(|f| f.name().clone()).collect()
            };
            assert_eq!(names(&rec.schema), names(&now));
            let rows = Rows::new(&rec.batches[0]);
            assert_eq!(rows.len(), 3);
            assert_eq!(rows.f64("logger_temp_c").null_count(), 3);
            assert_eq!(Rows::get(rows.f64("logger_w"), 1), Some(300.0));
            assert_eq!(rows.f32("b_w").value(0), 6.6);
            // A batch at a time, and a few columns only, the same.
            let r = open(&f.0).unwrap();
            assert!(r.upgrading());
            assert_eq!(r.schema, rec.schema);
            let batches: Vec<RecordBatch> = r.map(Result::unwrap).collect();
            assert_eq!(batches, rec.batches);
            let wanted = ["logger_temp_c", "logger_w", "time_s"];
            let r = open_columns(&f.0, &wanted).unwrap();
            let b: Vec<RecordBatch> = r.map(Result::unwrap).collect();
            let got: Vec<String> = names(&b[0].schema());
            assert_eq!(got, ["kind", "time_s", "logger_w", "logger_temp_c"]);
            assert_eq!(Rows::new(&b[0]).f64("logger_temp_c").null_count(), 3);
            let same: Vec<RecordBatch> = rec
                .batches(Some(&wanted))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert_eq!(same, b);
            let r = open_columns(&f.0, &["logger_w"]).unwrap();
            let b: Vec<RecordBatch> = r.map(Result::unwrap).collect();
            assert_eq!(names(&b[0].schema()), ["kind", "logger_w"]);
        }
    }

    #[test]
    fn the_temperature_column_is_missing_only_before_version_4() {
        let v4 = Temp::new("v4-columns");
        write_with_logger(&v4.0);
        let f = Temp::new("v4-without");
        rewrite_as(&v4.0, &f.0, 4, &["logger_temp_c"]);
        let e = open(&f.0).unwrap_err().to_string();
        assert!(
            e.contains("its columns are not the ones its railtrace metadata describes"),
            "{e}"
        );
        rewrite_as(&v4.0, &f.0, 3, &[]);
        let e = open(&f.0).unwrap_err().to_string();
        assert!(
            e.contains("its columns are not the ones its railtrace metadata describes"),
            "{e}"
        );
        rewrite_as(&v4.0, &f.0, 4, &[]);
        assert!(open(&f.0).is_ok());
        rewrite_as(&v4.0, &f.0, 8, &[]);
        let e = open(&f.0).unwrap_err().to_string();
        assert!(
            e.contains("recording format version 8; this railtrace reads versions 2 to 7"),
            "{e}"
        );
    }

    #[test]
    fn files_that_are_not_recordings_are_refused_at_open() {
        let f = Temp::new("foreign");
        for (bytes, words) in [
            (&b""[..], "the file is empty"),
            (b"PAR1\0\0\0\0PAR1", "a Parquet file"),
            (b"ARROW1\0\0", "an Arrow IPC file"),
            (b"time,power\n", "not an Arrow IPC stream"),
            (
                &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0],
                "not a readable Arrow IPC stream",
            ),
        ] {
            std::fs::write(&f.0, bytes).unwrap();
            let e = open(&f.0).unwrap_err().to_string();
            assert!(
                e.contains("not a railtrace recording") && e.contains(words),
                "{e}"
            );
        }
        std::fs::remove_file(&f.0).unwrap();
        let e = open(&f.0).unwrap_err();
        assert!(matches!(e, RecordingError::Io { .. }), "{e}");
    }
}
