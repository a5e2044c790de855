//! The twin's GPU: kernels of phases with known power, run by an endless workload.
//!
//! The configuration ([`GpuConfig`], [`KernelConfig`], [`WorkloadConfig`]) is plain data,
//! deserialisable from a scenario file; [`Gpu`] turns it into the true power timeline as
//! a stream of [`Segment`]s ([`Gpu::next_segment`]) and a record of every kernel
//! execution ([`Gpu::drain_executions`]). [`GpuClock`] is the GPU's timestamp counter.
//!
//! # The model
//!
//! All times are the twin's true time in s, powers in W, temperatures in °C.
//!
//! - **Idle.** Between executions the GPU draws `idle_power_w` (launch overheads, random
//!   delays, idle steps, back-to-back gaps); with a power model, the model's power at
//!   `idle_util` (below).
//! - **Workload.** [`WorkloadConfig::steps`] is repeated forever. A
//!   [`Step::Launch`] first waits a delay drawn uniformly in `[min_delay_s, max_delay_s]`
//!   (FinGraV's random delay, which makes the logger's samples land at every offset into
//!   the kernel), then the host launches; after `launch_overhead_s` the kernel runs
//!   `count` times back to back (a *train*), separated by `back_to_back_gap_s`.
//! - **Phases.** Execution `k` of a train at DVFS level `L` runs every phase of its kernel
//!   in turn; phase `j` lasts
//!   `duration_s[j] * dvfs_time_factor(L, j) * time_factor(k)` and draws
//!   `idle_power_w + (power_w[j] - idle_power_w) * power_scale(L) * power_factor(k)`
//!   (clamped at 0 W), or the power model's value (below).
//! - **DVFS.** `power_scale(L)` multiplies the dynamic power (above idle). The time
//!   scale `s = time_scale(L)` applies to the *compute-bound share* of a phase,
//!   `c = compute / (compute + memory)` from its utilisation (1 when both are 0), so
//!   `dvfs_time_factor(L, j) = c * s + (1 - c)`: a memory-bound phase keeps its duration
//!   when the core clock drops. Unset scales derive from the level's frequency and
//!   voltage relative to the first (reference) level: `time_scale = f0 / f`,
//!   `power_scale = (V / V0)^2 * f / f0` (CV²f).
//! - **Execution time.** `time_factor(k) = mode * outlier * warmup(k)`: `mode` is drawn
//!   from one of [`TimeDistribution::modes`] (chosen by weight) as
//!   `scale * (1 + spread * N(0, 1))` (redrawn while not positive); with probability
//!   `outlier_probability` the execution is an outlier and `outlier = 1 + (outlier_scale
//!   - 1) * Exp(1)` (mean `outlier_scale`), else 1; `warmup(k) = 1 + (first_time_scale -
//!   1) * exp(-k / settle_executions)`.
//! - **Power settling (SSE vs SSP).** `power_factor = 1 + (sse_to_ssp_ratio - 1) *
//!   exp(-u / tau_s)` where `u` is the time from the start of the train's first execution
//!   to the start of this one, evaluated once per execution. The first executions draw
//!   `sse_to_ssp_ratio` times the settled (SSP) dynamic power; the train then settles
//!   with time constant `tau_s`. Every train starts unsettled again.
//!
//! ## The power model (`[gpu.power_model]`, optional)
//!
//! With [`GpuConfig::power_model`], the power of every piece of the timeline follows from
//! its utilisation `u` (the phase's `util`, or `idle_util` while idle), the DVFS level in
//! effect (`f`, `V`) and the die temperature `T` at the piece's start:
//!
//! ```text
//! P = static_w
//!   + k_clock · f · V²
//!   + power_factor · Σ_m k_m · u_m · f · V²                  m ∈ {compute, memory, other}
//!   + leak_w · (V / V0) · exp(leak_per_c · (T − t_ref_c))
//!
//! k_m = {compute_w, memory_w, other_w}[m] / (f0 · V0²),   k_clock = clock_w / (f0 · V0²)
//! ```
//!
//! `f0`, `V0` are the first DVFS level's (at least one is then required), so `compute_w`,
//! `memory_w`, `other_w` are the dynamic powers at utilisation 1 and `clock_w` the
//! load-independent dynamic power (clock tree, always-on logic) at the reference level,
//! and `leak_w` is the leakage at `V0` and `t_ref_c`. `power_factor` is the execution's
//! settling factor above (1 while idle); it multiplies only the load-dependent dynamic
//! term. The phases' `power_w`, `gpu.idle_power_w` and the levels' `power_scale` are then
//! refused; `time_scale` still sets the durations. Without a thermal model `T = t_ref_c`.
//! Without `[gpu.power_model]` every power is computed exactly as above, unchanged.
//!
//! ## The thermal model (`[gpu.thermal]`, optional)
//!
//! `tau_s · dT/dt = ambient_c + r_c_per_w · P − T`, from `T(0) = initial_c` (default
//! `ambient_c`). The timeline is piecewise constant, so `T` is advanced exactly over each
//! segment at that segment's power, `T ← T∞ + (T − T∞) · exp(−Δt / tau_s)` with
//! `T∞ = ambient_c + r_c_per_w · P`, and the leakage of a segment is evaluated at the
//! temperature at its start. Idle stretches and phases longer than `max_step_s` (default
//! 1 ms) are cut into pieces of at most that length, so that `T` and the leakage follow
//! (without a thermal model, pieces are cut at [`MAX_STRETCH_S`], which only a phase
//! stretched by its time multipliers can reach);
//! the leakage held over a piece instead of following `T` within it costs at most
//! `r_c_per_w · L' · |dT/dt| · max_step_s / (1 − r_c_per_w · L')` in `T`, with `L'` the
//! largest slope of the leakage in `T` (W/°C). The thermal model needs no power model:
//! with the phases' `power_w` it only records the temperature. Each [`Segment`] comes
//! with its [`SegmentState`] (level, frequency, voltage, temperature at its start) from
//! [`Gpu::next_segment_with_state`].
//!
//! ## DVFS switching
//!
//! The GPU has a *current* level, the first one at true time 0. A switch asked for at
//! `t` takes effect at `t + dvfs_switch_latency_s` (default 0), or later in two cases:
//! never before a switch asked for earlier, and never inside the part of the timeline
//! already generated (the switch then lands at its end). The timeline is generated one
//! piece at a time, as it is consumed: a phase, or a piece of one, or an idle stretch (cut
//! at `max_step_s` with a thermal model), so a request made at the time the rig has
//! reached lands exactly whenever the latency is longer than that piece. Switches come
//! from:
//!
//! - the host: [`Gpu::request_dvfs`], or [`HostDvfsRequest`]s in [`HostLaunches`] (what
//!   `Twin::request_dvfs` queues). The level changes wherever the switch lands, inside
//!   a kernel too: the phase under way finishes the rest of its work at the new level's
//!   speed (`remaining fraction × its duration at the new level`) and power. A request
//!   of the level already set is recorded too, changing nothing;
//! - a launch naming a level (every workload step does: the first level when `dvfs` is
//!   absent; a host launch does when its level is not [`CURRENT_DVFS_LEVEL`]) other than
//!   the one the GPU is at or switching to: the switch is asked for at the launch, and the
//!   train's first execution starts at `max(launch + launch_overhead_s, effective time)`,
//!   so that the whole train runs at its level. With a latency of 0 this is the
//!   behaviour of a level per launch, unchanged.
//!
//! A host launch at [`CURRENT_DVFS_LEVEL`] runs at the current level. The level persists
//! after a train, so with a power model the idle power changes with it. Every switch is
//! recorded as a [`DvfsSwitch`] ([`Gpu::drain_dvfs_switches`]) once its effective time
//! has been reached. [`Execution::dvfs_level`] is the level at the execution's start.
//!
//! # Randomness
//!
//! The PRNG is PCG64 (`pcg64`, `Lcg128Xsl64` of the `rand_pcg` crate, value-stable across
//! releases), through [`crate::random`]. The timeline uses one stream of the seed
//! and host reads of the timestamp counter ([`Gpu::read_clock`]) another, so reading the
//! clock never changes the timeline. A given seed and
//! configuration give bit-identical output on every platform with IEEE-754 `f64` and the
//! same `libm` (`exp`, `ln`, `cos`).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::random::{normal, rng, uniform, Rng};
use crate::trace::{Segment, Util};

/// A configuration value out of range, or a reference to something that does not exist.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A numeric field out of its documented range.
    #[error("{field} = {value:?}: {reason}")]
    Invalid {
        /// Path of the field (e.g. `kernels[0].phases[1].duration_s`).
        field: String,
        /// The offending value.
        value: f64,
        /// What the value must satisfy.
        reason: &'static str,
    },
    /// A structural problem (empty list, missing or misplaced field).
    #[error("{field}: {reason}")]
    Structure {
        /// Path of the field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A workload step names a kernel that is not configured.
    #[error("workload.steps[{step}]: unknown kernel {name:?}")]
    UnknownKernel {
        /// Index of the step.
        step: usize,
        /// The name it gave.
        name: String,
    },
    /// A workload step names a DVFS level that is not configured.
    #[error("workload.steps[{step}]: unknown DVFS level {name:?}")]
    UnknownDvfs {
        /// Index of the step.
        step: usize,
        /// The name it gave.
        name: String,
    },
}

pub(crate) fn check(
    field: impl FnOnce() -> String,
    value: f64,
    ok: bool,
    reason: &'static str,
) -> Result<(), ConfigError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            field: field(),
            value,
            reason,
        })
    }
}

pub(crate) fn positive(field: impl FnOnce() -> String, value: f64) -> Result<(), ConfigError> {
    check(field, value, value > 0.0, "must be finite and > 0")
}

pub(crate) fn non_negative(field: impl FnOnce() -> String, value: f64) -> Result<(), ConfigError> {
    check(field, value, value >= 0.0, "must be finite and >= 0")
}

/// `value` finite and within `range`, or an error saying `reason`.
pub(crate) fn within(
    field: impl FnOnce() -> String,
    value: f64,
    range: std::ops::RangeInclusive<f64>,
    reason: &'static str,
) -> Result<(), ConfigError> {
    check(field, value, range.contains(&value), reason)
}

/// A stretch of time: `0..=`[`MAX_STRETCH_S`].
pub(crate) fn stretch(field: impl FnOnce() -> String, value: f64) -> Result<(), ConfigError> {
    within(
        field,
        value,
        0.0..=MAX_STRETCH_S,
        "must be >= 0, at most 10 s",
    )
}

/// The time multipliers allowed: `1 / MAX_TIME_FACTOR..=MAX_TIME_FACTOR`.
fn time_factors() -> std::ops::RangeInclusive<f64> {
    1.0 / MAX_TIME_FACTOR..=MAX_TIME_FACTOR
}

/// A time multiplier: within [`time_factors`].
fn time_factor(field: impl FnOnce() -> String, value: f64) -> Result<(), ConfigError> {
    within(field, value, time_factors(), "must be within 0.1 to 10")
}

/// The longest stretch of time one value of a scenario may give, s: a kernel phase, an
/// idle step, a random delay, a launch overhead, a back-to-back gap, a DVFS switch, a
/// counter read, a logger's period, window, delay or read. A profiling bench repeats its
/// workload every few seconds (no such stretch in the shipped scenarios is above
/// 110 ms), and ten seconds of any one of them is a bench left alone. It also bounds the
/// twin's work: a stretch is one piece of power, and a logger reports over a piece all
/// at once (at most 10 s / 10 µs = one million reports).
pub const MAX_STRETCH_S: f64 = 10.0;

/// The shortest kernel phase, s: 1 ns, a few cycles of a GPU's 1-3 GHz clock; no part of
/// a kernel's run is shorter.
pub const MIN_PHASE_S: f64 = 1e-9;

/// The shortest idle step, s: 1 µs, as short as a host's sleep or a launch goes.
pub const MIN_IDLE_S: f64 = 1e-6;

/// The most executions in one back-to-back train: a million, ten seconds of 10 µs
/// kernels (the shipped scenarios run at most 390).
pub const MAX_TRAIN: u32 = 1_000_000;

/// The most a time multiplier may stretch a kernel's time, or shrink it (by its
/// inverse): a DVFS level's `time_scale`, a mode's `scale`, a warm-up's
/// `first_time_scale`, an outlier's `outlier_scale`. A GPU's core clocks span about
/// 0.3-3 GHz, and a kernel ten times slower or faster than its nominal time is another
/// kernel.
pub const MAX_TIME_FACTOR: f64 = 10.0;

/// The longest a clock may have run before the twin starts, s: ten years of uptime. At
/// the fastest counter allowed (10 GHz) that is 3.2e18 ticks, within 64 bits.
pub const MAX_UPTIME_S: f64 = 10.0 * 365.25 * 86_400.0;

fn half() -> f64 {
    0.5
}

fn one() -> f64 {
    1.0
}

fn one_u32() -> u32 {
    1
}

/// The GPU board: idle power, launch behaviour, DVFS levels and timestamp counter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// Board power while no kernel runs (idle steps, random delays, launch overheads,
    /// back-to-back gaps), in W. Also the baseline above which DVFS and power settling
    /// scale a phase's power. Required without [`power_model`](GpuConfig::power_model),
    /// refused with it; NaN stands for "absent".
    #[serde(default = "absent", skip_serializing_if = "is_absent")]
    pub idle_power_w: f64,
    /// Utilisation reported while idle (fractions); default all 0.
    #[serde(default)]
    pub idle_util: Util,
    /// Time from the host's launch call to the start of the kernel's first phase, in s
    /// (the GPU idles meanwhile); `0..=`[`MAX_STRETCH_S`]. Paid once per back-to-back
    /// train.
    pub launch_overhead_s: f64,
    /// Idle gap between consecutive executions of one back-to-back train, in s;
    /// `0..=`[`MAX_STRETCH_S`]; default 0.
    #[serde(default)]
    pub back_to_back_gap_s: f64,
    /// DVFS levels (the first is the reference for derived scales); default: one nominal
    /// level with both scales 1.
    #[serde(default)]
    pub dvfs: Vec<DvfsLevel>,
    /// The GPU's timestamp counter and the cost of reading it from the host.
    pub clock: ClockConfig,
    /// Time from a DVFS request to the new level taking effect, in s;
    /// `0..=`[`MAX_STRETCH_S`]. Default 0: a launch's level applies at once.
    #[serde(default)]
    pub dvfs_switch_latency_s: f64,
    /// The true power as a function of utilisation, frequency, voltage and temperature;
    /// default none: phases give their power as `power_w`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_model: Option<PowerModelConfig>,
    /// A first-order thermal model of the die; default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thermal: Option<ThermalConfig>,
}

/// The true power model (see the [module documentation](self) for the formula): every
/// dynamic coefficient is the power at utilisation 1 at the reference (first) DVFS level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerModelConfig {
    /// Power independent of level, load and temperature (board, fans, memory refresh),
    /// in W; >= 0.
    pub static_w: f64,
    /// Load-independent dynamic power (clock tree, always-on logic) at the reference
    /// level, in W; >= 0; scales with `f * V^2`. Default 0.
    #[serde(default)]
    pub clock_w: f64,
    /// Dynamic power of the compute units at utilisation 1 at the reference level, in W;
    /// >= 0.
    pub compute_w: f64,
    /// Dynamic power of the memory system at utilisation 1 at the reference level, in W;
    /// >= 0.
    pub memory_w: f64,
    /// Dynamic power of everything else at utilisation 1 at the reference level, in W;
    /// >= 0.
    pub other_w: f64,
    /// Leakage at the reference voltage and `t_ref_c`, in W; >= 0. Default 0.
    #[serde(default)]
    pub leak_w: f64,
    /// Relative growth of the leakage per °C, in 1/°C; within 0..=1. Default 0.
    #[serde(default)]
    pub leak_per_c: f64,
    /// Temperature at which the leakage is `leak_w`, in °C; finite. Default 25.
    #[serde(default = "default_t_ref")]
    pub t_ref_c: f64,
}

fn default_t_ref() -> f64 {
    25.0
}

/// A first-order thermal model of the die: `tau_s * dT/dt = ambient_c + r_c_per_w * P - T`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThermalConfig {
    /// Ambient (coolant) temperature, in °C; finite.
    pub ambient_c: f64,
    /// Thermal resistance from die to ambient, in °C/W; >= 0.
    pub r_c_per_w: f64,
    /// Thermal time constant, in s; > 0 and at most an hour (a die under its heatsink
    /// settles in seconds to minutes; an hour is the room's).
    pub tau_s: f64,
    /// Temperature at true time 0, in °C; default `ambient_c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_c: Option<f64>,
    /// Longest piece of constant power, in s: longer idle stretches and phases are cut
    /// so that the temperature and the leakage follow. Default 1 ms. From 10 µs (the
    /// die's temperature moves in milliseconds, and the twin makes at most 100 000
    /// pieces a second) to [`MAX_STRETCH_S`].
    #[serde(default = "default_max_step")]
    pub max_step_s: f64,
}

fn default_max_step() -> f64 {
    1e-3
}

fn absent() -> f64 {
    f64::NAN
}

fn is_absent(x: &f64) -> bool {
    x.is_nan()
}

/// One DVFS operating point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DvfsLevel {
    /// Name that workload steps use to select the level.
    pub name: String,
    /// Core clock frequency, in Hz; 1 MHz to 10 GHz (GPU cores clock at 0.1-3 GHz).
    pub frequency_hz: f64,
    /// Core voltage, in V.
    pub voltage_v: f64,
    /// Multiplier on the compute-bound share of every phase's duration (dimensionless);
    /// default `f0 / frequency_hz` with `f0` the first level's frequency. Given or
    /// derived, within `1 / MAX_TIME_FACTOR..=MAX_TIME_FACTOR` ([`MAX_TIME_FACTOR`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_scale: Option<f64>,
    /// Multiplier on every phase's dynamic power, the part above `idle_power_w`
    /// (dimensionless); default `(voltage_v / V0)^2 * frequency_hz / f0` with `V0`, `f0`
    /// those of the first level. Refused with [`GpuConfig::power_model`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_scale: Option<f64>,
}

/// The GPU's timestamp counter (e.g. `s_memrealtime` on AMD, `%globaltimer` on NVIDIA).
///
/// Counter reading at true time `t`: `floor((offset_s + t * (1 + drift_ppm * 1e-6)) *
/// rate_hz)` ticks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockConfig {
    /// Nominal counting rate, in Hz (ticks per second of the counter's own time); 1 kHz
    /// to 10 GHz (GPU counters count at 25 MHz to 1 GHz).
    pub rate_hz: f64,
    /// Counter time at true time 0, in s; must be >= 0 (the counter is unsigned), and at
    /// most [`MAX_UPTIME_S`]. Default 0.
    #[serde(default)]
    pub offset_s: f64,
    /// Rate error against true time, in parts per million (positive: counts fast).
    /// Default 0.
    #[serde(default)]
    pub drift_ppm: f64,
    /// Fixed time a host read of the counter takes, from issue to return, in s;
    /// `0..=`[`MAX_STRETCH_S`]. Default 0.
    #[serde(default)]
    pub read_latency_s: f64,
    /// Extra read time drawn uniformly in `[0, read_jitter_s]` per read, in s;
    /// `0..=`[`MAX_STRETCH_S`]. Default 0.
    #[serde(default)]
    pub read_jitter_s: f64,
    /// Where in `[issue, return]` the counter is latched, as a fraction in `0..=1`
    /// (dimensionless). Default 0.5.
    #[serde(default = "half")]
    pub read_latch_fraction: f64,
}

/// One kernel: its phases and how its executions vary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelConfig {
    /// Name that workload steps use to launch the kernel.
    pub name: String,
    /// The phases, run in order; at least one.
    pub phases: Vec<PhaseConfig>,
    /// Spread of the execution time; default: no spread.
    #[serde(default)]
    pub time: TimeDistribution,
    /// How the first executions of a train run slower or faster; default: none.
    #[serde(default)]
    pub warmup: Warmup,
    /// How the power settles over a back-to-back train; default: none.
    #[serde(default)]
    pub power_settling: PowerSettling,
}

/// One phase of a kernel at the reference DVFS level, settled (SSP) power and nominal time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseConfig {
    /// Nominal duration, in s; [`MIN_PHASE_S`] to [`MAX_STRETCH_S`].
    pub duration_s: f64,
    /// Board power during the phase, in W (total, idle included); >= 0. Required without
    /// [`GpuConfig::power_model`], refused with it (the power then follows from `util`);
    /// NaN stands for "absent".
    #[serde(default = "absent", skip_serializing_if = "is_absent")]
    pub power_w: f64,
    /// Utilisation during the phase; default all 0.
    #[serde(default)]
    pub util: Util,
}

/// A multi-modal execution-time distribution with outliers, as a multiplier on the
/// nominal duration (see the [module documentation](self) for the formula).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeDistribution {
    /// The modes; at least one. Default: a single mode of scale 1 without spread.
    pub modes: Vec<TimeMode>,
    /// Probability that an execution is an outlier, in `0..=1`. Default 0.
    #[serde(default)]
    pub outlier_probability: f64,
    /// Mean multiplier of an outlier's time, from 1 to [`MAX_TIME_FACTOR`]
    /// (dimensionless); an outlier's extra factor is `1 + (outlier_scale - 1) * Exp(1)`.
    /// Default 2.
    #[serde(default = "default_outlier_scale")]
    pub outlier_scale: f64,
}

fn default_outlier_scale() -> f64 {
    2.0
}

impl Default for TimeDistribution {
    fn default() -> Self {
        TimeDistribution {
            modes: vec![TimeMode {
                weight: 1.0,
                scale: 1.0,
                spread: 0.0,
            }],
            outlier_probability: 0.0,
            outlier_scale: default_outlier_scale(),
        }
    }
}

/// One mode of the execution-time distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeMode {
    /// Relative weight, >= 0 (the weights need not sum to 1; at least one must be > 0).
    pub weight: f64,
    /// Mean multiplier on the nominal duration (dimensionless), within
    /// `1 / MAX_TIME_FACTOR..=MAX_TIME_FACTOR` ([`MAX_TIME_FACTOR`]).
    pub scale: f64,
    /// Relative standard deviation of the multiplier, 0 to 1 (dimensionless; a mode is a
    /// peak of the times, and one wider than its mean is none): the mode's multiplier is
    /// `scale * (1 + spread * N(0, 1))`.
    #[serde(default)]
    pub spread: f64,
}

/// Warm-up: the first executions of a train take `first_time_scale` times as long,
/// settling as `1 + (first_time_scale - 1) * exp(-k / settle_executions)` for execution
/// index `k` (0-based) in the train.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Warmup {
    /// Time multiplier of the first execution of a train (dimensionless), within
    /// `1 / MAX_TIME_FACTOR..=MAX_TIME_FACTOR` ([`MAX_TIME_FACTOR`]). Default 1.
    #[serde(default = "one")]
    pub first_time_scale: f64,
    /// Settling constant, in executions: > 0, at most a train's [`MAX_TRAIN`]. Default 1.
    #[serde(default = "one")]
    pub settle_executions: f64,
}

impl Default for Warmup {
    fn default() -> Self {
        Warmup {
            first_time_scale: 1.0,
            settle_executions: 1.0,
        }
    }
}

/// Power settling over a back-to-back train (FinGraV's SSE vs SSP): the dynamic power is
/// multiplied by `1 + (sse_to_ssp_ratio - 1) * exp(-u / tau_s)`, `u` the time since the
/// train's first execution started, evaluated at each execution's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PowerSettling {
    /// Dynamic power at the start of a train over the settled (SSP) one, > 0
    /// (dimensionless; < 1: the early, stable-time executions draw less). Default 1.
    #[serde(default = "one")]
    pub sse_to_ssp_ratio: f64,
    /// Settling time constant, in s of back-to-back running: > 0, at most
    /// [`MAX_STRETCH_S`]. Default 1 ms.
    #[serde(default = "default_settle_tau")]
    pub tau_s: f64,
}

fn default_settle_tau() -> f64 {
    1e-3
}

impl Default for PowerSettling {
    fn default() -> Self {
        PowerSettling {
            sse_to_ssp_ratio: 1.0,
            tau_s: default_settle_tau(),
        }
    }
}

/// The workload: steps repeated forever, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadConfig {
    /// The steps; at least one.
    pub steps: Vec<Step>,
}

/// One workload step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Idle for a while.
    Idle {
        /// How long, in s; [`MIN_IDLE_S`] to [`MAX_STRETCH_S`].
        duration_s: f64,
    },
    /// After a random delay, launch a kernel `count` times back to back.
    Launch {
        /// Name of the kernel (a [`KernelConfig::name`]).
        kernel: String,
        /// Executions in the train, 1 to [`MAX_TRAIN`]. Default 1.
        #[serde(default = "one_u32")]
        count: u32,
        /// Shortest random delay before the launch, in s; `0..=`[`MAX_STRETCH_S`].
        /// Default 0.
        #[serde(default)]
        min_delay_s: f64,
        /// Longest random delay before the launch, in s; from `min_delay_s` to
        /// [`MAX_STRETCH_S`]. Default 0.
        #[serde(default)]
        max_delay_s: f64,
        /// Name of the DVFS level (a [`DvfsLevel::name`]); default: the first level.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dvfs: Option<String>,
    },
}

impl GpuConfig {
    /// An MI300X-like board: 140 W idle, 5 µs launch overhead, three DVFS levels (2.1,
    /// 1.7 and 1.3 GHz), a 100 MHz timestamp counter 20 ppm fast, host reads of 2 µs ± 1 µs.
    pub fn mi300x_like() -> Self {
        GpuConfig {
            idle_power_w: 140.0,
            idle_util: Util::IDLE,
            launch_overhead_s: 5e-6,
            back_to_back_gap_s: 1e-6,
            dvfs: vec![
                DvfsLevel {
                    name: "high".into(),
                    frequency_hz: 2.1e9,
                    voltage_v: 0.95,
                    time_scale: None,
                    power_scale: None,
                },
                DvfsLevel {
                    name: "mid".into(),
                    frequency_hz: 1.7e9,
                    voltage_v: 0.85,
                    time_scale: None,
                    power_scale: None,
                },
                DvfsLevel {
                    name: "low".into(),
                    frequency_hz: 1.3e9,
                    voltage_v: 0.75,
                    time_scale: None,
                    power_scale: None,
                },
            ],
            clock: ClockConfig {
                rate_hz: 100e6,
                offset_s: 1234.5,
                drift_ppm: 20.0,
                read_latency_s: 2e-6,
                read_jitter_s: 1e-6,
                read_latch_fraction: 0.5,
            },
            dvfs_switch_latency_s: 0.0,
            power_model: None,
            thermal: None,
        }
    }

    /// Checks every field against its documented range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (&self.power_model, self.idle_power_w.is_nan()) {
            (None, true) => {
                return Err(ConfigError::Structure {
                    field: "gpu.idle_power_w".into(),
                    reason: "required without [gpu.power_model]".into(),
                })
            }
            (None, false) => non_negative(|| "gpu.idle_power_w".into(), self.idle_power_w)?,
            (Some(_), false) => {
                return Err(ConfigError::Structure {
                    field: "gpu.idle_power_w".into(),
                    reason: "does not apply with [gpu.power_model]: the idle power follows \
                             from gpu.idle_util"
                        .into(),
                })
            }
            (Some(_), true) => {}
        }
        if !self.idle_util.is_valid() {
            return Err(ConfigError::Structure {
                field: "gpu.idle_util".into(),
                reason: "every fraction must be within 0 to 1".into(),
            });
        }
        stretch(|| "gpu.launch_overhead_s".into(), self.launch_overhead_s)?;
        stretch(|| "gpu.back_to_back_gap_s".into(), self.back_to_back_gap_s)?;
        for (i, level) in self.dvfs.iter().enumerate() {
            within(
                || format!("gpu.dvfs[{i}].frequency_hz"),
                level.frequency_hz,
                1e6..=1e10,
                "must be within 1 MHz to 10 GHz",
            )?;
            positive(|| format!("gpu.dvfs[{i}].voltage_v"), level.voltage_v)?;
            if let Some(s) = level.time_scale {
                time_factor(|| format!("gpu.dvfs[{i}].time_scale"), s)?;
            } else if let Some(first) = self.dvfs.first() {
                check(
                    || format!("gpu.dvfs[{i}].frequency_hz"),
                    level.frequency_hz,
                    time_factors().contains(&(first.frequency_hz / level.frequency_hz)),
                    "must be within a factor of 10 of the first level's (its time_scale, \
                     f0 / frequency_hz, is within 0.1 to 10)",
                )?;
            }
            if let Some(s) = level.power_scale {
                non_negative(|| format!("gpu.dvfs[{i}].power_scale"), s)?;
            }
            if self.dvfs[..i].iter().any(|l| l.name == level.name) {
                return Err(ConfigError::Structure {
                    field: format!("gpu.dvfs[{i}].name"),
                    reason: format!("duplicate DVFS level name {:?}", level.name),
                });
            }
            if self.power_model.is_some() && level.power_scale.is_some() {
                return Err(ConfigError::Structure {
                    field: format!("gpu.dvfs[{i}].power_scale"),
                    reason: "does not apply with [gpu.power_model]: the power follows from \
                             frequency_hz and voltage_v"
                        .into(),
                });
            }
        }
        self.clock.validate()?;
        stretch(
            || "gpu.dvfs_switch_latency_s".into(),
            self.dvfs_switch_latency_s,
        )?;
        if let Some(m) = &self.power_model {
            if self.dvfs.is_empty() {
                return Err(ConfigError::Structure {
                    field: "gpu.dvfs".into(),
                    reason: "[gpu.power_model] needs at least one [[gpu.dvfs]] level (the \
                             first is the reference)"
                        .into(),
                });
            }
            for (name, value) in [
                ("static_w", m.static_w),
                ("clock_w", m.clock_w),
                ("compute_w", m.compute_w),
                ("memory_w", m.memory_w),
                ("other_w", m.other_w),
                ("leak_w", m.leak_w),
            ] {
                non_negative(|| format!("gpu.power_model.{name}"), value)?;
            }
            check(
                || "gpu.power_model.leak_per_c".into(),
                m.leak_per_c,
                (0.0..=1.0).contains(&m.leak_per_c),
                "must be within 0 to 1 (per °C)",
            )?;
            check(
                || "gpu.power_model.t_ref_c".into(),
                m.t_ref_c,
                true,
                "must be finite",
            )?;
        }
        if let Some(t) = &self.thermal {
            check(
                || "gpu.thermal.ambient_c".into(),
                t.ambient_c,
                t.ambient_c > -273.15,
                "must be finite and above -273.15 °C",
            )?;
            non_negative(|| "gpu.thermal.r_c_per_w".into(), t.r_c_per_w)?;
            check(
                || "gpu.thermal.tau_s".into(),
                t.tau_s,
                t.tau_s > 0.0 && t.tau_s <= 3600.0,
                "must be finite and > 0, at most 3600 s",
            )?;
            if let Some(c) = t.initial_c {
                check(
                    || "gpu.thermal.initial_c".into(),
                    c,
                    c > -273.15,
                    "must be finite and above -273.15 °C",
                )?;
            }
            within(
                || "gpu.thermal.max_step_s".into(),
                t.max_step_s,
                1e-5..=MAX_STRETCH_S,
                "must be > 0: within 10 µs to 10 s",
            )?;
        }
        Ok(())
    }

    /// The (time, power) scales of every DVFS level, derived where unset; one nominal
    /// level `(1, 1)` when none is configured.
    pub fn dvfs_scales(&self) -> Vec<(f64, f64)> {
        let Some(reference) = self.dvfs.first() else {
            return vec![(1.0, 1.0)];
        };
        self.dvfs
            .iter()
            .map(|l| {
                let f = l.frequency_hz / reference.frequency_hz;
                let v = l.voltage_v / reference.voltage_v;
                (
                    l.time_scale.unwrap_or(1.0 / f),
                    l.power_scale.unwrap_or(v * v * f),
                )
            })
            .collect()
    }
}

impl ClockConfig {
    /// Checks every field against its documented range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        within(
            || "gpu.clock.rate_hz".into(),
            self.rate_hz,
            1e3..=1e10,
            "must be within 1 kHz to 10 GHz",
        )?;
        within(
            || "gpu.clock.offset_s".into(),
            self.offset_s,
            0.0..=MAX_UPTIME_S,
            "must be >= 0, at most ten years (3.16e8 s)",
        )?;
        check(
            || "gpu.clock.drift_ppm".into(),
            self.drift_ppm,
            self.drift_ppm.abs() < 1e5,
            "must be finite and within ±1e5 ppm",
        )?;
        stretch(|| "gpu.clock.read_latency_s".into(), self.read_latency_s)?;
        stretch(|| "gpu.clock.read_jitter_s".into(), self.read_jitter_s)?;
        check(
            || "gpu.clock.read_latch_fraction".into(),
            self.read_latch_fraction,
            (0.0..=1.0).contains(&self.read_latch_fraction),
            "must be within 0 to 1",
        )
    }
}

impl KernelConfig {
    /// An MI300X-like ~200 µs kernel of two phases: a compute-heavy 100 µs at 620 W,
    /// then a memory-heavy 100 µs at 430 W. Two execution-time modes (85 % at 1.0, 15 %
    /// at 1.08, 1 % spread), 0.5 % outliers, a 30 % slower first execution settling over
    /// one execution, and an SSE drawing 85 % of the SSP dynamic power, settling in 3 ms.
    pub fn mi300x_like_two_phase(name: &str) -> Self {
        KernelConfig {
            name: name.into(),
            phases: vec![
                PhaseConfig {
                    duration_s: 100e-6,
                    power_w: 620.0,
                    util: Util::new(0.9, 0.3, 0.1),
                },
                PhaseConfig {
                    duration_s: 100e-6,
                    power_w: 430.0,
                    util: Util::new(0.2, 0.9, 0.1),
                },
            ],
            time: TimeDistribution {
                modes: vec![
                    TimeMode {
                        weight: 0.85,
                        scale: 1.0,
                        spread: 0.01,
                    },
                    TimeMode {
                        weight: 0.15,
                        scale: 1.08,
                        spread: 0.01,
                    },
                ],
                outlier_probability: 0.005,
                outlier_scale: 1.5,
            },
            warmup: Warmup {
                first_time_scale: 1.3,
                settle_executions: 1.0,
            },
            power_settling: PowerSettling {
                sse_to_ssp_ratio: 0.85,
                tau_s: 3e-3,
            },
        }
    }

    /// Nominal duration at the reference DVFS level (sum of the phases), in s.
    pub fn nominal_duration_s(&self) -> f64 {
        self.phases.iter().map(|p| p.duration_s).sum()
    }

    /// Checks every field against its documented range; `i` is the kernel's index, for
    /// messages.
    pub fn validate(&self, i: usize) -> Result<(), ConfigError> {
        if self.phases.is_empty() {
            return Err(ConfigError::Structure {
                field: format!("kernels[{i}].phases"),
                reason: "a kernel needs at least one phase".into(),
            });
        }
        for (j, p) in self.phases.iter().enumerate() {
            within(
                || format!("kernels[{i}].phases[{j}].duration_s"),
                p.duration_s,
                MIN_PHASE_S..=MAX_STRETCH_S,
                "must be within 1 ns to 10 s",
            )?;
            // An absent power_w (NaN) is checked against the power model by `Gpu::new`.
            if !p.power_w.is_nan() {
                non_negative(|| format!("kernels[{i}].phases[{j}].power_w"), p.power_w)?;
            }
            if !p.util.is_valid() {
                return Err(ConfigError::Structure {
                    field: format!("kernels[{i}].phases[{j}].util"),
                    reason: "every fraction must be within 0 to 1".into(),
                });
            }
        }
        let t = &self.time;
        if t.modes.is_empty() {
            return Err(ConfigError::Structure {
                field: format!("kernels[{i}].time.modes"),
                reason: "at least one mode is needed".into(),
            });
        }
        for (j, m) in t.modes.iter().enumerate() {
            non_negative(|| format!("kernels[{i}].time.modes[{j}].weight"), m.weight)?;
            time_factor(|| format!("kernels[{i}].time.modes[{j}].scale"), m.scale)?;
            within(
                || format!("kernels[{i}].time.modes[{j}].spread"),
                m.spread,
                0.0..=1.0,
                "must be within 0 to 1",
            )?;
        }
        let total: f64 = t.modes.iter().map(|m| m.weight).sum();
        positive(
            || format!("kernels[{i}].time.modes (sum of weights)"),
            total,
        )?;
        check(
            || format!("kernels[{i}].time.outlier_probability"),
            t.outlier_probability,
            (0.0..=1.0).contains(&t.outlier_probability),
            "must be within 0 to 1",
        )?;
        within(
            || format!("kernels[{i}].time.outlier_scale"),
            t.outlier_scale,
            1.0..=MAX_TIME_FACTOR,
            "must be within 1 to 10",
        )?;
        time_factor(
            || format!("kernels[{i}].warmup.first_time_scale"),
            self.warmup.first_time_scale,
        )?;
        check(
            || format!("kernels[{i}].warmup.settle_executions"),
            self.warmup.settle_executions,
            self.warmup.settle_executions > 0.0
                && self.warmup.settle_executions <= f64::from(MAX_TRAIN),
            "must be finite and > 0, at most 1000000",
        )?;
        positive(
            || format!("kernels[{i}].power_settling.sse_to_ssp_ratio"),
            self.power_settling.sse_to_ssp_ratio,
        )?;
        check(
            || format!("kernels[{i}].power_settling.tau_s"),
            self.power_settling.tau_s,
            self.power_settling.tau_s > 0.0 && self.power_settling.tau_s <= MAX_STRETCH_S,
            "must be finite and > 0, at most 10 s",
        )
    }
}

impl WorkloadConfig {
    /// FinGraV-style profiling of one kernel: trains of 20 back-to-back executions, each
    /// after a random delay uniform in [0.5, 1.5] ms (one full 1 ms logger period wide),
    /// then 5 ms idle.
    pub fn fingrav_like(kernel: &str) -> Self {
        WorkloadConfig {
            steps: vec![
                Step::Launch {
                    kernel: kernel.into(),
                    count: 20,
                    min_delay_s: 0.5e-3,
                    max_delay_s: 1.5e-3,
                    dvfs: None,
                },
                Step::Idle { duration_s: 5e-3 },
            ],
        }
    }
}

/// The GPU's timestamp counter: rate, offset and drift against true time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuClock {
    rate_hz: f64,
    offset_s: f64,
    drift_ppm: f64,
}

/// One host read of the GPU timestamp counter, all times true time in s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockRead {
    /// When the host issued the read.
    pub issue_s: f64,
    /// When the counter was latched (between issue and return).
    pub latch_s: f64,
    /// When the value reached the host.
    pub return_s: f64,
    /// The counter value read.
    pub ticks: u64,
}

impl GpuClock {
    /// A counter of nominal rate `rate_hz` (Hz), reading `offset_s` (s, >= 0) at true
    /// time 0 and running `drift_ppm` (ppm) fast.
    pub fn new(rate_hz: f64, offset_s: f64, drift_ppm: f64) -> Result<Self, ConfigError> {
        ClockConfig {
            rate_hz,
            offset_s,
            drift_ppm,
            read_latency_s: 0.0,
            read_jitter_s: 0.0,
            read_latch_fraction: 0.5,
        }
        .validate()?;
        Ok(GpuClock {
            rate_hz,
            offset_s,
            drift_ppm,
        })
    }

    /// The counter of a configuration.
    pub fn from_config(config: &ClockConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(GpuClock {
            rate_hz: config.rate_hz,
            offset_s: config.offset_s,
            drift_ppm: config.drift_ppm,
        })
    }

    /// Nominal rate, Hz.
    pub fn rate_hz(&self) -> f64 {
        self.rate_hz
    }

    /// Counter time at true time 0, s.
    pub fn offset_s(&self) -> f64 {
        self.offset_s
    }

    /// Rate error, ppm.
    pub fn drift_ppm(&self) -> f64 {
        self.drift_ppm
    }

    /// Ticks per second of true time: `rate_hz * (1 + drift_ppm * 1e-6)`.
    pub fn effective_rate_hz(&self) -> f64 {
        self.rate_hz * (1.0 + self.drift_ppm * 1e-6)
    }

    /// The counter's own (unquantised) time at true time `t_s`, in s:
    /// `offset_s + t_s * (1 + drift_ppm * 1e-6)`.
    pub fn counter_time_s(&self, true_time_s: f64) -> f64 {
        self.offset_s + true_time_s * (1.0 + self.drift_ppm * 1e-6)
    }

    /// The counter value at true time `t_s`: `floor(counter_time_s(t_s) * rate_hz)`,
    /// saturating at 0 before the counter started.
    pub fn ticks_at(&self, true_time_s: f64) -> u64 {
        let ticks = (self.counter_time_s(true_time_s) * self.rate_hz).floor();
        if ticks > 0.0 {
            ticks as u64
        } else {
            0
        }
    }

    /// The true time, in s, at which the counter reaches `ticks` (the inverse of
    /// [`ticks_at`](GpuClock::ticks_at): `ticks_at(true_time_at(n)) == n`, and the time
    /// is the earliest `f64` with that property up to a few ulps).
    pub fn true_time_at(&self, ticks: u64) -> f64 {
        let scale = 1.0 + self.drift_ppm * 1e-6;
        let mut t = (ticks as f64 / self.rate_hz - self.offset_s) / scale;
        // Correct the last few ulps of rounding so that the round trip is exact.
        for _ in 0..64 {
            if self.ticks_at(t) >= ticks {
                break;
            }
            t = next_up(t);
        }
        for _ in 0..64 {
            let prev = next_down(t);
            if self.ticks_at(prev) >= ticks {
                t = prev;
            } else {
                break;
            }
        }
        t
    }

    /// A host read issued at true time `issue_s` that takes `latency_s` (s) and latches
    /// the counter at `latch_fraction` (0..=1) of the way.
    pub fn read(&self, issue_s: f64, latency_s: f64, latch_fraction: f64) -> ClockRead {
        let latch_s = issue_s + latency_s * latch_fraction;
        ClockRead {
            issue_s,
            latch_s,
            return_s: issue_s + latency_s,
            ticks: self.ticks_at(latch_s),
        }
    }
}

fn next_up(x: f64) -> f64 {
    if x.is_nan() || x == f64::INFINITY {
        x
    } else if x == 0.0 {
        f64::from_bits(1)
    } else if x > 0.0 {
        f64::from_bits(x.to_bits() + 1)
    } else {
        f64::from_bits(x.to_bits() - 1)
    }
}

fn next_down(x: f64) -> f64 {
    -next_up(-x)
}

/// The record of one kernel execution, all times true time in s.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// Index of the kernel in the configured list.
    pub kernel: usize,
    /// Number of the train (0 for the first train of the run).
    pub train: u64,
    /// Position in the back-to-back train, 0-based.
    pub index_in_train: u32,
    /// When the host launched the train (after the random delay).
    pub launch_s: f64,
    /// Start of the first phase.
    pub start_s: f64,
    /// End of the last phase.
    pub end_s: f64,
    /// Phase boundaries: phase `j` runs over `[phase_bounds_s[j], phase_bounds_s[j + 1])`;
    /// the first is `start_s`, the last `end_s`.
    pub phase_bounds_s: Vec<f64>,
    /// Index of the DVFS level at the execution's start (0 when none is configured); a
    /// switch asked for by the host may land inside the execution (see the segments'
    /// [`SegmentState`]s).
    pub dvfs_level: usize,
    /// Index of the execution-time mode drawn.
    pub mode: usize,
    /// Whether the execution is an outlier.
    pub outlier: bool,
    /// Total time multiplier against the nominal duration at this DVFS level:
    /// mode, outlier and warm-up factors together (dimensionless).
    pub time_factor: f64,
    /// Power-settling multiplier on the dynamic power (dimensionless, 1 when settled).
    pub power_factor: f64,
    /// True energy of the execution, from `start_s` to `end_s`, idle power included, J.
    pub energy_j: f64,
}

impl Execution {
    /// Duration, s.
    pub fn duration_s(&self) -> f64 {
        self.end_s - self.start_s
    }
}

#[derive(Debug, Clone)]
enum Item {
    Segment(Segment, SegmentState),
    Done(Box<Execution>),
    Switch(DvfsSwitch),
}

#[derive(Debug, Clone)]
enum ResolvedStep {
    Idle {
        duration_s: f64,
    },
    Launch {
        kernel: usize,
        count: u32,
        min_delay_s: f64,
        max_delay_s: f64,
        dvfs: usize,
    },
}

/// A unit of work still to generate, one piece at a time.
#[derive(Debug, Clone)]
enum Task {
    /// Idle this long from wherever the task starts.
    IdleFor(f64),
    /// Idle until this instant.
    IdleUntil(f64),
    /// A train's launch at `generated_s`, with the DVFS level it names.
    Launch(Option<usize>),
    /// The train's first execution starts (after the launch's switch, if it waits).
    Start(bool),
    /// One execution, not started.
    Execute { kernel: usize, index_in_train: u32 },
    /// One execution under way.
    Run(Box<Running>),
    /// The end of a train.
    EndTrain,
}

/// An execution under way.
#[derive(Debug, Clone)]
struct Running {
    kernel: usize,
    index_in_train: u32,
    mode: usize,
    outlier: bool,
    time_factor: f64,
    power_factor: f64,
    start_s: f64,
    level: usize,
    bounds: Vec<f64>,
    /// The phase under way.
    phase: usize,
    /// The fraction of its work still to do.
    remaining: f64,
    energy_j: f64,
}

/// The GPU's state over one [`Segment`] (see [`Gpu::next_segment_with_state`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegmentState {
    /// Index of the DVFS level in effect over the whole segment (0 when none is
    /// configured).
    pub dvfs_level: usize,
    /// That level's core clock, Hz; `None` when no `[[gpu.dvfs]]` level is configured.
    pub frequency_hz: Option<f64>,
    /// That level's core voltage, V; `None` when no level is configured.
    pub voltage_v: Option<f64>,
    /// Die temperature at the segment's start, °C: the thermal model's state with
    /// `[gpu.thermal]`, else `power_model.t_ref_c` with `[gpu.power_model]`, else `None`
    /// (not modelled). The segment's power was evaluated at this temperature.
    pub temperature_c: Option<f64>,
}

/// What asked for a DVFS switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchCause {
    /// A request from the host ([`Gpu::request_dvfs`], `Twin::request_dvfs`).
    Request,
    /// A launch that named a level other than the one the GPU was at or switching to
    /// (a workload step, or a host launch with an explicit level).
    Launch,
}

/// One DVFS switch, all times true time in s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DvfsSwitch {
    /// When the switch was asked for.
    pub request_s: f64,
    /// When the new level took effect: `request_s + dvfs_switch_latency_s`, unless the
    /// timeline had already been generated past that instant, or an earlier switch was
    /// still pending (see the [module documentation](self)).
    pub effective_s: f64,
    /// Level before the switch.
    pub from: usize,
    /// Level after the switch (equal to `from` for a request of the level already set).
    pub to: usize,
    /// What asked for it.
    pub cause: SwitchCause,
}

/// The simulated GPU: an endless, seeded, deterministic stream of the true power and a
/// record of the executions behind it (see the [module documentation](self)).
#[derive(Debug, Clone)]
pub struct Gpu {
    config: GpuConfig,
    kernels: Vec<KernelConfig>,
    steps: Vec<ResolvedStep>,
    /// (time scale, power scale) per DVFS level.
    dvfs: Vec<(f64, f64)>,
    /// With a power model: per level, (`(f / f0) * (V / V0)^2`, `V / V0`).
    model_levels: Vec<(f64, f64)>,
    clock: GpuClock,
    rng: Rng,
    read_rng: Rng,
    /// End of everything generated so far (queued or emitted).
    generated_s: f64,
    /// End of the last segment returned by `next_segment`.
    emitted_s: f64,
    step: usize,
    in_step: u32,
    train: u64,
    train_launch_s: f64,
    train_start_s: f64,
    queue: VecDeque<Item>,
    done: VecDeque<Execution>,
    switched: VecDeque<DvfsSwitch>,
    record: bool,
    host: Option<std::sync::Arc<std::sync::Mutex<HostLaunches>>>,
    /// What is still to generate of the current workload step or host train.
    tasks: VecDeque<Task>,
    /// DVFS level in effect at `generated_s`.
    level: usize,
    /// Switches requested whose effective time lies at or after `generated_s`, in order.
    switches: VecDeque<DvfsSwitch>,
    /// The level once every pending switch has taken effect.
    target: usize,
    /// Effective time of the last switch that changes the level.
    settled_s: f64,
    /// Temperature at `generated_s`, °C (see [`SegmentState::temperature_c`]).
    temperature_c: Option<f64>,
    /// Longest segment generated: `thermal.max_step_s` with a thermal model, else
    /// [`MAX_STRETCH_S`].
    max_piece_s: f64,
    last_state: Option<SegmentState>,
}

/// How long the GPU idles between looks at the host's queue while the host drives it, s
/// (the most a host launch waits for the GPU to notice it).
pub const HOST_POLL_S: f64 = 50e-6;

/// [`HostLaunch::dvfs`] for a launch that runs at the GPU's current level (no switch).
pub const CURRENT_DVFS_LEVEL: usize = usize::MAX;

/// Launches asked for by the host (a GPU runner), which then drives the GPU instead of
/// the scenario's workload: once `active`, the workload stops at the end of its current
/// step and the GPU idles until a launch is queued.
#[derive(Debug, Default)]
pub struct HostLaunches {
    /// The host drives the GPU.
    pub active: bool,
    /// Launches not yet started, oldest first.
    pub queue: VecDeque<HostLaunch>,
    /// DVFS switches asked for and not yet seen by the GPU, oldest first. The GPU takes
    /// them whenever it generates more of its timeline, whether or not `active` is set;
    /// they do not wait for the launches queued before them.
    pub dvfs_requests: VecDeque<HostDvfsRequest>,
}

/// One launch asked for by the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLaunch {
    /// True time of the host's call, s: the train starts no earlier (plus the launch
    /// overhead).
    pub at_s: f64,
    /// Index of the kernel in the configured list.
    pub kernel: usize,
    /// Executions back to back, >= 1.
    pub count: u32,
    /// Index of the DVFS level; [`CURRENT_DVFS_LEVEL`] (or any index out of range) runs at
    /// the level in effect. An explicit level other than the one the GPU is at or
    /// switching to is requested at the launch, and the train's first execution waits
    /// for it to take effect.
    pub dvfs: usize,
}

/// One DVFS switch asked for by the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostDvfsRequest {
    /// True time of the host's call, s: the level changes `dvfs_switch_latency_s` later.
    pub at_s: f64,
    /// Index of the DVFS level.
    pub level: usize,
}

/// Stream of the timeline's generator (see [`crate::random::rng`]).
const TIMELINE_STREAM: u64 = 0;
/// Stream of the clock-read generator.
const READ_STREAM: u64 = 1;

impl Gpu {
    /// A GPU at true time 0, idle, about to start the workload's first step.
    ///
    /// Checks every configuration and resolves the kernel and DVFS names of the steps.
    pub fn new(
        gpu: GpuConfig,
        kernels: Vec<KernelConfig>,
        workload: WorkloadConfig,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        gpu.validate()?;
        let model = gpu.power_model.is_some();
        for (i, k) in kernels.iter().enumerate() {
            k.validate(i)?;
            if kernels[..i].iter().any(|o| o.name == k.name) {
                return Err(ConfigError::Structure {
                    field: format!("kernels[{i}].name"),
                    reason: format!("duplicate kernel name {:?}", k.name),
                });
            }
            for (j, p) in k.phases.iter().enumerate() {
                let reason = match (model, p.power_w.is_nan()) {
                    (true, false) => {
                        "does not apply with [gpu.power_model]: the phase's power follows \
                         from its util"
                    }
                    (false, true) => "required without [gpu.power_model]",
                    _ => continue,
                };
                return Err(ConfigError::Structure {
                    field: format!("kernels[{i}].phases[{j}].power_w"),
                    reason: reason.into(),
                });
            }
        }
        if workload.steps.is_empty() {
            return Err(ConfigError::Structure {
                field: "workload.steps".into(),
                reason: "at least one step is needed".into(),
            });
        }
        let mut steps = Vec::with_capacity(workload.steps.len());
        for (i, step) in workload.steps.iter().enumerate() {
            steps.push(match step {
                Step::Idle { duration_s } => {
                    within(
                        || format!("workload.steps[{i}].duration_s"),
                        *duration_s,
                        MIN_IDLE_S..=MAX_STRETCH_S,
                        "must be within 1 µs to 10 s",
                    )?;
                    ResolvedStep::Idle {
                        duration_s: *duration_s,
                    }
                }
                Step::Launch {
                    kernel,
                    count,
                    min_delay_s,
                    max_delay_s,
                    dvfs,
                } => {
                    let k = kernels
                        .iter()
                        .position(|k| &k.name == kernel)
                        .ok_or_else(|| ConfigError::UnknownKernel {
                            step: i,
                            name: kernel.clone(),
                        })?;
                    if !(1..=MAX_TRAIN).contains(count) {
                        return Err(ConfigError::Structure {
                            field: format!("workload.steps[{i}].count"),
                            reason: format!("must be within 1 to {MAX_TRAIN}, not {count}"),
                        });
                    }
                    stretch(|| format!("workload.steps[{i}].min_delay_s"), *min_delay_s)?;
                    check(
                        || format!("workload.steps[{i}].max_delay_s"),
                        *max_delay_s,
                        max_delay_s >= min_delay_s && *max_delay_s <= MAX_STRETCH_S,
                        "must be finite and >= min_delay_s, at most 10 s",
                    )?;
                    let level = match dvfs {
                        None => 0,
                        Some(name) => {
                            gpu.dvfs
                                .iter()
                                .position(|l| &l.name == name)
                                .ok_or_else(|| ConfigError::UnknownDvfs {
                                    step: i,
                                    name: name.clone(),
                                })?
                        }
                    };
                    ResolvedStep::Launch {
                        kernel: k,
                        count: *count,
                        min_delay_s: *min_delay_s,
                        max_delay_s: *max_delay_s,
                        dvfs: level,
                    }
                }
            });
        }
        let clock = GpuClock::from_config(&gpu.clock)?;
        let dvfs = gpu.dvfs_scales();
        let model_levels = match gpu.dvfs.first() {
            Some(r) if gpu.power_model.is_some() => gpu
                .dvfs
                .iter()
                .map(|l| {
                    let v = l.voltage_v / r.voltage_v;
                    (l.frequency_hz / r.frequency_hz * v * v, v)
                })
                .collect(),
            _ => Vec::new(),
        };
        let temperature_c = match (&gpu.thermal, &gpu.power_model) {
            (Some(t), _) => Some(t.initial_c.unwrap_or(t.ambient_c)),
            (None, Some(m)) => Some(m.t_ref_c),
            (None, None) => None,
        };
        let max_piece_s = gpu.thermal.as_ref().map_or(MAX_STRETCH_S, |t| t.max_step_s);
        Ok(Gpu {
            config: gpu,
            kernels,
            steps,
            dvfs,
            model_levels,
            clock,
            rng: rng(seed, TIMELINE_STREAM),
            read_rng: rng(seed, READ_STREAM),
            generated_s: 0.0,
            emitted_s: 0.0,
            step: 0,
            in_step: 0,
            train: 0,
            train_launch_s: 0.0,
            train_start_s: 0.0,
            queue: VecDeque::new(),
            done: VecDeque::new(),
            switched: VecDeque::new(),
            record: true,
            host: None,
            tasks: VecDeque::new(),
            level: 0,
            switches: VecDeque::new(),
            target: 0,
            settled_s: f64::NEG_INFINITY,
            temperature_c,
            max_piece_s,
            last_state: None,
        })
    }

    /// The board configuration.
    pub fn config(&self) -> &GpuConfig {
        &self.config
    }

    /// The kernels, indexed as [`Execution::kernel`].
    pub fn kernels(&self) -> &[KernelConfig] {
        &self.kernels
    }

    /// The (time, power) scale of every DVFS level, indexed as [`Execution::dvfs_level`].
    pub fn dvfs_scales(&self) -> &[(f64, f64)] {
        &self.dvfs
    }

    /// The GPU's timestamp counter.
    pub fn clock(&self) -> &GpuClock {
        &self.clock
    }

    /// End of the last segment returned by [`next_segment`](Gpu::next_segment), true s.
    pub fn now_s(&self) -> f64 {
        self.emitted_s
    }

    /// The state over the last segment returned by [`next_segment`](Gpu::next_segment)
    /// (None before the first).
    pub fn last_state(&self) -> Option<SegmentState> {
        self.last_state
    }

    /// Whether executions and DVFS switches are recorded for
    /// [`drain_executions`](Gpu::drain_executions) and
    /// [`drain_dvfs_switches`](Gpu::drain_dvfs_switches) (default true). Turn it off for
    /// endless runs that never drain.
    pub fn set_record_executions(&mut self, record: bool) {
        self.record = record;
        if !record {
            self.done.clear();
            self.switched.clear();
        }
    }

    /// The next piece of the true power. Segments are contiguous, never empty, and never
    /// run out: the workload repeats forever.
    pub fn next_segment(&mut self) -> Segment {
        self.next_segment_with_state().0
    }

    /// The next piece of the true power, with the DVFS level and temperature over it.
    pub fn next_segment_with_state(&mut self) -> (Segment, SegmentState) {
        loop {
            match self.queue.pop_front() {
                Some(Item::Segment(seg, state)) => {
                    self.emitted_s = seg.end_s;
                    self.last_state = Some(state);
                    return (seg, state);
                }
                Some(item) => self.log(item),
                None => self.generate(),
            }
        }
    }

    fn log(&mut self, item: Item) {
        if self.record {
            match item {
                Item::Done(exec) => self.done.push_back(*exec),
                Item::Switch(s) => self.switched.push_back(s),
                Item::Segment(..) => {}
            }
        }
    }

    /// Moves the records at the queue's front (behind the last segment returned) to
    /// their logs.
    fn flush_records(&mut self) {
        while matches!(self.queue.front(), Some(Item::Done(_) | Item::Switch(_))) {
            if let Some(item) = self.queue.pop_front() {
                self.log(item);
            }
        }
    }

    /// Takes the record of every execution whose last segment has been returned by
    /// [`next_segment`](Gpu::next_segment) since the last call, in order.
    pub fn drain_executions(&mut self) -> std::collections::vec_deque::Drain<'_, Execution> {
        // An execution is complete once its last segment has left the queue; its record
        // sits right behind that segment.
        self.flush_records();
        self.done.drain(..)
    }

    /// Takes the record of every DVFS switch whose effective time has been reached by
    /// the segments returned by [`next_segment`](Gpu::next_segment) since the last call,
    /// in order. A switch's record sits right before the first segment at its new level.
    pub fn drain_dvfs_switches(&mut self) -> std::collections::vec_deque::Drain<'_, DvfsSwitch> {
        self.flush_records();
        self.switched.drain(..)
    }

    /// Asks for DVFS level `level` at true time `at_s`, as the host would
    /// ([`HostLaunches::dvfs_requests`] does the same from another thread). The level
    /// takes effect `dvfs_switch_latency_s` later, or at the end of the timeline
    /// generated so far if that is later, and never before a switch asked for earlier.
    /// Returns the effective time, or None for a level that does not exist.
    pub fn request_dvfs(&mut self, at_s: f64, level: usize) -> Option<f64> {
        if level >= self.dvfs.len() {
            return None;
        }
        self.schedule_switch(at_s, level, SwitchCause::Request)
    }

    /// The power model's value, W, for `util` at DVFS level `level` and `temperature_c`,
    /// with the dynamic term multiplied by `power_factor` (see the
    /// [module documentation](self)); None without `[gpu.power_model]` or for a level
    /// that does not exist.
    pub fn model_power_w(
        &self,
        util: &Util,
        level: usize,
        temperature_c: f64,
        power_factor: f64,
    ) -> Option<f64> {
        let m = self.config.power_model.as_ref()?;
        let &(s, v) = self.model_levels.get(level)?;
        let dynamic =
            m.compute_w * util.compute + m.memory_w * util.memory + m.other_w * util.other;
        Some(
            m.static_w
                + m.clock_w * s
                + power_factor * dynamic * s
                + m.leak_w * v * (m.leak_per_c * (temperature_c - m.t_ref_c)).exp(),
        )
    }

    /// A host read of the timestamp counter issued at true time `issue_s`, taking
    /// `read_latency_s` plus a uniform jitter in `[0, read_jitter_s]`. Draws from its own
    /// generator: reading never changes the timeline.
    pub fn read_clock(&mut self, issue_s: f64) -> ClockRead {
        let c = &self.config.clock;
        let latency = c.read_latency_s + c.read_jitter_s * uniform(&mut self.read_rng);
        self.clock.read(issue_s, latency, c.read_latch_fraction)
    }

    /// Schedules a switch to `to` asked for at `at_s`; a launch's switch only when `to`
    /// differs from the level the GPU is at or switching to. Returns its effective time.
    fn schedule_switch(&mut self, at_s: f64, to: usize, cause: SwitchCause) -> Option<f64> {
        let from = self.target;
        if cause == SwitchCause::Launch && to == from {
            return None;
        }
        let last = self
            .switches
            .back()
            .map_or(f64::NEG_INFINITY, |s| s.effective_s);
        let effective_s = (at_s + self.config.dvfs_switch_latency_s)
            .max(self.generated_s)
            .max(last);
        self.switches.push_back(DvfsSwitch {
            request_s: at_s,
            effective_s,
            from,
            to,
            cause,
        });
        if to != from {
            self.settled_s = effective_s;
        }
        self.target = to;
        Some(effective_s)
    }

    /// Applies the switches due at `t_s`; their records go into the queue here.
    fn apply_due(&mut self, t_s: f64) {
        while self.switches.front().is_some_and(|s| s.effective_s <= t_s) {
            if let Some(s) = self.switches.pop_front() {
                self.level = s.to;
                self.queue.push_back(Item::Switch(s));
            }
        }
    }

    /// Where the piece starting at `t_s` must end at the latest: the next switch, or the
    /// longest piece the thermal model allows.
    fn piece_limit(&self, t_s: f64) -> f64 {
        let next = self
            .switches
            .front()
            .map_or(f64::INFINITY, |s| s.effective_s);
        next.min(t_s + self.max_piece_s)
    }

    fn state(&self) -> SegmentState {
        let level = self.config.dvfs.get(self.level);
        SegmentState {
            dvfs_level: self.level,
            frequency_hz: level.map(|l| l.frequency_hz),
            voltage_v: level.map(|l| l.voltage_v),
            temperature_c: self.temperature_c,
        }
    }

    /// The power now for `util`: idle (`phase` None) or a phase's (its `power_w` and
    /// power factor).
    fn power_now(&self, util: &Util, phase: Option<(f64, f64)>) -> f64 {
        if self.config.power_model.is_some() {
            let t = self.temperature_c.unwrap_or(0.0);
            let pf = phase.map_or(1.0, |p| p.1);
            return self
                .model_power_w(util, self.level, t, pf)
                .unwrap_or(0.0)
                .max(0.0);
        }
        let idle = self.config.idle_power_w;
        match phase {
            None => idle,
            Some((power_w, power_factor)) => {
                let power_scale = self.dvfs[self.level].1;
                (idle + (power_w - idle) * power_scale * power_factor).max(0.0)
            }
        }
    }

    /// Queues the piece `[start_s, end_s)` at the current level and temperature, and
    /// advances the temperature over it. Returns its energy, J.
    fn push_piece(
        &mut self,
        start_s: f64,
        end_s: f64,
        util: Util,
        phase: Option<(f64, f64)>,
    ) -> f64 {
        let seg = Segment {
            start_s,
            end_s,
            power_w: self.power_now(&util, phase),
            util,
        };
        let state = self.state();
        if let (Some(th), Some(t)) = (&self.config.thermal, self.temperature_c) {
            let settled = th.ambient_c + th.r_c_per_w * seg.power_w;
            self.temperature_c =
                Some(settled + (t - settled) * (-(end_s - start_s) / th.tau_s).exp());
        }
        self.queue.push_back(Item::Segment(seg, state));
        self.generated_s = end_s;
        seg.energy_j()
    }

    fn advance_step(&mut self) {
        self.step = (self.step + 1) % self.steps.len();
        self.in_step = 0;
    }

    /// Hands control to the host's launches (see [`HostLaunches`]).
    pub fn set_host_launches(&mut self, host: std::sync::Arc<std::sync::Mutex<HostLaunches>>) {
        self.host = Some(host);
    }

    /// Index of the kernel named `name`.
    pub fn kernel_index(&self, name: &str) -> Option<usize> {
        self.kernels.iter().position(|k| k.name == name)
    }

    /// Generates the next piece of the timeline (with the records before it). The
    /// timeline is generated one piece at a time, so that a DVFS request finds at most
    /// one piece generated ahead of the one being emitted.
    fn generate(&mut self) {
        if let Some(host) = &self.host {
            let requests: Vec<HostDvfsRequest> = host
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .dvfs_requests
                .drain(..)
                .collect();
            for r in requests {
                self.request_dvfs(r.at_s, r.level);
            }
        }
        loop {
            if self.tasks.is_empty() {
                self.plan();
            }
            if self.run_task() {
                return;
            }
        }
    }

    /// Plans what comes next: the host's next launch (or a look at its queue after
    /// [`HOST_POLL_S`] idle) once it drives the GPU and the workload's step is over, else
    /// the workload's next unit.
    fn plan(&mut self) {
        if self.in_step == 0 {
            if let Some(host) = self.host.clone() {
                let mut h = host.lock().unwrap_or_else(|p| p.into_inner());
                if h.active {
                    let launch = h.queue.pop_front();
                    drop(h);
                    match launch {
                        Some(l) => self.plan_host_train(l),
                        None => self.tasks.push_back(Task::IdleFor(HOST_POLL_S)),
                    }
                    return;
                }
            }
        }
        self.plan_step();
    }

    /// A train the host asked for: from its call (or now, if later), the launch, the
    /// launch overhead, then `count` executions back to back.
    fn plan_host_train(&mut self, l: HostLaunch) {
        let level = (l.dvfs < self.dvfs.len()).then_some(l.dvfs);
        self.tasks.extend([
            Task::IdleFor(l.at_s - self.generated_s),
            Task::Launch(level),
            Task::IdleFor(self.config.launch_overhead_s),
            Task::Start(level.is_some()),
        ]);
        for k in 0..l.count.max(1) {
            if k > 0 {
                self.tasks
                    .push_back(Task::IdleFor(self.config.back_to_back_gap_s));
            }
            self.tasks.push_back(Task::Execute {
                kernel: l.kernel,
                index_in_train: k,
            });
        }
        self.tasks.push_back(Task::EndTrain);
    }

    /// The next unit of the workload: an idle step, or one execution (with the delay and
    /// launch overhead before a train's first one).
    fn plan_step(&mut self) {
        match self.steps[self.step].clone() {
            ResolvedStep::Idle { duration_s } => {
                self.tasks.push_back(Task::IdleFor(duration_s));
                self.advance_step();
            }
            ResolvedStep::Launch {
                kernel,
                count,
                min_delay_s,
                max_delay_s,
                dvfs,
            } => {
                let k = self.in_step;
                if k == 0 {
                    let delay = min_delay_s + (max_delay_s - min_delay_s) * uniform(&mut self.rng);
                    self.tasks.extend([
                        Task::IdleFor(delay),
                        Task::Launch(Some(dvfs)),
                        Task::IdleFor(self.config.launch_overhead_s),
                        Task::Start(true),
                    ]);
                } else {
                    self.tasks
                        .push_back(Task::IdleFor(self.config.back_to_back_gap_s));
                }
                self.tasks.push_back(Task::Execute {
                    kernel,
                    index_in_train: k,
                });
                self.in_step += 1;
                if self.in_step == count {
                    self.advance_step();
                    self.tasks.push_back(Task::EndTrain);
                }
            }
        }
    }

    /// Runs the first task for one piece at most; true when it queued a piece.
    fn run_task(&mut self) -> bool {
        let Some(task) = self.tasks.pop_front() else {
            return false;
        };
        match task {
            Task::IdleFor(duration_s) => {
                if duration_s > 0.0 {
                    let end_s = self.generated_s + duration_s;
                    self.tasks.push_front(Task::IdleUntil(end_s));
                }
                false
            }
            Task::IdleUntil(end_s) => {
                let t = self.generated_s;
                if end_s > t {
                    self.apply_due(t);
                    let brk = end_s.min(self.piece_limit(t));
                    let util = self.config.idle_util;
                    self.push_piece(t, brk, util, None);
                    if end_s > brk {
                        self.tasks.push_front(Task::IdleUntil(end_s));
                    }
                    true
                } else {
                    false
                }
            }
            Task::Launch(level) => {
                self.train_launch_s = self.generated_s;
                if let Some(level) = level {
                    self.schedule_switch(self.train_launch_s, level, SwitchCause::Launch);
                }
                false
            }
            Task::Start(wait) => {
                if wait && self.settled_s > self.generated_s {
                    self.tasks.push_front(Task::Start(false));
                    self.tasks.push_front(Task::IdleUntil(self.settled_s));
                } else {
                    self.train_start_s = self.generated_s;
                }
                false
            }
            Task::Execute {
                kernel,
                index_in_train,
            } => {
                let run = self.start_execution(kernel, index_in_train);
                self.tasks.push_front(Task::Run(Box::new(run)));
                false
            }
            Task::Run(mut run) => {
                let queued = self.run_execution(&mut run);
                if run.phase < self.kernels[run.kernel].phases.len() {
                    self.tasks.push_front(Task::Run(run));
                }
                queued
            }
            Task::EndTrain => {
                self.train += 1;
                false
            }
        }
    }

    /// Draws an execution's mode and outlier and starts it at `generated_s`, at the level
    /// in effect.
    fn start_execution(&mut self, kernel: usize, index_in_train: u32) -> Running {
        let (mode, mode_factor) = self.draw_mode(kernel);
        let (outlier, outlier_factor) = self.draw_outlier(kernel);
        let kc = &self.kernels[kernel];
        let warm = &kc.warmup;
        let warm_factor = 1.0
            + (warm.first_time_scale - 1.0)
                * (-f64::from(index_in_train) / warm.settle_executions).exp();
        let time_factor = mode_factor * outlier_factor * warm_factor;
        let start_s = self.generated_s;
        let settle = &kc.power_settling;
        let power_factor = 1.0
            + (settle.sse_to_ssp_ratio - 1.0)
                * (-(start_s - self.train_start_s) / settle.tau_s).exp();
        let mut bounds = Vec::with_capacity(kc.phases.len() + 1);
        bounds.push(start_s);
        self.apply_due(start_s);
        Running {
            kernel,
            index_in_train,
            mode,
            outlier,
            time_factor,
            power_factor,
            start_s,
            level: self.level,
            bounds,
            phase: 0,
            remaining: 1.0,
            energy_j: 0.0,
        }
    }

    /// Queues the next piece of a running execution, at the level in effect: a switch
    /// that takes effect during a phase changes the speed and power of the rest of it.
    /// After the last phase, queues the execution's record. True when it queued a piece.
    fn run_execution(&mut self, run: &mut Running) -> bool {
        let phases = self.kernels[run.kernel].phases.len();
        while run.phase < phases {
            let p = self.kernels[run.kernel].phases[run.phase].clone();
            let t = self.generated_s;
            self.apply_due(t);
            let busy = p.util.compute + p.util.memory;
            let c = if busy > 0.0 {
                p.util.compute / busy
            } else {
                1.0
            };
            let time_scale = self.dvfs[self.level].0;
            // The phase's duration at this level, and the part of its work still to do.
            let duration = p.duration_s * (c * time_scale + (1.0 - c)) * run.time_factor;
            let end = t + run.remaining * duration;
            let brk = end.min(self.piece_limit(t));
            let phase = Some((p.power_w, run.power_factor));
            if brk < end {
                run.energy_j += self.push_piece(t, brk, p.util, phase);
                run.remaining -= (brk - t) / duration;
                return true;
            }
            let queued = end > t;
            if queued {
                run.energy_j += self.push_piece(t, end, p.util, phase);
            }
            run.bounds.push(self.generated_s);
            run.phase += 1;
            run.remaining = 1.0;
            if run.phase == phases {
                self.queue.push_back(Item::Done(Box::new(Execution {
                    kernel: run.kernel,
                    train: self.train,
                    index_in_train: run.index_in_train,
                    launch_s: self.train_launch_s,
                    start_s: run.start_s,
                    end_s: self.generated_s,
                    phase_bounds_s: std::mem::take(&mut run.bounds),
                    dvfs_level: run.level,
                    mode: run.mode,
                    outlier: run.outlier,
                    time_factor: run.time_factor,
                    power_factor: run.power_factor,
                    energy_j: run.energy_j,
                })));
            }
            if queued {
                return true;
            }
        }
        false
    }

    fn draw_mode(&mut self, kernel: usize) -> (usize, f64) {
        let modes = &self.kernels[kernel].time.modes;
        let total: f64 = modes.iter().map(|m| m.weight).sum();
        let mut pick = uniform(&mut self.rng) * total;
        let mut index = modes.len() - 1;
        for (i, m) in modes.iter().enumerate() {
            if pick < m.weight {
                index = i;
                break;
            }
            pick -= m.weight;
        }
        // Guard against a zero-weight last mode picked by rounding.
        while modes[index].weight == 0.0 && index > 0 {
            index -= 1;
        }
        let m = &modes[index];
        if m.spread == 0.0 {
            return (index, m.scale);
        }
        for _ in 0..64 {
            let f = m.scale * (1.0 + m.spread * normal(&mut self.rng));
            if f > 0.0 {
                return (index, f);
            }
        }
        (index, m.scale)
    }

    fn draw_outlier(&mut self, kernel: usize) -> (bool, f64) {
        let t = &self.kernels[kernel].time;
        if t.outlier_probability == 0.0 {
            return (false, 1.0);
        }
        if uniform(&mut self.rng) < t.outlier_probability {
            let e = -(1.0 - uniform(&mut self.rng)).ln();
            (true, 1.0 + (t.outlier_scale - 1.0) * e)
        } else {
            (false, 1.0)
        }
    }
}

impl Iterator for Gpu {
    type Item = Segment;

    /// Always `Some(self.next_segment())`: the stream is endless.
    fn next(&mut self) -> Option<Segment> {
        Some(self.next_segment())
    }
}
