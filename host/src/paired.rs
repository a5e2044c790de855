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

use crate::recording::{self, Kind, LoggerColumn, RecordingError, Rows};
use railtrace_calibration::logger::{period_from_changes, Reference};
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
    let period = period_from_changes(run.logger_t, run.logger_w);
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

fn energy(
    run: &PairedRun<'_>,
    meter: &Reference,
    correct: Option<&dyn Fn(f64) -> f64>,
) -> Option<Energy> {
    let (mt, lt) = (run.meter_t, run.logger_t);
    let from = mt.first()?.max(*lt.first()?);
    let to = mt.last()?.min(*lt.last()?);
    if to <= from {
        return None;
    }
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

    /// The twin's logger behind a step load: a 20 ms box every 10 ms, 50 ms late, with
    /// gain 0.95 and offset −2 W; the meter an ideal step sampled every 200 µs.
    #[test]
    fn the_twins_known_delay_reads_as_a_lag_and_its_gain_as_the_steady_line() {
        use railtrace_twin::gpu::GpuClock;
        use railtrace_twin::logger::{Logger, LoggerConfig, LoggerModel};
        use railtrace_twin::trace::{Segment, Util};
        let (d, window, period) = (50e-3, 20e-3, 10e-3);
        let config = LoggerConfig {
            delay_s: d,
            gain: 0.95,
            offset_w: -2.0,
            ..LoggerConfig::new(LoggerModel::Box { window_s: window }, period)
        };
        let mut logger = Logger::new(config, GpuClock::new(1e8, 0.0, 0.0).unwrap()).unwrap();
        // 100 W, then 300 W from 3.0037 s, 100 W from 6.0071 s, ... (edges off the grid).
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
        let (lt, lw): (Vec<f64>, Vec<f64>) = logger
            .drain_samples()
            .map(|s| (s.true_time_s, s.power_w))
            .unzip();
        let mt: Vec<f64> = (0..90_000).map(|k| f64::from(k) * 200e-6).collect();
        let mw: Vec<f64> = mt.iter().map(|&t| level(t)).collect();
        let run = PairedRun {
            meter_t: &mt,
            meter_w: &mw,
            logger_t: &lt,
            logger_w: &lw,
            edges: &edges,
        };
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
