//! Correcting a profiling run's stitched GPU-logger profile: the logger's identified
//! response undone by regularised deconvolution, with an uncertainty band and the energy
//! per execution (`railtrace correct`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema};
use railtrace_calibration::deconvolve::{
    deconvolve, kernel, Deconvolved, Input, LoggerKernel, Options as DeconvolveOptions, Profile,
};
use railtrace_calibration::plan::simultaneous_confidence;
use railtrace_calibration::stats::{median, two_sided_normal};
use railtrace_calibration::stitch::ProfileBin;

use railtrace_rig::Accuracy;

use crate::analysis::logger_model::LoggerModel;
use crate::analysis::stitch::{
    analyse, execution_durations, Analysis, AnalysisError, Link, Options, Point,
};

/// Why a profile could not be corrected.
#[derive(Debug, thiserror::Error)]
pub enum CorrectError {
    /// The profiling run could not be analysed.
    #[error(transparent)]
    Analysis(#[from] AnalysisError),
    /// The analysis kept no execution.
    #[error("{0}: no executions kept")]
    NoExecutions(PathBuf),
    /// The logger's model gives no response on these bins.
    #[error("{path}: {why}")]
    Model {
        /// The model's file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// No readings late enough to tell the idle level.
    #[error("{path}: no logger readings after the kernel's reach ({reach_ms:.3} ms) to tell the idle level")]
    NoIdle {
        /// The profile.
        path: PathBuf,
        /// The kernel's reach, ms.
        reach_ms: f64,
    },
    /// The deconvolution refused its input.
    #[error("{0}")]
    Deconvolution(String),
    /// The corrected profile could not be written.
    #[error("cannot write {path}: {why}")]
    Write {
        /// The output.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

fn bins(points: &[Point]) -> Vec<ProfileBin> {
    points
        .iter()
        .map(|p| ProfileBin {
            lo: p.lo_s,
            hi: p.hi_s,
            n: p.n,
            mean_w: p.mean_w,
            std_w: p.std_w,
            ci_half_w: p.ci_half_w,
        })
        .collect()
}

/// A stitched logger profile corrected.
#[derive(Debug)]
pub struct Corrected {
    /// The profiling run's analysis (its stitched logger and rig profiles).
    pub analysis: Analysis,
    /// The corrected profile.
    pub d: Deconvolved,
    /// The logger as the deconvolution saw it.
    pub logger: LoggerKernel,
    /// The idle level imposed before the kernel, W.
    pub idle_w: f64,
    /// The kept executions' mean duration, s.
    pub duration_s: f64,
    /// Their standard deviation, s: how far apart the executions' ends (and steps) fall.
    pub duration_sd_s: f64,
    /// How far the reference lags the GPU's timeline, as the model's negative delay
    /// says, s (0 for a delay ≥ 0).
    pub reference_lag_s: f64,
    /// The bin width asked for, s; the correction's own (`d.dt_s`) is wider where bins
    /// that narrow would hold fewer than [`MIN_READINGS_PER_BIN`] readings
    /// ([`Corrected::widened`]).
    pub requested_bin_s: f64,
    /// Logger readings per bin of the width asked for, on average over the kernel and
    /// the logger's reach after it.
    pub readings_per_bin: f64,
    /// The rig's stitched profile on bins of the width asked for (`analysis.rig` is on
    /// the correction's, wider where they were widened): the phases it resolves are what
    /// the planner plans for.
    pub reference_bins: Vec<Point>,
    /// The rig's stated accuracy the band carries; `None` where it was not known (the band
    /// then leaves the reference's own calibration out).
    pub reference: Option<Accuracy>,
    /// The relative standard uncertainty of the profile's scale the band carries: the
    /// rig's and the logger model's gain.
    pub gain_sd: f64,
    /// The standard uncertainty of the profile's level the band carries, W: the idle
    /// level's scatter, the logger model's offset and the rig's.
    pub offset_sd_w: f64,
    /// The standard uncertainty of the logger's delay on the GPU's timeline the band
    /// carries, s: the model's and the clock links'.
    pub delay_sd_s: f64,
}

/// Deconvolves the stitched logger profile of `profile` (its rig capture `rig`) with
/// `model`, on bins `bin_s` wide; the band carries the rig's stated accuracy `reference`
/// where it is known ([`recorded_accuracy`]).
pub fn correct(
    profile: &Path,
    rig: &Path,
    model: &LoggerModel,
    model_path: &Path,
    bin_s: f64,
    reference: Option<Accuracy>,
) -> Result<Corrected, CorrectError> {
    // Readings hold the kernel for up to a window (and the delay) after its end: stitch
    // that far and more past the executions' typical length.
    let durations = execution_durations(profile)?;
    let reach = logger_reach(model);
    let horizon_s = 2.0 * median(&durations) + 2.5 * reach;
    // The idle level is read past the kernel's reach, where only the run's last
    // execution has readings (the next launch comes sooner after the others): read
    // there whether or not that execution was kept.
    let mut options = Options {
        bin_s,
        horizon_s,
        idle_after_end_s: Some(2.0 * reach),
        ..Options::default()
    };
    let mut a = analyse(profile, rig, &options)?;
    let reference_bins = a.rig.clone();
    let seen_until = median(&durations) + reach;
    let readings_per_bin = readings_per_bin(&a.logger, seen_until);
    if readings_per_bin > 0.0 && readings_per_bin < MIN_READINGS_PER_BIN {
        options.bin_s = bin_s * (MIN_READINGS_PER_BIN / readings_per_bin).ceil();
        a = analyse(profile, rig, &options)?;
    }
    let dt = options.bin_s;
    let kept = a.kept_durations();
    if kept.is_empty() {
        return Err(CorrectError::NoExecutions(profile.to_path_buf()));
    }
    let unusable = |e: &dyn std::fmt::Display| CorrectError::Model {
        path: model_path.to_path_buf(),
        why: e.to_string(),
    };
    let duration = kept.iter().sum::<f64>() / kept.len() as f64;
    let response = model
        .response(dt, model.delay_s)
        .map_err(|e| unusable(&e))?;
    // The profile's time axis is the GPU's (each execution starts at TOI 0 by its own
    // timestamps), the model's delay is against the reference's: the logger's delay on
    // the GPU's timeline is the model's plus the reference's own lag behind it (the GPU
    // board's input filter, the rig's analog chain and trigger path), measured from the
    // rig's profile at the kernel's end. Where that cannot be measured, a negative delay
    // is taken as all lag (a logger cannot see power before it is drawn).
    let spread =
        (kept.iter().map(|d| (d - duration).powi(2)).sum::<f64>() / kept.len() as f64).sqrt();
    let reference_lag_s =
        reference_lag(&a.rig, duration, spread).unwrap_or((-model.delay_s).max(0.0));
    // The kernel holds the delay where it is ≥ 0; a total below 0 (the model's and the
    // lag's errors about a logger that reads at once) is the deconvolution's to
    // interpolate, not clamped to 0, which moved the phases by about 2.5 W a µs.
    let total_delay_s = model.delay_s + reference_lag_s;
    let h = kernel(&response, dt, total_delay_s.max(0.0)).map_err(|e| unusable(&e))?;
    // The idle level: the logger's readings long after the kernel (its reach over), made
    // reference watts through the model's gain and offset.
    let reach = duration + h.len() as f64 * dt;
    let late: Vec<f64> = a
        .logger
        .iter()
        .filter(|p| p.lo_s > reach && p.n > 0)
        .map(|p| (p.mean_w - model.offset_w) / model.gain)
        .collect();
    if late.is_empty() {
        return Err(CorrectError::NoIdle {
            path: profile.to_path_buf(),
            reach_ms: reach * 1e3,
        });
    }
    let idle = late.iter().sum::<f64>() / late.len() as f64;
    // What the band carries beyond the readings' noise: the idle level's own scatter
    // (the late bins are independent means), the logger model's gain and offset, and
    // the rig's accuracy, all as standard deviations combined in quadrature.
    let idle_se = if late.len() > 1 {
        let var = late.iter().map(|w| (w - idle).powi(2)).sum::<f64>() / (late.len() - 1) as f64;
        (var / late.len() as f64).sqrt()
    } else {
        0.0
    };
    let (ref_gain, ref_offset) = reference.map_or((0.0, 0.0), |a| (a.gain_sd, a.offset_sd_w));
    let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
    let gain_sd = ref_gain.hypot(finite(model.gain_se / model.gain));
    let offset_sd_w = ref_offset
        .hypot(idle_se)
        .hypot(finite(model.offset_se_w / model.gain));
    // The logger's delay on the GPU's timeline: the model's, known to its identification's
    // error, plus the reference's lag, read through the rig's and the GPU's clock links,
    // each link's offset known to its residuals' RMS over √(points).
    let link_se = |l: &Link| {
        if l.used > 0 {
            finite(l.rms_s / (l.used as f64).sqrt())
        } else {
            0.0
        }
    };
    let delay_sd_s = finite(model.delay_se_s)
        .hypot(link_se(&a.device))
        .hypot(link_se(&a.gpu));
    let stitched = Profile::from_bins(&bins(&a.logger))
        .map_err(|e| CorrectError::Deconvolution(format!("the stitched profile: {e}")))?;
    let logger = LoggerKernel {
        kernel: h,
        delay_s: total_delay_s.min(0.0),
        gain: model.gain,
        offset_w: model.offset_w,
    };
    let d = deconvolve(
        &Input {
            profile: stitched,
            logger: logger.clone(),
            idle_w: idle,
            duration_s: duration,
            gain_sd,
            offset_sd_w,
            timing_sd_s: spread,
            delay_sd_s,
        },
        &DeconvolveOptions::default(),
    )
    .map_err(|e| CorrectError::Deconvolution(format!("the deconvolution: {e}")))?;
    Ok(Corrected {
        analysis: a,
        d,
        logger,
        idle_w: idle,
        duration_s: duration,
        duration_sd_s: spread,
        reference_lag_s,
        requested_bin_s: bin_s,
        readings_per_bin,
        reference_bins,
        reference,
        gain_sd,
        offset_sd_w,
        delay_sd_s,
    })
}

/// The rig's stated accuracy from the description its capture `rig` recorded, where it
/// recorded one that states it.
pub fn recorded_accuracy(rig: &Path) -> Option<Accuracy> {
    let text = crate::store::recording::open(rig).ok()?.meta.rig?;
    toml::from_str::<railtrace_rig::RigDescription>(&text)
        .ok()?
        .accuracy
}

/// How long after the kernel's end the logger's readings still see it, s: its window, or
/// five time constants, or a period, and its delay.
fn logger_reach(model: &LoggerModel) -> f64 {
    model
        .window_s
        .or(model.tau_s.map(|t| 5.0 * t))
        .unwrap_or(model.period_s)
        + model.delay_s.abs()
}

/// The fewest logger readings a bin must hold on average, over the kernel and the
/// logger's reach after it, for the correction to be drawn on it. Each bin's standard
/// error comes from the scatter of its readings and its neighbours' (pooled over
/// ±[`railtrace_calibration::deconvolve::SE_POOL_HALF_WIDTH`] bins), and the
/// regulariser's strength is chosen by holding the fit's χ² to them: with fewer than
/// about one reading a bin most bins have none to scatter, their errors are guessed from
/// elsewhere in the profile, and the strength falls to nothing (a profile of spurious
/// steps). At 3 readings a bin (Poisson) four bins in five hold two or more, and the
/// pooled variance rests on some twenty degrees of freedom. On a logger of period `T`,
/// `N` runs give about `N·dt/T` readings to a bin of width `dt`.
pub const MIN_READINGS_PER_BIN: f64 = 3.0;

/// The mean readings per bin of the stitched logger profile `logger` over TOI
/// `[0, until)`.
fn readings_per_bin(logger: &[Point], until: f64) -> f64 {
    let seen: Vec<usize> = (logger.iter())
        .filter(|p| p.lo_s >= 0.0 && p.hi_s <= until)
        .map(|p| p.n)
        .collect();
    if seen.is_empty() {
        return 0.0;
    }
    seen.iter().sum::<usize>() as f64 / seen.len() as f64
}

impl Corrected {
    /// The planner: the bins and the executions a profiling run like this one needs for
    /// the level of every phase the rig's reference resolves within `plan`'s relative
    /// error, all of them together with its confidence. The phases: the rig's stitched
    /// profile's runs of bins whose level stays within the error of the run's mean
    /// ([`reference_runs`]), less the steps between two levels (runs no longer than a
    /// step's spread), each reaching to the middle of the steps either side. The bins:
    /// the width asked for, or a third
    /// of the shortest phase (or of `plan.phase_s`) where that is narrower, holding
    /// [`READINGS_MARGIN`] × [`MIN_READINGS_PER_BIN`] readings a bin. The levels: the
    /// logger's readings fitted with every step where the rig puts it
    /// ([`railtrace_calibration::plan::phase_levels`]), each level's standard deviation
    /// scaled by the readings' scatter about that fit against their stated errors (up
    /// only, where it rests on few readings), falling as one over the square root of the
    /// executions; Bonferroni over the phases. `None` where it cannot tell (no rig, no
    /// readings, the fit singular).
    pub fn run_plan(&self, model: &LoggerModel, plan: &PlanFor) -> Option<RunPlan> {
        let d = &self.d;
        let dt = d.dt_s;
        let have = self.analysis.executions.len() as f64;
        let until = self.duration_s + self.logger.kernel.len() as f64 * dt;
        let runs = reference_runs(
            &self.reference_bins,
            self.reference_lag_s,
            until,
            plan.rel_err,
        );
        if runs.is_empty() || self.readings_per_bin.is_nan() || self.readings_per_bin <= 0.0 {
            return None;
        }
        // The phases held to the error: the runs over the kernel less the steps between
        // them. A step in the reference spreads over the bin it falls in, over twice the
        // rig's 10-90 % rise (its whole rise) and over the executions' spread of its times
        // (four standard deviations): a run no longer than that whose level lies between
        // its neighbours' (the idle level before the first) is a step, or a piece of one
        // the runs' tolerance split, or of a ramp.
        let width = self.requested_bin_s;
        let rise = self.analysis.support.rig_rise_s.unwrap_or(0.0);
        let step = 4.0 * self.duration_sd_s + width + 2.0 * rise;
        let mut held: Vec<(f64, f64, f64)> = Vec::new(); // start, length, level
        for (i, r) in runs.iter().enumerate() {
            let inside: Vec<f64> = (0..r.3)
                .map(|k| r.0 + (k as f64 + 0.5) * width)
                .filter(|c| (0.0..self.duration_s).contains(c))
                .collect();
            let Some(&first) = inside.first() else {
                continue;
            };
            let before = if i == 0 { self.idle_w } else { runs[i - 1].2 };
            let between = (runs.get(i + 1))
                .is_some_and(|n| (before.min(n.2)..=before.max(n.2)).contains(&r.2));
            if between && r.3 as f64 * width <= step * (1.0 + 1e-9) {
                continue;
            }
            held.push((first - 0.5 * width, inside.len() as f64 * width, r.2));
        }
        // Each phase reaches to the middle of the ramps either side (a step where the
        // correction draws one), the first from the kernel's start, the last to its end;
        // the logger's reach after it one level more.
        let mut bounds: Vec<(f64, f64)> = (0..held.len())
            .map(|i| {
                let start = match i {
                    0 => 0.0,
                    _ => 0.5 * (held[i - 1].0 + held[i - 1].1 + held[i].0),
                };
                let end = match held.get(i + 1) {
                    Some(next) => 0.5 * (held[i].0 + held[i].1 + next.0),
                    None => self.duration_s,
                };
                (start, end)
            })
            .collect();
        let lengths: Vec<f64> = bounds.iter().map(|b| b.1 - b.0).collect();
        let shortest = (plan.phase_s).or_else(|| lengths.iter().copied().reduce(f64::min))?;
        // A step inside a cell moves power across the phase's edge: the corrected cell
        // holds the cell's mean, and a step a fraction `u` into it puts `u(1 − u)` of a
        // cell's worth of the step in the phase on either side, a quarter at most. A phase
        // `L` long between steps `Δ_a` and `Δ_b` moves by up to `dt/(4L)·(Δ_a + Δ_b)`;
        // the kernel's start and end are cells' edges (the bins below tile the kernel).
        let duration = self.duration_s;
        let level = |i: usize| held[i].2;
        let inner = |i: usize| {
            let before = if i == 0 {
                0.0
            } else {
                (level(i) - level(i - 1)).abs()
            };
            let after = if i + 1 < held.len() {
                (level(i) - level(i + 1)).abs()
            } else {
                0.0
            };
            before + after
        };
        if held.is_empty() {
            return None;
        }
        let bias = |bin: f64, i: usize| 0.25 * bin * inner(i) / (lengths[i] * level(i).abs());
        // Bins narrow enough that the steps leave half the error to the readings (the
        // bias grows with the bin).
        let fine = (0..held.len())
            .map(|i| 0.5 * plan.rel_err / bias(1.0, i))
            .fold(f64::INFINITY, f64::min);
        bounds.push((self.duration_s, until));
        // Not finer than the rig resolves: a narrower bin shows its own response. The
        // nearest bins that tile the kernel, its end on a cell's edge.
        let bin_s = width.min(shortest / 3.0).min(fine).max(rise);
        let tiles = (duration / bin_s)
            .round()
            .min((duration / rise).floor())
            .max(1.0);
        let bin_s = if duration > 0.0 {
            duration / tiles
        } else {
            bin_s
        };
        let rpb = self.readings_per_bin * bin_s / width;
        let for_bins = (have * READINGS_MARGIN * MIN_READINGS_PER_BIN / rpb).ceil() as u64;
        let response = model.response(dt, model.delay_s).ok()?;
        let stitched = Profile::from_bins(&bins(&self.analysis.logger)).ok()?;
        let fit = railtrace_calibration::plan::phase_levels(
            &stitched,
            &response,
            model.delay_s + self.reference_lag_s,
            model.gain,
            self.idle_w,
            &bounds,
        )?;
        // The readings' errors as their scatter about the fit tells them, where it rests
        // on enough of them to be known within about a tenth (a pilot's few readings a
        // bin state their errors loosely, and wide bins add the level's change within
        // them); otherwise never below what they state.
        let scale = match fit.scale {
            s if s.is_finite() && fit.dof >= MIN_SCALE_DOF => s,
            s if s.is_finite() => s.max(1.0),
            _ => 1.0,
        };
        let z = two_sided_normal(simultaneous_confidence(plan.confidence, held.len()));
        // The readings hold the rest of the error; where the rig's finest bins leave a
        // step all of it, no run count holds it, and the verdict says so.
        let factor = (held.iter().zip(&fit.sd_w).enumerate())
            .map(|(i, (h, sd))| {
                let room = (plan.rel_err - bias(bin_s, i)) * h.2.abs();
                if room > 0.0 {
                    (z * scale * sd / room).powi(2)
                } else {
                    f64::INFINITY
                }
            })
            .fold(0.0, f64::max);
        let step_bias = (0..held.len()).map(|i| bias(bin_s, i)).fold(0.0, f64::max);
        if factor.is_nan() {
            return None;
        }
        let for_levels = (have * factor).ceil() as u64;
        Some(RunPlan {
            bin_s,
            executions: for_bins.max(for_levels).max(2),
            for_bins,
            for_levels,
            shortest_phase_s: shortest,
            step_bias,
            phases: held.len(),
            scale: fit.scale,
            rel_err: plan.rel_err,
            confidence: plan.confidence,
        })
    }

    /// The plan `p` ([`Corrected::run_plan`]) as a sentence for the user.
    pub fn plan(&self, p: &RunPlan) -> String {
        let have = self.analysis.executions.len();
        let what = p.describe();
        if let Some(why) = p.unreachable() {
            return why;
        }
        if p.executions <= have as u64 && p.bin_s * (1.0 + p.bin_s / self.duration_s) >= self.d.dt_s
        {
            format!(
                "the readings hold {what} ({have} executions; {} would do)",
                p.executions
            )
        } else {
            format!(
                "plan: {} (this run has {have} on bins of {:.1} µs) would hold {what}",
                p.asks(),
                self.d.dt_s * 1e6
            )
        }
    }

    /// Why the correction is drawn on bins wider than asked, when it is: a sentence for
    /// the user.
    pub fn widened(&self) -> Option<String> {
        let (asked, drawn) = (self.requested_bin_s, self.d.dt_s);
        (drawn > asked * (1.0 + 1e-9)).then(|| {
            let runs = (self.analysis.executions.iter()).filter(|e| e.kept).count() as f64;
            format!(
                "bins of {:.0} µs hold {:.2} logger readings each over the kernel and the logger's reach, \
                 too few to tell their scatter: corrected on bins of {:.0} µs instead \
                 (about {:.0} runs would hold {MIN_READINGS_PER_BIN} a bin at {:.0} µs)",
                asked * 1e6,
                self.readings_per_bin,
                drawn * 1e6,
                (runs * MIN_READINGS_PER_BIN / self.readings_per_bin).ceil(),
                asked * 1e6,
            )
        })
    }
}

impl Corrected {
    /// Every condition that puts this correction outside the range where it can be
    /// trusted, as a sentence (none: within range): a logger model that is not a
    /// calibration (its doubts); bins [`TOO_WIDE`] times wider than
    /// [`Corrected::run_plan`] plans for the phases the rig resolves, a step inside the
    /// rig's finest bins that can move a phase's level by more than the error, or fewer
    /// executions than the phases' levels need; without the rig's reference, a phase the
    /// corrected profile draws under 3 bins (a single cell between its neighbours' levels
    /// is a step inside that cell, not a phase); and bins over the kernel and the logger's
    /// reach that hold no reading (a fifth of them, or a gap as long as the shortest
    /// phase: the runs' offsets cover it too sparsely).
    /// `run_plan` is [`Corrected::run_plan`]'s for the error planned for.
    pub fn outside_range(&self, model: &LoggerModel, run_plan: Option<&RunPlan>) -> Vec<String> {
        let mut why = Vec::new();
        if !model.doubts.is_empty() {
            why.push(format!(
                "the logger model is not a calibration: {}",
                model.doubts.join("; ")
            ));
        }
        let d = &self.d;
        // With the rig's reference the phases are those it resolves (the planner's);
        // without it, those the corrected profile draws, where one cell over- or
        // undershooting at a step would read as a short phase.
        let ramp = (4.0 * self.duration_sd_s).max(d.dt_s);
        let short = match run_plan {
            Some(_) => Vec::new(),
            None => short_phases(
                &phases(&d.t, d.dt_s, &d.power_w, self.duration_s, ramp),
                d.dt_s,
            ),
        };
        for (start, len) in short {
            why.push(format!(
                "a phase of {:.0} µs at {:.0} µs is under 3 bins of {:.0} µs: shorter than the bins resolve",
                len * 1e6,
                start * 1e6,
                d.dt_s * 1e6
            ));
        }
        let reach = self.duration_s + logger_reach(model);
        let seen: Vec<&Point> = (self.analysis.logger.iter())
            .filter(|p| p.lo_s >= 0.0 && p.hi_s <= reach)
            .collect();
        // Empty bins scattered among read ones leave every phase seen by readings whose
        // window's edge falls in it, which place its steps; a gap as long as the shortest
        // phase (3 bins without the rig's) leaves that phase seen only whole, its energy
        // told but not where its steps fall. Too sparse: such a gap, or a fifth of the
        // bins empty (under about 1.6 readings a bin, half what a bin is drawn on).
        let empty = seen.iter().filter(|p| p.n == 0).count();
        let gap = (seen.iter())
            .fold((0_usize, 0_usize), |(run, most), p| {
                let run = if p.n == 0 { run + 1 } else { 0 };
                (run, most.max(run))
            })
            .1 as f64
            * d.dt_s;
        let phase = run_plan.map_or(3.0 * d.dt_s, |p| p.shortest_phase_s);
        if empty * 5 > seen.len() || gap >= phase * (1.0 - 1e-9) {
            why.push(format!(
                "{empty} of {} bins over the kernel and the logger's reach hold no reading, {:.0} µs of them in a row: the runs' offsets cover it too sparsely",
                seen.len(),
                gap * 1e6
            ));
        }
        if let Some(p) = run_plan {
            let have = self.analysis.executions.len();
            if d.dt_s > TOO_WIDE * p.bin_s {
                why.push(format!(
                    "bins of {:.1} µs are too wide for the phases the rig resolves (the shortest {:.0} µs): {} would hold {}",
                    d.dt_s * 1e6,
                    p.shortest_phase_s * 1e6,
                    p.asks(),
                    p.describe()
                ));
            } else if p.step_bias >= p.rel_err {
                why.push(format!(
                    "a step inside a bin of {:.1} µs, the finest the rig resolves, can move a phase's level by up to {:.1} %, more than the {} % error planned for",
                    p.bin_s * 1e6,
                    p.step_bias * 100.0,
                    p.rel_err * 100.0
                ));
            } else if p.for_levels > have as u64 {
                why.push(format!(
                    "{have} executions are too few to hold {} (about {} would)",
                    p.describe(),
                    p.for_levels
                ));
            }
        }
        why
    }
}

/// The verdict of [`Corrected::outside_range`] as `--json` gives it.
pub fn validity(outside: &[String]) -> serde_json::Value {
    serde_json::json!({"within_range": outside.is_empty(), "outside": outside})
}

/// The phases of a piecewise-constant profile (cells centred at `t`, `dt` wide, levels
/// `w`) over `[0, duration)`, as (start, length), s: its runs of cells of one level, less
/// the runs no longer than `ramp` s whose level lies between their neighbours': a step
/// inside a cell, or one blurred over a few cells because the executions' steps fall at
/// different times (`ramp` about four of their durations' standard deviations).
fn phases(t: &[f64], dt: f64, w: &[f64], duration: f64, ramp: f64) -> Vec<(f64, f64)> {
    // Runs over every cell (those outside the kernel are its neighbours' context), each
    // with the start and the count of its cells inside `[0, duration)`.
    let mut runs: Vec<(usize, f64, Option<f64>, usize)> = Vec::new();
    for (&tc, &wc) in t.iter().zip(w) {
        if !matches!(runs.last(), Some(r) if r.1 == wc) {
            runs.push((0, wc, None, 0));
        }
        let r = runs.last_mut().expect("pushed");
        r.0 += 1;
        if (0.0..duration).contains(&tc) {
            r.2.get_or_insert(tc - 0.5 * dt);
            r.3 += 1;
        }
    }
    // Runs no longer than `ramp` between their neighbours' levels; consecutive ones are
    // one ramp, dropped when it spans no more than `ramp`.
    let inner = |i: usize| {
        let between = |a: f64, b: f64| (a.min(b)..=a.max(b)).contains(&runs[i].1);
        i > 0
            && i + 1 < runs.len()
            && runs[i].0 as f64 * dt <= ramp * (1.0 + 1e-9)
            && between(runs[i - 1].1, runs[i + 1].1)
    };
    let mut keep = vec![true; runs.len()];
    let mut i = 0;
    while i < runs.len() {
        let end = (i..runs.len()).find(|&j| !inner(j)).unwrap_or(runs.len());
        let span: usize = runs[i..end].iter().map(|r| r.0).sum();
        if end > i && span as f64 * dt <= ramp * (1.0 + 1e-9) {
            keep[i..end].iter_mut().for_each(|k| *k = false);
        }
        i = end + 1;
    }
    (0..runs.len())
        .filter(|&i| keep[i])
        .filter_map(|i| Some((runs[i].2?, runs[i].3 as f64 * dt)))
        .collect()
}

/// The phases of [`phases`] under 3 cells.
fn short_phases(phases: &[(f64, f64)], dt: f64) -> Vec<(f64, f64)> {
    (phases.iter().copied())
        .filter(|&(_, len)| len < 2.5 * dt)
        .collect()
}

/// How far the rig's stitched profile `rig` lags the GPU's timeline, s, from the energy
/// it is missing after the kernel's start, over the step up from idle there (a linear lag
/// of unit gain misses `(P_first − idle)·L` of a first phase that outlasts it, `L` its mean
/// delay); where the first phase is not level long enough to tell, from the energy it
/// still shows after the kernel's end (`duration`, on the GPU's timestamps), likewise.
/// The start is each execution's own stamp, sharp; the ends spread with the durations
/// (`spread`, s, their standard deviation), and the end's reading scattered over 0.25 µs
/// between runs of the twin's default demo and read 0.2 µs long on average, where the
/// start's scattered over 0.09 µs. `None` where neither tells (no idle after the
/// kernel's tail, no step, a lag outside `[0, duration/2]`, or ends spread past it).
fn reference_lag(rig: &[Point], duration: f64, spread: f64) -> Option<f64> {
    let from_end = end_lag(rig, duration, spread);
    let with = |p: &&Point| p.n > 0 && p.mean_w.is_finite();
    let first_bin = rig.iter().find(with)?;
    let width = first_bin.hi_s - first_bin.lo_s;
    // The rise: bins from TOI 0 over eight lags (three bins at least); the first
    // phase's level: the median of the bins over as long again, which must be level
    // (within 2 % of the step) and inside the kernel.
    let rise = (8.0 * from_end.unwrap_or(width)).max(3.0 * width);
    let level: Vec<f64> = (rig.iter().filter(with))
        .filter(|p| p.lo_s >= rise - 1e-12 && p.hi_s <= 2.0 * rise + 1e-12)
        .map(|p| p.mean_w)
        .collect();
    let first = median(&level);
    let idle = late_idle(rig, duration, width)?;
    let step = first - idle;
    let flat = level.iter().fold(0.0_f64, |m, w| m.max((w - first).abs()));
    let missing: f64 = (rig.iter().filter(with))
        .filter(|p| p.lo_s >= -1e-12 && p.hi_s <= rise + 1e-12)
        .map(|p| (first - p.mean_w) * (p.hi_s - p.lo_s))
        .sum();
    let lag = missing / step;
    let usable = level.len() >= 2
        && 2.0 * rise <= duration
        && step.abs() > 0.0
        && flat <= 0.02 * step.abs()
        && (0.0..=0.5 * duration).contains(&lag);
    if usable {
        Some(lag)
    } else {
        from_end
    }
}

/// The rig's idle level after the kernel's end (`duration`): the median of its bins from
/// a quarter of the kernel or ten bins of `width` after it, whichever is later.
fn late_idle(rig: &[Point], duration: f64, width: f64) -> Option<f64> {
    let until = duration + (0.25 * duration).max(10.0 * width);
    let after: Vec<f64> = (rig.iter())
        .filter(|p| p.n > 0 && p.mean_w.is_finite() && p.lo_s >= until)
        .map(|p| p.mean_w)
        .collect();
    let idle = median(&after);
    idle.is_finite().then_some(idle)
}

/// [`reference_lag`] from the kernel's end: the energy the rig still shows after it,
/// over the step down to idle there. The longer executions put energy past the mean
/// end, the shorter ones end their lag's tail before it, which cancel to first order
/// while the spread is within the lag (beyond, the excess is about
/// `(0.4·spread + lag/2)·step`), so it is taken only there.
fn end_lag(rig: &[Point], duration: f64, spread: f64) -> Option<f64> {
    let with = |p: &&Point| p.n > 0 && p.mean_w.is_finite();
    let last = rig.iter().filter(with).rfind(|p| p.hi_s <= duration)?;
    // The tail: the bins from the one holding the end, over a quarter of the kernel or
    // ten bins, whichever is longer; the part of the first bin before the end taken at
    // the last phase's level. The idle level: the bins after it.
    let width = last.hi_s - last.lo_s;
    let until = duration + (0.25 * duration).max(10.0 * width);
    let idle = late_idle(rig, duration, width)?;
    let step = last.mean_w - idle;
    let mut excess = 0.0;
    for p in rig.iter().filter(with) {
        if p.hi_s > duration && p.lo_s < until {
            excess += (p.mean_w - idle) * (p.hi_s - p.lo_s);
            if p.lo_s < duration {
                excess -= step * (duration - p.lo_s);
            }
        }
    }
    let lag = excess / step;
    (step.abs() > 0.0 && (0.0..=0.5 * duration).contains(&lag) && spread <= lag).then_some(lag)
}

/// What the correction's planner plans for: every phase the rig's reference resolves (or,
/// with `phase_s`, bins that resolve phases that short) within `rel_err` of its power, all
/// of them together with probability `confidence` ([`Corrected::run_plan`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanFor {
    /// Relative error (0.05: 5 %).
    pub rel_err: f64,
    /// Probability that every phase holds it.
    pub confidence: f64,
    /// The shortest phase, s, in place of the rig's shortest.
    pub phase_s: Option<f64>,
}

impl Default for PlanFor {
    fn default() -> Self {
        PlanFor {
            rel_err: 0.05,
            confidence: 0.95,
            phase_s: None,
        }
    }
}

/// How much wider than the planner's bins a correction's may be before the verdict calls
/// them too wide: a step's share of the cell it falls in then moves a phase's level by up
/// to three quarters of the error, where the plan keeps it within half.
const TOO_WIDE: f64 = 1.5;

/// How many times [`MIN_READINGS_PER_BIN`] the planner plans for: the readings a bin that
/// a pilot counts, and those the planned run gets, each scatter by 5-10 % (Poisson, over
/// some hundred bins), and a run that comes out under the minimum is corrected on bins
/// twice as wide.
const READINGS_MARGIN: f64 = 1.2;

/// The fewest degrees of freedom the readings' scatter about the planner's fit must rest on
/// to be taken for their errors when it is below what they state: `√(2·50)` puts the
/// scatter's own relative error near 0.1.
const MIN_SCALE_DOF: usize = 50;

/// What the planner asks of a profiling run ([`Corrected::run_plan`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunPlan {
    /// The bins to correct on, s.
    pub bin_s: f64,
    /// Executions needed: the more of `for_bins` and `for_levels`.
    pub executions: u64,
    /// Executions that put [`MIN_READINGS_PER_BIN`] readings ([`READINGS_MARGIN`] times) in a bin
    /// of `bin_s`.
    pub for_bins: u64,
    /// Executions that hold every phase's level within the error (`u64::MAX` where a
    /// step inside the bins leaves the readings none of it).
    pub for_levels: u64,
    /// The shortest phase planned for, s.
    pub shortest_phase_s: f64,
    /// The largest relative error the steps inside bins of `bin_s` can put in a phase's
    /// level (a quarter of a bin's worth of each step at its edges, over the phase; the
    /// bins tile the kernel, so its start and end are cells' edges); the plan keeps it
    /// within half the error where the rig resolves bins that fine, and the verdict says
    /// where it is above the whole error.
    pub step_bias: f64,
    /// The phases held to the error.
    pub phases: usize,
    /// The logger's readings' scatter about the phases' fit against their standard
    /// errors, by which the levels' deviations are scaled (up only where it rests on
    /// few readings).
    pub scale: f64,
    /// The relative error planned for.
    pub rel_err: f64,
    /// The probability that every phase holds it.
    pub confidence: f64,
}

impl RunPlan {
    /// What it holds, for a sentence.
    pub fn describe(&self) -> String {
        format!(
            "every phase the rig resolves ({}, the shortest {:.0} µs) within {} % at {:.0} %",
            self.phases,
            self.shortest_phase_s * 1e6,
            self.rel_err * 100.0,
            self.confidence * 100.0
        )
    }

    /// What it asks, for a sentence.
    pub fn asks(&self) -> String {
        format!(
            "bins of {:.1} µs and about {} executions",
            self.bin_s * 1e6,
            self.executions
        )
    }

    /// Why no run count holds it, where none does.
    pub fn unreachable(&self) -> Option<String> {
        (self.executions == u64::MAX).then(|| {
            format!(
                "no run count holds {}: a step inside bins of {:.1} µs, the finest the rig resolves, moves a phase's level by up to {:.1} %",
                self.describe(),
                self.bin_s * 1e6,
                self.step_bias * 100.0
            )
        })
    }
}

/// The runs of the rig's stitched profile `rig` on the GPU's timeline (its bins' times
/// less the reference's `lag`), over the bins that reach into `[0, until)`: bins in turn,
/// each joining the run before it while its level is within `tol` (relative) of that
/// run's mean, as (start, end, mean level W, bins). A bin with no sample ends a run and
/// joins none.
fn reference_runs(rig: &[Point], lag: f64, until: f64, tol: f64) -> Vec<(f64, f64, f64, usize)> {
    let mut runs: Vec<(f64, f64, f64, usize)> = Vec::new(); // start, end, Σ w, bins
    let mut open = false;
    for p in rig {
        let (lo, hi) = (p.lo_s - lag, p.hi_s - lag);
        if hi <= 0.0 || lo >= until {
            continue;
        }
        if p.n == 0 || !p.mean_w.is_finite() {
            open = false;
            continue;
        }
        match runs.last_mut() {
            Some(r)
                if open
                    && (p.mean_w - r.2 / r.3 as f64).abs() <= tol * (r.2 / r.3 as f64).abs() =>
            {
                r.1 = hi;
                r.2 += p.mean_w;
                r.3 += 1;
            }
            _ => runs.push((lo, hi, p.mean_w, 1)),
        }
        open = true;
    }
    runs.into_iter()
        .map(|r| (r.0, r.1, r.2 / r.3 as f64, r.3))
        .collect()
}

/// The figures of a correction, as `railtrace correct --json` prints them and the
/// corrected file's metadata holds them.
pub fn figures(
    c: &Corrected,
    model: &LoggerModel,
    model_path: &Path,
    plan: &PlanFor,
) -> serde_json::Value {
    let run_plan = c.run_plan(model, plan);
    let (a, d) = (&c.analysis, &c.d);
    serde_json::json!({
        "duration_s": c.duration_s,
        "idle_w": c.idle_w,
        "reference_lag_s": c.reference_lag_s,
        "energy_j": d.energy_j,
        "energy_lo_j": d.energy_lo_j,
        "energy_hi_j": d.energy_hi_j,
        "rig_energy_j": a.rig_energy_j,
        "lambda": d.lambda,
        "rule": d.rule,
        "noise_scale": d.noise_scale,
        "segments": d.segments,
        "confidence": d.confidence,
        "bin_s": d.dt_s,
        "requested_bin_s": c.requested_bin_s,
        "readings_per_bin": c.readings_per_bin,
        "band_carries": band_carries(c),
        "planned_executions": run_plan.as_ref().map(|p| p.executions),
        "plan": run_plan.as_ref().map(|p| c.plan(p)),
        "validity": validity(&c.outside_range(model, run_plan.as_ref())),
        "run_plan": run_plan,
        "logger_model": model_path.display().to_string(),
        "family": model.family,
    })
}

/// What the band and the energy's interval carry beyond the readings' noise and the
/// regulariser's choice of steps (the bootstrap's replicates, each chosen by the rule
/// again): the scale's and the level's standard uncertainties and the rig's stated
/// accuracy among them (null where the rig's description states none).
pub fn band_carries(c: &Corrected) -> serde_json::Value {
    serde_json::json!({
        "bootstrap_replicates": c.d.bootstrap,
        "confidence": c.d.confidence,
        "gain_sd": c.gain_sd,
        "offset_sd_w": c.offset_sd_w,
        "delay_sd_s": c.delay_sd_s,
        "timing_sd_s": c.duration_sd_s,
        "reference_accuracy": c.reference.map(|a| serde_json::json!({"gain_sd": a.gain_sd, "offset_sd_w": a.offset_sd_w})),
    })
}

/// Writes the corrected profile ([`table`]) as an Arrow IPC stream.
pub fn write(
    c: &Corrected,
    figures: &serde_json::Value,
    output: &Path,
) -> Result<(), CorrectError> {
    let failed = |why: String| CorrectError::Write {
        path: output.to_path_buf(),
        why,
    };
    let batch = table(c, figures).map_err(|e| failed(e.to_string()))?;
    let mut w = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema())
        .map_err(|e| failed(e.to_string()))?;
    w.write(&batch).map_err(|e| failed(e.to_string()))?;
    w.finish().map_err(|e| failed(e.to_string()))?;
    let bytes = w.into_inner().map_err(|e| failed(e.to_string()))?;
    crate::store::write_output(output, bytes).map_err(|e| failed(e.to_string()))
}

/// The corrected profile, one row per cell (`t_s`, `logger_w`, `corrected_w`, `lo_w`,
/// `hi_w`, `rig_w`), `figures` in the schema's `railtrace.corrected` metadata.
pub fn table(c: &Corrected, figures: &serde_json::Value) -> Result<RecordBatch, ArrowError> {
    let (a, d) = (&c.analysis, &c.d);
    let at = |points: &[Point], t: f64| {
        points
            .iter()
            .find(|p| p.lo_s <= t && t < p.hi_s && p.n > 0)
            .map_or(f64::NAN, |p| p.mean_w)
    };
    let col = |v: Vec<f64>| Arc::new(Float64Array::from(v)) as ArrayRef;
    let fields: Vec<Field> = ["t_s", "logger_w", "corrected_w", "lo_w", "hi_w", "rig_w"]
        .iter()
        .map(|n| Field::new(*n, DataType::Float64, true))
        .collect();
    let schema = Arc::new(
        Schema::new(fields).with_metadata(std::collections::HashMap::from([(
            "railtrace.corrected".to_string(),
            figures.to_string(),
        )])),
    );
    RecordBatch::try_new(
        schema.clone(),
        vec![
            col(d.t.clone()),
            col(d.t.iter().map(|&t| at(&a.logger, t)).collect()),
            col(d.power_w.clone()),
            col(d.lo_w.clone()),
            col(d.hi_w.clone()),
            col(d.t.iter().map(|&t| at(&a.rig, t)).collect()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The phases a verdict calls unresolved: on 10 µs cells over a 260 µs kernel, two
    /// 130 µs phases are resolved; a 20 µs phase between them is not, nor is a one-cell
    /// spike above both; a single cell between two levels (a step inside it) is no phase,
    /// nor are cells stepping down between them over the span the executions' steps blur.
    #[test]
    fn phases_under_three_bins_are_found_and_a_step_inside_a_cell_is_not_one() {
        let dt = 10e-6;
        let profile_blurred = |levels: &[(usize, f64)], ramp: f64| {
            let w: Vec<f64> = (levels.iter())
                .flat_map(|&(n, v)| std::iter::repeat_n(v, n))
                .chain(std::iter::repeat_n(140.0, 20))
                .collect();
            let t: Vec<f64> = (0..w.len()).map(|i| (i as f64 - 2.0 + 0.5) * dt).collect();
            short_phases(&phases(&t, dt, &w, 260e-6, ramp), dt)
        };
        let profile = |levels: &[(usize, f64)]| profile_blurred(levels, dt);
        // Two cells of idle before TOI 0, then the kernel.
        assert!(profile(&[(2, 140.0), (13, 548.0), (13, 385.0)]).is_empty());
        let step_inside = profile(&[(2, 140.0), (13, 548.0), (1, 470.0), (12, 385.0)]);
        assert!(step_inside.is_empty(), "{step_inside:?}");
        let short = profile(&[(2, 140.0), (12, 548.0), (2, 470.0), (12, 385.0)]);
        assert_eq!(short.len(), 1, "{short:?}");
        assert!((short[0].0 - 120e-6).abs() < 1e-12 && (short[0].1 - 20e-6).abs() < 1e-12);
        let spike = profile(&[(2, 140.0), (13, 548.0), (1, 700.0), (12, 385.0)]);
        assert_eq!(spike.len(), 1, "{spike:?}");
        // A step blurred over three cells: a ramp where the executions' steps spread
        // over 30 µs, phases where they fall within 20 µs.
        let ramp = [
            (2, 140.0),
            (11, 548.0),
            (1, 500.0),
            (1, 450.0),
            (1, 400.0),
            (12, 385.0),
        ];
        assert!(profile_blurred(&ramp, 30e-6).is_empty());
        assert_eq!(profile_blurred(&ramp, 20e-6).len(), 3);
        // A spike is a phase however blurred the steps are.
        let spike = profile_blurred(&[(2, 140.0), (13, 548.0), (1, 700.0), (12, 385.0)], 30e-6);
        assert_eq!(spike.len(), 1, "{spike:?}");
    }

    /// A rig's stitched profile of a kernel of one level `step` W above 140 W idle, seen
    /// through a first-order lag `tau`, over executions of `durations`: bin means on
    /// 10 µs bins from TOI 0 to 1 ms by a 2 000-point midpoint rule.
    fn lagged(tau: f64, durations: &[f64], step: f64) -> Vec<Point> {
        let r = |t: f64, d: f64| {
            let up = 1.0 - (-t.min(d) / tau).exp();
            let decay = if t > d { (-(t - d) / tau).exp() } else { 1.0 };
            140.0 + step * up * decay
        };
        (0..100)
            .map(|k| {
                let (lo, hi) = (f64::from(k) * 10e-6, f64::from(k + 1) * 10e-6);
                let m = 2000;
                let mean = (0..m)
                    .map(|i| {
                        let t = lo + (f64::from(i) + 0.5) * (hi - lo) / f64::from(m);
                        durations.iter().map(|&d| r(t, d)).sum::<f64>() / durations.len() as f64
                    })
                    .sum::<f64>()
                    / f64::from(m);
                Point {
                    lo_s: lo,
                    hi_s: hi,
                    n: 100,
                    mean_w: mean,
                    std_w: 1.0,
                    ci_half_w: 0.1,
                }
            })
            .collect()
    }

    #[test]
    fn the_rigs_lag_is_read_from_its_profile_at_the_kernels_start_or_end() {
        let tau = 5e-6;
        // One duration, ending mid-bin: the lag to 1 % from the start (the rise's eight
        // lags hold all but e^-8 of it) and from the end (the tail's 10 bins, e^-20).
        let one = lagged(tau, &[263e-6], 400.0);
        let lag = reference_lag(&one, 263e-6, 0.0).unwrap();
        assert!((lag / tau - 1.0).abs() < 0.01, "{lag}");
        let lag = end_lag(&one, 263e-6, 0.0).unwrap();
        assert!((lag / tau - 1.0).abs() < 0.01, "{lag}");
        // Durations spread by half the lag (uniform ±√3·σ): first order cancels; within 5 %.
        let sd = 0.5 * tau;
        let ds: Vec<f64> = (0..41)
            .map(|i| 263e-6 + 3f64.sqrt() * sd * (f64::from(i) / 20.0 - 1.0))
            .collect();
        let mean = ds.iter().sum::<f64>() / ds.len() as f64;
        let spread = (ds.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / ds.len() as f64).sqrt();
        let lag = end_lag(&lagged(tau, &ds, 400.0), mean, spread).unwrap();
        assert!((lag / tau - 1.0).abs() < 0.05, "{lag}");
        // Spread past the lag: not taken from the end; the start tells it all the same.
        assert_eq!(end_lag(&lagged(tau, &ds, 400.0), mean, 2.0 * tau), None);
        let lag = reference_lag(&lagged(tau, &ds, 400.0), mean, 2.0 * tau).unwrap();
        assert!((lag / tau - 1.0).abs() < 0.01, "{lag}");
        // A first phase too short to be level after the rise: the end's reading.
        let short = lagged(tau, &[30e-6], 400.0);
        assert_eq!(
            reference_lag(&short, 30e-6, 0.0),
            end_lag(&short, 30e-6, 0.0)
        );
        // No step at the end: nothing to read.
        assert_eq!(
            reference_lag(&lagged(tau, &[263e-6], 0.0), 263e-6, 0.0),
            None
        );
    }
}
