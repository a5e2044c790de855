//! A GPU's own power logger compared with a reference meter over one paired run, by the
//! measures of Yang, Adamek and Armour (SC24): the logger's update period, its rise time
//! and delay at the load's steps, its steady-state error as a line against the meter, and
//! the energy error over the run, raw and through an identified logger model.
//!
//! Conventions:
//! - **delay**: the logger's 50 % crossing of a step minus the meter's, so a positive
//!   delay means the logger lags the meter;
//! - **rise time**: from the 10 % to the 90 % crossing of the step's height, each signal's
//!   own levels (the median of the settled second half of the intervals before and after
//!   the edge); a logger's crossing is the time of its first reading past the level, so it
//!   is known to within its update period;
//! - **steady state**: readings with no edge within the settling time before them, each
//!   paired with the meter's mean over the update period before it; `reading = gradient ·
//!   meter + intercept` by least squares;
//! - **energy**: over the span both cover, the meter's samples joined by straight lines
//!   and the logger's readings each held until the next; the error is `(logger −
//!   meter) / meter`.

use std::path::Path;

use serde::Serialize;

use crate::analysis::logger_model::LoggerModel;
use crate::store::recording::{self, Kind, LoggerColumn, RecordingError, Rows};
use railtrace_calibration::deconvolve::{
    self, sampled_kernel, Input, LoggerKernel, Options as DeconvolveOptions, Profile,
};
use railtrace_calibration::logger::{period_from_changes, update_index, Reference};
use railtrace_calibration::stats::median;
use railtrace_calibration::ParamError;

/// A recording holding a meter and a logger on one timeline (`railtrace import pmd`),
/// read for [`measure`].
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// The meter's sample times, s.
    pub meter_t: Vec<f64>,
    /// Its total power, W.
    pub meter_w: Vec<f64>,
    /// The logger's reading times, s (those of the column asked for).
    pub logger_t: Vec<f64>,
    /// Its readings, W.
    pub logger_w: Vec<f64>,
    /// The load's edges, s.
    pub edges: Vec<f64>,
    /// The meter, as the recording's device names it (its `board`), where it does.
    pub meter: Option<String>,
    /// The logger, as the recording's settings describe it (`gpu_logger`), where they do.
    pub logger: Option<String>,
    /// Where the recording came from (its metadata's `source`).
    pub source: String,
}

impl Recorded {
    /// The run as [`measure`] takes it.
    pub fn run(&self) -> PairedRun<'_> {
        PairedRun {
            meter_t: &self.meter_t,
            meter_w: &self.meter_w,
            logger_t: &self.logger_t,
            logger_w: &self.logger_w,
            edges: &self.edges,
            update_s: None,
        }
    }
}

/// Reads the meter's samples, the logger's readings of `column` and the edges of the
/// recording at `path`.
///
/// # Errors
///
/// The recording cannot be read.
pub fn read(path: &Path, column: LoggerColumn) -> Result<Recorded, RecordingError> {
    let names = ["time_s", "total_w", column.column()];
    let r = recording::open_columns(path, &names)?;
    let mut out = Recorded {
        meter: (r.meta.device.as_ref()).and_then(|d| d["board"].as_str().map(str::to_string)),
        logger: (r.meta.settings.as_ref())
            .and_then(|s| s["gpu_logger"].as_str().map(str::to_string)),
        source: r.meta.source.clone(),
        ..Recorded::default()
    };
    for batch in r {
        let batch = batch?;
        let rows = Rows::new(&batch);
        let (time, total, logger) = (
            rows.f64("time_s"),
            rows.f32("total_w"),
            rows.f64(column.column()),
        );
        for i in 0..rows.len() {
            let t = time.value(i);
            match rows.kind(i) {
                Kind::Sample => {
                    if let Some(w) = Rows::get(total, i) {
                        out.meter_t.push(t);
                        out.meter_w.push(f64::from(w));
                    }
                }
                Kind::Logger => {
                    if let Some(w) = Rows::get(logger, i) {
                        out.logger_t.push(t);
                        out.logger_w.push(w);
                    }
                }
                Kind::Edge => out.edges.push(t),
                _ => {}
            }
        }
    }
    Ok(out)
}

/// One paired run: the meter's samples, the logger's readings and the load's edges, all
/// on one timeline (s), each in time order.
#[derive(Debug, Clone, Copy)]
pub struct PairedRun<'a> {
    /// The meter's sample times, s.
    pub meter_t: &'a [f64],
    /// The meter's power, W.
    pub meter_w: &'a [f64],
    /// The logger's reading times, s.
    pub logger_t: &'a [f64],
    /// The logger's readings, W.
    pub logger_w: &'a [f64],
    /// The load's edges, s.
    pub edges: &'a [f64],
    /// The logger's update period where it is known (a deconvolved run's cells), s; None:
    /// from the changes of its readings.
    pub update_s: Option<f64>,
}

/// One step of the load as each signal shows it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Step {
    /// The edge's time, s.
    pub edge_s: f64,
    /// Whether the power went up.
    pub rising: bool,
    /// The meter's levels before and after, W.
    pub meter_levels_w: [f64; 2],
    /// The logger's levels before and after, W.
    pub logger_levels_w: [f64; 2],
    /// The meter's 10-90 % rise time, s.
    pub meter_rise_s: f64,
    /// The logger's 10-90 % rise time, s.
    pub logger_rise_s: f64,
    /// The logger's 50 % crossing minus the meter's, s (positive: the logger lags).
    pub delay_s: f64,
}

/// A least-squares line `y = gradient · x + intercept`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Line {
    /// Slope.
    pub gradient: f64,
    /// Value at `x = 0`, W.
    pub intercept_w: f64,
    /// Coefficient of determination.
    pub r2: f64,
    /// Points fitted.
    pub points: usize,
}

/// Energy over a span, J.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Energy {
    /// The span, s.
    pub from_s: f64,
    /// Its end, s.
    pub to_s: f64,
    /// The meter's energy, J.
    pub meter_j: f64,
    /// The logger's raw readings' energy, J.
    pub logger_j: f64,
    /// `(logger − meter) / meter`.
    pub error: f64,
    /// The readings corrected by a logger model, where one was given: their energy, J.
    pub corrected_j: Option<f64>,
    /// Its error against the meter.
    pub corrected_error: Option<f64>,
}

/// The measures of one paired run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measures {
    /// The logger's update period from the changes of its readings, s, with its standard
    /// error (None where its readings change too seldom to tell).
    pub period_s: Option<[f64; 2]>,
    /// The steps whose neighbouring edges leave the logger time to settle (four update
    /// periods either side).
    pub steps: Vec<Step>,
    /// Edges left out: too close to a neighbour for the logger to settle between them.
    pub steps_unsettled: usize,
    /// Edges left out: the power changes there by less than a tenth.
    pub steps_flat: usize,
    /// Median of the steps' logger rise times, s.
    pub rise_s: Option<f64>,
    /// Median of the steps' delays, s (positive: the logger lags).
    pub delay_s: Option<f64>,
    /// Steady-state readings against the meter (None where the settled readings span one
    /// level only).
    pub steady: Option<Line>,
    /// Settled readings found.
    pub steady_readings: usize,
    /// The settling time used for the steady state, s.
    pub settle_s: f64,
    /// Energy over the run.
    pub energy: Option<Energy>,
}

/// `∫` over `[a, b]` of readings each held until the next (the last to `b`), J.
fn held_integral(t: &[f64], w: &[f64], a: f64, b: f64) -> f64 {
    (0..t.len())
        .map(|i| {
            let (s, e) = (t[i].max(a), t.get(i + 1).copied().unwrap_or(b).min(b));
            if e > s {
                w[i] * (e - s)
            } else {
                0.0
            }
        })
        .sum()
}

/// Least squares `y = g·x + c` with its R²; None for fewer than 3 points, or for points
/// whose `x` spans less than a fifth of its mean (one level: the slope is then set by
/// the noise, not by the sensor's scale).
fn line(x: &[f64], y: &[f64]) -> Option<Line> {
    let n = x.len();
    if n < 3 {
        return None;
    }
    let (lo, hi) = x
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    if hi - lo < 0.2 * (0.5 * (lo + hi)).abs() {
        return None;
    }
    let (mx, my) = (
        x.iter().sum::<f64>() / n as f64,
        y.iter().sum::<f64>() / n as f64,
    );
    let sxx: f64 = x.iter().map(|v| (v - mx).powi(2)).sum();
    let syy: f64 = y.iter().map(|v| (v - my).powi(2)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    if sxx.is_nan() || sxx <= 0.0 {
        return None;
    }
    let g = sxy / sxx;
    let rss = syy - g * sxy;
    Some(Line {
        gradient: g,
        intercept_w: my - g * mx,
        r2: if syy > 0.0 { 1.0 - rss / syy } else { 1.0 },
        points: n,
    })
}

/// When a signal crosses `level` going `up` (or down) for good within `[from, until]`:
/// after its last value short of the level there (so that noise about the level before
/// the step does not count), for samples joined by lines where the line crosses it, for
/// `held` readings the time of the next reading. The edge's own time is not used: a
/// bench's edge stamps may lag or lead the load.
fn crossing(
    t: &[f64],
    w: &[f64],
    (from, until): (f64, f64),
    level: f64,
    up: bool,
    held: bool,
) -> f64 {
    let short = |v: f64| if up { v < level } else { v > level };
    let (i0, i1) = (
        t.partition_point(|&s| s < from),
        t.partition_point(|&s| s <= until),
    );
    match (i0..i1).rev().find(|&i| short(w[i])) {
        Some(i) if i + 1 < t.len() => {
            if held {
                t[i + 1]
            } else {
                let f = (level - w[i]) / (w[i + 1] - w[i]);
                t[i] + f * (t[i + 1] - t[i])
            }
        }
        Some(_) => f64::NAN,
        None => t.get(i0).copied().unwrap_or(f64::NAN),
    }
}

/// The values of a signal within `[a, b]`.
fn within<'a>(t: &[f64], w: &'a [f64], a: f64, b: f64) -> &'a [f64] {
    &w[t.partition_point(|&s| s < a)..t.partition_point(|&s| s <= b)]
}

/// A step's levels, crossings and delay, from `from` (the middle of the interval before
/// the edge) to `to` (the end of the interval after it).
fn step(run: &PairedRun<'_>, before: (f64, f64), edge: f64, after: (f64, f64)) -> Option<Step> {
    let levels = |t: &[f64], w: &[f64]| {
        [
            median(within(t, w, before.0, before.1)),
            median(within(t, w, after.0, after.1)),
        ]
    };
    let m = levels(run.meter_t, run.meter_w);
    let l = levels(run.logger_t, run.logger_w);
    // A step a tenth of the power or more: below that, a marked edge where the load's
    // power barely changes (a run's closing mark), whose crossings are noise.
    let flat = |v: [f64; 2]| (v[1] - v[0]).abs() < 0.1 * v[0].abs().max(v[1].abs());
    if !m.iter().chain(&l).all(|v| v.is_finite()) || flat(m) || flat(l) {
        return None;
    }
    let up = m[1] > m[0];
    let span = (before.0, after.0);
    let at = |t: &[f64], w: &[f64], lv: [f64; 2], f: f64, held: bool| {
        crossing(t, w, span, lv[0] + f * (lv[1] - lv[0]), lv[1] > lv[0], held)
    };
    let (m10, m50, m90) = (
        at(run.meter_t, run.meter_w, m, 0.1, false),
        at(run.meter_t, run.meter_w, m, 0.5, false),
        at(run.meter_t, run.meter_w, m, 0.9, false),
    );
    let (l10, l50, l90) = (
        at(run.logger_t, run.logger_w, l, 0.1, true),
        at(run.logger_t, run.logger_w, l, 0.5, true),
        at(run.logger_t, run.logger_w, l, 0.9, true),
    );
    Some(Step {
        edge_s: edge,
        rising: up,
        meter_levels_w: m,
        logger_levels_w: l,
        meter_rise_s: m90 - m10,
        logger_rise_s: l90 - l10,
        delay_s: l50 - m50,
    })
}

/// The measures of `run`; `correct` maps a raw reading to the power it stands for (an
/// identified model's gain and offset inverted), for the corrected energy.
///
/// # Errors
///
/// The meter's samples are fewer than 2, not finite, or not in strictly increasing time.
pub fn measure(
    run: &PairedRun<'_>,
    correct: Option<&dyn Fn(f64) -> f64>,
) -> Result<Measures, ParamError> {
    // The meter's samples joined by straight lines, held before the first and after the
    // last: its means and integrals.
    let meter = Reference::new(run.meter_t, run.meter_w)?;
    let period = match run.update_s {
        Some(p) => Some((p, 0.0)),
        None => period_from_changes(run.logger_t, run.logger_w),
    };
    let t_up = period.map_or(f64::NAN, |p| p.0);
    // Levels from the settled second half of each interval between edges, which needs
    // readings there: intervals of at least four update periods either side.
    let mut steps = Vec::new();
    let (mut unsettled, mut flat) = (0, 0);
    let (first, last) = (
        run.meter_t.first().copied().unwrap_or(f64::NAN),
        run.meter_t.last().copied().unwrap_or(f64::NAN),
    );
    for (i, &e) in run.edges.iter().enumerate() {
        let prev = if i == 0 { first } else { run.edges[i - 1] };
        let next = run.edges.get(i + 1).copied().unwrap_or(last);
        if !(e - prev >= 4.0 * t_up && next - e >= 4.0 * t_up) {
            unsettled += 1;
            continue;
        }
        let before = (0.5 * (prev + e), e);
        let after = (0.5 * (e + next), next);
        match step(run, before, e, after) {
            Some(s) => steps.push(s),
            None => flat += 1,
        }
    }
    let pick = |f: fn(&Step) -> f64| {
        let v: Vec<f64> = steps.iter().map(f).collect();
        (!v.is_empty())
            .then(|| median(&v))
            .filter(|m| m.is_finite())
    };
    let (rise_s, delay_s) = (pick(|s| s.logger_rise_s), pick(|s| s.delay_s));
    // Settled: five update periods and a second after an edge (a logger's own average can
    // span a second), and an update period before the next.
    let settle_s = 5.0 * t_up.max(0.0) + 1.0;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for (&t, &w) in run.logger_t.iter().zip(run.logger_w) {
        let near = run.edges.iter().any(|&e| t - e < settle_s && e - t < t_up);
        if near || !t_up.is_finite() || t - t_up < first || t > last {
            continue;
        }
        let m = meter.mean(t - t_up, t);
        if m.is_finite() {
            x.push(m);
            y.push(w);
        }
    }
    let energy = energy(run, &meter, correct);
    Ok(Measures {
        period_s: period.map(|p| [p.0, p.1]),
        steps,
        steps_unsettled: unsettled,
        steps_flat: flat,
        rise_s,
        delay_s,
        steady: line(&x, &y),
        steady_readings: x.len(),
        settle_s,
        energy,
    })
}

/// The span both the meter and the logger cover, s: the energies' (None without either).
fn span(run: &PairedRun<'_>) -> Option<(f64, f64)> {
    let (mt, lt) = (run.meter_t, run.logger_t);
    Some((mt.first()?.max(*lt.first()?), mt.last()?.min(*lt.last()?)))
}

fn energy(
    run: &PairedRun<'_>,
    meter: &Reference,
    correct: Option<&dyn Fn(f64) -> f64>,
) -> Option<Energy> {
    let (from, to) = span(run)?;
    if to <= from {
        return None;
    }
    let lt = run.logger_t;
    let meter_j = meter.integral(from, to);
    // The reading in effect at `from` is the last one at or before it.
    let i0 = lt.partition_point(|&s| s <= from).saturating_sub(1);
    let (t, w) = (&lt[i0..], &run.logger_w[i0..]);
    let logger_j = held_integral(t, w, from, to);
    let corrected_j = correct.map(|f| {
        let c: Vec<f64> = w.iter().map(|&v| f(v)).collect();
        held_integral(t, &c, from, to)
    });
    let err = |j: f64| (j - meter_j) / meter_j;
    Some(Energy {
        from_s: from,
        to_s: to,
        meter_j,
        logger_j,
        error: err(logger_j),
        corrected_j,
        corrected_error: corrected_j.map(err),
    })
}

/// A run's logger readings with the logger's response undone ([`deconvolve`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Deconvolution {
    /// Width of a cell, the logger's update period, s.
    pub cell_s: f64,
    /// The share of a step the first update after it shows (the sampled response's first
    /// tap).
    pub first_share: f64,
    /// Updates read (cells with a reading at their end).
    pub updates: usize,
    /// Each cell's start, s on the run's timeline; the power is held until the next
    /// (the first starts at the run's energy span, a last point ends it).
    #[serde(skip)]
    pub t_s: Vec<f64>,
    /// Power per cell, W.
    #[serde(skip)]
    pub power_w: Vec<f64>,
    /// Lower edge of its band, W.
    #[serde(skip)]
    pub lo_w: Vec<f64>,
    /// Upper edge of its band, W.
    #[serde(skip)]
    pub hi_w: Vec<f64>,
    /// The band's central probability.
    pub confidence: f64,
    /// The readings' scatter about the fit, W (the noise the regularisation was set by).
    pub noise_w: f64,
    /// The deconvolved power's measures against the meter: its steps, steady line and
    /// energy (its `logger_j` and `error` are the deconvolved power's).
    pub measures: Measures,
}

/// Why a run's readings were not deconvolved.
#[derive(Debug, thiserror::Error)]
pub enum NotDeconvolved {
    /// Each reading averages part of its update only.
    #[error(
        "each reading averages {:.1} ms of every {:.1} ms update: the power between the windows is not in the readings",
        .window_s * 1e3,
        .period_s * 1e3
    )]
    Partial {
        /// The window, s.
        window_s: f64,
        /// The update period, s.
        period_s: f64,
    },
    /// The response is within one update.
    #[error(
        "the first update after a step shows {:.0} % of it: the readings already are the power at the update period's resolution, and there is nothing to deconvolve",
        .share * 100.0
    )]
    WithinOneUpdate {
        /// The first update's share of a step.
        share: f64,
    },
    /// Too few readings.
    #[error("{updates} updates read: too few to deconvolve")]
    Few {
        /// Updates read.
        updates: usize,
    },
    /// The model cannot be applied.
    #[error("the logger model: {0}")]
    Model(String),
    /// The solve failed.
    #[error("the deconvolution: {0}")]
    Solve(#[from] ParamError),
}

/// The logger's update instants on the readings' timeline, modulo `period`: the
/// readings change at the first poll after an update is shown, `u + delay` and the
/// poll's wait, so the changes' residues `(c − delay) mod period` fill an arc that starts
/// at the updates' phase; its start is the residue after the widest gap between them.
/// None with fewer than 8 changes, or residues that leave no gap of a tenth of the
/// period (polls as slow as the updates, whose waits fill the whole period).
fn update_phase(t: &[f64], w: &[f64], period: f64, delay: f64) -> Option<f64> {
    let mut r: Vec<f64> = (1..t.len().min(w.len()))
        .filter(|&j| w[j] != w[j - 1])
        .map(|j| (t[j] - delay).rem_euclid(period))
        .collect();
    if r.len() < 8 {
        return None;
    }
    r.sort_by(f64::total_cmp);
    // The gap before each residue, the first's across the period's wrap.
    let (mut widest, mut start) = (r[0] + period - r[r.len() - 1], r[0]);
    for i in 1..r.len() {
        if r[i] - r[i - 1] > widest {
            (widest, start) = (r[i] - r[i - 1], r[i]);
        }
    }
    (widest >= 0.1 * period).then_some(start)
}

/// A response whose first update shows this share of a step or more is left as it is.
pub const DECONVOLVE_BELOW_SHARE: f64 = 0.9;

/// The run's readings with `model`'s response undone, where the readings allow: a window
/// or time constant that spreads a step over several updates, each read.
///
/// The cells are the logger's updates: the reading showing update `u` is `gain·r(u) +
/// offset`, `r(u)` the response to power constant within each update's interval, so the
/// readings are `Σ_j h_j·P_{k−j}` with `h` the response sampled at the updates
/// ([`sampled_kernel`]), which [`deconvolve::deconvolve`] inverts (total variation, power
/// ≥ 0, λ by its discrepancy test, a bootstrap band). Readings of one update are
/// averaged. Before the first update the power is taken as steady at what the first
/// reading stands for (a run that starts idle). The deconvolved power is then measured
/// against the meter as the readings are, its energy over the same span. `bootstrap`
/// replicates give the band (0: none; each costs about a solve, a fraction of a second
/// for a thousand updates).
///
/// # Errors
///
/// [`NotDeconvolved`]: a response the readings cannot undo, too few readings, or a solve
/// that fails.
pub fn deconvolve(
    run: &PairedRun<'_>,
    model: &LoggerModel,
    bootstrap: usize,
) -> Result<Deconvolution, NotDeconvolved> {
    let p = model.period_s;
    let window = model.window_s.unwrap_or(p);
    if model.family == "partial" && window < p * (1.0 - 1e-9) {
        return Err(NotDeconvolved::Partial {
            window_s: window,
            period_s: p,
        });
    }
    let response = model
        .response(p, 0.0)
        .map_err(|e| NotDeconvolved::Model(e.to_string()))?;
    let h = sampled_kernel(&response, p)?;
    if h[0] >= DECONVOLVE_BELOW_SHARE {
        return Err(NotDeconvolved::WithinOneUpdate { share: h[0] });
    }
    // Each reading's update, counted from the first: on this run's own grid where its
    // readings show it (a model applied to another run of the same GPU), else the
    // model's.
    let phase = update_phase(run.logger_t, run.logger_w, p, model.delay_s).unwrap_or(model.phase_s);
    let update = |t: f64| update_index(t, p, phase, model.delay_s);
    let (Some(&t0), Some(&t1)) = (run.logger_t.first(), run.logger_t.last()) else {
        return Err(NotDeconvolved::Few { updates: 0 });
    };
    let (k0, k1) = (update(t0), update(t1));
    let bins = (k1 - k0).max(0.0) as usize + 1;
    if bins > deconvolve::MAX_CELLS {
        return Err(NotDeconvolved::Model(format!(
            "{bins} updates at {:.3} ms: more than the {} cells one deconvolution solves",
            p * 1e3,
            deconvolve::MAX_CELLS
        )));
    }
    let (mut sum, mut n) = (vec![0.0; bins], vec![0usize; bins]);
    for (&t, &w) in run.logger_t.iter().zip(run.logger_w) {
        let k = update(t) - k0;
        if (0.0..bins as f64).contains(&k) {
            sum[k as usize] += w;
            n[k as usize] += 1;
        }
    }
    let updates = n.iter().filter(|&&c| c > 0).count();
    if updates < 3 * h.len().max(4) {
        return Err(NotDeconvolved::Few { updates });
    }
    // Bin k ends at update k0 + k: TOI 0 is a period before the first update.
    let origin = phase + k0 * p - p;
    let profile = Profile {
        t0_s: 0.0,
        dt_s: p,
        power_w: (sum.iter().zip(&n))
            .map(|(s, &c)| if c > 0 { s / c as f64 } else { f64::NAN })
            .collect(),
        se_w: None,
        exact: Vec::new(),
    };
    let idle = model.invert(profile.power_w[0]).max(0.0);
    let d = deconvolve::deconvolve(
        &Input {
            profile,
            logger: LoggerKernel {
                kernel: h.clone(),
                delay_s: 0.0,
                gain: model.gain,
                offset_w: model.offset_w,
            },
            idle_w: idle,
            duration_s: bins as f64 * p,
            gain_sd: 0.0,
            offset_sd_w: 0.0,
            timing_sd_s: 0.0,
            delay_sd_s: 0.0,
        },
        &DeconvolveOptions {
            bootstrap,
            ..DeconvolveOptions::default()
        },
    )?;
    // Held from each cell's start, over the span the raw readings' energy covers.
    let (from, to) = span(run).unwrap_or((t0, t1));
    let (mut t, mut power, mut lo, mut hi) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, &c) in d.t.iter().enumerate() {
        let (start, end) = (origin + c - 0.5 * p, origin + c + 0.5 * p);
        if end <= from || start >= to {
            continue;
        }
        t.push(start.max(from));
        power.push(d.power_w[i]);
        lo.push(d.lo_w[i]);
        hi.push(d.hi_w[i]);
    }
    if let (Some(&pw), Some(&l), Some(&u)) = (power.last(), lo.last(), hi.last()) {
        t.push(to);
        power.push(pw);
        lo.push(l);
        hi.push(u);
    }
    let measures = measure(
        &PairedRun {
            logger_t: &t,
            logger_w: &power,
            update_s: Some(p),
            ..*run
        },
        None,
    )?;
    Ok(Deconvolution {
        cell_s: p,
        first_share: h[0],
        updates,
        t_s: t,
        power_w: power,
        lo_w: lo,
        hi_w: hi,
        confidence: d.confidence,
        noise_w: d.noise_scale,
        measures,
    })
}

impl Deconvolution {
    /// The deconvolved readings as CSV: each update's start, its power and band, and the
    /// meter's mean over the same span.
    ///
    /// # Errors
    ///
    /// The meter's samples unusable, or the file not written.
    pub fn write_csv(&self, rec: &Recorded, path: &Path) -> anyhow::Result<()> {
        use anyhow::Context;
        use std::fmt::Write;
        let d = self;
        let meter = Reference::new(&rec.meter_t, &rec.meter_w)
            .map_err(|e| anyhow::anyhow!("the meter's samples: {e}"))?;
        let mut w = String::new();
        writeln!(w, "t_s,power_w,lo_w,hi_w,meter_w")?;
        // The last point closes the span; it starts no update of its own.
        for i in 0..d.t_s.len().saturating_sub(1) {
            let (a, b) = (d.t_s[i], d.t_s[i + 1]);
            writeln!(
                w,
                "{a:.6},{:.3},{:.3},{:.3},{:.3}",
                d.power_w[i],
                d.lo_w[i],
                d.hi_w[i],
                meter.mean(a, b)
            )?;
        }
        crate::store::write_output(path, w)
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integrals_against_a_fine_sum() {
        // A triangle and a held staircase, summed on a fine grid as the reference.
        let t = [0.0, 1.0, 2.0, 4.0];
        let w = [0.0, 10.0, 0.0, 5.0];
        let fine = |f: &dyn Fn(f64) -> f64, a: f64, b: f64| {
            let n = 200_000;
            let h = (b - a) / f64::from(n);
            (0..n)
                .map(|k| f(a + (f64::from(k) + 0.5) * h) * h)
                .sum::<f64>()
        };
        let lin = |x: f64| {
            let i = t.partition_point(|&s| s <= x).clamp(1, 3);
            let f = ((x - t[i - 1]) / (t[i] - t[i - 1])).clamp(0.0, 1.0);
            w[i - 1] + f * (w[i] - w[i - 1])
        };
        let held = |x: f64| w[t.partition_point(|&s| s <= x).max(1) - 1];
        for (a, b) in [(0.0_f64, 4.0_f64), (0.5, 3.3), (1.2, 1.7), (3.0, 5.0)] {
            let want = fine(&lin, a, b.min(4.0)) + if b > 4.0 { 5.0 * (b - 4.0) } else { 0.0 };
            let joined = Reference::new(&t, &w).unwrap().integral(a, b);
            assert!((joined - want).abs() < 1e-6, "{a}..{b}");
            let want = fine(&held, a, b);
            assert!(
                (held_integral(&t, &w, a, b) - want).abs() < 1e-3,
                "{a}..{b}"
            );
        }
    }

    /// A paired run of the twin's logger `config` behind a step load: 100 W, then 300 W
    /// from 3.0037 s, 100 W from 6.0074 s, ... (five edges off the update grid), to 18 s;
    /// the meter an ideal step sampled every 200 µs. Each report read `polls` times per
    /// update period.
    fn twin_steps(config: railtrace_twin::logger::LoggerConfig, polls: u32) -> Recorded {
        use railtrace_twin::gpu::GpuClock;
        use railtrace_twin::logger::Logger;
        use railtrace_twin::trace::{Segment, Util};
        let period = config.period_s;
        let mut logger = Logger::new(config, GpuClock::new(1e8, 0.0, 0.0).unwrap()).unwrap();
        let edges: Vec<f64> = (1..6)
            .map(|k| f64::from(k) * 3.0 + 0.0037 * f64::from(k))
            .collect();
        let level = |t: f64| {
            if edges.iter().filter(|&&e| e <= t).count() % 2 == 1 {
                300.0
            } else {
                100.0
            }
        };
        let mut bounds = vec![0.0];
        bounds.extend(&edges);
        bounds.push(18.0);
        for w in bounds.windows(2) {
            let seg = Segment {
                start_s: w[0],
                end_s: w[1],
                power_w: level(w[0]),
                util: Util::default(),
            };
            logger.push(&seg).unwrap();
        }
        let (mut lt, mut lw) = (Vec::new(), Vec::new());
        for s in logger.drain_samples() {
            for poll in 0..polls {
                lt.push(s.true_time_s + f64::from(poll) / f64::from(polls) * period);
                lw.push(s.power_w);
            }
        }
        let mt: Vec<f64> = (0..90_000).map(|k| f64::from(k) * 200e-6).collect();
        let mw: Vec<f64> = mt.iter().map(|&t| level(t)).collect();
        Recorded {
            meter_t: mt,
            meter_w: mw,
            logger_t: lt,
            logger_w: lw,
            edges,
            ..Recorded::default()
        }
    }

    /// The twin's logger behind a step load: a 20 ms box every 10 ms, 50 ms late, with
    /// gain 0.95 and offset −2 W.
    #[test]
    fn the_twins_known_delay_reads_as_a_lag_and_its_gain_as_the_steady_line() {
        use railtrace_twin::logger::{LoggerConfig, LoggerModel};
        let (d, window, period) = (50e-3, 20e-3, 10e-3);
        let config = LoggerConfig {
            delay_s: d,
            gain: 0.95,
            offset_w: -2.0,
            ..LoggerConfig::new(LoggerModel::Box { window_s: window }, period)
        };
        let rec = twin_steps(config, 1);
        let run = rec.run();
        let m = measure(&run, Some(&|w: f64| (w + 2.0) / 0.95)).unwrap();
        assert_eq!(m.steps.len(), 5, "{m:?}");
        let p = m.period_s.unwrap()[0];
        assert!((p - period).abs() < 1e-6, "period {p}");
        for s in &m.steps {
            // The reading first past half the step is the first update at or after
            // edge + d + W/2; the meter's ideal step interpolates to within a sample.
            let lo = d + 0.5 * window - 200e-6;
            assert!((lo..lo + period + 400e-6).contains(&s.delay_s), "{s:?}");
            // 10 % and 90 % are 0.8·W apart, each known to within an update.
            assert!(
                (s.logger_rise_s - 0.8 * window).abs() <= period + 1e-9,
                "{s:?}"
            );
            assert!(s.meter_rise_s < 200e-6, "{s:?}");
        }
        assert!(
            m.delay_s.unwrap() > 0.0,
            "the logger lags: a positive delay"
        );
        let l = m.steady.unwrap();
        assert!(
            (l.gradient - 0.95).abs() < 1e-9 && (l.intercept_w + 2.0).abs() < 1e-6,
            "{l:?}"
        );
        // Energy: the raw readings carry the gain and offset and the 50 ms lag at each
        // edge; corrected, only the lag's energy remains: 5 edges × 200 W × (d + W/2 +
        // up to T) against ~2.7 kJ, alternately added and removed, so within 0.5 %.
        let e = m.energy.unwrap();
        assert!(
            (e.error - (0.95 - 1.0 - 2.0 / (e.meter_j / (e.to_s - e.from_s)))).abs() < 5e-3,
            "{e:?}"
        );
        assert!(e.corrected_error.unwrap().abs() < 5e-3, "{e:?}");
    }

    /// The model a lab would have identified for the twin's logger.
    fn model(
        family: &str,
        period: f64,
        window: f64,
        delay: f64,
        gain: f64,
        offset: f64,
    ) -> LoggerModel {
        let text = format!(
            "format = \"railtrace-logger-model\"\nversion = 1\nfamily = \"{family}\"\n\
             period_s = {period}\nperiod_se_s = 0.0\nphase_s = 0.0\ndelay_s = {delay}\n\
             delay_se_s = 0.0\nwindow_s = {window}\nwindow_se_s = 0.0\ngain = {gain}\n\
             gain_se = 0.0\noffset_w = {offset}\noffset_se_w = 0.0\nresidual_rms_w = 0.0\n\
             readings = 0\n[bic]\n[provenance]\ninput = \"twin\"\nreference = \"truth\"\n\
             logger = \"twin\"\ncreated_utc = \"\"\nrailtrace = \"\"\n"
        );
        LoggerModel::parse(Path::new("twin.toml"), &text).unwrap()
    }

    /// The twin's 1 s sliding box, updated every 100 ms and shown 30 ms later (gain 0.95,
    /// offset −2 W, 10 mW steps), polled twice per update, behind a step load: the raw
    /// readings lag each step by half the window, deconvolved with the logger's model by
    /// less than the update they are resolved to.
    #[test]
    fn a_long_window_deconvolved_follows_the_twins_steps() {
        use railtrace_twin::logger::{LoggerConfig, LoggerModel as Twin};
        let (d, window, period) = (30e-3, 1.0, 0.1);
        let config = LoggerConfig {
            delay_s: d,
            gain: 0.95,
            offset_w: -2.0,
            quantum_w: 0.01,
            ..LoggerConfig::new(Twin::Box { window_s: window }, period)
        };
        let rec = twin_steps(config, 2);
        let run = rec.run();
        let raw = measure(&run, None).unwrap();
        let dec = deconvolve(&run, &model("box", period, window, d, 0.95, -2.0), 20).unwrap();
        let m = &dec.measures;
        assert_eq!((raw.steps.len(), m.steps.len()), (5, 5), "{m:?}");
        assert!((dec.first_share - period / window).abs() < 1e-12);
        for (r, s) in raw.steps.iter().zip(&m.steps) {
            // Raw: the 50 % crossing is half the window and the delay late.
            assert!(r.delay_s > 0.5 * window, "{r:?}");
            // Deconvolved: the step falls within one update's cell, whose start is the
            // crossing, and the 10 % and 90 % crossings are in that cell or the next.
            assert!(s.delay_s.abs() < period, "{s:?}");
            assert!(s.logger_rise_s <= period + 1e-9, "{s:?}");
            assert!(
                (s.logger_levels_w[0] - s.meter_levels_w[0]).abs() < 0.5
                    && (s.logger_levels_w[1] - s.meter_levels_w[1]).abs() < 0.5,
                "{s:?}"
            );
        }
        // The energy over the run: exact but for the 10 mW steps and the last update's
        // power held to the span's end (the power is steady there).
        let e = m.energy.unwrap();
        assert!(e.error.abs() < 1e-3, "{e:?}");
        let l = m.steady.unwrap();
        assert!(
            (l.gradient - 1.0).abs() < 2e-3 && l.intercept_w.abs() < 0.5,
            "{l:?}"
        );
    }

    #[test]
    fn a_reading_within_one_update_is_not_deconvolved() {
        let (t, w): (Vec<f64>, Vec<f64>) = (0..200)
            .map(|k| (f64::from(k) * 0.1, if k % 40 < 20 { 100.0 } else { 300.0 }))
            .unzip();
        let run = PairedRun {
            meter_t: &t,
            meter_w: &w,
            logger_t: &t,
            logger_w: &w,
            edges: &[],
            update_s: None,
        };
        let partial = deconvolve(&run, &model("partial", 0.1, 0.025, 0.0, 1.0, 0.0), 0);
        assert!(
            matches!(partial, Err(NotDeconvolved::Partial { .. })),
            "{partial:?}"
        );
        let tiling = deconvolve(&run, &model("box", 0.1, 0.1, 0.0, 1.0, 0.0), 0);
        assert!(
            matches!(tiling, Err(NotDeconvolved::WithinOneUpdate { share }) if share == 1.0),
            "{tiling:?}"
        );
    }

    #[test]
    fn a_line_through_exact_points_and_its_r2() {
        let x = [100.0, 150.0, 200.0, 250.0];
        let y: Vec<f64> = x.iter().map(|v| 0.954 * v - 1.2).collect();
        let l = line(&x, &y).unwrap();
        assert!((l.gradient - 0.954).abs() < 1e-12 && (l.intercept_w + 1.2).abs() < 1e-9);
        assert!((l.r2 - 1.0).abs() < 1e-12);
        assert!(line(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]).is_none());
        // One level and its noise: no line.
        assert!(line(&[100.0, 101.0, 99.5, 100.2], &[95.0, 96.0, 94.0, 95.1]).is_none());
    }
}
