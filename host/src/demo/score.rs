//! The demo's scoring: a profiling run on the twin held against the twin's truth (its true
//! GPU power and true executions, written by the twin beside the run).
//!
//! Every profile is scored the same way, on the time of interest (TOI, s since each
//! execution's start):
//! - **each phase's power**: the profile's mean over the phase's true span (the mean over
//!   the kept executions of each phase boundary's TOI), cells weighted by their overlap;
//! - **the time of a step** between two phases: where the profile, linearly interpolated
//!   between cell centres, crosses the midpoint of its own two levels (each the median of
//!   its cells in the middle half of the phase) in the direction the truth steps, searched
//!   over the cells from the one holding the middle of one phase to the one holding the
//!   middle of the next; none if it never does;
//! - **RMS error**: against the truth stitched on the same cells (the mean over the kept
//!   executions of the true power over each cell), over the TOI span given.

use std::path::Path;

use anyhow::{anyhow, Context};

use crate::analysis::stitch::{cells, mean_over, Cell};
use arrow_array::{Array, Float64Array, ListArray, RecordBatch};
use railtrace_calibration::stats::median;

/// The twin's true GPU power and executions.
#[derive(Debug, Clone)]
pub struct Truth {
    /// Power segments `(start, end, W)`, in time order, true s.
    segments: Vec<(f64, f64, f64)>,
    /// Energy before each segment, J.
    before: Vec<f64>,
    /// Every execution, in order.
    pub executions: Vec<TrueExecution>,
}

/// One true execution.
#[derive(Debug, Clone, PartialEq)]
pub struct TrueExecution {
    /// Start, true s.
    pub start_s: f64,
    /// End, true s.
    pub end_s: f64,
    /// Phase boundaries (the first is the start, the last the end), true s.
    pub bounds_s: Vec<f64>,
    /// Its energy, J.
    pub energy_j: f64,
}

fn batches(path: &Path) -> anyhow::Result<Vec<RecordBatch>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    arrow_ipc::reader::StreamReader::try_new(file, None)
        .and_then(|r| r.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("{}: not a readable Arrow stream", path.display()))
}

fn f64s<'a>(b: &'a RecordBatch, name: &str, path: &Path) -> anyhow::Result<&'a Float64Array> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
        .ok_or_else(|| anyhow!("{}: no Float64 column {name:?}", path.display()))
}

impl Truth {
    /// Reads `gpu_power.arrow` and `executions.arrow` from the twin's truth directory.
    /// The truth's executions that are a profiling run's `aligned` ones: its last ones (the
    /// scenario's own workload ran before), checked to have the same durations (within
    /// 5 µs).
    pub fn executions_of(
        &self,
        aligned: &[crate::analysis::stitch::Aligned],
    ) -> anyhow::Result<&[TrueExecution]> {
        let n = aligned.len();
        anyhow::ensure!(
            self.executions.len() >= n,
            "the twin's truth has {} executions, the profile {n}",
            self.executions.len()
        );
        let mine = &self.executions[self.executions.len() - n..];
        let worst = aligned
            .iter()
            .zip(mine)
            .map(|(x, e)| (x.duration_s - (e.end_s - e.start_s)).abs())
            .fold(0.0, f64::max);
        anyhow::ensure!(
            worst < 5e-6,
            "the profile's executions are not the truth's (durations differ by up to {:.1} µs)",
            worst * 1e6
        );
        Ok(mine)
    }

    pub fn read(dir: &Path) -> anyhow::Result<Truth> {
        let path = dir.join("gpu_power.arrow");
        let mut segments = Vec::new();
        for b in batches(&path)? {
            let (s, e, p) = (
                f64s(&b, "start_s", &path)?,
                f64s(&b, "end_s", &path)?,
                f64s(&b, "power_w", &path)?,
            );
            segments.extend((0..b.num_rows()).map(|i| (s.value(i), e.value(i), p.value(i))));
        }
        segments.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut before = Vec::with_capacity(segments.len());
        let mut e = 0.0;
        for &(a, b, p) in &segments {
            before.push(e);
            e += p * (b - a);
        }
        let path = dir.join("executions.arrow");
        let mut executions = Vec::new();
        for b in batches(&path)? {
            let (s, e, en) = (
                f64s(&b, "start_s", &path)?,
                f64s(&b, "end_s", &path)?,
                f64s(&b, "energy_j", &path)?,
            );
            let bounds = b
                .column_by_name("phase_bounds_s")
                .and_then(|c| c.as_any().downcast_ref::<ListArray>())
                .ok_or_else(|| anyhow!("{}: no list column \"phase_bounds_s\"", path.display()))?;
            for i in 0..b.num_rows() {
                let v = bounds.value(i);
                let v = v
                    .as_any()
                    .downcast_ref::<Float64Array>()
                    .ok_or_else(|| anyhow!("{}: phase_bounds_s is not Float64", path.display()))?;
                executions.push(TrueExecution {
                    start_s: s.value(i),
                    end_s: e.value(i),
                    bounds_s: v.values().to_vec(),
                    energy_j: en.value(i),
                });
            }
        }
        Ok(Truth {
            segments,
            before,
            executions,
        })
    }

    /// True energy from the first segment's start to `t`, J.
    fn energy_to(&self, t: f64) -> f64 {
        let i = self.segments.partition_point(|s| s.0 <= t);
        if i == 0 {
            return 0.0;
        }
        let (a, b, p) = self.segments[i - 1];
        self.before[i - 1] + p * (t.min(b) - a)
    }

    /// True mean power over `[a, b]`, W.
    pub fn mean(&self, a: f64, b: f64) -> f64 {
        (self.energy_to(b) - self.energy_to(a)) / (b - a)
    }
}

/// The truth stitched on a set of executions.
#[derive(Debug, Clone)]
pub struct Stitched<'a> {
    truth: &'a Truth,
    execs: Vec<&'a TrueExecution>,
    /// Each phase boundary's mean TOI, s (the first 0, the last the mean duration).
    pub bounds_s: Vec<f64>,
    /// Each phase's mean power, W.
    pub phase_w: Vec<f64>,
    /// Mean energy per execution, J.
    pub energy_j: f64,
}

impl<'a> Stitched<'a> {
    /// The truth over `execs` (at least one, all with the same number of phases).
    /// The truth stitched on the executions the analysis kept, `mine` being the truth's
    /// executions of the same run (from [`Truth::executions_of`]).
    pub fn of_kept(
        truth: &'a Truth,
        aligned: &[crate::analysis::stitch::Aligned],
        mine: &'a [TrueExecution],
    ) -> anyhow::Result<Stitched<'a>> {
        let kept = aligned
            .iter()
            .zip(mine)
            .filter(|(x, _)| x.kept)
            .map(|(_, e)| e)
            .collect();
        Stitched::new(truth, kept)
    }

    pub fn new(truth: &'a Truth, execs: Vec<&'a TrueExecution>) -> anyhow::Result<Stitched<'a>> {
        let first = execs
            .first()
            .ok_or_else(|| anyhow!("no executions to score"))?;
        let phases = first.bounds_s.len().saturating_sub(1);
        anyhow::ensure!(phases >= 1, "the truth's executions have no phases");
        anyhow::ensure!(
            execs.iter().all(|e| e.bounds_s.len() == phases + 1),
            "the executions' phase counts differ"
        );
        let n = execs.len() as f64;
        let bounds_s = (0..=phases)
            .map(|j| execs.iter().map(|e| e.bounds_s[j] - e.start_s).sum::<f64>() / n)
            .collect();
        let phase_w = (0..phases)
            .map(|j| {
                execs
                    .iter()
                    .map(|e| truth.mean(e.bounds_s[j], e.bounds_s[j + 1]))
                    .sum::<f64>()
                    / n
            })
            .collect();
        let energy_j = execs.iter().map(|e| e.energy_j).sum::<f64>() / n;
        Ok(Stitched {
            truth,
            execs,
            bounds_s,
            phase_w,
            energy_j,
        })
    }

    /// The true power stitched on `[lo, hi)` TOI: its mean over the executions, W.
    pub fn mean(&self, lo: f64, hi: f64) -> f64 {
        self.execs
            .iter()
            .map(|e| self.truth.mean(e.start_s + lo, e.start_s + hi))
            .sum::<f64>()
            / self.execs.len() as f64
    }

    /// The truth on cells `dt` wide from `lo` to `hi`.
    pub fn cells(&self, lo: f64, hi: f64, dt: f64) -> Vec<Cell> {
        let n = ((hi - lo) / dt).ceil().max(0.0) as usize;
        (0..n)
            .map(|i| {
                let a = lo + i as f64 * dt;
                Cell {
                    lo: a,
                    hi: a + dt,
                    w: self.mean(a, a + dt),
                }
            })
            .collect()
    }

    /// Scores `cells` (whose energy per execution is `energy_j`) against this truth, the
    /// RMS error over cells centred in `rms_span`.
    pub fn score(&self, cells: &[Cell], energy_j: f64, rms_span: (f64, f64)) -> Score {
        let b = &self.bounds_s;
        let phase_w: Vec<f64> = b.windows(2).map(|p| mean_over(cells, p[0], p[1])).collect();
        let level = |j: usize| {
            let q = 0.25 * (b[j + 1] - b[j]);
            let mut v: Vec<f64> = cells
                .iter()
                .filter(|c| {
                    let m = 0.5 * (c.lo + c.hi);
                    m > b[j] + q && m < b[j + 1] - q && c.w.is_finite()
                })
                .map(|c| c.w)
                .collect();
            v.sort_by(f64::total_cmp);
            if v.is_empty() {
                f64::NAN
            } else if v.len() % 2 == 1 {
                v[v.len() / 2]
            } else {
                0.5 * (v[v.len() / 2 - 1] + v[v.len() / 2])
            }
        };
        let step_s = (1..b.len() - 1)
            .map(|j| {
                let (l0, l1) = (level(j - 1), level(j));
                let down = self.phase_w[j] < self.phase_w[j - 1];
                if !(l0.is_finite() && l1.is_finite()) || (l1 < l0) != down {
                    return None;
                }
                // The cells over the span, those holding its ends included: on cells
                // as wide as a third of a phase, a centre a hair past the next phase's
                // middle would otherwise leave the step with no cell after it.
                let (from, to) = (0.5 * (b[j - 1] + b[j]), 0.5 * (b[j] + b[j + 1]));
                let pts: Vec<(f64, f64)> = cells
                    .iter()
                    .filter(|c| c.hi > from && c.lo < to && c.w.is_finite())
                    .map(|c| (0.5 * (c.lo + c.hi), c.w))
                    .collect();
                // Where the profile first crosses `l0 + f·(l1 − l0)` on its way.
                let cross = |f: f64| {
                    let level = l0 + f * (l1 - l0);
                    pts.windows(2).find_map(|p| {
                        let ((t0, w0), (t1, w1)) = (p[0], p[1]);
                        let crosses = if down {
                            w0 >= level && w1 < level
                        } else {
                            w0 <= level && w1 > level
                        };
                        crosses.then(|| t0 + (t1 - t0) * (w0 - level) / (w0 - w1))
                    })
                };
                // A step, not a ramp: its 10-90 % transition within half the shorter
                // of the phases it divides.
                let rise = cross(0.9)? - cross(0.1)?;
                let shorter = (b[j] - b[j - 1]).min(b[j + 1] - b[j]);
                (rise <= 0.5 * shorter).then(|| cross(0.5)).flatten()
            })
            .collect();
        let (mut sq, mut n) = (0.0, 0usize);
        for c in cells {
            let m = 0.5 * (c.lo + c.hi);
            if m >= rms_span.0 && m < rms_span.1 && c.w.is_finite() {
                sq += (c.w - self.mean(c.lo, c.hi)).powi(2);
                n += 1;
            }
        }
        Score {
            phase_w,
            step_s,
            energy_j,
            rms_w: if n > 0 {
                (sq / n as f64).sqrt()
            } else {
                f64::NAN
            },
        }
    }
}

/// A profile's figures against the truth.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Score {
    /// Each phase's power, W.
    pub phase_w: Vec<f64>,
    /// Each step's TOI, s: where the profile crosses halfway between the levels of the
    /// two phases (their middle halves' medians); none where it does not change the
    /// truth's way, or only ramps (its 10-90 % transition longer than half the shorter
    /// phase).
    pub step_s: Vec<Option<f64>>,
    /// Energy per execution, J.
    pub energy_j: f64,
    /// RMS error against the stitched truth, W.
    pub rms_w: f64,
}

/// How the corrected profile's band and the energy's interval held the truth on one run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BandScore {
    /// Cells over the kernel whose band holds the truth, and the kernel's cells.
    pub kernel_cells: (usize, usize),
    /// The same over the logger's reach after the kernel (to the next execution's start
    /// at the earliest).
    pub after_cells: (usize, usize),
    /// The band's median half-width over the kernel, W.
    pub median_half_width_w: f64,
    /// The corrected profile's median absolute error over the kernel, W.
    pub median_error_w: f64,
    /// Whether the energy per execution's interval holds the truth's.
    pub energy_held: bool,
}

impl BandScore {
    /// `band` (low, high cells) about `corrected` against `truth` on the same cells
    /// (matched by their start), over the kernel `[0, duration)` and `[duration, end)`
    /// after it; `energy` the truth's energy per execution and `interval` the energy's.
    fn of(
        truth: &[Cell],
        corrected: &[Cell],
        band: &[(Cell, Cell)],
        (duration, end): (f64, f64),
        energy: f64,
        interval: (f64, f64),
    ) -> BandScore {
        let dt = corrected.first().map_or(1.0, |c| c.hi - c.lo);
        let key = |c: &Cell| (c.lo / dt).round() as i64;
        let truth: std::collections::HashMap<i64, f64> =
            truth.iter().map(|c| (key(c), c.w)).collect();
        let (mut kernel, mut after) = ((0, 0), (0, 0));
        let (mut half, mut error) = (Vec::new(), Vec::new());
        for (c, (lo, hi)) in corrected.iter().zip(band) {
            let Some(&p) = truth.get(&key(c)).filter(|p| p.is_finite()) else {
                continue;
            };
            let mid = 0.5 * (c.lo + c.hi);
            let held = usize::from(lo.w - 1e-9 <= p && p <= hi.w + 1e-9);
            if (0.0..duration).contains(&mid) {
                kernel.0 += held;
                kernel.1 += 1;
                half.push(0.5 * (hi.w - lo.w));
                error.push((c.w - p).abs());
            } else if (duration..end).contains(&mid) {
                after.0 += held;
                after.1 += 1;
            }
        }
        BandScore {
            kernel_cells: kernel,
            after_cells: after,
            median_half_width_w: median(&half),
            median_error_w: median(&error),
            energy_held: interval.0 <= energy && energy <= interval.1,
        }
    }

    /// The band's score in a sentence, for a band of `confidence` (0.95: 95 %).
    pub fn describe(&self, confidence: f64) -> String {
        format!(
            "{:.0} % band: holds the truth in {} of {} cells over the kernel and {} of {} over the logger's reach after it; median half-width {:.2} W against a median error of {:.2} W; the energy's interval {} the truth",
            confidence * 100.0,
            self.kernel_cells.0,
            self.kernel_cells.1,
            self.after_cells.0,
            self.after_cells.1,
            self.median_half_width_w,
            self.median_error_w,
            if self.energy_held { "holds" } else { "MISSES" }
        )
    }
}

/// Every profile of a corrected run on the same cells, and its scores.
#[derive(Debug, Clone)]
pub struct Scored {
    /// The truth's, the rig's, the raw stitched logger's and the corrected profile's
    /// scores, in that order.
    pub rows: [(&'static str, Score); 4],
    /// How the corrected profile's band held the truth.
    pub band: BandScore,
    /// The kept executions' true mean duration, s.
    pub duration_s: f64,
    /// The TOI span the profiles are drawn over, s.
    pub span: (f64, f64),
    /// The profiles.
    pub profiles: Profiles,
}

/// The profiles of a corrected run, as cells.
#[derive(Debug, Clone)]
pub struct Profiles {
    /// The truth stitched on the corrected profile's cells.
    pub truth: Vec<Cell>,
    /// The rig's.
    pub rig: Vec<Cell>,
    /// The raw stitched logger's.
    pub raw: Vec<Cell>,
    /// The rig's through the identified logger.
    pub through: Vec<Cell>,
    /// The corrected one.
    pub corrected: Vec<Cell>,
    /// The corrected profile's band, (low, high) a cell.
    pub band: Vec<(Cell, Cell)>,
}

/// The corrected run `c` held against the twin's `truth`: the host's executions are the
/// twin's last ones (its scenario's own workload ran before). RMS errors are over the
/// kernel and the logger's reach after it, up to the next execution's start at the
/// earliest.
///
/// # Errors
///
/// The truth not holding the run's executions.
pub fn score(truth: &Truth, c: &crate::analysis::correct::Corrected) -> anyhow::Result<Scored> {
    let (a, d) = (&c.analysis, &c.d);
    let mine = truth.executions_of(&a.executions)?;
    let st = Stitched::of_kept(truth, &a.executions, mine)?;
    let duration = *st.bounds_s.last().unwrap_or(&0.0);
    let dt = d.dt_s;
    let corrected: Vec<Cell> = (d.t.iter().zip(&d.power_w))
        .map(|(&t, &w)| Cell {
            lo: t - 0.5 * dt,
            hi: t + 0.5 * dt,
            w,
        })
        .collect();
    let band: Vec<(Cell, Cell)> = (corrected.iter().zip(d.lo_w.iter().zip(&d.hi_w)))
        .map(|(c, (&l, &h))| (Cell { w: l, ..*c }, Cell { w: h, ..*c }))
        .collect();
    let raw = cells(&a.logger);
    let rig = cells(&a.rig);
    let through = crate::analysis::logger_model::through_logger(
        &rig.iter().map(|c| (c.lo, c.w)).collect::<Vec<_>>(),
        a.options.bin_s,
        &c.logger,
        c.idle_w,
    )
    .into_iter()
    .zip(&rig)
    .map(|((_, w), r)| Cell { w, ..*r })
    .collect();
    let reach = c.logger.kernel.len() as f64 * dt;
    // Up to the next execution's start at the earliest (the truth beyond holds it).
    let spacing = (mine.windows(2))
        .map(|w| w[1].start_s - w[0].start_s)
        .fold(f64::INFINITY, f64::min);
    let span = (
        corrected.first().map_or(0.0, |c| c.lo).min(0.0),
        raw.last().map_or(duration + reach, |c| c.hi).min(spacing),
    );
    // Not past the next execution's start: the readings there are of the next one.
    let rms_span = (0.0, (duration + reach).min(spacing));
    let exact = Score {
        phase_w: st.phase_w.clone(),
        step_s: (st.bounds_s[1..st.bounds_s.len() - 1].iter())
            .map(|&b| Some(b))
            .collect(),
        energy_j: st.energy_j,
        rms_w: 0.0,
    };
    let rows = [
        ("truth", exact),
        ("rig", st.score(&rig, a.rig_energy_j, rms_span)),
        (
            "raw stitched",
            st.score(&raw, mean_over(&raw, 0.0, duration) * duration, rms_span),
        ),
        ("corrected", st.score(&corrected, d.energy_j, rms_span)),
    ];
    let truth_cells = st.cells(span.0, span.1, dt);
    let band_score = BandScore::of(
        &truth_cells,
        &corrected,
        &band,
        (duration, rms_span.1),
        st.energy_j,
        (d.energy_lo_j, d.energy_hi_j),
    );
    Ok(Scored {
        rows,
        band: band_score,
        duration_s: duration,
        span,
        profiles: Profiles {
            truth: truth_cells,
            rig,
            raw,
            through,
            corrected,
            band,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One execution at 0 of three phases, 140 W idle around it.
    fn truth(bounds: &[f64], power: &[f64]) -> Truth {
        let mut segments = vec![(-1e-3, 0.0, 140.0)];
        segments.extend(bounds.windows(2).zip(power).map(|(b, &p)| (b[0], b[1], p)));
        segments.push((*bounds.last().unwrap(), 1e-3, 140.0));
        let mut before = Vec::new();
        let mut e = 0.0;
        for &(a, b, p) in &segments {
            before.push(e);
            e += p * (b - a);
        }
        Truth {
            segments,
            before,
            executions: vec![TrueExecution {
                start_s: 0.0,
                end_s: *bounds.last().unwrap(),
                bounds_s: bounds.to_vec(),
                energy_j: e,
            }],
        }
    }

    #[test]
    fn a_step_drawn_a_cell_late_is_found_there() {
        // Phases 15, 20 and 14.9 µs on 5 µs cells, and a profile that draws the second
        // step a cell late, at 40 µs: the cell after it (centre 42.5 µs) lies a hair past
        // phase 3's middle (42.45 µs), and the step is still found, 5 µs late, not
        // missed.
        let bounds = [0.0, 15e-6, 35e-6, 49.9e-6];
        let t = truth(&bounds, &[548.0, 386.0, 497.0]);
        let st = Stitched::new(&t, t.executions.iter().collect()).unwrap();
        let drawn = [
            548.0, 548.0, 548.0, 386.0, 386.0, 386.0, 386.0, 386.0, 497.0, 497.0,
        ];
        let cells: Vec<Cell> = (0..12)
            .map(|k| Cell {
                lo: f64::from(k) * 5e-6,
                hi: f64::from(k + 1) * 5e-6,
                w: drawn.get(k as usize).copied().unwrap_or(140.0),
            })
            .collect();
        let s = st.score(&cells, st.energy_j, (0.0, 60e-6));
        for (got, want) in s.step_s.iter().zip([15e-6, 40e-6]) {
            let got = got.expect("a step");
            assert!((got - want).abs() < 1e-9, "{got} against {want}");
        }
    }
}
