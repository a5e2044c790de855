//! FinGraV stitching: many runs of one kernel, each started after a random delay, so
//! that the power readings land at every offset into the kernel.
//!
//! - [`assign`] gives each reading its *time of interest* (TOI): its time relative to
//!   the start of the execution it belongs to, under a [`Policy`].
//! - [`profile`] bins the stitched points by TOI: mean, sample standard deviation and a
//!   Student-t confidence interval per bin.
//! - [`energy`] integrates a profile, [`energy_trapezoid`] dense samples.
//! - [`classify`] and [`estimate_settling`] separate the first executions of a train
//!   (SSE, "steady-state execution") from the later, power-settled ones (SSP).
//!
//! All on one timeline in s (after [`crate::align`]), powers in W. A stitched logger
//! profile is the true profile convolved with the logger's window, not the profile.

use crate::stats::two_sided_t;
use crate::ParamError;

/// One kernel execution on the common timeline, s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Execution {
    /// Start time, s.
    pub start: f64,
    /// End time, s (≥ `start`).
    pub end: f64,
}

/// One power reading on the common timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Time stamp, s (for a windowed logger: the time its value is attributed to, for
    /// example the end of its averaging window).
    pub time: f64,
    /// Power, W.
    pub power_w: f64,
}

/// Which readings belong to an execution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// A reading belongs to an execution whose `[start, end)` holds its time.
    Containing,
    /// A reading belongs to the latest execution that started at or before it, if it
    /// lies less than `horizon` s after that start; its TOI may exceed the execution's
    /// duration. This is what a windowed logger needs: a 1 ms box average stamped at its
    /// window's end still holds a 200 µs kernel's energy up to 1 ms after it ends.
    Following {
        /// Longest TOI kept, s.
        horizon: f64,
    },
}

/// A reading placed relative to an execution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stitched {
    /// Index of the execution in the slice given to [`assign`].
    pub execution: usize,
    /// Time of interest: the reading's time minus the execution's start, s (≥ 0).
    pub toi: f64,
    /// The reading's power, W.
    pub power_w: f64,
}

/// Assigns readings to executions: one [`Stitched`] per assigned reading, in the order
/// of `readings`; readings that belong to no execution (or hold a NaN or an infinity)
/// are left out.
///
/// The candidate execution of a reading at `t` is the one with the latest start `≤ t`,
/// found by binary search (O(n log m)); with [`Policy::Containing`] it must also have
/// `t < end`, with [`Policy::Following`] `t − start < horizon`. Executions are expected
/// in start order and not overlapping (one GPU queue); if they are not sorted they are
/// sorted here (indices still refer to the input), and where two overlap a reading goes
/// to the later-started one only. Executions with a non-finite start are ignored.
pub fn assign(readings: &[Reading], executions: &[Execution], policy: Policy) -> Vec<Stitched> {
    let mut order: Vec<usize> = (0..executions.len())
        .filter(|&i| executions[i].start.is_finite())
        .collect();
    if !order
        .windows(2)
        .all(|w| executions[w[0]].start <= executions[w[1]].start)
    {
        // Stable: equal starts keep input order.
        order.sort_by(|&i, &j| executions[i].start.total_cmp(&executions[j].start));
    }
    let starts: Vec<f64> = order.iter().map(|&i| executions[i].start).collect();
    let mut out = Vec::new();
    for r in readings {
        if !(r.time.is_finite() && r.power_w.is_finite()) {
            continue;
        }
        let k = starts.partition_point(|&s| s <= r.time);
        if k == 0 {
            continue;
        }
        let index = order[k - 1];
        let e = executions[index];
        let toi = r.time - e.start;
        let keep = match policy {
            Policy::Containing => r.time < e.end,
            Policy::Following { horizon } => toi < horizon,
        };
        if keep {
            out.push(Stitched {
                execution: index,
                toi,
                power_w: r.power_w,
            });
        }
    }
    out
}

/// One bin of a stitched profile: the readings with `lo ≤ toi < hi`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileBin {
    /// Lower TOI edge, s.
    pub lo: f64,
    /// Upper TOI edge, s.
    pub hi: f64,
    /// Number of readings in the bin.
    pub n: usize,
    /// Mean power, W (NaN if `n = 0`).
    pub mean_w: f64,
    /// Sample standard deviation (divisor `n − 1`), W (NaN if `n < 2`).
    pub std_w: f64,
    /// Half-width of the two-sided Student-t confidence interval of the mean,
    /// `t(confidence, n − 1) · std_w / √n`, W (NaN if `n < 2`).
    pub ci_half_w: f64,
}

/// Most bins [`profile`] will allocate.
pub const MAX_BINS: usize = 1_000_000;

/// Bins stitched points by TOI into bins `[k·bin_s, (k + 1)·bin_s)` and gives each its
/// mean, sample standard deviation and the half-width of the two-sided Student-t
/// confidence interval at `confidence` (e.g. 0.95).
///
/// The bins run contiguously from the first to the last occupied one (empty bins in
/// between have `n = 0` and NaN statistics); no points give no bins. Points with a NaN
/// or infinite TOI or power are ignored. The interval assumes the readings in a bin are
/// independent (distinct runs) and their mean nearly normal (CLT).
///
/// # Errors
///
/// `bin_s` not finite and > 0, `confidence` not in `(0, 1)`, or more than
/// [`MAX_BINS`] bins.
pub fn profile(
    points: &[Stitched],
    bin_s: f64,
    confidence: f64,
) -> Result<Vec<ProfileBin>, ParamError> {
    let mut acc = ProfileAccumulator::new(bin_s, confidence)?;
    for p in points {
        acc.push(p.toi, p.power_w);
    }
    acc.finish()
}

/// A stitched profile built one point at a time ([`profile`] of points given as they
/// come, e.g. a long capture's samples read a batch at a time): per bin the count and
/// the sums of the points and of their squares, each less the bin's first point (a shift
/// that keeps the variance's difference of sums free of cancellation, as Welford's
/// update does, without its division a point: most of the time of a long capture's
/// stitching), so memory holds the bins, not the points.
#[derive(Debug, Clone)]
pub struct ProfileAccumulator {
    bin_s: f64,
    confidence: f64,
    /// Bin number of `bins[0]`.
    first: i64,
    /// (count, shift, Σ(x − shift), Σ(x − shift)²).
    bins: Vec<(usize, f64, f64, f64)>,
    /// A point lay beyond `MAX_BINS` bins of the others.
    too_many: bool,
}

impl ProfileAccumulator {
    /// An empty profile of bins `bin_s` wide, intervals at `confidence`.
    ///
    /// # Errors
    ///
    /// `bin_s` not finite and > 0, or `confidence` not in (0, 1).
    pub fn new(bin_s: f64, confidence: f64) -> Result<Self, ParamError> {
        if !(bin_s.is_finite() && bin_s > 0.0) {
            return Err(ParamError::new("bin_s", bin_s, "must be finite and > 0"));
        }
        if !(confidence > 0.0 && confidence < 1.0) {
            return Err(ParamError::new(
                "confidence",
                confidence,
                "must be in (0, 1)",
            ));
        }
        Ok(ProfileAccumulator {
            bin_s,
            confidence,
            first: 0,
            bins: Vec::new(),
            too_many: false,
        })
    }

    /// Adds a point at `toi` (s) of `power_w`; a non-finite one is left out.
    pub fn push(&mut self, toi: f64, power_w: f64) {
        if !(toi.is_finite() && power_w.is_finite()) {
            return;
        }
        let q = toi / self.bin_s;
        if q.abs() > 1e15 {
            self.too_many = true;
            return;
        }
        // `q.floor()`, without a call to libm's `floor` (60 M points in a long capture).
        let k = q as i64 - i64::from(q < (q as i64) as f64);
        if self.bins.is_empty() {
            self.first = k;
        }
        let (lo, hi) = (
            self.first.min(k),
            (self.first + self.bins.len() as i64).max(k + 1),
        );
        if hi - lo > MAX_BINS as i64 {
            self.too_many = true;
            return;
        }
        if k < self.first {
            let more = (self.first - k) as usize;
            self.bins
                .splice(0..0, std::iter::repeat_n((0, 0.0, 0.0, 0.0), more));
            self.first = k;
        }
        let i = (k - self.first) as usize;
        if i >= self.bins.len() {
            self.bins.resize(i + 1, (0, 0.0, 0.0, 0.0));
        }
        let b = &mut self.bins[i];
        if b.0 == 0 {
            b.1 = power_w;
        }
        b.0 += 1;
        let d = power_w - b.1;
        b.2 += d;
        b.3 += d * d;
    }

    /// The bins from the first point's to the last's (empty ones included).
    ///
    /// # Errors
    ///
    /// The points span more than `MAX_BINS` bins.
    pub fn finish(self) -> Result<Vec<ProfileBin>, ParamError> {
        if self.too_many {
            return Err(ParamError::new("bin_s", self.bin_s, "gives too many bins"));
        }
        let bins = self
            .bins
            .iter()
            .enumerate()
            .map(|(i, &(n, shift, s1, s2))| {
                let k = (self.first + i as i64) as f64;
                let mean_w = if n > 0 {
                    shift + s1 / n as f64
                } else {
                    f64::NAN
                };
                let std_w = if n >= 2 {
                    ((s2 - s1 * s1 / n as f64).max(0.0) / (n - 1) as f64).sqrt()
                } else {
                    f64::NAN
                };
                let ci_half_w = if n >= 2 {
                    two_sided_t(self.confidence, (n - 1) as f64) * std_w / (n as f64).sqrt()
                } else {
                    f64::NAN
                };
                ProfileBin {
                    lo: k * self.bin_s,
                    hi: (k + 1.0) * self.bin_s,
                    n,
                    mean_w,
                    std_w,
                    ci_half_w,
                }
            })
            .collect();
        Ok(bins)
    }
}

/// Energies over windows of a dense trace read one sample at a time in time order: for
/// each window `[from, to]`, `∫ P` of the samples' linear interpolation, as
/// [`energy_trapezoid`] gives it over the whole trace (NaN for a window not within the
/// samples), in one pass and without keeping the samples. Where the trace has a hole
/// ([`WindowEnergies::gap`]: samples lost) nothing is interpolated across it: a window
/// that overlaps it is NaN.
#[derive(Debug, Clone)]
pub struct WindowEnergies {
    /// Every window's `from` and `to`, with (window, is its `to`), by time.
    marks: Vec<(f64, usize, bool)>,
    next: usize,
    /// Running integral at each window's start and end.
    at: Vec<(f64, f64)>,
    last: Option<(f64, f64)>,
    acc: f64,
    first_s: f64,
    bad: bool,
    /// Whether samples are missing before the next one.
    gap_pending: bool,
    /// The holes: from the last sample before to the first after, in time order.
    gaps: Vec<(f64, f64)>,
    windows: Vec<(f64, f64)>,
}

impl WindowEnergies {
    /// For windows `(from, to)` s.
    pub fn new(windows: &[(f64, f64)]) -> Self {
        let mut marks: Vec<(f64, usize, bool)> = windows
            .iter()
            .enumerate()
            .flat_map(|(i, &(a, b))| [(a, i, false), (b, i, true)])
            .collect();
        marks.sort_by(|a, b| a.0.total_cmp(&b.0));
        WindowEnergies {
            marks,
            next: 0,
            at: vec![(f64::NAN, f64::NAN); windows.len()],
            last: None,
            acc: 0.0,
            first_s: f64::NAN,
            bad: false,
            gap_pending: false,
            gaps: Vec::new(),
            windows: windows.to_vec(),
        }
    }

    /// Samples are missing between the last one pushed and the next: the windows that
    /// overlap that stretch have no energy (NaN).
    pub fn gap(&mut self) {
        self.gap_pending = true;
    }

    fn mark(&mut self, e: f64) {
        let (_, i, end) = self.marks[self.next];
        if end {
            self.at[i].1 = e;
        } else {
            self.at[i].0 = e;
        }
        self.next += 1;
    }

    /// Adds the next sample (times non-decreasing; a non-finite one makes every energy
    /// NaN, as [`energy_trapezoid`] refuses such a trace).
    pub fn push(&mut self, t: f64, w: f64) {
        if !(t.is_finite() && w.is_finite()) || self.last.is_some_and(|l| t < l.0) {
            self.bad = true;
            return;
        }
        let Some((t0, w0)) = self.last else {
            self.first_s = t;
            // Marks before the first sample stay NaN; those at it are 0.
            while self.next < self.marks.len() && self.marks[self.next].0 < t {
                self.next += 1;
            }
            while self.next < self.marks.len() && self.marks[self.next].0 == t {
                self.mark(0.0);
            }
            self.last = Some((t, w));
            return;
        };
        while self.next < self.marks.len() && self.marks[self.next].0 <= t {
            let q = self.marks[self.next].0;
            let h = q - t0;
            let e = if t > t0 {
                self.acc + h * (w0 + 0.5 * (w - w0) * h / (t - t0))
            } else {
                self.acc
            };
            self.mark(e);
        }
        if std::mem::take(&mut self.gap_pending) {
            self.gaps.push((t0, t));
        }
        self.acc += 0.5 * (w0 + w) * (t - t0);
        self.last = Some((t, w));
    }

    /// Each window's energy, J, in the order given.
    pub fn finish(self) -> Vec<f64> {
        let gaps = &self.gaps;
        // The holes' ends increase with their starts: the first that ends after a
        // window's start is the only one that can overlap it first.
        let over_gap = |&(from, to): &(f64, f64)| {
            let (lo, hi) = (from.min(to), from.max(to));
            let k = gaps.partition_point(|g| g.1 <= lo);
            gaps.get(k).is_some_and(|g| g.0 < hi)
        };
        (self.at.iter().zip(&self.windows))
            .map(|(&(a, b), w)| {
                if self.bad || over_gap(w) {
                    f64::NAN
                } else {
                    b - a
                }
            })
            .collect()
    }
}

/// Energy of a profile over `[from, to]` (TOI, s), J: `∫ mean_w dt` with the profile
/// taken as constant within each bin (partial bins count by their overlap).
///
/// NaN if any part of `[from, to]` is not covered by the bins, if an overlapped bin is
/// empty (`n = 0`), or for NaN bounds: a hole in the profile is not silently zero.
/// `from > to` gives the negative of `[to, from]`.
pub fn energy(profile: &[ProfileBin], from: f64, to: f64) -> f64 {
    if from.is_nan() || to.is_nan() {
        return f64::NAN;
    }
    if from > to {
        return -energy(profile, to, from);
    }
    if from == to {
        return 0.0;
    }
    let (mut joules, mut covered) = (0.0, 0.0);
    for b in profile {
        let overlap = b.hi.min(to) - b.lo.max(from);
        if overlap > 0.0 {
            if b.n == 0 || !b.mean_w.is_finite() {
                return f64::NAN;
            }
            joules += b.mean_w * overlap;
            covered += overlap;
        }
    }
    // Bins tile the range exactly up to rounding of their edges.
    if (covered - (to - from)).abs() > 1e-9 * (to - from) {
        return f64::NAN;
    }
    joules
}

/// Energy of densely sampled power over `[from, to]`, J, by the trapezoid rule on the
/// samples, the power interpolated linearly at `from` and `to` (partial first and last
/// intervals).
///
/// `times` (s) must be non-decreasing and as long as `watts` (W), with at least 2
/// samples, all finite, and `[from, to]` within `[times[0], times[last]]`; otherwise NaN.
/// `from > to` gives the negative of `[to, from]`. O(n) for the checks, O(log n + k) for
/// the `k` samples inside.
pub fn energy_trapezoid(times: &[f64], watts: &[f64], from: f64, to: f64) -> f64 {
    let n = times.len();
    if n < 2
        || watts.len() != n
        || from.is_nan()
        || to.is_nan()
        || !times.iter().chain(watts).all(|v| v.is_finite())
        || !times.windows(2).all(|w| w[0] <= w[1])
    {
        return f64::NAN;
    }
    if from > to {
        return -energy_trapezoid(times, watts, to, from);
    }
    if from < times[0] || to > times[n - 1] {
        return f64::NAN;
    }
    let at = |t: f64| {
        // times[j - 1] ≤ t < times[j], or t = times[n - 1].
        let j = times.partition_point(|&s| s <= t);
        if j >= n {
            watts[n - 1]
        } else {
            let (t0, t1) = (times[j - 1], times[j]);
            watts[j - 1] + (watts[j] - watts[j - 1]) * (t - t0) / (t1 - t0)
        }
    };
    let mut prev = (from, at(from));
    let mut joules = 0.0;
    let first = times.partition_point(|&s| s <= from);
    for k in first..n {
        if times[k] >= to {
            break;
        }
        joules += 0.5 * (times[k] - prev.0) * (watts[k] + prev.1);
        prev = (times[k], watts[k]);
    }
    joules + 0.5 * (to - prev.0) * (at(to) + prev.1)
}

/// Where an execution sits in its train (a run of back-to-back executions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainPosition {
    /// 0 for the train's first execution.
    pub index_in_train: u32,
    /// Start of this execution minus the start of the train's first one, s.
    pub since_train_start_s: f64,
}

/// FinGraV's two power regimes of a train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Regime {
    /// Steady-state execution: the first executions, before power settles.
    Sse,
    /// Steady-state power: after settling.
    Ssp,
}

/// Classifies executions: [`Regime::Sse`] for a train's first execution and for any
/// that started less than `settle_s` after the train's first start (or whose offset is
/// NaN), [`Regime::Ssp`] otherwise.
pub fn classify(execs: &[TrainPosition], settle_s: f64) -> Vec<Regime> {
    execs
        .iter()
        .map(|e| {
            if e.index_in_train > 0 && e.since_train_start_s >= settle_s {
                Regime::Ssp
            } else {
                Regime::Sse
            }
        })
        .collect()
}

/// The settling of power over a train, fitted as `p(u) = p_ssp_w + amplitude_w ·
/// exp(−u / tau_s)` to per-execution mean power against `u`, the time since the train's
/// first start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settling {
    /// Time constant, s.
    pub tau_s: f64,
    /// Suggested [`classify`] threshold, `3 · tau_s` (5 % of the gap left), s.
    pub settle_s: f64,
    /// Settled (SSP) power, W.
    pub p_ssp_w: f64,
    /// Power at `u = 0` minus `p_ssp_w`, W (negative when the first executions draw
    /// less, as on FinGraV's MI300X).
    pub amplitude_w: f64,
    /// RMS of the fit's residuals, W.
    pub rms_w: f64,
    /// True if the best `tau_s` lies at an end of the search range
    /// `[u_max / 1000, 10 · u_max]`: the data do not pin it down.
    pub at_search_edge: bool,
}

/// Estimates power settling over trains from per-execution mean power
/// `mean_power_w[i]` at `since_train_start_s[i]` (pooled over trains).
///
/// A 1-D search over `tau_s`: a log-spaced grid of 200 points on
/// `[u_max / 1000, 10 · u_max]`, refined by golden-section search on `ln tau` around the
/// best grid point; for each `tau_s`, `p_ssp_w` and `amplitude_w` are the linear
/// least-squares solution. Assumes one exponential with independent, equal-variance
/// noise; for `tau_s` to be identified the data must cover a few `tau_s`.
///
/// # Errors
///
/// Lengths differ, fewer than 4 finite points, a negative offset, or no spread of
/// offsets.
pub fn estimate_settling(
    since_train_start_s: &[f64],
    mean_power_w: &[f64],
) -> Result<Settling, ParamError> {
    if since_train_start_s.len() != mean_power_w.len() {
        return Err(ParamError::new(
            "mean_power_w.len()",
            mean_power_w.len() as f64,
            "must equal since_train_start_s.len()",
        ));
    }
    let (u, p): (Vec<f64>, Vec<f64>) = since_train_start_s
        .iter()
        .zip(mean_power_w)
        .filter(|(u, p)| u.is_finite() && p.is_finite())
        .map(|(u, p)| (*u, *p))
        .unzip();
    if u.len() < 4 {
        return Err(ParamError::new(
            "points",
            u.len() as f64,
            "need at least 4 finite points",
        ));
    }
    if let Some(&bad) = u.iter().find(|&&u| u < 0.0) {
        return Err(ParamError::new("since_train_start_s", bad, "must be >= 0"));
    }
    let u_max = u.iter().copied().fold(0.0, f64::max);
    let u_min = u.iter().copied().fold(f64::INFINITY, f64::min);
    if u_max <= u_min {
        return Err(ParamError::new(
            "since_train_start_s",
            u_max,
            "needs at least two distinct offsets",
        ));
    }
    let (ln_lo, ln_hi) = ((u_max / 1000.0).ln(), (10.0 * u_max).ln());
    const GRID: usize = 200;
    let grid = |i: usize| ln_lo + (ln_hi - ln_lo) * i as f64 / (GRID - 1) as f64;
    let sse = |ln_tau: f64| settle_fit(&u, &p, ln_tau.exp()).2;
    let on_grid: Vec<f64> = (0..GRID).map(|i| sse(grid(i))).collect();
    let best = (0..GRID)
        .min_by(|&i, &j| on_grid[i].total_cmp(&on_grid[j]))
        .unwrap_or(0);
    let at_search_edge = best == 0 || best == GRID - 1;
    // Golden-section search on [grid(best - 1), grid(best + 1)].
    let (mut a, mut b) = (grid(best.saturating_sub(1)), grid((best + 1).min(GRID - 1)));
    let g = 0.5 * (5.0_f64.sqrt() - 1.0);
    let (mut c, mut d) = (b - g * (b - a), a + g * (b - a));
    let (mut fc, mut fd) = (sse(c), sse(d));
    for _ in 0..80 {
        if fc <= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = sse(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = sse(d);
        }
    }
    let mut ln_tau = 0.5 * (a + b);
    if on_grid[best] < sse(ln_tau) {
        ln_tau = grid(best);
    }
    let tau_s = ln_tau.exp();
    let (p_ssp_w, amplitude_w, sse) = settle_fit(&u, &p, tau_s);
    Ok(Settling {
        tau_s,
        settle_s: 3.0 * tau_s,
        p_ssp_w,
        amplitude_w,
        rms_w: (sse / u.len() as f64).sqrt(),
        at_search_edge,
    })
}

/// Least squares of `p = c + a·exp(−u/tau)` for fixed `tau`: `(c, a, sse)`.
fn settle_fit(u: &[f64], p: &[f64], tau: f64) -> (f64, f64, f64) {
    let n = u.len() as f64;
    let e: Vec<f64> = u.iter().map(|u| (-u / tau).exp()).collect();
    let me = e.iter().sum::<f64>() / n;
    let mp = p.iter().sum::<f64>() / n;
    let (mut see, mut sep, mut spp) = (0.0, 0.0, 0.0);
    for (e, p) in e.iter().zip(p) {
        see += (e - me) * (e - me);
        sep += (e - me) * (p - mp);
        spp += (p - mp) * (p - mp);
    }
    if see <= 1e-300 {
        return (mp, 0.0, spp);
    }
    let a = sep / see;
    (mp - a * me, a, (spp - sep * sep / see).max(0.0))
}
