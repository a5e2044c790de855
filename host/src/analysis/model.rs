//! Power models fitted on profiling runs (`railtrace model fit`, `railtrace model
//! validate`): the observations each run gives, the model file, the validation.
//!
//! A *run* is one `railtrace profile --dvfs LEVEL` recording of one kernel at one DVFS
//! level, with the rig's capture beside it. It gives one kernel observation (the
//! kernel's mean power over its kept executions, their mean duration, the die
//! temperature the GPU's logger reported over the run) and one idle observation (the
//! power between executions), each as seen by three sources:
//! - `rig`: the reference, the rig's stitched profile over each execution and 0.1 ms
//!   past its end, less the idle power over those 0.1 ms (a linear input filter delays
//!   the rise and the fall alike and conserves the energy), and its mean over the idle
//!   stretch 0.2–0.8 ms after each execution's end;
//! - `logger`: the GPU's own logger as it stands, the stitched profile's mean over the
//!   kernel (`[0, duration]` after each start) and its readings long after it (idle):
//!   what a power model fitted on the logger sees;
//! - `corrected`: the stitched logger profile deconvolved with the logger's identified
//!   model (`railtrace calibrate`), its energy per execution over the duration, and the
//!   idle level the correction imposed.
//!
//! The utilisation of each kernel (and of idle) and the DVFS levels' frequency and
//! voltage come from a GPU description: a TOML with `[[kernels]]` (name, `[[phases]]`
//! with `duration_s` and `util = { compute, memory, other }`) and `[[gpu.dvfs]]` (name,
//! `frequency_hz`, `voltage_v`), `[gpu.idle_util]` optional: the twin's scenario files
//! are such descriptions; for a real GPU, a profiler's counters fill one in. A kernel's
//! utilisation is its phases' mean weighted by their durations at the run's level
//! ([`Gpu::util`]).
//!
//! Validation always scores against the rig (the reference): a model fitted on the
//! logger is judged by how well it predicts what the GPU really draws.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use railtrace_calibration::power::{
    fit_dvfs, fit_time, fit_util, DvfsModel, DvfsObservation, Observation, TimeModel, UtilModel,
    DEFAULT_MAX_PIECES,
};
use serde::{Deserialize, Serialize};

use crate::analysis::correct::CorrectError;
use crate::analysis::logger_model::LoggerModel;
use crate::analysis::stitch::{analyse, cells, mean_over, Analysis, AnalysisError, Options};
use crate::store::recording::{self, Kind, RecordingError, Rows};

/// Why a power model could not be fitted, validated, read or written.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A profiling run could not be analysed.
    #[error(transparent)]
    Analysis(#[from] AnalysisError),
    /// A recording could not be read.
    #[error(transparent)]
    Recording(#[from] RecordingError),
    /// A run's logger profile could not be corrected.
    #[error(transparent)]
    Correct(#[from] CorrectError),
    /// A file, a GPU description, a model or the runs do not hold what is needed, or a
    /// fit or a picture failed: what and why.
    #[error("{0}")]
    Invalid(String),
}

/// A [`ModelError::Invalid`] of a message.
macro_rules! invalid {
    ($($t:tt)*) => { ModelError::Invalid(format!($($t)*)) };
}

/// Returns a [`ModelError::Invalid`] of a message.
macro_rules! refuse {
    ($($t:tt)*) => { return Err(invalid!($($t)*)) };
}

/// The value of `format` in a model file.
pub const FORMAT: &str = "railtrace-power-model";
/// The version this code writes and reads.
pub const VERSION: u32 = 1;

/// The built-in GPU description: the twin's DVFS bench.
pub const DVFS_SCENARIO: &str = include_str!("../../../hardware/scenarios/dvfs.toml");

/// The idle stretch after each execution's end whose rig power is the idle level, s
/// (inside the shortest default delay between executions, 1 ms).
const IDLE_SPAN_S: (f64, f64) = (0.2e-3, 0.8e-3);

/// How far past each execution's end the rig's energy is counted, s (many times its input
/// filter's time constant, inside the idle stretch).
const TAIL_S: f64 = 0.1e-3;

/// Which trace a model is fitted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Against {
    /// The rig's reference samples.
    Rig,
    /// The GPU's own logger, as it stands (stitched, not corrected).
    Logger,
    /// The GPU's logger, stitched and corrected with its identified model.
    Corrected,
}

impl Against {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Against::Rig => "rig",
            Against::Logger => "logger",
            Against::Corrected => "corrected",
        }
    }
}

/// Which model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Utilisation model (EnergAIzer): static + Σ_m c_m·u_m·f·V².
    Util,
    /// DVFS model: constant + (clock + Σ_m a_m·u_m)·f·V² + leakage·V·e^{γ(T − T_ref)},
    /// and each kernel's execution time against frequency.
    Dvfs,
}

impl ModelKind {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Util => "util",
            ModelKind::Dvfs => "dvfs",
        }
    }
}

/// A DVFS level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// Its name.
    pub name: String,
    /// Core clock, Hz.
    pub frequency_hz: f64,
    /// Core voltage, V.
    pub voltage_v: f64,
}

/// A GPU description: its kernels' utilisation and its DVFS levels.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// Where it came from.
    pub origin: String,
    /// Each kernel's phases: (duration at the first level, s; utilisation).
    pub kernels: BTreeMap<String, Vec<(f64, [f64; 3])>>,
    /// The utilisation while idle.
    pub idle_util: [f64; 3],
    /// The levels.
    pub levels: Vec<Level>,
}

#[derive(Deserialize)]
struct GpuFile {
    gpu: GpuSection,
    #[serde(default)]
    kernels: Vec<KernelDesc>,
}

#[derive(Deserialize)]
struct GpuSection {
    #[serde(default)]
    dvfs: Vec<Level>,
    #[serde(default)]
    idle_util: Util,
}

#[derive(Deserialize)]
struct KernelDesc {
    name: String,
    phases: Vec<PhaseDesc>,
}

#[derive(Deserialize)]
struct PhaseDesc {
    duration_s: f64,
    #[serde(default)]
    util: Util,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct Util {
    #[serde(default)]
    compute: f64,
    #[serde(default)]
    memory: f64,
    #[serde(default)]
    other: f64,
}

impl Util {
    fn array(self) -> [f64; 3] {
        [self.compute, self.memory, self.other]
    }
}

impl Gpu {
    /// Reads a description from `path`, or the built-in one (`None`).
    pub fn read(path: Option<&Path>) -> Result<Gpu, ModelError> {
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    invalid!("cannot read the GPU description {}: {e}", p.display())
                })?;
                Gpu::parse(&text, &p.display().to_string())
            }
            None => Gpu::parse(DVFS_SCENARIO, "the built-in hardware/scenarios/dvfs.toml"),
        }
    }

    /// Parses a description; errors name `origin` and what is wrong.
    pub fn parse(text: &str, origin: &str) -> Result<Gpu, ModelError> {
        let f: GpuFile = toml::from_str(text).map_err(|e| invalid!("{origin}: {e}"))?;
        if f.gpu.dvfs.is_empty() {
            refuse!("{origin}: no [[gpu.dvfs]] levels (each a name, frequency_hz and voltage_v)");
        }
        for l in &f.gpu.dvfs {
            if !(l.frequency_hz > 0.0 && l.voltage_v > 0.0) {
                refuse!(
                    "{origin}: DVFS level {:?}: frequency_hz and voltage_v must be > 0",
                    l.name
                );
            }
        }
        let unit = |u: [f64; 3], what: &str| -> Result<[f64; 3], ModelError> {
            if u.iter().all(|x| (0.0..=1.0).contains(x)) {
                Ok(u)
            } else {
                refuse!("{origin}: {what}: utilisation {u:?} outside [0, 1]")
            }
        };
        let mut kernels = BTreeMap::new();
        for k in &f.kernels {
            if k.phases.is_empty() || k.phases.iter().any(|p| p.duration_s <= 0.0) {
                refuse!(
                    "{origin}: kernel {:?}: phases must be there, each of positive duration",
                    k.name
                );
            }
            let phases = (k.phases.iter())
                .map(|p| {
                    Ok((
                        p.duration_s,
                        unit(p.util.array(), &format!("kernel {:?}", k.name))?,
                    ))
                })
                .collect::<Result<Vec<_>, ModelError>>()?;
            kernels.insert(k.name.clone(), phases);
        }
        Ok(Gpu {
            origin: origin.into(),
            kernels,
            idle_util: unit(f.gpu.idle_util.array(), "gpu.idle_util")?,
            levels: f.gpu.dvfs,
        })
    }

    /// The level named `name`, or an error naming the known ones.
    pub fn level(&self, name: &str) -> Result<&Level, ModelError> {
        self.levels.iter().find(|l| l.name == name).ok_or_else(|| {
            invalid!(
                "{}: no DVFS level {name:?} (it has {})",
                self.origin,
                self.levels
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
    }

    /// Kernel `name`'s utilisation at `level`, or an error naming the known kernels: its
    /// phases' mean weighted by their durations there. A phase's compute-bound share `c =
    /// compute / (compute + memory)` (1 when both are 0) scales with the clock, the rest
    /// does not: `duration · (c · f0/f + 1 − c)`, `f0` the first level's (the twin's
    /// rule, hardware/twin/SCENARIOS.md).
    pub fn util(&self, name: &str, level: &Level) -> Result<[f64; 3], ModelError> {
        let phases = self.kernels.get(name).ok_or_else(|| {
            invalid!(
                "{}: no kernel {name:?} (it describes {})",
                self.origin,
                self.kernels.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        let s = self.levels[0].frequency_hz / level.frequency_hz;
        let (mut u, mut total) = ([0.0; 3], 0.0);
        for (d, pu) in phases {
            let c = if pu[0] + pu[1] > 0.0 {
                pu[0] / (pu[0] + pu[1])
            } else {
                1.0
            };
            let w = d * (c * s + 1.0 - c);
            total += w;
            for m in 0..3 {
                u[m] += w * pu[m];
            }
        }
        Ok(u.map(|x| x / total))
    }
}

/// Power as each source saw it, W (NaN where the source was not asked for).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Seen {
    /// The rig's.
    pub rig_w: f64,
    /// The raw logger's.
    pub logger_w: f64,
    /// The corrected logger's.
    pub corrected_w: f64,
}

impl Seen {
    /// The power by `against`.
    pub fn by(&self, against: Against) -> f64 {
        match against {
            Against::Rig => self.rig_w,
            Against::Logger => self.logger_w,
            Against::Corrected => self.corrected_w,
        }
    }
}

/// What one profiling run gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// The recording.
    pub path: PathBuf,
    /// The kernel.
    pub kernel: String,
    /// Its utilisation.
    pub util: [f64; 3],
    /// The DVFS level.
    pub level: Level,
    /// Mean die temperature the logger reported over the run, °C (None: it reported
    /// none).
    pub temp_c: Option<f64>,
    /// Kept executions.
    pub executions: usize,
    /// Their mean duration, s.
    pub time_s: f64,
    /// The kernel's mean power.
    pub power: Seen,
    /// The idle power between executions.
    pub idle: Seen,
}

/// What a profiling run recorded of itself: its kernel and DVFS level (from its
/// settings), and the mean die temperature its logger reported, °C (None: it reported
/// none; recordings before format 4 read as none).
fn recorded(path: &Path) -> Result<(String, Option<String>, Option<f64>), ModelError> {
    let r = recording::read(path)?;
    let s = r.meta.settings.as_ref();
    let kernel = s
        .and_then(|s| s["kernel"].as_str())
        .ok_or_else(|| {
            invalid!(
                "{}: not a profiling run (no kernel in its settings; make one with `railtrace profile`)",
                path.display()
            )
        })?
        .to_string();
    let level = s.and_then(|s| s["dvfs"].as_str()).map(str::to_string);
    let (mut sum, mut n) = (0.0, 0usize);
    for rows in r.rows() {
        let col = rows.f64("logger_temp_c");
        for i in (0..rows.len()).filter(|&i| rows.kind(i) == Kind::Logger) {
            if let Some(t) = Rows::get(col, i).filter(|t| t.is_finite()) {
                sum += t;
                n += 1;
            }
        }
    }
    Ok((kernel, level, (n > 0).then(|| sum / n as f64)))
}

/// A run's stitched logger profile corrected: given the run and its rig capture, its
/// analysis, the corrected power over the kernel and the idle level, W.
pub type Correction<'a> = &'a dyn Fn(&Path, &Path) -> Result<(Analysis, f64, f64), ModelError>;

/// Reads the observations of the profiling run `path` (its rig capture beside it):
/// the rig's and the raw logger's always, the corrected logger's where `correct` is
/// given, on bins `bin_s` wide.
pub fn observe(
    path: &Path,
    gpu: &Gpu,
    correct: Option<Correction<'_>>,
    bin_s: f64,
) -> Result<Run, ModelError> {
    let (kernel, level, temp_c) = recorded(path)?;
    let level = level.ok_or_else(|| {
        invalid!(
            "{}: profiled without a DVFS level: its frequency and voltage are unknown (profile with --dvfs LEVEL)",
            path.display()
        )
    })?;
    let level = gpu.level(&level)?.clone();
    let util = gpu.util(&kernel, &level)?;
    let rig = recording::rig_path(path);
    let (a, corrected): (Analysis, Option<(f64, f64)>) = match correct {
        Some(c) => {
            let (a, p, idle) = c(path, &rig)?;
            (a, Some((p, idle)))
        }
        None => (
            analyse(
                path,
                &rig,
                &Options {
                    bin_s,
                    ..Options::default()
                },
            )?,
            None,
        ),
    };
    let kept = a.kept_durations();
    if kept.is_empty() {
        refuse!("{}: no executions kept", path.display());
    }
    let d = kept.iter().sum::<f64>() / kept.len() as f64;
    let (rig, logger) = (cells(&a.rig), cells(&a.logger));
    let rig_idle = mean_over(&rig, d + IDLE_SPAN_S.0, d + IDLE_SPAN_S.1);
    // The logger's readings after its reach: those past the horizon's last 40 %.
    let late = 0.6 * a.options.horizon_s;
    let logger_idle = mean_over(&logger, late.max(d + IDLE_SPAN_S.0), f64::INFINITY);
    // The rig's input filter moves some of each execution's energy past its end (area is
    // conserved, the rise and fall delayed alike): its energy counted to a margin past
    // the end, less the idle power over the margin.
    let rig_energy = mean_over(&rig, 0.0, d + TAIL_S) * (d + TAIL_S) - rig_idle * TAIL_S;
    let kernel_seen = Seen {
        rig_w: rig_energy / d,
        logger_w: mean_over(&logger, 0.0, d),
        corrected_w: corrected.map_or(f64::NAN, |c| c.0),
    };
    let idle = Seen {
        rig_w: rig_idle,
        logger_w: logger_idle,
        corrected_w: corrected.map_or(f64::NAN, |c| c.1),
    };
    Ok(Run {
        path: path.to_path_buf(),
        kernel,
        util,
        level,
        temp_c,
        executions: kept.len(),
        time_s: d,
        power: kernel_seen,
        idle,
    })
}

/// A utilisation model, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UtilTerms {
    /// Static power, W.
    pub static_w: f64,
    /// Coefficients of compute, memory, other: W/(Hz·V²).
    pub coef: [f64; 3],
    /// Their standard errors (static first).
    pub se: [f64; 4],
    /// RMS residual of the fit, W.
    pub rms_w: f64,
}

/// A DVFS power model, as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DvfsTerms {
    /// Constant power, W.
    pub const_w: f64,
    /// Load-independent dynamic coefficient, W/(Hz·V²).
    pub clock_coef: f64,
    /// Load-dependent coefficients of compute, memory, other, W/(Hz·V²).
    pub dyn_coef: [f64; 3],
    /// Leakage per volt at `t_ref_c`, W/V.
    pub leak_w_per_v: f64,
    /// The leakage's temperature coefficient, 1/°C (0 without the temperature term).
    pub gamma_per_c: f64,
    /// Reference temperature, °C.
    pub t_ref_c: f64,
    /// Standard errors: constant, clock, compute, memory, other, leakage, γ.
    pub se: [f64; 7],
    /// RMS residual of the fit, W.
    pub rms_w: f64,
}

/// A kernel's execution time against frequency, as written: `t(f) = max_j (α_j/f + β_j)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeTerms {
    /// The kernel.
    pub kernel: String,
    /// The pieces `[α cycles, β s]`.
    pub pieces: Vec<[f64; 2]>,
    /// Relative RMS residual.
    pub rms_rel: f64,
    /// Frequencies it was fitted on, Hz.
    pub frequencies_hz: Vec<f64>,
}

impl TimeTerms {
    /// Predicted time at `f`, s.
    pub fn time_s(&self, f: f64) -> f64 {
        (self.pieces.iter())
            .map(|p| p[0] / f + p[1])
            .fold(f64::NEG_INFINITY, f64::max)
    }
}

/// A fitted power model: `model.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerModel {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// Which model.
    pub kind: ModelKind,
    /// Fitted on which trace.
    pub against: Against,
    /// The runs it was fitted on.
    pub inputs: Vec<String>,
    /// The GPU description.
    pub gpu: String,
    /// The kernels it was fitted on.
    pub kernels: Vec<String>,
    /// The levels it was fitted on.
    pub levels: Vec<String>,
    /// When, UTC.
    pub created_utc: String,
    /// The railtrace that made it.
    pub railtrace: String,
    /// The utilisation model (kind `util`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub util: Option<UtilTerms>,
    /// The DVFS model with its temperature term (kind `dvfs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dvfs: Option<DvfsTerms>,
    /// The same fitted without the temperature term (γ = 0), for its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dvfs_without_temperature: Option<DvfsTerms>,
    /// Execution time against frequency, per kernel fitted at two frequencies or more.
    #[serde(default)]
    pub time: Vec<TimeTerms>,
}

fn util_terms(m: &UtilModel) -> UtilTerms {
    UtilTerms {
        static_w: m.static_w,
        coef: m.coef,
        se: [m.static_se_w, m.coef_se[0], m.coef_se[1], m.coef_se[2]],
        rms_w: m.rms_w,
    }
}

fn dvfs_terms(m: &DvfsModel) -> DvfsTerms {
    DvfsTerms {
        const_w: m.const_w,
        clock_coef: m.clock_coef,
        dyn_coef: m.dyn_coef,
        leak_w_per_v: m.leak_w_per_v,
        gamma_per_c: m.gamma_per_c,
        t_ref_c: m.t_ref_c,
        se: m.se,
        rms_w: m.rms_w,
    }
}

impl DvfsTerms {
    /// Predicted power, W (the calibration crate's model, [`DvfsModel::predict`]).
    pub fn predict(&self, util: [f64; 3], f: f64, v: f64, t: f64) -> f64 {
        DvfsModel {
            const_w: self.const_w,
            clock_coef: self.clock_coef,
            dyn_coef: self.dyn_coef,
            leak_w_per_v: self.leak_w_per_v,
            gamma_per_c: self.gamma_per_c,
            t_ref_c: self.t_ref_c,
            with_temperature: self.gamma_per_c != 0.0,
            se: self.se,
            rms_w: self.rms_w,
            at_search_edge: false,
            observations: 0,
        }
        .predict(util, f, v, t)
    }
}

impl UtilTerms {
    /// Predicted power, W (the calibration crate's model, [`UtilModel::predict`]).
    pub fn predict(&self, util: [f64; 3], f: f64, v: f64) -> f64 {
        UtilModel {
            static_w: self.static_w,
            coef: self.coef,
            static_se_w: self.se[0],
            coef_se: [self.se[1], self.se[2], self.se[3]],
            rms_w: self.rms_w,
            observations: 0,
        }
        .predict(util, f, v)
    }
}

/// One observation for the fits: a kernel's or idle's power at a level and temperature.
#[derive(Debug, Clone, PartialEq)]
struct Point3 {
    util: [f64; 3],
    level: Level,
    temp_c: f64,
    power_w: f64,
}

/// The observations `runs` give by `against`: each run's kernel, and its idle.
fn points(
    runs: &[Run],
    gpu: &Gpu,
    against: Against,
    need_temp: bool,
) -> Result<Vec<Point3>, ModelError> {
    let mut out = Vec::new();
    for r in runs {
        let temp_c = match r.temp_c {
            Some(t) => t,
            None if need_temp => refuse!(
                "{}: the logger reported no temperature (recording format 4 has it); fit --kind util, or a logger that reports one",
                r.path.display()
            ),
            None => f64::NAN,
        };
        for (util, p) in [(r.util, r.power), (gpu.idle_util, r.idle)] {
            let w = p.by(against);
            if !w.is_finite() {
                refuse!(
                    "{}: no {} power (the run has too few readings there)",
                    r.path.display(),
                    against.name()
                );
            }
            out.push(Point3 {
                util,
                level: r.level.clone(),
                temp_c,
                power_w: w,
            });
        }
    }
    Ok(out)
}

/// Fits a model of `kind` on `runs` by `against`.
pub fn fit(
    kind: ModelKind,
    against: Against,
    runs: &[Run],
    gpu: &Gpu,
) -> Result<PowerModel, ModelError> {
    if runs.is_empty() {
        refuse!("no runs to fit on");
    }
    let pts = points(runs, gpu, against, kind == ModelKind::Dvfs)?;
    let (mut util, mut dvfs, mut dvfs0) = (None, None, None);
    match kind {
        ModelKind::Util => {
            let obs: Vec<Observation> = pts
                .iter()
                .map(|p| {
                    Observation::new(p.util, p.level.frequency_hz, p.level.voltage_v, p.power_w)
                })
                .collect();
            util = Some(util_terms(
                &fit_util(&obs).map_err(|e| invalid!("the utilisation model: {e}"))?,
            ));
        }
        ModelKind::Dvfs => {
            let obs: Vec<DvfsObservation> = pts
                .iter()
                .map(|p| {
                    DvfsObservation::new(
                        p.util,
                        p.level.frequency_hz,
                        p.level.voltage_v,
                        p.temp_c,
                        p.power_w,
                    )
                })
                .collect();
            let fit = |t: bool| {
                fit_dvfs(&obs, t)
                    .map(|m| dvfs_terms(&m))
                    .map_err(|e| invalid!("the DVFS model: {e}"))
            };
            dvfs = Some(fit(true)?);
            dvfs0 = Some(fit(false)?);
        }
    }
    let mut kernels: Vec<String> = runs.iter().map(|r| r.kernel.clone()).collect();
    kernels.sort();
    kernels.dedup();
    let mut levels: Vec<String> = runs.iter().map(|r| r.level.name.clone()).collect();
    levels.sort();
    levels.dedup();
    // Execution time per kernel seen at two frequencies or more.
    let mut time = Vec::new();
    for k in &kernels {
        let samples: Vec<(f64, f64)> = (runs.iter())
            .filter(|r| &r.kernel == k)
            .map(|r| (r.level.frequency_hz, r.time_s))
            .collect();
        let mut fs: Vec<f64> = samples.iter().map(|s| s.0).collect();
        fs.sort_by(f64::total_cmp);
        fs.dedup();
        if fs.len() < 2 {
            continue;
        }
        let m: TimeModel = fit_time(&samples, DEFAULT_MAX_PIECES)
            .map_err(|e| invalid!("kernel {k}'s execution time: {e}"))?;
        time.push(TimeTerms {
            kernel: k.clone(),
            pieces: m.pieces.iter().map(|&(a, b)| [a, b]).collect(),
            rms_rel: m.rms_rel,
            frequencies_hz: fs,
        });
    }
    Ok(PowerModel {
        format: FORMAT.into(),
        version: VERSION,
        kind,
        against,
        inputs: runs.iter().map(|r| r.path.display().to_string()).collect(),
        gpu: gpu.origin.clone(),
        kernels,
        levels,
        created_utc: recording::iso_utc(recording::host_now_ns()),
        railtrace: env!("CARGO_PKG_VERSION").into(),
        util,
        dvfs,
        dvfs_without_temperature: dvfs0,
        time,
    })
}

impl PowerModel {
    /// Writes the model as TOML.
    pub fn write(&self, path: &Path) -> Result<(), ModelError> {
        let text = toml::to_string_pretty(self).map_err(|e| invalid!("the model: {e}"))?;
        crate::store::write_output(path, text)
            .map_err(|e| invalid!("cannot write {}: {e}", path.display()))
    }

    /// Reads a model, checking its format and version.
    pub fn read(path: &Path) -> Result<PowerModel, ModelError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid!("cannot read the model {}: {e}", path.display()))?;
        let head: toml::Table =
            toml::from_str(&text).map_err(|e| invalid!("{}: {e}", path.display()))?;
        if head.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            refuse!(
                "{}: not a railtrace power model (format is not {FORMAT:?}; make one with `railtrace model fit`)",
                path.display()
            );
        }
        let m: PowerModel =
            toml::from_str(&text).map_err(|e| invalid!("{}: {e}", path.display()))?;
        if m.version != VERSION {
            refuse!(
                "{}: power model version {} (this railtrace reads {VERSION})",
                path.display(),
                m.version
            );
        }
        match m.kind {
            ModelKind::Util if m.util.is_none() => {
                refuse!("{}: kind util without [util]", path.display())
            }
            ModelKind::Dvfs if m.dvfs.is_none() => {
                refuse!("{}: kind dvfs without [dvfs]", path.display())
            }
            _ => Ok(m),
        }
    }

    /// A name for tables: `<kind> on <against>`.
    pub fn label(&self) -> String {
        format!("{} on {}", self.kind.name(), self.against.name())
    }

    /// Predicted power of a kernel of utilisation `util` at `level` and `temp_c`, W; the
    /// DVFS model without its temperature term as the second value (NaN for `util`).
    pub fn power_w(
        &self,
        util: [f64; 3],
        level: &Level,
        temp_c: Option<f64>,
    ) -> Result<(f64, f64), ModelError> {
        let (f, v) = (level.frequency_hz, level.voltage_v);
        if let Some(u) = &self.util {
            return Ok((u.predict(util, f, v), f64::NAN));
        }
        let (Some(d), Some(d0)) = (&self.dvfs, &self.dvfs_without_temperature) else {
            refuse!("the model has no terms");
        };
        let t = temp_c.ok_or_else(|| {
            invalid!("the DVFS model needs the die temperature, and the run's logger reported none")
        })?;
        Ok((d.predict(util, f, v, t), d0.predict(util, f, v, t)))
    }

    /// Kernel `kernel`'s predicted execution time at `f`, s, where the model has it.
    pub fn time_s(&self, kernel: &str, f: f64) -> Option<f64> {
        self.time
            .iter()
            .find(|t| t.kernel == kernel)
            .map(|t| t.time_s(f))
    }
}

/// One run held against one model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scored {
    /// The kernel.
    pub kernel: String,
    /// The level.
    pub level: String,
    /// Mean die temperature, °C.
    pub temp_c: Option<f64>,
    /// The rig's power (the reference), W.
    pub measured_w: f64,
    /// The model's, W.
    pub predicted_w: f64,
    /// The DVFS model's without its temperature term, W (NaN for `util`).
    pub predicted_no_temp_w: f64,
    /// Measured mean execution time, s.
    pub measured_s: f64,
    /// The model's, s (the measured one where it has no time model for the kernel).
    pub predicted_s: f64,
    /// Whether `predicted_s` is the model's own.
    pub time_modelled: bool,
    /// The kernel was among those it was fitted on.
    pub kernel_seen: bool,
    /// The level was among those it was fitted on.
    pub level_seen: bool,
}

impl Scored {
    /// Power error, % of the measured.
    pub fn power_pct(&self) -> f64 {
        100.0 * (self.predicted_w - self.measured_w) / self.measured_w
    }
    /// Energy per execution error, % (predicted power × predicted time against measured).
    pub fn energy_pct(&self) -> f64 {
        100.0 * (self.predicted_w * self.predicted_s - self.measured_w * self.measured_s)
            / (self.measured_w * self.measured_s)
    }
    /// Execution time error, %.
    pub fn time_pct(&self) -> f64 {
        100.0 * (self.predicted_s - self.measured_s) / self.measured_s
    }
}

/// Scores `model` on `runs` against the rig.
pub fn score(model: &PowerModel, runs: &[Run]) -> Result<Vec<Scored>, ModelError> {
    runs.iter()
        .map(|r| {
            let (p, p0) = model
                .power_w(r.util, &r.level, r.temp_c)
                .map_err(|e| invalid!("{}: {e}", r.path.display()))?;
            let t = model.time_s(&r.kernel, r.level.frequency_hz);
            Ok(Scored {
                kernel: r.kernel.clone(),
                level: r.level.name.clone(),
                temp_c: r.temp_c,
                measured_w: r.power.rig_w,
                predicted_w: p,
                predicted_no_temp_w: p0,
                measured_s: r.time_s,
                predicted_s: t.unwrap_or(r.time_s),
                time_modelled: t.is_some(),
                kernel_seen: model.kernels.contains(&r.kernel),
                level_seen: model.levels.contains(&r.level.name),
            })
        })
        .collect()
}

/// Mean absolute error of `pct` over `rows`, %.
pub fn mae(rows: &[&Scored], pct: impl Fn(&Scored) -> f64) -> f64 {
    rows.iter().map(|r| pct(r).abs()).sum::<f64>() / rows.len().max(1) as f64
}

#[cfg(feature = "plots")]
/// Colours of the models in a picture, in order.
const COLOURS: [(u8, u8, u8); 6] = [
    (0x1f, 0x77, 0xb4),
    (0xd6, 0x27, 0x28),
    (0x2c, 0xa0, 0x2c),
    (0xff, 0x7f, 0x0e),
    (0x94, 0x67, 0xbd),
    (0x8c, 0x56, 0x4b),
];

#[cfg(feature = "plots")]
/// A picture of a validation, PNG or SVG by `out`'s extension: each model's predicted
/// power against the rig's (the diagonal is perfect; hollow marks are held-out kernels
/// or levels), and the kernels' execution time against frequency (measured, and the
/// first model's time curves).
pub fn plot(
    models: &[(PowerModel, Vec<Scored>)],
    runs: &[Run],
    out: &Path,
) -> Result<(), ModelError> {
    use plotters::prelude::*;
    type Dr<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;
    fn draw<DB: DrawingBackend>(
        root: DrawingArea<DB, plotters::coord::Shift>,
        models: &[(PowerModel, Vec<Scored>)],
        runs: &[Run],
    ) -> Dr<DB> {
        root.fill(&WHITE)?;
        let root = root.titled(
            "railtrace model validate: against the rig",
            ("sans-serif", 24),
        )?;
        let (left, right) = root.split_horizontally(root.dim_in_pixel().0 / 2);
        let all = models.iter().flat_map(|(_, s)| s.iter());
        let (lo, hi) = all
            .flat_map(|s| [s.measured_w, s.predicted_w])
            .filter(|x| x.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(x), b.max(x))
            });
        let (lo, hi) = if hi > lo {
            (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        } else {
            (0.0, 1.0)
        };
        let mut c = ChartBuilder::on(&left)
            .caption("predicted against measured power", ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(lo..hi, lo..hi)?;
        c.configure_mesh()
            .x_desc("the rig's power, W")
            .y_desc("the model's, W")
            .label_style(("sans-serif", 14))
            .draw()?;
        c.draw_series(std::iter::once(PathElement::new(
            vec![(lo, lo), (hi, hi)],
            BLACK.mix(0.4),
        )))?;
        for (i, (m, rows)) in models.iter().enumerate() {
            let (r, g, b) = COLOURS[i % COLOURS.len()];
            let col = RGBColor(r, g, b);
            c.draw_series(rows.iter().map(|s| {
                let style = if s.kernel_seen && s.level_seen {
                    col.filled()
                } else {
                    col.stroke_width(2)
                };
                Circle::new((s.measured_w, s.predicted_w), 5, style)
            }))?
            .label(m.label())
            .legend(move |(x, y)| Circle::new((x, y), 5, col.filled()));
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 14))
            .draw()?;
        // Time against frequency.
        let (flo, fhi) = runs
            .iter()
            .map(|r| r.level.frequency_hz * 1e-9)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(x), b.max(x))
            });
        let (flo, fhi) = if fhi > flo {
            (flo - 0.1 * (fhi - flo), fhi + 0.1 * (fhi - flo))
        } else {
            (flo - 0.1, flo + 0.1)
        };
        let thi = runs.iter().map(|r| r.time_s * 1e6).fold(0.0, f64::max) * 1.15;
        let mut c = ChartBuilder::on(&right)
            .caption("execution time against the core clock", ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(flo..fhi, 0.0..thi.max(1.0))?;
        c.configure_mesh()
            .x_desc("core clock, GHz")
            .y_desc("mean execution time, µs")
            .label_style(("sans-serif", 14))
            .draw()?;
        let mut kernels: Vec<&str> = runs.iter().map(|r| r.kernel.as_str()).collect();
        kernels.sort();
        kernels.dedup();
        for (i, k) in kernels.iter().enumerate() {
            let (r, g, b) = COLOURS[i % COLOURS.len()];
            let col = RGBColor(r, g, b);
            c.draw_series((runs.iter().filter(|r| r.kernel == *k)).map(|r| {
                Cross::new(
                    (r.level.frequency_hz * 1e-9, r.time_s * 1e6),
                    6,
                    col.stroke_width(2),
                )
            }))?
            .label(k.to_string())
            .legend(move |(x, y)| Cross::new((x, y), 5, col.stroke_width(2)));
            if let Some(t) = models
                .iter()
                .find_map(|(m, _)| m.time.iter().find(|t| t.kernel == *k))
            {
                c.draw_series(LineSeries::new(
                    (0..=100).map(|j| {
                        let f = flo + (fhi - flo) * f64::from(j) / 100.0;
                        (f, t.time_s(f * 1e9) * 1e6)
                    }),
                    col.mix(0.6),
                ))?;
            }
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 14))
            .draw()?;
        root.present()
    }
    let drawn = || -> anyhow::Result<()> {
        crate::store::plot::draw_to!(out, (1600, 800), |root| draw(root, models, runs));
        Ok(())
    };
    drawn().map_err(|e| invalid!("{e:#}"))
}

/// Observes every run of `inputs` (a rig capture among them, `*.rig.arrow`, is read with
/// its run, not as a run), telling `on` of each: its number, of how many, its path, what
/// it gave and the seconds it took.
///
/// # Errors
///
/// As [`observe`].
pub fn observe_all(
    inputs: &[PathBuf],
    gpu: &Gpu,
    correct: Option<Correction<'_>>,
    bin_s: f64,
    mut on: impl FnMut(usize, usize, &Path, &Run, f64),
) -> Result<Vec<Run>, ModelError> {
    let inputs: Vec<&PathBuf> = (inputs.iter()).filter(|p| !is_rig_capture(p)).collect();
    let mut runs = Vec::new();
    for (i, p) in inputs.iter().enumerate() {
        let t0 = std::time::Instant::now();
        let r = observe(p, gpu, correct, bin_s)?;
        on(i, inputs.len(), p, &r, t0.elapsed().as_secs_f64());
        runs.push(r);
    }
    Ok(runs)
}

/// A rig's capture (`*.rig.arrow`), read with its run rather than as one.
pub fn is_rig_capture(path: &Path) -> bool {
    path.to_string_lossy().ends_with(".rig.arrow")
}

/// A model of `kind` fitted on the runs of `inputs` by `against` (see [`observe_all`] for
/// `on`); against the corrected logger, each run's stitched logger profile is corrected
/// with `logger` (its model and the model's path) on bins `bin_s` wide.
///
/// # Errors
///
/// Against the corrected logger without its model, a run that cannot be observed or
/// corrected, or too few runs for the fit.
pub fn fit_runs(
    kind: ModelKind,
    against: Against,
    inputs: &[PathBuf],
    gpu: &Gpu,
    logger: Option<&(LoggerModel, PathBuf)>,
    bin_s: f64,
    on: impl FnMut(usize, usize, &Path, &Run, f64),
) -> Result<(PowerModel, Vec<Run>), ModelError> {
    let correct_fn = |run: &Path, rig: &Path| -> Result<_, ModelError> {
        let (m, p) = logger.ok_or_else(|| {
            invalid!(
                "against the corrected logger needs the logger's model (from `railtrace calibrate`)"
            )
        })?;
        let accuracy = crate::analysis::correct::recorded_accuracy(rig);
        let c = crate::analysis::correct::correct(run, rig, m, p, bin_s, accuracy)?;
        Ok((c.analysis, c.d.energy_j / c.duration_s, c.idle_w))
    };
    let correct: Option<Correction<'_>> = (against == Against::Corrected).then_some(&correct_fn);
    let runs = observe_all(inputs, gpu, correct, bin_s, on)?;
    let m = fit(kind, against, &runs, gpu)?;
    Ok((m, runs))
}

impl Run {
    /// What the run gave, in a line: the kernel, level and temperature, the executions,
    /// the power and the idle power by the rig, the logger and the corrected logger.
    pub fn describe(&self) -> String {
        let na = |x: f64| {
            if x.is_finite() {
                format!("{x:.1}")
            } else {
                "-".into()
            }
        };
        format!(
            "{} at {}, {} °C, {} executions of {:.1} µs; power W rig {} logger {} corrected {}; idle W rig {} logger {} corrected {}",
            self.kernel,
            self.level.name,
            self.temp_c.map_or("-".into(), |t| format!("{t:.1}")),
            self.executions,
            self.time_s * 1e6,
            na(self.power.rig_w),
            na(self.power.logger_w),
            na(self.power.corrected_w),
            na(self.idle.rig_w),
            na(self.idle.logger_w),
            na(self.idle.corrected_w),
        )
    }
}

impl PowerModel {
    /// The model, for people: its terms and fits, a line each.
    pub fn describe(&self) -> String {
        let m = self;
        let mut s = String::new();
        let nf = 1e-9; // W/(Hz·V²) shown as W/(GHz·V²)
        if let Some(u) = &m.util {
            let _ = writeln!(
            s,
            "  P = {:.1} W + ({:.1}·u_compute + {:.1}·u_memory + {:.1}·u_other) W/(GHz·V²) · f·V²   (rms {:.2} W)",
            u.static_w,
            u.coef[0] / nf,
            u.coef[1] / nf,
            u.coef[2] / nf,
            u.rms_w
        );
        }
        for (name, d) in [
            ("with temperature", &m.dvfs),
            ("without", &m.dvfs_without_temperature),
        ] {
            if let Some(d) = d {
                let _ = writeln!(
                s,
                "  {name:<16} P = {:.1} W + ({:.1} + {:.1}·u_c + {:.1}·u_m + {:.1}·u_o) W/(GHz·V²) · f·V² + {:.1} W/V · V·e^({:.4}·(T − {:.0} °C))   (rms {:.2} W)",
                d.const_w,
                d.clock_coef / nf,
                d.dyn_coef[0] / nf,
                d.dyn_coef[1] / nf,
                d.dyn_coef[2] / nf,
                d.leak_w_per_v,
                d.gamma_per_c,
                d.t_ref_c,
                d.rms_w
            );
            }
        }
        if let Some(d) = &m.dvfs {
            let _ = writeln!(
                s,
                "  leakage temperature coefficient γ = {:.4} ± {:.4} /°C",
                d.gamma_per_c, d.se[6]
            );
        }
        for t in &m.time {
            let pieces: Vec<String> = (t.pieces.iter())
                .map(|p| format!("{:.0} cycles/f + {:.2} µs", p[0], p[1] * 1e6))
                .collect();
            let _ = writeln!(
                s,
                "  time {:<12} max({})   (rms {:.2} %, {} frequencies)",
                t.kernel,
                pieces.join(", "),
                t.rms_rel * 100.0,
                t.frequencies_hz.len()
            );
        }
        s
    }
}

/// The errors over `rows`: power, energy and time MAE, %.
fn errors(rows: &[&Scored]) -> serde_json::Value {
    let timed: Vec<&Scored> = rows.iter().copied().filter(|r| r.time_modelled).collect();
    serde_json::json!({
        "runs": rows.len(),
        "power_mae_pct": mae(rows, Scored::power_pct),
        "energy_mae_pct": mae(rows, Scored::energy_pct),
        "time_mae_pct": if timed.is_empty() { None } else { Some(mae(&timed, Scored::time_pct)) },
        "power_mae_no_temp_pct": if rows.iter().all(|r| r.predicted_no_temp_w.is_finite()) {
            Some(mae(rows, |r| 100.0 * (r.predicted_no_temp_w - r.measured_w) / r.measured_w))
        } else {
            None
        },
    })
}

/// One model's validation as JSON: every run, per kernel, overall, held-out apart.
pub fn validation(m: &PowerModel, s: &[Scored]) -> serde_json::Value {
    let all: Vec<&Scored> = s.iter().collect();
    let pick =
        |f: &dyn Fn(&Scored) -> bool| -> Vec<&Scored> { s.iter().filter(|r| f(r)).collect() };
    let mut kernels: Vec<&str> = s.iter().map(|r| r.kernel.as_str()).collect();
    kernels.sort();
    kernels.dedup();
    let per_kernel: serde_json::Map<String, serde_json::Value> = kernels
        .iter()
        .map(|k| (k.to_string(), errors(&pick(&|r| r.kernel == *k))))
        .collect();
    let rows: Vec<serde_json::Value> = s
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["power_pct"] = r.power_pct().into();
            v["energy_pct"] = r.energy_pct().into();
            v["time_pct"] = r.time_pct().into();
            v
        })
        .collect();
    serde_json::json!({
        "label": m.label(),
        "kind": m.kind,
        "against": m.against,
        "kernels_fitted": m.kernels,
        "levels_fitted": m.levels,
        "gamma_per_c": m.dvfs.as_ref().map(|d| d.gamma_per_c),
        "gamma_se_per_c": m.dvfs.as_ref().map(|d| d.se[6]),
        "overall": errors(&all),
        "held_out_kernels": errors(&pick(&|r| !r.kernel_seen)),
        "held_out_levels": errors(&pick(&|r| !r.level_seen)),
        "seen": errors(&pick(&|r| r.kernel_seen && r.level_seen)),
        "per_kernel": per_kernel,
        "rows": rows,
    })
}

/// One model's validation for people (`j`: its [`validation`]).
pub fn validation_table(m: &PowerModel, s: &[Scored], j: &serde_json::Value) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{} (fitted on {}; levels {}):",
        m.label(),
        m.kernels.join(", "),
        m.levels.join(", ")
    );
    let _ = writeln!(
        t,
        "  {:<12} {:<6} {:>6} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8}  held out",
        "kernel", "level", "°C", "rig W", "model W", "power", "time µs", "time", "energy"
    );
    for r in s {
        let held = match (r.kernel_seen, r.level_seen) {
            (true, true) => "",
            (false, true) => "kernel",
            (true, false) => "level",
            (false, false) => "kernel, level",
        };
        let _ = writeln!(
            t,
            "  {:<12} {:<6} {:>6} {:>9.1} {:>9.1} {:>+7.2}% {:>9.1} {:>8} {:>+7.2}%  {held}",
            r.kernel,
            r.level,
            r.temp_c.map_or("-".into(), |x| format!("{x:.1}")),
            r.measured_w,
            r.predicted_w,
            r.power_pct(),
            r.measured_s * 1e6,
            if r.time_modelled {
                format!("{:+.2}%", r.time_pct())
            } else {
                "-".into()
            },
            r.energy_pct(),
        );
    }
    let line = |name: &str, e: &serde_json::Value| {
        if e["runs"].as_u64().unwrap_or(0) == 0 {
            return String::new();
        }
        let f = |k: &str| e[k].as_f64().map_or("-".into(), |x| format!("{x:.2} %"));
        format!(
            "  {name:<22} power MAE {:>8}, energy MAE {:>8}, time MAE {:>8}{}  ({} runs)\n",
            f("power_mae_pct"),
            f("energy_mae_pct"),
            f("time_mae_pct"),
            if e["power_mae_no_temp_pct"].is_f64() {
                format!(
                    ", without the temperature term {}",
                    f("power_mae_no_temp_pct")
                )
            } else {
                String::new()
            },
            e["runs"]
        )
    };
    if let Some(k) = j["per_kernel"].as_object() {
        for (name, e) in k {
            t.push_str(&line(name, e));
        }
    }
    t.push_str(&line("overall", &j["overall"]));
    t.push_str(&line("held-out kernels", &j["held_out_kernels"]));
    t.push_str(&line("held-out levels", &j["held_out_levels"]));
    t
}
