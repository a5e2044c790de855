//! The truth, written while the twin runs, so that any later stage can be scored: Arrow
//! IPC stream files (the format the host records in; pyarrow, polars and arrow-rs read
//! them as they are), flushed every half second, plus the clocks' parameters.
//!
//! In the directory given:
//! - `gpu_power.arrow`: the GPU's true power, piecewise constant: `start_s`, `end_s`,
//!   `power_w`, `util_compute`, `util_memory`, `util_other`, then the GPU's state over
//!   the segment: `dvfs_level` (index into `gpu.dvfs`), `frequency_hz`, `voltage_v`
//!   (null when the scenario has no `[[gpu.dvfs]]`), `temperature_c` (at the segment's
//!   start, the temperature its power was evaluated at; null when neither
//!   `[gpu.thermal]` nor `[gpu.power_model]` is configured).
//! - `rails.arrow`: the true current and voltage of every rail at every ADC conversion,
//!   before the sensors: `t_s`, `device_tick`, then per rail `<rail>_current_a`,
//!   `<rail>_voltage_v`, `<rail>_power_w`.
//! - `executions.arrow`: every kernel execution: `kernel`, `train`, `index_in_train`,
//!   `launch_s`, `start_s`, `end_s`, `phase_bounds_s` (list), `dvfs_level`, `energy_j`,
//!   `time_factor`, `power_factor`, `outlier`.
//! - `logger.arrow`: the GPU logger's reports with their truth: `index`, `true_time_s`,
//!   `stamp_gpu_ticks` or `stamp_host_read_s` (the other null), `response_w` (before gain,
//!   offset and quantisation), `power_w`.
//! - `dvfs.arrow`: every DVFS switch, once it has taken effect: `request_s` (when it was
//!   asked for), `effective_s` (when the new level took effect), `from_level`,
//!   `to_level` (indices), `from`, `to` (names), `cause` (`"request"`: the host's
//!   `Twin::request_dvfs`; `"launch"`: a launch naming another level).
//! - `clocks.toml`: the MCU clock, the GPU clock, and the host monotonic time (ns, the
//!   clock of `clock_gettime(CLOCK_MONOTONIC)`) at true time 0.
//!
//! Times `*_s` are true time: seconds since the twin started, on the host's monotonic
//! clock.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, ListBuilder, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, Schema};

use crate::gpu::{DvfsSwitch, Execution, SegmentState, SwitchCause};
use crate::logger::{LoggerSample, Stamp};
use crate::rig::RailState;
use crate::trace::Segment;

/// One row for one of the truth files.
#[derive(Debug)]
pub enum Row {
    /// A piece of the GPU's power (its state columns null).
    Segment(Segment),
    /// A piece of the GPU's power with the GPU's state over it.
    GpuSegment(Segment, SegmentState),
    /// A DVFS switch that has taken effect, with the names of its levels (from, to).
    DvfsSwitch(DvfsSwitch, String, String),
    /// The rails at a conversion.
    Rails {
        /// True time, s.
        t_s: f64,
        /// Device tick of the conversion.
        device_tick: u64,
        /// Per rail, in the rig's order.
        rails: Vec<RailState>,
    },
    /// A kernel execution, with its kernel's name.
    Execution(Execution, String),
    /// A logger report.
    Logger(LoggerSample),
}

/// Why the truth could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    /// A file.
    #[error("truth file {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What happened.
        error: std::io::Error,
    },
    /// Arrow.
    #[error("truth file {}: {error}", path.display())]
    Arrow {
        /// The file.
        path: PathBuf,
        /// What happened.
        error: ArrowError,
    },
}

struct Table {
    path: PathBuf,
    writer: StreamWriter<BufWriter<File>>,
    schema: Arc<Schema>,
}

impl Table {
    fn create(dir: &Path, name: &str, fields: Vec<Field>) -> Result<Table, TruthError> {
        let path = dir.join(name);
        let file = File::create(&path).map_err(|error| TruthError::Io {
            path: path.clone(),
            error,
        })?;
        let schema = Arc::new(Schema::new(fields));
        let writer = StreamWriter::try_new(BufWriter::new(file), &schema).map_err(|error| {
            TruthError::Arrow {
                path: path.clone(),
                error,
            }
        })?;
        Ok(Table {
            path,
            writer,
            schema,
        })
    }

    fn write(&mut self, columns: Vec<ArrayRef>) -> Result<(), TruthError> {
        let err = |error| TruthError::Arrow {
            path: self.path.clone(),
            error,
        };
        let batch = RecordBatch::try_new(self.schema.clone(), columns).map_err(err)?;
        if batch.num_rows() > 0 {
            self.writer.write(&batch).map_err(err)?;
            self.writer.flush().map_err(err)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), TruthError> {
        self.writer.finish().map_err(|error| TruthError::Arrow {
            path: self.path.clone(),
            error,
        })
    }
}

fn f64s(name: &str) -> Field {
    Field::new(name, DataType::Float64, false)
}

#[derive(Default)]
struct Pending {
    segments: Vec<(Segment, Option<SegmentState>)>,
    switches: Vec<(DvfsSwitch, String, String)>,
    rails: Vec<(f64, u64, Vec<RailState>)>,
    executions: Vec<(Execution, String)>,
    logger: Vec<LoggerSample>,
}

impl Pending {
    fn add(&mut self, row: Row) {
        match row {
            Row::Segment(s) => self.segments.push((s, None)),
            Row::GpuSegment(s, state) => self.segments.push((s, Some(state))),
            Row::DvfsSwitch(d, from, to) => self.switches.push((d, from, to)),
            Row::Rails {
                t_s,
                device_tick,
                rails,
            } => self.rails.push((t_s, device_tick, rails)),
            Row::Execution(e, k) => self.executions.push((e, k)),
            Row::Logger(l) => self.logger.push(l),
        }
    }
}

/// Writes the truth from a background thread; rows go in through [`Truth::sender`].
#[derive(Debug)]
pub struct Truth {
    tx: Option<mpsc::Sender<Row>>,
    thread: Option<std::thread::JoinHandle<Result<(), TruthError>>>,
}

impl Truth {
    /// Creates the files in `dir` (made if missing) for a rig with `rails`, and writes
    /// `clocks.toml` (its text given).
    pub fn create(dir: &Path, rails: &[String], clocks_toml: &str) -> Result<Truth, TruthError> {
        std::fs::create_dir_all(dir).map_err(|error| TruthError::Io {
            path: dir.to_path_buf(),
            error,
        })?;
        let clocks = dir.join("clocks.toml");
        std::fs::write(&clocks, clocks_toml).map_err(|error| TruthError::Io {
            path: clocks,
            error,
        })?;
        let mut segment_fields = [
            "start_s",
            "end_s",
            "power_w",
            "util_compute",
            "util_memory",
            "util_other",
        ]
        .map(f64s)
        .to_vec();
        segment_fields.extend([
            Field::new("dvfs_level", DataType::UInt32, true),
            Field::new("frequency_hz", DataType::Float64, true),
            Field::new("voltage_v", DataType::Float64, true),
            Field::new("temperature_c", DataType::Float64, true),
        ]);
        let mut segments = Table::create(dir, "gpu_power.arrow", segment_fields)?;
        let mut rail_fields = vec![
            f64s("t_s"),
            Field::new("device_tick", DataType::UInt64, false),
        ];
        for r in rails {
            for q in ["current_a", "voltage_v", "power_w"] {
                rail_fields.push(f64s(&format!("{r}_{q}")));
            }
        }
        let mut rail_table = Table::create(dir, "rails.arrow", rail_fields)?;
        let list = DataType::List(Arc::new(Field::new("item", DataType::Float64, true)));
        let mut executions = Table::create(
            dir,
            "executions.arrow",
            vec![
                Field::new("kernel", DataType::Utf8, false),
                Field::new("train", DataType::UInt64, false),
                Field::new("index_in_train", DataType::UInt32, false),
                f64s("launch_s"),
                f64s("start_s"),
                f64s("end_s"),
                Field::new("phase_bounds_s", list, false),
                Field::new("dvfs_level", DataType::UInt32, false),
                f64s("energy_j"),
                f64s("time_factor"),
                f64s("power_factor"),
                Field::new("outlier", DataType::Boolean, false),
            ],
        )?;
        let mut logger = Table::create(
            dir,
            "logger.arrow",
            vec![
                Field::new("index", DataType::UInt64, false),
                f64s("true_time_s"),
                Field::new("stamp_gpu_ticks", DataType::UInt64, true),
                Field::new("stamp_host_read_s", DataType::Float64, true),
                f64s("response_w"),
                f64s("power_w"),
            ],
        )?;
        let mut dvfs = Table::create(
            dir,
            "dvfs.arrow",
            vec![
                f64s("request_s"),
                f64s("effective_s"),
                Field::new("from_level", DataType::UInt32, false),
                Field::new("to_level", DataType::UInt32, false),
                Field::new("from", DataType::Utf8, false),
                Field::new("to", DataType::Utf8, false),
                Field::new("cause", DataType::Utf8, false),
            ],
        )?;
        let (tx, rx) = mpsc::channel::<Row>();
        let thread = std::thread::Builder::new()
            .name("twin-truth".into())
            .spawn(move || {
                let mut p = Pending::default();
                let mut last = Instant::now();
                loop {
                    let got = rx.recv_timeout(Duration::from_millis(100));
                    let closed = matches!(got, Err(mpsc::RecvTimeoutError::Disconnected));
                    if let Ok(row) = got {
                        p.add(row);
                        rx.try_iter().for_each(|row| p.add(row));
                    }
                    if closed || last.elapsed() >= Duration::from_millis(500) {
                        last = Instant::now();
                        write_segments(&mut segments, &mut p.segments)?;
                        write_rails(&mut rail_table, &mut p.rails)?;
                        write_executions(&mut executions, &mut p.executions)?;
                        write_logger(&mut logger, &mut p.logger)?;
                        write_switches(&mut dvfs, &mut p.switches)?;
                    }
                    if closed {
                        for t in [
                            &mut segments,
                            &mut rail_table,
                            &mut executions,
                            &mut logger,
                            &mut dvfs,
                        ] {
                            t.finish()?;
                        }
                        return Ok(());
                    }
                }
            })
            .map_err(|error| TruthError::Io {
                path: dir.to_path_buf(),
                error,
            })?;
        Ok(Truth {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Where rows go (cheap to clone, one per thread).
    pub fn sender(&self) -> Option<mpsc::Sender<Row>> {
        self.tx.clone()
    }

    /// Writes what is pending and closes the files.
    pub fn finish(mut self) -> Result<(), TruthError> {
        self.close()
    }

    fn close(&mut self) -> Result<(), TruthError> {
        self.tx = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(TruthError::Io {
                path: PathBuf::new(),
                error: std::io::Error::other("the truth writer panicked"),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Truth {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn col(mut b: Float64Builder) -> ArrayRef {
    Arc::new(b.finish())
}

fn write_segments(
    t: &mut Table,
    rows: &mut Vec<(Segment, Option<SegmentState>)>,
) -> Result<(), TruthError> {
    let f = |g: fn(&Segment) -> f64| {
        let mut b = Float64Builder::with_capacity(rows.len());
        rows.iter().for_each(|(s, _)| b.append_value(g(s)));
        col(b)
    };
    let state = |g: fn(&SegmentState) -> Option<f64>| {
        let mut b = Float64Builder::with_capacity(rows.len());
        rows.iter()
            .for_each(|(_, s)| b.append_option(s.as_ref().and_then(g)));
        col(b)
    };
    let mut level = UInt32Builder::with_capacity(rows.len());
    for (_, s) in rows.iter() {
        level.append_option(s.map(|s| s.dvfs_level as u32));
    }
    let cols = vec![
        f(|s| s.start_s),
        f(|s| s.end_s),
        f(|s| s.power_w),
        f(|s| s.util.compute),
        f(|s| s.util.memory),
        f(|s| s.util.other),
        Arc::new(level.finish()),
        state(|s| s.frequency_hz),
        state(|s| s.voltage_v),
        state(|s| s.temperature_c),
    ];
    rows.clear();
    t.write(cols)
}

fn write_switches(
    t: &mut Table,
    rows: &mut Vec<(DvfsSwitch, String, String)>,
) -> Result<(), TruthError> {
    let n = rows.len();
    let mut request = Float64Builder::with_capacity(n);
    let mut effective = Float64Builder::with_capacity(n);
    let mut from_level = UInt32Builder::with_capacity(n);
    let mut to_level = UInt32Builder::with_capacity(n);
    let mut from = StringBuilder::new();
    let mut to = StringBuilder::new();
    let mut cause = StringBuilder::new();
    for (d, f, t) in rows.iter() {
        request.append_value(d.request_s);
        effective.append_value(d.effective_s);
        from_level.append_value(d.from as u32);
        to_level.append_value(d.to as u32);
        from.append_value(f);
        to.append_value(t);
        cause.append_value(match d.cause {
            SwitchCause::Request => "request",
            SwitchCause::Launch => "launch",
        });
    }
    let cols: Vec<ArrayRef> = vec![
        col(request),
        col(effective),
        Arc::new(from_level.finish()),
        Arc::new(to_level.finish()),
        Arc::new(from.finish()),
        Arc::new(to.finish()),
        Arc::new(cause.finish()),
    ];
    rows.clear();
    t.write(cols)
}

fn write_rails(
    t: &mut Table,
    rows: &mut Vec<(f64, u64, Vec<RailState>)>,
) -> Result<(), TruthError> {
    let rails = (t.schema.fields().len() - 2) / 3;
    let mut ts = Float64Builder::with_capacity(rows.len());
    let mut ticks = UInt64Builder::with_capacity(rows.len());
    let mut values: Vec<Float64Builder> = (0..3 * rails)
        .map(|_| Float64Builder::with_capacity(rows.len()))
        .collect();
    for (t_s, tick, states) in rows.iter() {
        ts.append_value(*t_s);
        ticks.append_value(*tick);
        for (r, chunk) in values.chunks_mut(3).enumerate() {
            let s = states.get(r).copied().unwrap_or(RailState {
                current_a: f64::NAN,
                voltage_v: f64::NAN,
            });
            if let [i, v, p] = chunk {
                i.append_value(s.current_a);
                v.append_value(s.voltage_v);
                p.append_value(s.current_a * s.voltage_v);
            }
        }
    }
    let mut cols: Vec<ArrayRef> = vec![col(ts), Arc::new(ticks.finish())];
    cols.extend(values.into_iter().map(col));
    rows.clear();
    t.write(cols)
}

fn write_executions(t: &mut Table, rows: &mut Vec<(Execution, String)>) -> Result<(), TruthError> {
    let n = rows.len();
    let mut kernel = StringBuilder::new();
    let mut train = UInt64Builder::with_capacity(n);
    let mut index = UInt32Builder::with_capacity(n);
    let mut f: Vec<Float64Builder> = (0..6).map(|_| Float64Builder::with_capacity(n)).collect();
    let mut bounds = ListBuilder::new(Float64Builder::new());
    let mut dvfs = UInt32Builder::with_capacity(n);
    let mut outlier = BooleanBuilder::with_capacity(n);
    for (e, name) in rows.iter() {
        kernel.append_value(name);
        train.append_value(e.train);
        index.append_value(e.index_in_train);
        for (b, v) in f.iter_mut().zip([
            e.launch_s,
            e.start_s,
            e.end_s,
            e.energy_j,
            e.time_factor,
            e.power_factor,
        ]) {
            b.append_value(v);
        }
        bounds.values().append_slice(&e.phase_bounds_s);
        bounds.append(true);
        dvfs.append_value(e.dvfs_level as u32);
        outlier.append_value(e.outlier);
    }
    let mut f = f.into_iter().map(col);
    let mut next = || f.next().unwrap_or_else(|| col(Float64Builder::new()));
    let (launch, start, end, energy, tf, pf) = (next(), next(), next(), next(), next(), next());
    let cols: Vec<ArrayRef> = vec![
        Arc::new(kernel.finish()),
        Arc::new(train.finish()),
        Arc::new(index.finish()),
        launch,
        start,
        end,
        Arc::new(bounds.finish()),
        Arc::new(dvfs.finish()),
        energy,
        tf,
        pf,
        Arc::new(outlier.finish()),
    ];
    rows.clear();
    t.write(cols)
}

fn write_logger(t: &mut Table, rows: &mut Vec<LoggerSample>) -> Result<(), TruthError> {
    let n = rows.len();
    let mut index = UInt64Builder::with_capacity(n);
    let mut true_t = Float64Builder::with_capacity(n);
    let mut ticks = UInt64Builder::with_capacity(n);
    let mut read = Float64Builder::with_capacity(n);
    let mut response = Float64Builder::with_capacity(n);
    let mut power = Float64Builder::with_capacity(n);
    for l in rows.iter() {
        index.append_value(l.index);
        true_t.append_value(l.true_time_s);
        match l.stamp {
            Stamp::GpuTicks(t) => {
                ticks.append_value(t);
                read.append_null();
            }
            Stamp::HostRead { read_s } => {
                ticks.append_null();
                read.append_value(read_s);
            }
        }
        response.append_value(l.response_w);
        power.append_value(l.power_w);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(index.finish()),
        col(true_t),
        Arc::new(ticks.finish()),
        col(read),
        col(response),
        col(power),
    ];
    rows.clear();
    t.write(cols)
}
