//! The analysis of a profiling run: three clocks aligned to the host's, executions binned
//! by duration, and the GPU logger's readings and the rig's samples stitched onto the
//! kernel's time axis (FinGraV). The mathematics is `railtrace-calibration`'s; this
//! module reads the two recordings and puts the pieces together.

use std::path::Path;

use arrow_array::{BooleanArray, Float32Array, Int64Array, UInt32Array, UInt8Array};
use railtrace_calibration::align::{fit_brackets, fit_pairs, Bracket, Fit};
use railtrace_calibration::binning::{cluster, fixed_margin, Bin, Clusters};
use railtrace_calibration::logger::{LatticeBuilder, Reference as LatticeReference};
use railtrace_calibration::stitch::{
    assign, classify, estimate_settling, profile, Execution, Policy, ProfileAccumulator,
    ProfileBin, Reading, Regime, TrainPosition, WindowEnergies,
};
use serde::Serialize;

use crate::store::recording::{self, Kind, LoggerColumn, RecordingError, Rows};

/// Why a run could not be analysed.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    /// A recording.
    #[error(transparent)]
    Recording(#[from] RecordingError),
    /// The recordings do not hold what the analysis needs.
    #[error("{0}")]
    Missing(String),
    /// A step of the mathematics refused its input.
    #[error("{0}")]
    Math(String),
}

/// How to analyse.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Options {
    /// Width of the stitched profiles' time bins, s.
    pub bin_s: f64,
    /// Readings up to this long after an execution's start belong to it, s (a windowed
    /// logger's reading holds a kernel's energy up to a window after it ended).
    pub horizon_s: f64,
    /// Readings at least this long after the end of the run's last execution hold no
    /// trace of it, s: they are placed after it (up to the horizon) even where it was
    /// left out, for they read the idle level after the run all the same (the idle
    /// level past a logger's reach is read there, where no next launch comes). `None`:
    /// only after kept executions.
    pub idle_after_end_s: Option<f64>,
    /// Confidence of the intervals.
    pub confidence: f64,
    /// Fraction of the tightest GPU clock brackets the GPU↔host fit keeps.
    pub keep_brackets: f64,
    /// FinGraV's fixed margin around the median duration, reported beside the clustering.
    pub margin: f64,
    /// Executions started within this long of their train's first start are SSE, s.
    pub settle_s: f64,
    /// The trigger path's mean latency, from the host's call to the edge at the rig's
    /// input, s (measured once for a given trigger output; 0 when unknown, which shifts
    /// the device link by that latency).
    pub trigger_latency_s: f64,
    /// The logger's readings analysed: a column of the logger rows.
    pub logger_column: LoggerColumn,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            bin_s: 20e-6,
            horizon_s: 2.5e-3,
            idle_after_end_s: None,
            confidence: 0.95,
            keep_brackets: 0.2,
            margin: 0.03,
            settle_s: 10e-3,
            trigger_latency_s: 0.0,
            logger_column: LoggerColumn::default(),
        }
    }
}

impl Link {
    /// Host time (s since the profile's epoch) of the other clock's time `x` (s).
    pub fn to_host(&self, x: f64) -> f64 {
        self.offset_s + self.slope * (x - self.x0_s)
    }
}

/// One clock link, for people and scripts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    /// The reference point on the other clock, s.
    pub x0_s: f64,
    /// Host time at the reference point, s since the profile's epoch.
    pub offset_s: f64,
    /// Host seconds per second of the other clock.
    pub slope: f64,
    /// Rate error of the other clock against the host's, ppm.
    pub rate_error_ppm: f64,
    /// RMS of the residuals, s.
    pub rms_s: f64,
    /// Observations used.
    pub used: usize,
    /// Outliers dropped.
    pub outliers: usize,
    /// Residuals, s (every observation).
    pub residuals_s: Vec<f64>,
}

impl Link {
    /// No link: a run without the clock it would map (a profile without a rig).
    pub fn none() -> Link {
        Link {
            x0_s: f64::NAN,
            offset_s: f64::NAN,
            slope: f64::NAN,
            rate_error_ppm: f64::NAN,
            rms_s: f64::NAN,
            used: 0,
            outliers: 0,
            residuals_s: Vec::new(),
        }
    }
}

fn link(fit: &Fit) -> Link {
    Link {
        x0_s: fit.map.x0,
        offset_s: fit.map.offset,
        slope: fit.map.slope,
        // The fit maps the other clock to host time: slope = 1 / (1 + error).
        rate_error_ppm: (1.0 / fit.map.slope - 1.0) * 1e6,
        rms_s: fit.rms_s,
        used: fit.inliers,
        outliers: fit.outliers.len(),
        residuals_s: fit.residuals.clone(),
    }
}

/// One execution on the host's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Aligned {
    /// Start, host s since the profile's epoch.
    pub start_s: f64,
    /// End, host s.
    pub end_s: f64,
    /// Duration on the GPU's clock, s.
    pub duration_s: f64,
    /// Train number.
    pub train: u64,
    /// Position in the train.
    pub index_in_train: u32,
    /// Kept by the duration clustering.
    pub kept: bool,
    /// Steady-state execution (SSE) or steady-state power (SSP).
    pub ssp: bool,
    /// Energy from the rig's samples over [start, end], J.
    pub rig_energy_j: f64,
}

/// One bin of a stitched profile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// Bin start, s after the execution's start.
    pub lo_s: f64,
    /// Bin end, s.
    pub hi_s: f64,
    /// Readings in it.
    pub n: usize,
    /// Their mean, W.
    pub mean_w: f64,
    /// Their standard deviation, W.
    pub std_w: f64,
    /// Half-width of the mean's confidence interval, W.
    pub ci_half_w: f64,
}

fn points(bins: &[ProfileBin]) -> Vec<Point> {
    bins.iter()
        .map(|b| Point {
            lo_s: b.lo,
            hi_s: b.hi,
            n: b.n,
            mean_w: b.mean_w,
            std_w: b.std_w,
            ci_half_w: b.ci_half_w,
        })
        .collect()
}

/// The result.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// Device (rig) clock → host.
    pub device: Link,
    /// GPU clock → host.
    pub gpu: Link,
    /// The executions.
    pub executions: Vec<Aligned>,
    /// Duration clusters (the dominant one is kept).
    pub clusters: Vec<(f64, f64, usize)>,
    /// FinGraV's fixed-margin bin on the same durations: (lo, hi, kept).
    pub fixed_margin: (f64, f64, usize),
    /// The logger's stitched profile.
    pub logger: Vec<Point>,
    /// The rig's stitched profile (total power).
    pub rig: Vec<Point>,
    /// Mean rig energy per kept execution, J.
    pub rig_energy_j: f64,
    /// Mean rig energy per kept SSE execution (power not yet settled), J.
    pub sse_energy_j: Option<f64>,
    /// Mean rig energy per kept SSP execution (power settled), J.
    pub ssp_energy_j: Option<f64>,
    /// The power-settling time constant fitted over trains, s, where trains were long
    /// enough.
    pub settling_tau_s: Option<f64>,
    /// Executions started this long after their train's first are SSP, s (3 τ, or the
    /// option's value).
    pub settle_s: f64,
    /// The options used.
    pub options: Options,
    /// Which bins the rig and the logger support.
    pub support: Support,
}

/// Which of the stitched bins the rig and the logger support: a report draws those and
/// says why it leaves out the others.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Support {
    /// The rig's 10-90 % rise (its sensors and ADC input filter), s, where the profile
    /// records it: a bin narrower than that shows the rig's own response, not the power's.
    pub rig_rise_s: Option<f64>,
    /// Whether the rig resolves the bins (true where its rise is not known).
    pub rig_resolves: bool,
    /// Rig bins with fewer than [`Support::RIG_SAMPLES`] samples.
    pub rig_thin: usize,
    /// Logger bins with fewer than [`Support::LOGGER_READINGS`] readings.
    pub logger_thin: usize,
    /// What a report says of the bins it leaves out, a line each.
    pub notes: Vec<String>,
}

impl Support {
    /// Samples a rig bin needs for its mean (its noise falls as 1/√n).
    pub const RIG_SAMPLES: usize = 30;
    /// Readings a logger bin needs for a mean with a confidence interval.
    pub const LOGGER_READINGS: usize = 2;

    /// The support of bins `bin_s` wide: by the rig, its rise (None: unknown) and its
    /// stitched profile, where a rig captured the run (`rig`); by the logger, its stitched
    /// profile.
    pub fn of(rig: Option<(Option<f64>, &[Point])>, bin_s: f64, logger: &[Point]) -> Support {
        let thin = |p: &[Point], least: usize| p.iter().filter(|b| b.n > 0 && b.n < least).count();
        let rig_rise_s = rig.and_then(|r| r.0);
        let (rig_thin, logger_thin) = (
            rig.map_or(0, |r| thin(r.1, Self::RIG_SAMPLES)),
            thin(logger, Self::LOGGER_READINGS),
        );
        let rig_resolves = rig_rise_s.is_none_or(|r| bin_s >= r * (1.0 - 1e-9));
        let mut notes = Vec::new();
        match (rig, rig_rise_s) {
            (None, _) => notes.push(
                "no rig: the logger's profile is its raw readings, not deconvolved, and nothing holds it against the power drawn".into(),
            ),
            (Some(_), Some(r)) if !rig_resolves => notes.push(format!(
                "rig: not drawn: bins of {:.1} µs are finer than it resolves (its 10-90 % rise {:.1} µs); take bins of {:.0} µs or wider",
                bin_s * 1e6,
                r * 1e6,
                (r * 1e6).ceil()
            )),
            (Some(_), None) => notes.push(
                "rig: its rise is not recorded in the profile, so bins finer than it are not told apart".into(),
            ),
            _ => {}
        }
        if rig_thin > 0 && rig_resolves {
            notes.push(format!(
                "rig: {rig_thin} bins with fewer than {} samples not drawn (more runs fill them)",
                Self::RIG_SAMPLES
            ));
        }
        if logger_thin > 0 {
            notes.push(format!(
                "logger: {logger_thin} bins with fewer than {} readings not drawn (more runs or wider bins fill them)",
                Self::LOGGER_READINGS
            ));
        }
        Support {
            rig_rise_s,
            rig_resolves,
            rig_thin,
            logger_thin,
            notes,
        }
    }
}

impl Analysis {
    /// The durations of the executions the clustering kept, s.
    pub fn kept_durations(&self) -> Vec<f64> {
        (self.executions.iter())
            .filter(|e| e.kept)
            .map(|e| e.duration_s)
            .collect()
    }

    /// Whether a rig captured the run (its clock is linked to the host's by its trigger
    /// edges): without one, only the GPU's logger was recorded.
    pub fn has_rig(&self) -> bool {
        self.device.used > 0
    }

    /// The analysis as a report draws it: the bins the rig or the logger does not support
    /// ([`Analysis::support`]) emptied (their mean NaN), the rig's all of them where it
    /// does not resolve the bins.
    pub fn drawable(&self) -> Analysis {
        let mut a = self.clone();
        let blank = |p: &mut Point| {
            p.mean_w = f64::NAN;
            p.ci_half_w = f64::NAN;
        };
        for p in &mut a.rig {
            if !self.support.rig_resolves || p.n < Support::RIG_SAMPLES {
                blank(p);
            }
        }
        for p in a
            .logger
            .iter_mut()
            .filter(|p| p.n < Support::LOGGER_READINGS)
        {
            blank(p);
        }
        a
    }
}

/// The GPU side of a run: what the analysis reads from the profile recording, and what a
/// run in progress has so far.
#[derive(Debug, Default)]
pub(crate) struct GpuSide {
    pub(crate) epoch_ns: i64,
    pub(crate) hz: f64,
    pub(crate) line: u8,
    /// (start ticks, end ticks, train, index in train).
    pub(crate) executions: Vec<(u64, u64, u64, u32)>,
    /// GPU clock reads, host s since `epoch_ns`.
    pub(crate) brackets: Vec<Bracket>,
    /// (rising, host mid s).
    pub(crate) driven: Vec<(bool, f64)>,
    /// (its stamp, power).
    pub(crate) logger: Vec<(LoggerStamp, f64)>,
    /// DVFS requests: (level, host s before, host s after).
    pub(crate) dvfs: Vec<(String, f64, f64)>,
    /// The rig's 10-90 % rise, s, where the profile records it.
    pub(crate) rig_rise_s: Option<f64>,
    /// Whether a rig captured the run (a profile names its recording).
    pub(crate) rig_recorded: bool,
}

/// A logger reading's timestamp.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LoggerStamp {
    /// On the GPU's clock, ticks.
    Gpu(u64),
    /// On the host's, s since the profile's epoch.
    Host(f64),
    /// On the logger's own clock, s, with the host time (s) at which it was polled.
    Own(f64, f64),
}

/// What the GPU side alone gives: the GPU link, the executions on the host's timeline
/// and clustered by duration, and the logger's readings stitched onto the kept ones.
#[derive(Debug)]
pub(crate) struct GpuView {
    pub(crate) gpu: Fit,
    pub(crate) execs: Vec<Execution>,
    pub(crate) durations: Vec<f64>,
    pub(crate) clusters: Clusters,
    pub(crate) kept: Vec<bool>,
    /// The logger's readings placed on the kept executions.
    pub(crate) stitched: Vec<railtrace_calibration::stitch::Stitched>,
}

/// Readings stitched onto the kept executions. Each reading belongs to the latest
/// execution started before it, kept or not (a reading after a dropped execution holds
/// that execution's power); those of dropped executions are then left out.
fn stitch_kept(
    readings: &[Reading],
    execs: &[Execution],
    kept: &[bool],
    o: &Options,
) -> Vec<railtrace_calibration::stitch::Stitched> {
    let policy = Policy::Following {
        horizon: o.horizon_s,
    };
    let mut s = assign(readings, execs, policy);
    let last = (0..execs.len())
        .filter(|&i| execs[i].start.is_finite())
        .max_by(|&i, &j| execs[i].start.total_cmp(&execs[j].start));
    let idle = |execution: usize, toi: f64| {
        let e = &execs[execution];
        Some(execution) == last
            && o.idle_after_end_s
                .is_some_and(|r| toi >= e.end - e.start + r)
    };
    s.retain(|p| kept[p.execution] || idle(p.execution, p.toi));
    s
}

/// The link from a logger's own clock to the host's, from the host times at which its
/// readings were polled: a robust line through (own time, poll time), moved down to the
/// earliest polls (a reading is polled after it is stamped, never before), so the link
/// errs late by at most the shortest polling delay.
fn own_link(g: &GpuSide) -> Option<railtrace_calibration::align::LinearMap> {
    let pairs: Vec<(f64, f64)> = g
        .logger
        .iter()
        .filter_map(|(s, _)| match *s {
            LoggerStamp::Own(own, polled) => Some((own, polled)),
            _ => None,
        })
        .collect();
    let fit = fit_pairs(&pairs).ok()?;
    let lowest = fit
        .residuals
        .iter()
        .enumerate()
        .filter(|(i, _)| fit.outliers.binary_search(i).is_err())
        .map(|(_, r)| *r)
        .fold(f64::INFINITY, f64::min);
    let mut map = fit.map;
    map.offset += lowest;
    Some(map)
}

/// GPU clock (s) → host, from the tightest bracketed reads.
fn gpu_link(g: &GpuSide, o: &Options) -> Result<Fit, AnalysisError> {
    fit_brackets(&g.brackets, o.keep_brackets).map_err(|e| {
        AnalysisError::Math(format!(
            "GPU↔host from {} clock reads: {e}",
            g.brackets.len()
        ))
    })
}

/// Device clock (s) → host, from the trigger edges the host drove (their brackets'
/// midpoints plus the trigger path's known latency) paired with the rig's timestamps.
fn device_link(g: &GpuSide, rig: &RigSide, o: &Options) -> Result<Fit, AnalysisError> {
    let driven: Vec<(bool, f64)> = g
        .driven
        .iter()
        .map(|&(up, t)| (up, t + o.trigger_latency_s))
        .collect();
    let pairs = pair_edges(&driven, &rig.edges);
    fit_pairs(&pairs).map_err(|e| {
        AnalysisError::Math(format!(
            "device↔host from {} of {} trigger edges paired: {e}",
            pairs.len(),
            g.driven.len()
        ))
    })
}

/// The logger's readings on the host's timeline (NaN where a reading's clock has no
/// link).
fn logger_readings(g: &GpuSide, gpu: &Fit) -> Vec<Reading> {
    let own = own_link(g);
    g.logger
        .iter()
        .map(|&(stamp, power_w)| Reading {
            time: match stamp {
                LoggerStamp::Gpu(ticks) => gpu.map.apply(ticks as f64 / g.hz),
                LoggerStamp::Host(host_s) => host_s,
                LoggerStamp::Own(own_s, _) => own.map_or(f64::NAN, |m| m.apply(own_s)),
            },
            power_w,
        })
        .collect()
}

/// The GPU side's analysis (see [`GpuView`]).
pub(crate) fn gpu_view(g: &GpuSide, o: &Options) -> Result<GpuView, AnalysisError> {
    let gpu = gpu_link(g, o)?;
    let to_host = |ticks: u64| gpu.map.apply(ticks as f64 / g.hz);
    let execs: Vec<Execution> = g
        .executions
        .iter()
        .map(|e| Execution {
            start: to_host(e.0),
            end: to_host(e.1),
        })
        .collect();
    let durations: Vec<f64> = g
        .executions
        .iter()
        .map(|e| e.1.saturating_sub(e.0) as f64 / g.hz)
        .collect();
    let clusters: Clusters = cluster(&durations, (durations.len() / 50).max(3));
    let mut kept = vec![false; durations.len()];
    if let Some(c) = clusters.dominant() {
        for &i in &c.indices {
            kept[i] = true;
        }
    }
    let stitched = stitch_kept(&logger_readings(g, &gpu), &execs, &kept, o);
    Ok(GpuView {
        gpu,
        execs,
        durations,
        clusters,
        kept,
        stitched,
    })
}

/// The GPU side of the profile recording at `path`, read a batch at a time, with the
/// logger's readings of `column` (the rows where it is null left out).
fn gpu_side(path: &Path, column: LoggerColumn) -> Result<GpuSide, AnalysisError> {
    let r = recording::open(path)?;
    let settings = r.meta.settings.clone().unwrap_or_default();
    let hz = settings["gpu_clock_hz"].as_f64().ok_or_else(|| {
        AnalysisError::Missing(format!(
            "{}: not a profile (no gpu_clock_hz in its settings); a recording of a meter beside a GPU's logger is held against it, and its readings corrected, by `railtrace compare RECORDING --logger MODEL`",
            r.path.display()
        ))
    })?;
    let mut g = GpuSide {
        epoch_ns: r.meta.epoch_utc_ns,
        hz,
        line: settings["trigger_line"].as_u64().unwrap_or(0) as u8,
        rig_rise_s: settings["more"]["rig_rise_s"].as_f64(),
        // Profiles written before runs without a rig were possible always had one.
        rig_recorded: (settings["more"].get("rig_recording")).is_none_or(|r| !r.is_null()),
        ..GpuSide::default()
    };
    let s = |ns: i64| (ns - g.epoch_ns) as f64 * 1e-9;
    for batch in r {
        let batch = batch?;
        let rows = Rows::new(&batch);
        let (send, recv) = (
            rows.column::<Int64Array>("host_send_ns"),
            rows.column::<Int64Array>("host_recv_ns"),
        );
        let (ticks, end) = (rows.u64("gpu_ticks"), rows.u64("gpu_end_ticks"));
        let rising = rows.column::<BooleanArray>("rising");
        for i in 0..rows.len() {
            match rows.kind(i) {
                Kind::Execution => g.executions.push((
                    ticks.value(i),
                    end.value(i),
                    rows.u64("train").value(i),
                    rows.column::<UInt32Array>("index_in_train").value(i),
                )),
                Kind::ClockRead => g.brackets.push(Bracket {
                    before: s(send.value(i)),
                    reading: ticks.value(i) as f64 / hz,
                    after: s(recv.value(i)),
                }),
                Kind::Driven => {
                    let mid = send.value(i) + (recv.value(i) - send.value(i)) / 2;
                    g.driven.push((rising.value(i), s(mid)));
                }
                Kind::DvfsRequest => g.dvfs.push((
                    rows.text().value(i).to_string(),
                    s(send.value(i)),
                    s(recv.value(i)),
                )),
                Kind::Logger => {
                    let Some(w) = Rows::get(rows.f64(column.column()), i) else {
                        continue;
                    };
                    let own = Rows::get(rows.f64("own_s"), i);
                    match (Rows::get(ticks, i), Rows::get(recv, i), own) {
                        (Some(t), _, _) => g.logger.push((LoggerStamp::Gpu(t), w)),
                        (None, Some(ns), _) => g.logger.push((LoggerStamp::Host(s(ns)), w)),
                        (None, None, Some(own)) => {
                            if let Some(polled) = Rows::get(send, i) {
                                g.logger.push((LoggerStamp::Own(own, s(polled)), w));
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
    }
    Ok(g)
}

/// What the analysis reads from the rig's recording.
#[derive(Debug, Default)]
struct RigSide {
    /// (rising, device s, coarse host s since the profile's epoch).
    edges: Vec<(bool, f64, f64)>,
}

/// The rig's capture at `path` opened for [`rig_side`]: its edges' columns, and with
/// `samples` its samples' too.
fn rig_reader(path: &Path, samples: bool) -> Result<recording::Reader, AnalysisError> {
    let edges = ["time_s", "tick", "line", "rising"];
    let all = [
        "time_s",
        "tick",
        "line",
        "rising",
        "total_w",
        "count",
        "codes",
        "period_ticks",
    ];
    Ok(recording::open_blocks(
        path,
        if samples { &all } else { &edges },
    )?)
}

/// The rig's capture opened ([`rig_reader`]) on a thread of its own: opening checks every
/// message of the file, which on a long capture overlaps the work on the GPU's side.
struct Opening(std::thread::JoinHandle<Result<recording::Reader, AnalysisError>>);

impl Opening {
    fn new(path: &Path, samples: bool) -> Self {
        let path = path.to_path_buf();
        Opening(std::thread::spawn(move || rig_reader(&path, samples)))
    }

    fn reader(self) -> Result<recording::Reader, AnalysisError> {
        self.0
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

/// The rig's capture `r` ([`rig_reader`]), read a batch at a time: its edges on `line`,
/// and each sample's (device s, total W, whether samples are missing before it: a gap
/// row came first) given to `sample`.
fn rig_side(
    r: recording::Reader,
    line: u8,
    epoch_ns: i64,
    mut sample: Option<&mut dyn FnMut(f64, f32, bool) -> Result<(), AnalysisError>>,
) -> Result<RigSide, AnalysisError> {
    let derive = r.meta.derive.clone();
    let tick_hz = r
        .meta
        .device
        .as_ref()
        .and_then(|d| d["tick_hz"].as_f64())
        .ok_or_else(|| {
            AnalysisError::Missing(format!(
                "{}: not a rig capture (no device tick rate)",
                r.path.display()
            ))
        })?;
    let shift = (r.meta.epoch_utc_ns - epoch_ns) as f64 * 1e-9;
    let mut rig = RigSide::default();
    let mut after_gap = false;
    for batch in r.read_ahead() {
        let batch = batch?;
        let rows = Rows::new(&batch);
        let (tick, time) = (rows.u64("tick"), rows.f64("time_s"));
        let total = (batch.column_by_name("total_w"))
            .and_then(|c| c.as_any().downcast_ref::<Float32Array>());
        let (lines, rising) = (
            rows.column::<UInt8Array>("line"),
            rows.column::<BooleanArray>("rising"),
        );
        for i in 0..rows.len() {
            if rows.is_block(i) {
                let mut failed = Ok(());
                if let (Some(d), Some(sample)) = (&derive, sample.as_mut()) {
                    rows.block_samples(i, d, |t, w| {
                        if failed.is_ok() {
                            failed = sample(t as f64 / tick_hz, w, std::mem::take(&mut after_gap));
                        }
                    });
                }
                failed?;
                continue;
            }
            match rows.kind(i) {
                Kind::Sample => {
                    let (Some(sample), Some(total)) = (sample.as_mut(), total) else {
                        continue;
                    };
                    if let (Some(t), Some(w)) = (Rows::get(tick, i), Rows::get(total, i)) {
                        sample(t as f64 / tick_hz, w, std::mem::take(&mut after_gap))?;
                    }
                }
                Kind::Gap => after_gap = true,
                Kind::Edge if lines.value(i) == line => rig.edges.push((
                    rising.value(i),
                    tick.value(i) as f64 / tick_hz,
                    time.value(i) + shift,
                )),
                _ => {}
            }
        }
    }
    Ok(rig)
}

/// Places samples given in time order on the kept executions as [`stitch_kept`] places
/// readings: each on the latest execution started at or before it, kept, and less than
/// the horizon after its start.
struct Following<'a> {
    /// Executions with a finite start, by start.
    order: Vec<usize>,
    execs: &'a [Execution],
    kept: &'a [bool],
    horizon_s: f64,
    /// Executions in `order` started at or before the last sample.
    started: usize,
}

impl<'a> Following<'a> {
    fn new(execs: &'a [Execution], kept: &'a [bool], horizon_s: f64) -> Self {
        let mut order: Vec<usize> = (0..execs.len())
            .filter(|&i| execs[i].start.is_finite())
            .collect();
        order.sort_by(|&i, &j| execs[i].start.total_cmp(&execs[j].start));
        Following {
            order,
            execs,
            kept,
            horizon_s,
            started: 0,
        }
    }

    /// The time of interest of a sample at `t` (not before the last one's), if placed.
    fn toi(&mut self, t: f64) -> Option<f64> {
        let (order, execs) = (&self.order, self.execs);
        while self.started < order.len() && execs[order[self.started]].start <= t {
            self.started += 1;
        }
        let i = *order.get(self.started.checked_sub(1)?)?;
        let toi = t - execs[i].start;
        (self.kept[i] && toi < self.horizon_s).then_some(toi)
    }
}

/// How far the rig's coarse timeline may sit from the host's: the capture anchors it by
/// one time-sync exchange, whose round trip on a loaded host is milliseconds, not more.
const ANCHOR_SEARCH_S: f64 = 50e-3;

/// Pairs each driven edge (sense, host s) with the rig's edge (sense, device s, coarse
/// host s) of the same sense that is the same edge.
///
/// The rig's coarse timeline is off the host's by up to half its anchoring exchange's
/// round trip, which on a loaded host exceeds the spacing of the edges, and it drifts at
/// the device clock's rate error; the nearest edge on it is then a neighbour. So the
/// offset is first found as the one most of the first edges agree on (wrong neighbours
/// disagree, the edges' spacings being irregular), then followed edge by edge, each driven
/// edge taking the rig's nearest to where the offset puts it, within half the edges'
/// typical spacing.
fn pair_edges(driven: &[(bool, f64)], rig: &[(bool, f64, f64)]) -> Vec<(f64, f64)> {
    let mut driven = driven.to_vec();
    driven.sort_by(|a, b| a.1.total_cmp(&b.1));
    let sense = |up: bool| {
        let mut v: Vec<(f64, f64)> = (rig.iter())
            .filter(|e| e.0 == up)
            .map(|e| (e.2, e.1))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let (rising, falling) = (sense(true), sense(false));
    let of = |up: bool| if up { &rising } else { &falling };
    // The typical spacing of same-sense edges as driven.
    let gaps: Vec<f64> = [true, false]
        .iter()
        .flat_map(|&up| {
            let t: Vec<f64> = driven.iter().filter(|d| d.0 == up).map(|d| d.1).collect();
            t.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
        })
        .collect();
    let spacing = railtrace_calibration::stats::median(&gaps);
    if spacing.is_nan() || spacing <= 0.0 || rig.is_empty() {
        return Vec::new();
    }
    // The offset most of the first edges agree on, within a quarter of the spacing.
    let mut offsets: Vec<f64> = Vec::new();
    for &(up, host) in driven.iter().take(64) {
        let edges = of(up);
        let from = edges.partition_point(|e| e.0 < host - ANCHOR_SEARCH_S);
        offsets.extend(
            (edges[from..].iter())
                .take_while(|e| e.0 <= host + ANCHOR_SEARCH_S)
                .map(|e| e.0 - host),
        );
    }
    offsets.sort_by(f64::total_cmp);
    let tol = spacing / 4.0;
    let (mut best, mut at) = (0, 0);
    for i in 0..offsets.len() {
        let n = offsets[i..].partition_point(|&d| d <= offsets[i] + 2.0 * tol);
        if n > best {
            (best, at) = (n, i);
        }
    }
    let Some(window) = offsets.get(at..at + best) else {
        return Vec::new();
    };
    let mut offset = window[window.len() / 2];
    let mut pairs = Vec::new();
    for &(up, host) in &driven {
        let edges = of(up);
        let want = host + offset;
        let i = edges.partition_point(|e| e.0 < want);
        let nearest = [i.checked_sub(1), Some(i)]
            .into_iter()
            .flatten()
            .filter_map(|j| edges.get(j))
            .min_by(|a, b| (a.0 - want).abs().total_cmp(&(b.0 - want).abs()));
        if let Some(&(coarse, device)) = nearest.filter(|e| (e.0 - want).abs() < 2.0 * tol) {
            pairs.push((device, host));
            // Follows the drift; one edge's jitter moves the offset by a tenth of it.
            offset += 0.1 * (coarse - host - offset);
        }
    }
    pairs
}

/// The executions' durations in the profile recording at `path`, by the GPU's clock, s:
/// what sets how far after an execution's start its readings are stitched.
pub fn execution_durations(path: &Path) -> Result<Vec<f64>, AnalysisError> {
    let g = gpu_side(path, LoggerColumn::default())?;
    Ok((g.executions.iter())
        .map(|e| e.1.saturating_sub(e.0) as f64 / g.hz)
        .collect())
}

/// Analyses the profile recording `profile` and the rig's capture `rig` of the same run.
pub fn analyse(
    profile_path: &Path,
    rig_path: &Path,
    o: &Options,
) -> Result<Analysis, AnalysisError> {
    let math = |e: &dyn std::fmt::Display| AnalysisError::Math(e.to_string());
    let (edges_at, samples_at) = (Opening::new(rig_path, false), Opening::new(rig_path, true));
    let g = gpu_side(profile_path, o.logger_column)?;
    if g.executions.is_empty() {
        return Err(AnalysisError::Missing(format!(
            "{}: no executions",
            profile_path.display()
        )));
    }
    // GPU ↔ host; executions clustered by duration; the logger's readings stitched.
    let GpuView {
        gpu,
        execs,
        durations,
        clusters,
        kept,
        stitched,
    } = gpu_view(&g, o)?;
    let fixed: Bin = fixed_margin(&durations, o.margin);
    let mut train_start = std::collections::HashMap::new();
    for (e, x) in g.executions.iter().zip(&execs) {
        let s = train_start.entry(e.2).or_insert(x.start);
        *s = s.min(x.start);
    }
    let positions: Vec<TrainPosition> = g
        .executions
        .iter()
        .zip(&execs)
        .map(|(e, x)| TrainPosition {
            index_in_train: e.3,
            since_train_start_s: x.start - train_start[&e.2],
        })
        .collect();
    // Device ↔ host, from the trigger edges; then the rig's samples on the host's
    // timeline, read a batch at a time: each execution's energy, and the rig's profile
    // stitched onto the kept executions.
    // A run without a rig has the logger's readings alone.
    let (device, energies, rig_profile) = if g.rig_recorded {
        let edges = rig_side(edges_at.reader()?, g.line, g.epoch_ns, None)?;
        let device = device_link(&g, &edges, o)?;
        let windows: Vec<(f64, f64)> = execs.iter().map(|x| (x.start, x.end)).collect();
        let mut energy = WindowEnergies::new(&windows);
        let mut rig_bins = ProfileAccumulator::new(o.bin_s, o.confidence).map_err(|e| math(&e))?;
        let mut follow = Following::new(&execs, &kept, o.horizon_s);
        rig_side(
            samples_at.reader()?,
            g.line,
            g.epoch_ns,
            Some(&mut |d, w, after_gap| {
                let (t, w) = (device.map.apply(d), f64::from(w));
                if after_gap {
                    energy.gap();
                }
                energy.push(t, w);
                if let Some(toi) = follow.toi(t) {
                    rig_bins.push(toi, w);
                }
                Ok(())
            }),
        )?;
        let rig_profile = rig_bins.finish().map_err(|e| math(&e))?;
        (link(&device), energy.finish(), rig_profile)
    } else {
        (Link::none(), vec![f64::NAN; execs.len()], Vec::new())
    };
    // Power settling over trains (SSE → SSP), where trains are long enough to see it.
    let settling = if g.rig_recorded && g.executions.iter().any(|e| e.3 >= 8) {
        let (u, p): (Vec<f64>, Vec<f64>) = positions
            .iter()
            .zip(energies.iter().zip(&durations))
            .zip(&kept)
            .filter(|(_, k)| **k)
            .map(|((pos, (e, d)), _)| (pos.since_train_start_s, e / d))
            .unzip();
        estimate_settling(&u, &p).ok().filter(|s| !s.at_search_edge)
    } else {
        None
    };
    let settle_s = settling.map_or(o.settle_s, |s| s.settle_s);
    let regimes = classify(&positions, settle_s);
    let logger = profile(&stitched, o.bin_s, o.confidence).map_err(|e| math(&e))?;
    let executions: Vec<Aligned> = g
        .executions
        .iter()
        .zip(&execs)
        .zip(&durations)
        .enumerate()
        .map(|(i, ((e, x), &d))| Aligned {
            start_s: x.start,
            end_s: x.end,
            duration_s: d,
            train: e.2,
            index_in_train: e.3,
            kept: kept[i],
            ssp: regimes[i] == Regime::Ssp,
            rig_energy_j: energies[i],
        })
        .collect();
    let mean_energy = |ssp: bool| {
        let e: Vec<f64> = executions
            .iter()
            .filter(|e| e.kept && e.ssp == ssp && e.rig_energy_j.is_finite())
            .map(|e| e.rig_energy_j)
            .collect();
        (!e.is_empty()).then(|| e.iter().sum::<f64>() / e.len() as f64)
    };
    let (sse_energy_j, ssp_energy_j) = (mean_energy(false), mean_energy(true));
    let kept_energy: Vec<f64> = executions
        .iter()
        .filter(|e| e.kept && e.rig_energy_j.is_finite())
        .map(|e| e.rig_energy_j)
        .collect();
    let (logger, rig) = (points(&logger), points(&rig_profile));
    let support = Support::of(
        g.rig_recorded.then_some((g.rig_rise_s, rig.as_slice())),
        o.bin_s,
        &logger,
    );
    Ok(Analysis {
        device,
        gpu: link(&gpu),
        support,
        executions,
        clusters: clusters
            .clusters
            .iter()
            .map(|c| (c.lo, c.hi, c.indices.len()))
            .collect(),
        fixed_margin: (fixed.lo, fixed.hi, fixed.indices.len()),
        logger,
        rig,
        rig_energy_j: if kept_energy.is_empty() {
            f64::NAN
        } else {
            kept_energy.iter().sum::<f64>() / kept_energy.len() as f64
        },
        sse_energy_j,
        ssp_energy_j,
        settling_tau_s: settling.map(|s| s.tau_s),
        settle_s,
        options: o.clone(),
    })
}

/// The rig's capture at `rig_path` of the run whose GPU side is `g`: the device → host
/// link from the trigger edges, and the rig's sample times on the host's timeline (s
/// since the run's epoch) with their total power.
fn rig_on_host(
    g: &GpuSide,
    rig_path: &Path,
    o: &Options,
) -> Result<(Fit, Vec<f64>, Vec<f64>), AnalysisError> {
    let mut samples: Vec<(f64, f32)> = Vec::new();
    let rig = rig_side(
        rig_reader(rig_path, true)?,
        g.line,
        g.epoch_ns,
        Some(&mut |d, w, _| {
            samples.push((d, w));
            Ok(())
        }),
    )?;
    let device = device_link(g, &rig, o)?;
    let (t, w) = samples
        .iter()
        .map(|&(d, w)| (device.map.apply(d), f64::from(w)))
        .unzip();
    Ok((device, t, w))
}

/// A DVFS run (`railtrace dvfs latency`): the host's requests and the rig's samples on the
/// host's timeline (s since the run's epoch), through the device link.
#[derive(Debug, Clone)]
pub struct DvfsTimeline {
    /// Each request: the level, and the host's clock just before and after it, s.
    pub requests: Vec<(String, f64, f64)>,
    /// The rig's sample times, s.
    pub rig_t: Vec<f64>,
    /// The rig's total power, W.
    pub rig_w: Vec<f64>,
    /// The device → host link.
    pub device: Link,
}

/// The requests of a DVFS run and its rig capture on one timeline.
pub fn dvfs_timeline(
    run_path: &Path,
    rig_path: &Path,
    o: &Options,
) -> Result<DvfsTimeline, AnalysisError> {
    let g = gpu_side(run_path, o.logger_column)?;
    let (device, rig_t, rig_w) = rig_on_host(&g, rig_path, o)?;
    Ok(DvfsTimeline {
        requests: g.dvfs,
        rig_t,
        rig_w,
        device: link(&device),
    })
}

/// Rig samples up to which [`reduced_timeline`] keeps the samples themselves (64 MB of
/// them; 40 s at 100 kS/s): the lattice is for longer captures.
pub const EXACT_SAMPLES: usize = 4_000_000;

/// A profiling run reduced for identifying its logger: the logger's readings on the host's
/// timeline, and the rig's total power as a lattice reference on the same timeline.
#[derive(Debug, Clone)]
pub struct Reduced {
    /// The rig's total power: its samples, or for more than [`EXACT_SAMPLES`] of them
    /// their exact integrals over the lattice's cells.
    pub reference: LatticeReference,
    /// Rig samples read.
    pub samples: u64,
    /// The logger's reading times, host s since the profile's epoch.
    pub logger_t: Vec<f64>,
    /// The logger's readings, W.
    pub logger_w: Vec<f64>,
}

/// The logger's readings and the rig's samples of a profiling run on the host's timeline,
/// through the device and GPU links of [`analyse`]. The rig's capture is read a batch at
/// a time; beyond [`EXACT_SAMPLES`] it is reduced as it is read ([`LatticeBuilder`]), so
/// that memory holds the lattice's cells, not the samples. `cell_s` gives the cell width
/// from the logger's readings (times, W) and the rig's sample rate (Hz, where its
/// recording says); `progress` is told the samples read so far, every million.
pub fn reduced_timeline(
    profile_path: &Path,
    rig_path: &Path,
    o: &Options,
    cell_s: impl FnOnce(&[f64], &[f64], Option<f64>) -> f64,
    mut progress: impl FnMut(u64),
) -> Result<Reduced, AnalysisError> {
    let math = |e: &dyn std::fmt::Display| AnalysisError::Math(format!("the rig's samples: {e}"));
    let opening = Opening::new(rig_path, true);
    let g = gpu_side(profile_path, o.logger_column)?;
    if !g.rig_recorded {
        return Err(AnalysisError::Missing(format!(
            "{}: recorded without a rig; a logger is identified against the rig's capture of its run",
            profile_path.display()
        )));
    }
    let reader = opening.reader()?;
    let rate_hz = (reader.meta.settings.as_ref()).and_then(|s| s["sample_rate_hz"].as_f64());
    let gpu = gpu_link(&g, o)?;
    let (logger_t, logger_w): (Vec<f64>, Vec<f64>) = logger_readings(&g, &gpu)
        .iter()
        .filter(|r| r.time.is_finite())
        .map(|r| (r.time, r.power_w))
        .unzip();
    let cell = cell_s(&logger_t, &logger_w, rate_hz);
    let mut lattice = LatticeBuilder::new(cell)
        .map_err(|e| math(&e))?
        .exact_up_to(EXACT_SAMPLES);
    let rig = rig_side(
        reader,
        g.line,
        g.epoch_ns,
        Some(&mut |d, w, _| {
            lattice.push(d, f64::from(w)).map_err(|e| math(&e))?;
            if lattice.samples() % 1_000_000 == 0 {
                progress(lattice.samples());
            }
            Ok(())
        }),
    )?;
    let samples = lattice.samples();
    progress(samples);
    let device = device_link(&g, &rig, o)?;
    let m = device.map;
    let reference = (lattice.finish())
        .and_then(|r| r.on_timeline(m.slope, m.offset - m.slope * m.x0))
        .map_err(|e| math(&e))?;
    Ok(Reduced {
        reference,
        samples,
        logger_t,
        logger_w,
    })
}

impl Analysis {
    /// The analysis for people, a few lines: the clocks' links, the executions and their
    /// clusters, the profiles, the energy and what limits the profiles' support.
    pub fn summary(&self) -> String {
        let a = self;
        let kept = a.executions.iter().filter(|e| e.kept).count();
        let peak = |p: &[Point]| {
            p.iter()
                .map(|b| b.mean_w)
                .filter(|w| w.is_finite())
                .fold(f64::NAN, f64::max)
        };
        let device = if a.has_rig() {
            format!(
                "rate error {:+.2} ppm, residual RMS {:.2} µs ({} edges, {} outliers)",
                a.device.rate_error_ppm,
                a.device.rms_s * 1e6,
                a.device.used,
                a.device.outliers
            )
        } else {
            "no rig".into()
        };
        let mut s = format!(
        "clocks    device→host: {device}\n          GPU→host:    rate error {:+.2} ppm, residual RMS {:.2} µs ({} reads kept, {} outliers)\n",
        a.gpu.rate_error_ppm,
        a.gpu.rms_s * 1e6,
        a.gpu.used,
        a.gpu.outliers
    );
        s += &format!(
        "runs      {} executions, {} kept by clustering into {} cluster(s); fixed margin {:.1}-{:.1} µs keeps {}\n",
        a.executions.len(),
        kept,
        a.clusters.len(),
        a.fixed_margin.0 * 1e6,
        a.fixed_margin.1 * 1e6,
        a.fixed_margin.2
    );
        for (lo, hi, n) in &a.clusters {
            s += &format!("  cluster {:.1}-{:.1} µs: {n}\n", lo * 1e6, hi * 1e6);
        }
        s += &format!(
            "profiles  logger: {} bins of {:.0} µs, peak {:.1} W; ",
            a.logger.len(),
            a.options.bin_s * 1e6,
            peak(&a.logger),
        );
        s += &if a.has_rig() {
            format!(
                "rig: {} bins, peak {:.1} W\nenergy    {:.3} mJ per kept execution (rig)\n",
                a.rig.len(),
                peak(&a.rig),
                a.rig_energy_j * 1e3
            )
        } else {
            "no rig\n".into()
        };
        for note in &a.support.notes {
            s += &format!("support   {note}\n");
        }
        s
    }
}

/// A profile on the TOI axis: cells `[lo, hi)` and their power, W (NaN: no data).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    /// Start, s.
    pub lo: f64,
    /// End, s.
    pub hi: f64,
    /// Power, W.
    pub w: f64,
}

/// A stitched profile's bins as cells (bins without data NaN, left out by
/// [`mean_over`]).
pub fn cells(points: &[Point]) -> Vec<Cell> {
    points
        .iter()
        .map(|p| Cell {
            lo: p.lo_s,
            hi: p.hi_s,
            w: if p.n > 0 { p.mean_w } else { f64::NAN },
        })
        .collect()
}

/// A profile's mean over `[a, b]`, cells weighted by their overlap (cells without data
/// left out).
pub fn mean_over(cells: &[Cell], a: f64, b: f64) -> f64 {
    let (mut e, mut t) = (0.0, 0.0);
    for c in cells.iter().filter(|c| c.w.is_finite()) {
        let o = c.hi.min(b) - c.lo.max(a);
        if o > 0.0 {
            e += c.w * o;
            t += o;
        }
    }
    e / t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_long_after_the_runs_last_execution_are_placed_though_it_was_left_out() {
        // The run's last execution (2-2.5 ms) left out (an outlier's duration); readings
        // every 1 ms to 20 ms. Those 7 ms past its end read the idle level after the run
        // and are placed, up to the 14.5 ms horizon; nearer ones go with its fate.
        let exec = |start: f64, end: f64| Execution { start, end };
        let execs = [exec(0.0, 0.2e-3), exec(2e-3, 2.5e-3)];
        let readings: Vec<Reading> = (1..=20)
            .map(|k| Reading {
                time: f64::from(k) * 1e-3,
                power_w: 100.0,
            })
            .collect();
        let o = Options {
            horizon_s: 14.5e-3,
            idle_after_end_s: Some(7e-3),
            ..Options::default()
        };
        let tois = |execs: &[Execution], kept: &[bool], o: &Options| -> Vec<(usize, f64)> {
            stitch_kept(&readings, execs, kept, o)
                .iter()
                .map(|p| (p.execution, (p.toi * 1e3).round()))
                .collect()
        };
        let want: Vec<(usize, f64)> = std::iter::once((0, 1.0))
            .chain((8..15).map(|t| (1, f64::from(t))))
            .collect();
        assert_eq!(tois(&execs, &[true, false], &o), want);
        // Not after an execution left out that another follows, nor without the option.
        let three = [execs[0], execs[1], exec(30e-3, 30.2e-3)];
        assert_eq!(tois(&three, &[true, false, true], &o), [(0, 1.0)]);
        let only_kept = Options {
            idle_after_end_s: None,
            ..o.clone()
        };
        assert_eq!(tois(&execs, &[true, false], &only_kept), [(0, 1.0)]);
    }

    #[test]
    fn trigger_edges_pair_with_their_own_when_the_coarse_anchor_is_off_by_more_than_their_spacing()
    {
        // Trains 1-3 ms apart (a fixed-seed LCG), each a 0.2 ms pulse, for 10 s; the rig's
        // device clock 50 ppm fast; its coarse timeline anchored 2.3 ms late (half a slow
        // time-sync's round trip on a loaded host); 20 µs of edge jitter.
        let mut x: u64 = 99;
        let mut uniform = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut driven, mut rig, mut truth) = (Vec::new(), Vec::new(), Vec::new());
        let mut t = 0.0;
        while t < 10.0 {
            for (up, at) in [(true, t), (false, t + 0.2e-3)] {
                let edge = at + 20e-6 * (uniform() - 0.5) * 3.46;
                let device = edge * (1.0 + 50e-6);
                driven.push((up, at));
                rig.push((up, device, device + 2.3e-3));
                truth.push((device, at));
            }
            t += 1e-3 + 2e-3 * uniform();
        }
        let pairs = pair_edges(&driven, &rig);
        assert_eq!(pairs.len(), truth.len());
        for (p, t) in pairs.iter().zip(&truth) {
            assert_eq!(p, t);
        }
        // Nothing to pair with: nothing paired.
        assert!(pair_edges(&driven, &[]).is_empty());
        assert!(pair_edges(&[], &rig).is_empty());
    }

    #[test]
    fn a_loggers_own_clock_is_linked_to_the_hosts_by_its_earliest_polls() {
        // The logger's clock: 5 s ahead, 100 ppm fast. Polled 0.1-2.1 ms after each
        // reading (a fixed-seed LCG), every 10 ms for 10 s.
        let mut x: u64 = 12345;
        let mut g = GpuSide::default();
        let truth = |host: f64| 5.0 + host * (1.0 + 100e-6);
        let mut times = Vec::new();
        for k in 0..1000 {
            let t = f64::from(k) * 0.01;
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let delay = 0.1e-3 + 2e-3 * (x >> 11) as f64 / (1u64 << 53) as f64;
            g.logger.push((LoggerStamp::Own(truth(t), t + delay), 1.0));
            times.push(t);
        }
        let map = own_link(&g).unwrap();
        for (t, (s, _)) in times.iter().zip(&g.logger) {
            let LoggerStamp::Own(own, _) = *s else {
                unreachable!()
            };
            let err = map.apply(own) - t;
            // Late by about the shortest polling delay (0.1 ms), never early by more
            // than the line's scatter.
            assert!((-20e-6..0.2e-3).contains(&err), "{err} s at {t} s");
        }
    }
}
