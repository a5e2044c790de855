//! The GPU's own power logger, as documented models with parameters.
//!
//! A [`Logger`] is fed the true power ([`Segment`]s, in order, as the
//! [`Gpu`](crate::gpu::Gpu) produces them) and emits a [`LoggerSample`] at every report
//! instant `t_k = phase_s + k * period_s` (`k = 0, 1, ...`, from the first instant at or
//! after the start of the first segment).
//!
//! # The models
//!
//! With `x(t)` the true power and `d = delay_s`, the model's *response* `r_k` at report
//! `k` is:
//!
//! - `box` (width `W = window_s`, any `W > 0`, e.g. AMD MI300X: `W = P = 1 ms`):
//!   `r_k = (1 / W) ∫ x` over `[t_k - d - W, t_k - d]`, the exact mean over the window.
//!   With `W = P` the windows tile time, with `W > P` they overlap (a sliding average).
//! - `partial` (`0 < W <= P`, e.g. NVIDIA A100/H100: about 25 ms of every 100 ms):
//!   the same formula, but the windows see exactly `W / P` of the time and the rest is
//!   never observed.
//! - `exponential` (`tau_s`): `r_k = y(t_k)` with `tau * y' = x(t - d) - y`, updated
//!   exactly over each constant piece: `y <- x + (y - x) * exp(-dt / tau)`.
//! - `response` (impulse response `h` given as `samples` at `spacing_s` = `Δ`):
//!   `h` is the *staircase* `h(τ) = h_i` for `τ` in `[iΔ, (i+1)Δ)`, `i = 0..n`, sample 0
//!   acting on the most recent input; the logger normalises it to unit area
//!   (`h_i = samples[i] / (Σ samples * Δ)`, so a constant input is reported unchanged).
//!   Then `r_k = Σ_i h_i ∫ x` over `[t_k - d - (i+1)Δ, t_k - d - iΔ]`, which is exact
//!   for piecewise-constant input (no grid error: each bin's integral is exact). A
//!   smooth response is thereby approximated by its staircase; the approximation error
//!   is that of the staircase against the smooth curve, which is the caller's choice of
//!   `Δ` and is not part of the twin's truth (the staircase *is* the truth).
//!
//! The reported power is then `power_w = quantise(gain * r_k + offset_w)`, where
//! `quantise(v) = round(v / quantum_w) * quantum_w` (round half away from zero), or `v`
//! when `quantum_w = 0`. Before the first segment fed, the input is taken as the first
//! segment's power held constant (a GPU at rest before the run), so the first windows
//! are complete; exponential state starts settled at that power.
//!
//! # Temperature
//!
//! Real loggers report the die's temperature with the power (amdgpu's `gpu_metrics`
//! `temperature_hotspot`, hwmon's `temp1_input`, NVML's `nvmlDeviceGetTemperature`).
//! Each sample carries the twin's die temperature at `t_k - delay_s` (the end of the
//! input the report describes; the report instant itself with `delay_s = 0`, as in every
//! shipped scenario), exact and not quantised, when the logger is fed with
//! [`Logger::push_with_state`]: with [`Logger::with_thermal`] the thermal model's
//! solution within the segment, `T∞ + (T0 − T∞) · exp(−(t − start) / tau_s)` from the
//! segment's [`SegmentState::temperature_c`] `T0` and `T∞ = ambient_c + r_c_per_w · P`
//! (the same expression as the GPU's, so a report at a segment's end carries exactly the
//! next segment's starting temperature); without a thermal model the segment's
//! `temperature_c` as it is (`power_model.t_ref_c`, the temperature the twin's power was
//! evaluated at, with a power model alone; `None` with neither). Fed with
//! [`Logger::push`], the samples carry no temperature. Reports before the first segment
//! carry its starting temperature. Computing it draws no random numbers and changes
//! nothing else.
//!
//! # Timestamps
//!
//! Each sample carries its true report instant `t_k` and a [`Stamp`]: with
//! [`StampConfig::GpuClock`] the GPU timestamp counter's value at `t_k`, with
//! [`StampConfig::HostRead`] the true time at which a host read of the value returned,
//! `t_k + read_latency_s` (the caller maps it through its host-clock model).
//!
//! # Scenario files
//!
//! ```toml
//! kind = "box"        # "box" | "partial" | "exponential" | "response"
//! window_s = 1e-3     # box, partial
//! period_s = 1e-3
//! # tau_s = 1e-3                # exponential
//! # samples = [1.0, 2.0, 1.0]   # response
//! # spacing_s = 1e-4            # response
//! phase_s = 1e-3      # default: period_s
//! delay_s = 0.0       # default 0
//! gain = 1.0          # default 1
//! offset_w = 0.0      # default 0
//! quantum_w = 1.0     # default 0 (none)
//! stamp = { kind = "gpu_clock" }   # or { kind = "host_read", read_latency_s = 5e-5 }
//! ```

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::gpu::{
    check, non_negative, positive, stretch, within, ConfigError, GpuClock, SegmentState,
    ThermalConfig, MAX_STRETCH_S,
};
use crate::trace::{Segment, TraceError};

/// The shortest reporting period, s: 10 µs. The loggers modelled report every 1 ms
/// (amdgpu's `gpu_metrics`) to 100 ms (NVML); a board sensor read at 100 kHz is already
/// faster than any GPU's, and each report costs the twin a sum over the power it reaches.
pub const MIN_PERIOD_S: f64 = 1e-5;

/// The most samples of a `response` logger: 1000, a staircase finer than any response an
/// identification resolves (each report sums over every sample).
pub const MAX_RESPONSE_SAMPLES: usize = 1000;

/// How many reporting periods a `box`, `partial` or `response` logger may reach back: a
/// thousand. The loggers modelled average over one period or less (a sliding average of
/// a second reported every millisecond is a thousand); each report sums the power over
/// its reach, so this bounds the twin's work per second of reports.
pub const MAX_REACH_PERIODS: f64 = 1000.0;

/// The response model of a logger (see the [module documentation](self)).
#[derive(Debug, Clone, PartialEq)]
pub enum LoggerModel {
    /// Box average of width `window_s`, any width.
    Box {
        /// Width of the averaging window, in s; 1 µs to 10 s.
        window_s: f64,
    },
    /// Box average of width `window_s` no longer than the period: only `window_s /
    /// period_s` of the time is seen.
    Partial {
        /// Width of the averaging window, in s; 1 µs to `period_s`.
        window_s: f64,
    },
    /// First-order low pass.
    Exponential {
        /// Time constant, in s; 1 µs to 10 s.
        tau_s: f64,
    },
    /// An arbitrary staircase impulse response, normalised to unit area by the logger.
    Response {
        /// The response's values, sample 0 acting on the most recent input, in any unit
        /// (only the shape matters); 1 to [`MAX_RESPONSE_SAMPLES`] of them, summing to
        /// more than 0.
        samples: Vec<f64>,
        /// Width of each sample's step, in s; 1 µs to 10 s, and the whole response
        /// (`samples.len() * spacing_s`) at most 10 s.
        spacing_s: f64,
    },
}

impl LoggerModel {
    /// How far back the model reaches from `t_k - delay_s`, in s (infinite for the
    /// exponential).
    pub fn support_s(&self) -> f64 {
        match self {
            LoggerModel::Box { window_s } | LoggerModel::Partial { window_s } => *window_s,
            LoggerModel::Exponential { .. } => f64::INFINITY,
            LoggerModel::Response { samples, spacing_s } => samples.len() as f64 * spacing_s,
        }
    }
}

/// How a logger timestamps its samples.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StampConfig {
    /// The GPU timestamp counter's value at the report instant.
    #[default]
    GpuClock,
    /// The host's read: the true time at which the read of the value returned.
    HostRead {
        /// Time from the report instant to the host's read returning, in s; 0 to 10 s.
        read_latency_s: f64,
    },
}

/// A logger's configuration: model, reporting, distortions and timestamping.
///
/// (De)serialised flat with a `kind` tag; see the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawLoggerConfig", into = "RawLoggerConfig")]
pub struct LoggerConfig {
    /// The response model.
    pub model: LoggerModel,
    /// Reporting period `P`, in s; [`MIN_PERIOD_S`] to 10 s, and at least
    /// `1 / MAX_REACH_PERIODS` of the window or response ([`MAX_REACH_PERIODS`]).
    pub period_s: f64,
    /// True time of report 0, in s; 0 to 10 s. Default `period_s`.
    pub phase_s: f64,
    /// Delay between the input and the report, in s; 0 to 10 s. Default 0.
    pub delay_s: f64,
    /// Multiplier on the response (dimensionless). Default 1.
    pub gain: f64,
    /// Added to the response after the gain, in W. Default 0.
    pub offset_w: f64,
    /// Quantisation step of the reported power, in W; >= 0, 0 for none. Default 0.
    pub quantum_w: f64,
    /// Timestamping. Default: GPU clock.
    pub stamp: StampConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Box,
    Partial,
    Exponential,
    Response,
}

/// The flat file form of [`LoggerConfig`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoggerConfig {
    kind: Kind,
    period_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tau_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    samples: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spacing_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phase_s: Option<f64>,
    #[serde(default)]
    delay_s: f64,
    #[serde(default = "one")]
    gain: f64,
    #[serde(default)]
    offset_w: f64,
    #[serde(default)]
    quantum_w: f64,
    #[serde(default)]
    stamp: StampConfig,
}

fn one() -> f64 {
    1.0
}

impl TryFrom<RawLoggerConfig> for LoggerConfig {
    type Error = ConfigError;

    fn try_from(raw: RawLoggerConfig) -> Result<Self, ConfigError> {
        let kind_name = match raw.kind {
            Kind::Box => "box",
            Kind::Partial => "partial",
            Kind::Exponential => "exponential",
            Kind::Response => "response",
        };
        let misplaced = |field: &str| ConfigError::Structure {
            field: format!("logger.{field}"),
            reason: format!("does not apply to kind = {kind_name:?}"),
        };
        let missing = |field: &str| ConfigError::Structure {
            field: format!("logger.{field}"),
            reason: format!("is required for kind = {kind_name:?}"),
        };
        let uses_window = matches!(raw.kind, Kind::Box | Kind::Partial);
        if !uses_window && raw.window_s.is_some() {
            return Err(misplaced("window_s"));
        }
        if raw.kind != Kind::Exponential && raw.tau_s.is_some() {
            return Err(misplaced("tau_s"));
        }
        if raw.kind != Kind::Response && raw.samples.is_some() {
            return Err(misplaced("samples"));
        }
        if raw.kind != Kind::Response && raw.spacing_s.is_some() {
            return Err(misplaced("spacing_s"));
        }
        let model = match raw.kind {
            Kind::Box => LoggerModel::Box {
                window_s: raw.window_s.ok_or_else(|| missing("window_s"))?,
            },
            Kind::Partial => LoggerModel::Partial {
                window_s: raw.window_s.ok_or_else(|| missing("window_s"))?,
            },
            Kind::Exponential => LoggerModel::Exponential {
                tau_s: raw.tau_s.ok_or_else(|| missing("tau_s"))?,
            },
            Kind::Response => LoggerModel::Response {
                samples: raw.samples.ok_or_else(|| missing("samples"))?,
                spacing_s: raw.spacing_s.ok_or_else(|| missing("spacing_s"))?,
            },
        };
        let config = LoggerConfig {
            model,
            period_s: raw.period_s,
            phase_s: raw.phase_s.unwrap_or(raw.period_s),
            delay_s: raw.delay_s,
            gain: raw.gain,
            offset_w: raw.offset_w,
            quantum_w: raw.quantum_w,
            stamp: raw.stamp,
        };
        config.validate()?;
        Ok(config)
    }
}

impl From<LoggerConfig> for RawLoggerConfig {
    fn from(c: LoggerConfig) -> Self {
        let mut raw = RawLoggerConfig {
            kind: Kind::Box,
            period_s: c.period_s,
            window_s: None,
            tau_s: None,
            samples: None,
            spacing_s: None,
            phase_s: Some(c.phase_s),
            delay_s: c.delay_s,
            gain: c.gain,
            offset_w: c.offset_w,
            quantum_w: c.quantum_w,
            stamp: c.stamp,
        };
        match c.model {
            LoggerModel::Box { window_s } => raw.window_s = Some(window_s),
            LoggerModel::Partial { window_s } => {
                raw.kind = Kind::Partial;
                raw.window_s = Some(window_s);
            }
            LoggerModel::Exponential { tau_s } => {
                raw.kind = Kind::Exponential;
                raw.tau_s = Some(tau_s);
            }
            LoggerModel::Response { samples, spacing_s } => {
                raw.kind = Kind::Response;
                raw.samples = Some(samples);
                raw.spacing_s = Some(spacing_s);
            }
        }
        raw
    }
}

impl LoggerConfig {
    /// A logger of the given model reporting every `period_s`, first at `period_s`,
    /// without delay or distortion, stamped with the GPU clock.
    pub fn new(model: LoggerModel, period_s: f64) -> Self {
        LoggerConfig {
            model,
            period_s,
            phase_s: period_s,
            delay_s: 0.0,
            gain: 1.0,
            offset_w: 0.0,
            quantum_w: 0.0,
            stamp: StampConfig::GpuClock,
        }
    }

    /// AMD MI300X-like: a 1 ms box average reported every 1 ms, in whole watts, stamped
    /// with the GPU clock.
    pub fn mi300x_like() -> Self {
        LoggerConfig {
            quantum_w: 1.0,
            ..LoggerConfig::new(LoggerModel::Box { window_s: 1e-3 }, 1e-3)
        }
    }

    /// NVIDIA A100/H100-like: a 25 ms window every 100 ms (a quarter of the time seen),
    /// in milliwatts, stamped by a host read 50 µs after each report.
    pub fn nvidia_partial_like() -> Self {
        LoggerConfig {
            quantum_w: 1e-3,
            stamp: StampConfig::HostRead {
                read_latency_s: 50e-6,
            },
            ..LoggerConfig::new(LoggerModel::Partial { window_s: 25e-3 }, 100e-3)
        }
    }

    /// True time of report `k`: `phase_s + k * period_s`, in s, rounded once (a fused
    /// multiply-add), so that report times land on round values where they should.
    pub fn report_time_s(&self, k: u64) -> f64 {
        (k as f64).mul_add(self.period_s, self.phase_s)
    }

    /// Checks every field against its documented range.
    ///
    /// Loggers report every 10 µs ([`MIN_PERIOD_S`]) to 10 s ([`MAX_STRETCH_S`]), and
    /// every time they give (window, time constant, step, phase, delay, read) is within
    /// 1 µs..=10 s or, for the phase, delay and read, 0..=10 s; see also
    /// [`MAX_RESPONSE_SAMPLES`] and [`MAX_REACH_PERIODS`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        within(
            || "logger.period_s".into(),
            self.period_s,
            MIN_PERIOD_S..=MAX_STRETCH_S,
            "must be within 10 µs to 10 s",
        )?;
        let duration = |field: &'static str, value: f64| {
            within(
                || format!("logger.{field}"),
                value,
                1e-6..=MAX_STRETCH_S,
                "must be > 0: within 1 µs to 10 s",
            )
        };
        match &self.model {
            LoggerModel::Box { window_s } => duration("window_s", *window_s)?,
            LoggerModel::Partial { window_s } => check(
                || "logger.window_s".into(),
                *window_s,
                *window_s >= 1e-6 && *window_s <= self.period_s,
                "must be > 0 (1 µs at least) and <= period_s for kind = \"partial\"",
            )?,
            LoggerModel::Exponential { tau_s } => duration("tau_s", *tau_s)?,
            LoggerModel::Response { samples, spacing_s } => {
                duration("spacing_s", *spacing_s)?;
                if samples.is_empty() || samples.len() > MAX_RESPONSE_SAMPLES {
                    return Err(ConfigError::Structure {
                        field: "logger.samples".into(),
                        reason: format!(
                            "1 to {MAX_RESPONSE_SAMPLES} samples are needed, not {}",
                            samples.len()
                        ),
                    });
                }
                for (i, s) in samples.iter().enumerate() {
                    check(
                        || format!("logger.samples[{i}]"),
                        *s,
                        true,
                        "must be finite",
                    )?;
                }
                positive(
                    || "logger.samples (sum)".into(),
                    samples.iter().sum::<f64>(),
                )?;
                check(
                    || "logger.spacing_s".into(),
                    *spacing_s,
                    self.model.support_s() <= MAX_STRETCH_S,
                    "the response (its samples × spacing_s) must reach back at most 10 s",
                )?;
            }
        }
        if !matches!(self.model, LoggerModel::Exponential { .. }) {
            let reach = self.model.support_s();
            if reach > MAX_REACH_PERIODS * self.period_s {
                return Err(ConfigError::Structure {
                    field: "logger.period_s".into(),
                    reason: format!(
                        "the logger reaches back {reach} s, more than {MAX_REACH_PERIODS} \
                         periods: report at least every {} s",
                        reach / MAX_REACH_PERIODS
                    ),
                });
            }
        }
        stretch(|| "logger.phase_s".into(), self.phase_s)?;
        stretch(|| "logger.delay_s".into(), self.delay_s)?;
        check(|| "logger.gain".into(), self.gain, true, "must be finite")?;
        check(
            || "logger.offset_w".into(),
            self.offset_w,
            true,
            "must be finite",
        )?;
        non_negative(|| "logger.quantum_w".into(), self.quantum_w)?;
        if let StampConfig::HostRead { read_latency_s } = self.stamp {
            stretch(|| "logger.stamp.read_latency_s".into(), read_latency_s)?;
        }
        Ok(())
    }

    /// `quantise(gain * response_w + offset_w)`: what the logger reports for a response.
    pub fn apply_distortions(&self, response_w: f64) -> f64 {
        let v = self.gain * response_w + self.offset_w;
        if self.quantum_w > 0.0 {
            (v / self.quantum_w).round() * self.quantum_w
        } else {
            v
        }
    }
}

/// A sample's timestamp.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stamp {
    /// The GPU timestamp counter's value at the report instant.
    GpuTicks(u64),
    /// The true time at which the host's read of the value returned, in s.
    HostRead {
        /// True time, s.
        read_s: f64,
    },
}

/// One report of the logger.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoggerSample {
    /// Report number `k` (report 0 is at `phase_s`).
    pub index: u64,
    /// True report instant `t_k`, s.
    pub true_time_s: f64,
    /// The logger's own timestamp.
    pub stamp: Stamp,
    /// The model's response before gain, offset and quantisation, W (the truth an
    /// identified model should reproduce).
    pub response_w: f64,
    /// The reported power, W.
    pub power_w: f64,
    /// The die's temperature the logger reports with the power, °C (see the
    /// [module documentation](self#temperature)); None when not modelled.
    pub temperature_c: Option<f64>,
}

/// The die's temperature over the segment being fed: `settled_c + (start_c - settled_c)
/// * exp(-(t - start_s) / tau_s)` for `t` in `[start_s, end_s]`.
#[derive(Debug, Clone, Copy)]
struct Heat {
    start_s: f64,
    end_s: f64,
    start_c: f64,
    settled_c: f64,
    tau_s: f64,
}

impl Heat {
    fn at(&self, t_s: f64) -> f64 {
        if self.tau_s.is_infinite() {
            return self.start_c;
        }
        let t = t_s.clamp(self.start_s, self.end_s);
        self.settled_c + (self.start_c - self.settled_c) * (-(t - self.start_s) / self.tau_s).exp()
    }
}

#[derive(Debug, Clone, Copy)]
struct Piece {
    start_s: f64,
    end_s: f64,
    power_w: f64,
}

#[derive(Debug, Clone)]
enum Core {
    /// Staircase kernel: bin `i` covers `[t - d - (i+1)Δ, t - d - iΔ]`; `weights[i]` is
    /// `h_i` (1/s), or `None` for a box (divide by the width instead, for exactness).
    Bins {
        width_s: f64,
        weights: Option<Vec<f64>>,
    },
    Exponential {
        tau_s: f64,
        y_w: f64,
        at_s: f64,
    },
}

/// A streaming power logger (see the [module documentation](self)).
#[derive(Debug, Clone)]
pub struct Logger {
    config: LoggerConfig,
    clock: GpuClock,
    core: Core,
    /// Retained input, contiguous; for the bins models only.
    buffer: VecDeque<Piece>,
    /// Start and power of the first segment fed.
    first: Option<(f64, f64)>,
    /// End of the last segment fed.
    end_s: Option<f64>,
    next_k: u64,
    out: VecDeque<LoggerSample>,
    /// The die's thermal model, for the temperature within a segment.
    thermal: Option<ThermalConfig>,
    /// The temperature over the segment being fed, if it came with one.
    heat: Option<Heat>,
}

impl Logger {
    /// A logger that stamps with `clock` (used with [`StampConfig::GpuClock`]).
    pub fn new(config: LoggerConfig, clock: GpuClock) -> Result<Self, ConfigError> {
        config.validate()?;
        let core = match &config.model {
            LoggerModel::Box { window_s } | LoggerModel::Partial { window_s } => Core::Bins {
                width_s: *window_s,
                weights: None,
            },
            LoggerModel::Exponential { tau_s } => Core::Exponential {
                tau_s: *tau_s,
                y_w: 0.0,
                at_s: 0.0,
            },
            LoggerModel::Response { samples, spacing_s } => {
                let area: f64 = samples.iter().sum::<f64>() * spacing_s;
                Core::Bins {
                    width_s: *spacing_s,
                    weights: Some(samples.iter().map(|s| s / area).collect()),
                }
            }
        };
        Ok(Logger {
            config,
            clock,
            core,
            buffer: VecDeque::new(),
            first: None,
            end_s: None,
            next_k: 0,
            out: VecDeque::new(),
            thermal: None,
            heat: None,
        })
    }

    /// The die's thermal model (the scenario's `[gpu.thermal]`), for the temperature the
    /// samples carry within a segment fed with [`push_with_state`](Logger::push_with_state)
    /// (see the [module documentation](self#temperature)).
    pub fn with_thermal(mut self, thermal: Option<ThermalConfig>) -> Self {
        self.thermal = thermal;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &LoggerConfig {
        &self.config
    }

    /// The normalised response `h_i` (1/s) of a `response` logger.
    pub fn normalised_response(&self) -> Option<&[f64]> {
        match &self.core {
            Core::Bins {
                weights: Some(w), ..
            } => Some(w),
            _ => None,
        }
    }

    /// Number of the next report to be emitted.
    pub fn next_index(&self) -> u64 {
        self.next_k
    }

    /// Feeds the next segment of the true power (contiguous with the previous one) and
    /// queues every report that it completes; the reports carry no temperature.
    pub fn push(&mut self, seg: &Segment) -> Result<(), TraceError> {
        self.push_at(seg, None)
    }

    /// Like [`push`](Logger::push), with the GPU's state over the segment: the reports
    /// carry the die's temperature (see the [module documentation](self#temperature)).
    pub fn push_with_state(
        &mut self,
        seg: &Segment,
        state: &SegmentState,
    ) -> Result<(), TraceError> {
        self.push_at(seg, state.temperature_c)
    }

    fn push_at(&mut self, seg: &Segment, start_c: Option<f64>) -> Result<(), TraceError> {
        if !(seg.start_s.is_finite() && seg.end_s.is_finite() && seg.end_s > seg.start_s) {
            return Err(TraceError::BadSegment {
                start_s: seg.start_s,
                end_s: seg.end_s,
            });
        }
        if !seg.power_w.is_finite() {
            return Err(TraceError::BadPower {
                power_w: seg.power_w,
            });
        }
        match self.end_s {
            Some(prev_end_s) if prev_end_s != seg.start_s => {
                return Err(TraceError::NotContiguous {
                    prev_end_s,
                    start_s: seg.start_s,
                })
            }
            Some(_) => {}
            None => self.start(seg),
        }
        self.end_s = Some(seg.end_s);
        self.heat = start_c.map(|start_c| {
            let (settled_c, tau_s) = match &self.thermal {
                Some(th) => (th.ambient_c + th.r_c_per_w * seg.power_w, th.tau_s),
                None => (start_c, f64::INFINITY),
            };
            Heat {
                start_s: seg.start_s,
                end_s: seg.end_s,
                start_c,
                settled_c,
                tau_s,
            }
        });
        let piece = Piece {
            start_s: seg.start_s,
            end_s: seg.end_s,
            power_w: seg.power_w,
        };
        if matches!(self.core, Core::Exponential { .. }) {
            self.push_exponential(piece);
        } else {
            self.buffer.push_back(piece);
            self.emit_bins();
        }
        Ok(())
    }

    /// Feeds every segment in turn (see [`push`](Logger::push)).
    pub fn push_all<'a, I: IntoIterator<Item = &'a Segment>>(
        &mut self,
        segments: I,
    ) -> Result<(), TraceError> {
        segments.into_iter().try_for_each(|s| self.push(s))
    }

    /// The oldest queued report, if any.
    pub fn pop_sample(&mut self) -> Option<LoggerSample> {
        self.out.pop_front()
    }

    /// Takes every queued report, in order.
    pub fn drain_samples(&mut self) -> std::collections::vec_deque::Drain<'_, LoggerSample> {
        self.out.drain(..)
    }

    fn start(&mut self, seg: &Segment) {
        let t0 = seg.start_s;
        self.first = Some((t0, seg.power_w));
        let c = &self.config;
        let mut k = ((t0 - c.phase_s) / c.period_s).ceil().max(0.0) as u64;
        while c.report_time_s(k) < t0 {
            k += 1;
        }
        while k > 0 && c.report_time_s(k - 1) >= t0 {
            k -= 1;
        }
        self.next_k = k;
        if let Core::Exponential { y_w, at_s, .. } = &mut self.core {
            *y_w = seg.power_w;
            *at_s = t0 + c.delay_s;
        }
    }

    fn emit(&mut self, t_s: f64, response_w: f64) {
        let stamp = match self.config.stamp {
            StampConfig::GpuClock => Stamp::GpuTicks(self.clock.ticks_at(t_s)),
            StampConfig::HostRead { read_latency_s } => Stamp::HostRead {
                read_s: t_s + read_latency_s,
            },
        };
        let temperature_c = self.heat.map(|h| h.at(t_s - self.config.delay_s));
        self.out.push_back(LoggerSample {
            index: self.next_k,
            true_time_s: t_s,
            stamp,
            response_w,
            power_w: self.config.apply_distortions(response_w),
            temperature_c,
        });
        self.next_k += 1;
    }

    fn push_exponential(&mut self, piece: Piece) {
        let d = self.config.delay_s;
        let end = piece.end_s + d;
        loop {
            let t = self.config.report_time_s(self.next_k);
            if t > end {
                break;
            }
            let y = self.advance_exponential(t, piece.power_w);
            self.emit(t, y);
        }
        self.advance_exponential(end, piece.power_w);
    }

    /// Advances the exponential state to `to_s` under constant input `x_w`; returns it.
    fn advance_exponential(&mut self, to_s: f64, x_w: f64) -> f64 {
        match &mut self.core {
            Core::Exponential { tau_s, y_w, at_s } => {
                if to_s > *at_s {
                    *y_w = x_w + (*y_w - x_w) * (-(to_s - *at_s) / *tau_s).exp();
                    *at_s = to_s;
                }
                *y_w
            }
            Core::Bins { .. } => 0.0,
        }
    }

    fn emit_bins(&mut self) {
        let Some(end) = self.end_s else { return };
        let d = self.config.delay_s;
        loop {
            let t = self.config.report_time_s(self.next_k);
            if t - d > end {
                break;
            }
            let r = self.bins_response(t - d);
            self.emit(t, r);
            // Forget the input no later report can reach.
            let oldest = self.config.report_time_s(self.next_k) - d - self.config.model.support_s();
            while self.buffer.front().is_some_and(|p| p.end_s <= oldest) {
                self.buffer.pop_front();
            }
        }
    }

    /// The bins model's response for a window ending at `upto_s` (= `t_k - delay_s`).
    fn bins_response(&self, upto_s: f64) -> f64 {
        let Core::Bins { width_s, weights } = &self.core else {
            return 0.0;
        };
        let n = weights.as_ref().map_or(1, Vec::len);
        let edge = |i: usize| upto_s - i as f64 * width_s;
        let (t0, p0) = self.first.unwrap_or((f64::NEG_INFINITY, 0.0));
        let mut idx = self.buffer.partition_point(|p| p.end_s <= edge(n));
        let mut response = 0.0;
        // Oldest bin first, sweeping the retained pieces once.
        for i in (0..n).rev() {
            let (lo, hi) = (edge(i + 1), edge(i));
            let mut energy = 0.0;
            if lo < t0 {
                energy += p0 * (hi.min(t0) - lo);
            }
            while let Some(p) = self.buffer.get(idx) {
                if p.start_s >= hi {
                    break;
                }
                let a = lo.max(p.start_s);
                let b = hi.min(p.end_s);
                if b > a {
                    energy += p.power_w * (b - a);
                }
                if p.end_s <= hi {
                    idx += 1;
                } else {
                    break;
                }
            }
            response += match weights {
                Some(w) => w[i] * energy,
                None => energy / width_s,
            };
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Gpu;
    use crate::scenario::{default_scenario, Loaded};

    fn dvfs_scenario() -> Loaded {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/dvfs.toml");
        crate::scenario::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs the scenario's GPU and logger (fed as the twin feeds it) to `until_s`: the
    /// segments with their states, and the samples.
    fn run(l: &Loaded, until_s: f64) -> (Vec<(Segment, SegmentState)>, Vec<LoggerSample>) {
        let s = &l.scenario;
        let mut gpu =
            Gpu::new(s.gpu.clone(), s.kernels.clone(), s.workload.clone(), s.seed).unwrap();
        gpu.set_record_executions(false);
        let mut logger = Logger::new(s.logger.clone(), *gpu.clock())
            .unwrap()
            .with_thermal(s.gpu.thermal.clone());
        let mut segs = Vec::new();
        let mut samples = Vec::new();
        while gpu.now_s() < until_s {
            let (seg, state) = gpu.next_segment_with_state();
            logger.push_with_state(&seg, &state).unwrap();
            samples.extend(logger.drain_samples());
            segs.push((seg, state));
        }
        (segs, samples)
    }

    #[test]
    fn the_loggers_temperature_follows_the_dies_on_the_dvfs_scenario() {
        let l = dvfs_scenario();
        let th = l.scenario.gpu.thermal.clone().unwrap();
        // The cold sweep and most of the ~4.1 s of gemm at the high level.
        let (segs, samples) = run(&l, 4.0);
        assert!(samples.len() > 3_900, "{} samples", samples.len());
        let mut j = 0;
        for s in &samples {
            // The segment holding the report instant (the later one at a boundary; the
            // last one for a report at the end of the timeline generated so far).
            while j + 1 < segs.len() && segs[j].0.end_s <= s.true_time_s {
                j += 1;
            }
            let (seg, state) = &segs[j];
            let t = s.temperature_c.expect("a temperature with a thermal model");
            if seg.start_s == s.true_time_s {
                // At a boundary: exactly the truth's temperature_c of the segment.
                assert_eq!(Some(t), state.temperature_c, "at {} s", s.true_time_s);
            } else {
                let t0 = state.temperature_c.unwrap();
                let settled = th.ambient_c + th.r_c_per_w * seg.power_w;
                let want =
                    settled + (t0 - settled) * (-(s.true_time_s - seg.start_s) / th.tau_s).exp();
                assert!((t - want).abs() < 1e-9, "{t} vs {want} °C");
                // Between the segment's two ends' temperatures.
                if let Some((_, next)) = segs.get(j + 1) {
                    let t1 = next.temperature_c.unwrap();
                    assert!(t >= t0.min(t1) - 1e-12 && t <= t0.max(t1) + 1e-12);
                }
            }
        }
        // It rises under sustained load, as the truth's does (by ~17 °C by 4 s).
        let first = samples[0].temperature_c.unwrap();
        let last = samples.last().unwrap().temperature_c.unwrap();
        assert!((first - th.initial_c.unwrap()).abs() < 0.1, "{first} °C");
        assert!(last - first > 12.0, "from {first} to {last} °C");
        let truth_last = segs.last().unwrap().1.temperature_c.unwrap();
        assert!(
            (truth_last - last).abs() < 0.01,
            "{truth_last} vs {last} °C"
        );
    }

    #[test]
    fn the_temperature_is_t_ref_without_a_thermal_model_and_none_without_either() {
        let mut l = dvfs_scenario();
        l.scenario.gpu.thermal = None;
        let t_ref = l.scenario.gpu.power_model.as_ref().unwrap().t_ref_c;
        let (_, samples) = run(&l, 0.05);
        assert!(!samples.is_empty());
        assert!(samples.iter().all(|s| s.temperature_c == Some(t_ref)));

        let (_, samples) = run(&default_scenario(), 0.05);
        assert!(!samples.is_empty());
        assert!(samples.iter().all(|s| s.temperature_c.is_none()));
    }

    #[test]
    fn the_temperature_changes_nothing_else() {
        let l = dvfs_scenario();
        let s = &l.scenario;
        let (segs, with) = run(&l, 0.5);
        let gpu = Gpu::new(s.gpu.clone(), s.kernels.clone(), s.workload.clone(), s.seed).unwrap();
        let mut plain = Logger::new(s.logger.clone(), *gpu.clock()).unwrap();
        for (seg, _) in &segs {
            plain.push(seg).unwrap();
        }
        let without: Vec<LoggerSample> = plain.drain_samples().collect();
        assert_eq!(with.len(), without.len());
        for (a, b) in with.iter().zip(&without) {
            assert_eq!(b.temperature_c, None);
            assert_eq!(
                LoggerSample {
                    temperature_c: None,
                    ..*a
                },
                *b
            );
        }
    }
}
