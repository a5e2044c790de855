//! Logger identification: what a GPU's own power logger does to the power, measured
//! against a reference trace on the same timeline.
//!
//! # The models
//!
//! With `P(t)` the reference power and the logger's *update instants* `u_k = φ + k·T`
//! (period `T`, phase `φ`), a reading taken at time `t` shows the latest update that is
//! visible by then: `u = max { u_k : u_k ≤ t − d }` (delay `d`), so a logger polled faster
//! than it updates repeats its last value, and one polled at its own rate shows a new
//! update each time. The reading is `g · r(u) + c` (gain `g`, offset `c`), where the
//! response `r(u)` is, per family:
//!
//! - [`Family::Box`]: `r(u) = mean of P over [u − W, u]` with `W = T`: windows tile
//!   time (an MI300X-like 1 ms average reported every 1 ms), or `W > T`: a sliding
//!   average (an RTX 3090-like 1 s average updated every 100 ms); every instant is seen;
//! - [`Family::Partial`]: `r(u) = mean of P over [u − W, u]` with `0 < W ≤ T` (an
//!   A100-like 25 ms window every 100 ms: only `W / T` of the time is seen);
//! - [`Family::Exponential`]: `r(u) = y(u)`, `τ·y' = P − y` (a first-order low pass
//!   sampled at the updates);
//! - [`Family::Response`]: `r(u) = Σ_i h_i ∫ P over [u − (i+1)Δ, u − iΔ]`, a
//!   non-negative staircase response of unit area `Σ h_i Δ = 1` on a grid `Δ` (the
//!   gain is its area before normalisation).
//!
//! These are the twin's logger models (`hardware/twin/src/logger.rs`; its `box` with
//! `W ≤ P` is a partial window here unless `W = P`): a report at `t_k` of a window ending
//! at `t_k − d` is an update `u_k = t_k − d` read at `t_k`.
//!
//! # The fit
//!
//! The reference is interpolated linearly between its samples (held constant outside
//! them); window means come from its running integral in O(log n) (a binary search and
//! a quadratic within one sample interval), the low pass from an exact recursion over the
//! piecewise-linear input. For each family:
//!
//! 1. `T` is first estimated from the readings alone ([`period_from_changes`]): the
//!    instants at which the reading changes lie on a lattice of step `T` (plus the poll
//!    jitter); the lattice is fitted robustly.
//! 2. A coarse grid over the phase (`phase_steps` values in `[0, T)`) and the shape
//!    (`shape_steps` log-spaced values of `W` in `[T, 12T]` for a sliding box, in
//!    `[T/64, T]` for a partial window, or of `τ` in `[T/64, 4T]`), then Nelder–Mead on
//!    `(T, φ, ln W or ln τ)` from the three best distinct grid points (restarted once).
//!    The tiling box (`W = T`) searches `(T, φ)` only.
//! 3. For every candidate `(T, φ, shape)`, the delay is optimised *exactly*: as `d` grows
//!    a reading switches to the previous update when `d` passes its distance to the grid,
//!    so sorting those distances gives every distinct assignment of readings to updates
//!    for `d` in `[−A·T, M·T)` (`A = max_advance_periods`, `M = max_delay_periods`; a
//!    negative delay is a timeline offset, a reading stamped early); each is scored by
//!    linear least squares for `g` and `c` from running sums, O(1) per switch.
//! 4. The non-parametric family takes the update grid and delay of the best parametric
//!    family, places `response_bins` bins over `1.5 ×` that family's reach (`W`, or
//!    `3τ`, at least `T`), solves for non-negative weights by Lawson–Hanson [`nnls_gram`] (offset
//!    free) with the bins' origin tried at eight offsets over one bin (the lowest residual
//!    kept, so that the delay is not tied to the bin grid), and trims the leading bins
//!    into the delay up to the first whose weight is beyond two standard errors and a
//!    tenth of the peak bin's.
//!
//! 5. **Long captures.** With more than [`Options::search_readings`] readings (3 000 by
//!    default) steps 2 and 3 run on the busiest stretch of that many consecutive readings
//!    (the largest sum of changes between successive readings) against the part of the
//!    reference they reach; with more than [`POLISH_READINGS`] the simplex's second pass
//!    runs on the busiest that many, its period held (at the period from all of the
//!    readings' changes, or the one given): a part of seconds knows the period worse,
//!    and its error would move the phase by the distance to the middle of all the
//!    readings. Each family is then refined on every reading from that optimum:
//!    Levenberg–Marquardt on `(T, φ, ln W or ln τ)`, gain and offset with each reading's
//!    update held (its columns scaled to unit norm: the period's is the phase's times the
//!    update's index), then the delay optimised exactly again at the new point, until
//!    the residual falls by less than a hundredth of one reading's noise variance. A
//!    family whose residual on the part is over [`UNREFINED_RSS_RATIO`] times the best
//!    one's there is not refined: it cannot be chosen; one already that far behind on the
//!    search's readings is not polished either.
//!    The free response's weights are fitted on at most [`RESPONSE_UPDATES`] updates spread
//!    evenly over the readings, its residual over all of them. The cost is then the
//!    search's (fixed) plus a few passes over the readings and the reference, linear in
//!    the capture's length.
//!
//! The reference may be a lattice ([`LatticeBuilder`]): the rig's samples reduced, as
//! they are read, to exact integrals and first moments over cells of `T/64` (the finest
//! window, time constant or free-response bin searched), so that a long capture's
//! reference is held in 12 bytes a cell, not its samples.
//!
//! The delay is an interval: every `d` in `(delay_min_s, delay_s]` gives the same readings.
//! [`FamilyFit::delay_s`] is its upper end, the smallest lag at which any reading showed
//! its update (for a logger stamped at its report, that is the true delay; for a logger
//! polled faster than it updates, it overshoots the truth by at most the poll gap).
//!
//! # The criterion and the uncertainties
//!
//! Families are compared by BIC, `n_u · ln(RSS / n) + k · ln n_u`, with `RSS` the sum of
//! squared reading residuals over the `n` readings used and `n_u` the number of distinct
//! updates they show (readings that repeat an update are not independent evidence).
//! Parameter counts `k`: tiling box 5 (`T, φ, d, g, c`), sliding box, partial and
//! exponential 6 (`+ W` or `+ τ`), response `4 + m` (`T, φ, d, c` and the `m` non-zero
//! bins, whose sum is the gain). The box family is the tiling or the sliding box,
//! whichever has the lower BIC (a partial window at `W = T` is the tiling box with a
//! parameter more, so a tiling logger is called a box). The parametric family of lowest
//! BIC is [`Identification::best`] (a partial window short of the period by less than one
//! reference sample counts as the tiling box), unless the free response has a lower BIC *and* a
//! residual at least [`RESPONSE_MIN_GAIN`] below it (half). The margin is there because
//! a reference is never the GPU's own power: a rig's input filter and sensor errors are
//! differences a free shape absorbs. Against the twin's rig (a 5 µs input filter), a
//! 1 ms box logger lost to the free response by 28-121 BIC units at a residual 1-2 %
//! lower, a 0.25 ms partial window at a residual 28 % lower (its edges meet the filter
//! every 250 µs); where no parametric shape holds (the RTX 3090's square wave) the free
//! response's residual is a quarter of the best parametric one's, and a
//! wrong family leaves residuals several times the right one's.
//!
//! Uncertainties are from the curvature of the residual sum of squares (Gauss–Newton)
//! with the Jacobian `J` of the per-update prediction (central finite differences for
//! `T`, `φ`, `W`/`τ`; exact for `g`, `c`; the active bins for the response), made robust
//! to the errors one load step's readings share: each variance is the larger of the
//! cluster-robust sandwich's over the run's load-step blocks and the independent
//! readings' `s² (JᵀJ)⁻¹`, and [`FamilyFit::interval`] takes Student's t on the blocks
//! less one ([`FamilyFit::se_dof`]). The delay's standard error is that of the update
//! instant that sets it; the response's bins add their grid resolution `Δ/√12`.
//!
//! All times in s on the caller's timeline, powers in W.

use std::fmt;

use crate::par::par_map;
use crate::ParamError;

// ----------------------------------------------------------------------------------------
// Reference trace
// ----------------------------------------------------------------------------------------

/// A node of a [`Reference`]: the running integral at it, J, from the first, and in a
/// lattice the tilt of the cell it starts (half the rise of the cell's straight line, W).
/// Kept together in 12 bytes, so that an integral's cell comes from memory in one fetch:
/// on a long capture's lattice, larger than any cache, the fetches are what an integral
/// costs.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, packed(4))]
struct Node {
    e: f64,
    tilt: f32,
}

/// A dense reference power trace (the rig or an external meter), in one of two forms:
///
/// - its samples ([`Reference::new`]), linearly interpolated between them and held at the
///   first (last) sample's power before (after) them;
/// - a lattice of cells ([`LatticeBuilder`]): the exact integral and first moment of that
///   same interpolation over each cell of a uniform lattice, read in one pass over the
///   samples; within a cell the power is the straight line with that mean and that
///   moment. Integrals between the lattice's nodes are exact, and so is any integral where
///   the interpolation is straight across the cell; one that ends inside a cell holding a
///   sample where the interpolation bends (a step between two samples) is off by a
///   fraction of the cell's width times the power's spread within it. Memory is 12 bytes a
///   cell, however many samples it came from.
///
/// Times are kept relative to the first sample (node), so that epoch-scale times keep
/// their sub-microsecond digits in the differences.
#[derive(Debug, Clone)]
pub struct Reference {
    origin_s: f64,
    /// Sample times (samples); empty for a lattice.
    t: Vec<f64>,
    /// Sample powers (samples); empty for a lattice.
    p: Vec<f64>,
    /// Running integral at each sample (lattice node), and a lattice's tilt of the cell
    /// each node starts.
    nodes: Vec<Node>,
    /// The median sample interval of the samples it came from, s.
    spacing_s: f64,
    /// A lattice's cell width: node `i` at `i·cell_s`.
    cell_s: Option<f64>,
    /// A lattice's intervals between samples longer than twice the median spacing
    /// (relative s): the gaps of the samples it came from.
    gaps: Vec<(f64, f64)>,
    /// Samples: the sample index's buckets ([`SampleIndex`]); empty for a lattice.
    index: SampleIndex,
}

/// Where a relative time falls among a reference's samples in constant time: the
/// samples at or before each bucket's start. The buckets are the median spacing wide
/// (no wider than a quarter of the mean, so that a capture with long gaps keeps at most
/// four buckets a sample): evenly spaced samples put one in each, and
/// [`Reference::locate`] searches one bucket, not the whole capture (a third of an
/// identification's time went to that search).
#[derive(Debug, Clone, Default)]
struct SampleIndex {
    width_s: f64,
    /// `first[b]`: how many samples lie at or before `b·width_s`.
    first: Vec<u32>,
}

impl SampleIndex {
    fn new(t: &[f64], spacing_s: f64) -> Self {
        let span = t[t.len() - 1];
        let width_s = spacing_s.max(span / (4.0 * t.len() as f64));
        let buckets = (span / width_s).ceil() as usize + 2;
        let mut first = Vec::with_capacity(buckets);
        let mut i = 0;
        for b in 0..buckets {
            let edge = b as f64 * width_s;
            while i < t.len() && t[i] <= edge {
                i += 1;
            }
            first.push(i as u32);
        }
        SampleIndex { width_s, first }
    }

    /// How many of the samples `t` lie at or before `x`: `t.partition_point(|&ti| ti <= x)`.
    fn count(&self, t: &[f64], x: f64) -> usize {
        let last = self.first.len() - 2;
        let b = ((x / self.width_s).max(0.0) as usize).min(last);
        let (lo, hi) = (self.first[b] as usize, self.first[b + 1] as usize);
        let mut i = lo + t[lo..hi].partition_point(|&ti| ti <= x);
        // Exact whatever the rounding of `x / width_s`.
        while i > 0 && t[i - 1] > x {
            i -= 1;
        }
        while i < t.len() && t[i] <= x {
            i += 1;
        }
        i
    }
}

impl Reference {
    /// A reference from samples at strictly increasing finite `times_s` with finite
    /// `power_w`.
    ///
    /// # Errors
    ///
    /// Lengths differ, fewer than 2 samples, a non-finite value, or times not strictly
    /// increasing.
    pub fn new(times_s: &[f64], power_w: &[f64]) -> Result<Self, ParamError> {
        if times_s.len() != power_w.len() {
            return Err(ParamError::new(
                "power_w.len()",
                power_w.len() as f64,
                "must equal times_s.len()",
            ));
        }
        if times_s.len() < 2 {
            return Err(ParamError::new(
                "times_s.len()",
                times_s.len() as f64,
                "need at least 2 reference samples",
            ));
        }
        if let Some(&bad) = times_s.iter().chain(power_w).find(|v| !v.is_finite()) {
            return Err(ParamError::new("reference", bad, "must be finite"));
        }
        if let Some(w) = times_s.windows(2).find(|w| w[1] <= w[0]) {
            return Err(ParamError::new(
                "times_s",
                w[1],
                "must be strictly increasing",
            ));
        }
        let origin_s = times_s[0];
        let t: Vec<f64> = times_s.iter().map(|x| x - origin_s).collect();
        let mut nodes = Vec::with_capacity(t.len());
        let mut acc = 0.0;
        nodes.push(Node::default());
        for i in 1..t.len() {
            acc += 0.5 * (power_w[i - 1] + power_w[i]) * (t[i] - t[i - 1]);
            nodes.push(Node { e: acc, tilt: 0.0 });
        }
        let mut d: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        d.sort_by(f64::total_cmp);
        let spacing_s = d[d.len() / 2];
        Ok(Reference {
            origin_s,
            spacing_s,
            index: SampleIndex::new(&t, spacing_s),
            t,
            p: power_w.to_vec(),
            nodes,
            cell_s: None,
            gaps: Vec::new(),
        })
    }

    /// Number of samples (of a lattice: its nodes, one more than its cells).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false (a reference has at least 2 samples).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Time of the first sample (lattice node), s.
    pub fn start_s(&self) -> f64 {
        self.origin_s
    }

    /// Time of the last sample (lattice node), s.
    pub fn end_s(&self) -> f64 {
        self.origin_s + self.last_rel()
    }

    /// Median spacing of the samples, s.
    pub fn median_spacing_s(&self) -> f64 {
        self.spacing_s
    }

    /// A lattice's cell width, s (`None` for samples).
    pub fn cell_s(&self) -> Option<f64> {
        self.cell_s
    }

    /// The finest time step the reference holds: the sample spacing, or a lattice's cell
    /// if wider, s.
    pub fn resolution_s(&self) -> f64 {
        self.cell_s
            .map_or(self.spacing_s, |c| c.max(self.spacing_s))
    }

    /// The same trace on another timeline, `time' = offset_s + slope · time` (a clock
    /// link): integrals scale with the slope, powers stay.
    ///
    /// # Errors
    ///
    /// `slope` not finite and > 0, or `offset_s` not finite.
    pub fn on_timeline(mut self, slope: f64, offset_s: f64) -> Result<Self, ParamError> {
        if !(slope.is_finite() && slope > 0.0) {
            return Err(ParamError::new("slope", slope, "must be finite and > 0"));
        }
        if !offset_s.is_finite() {
            return Err(ParamError::new("offset_s", offset_s, "must be finite"));
        }
        self.origin_s = offset_s + slope * self.origin_s;
        for x in self.t.iter_mut() {
            *x *= slope;
        }
        for n in self.nodes.iter_mut() {
            n.e *= slope;
        }
        for g in &mut self.gaps {
            *g = (g.0 * slope, g.1 * slope);
        }
        self.spacing_s *= slope;
        self.cell_s = self.cell_s.map(|c| c * slope);
        Ok(self)
    }

    /// The interpolated power at `t_s`, W (of a lattice: the mean of the cell holding it).
    pub fn power_at(&self, t_s: f64) -> f64 {
        self.p_rel(t_s - self.origin_s)
    }

    /// `∫ P` over `[from_s, to_s]`, J (negative if `to_s < from_s`).
    pub fn integral(&self, from_s: f64, to_s: f64) -> f64 {
        self.e_rel(to_s - self.origin_s) - self.e_rel(from_s - self.origin_s)
    }

    /// Mean power over `[from_s, to_s]`, W; the power at `from_s` if the two are equal.
    pub fn mean(&self, from_s: f64, to_s: f64) -> f64 {
        self.mean_rel(from_s - self.origin_s, to_s - self.origin_s)
    }

    /// The first-order low pass `τ·y' = P − y` of the reference, settled at the first
    /// sample's power at the first sample.
    ///
    /// # Errors
    ///
    /// `tau_s` not finite and > 0.
    pub fn low_pass(&self, tau_s: f64) -> Result<LowPass<'_>, ParamError> {
        if !(tau_s.is_finite() && tau_s > 0.0) {
            return Err(ParamError::new("tau_s", tau_s, "must be finite and > 0"));
        }
        Ok(LowPass::new(self, tau_s))
    }

    /// The last sample's (node's) relative time.
    fn last_rel(&self) -> f64 {
        match self.cell_s {
            Some(c) => (self.nodes.len() - 1) as f64 * c,
            None => self.t[self.t.len() - 1],
        }
    }

    /// The gaps longer than `max_gap`, relative s: intervals between samples.
    fn gaps_over(&self, max_gap: f64) -> Vec<(f64, f64)> {
        match self.cell_s {
            Some(_) => (self.gaps.iter().copied())
                .filter(|g| g.1 - g.0 > max_gap)
                .collect(),
            None => (self.t.windows(2))
                .filter(|w| w[1] - w[0] > max_gap)
                .map(|w| (w[0], w[1]))
                .collect(),
        }
    }

    /// Index `i` of the sample interval (cell) `[t_i, t_{i+1})` holding `x`, clamped to
    /// `0..=n−2`.
    fn locate(&self, x: f64) -> usize {
        let n = self.nodes.len();
        match self.cell_s {
            // Truncation is the floor here (≥ 0), without a call to libm's `floor`.
            Some(c) => ((x / c).max(0.0) as usize).min(n - 2),
            None => self.index.count(&self.t, x).clamp(1, n - 1) - 1,
        }
    }

    /// A lattice's mean power in cell `i`.
    fn cell_mean(&self, i: usize, cell: f64) -> f64 {
        (self.nodes[i + 1].e - self.nodes[i].e) / cell
    }

    /// A lattice's cell `i` as the power at its start and its slope, (W, W/s).
    fn cell_line(&self, i: usize, cell: f64) -> (f64, f64) {
        let tilt = f64::from(self.nodes[i].tilt);
        (self.cell_mean(i, cell) - tilt, 2.0 * tilt / cell)
    }

    fn p_rel(&self, x: f64) -> f64 {
        if let Some(c) = self.cell_s {
            let n = self.nodes.len();
            let i = self.locate(x);
            let h = (x - i as f64 * c).clamp(0.0, c);
            let (a, b) = self.cell_line(i, c);
            return if x <= 0.0 {
                a
            } else if x >= (n - 1) as f64 * c {
                a + b * c
            } else {
                a + b * h
            };
        }
        let n = self.t.len();
        if x <= 0.0 {
            return self.p[0];
        }
        if x >= self.t[n - 1] {
            return self.p[n - 1];
        }
        let i = self.locate(x);
        let f = (x - self.t[i]) / (self.t[i + 1] - self.t[i]);
        self.p[i] + f * (self.p[i + 1] - self.p[i])
    }

    /// Running integral at relative time `x`.
    fn e_rel(&self, x: f64) -> f64 {
        if let Some(c) = self.cell_s {
            let n = self.nodes.len();
            let end = (n - 1) as f64 * c;
            return if x <= 0.0 {
                x * self.cell_line(0, c).0
            } else if x >= end {
                let (a, b) = self.cell_line(n - 2, c);
                self.nodes[n - 1].e + (x - end) * (a + b * c)
            } else {
                // `h·(a + b·h/2)` of the cell's line `(a, b)`, written without divisions:
                // with `u = h/c`, `u·ΔE − tilt·h·(1 − u)`.
                let i = self.locate(x);
                let h = x - i as f64 * c;
                let (a, b) = self.cell_line(i, c);
                self.nodes[i].e + h * (a + 0.5 * b * h)
            };
        }
        let n = self.t.len();
        if x <= 0.0 {
            return x * self.p[0];
        }
        if x >= self.t[n - 1] {
            return self.nodes[n - 1].e + (x - self.t[n - 1]) * self.p[n - 1];
        }
        let i = self.locate(x);
        let h = x - self.t[i];
        let slope = (self.p[i + 1] - self.p[i]) / (self.t[i + 1] - self.t[i]);
        self.nodes[i].e + h * (self.p[i] + 0.5 * slope * h)
    }

    fn mean_rel(&self, a: f64, b: f64) -> f64 {
        if b == a {
            return self.p_rel(a);
        }
        (self.e_rel(b) - self.e_rel(a)) / (b - a)
    }

    /// The part of the reference over relative `[from, to]` (whole samples or cells
    /// around it), for a search over part of the readings: its times are relative to its
    /// own first sample (node), which is returned with it.
    fn part(&self, from: f64, to: f64) -> (Reference, f64) {
        let n = self.nodes.len();
        let i0 = self.locate(from);
        let i1 = (self.locate(to) + 2).min(n);
        if i1 - i0 < 2 {
            return (self.clone(), 0.0);
        }
        let (t0, e0) = (self.node(i0), self.nodes[i0].e);
        let t: Vec<f64> =
            (self.t.get(i0..i1)).map_or(Vec::new(), |t| t.iter().map(|x| x - t0).collect());
        let r = Reference {
            origin_s: self.origin_s + t0,
            index: if t.is_empty() {
                SampleIndex::default()
            } else {
                SampleIndex::new(&t, self.spacing_s)
            },
            t,
            p: self.p.get(i0..i1).map_or(Vec::new(), <[f64]>::to_vec),
            nodes: (self.nodes[i0..i1].iter())
                .map(|n| Node {
                    e: n.e - e0,
                    tilt: n.tilt,
                })
                .collect(),
            spacing_s: self.spacing_s,
            cell_s: self.cell_s,
            gaps: (self.gaps.iter())
                .filter(|g| g.1 > t0 && g.0 < self.node(i1 - 1))
                .map(|g| (g.0 - t0, g.1 - t0))
                .collect(),
        };
        (r, t0)
    }

    /// Relative time of sample (node) `i`.
    fn node(&self, i: usize) -> f64 {
        self.cell_s.map_or_else(|| self.t[i], |c| i as f64 * c)
    }
}

/// Reduces a reference's samples, read in time order a few at a time (a recording's
/// batches), to a lattice [`Reference`]: the exact integral and first moment of their
/// linear interpolation over each cell of a uniform lattice of width `cell_s` from the
/// first sample, kept as the running integral at each node and the tilt of the straight
/// line with that moment (12 bytes a cell). The intervals between samples
/// longer than twice their median spacing are kept as the reference's gaps; the median is
/// that of the first 1 024 intervals. A tail shorter than a cell after the last node is
/// left out. With [`LatticeBuilder::exact_up_to`] a trace short enough to hold is kept as
/// its samples instead.
#[derive(Debug, Clone)]
pub struct LatticeBuilder {
    cell_s: f64,
    origin_s: f64,
    /// Relative time and power of the last sample.
    last: Option<(f64, f64)>,
    /// Running integral at the last sample, J.
    acc: f64,
    nodes: Vec<Node>,
    /// First moment of the open cell about its middle so far, J·s.
    mom: f64,
    /// The first intervals, for the median spacing.
    first: Vec<f64>,
    /// Intervals longer than 1.5 × the median known so far (all of the first ones).
    long: Vec<(f64, f64)>,
    /// The median of the first intervals, once there are all of them.
    median: Option<f64>,
    samples: u64,
    /// The samples themselves while there are at most `exact_up_to` of them.
    exact: Option<(Vec<f64>, Vec<f64>)>,
    exact_up_to: usize,
}

/// Intervals the median spacing of a [`LatticeBuilder`] is taken from.
const SPACING_INTERVALS: usize = 1024;

impl LatticeBuilder {
    /// A builder with cells `cell_s` wide.
    ///
    /// # Errors
    ///
    /// `cell_s` not finite and > 0.
    pub fn new(cell_s: f64) -> Result<Self, ParamError> {
        if !(cell_s.is_finite() && cell_s > 0.0) {
            return Err(ParamError::new("cell_s", cell_s, "must be finite and > 0"));
        }
        Ok(LatticeBuilder {
            cell_s,
            origin_s: f64::NAN,
            last: None,
            acc: 0.0,
            nodes: Vec::new(),
            mom: 0.0,
            first: Vec::with_capacity(SPACING_INTERVALS),
            long: Vec::new(),
            median: None,
            samples: 0,
            exact: None,
            exact_up_to: 0,
        })
    }

    /// Keeps the samples themselves while there are at most `samples` of them, and gives
    /// a reference of those samples ([`Reference::new`]) if the trace ends by then; the
    /// lattice only for a longer one.
    pub fn exact_up_to(mut self, samples: usize) -> Self {
        self.exact_up_to = samples;
        self.exact = (samples > 0).then(|| (Vec::new(), Vec::new()));
        self
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Adds the next sample.
    ///
    /// # Errors
    ///
    /// A non-finite value, or a time not after the last sample's.
    pub fn push(&mut self, t_s: f64, power_w: f64) -> Result<(), ParamError> {
        if let Some((t, p)) = &mut self.exact {
            if t.len() < self.exact_up_to {
                if !(t_s.is_finite() && power_w.is_finite()) {
                    let bad = if t_s.is_finite() { power_w } else { t_s };
                    return Err(ParamError::new("reference sample", bad, "must be finite"));
                }
                if t.last().is_some_and(|&l| t_s <= l) {
                    return Err(ParamError::new(
                        "reference sample times",
                        t_s,
                        "must be strictly increasing",
                    ));
                }
                t.push(t_s);
                p.push(power_w);
                self.samples += 1;
                return Ok(());
            }
            // One more than kept: the lattice from here on, from the first sample.
            let (t, p) = self.exact.take().unwrap_or_default();
            self.samples = 0;
            for (&t, &p) in t.iter().zip(&p) {
                self.reduce(t, p)?;
            }
        }
        self.reduce(t_s, power_w)
    }

    fn reduce(&mut self, t_s: f64, power_w: f64) -> Result<(), ParamError> {
        if !(t_s.is_finite() && power_w.is_finite()) {
            let bad = if t_s.is_finite() { power_w } else { t_s };
            return Err(ParamError::new("reference sample", bad, "must be finite"));
        }
        let Some((x0, p0)) = self.last else {
            self.origin_s = t_s;
            self.nodes.push(Node::default());
            self.last = Some((0.0, power_w));
            self.samples = 1;
            return Ok(());
        };
        let x = t_s - self.origin_s;
        let h = x - x0;
        if h <= 0.0 {
            return Err(ParamError::new(
                "reference sample times",
                t_s,
                "must be strictly increasing",
            ));
        }
        let slope = (power_w - p0) / h;
        let c = self.cell_s;
        // ∫ (t − m)·P over a straight piece [a, b] about m: (b − a)·(mean·(mid − m) +
        // rise·(b − a)/12).
        let moment = |a: f64, b: f64, m: f64| {
            let (pa, pb) = (p0 + slope * (a - x0), p0 + slope * (b - x0));
            (b - a) * (0.5 * (pa + pb) * (0.5 * (a + b) - m) + (pb - pa) * (b - a) / 12.0)
        };
        let mut from = x0;
        loop {
            let node = self.nodes.len() as f64 * c;
            if node > x {
                break;
            }
            let s = node - x0;
            // The cell just closed: its line's half rise, 6·moment / cell².
            self.mom += moment(from, node, node - 0.5 * c);
            let closed = self.nodes.len() - 1;
            self.nodes[closed].tilt = (6.0 * self.mom / (c * c)) as f32;
            self.nodes.push(Node {
                e: self.acc + s * (p0 + 0.5 * slope * s),
                tilt: 0.0,
            });
            self.mom = 0.0;
            from = node;
        }
        self.mom += moment(from, x, self.nodes.len() as f64 * c - 0.5 * c);
        self.acc += 0.5 * (p0 + power_w) * h;
        self.last = Some((x, power_w));
        self.samples += 1;
        match self.median {
            None => {
                self.first.push(h);
                self.long.push((x0, x));
                if self.first.len() == SPACING_INTERVALS {
                    self.median = Some(self.spacing());
                }
            }
            Some(m) if h > 1.5 * m => self.long.push((x0, x)),
            Some(_) => {}
        }
        Ok(())
    }

    /// The median of the first intervals.
    fn spacing(&self) -> f64 {
        let mut d = self.first.clone();
        d.sort_by(f64::total_cmp);
        d.get(d.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// The lattice reference.
    ///
    /// # Errors
    ///
    /// The samples span less than one cell.
    pub fn finish(self) -> Result<Reference, ParamError> {
        if let Some((t, p)) = &self.exact {
            return Reference::new(t, p);
        }
        if self.nodes.len() < 2 {
            return Err(ParamError::new(
                "reference samples",
                self.samples as f64,
                "span less than one cell of the lattice",
            ));
        }
        let spacing = self.spacing();
        Ok(Reference {
            origin_s: self.origin_s,
            t: Vec::new(),
            p: Vec::new(),
            gaps: (self.long.into_iter())
                .filter(|g| g.1 - g.0 > 2.0 * spacing)
                .collect(),
            nodes: self.nodes,
            spacing_s: spacing,
            cell_s: Some(self.cell_s),
            index: SampleIndex::default(),
        })
    }
}

/// The first-order low pass of a [`Reference`] (see [`Reference::low_pass`]): exact for
/// the piecewise-linear interpolated input (a lattice's piecewise-constant one).
#[derive(Debug, Clone)]
pub struct LowPass<'a> {
    reference: &'a Reference,
    tau_s: f64,
    /// State at each sample (at every [`LP_CHECK`]-th node of a lattice, and the last).
    y: Vec<f64>,
    /// A lattice's step over one cell (`None` for samples).
    step: Option<CellStep>,
}

/// A lattice's low pass keeps its state every this many nodes.
const LP_CHECK: usize = 16;

/// One exact step of `τ·y' = a + b·s − y` over `s ∈ [0, h]` from `y0`.
fn lp_step(y0: f64, a: f64, b: f64, h: f64, tau: f64) -> f64 {
    let om = -(-h / tau).exp_m1();
    y0 * (1.0 - om) + a * om + b * (h - tau * om)
}

/// [`lp_step`] over whole lattice cells, its constants for one cell width and `τ` kept:
/// over cell `i` of a lattice (its energy `ΔE` and tilt), the step
/// `y·decay + a·(1 − decay) + b·(cell − τ·(1 − decay))` of the cell's line
/// `(a, b) = (ΔE/cell − tilt, 2·tilt/cell)` is `y·decay + α·ΔE + κ·tilt`.
#[derive(Debug, Clone, Copy)]
struct CellStep {
    decay: f64,
    alpha: f64,
    kappa: f64,
}

impl CellStep {
    fn new(cell: f64, tau: f64) -> Self {
        let om = -(-cell / tau).exp_m1();
        CellStep {
            decay: 1.0 - om,
            alpha: om / cell,
            kappa: 2.0 - om - 2.0 * tau * om / cell,
        }
    }

    /// The state after lattice cell `i` of `r`, from `y0` at its start.
    fn over(&self, y0: f64, r: &Reference, i: usize) -> f64 {
        y0 * self.decay + self.input(r, i)
    }

    /// What lattice cell `i` of `r` adds to the state over it.
    fn input(&self, r: &Reference, i: usize) -> f64 {
        let (a, b) = (r.nodes[i], r.nodes[i + 1]);
        self.alpha * (b.e - a.e) + self.kappa * f64::from(a.tilt)
    }
}

impl<'a> LowPass<'a> {
    fn new(reference: &'a Reference, tau_s: f64) -> Self {
        if let Some(c) = reference.cell_s {
            let n = reference.nodes.len();
            let step = CellStep::new(c, tau_s);
            // A whole block of cells at once: the state after it is the state before
            // times `decay^LP_CHECK` plus each cell's input decayed over the cells after
            // it, sums that do not wait on each other as one cell's step waits on the last.
            let mut weights = [1.0; LP_CHECK];
            for m in (0..LP_CHECK - 1).rev() {
                weights[m] = weights[m + 1] * step.decay;
            }
            let decay_block = weights[0] * step.decay;
            let mut y = Vec::with_capacity(n / LP_CHECK + 2);
            let mut state = reference.cell_line(0, c).0;
            let cells = n - 1;
            let mut i = 0;
            while i < cells {
                y.push(state);
                let end = (i + LP_CHECK).min(cells);
                if end - i == LP_CHECK {
                    let input: f64 = (weights.iter().enumerate())
                        .map(|(m, w)| w * step.input(reference, i + m))
                        .sum();
                    state = state * decay_block + input;
                } else {
                    for j in i..end {
                        state = step.over(state, reference, j);
                    }
                }
                i = end;
            }
            y.push(state);
            return LowPass {
                reference,
                tau_s,
                y,
                step: Some(step),
            };
        }
        let (t, p) = (&reference.t, &reference.p);
        let mut y = Vec::with_capacity(t.len());
        let mut state = p[0];
        y.push(state);
        // [`lp_step`] with its `1 − e^(−h/τ)` carried from the last interval `h0` where
        // `h` differs from it by a millionth or less (evenly spaced samples, their times'
        // rounding): `om0 + (1 − om0)·(h − h0)/τ`, exact but for `(1 − om0)·((h − h0)/τ)²/2`,
        // under 1e-12 of `om`; half the low pass's time went to `exp_m1`.
        let (mut h0, mut om0) = (f64::NAN, 0.0);
        for i in 1..t.len() {
            let h = t[i] - t[i - 1];
            let dh = h - h0;
            let om = if dh.abs() <= 1e-6 * h0 {
                om0 + (1.0 - om0) * dh / tau_s
            } else {
                (h0, om0) = (h, -(-h / tau_s).exp_m1());
                om0
            };
            let (a, b) = (p[i - 1], (p[i] - p[i - 1]) / h);
            state = state * (1.0 - om) + a * om + b * (h - tau_s * om);
            y.push(state);
        }
        LowPass {
            reference,
            tau_s,
            y,
            step: None,
        }
    }

    /// Time constant, s.
    pub fn tau_s(&self) -> f64 {
        self.tau_s
    }

    /// The low pass's output at `t_s`, W.
    pub fn at(&self, t_s: f64) -> f64 {
        self.at_rel(t_s - self.reference.origin_s)
    }

    fn at_rel(&self, x: f64) -> f64 {
        let r = self.reference;
        if let (Some(c), Some(step)) = (r.cell_s, self.step) {
            let n = r.nodes.len();
            if x <= 0.0 {
                return r.cell_line(0, c).0;
            }
            let end = (n - 1) as f64 * c;
            if x >= end {
                let last = self.y[self.y.len() - 1];
                let (a, b) = r.cell_line(n - 2, c);
                return lp_step(last, a + b * c, 0.0, x - end, self.tau_s);
            }
            let i = r.locate(x);
            let from = i / LP_CHECK * LP_CHECK;
            let mut state = self.y[i / LP_CHECK];
            for j in from..i {
                state = step.over(state, r, j);
            }
            let (a, b) = r.cell_line(i, c);
            return lp_step(state, a, b, x - i as f64 * c, self.tau_s);
        }
        let n = r.t.len();
        if x <= 0.0 {
            return r.p[0];
        }
        if x >= r.t[n - 1] {
            return lp_step(self.y[n - 1], r.p[n - 1], 0.0, x - r.t[n - 1], self.tau_s);
        }
        let i = r.locate(x);
        let slope = (r.p[i + 1] - r.p[i]) / (r.t[i + 1] - r.t[i]);
        lp_step(self.y[i], r.p[i], slope, x - r.t[i], self.tau_s)
    }
}

// ----------------------------------------------------------------------------------------
// Non-negative least squares
// ----------------------------------------------------------------------------------------

/// Solves the `n × n` symmetric positive-definite system `a·x = b` in place (Cholesky;
/// `a` row-major, overwritten); false if `a` is not numerically positive definite.
fn cholesky_solve(a: &mut [f64], n: usize, b: &mut [f64]) -> bool {
    let scale = (0..n).map(|i| a[i * n + i].abs()).fold(0.0, f64::max);
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d.is_nan() || d <= 1e-13 * scale || !d.is_finite() {
            return false;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
    }
    for i in 0..n {
        let mut s = b[i];
        for k in 0..i {
            s -= a[i * n + k] * b[k];
        }
        b[i] = s / a[i * n + i];
    }
    for i in (0..n).rev() {
        let mut s = b[i];
        for k in i + 1..n {
            s -= a[k * n + i] * b[k];
        }
        b[i] = s / a[i * n + i];
    }
    true
}

/// The inverse of an `n × n` symmetric positive-definite matrix (row-major), or None.
fn spd_inverse(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut inv = vec![0.0; n * n];
    for j in 0..n {
        let mut m = a.to_vec();
        let mut col = vec![0.0; n];
        col[j] = 1.0;
        if !cholesky_solve(&mut m, n, &mut col) {
            return None;
        }
        for i in 0..n {
            inv[i * n + j] = col[i];
        }
    }
    Some(inv)
}

/// Non-negative least squares in normal-equation form: minimises `½ xᵀ G x − bᵀ x`
/// subject to `x ≥ 0`, for a symmetric positive-semidefinite `n × n` Gram matrix `G =
/// AᵀA` (row-major) and `b = Aᵀy`; that is, `min |A x − y|²` with `x ≥ 0`.
///
/// Lawson and Hanson's active-set algorithm (1974, ch. 23): add the variable with the
/// largest positive gradient `b − G x` to the passive set, solve the unconstrained
/// problem on that set (Cholesky), step back to the boundary while any passive variable
/// would go negative, repeat until no gradient is positive (the KKT conditions). A
/// passive set whose Gram block is not positive definite drops its newest variable.
///
/// # Panics
///
/// If `gram.len() != n·n` or `rhs.len() != n`.
pub fn nnls_gram(gram: &[f64], rhs: &[f64], n: usize) -> Vec<f64> {
    assert_eq!(gram.len(), n * n, "gram must be n × n");
    assert_eq!(rhs.len(), n, "rhs must have n entries");
    let mut x = vec![0.0; n];
    let mut passive = vec![false; n];
    let scale = rhs.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
    if scale == 0.0 {
        return x;
    }
    let tol = 1e-11 * scale;
    let grad = |x: &[f64], j: usize| rhs[j] - (0..n).map(|k| gram[j * n + k] * x[k]).sum::<f64>();
    let solve_on = |set: &[usize]| -> Option<Vec<f64>> {
        let m = set.len();
        let mut a = vec![0.0; m * m];
        let mut b = vec![0.0; m];
        for (r, &i) in set.iter().enumerate() {
            b[r] = rhs[i];
            for (c, &j) in set.iter().enumerate() {
                a[r * m + c] = gram[i * n + j];
            }
        }
        cholesky_solve(&mut a, m, &mut b).then_some(b)
    };
    let mut excluded = vec![false; n];
    for _ in 0..3 * n + 10 {
        // The most promising variable outside the passive set.
        let Some(j) = (0..n)
            .filter(|&j| !passive[j] && !excluded[j])
            .map(|j| (j, grad(&x, j)))
            .filter(|&(_, g)| g > tol)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(j, _)| j)
        else {
            break;
        };
        passive[j] = true;
        loop {
            let set: Vec<usize> = (0..n).filter(|&i| passive[i]).collect();
            let Some(z) = solve_on(&set) else {
                // Dependent on the others: leave it out for good.
                passive[j] = false;
                excluded[j] = true;
                break;
            };
            if z.iter().all(|&v| v > 0.0) {
                for (&i, &v) in set.iter().zip(&z) {
                    x[i] = v;
                }
                break;
            }
            // Step from x towards z until the first passive variable reaches zero.
            let mut alpha = 1.0_f64;
            for (&i, &v) in set.iter().zip(&z) {
                if v <= 0.0 {
                    let a = x[i] / (x[i] - v);
                    if a < alpha {
                        alpha = a;
                    }
                }
            }
            for (&i, &v) in set.iter().zip(&z) {
                x[i] += alpha * (v - x[i]);
                if x[i] <= 1e-15 * scale.max(1.0) || (v <= 0.0 && x[i] <= 0.0) {
                    x[i] = 0.0;
                    passive[i] = false;
                }
            }
            if !passive.iter().any(|&p| p) {
                break;
            }
        }
        // A newly allowed variable may have been excluded only under another set.
        if excluded.iter().any(|&e| e) && passive.iter().filter(|&&p| p).count() == 0 {
            excluded.iter_mut().for_each(|e| *e = false);
        }
    }
    x
}

// ----------------------------------------------------------------------------------------
// Results
// ----------------------------------------------------------------------------------------

/// A logger response family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Box average whose width equals the update period (windows tile time).
    Box,
    /// Box average of width `W ≤ T` every period `T`.
    Partial,
    /// First-order low pass sampled at the updates.
    Exponential,
    /// Non-negative staircase response on a grid.
    Response,
}

impl Family {
    /// Every family, in the order [`Identification::fits`] holds them.
    pub const ALL: [Family; 4] = [
        Family::Box,
        Family::Partial,
        Family::Exponential,
        Family::Response,
    ];

    /// The family's name, as in the twin's scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Family::Box => "box",
            Family::Partial => "partial",
            Family::Exponential => "exponential",
            Family::Response => "response",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fitted value with its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The value.
    pub value: f64,
    /// Its standard error (same unit).
    pub se: f64,
}

impl Estimate {
    fn new(value: f64, se: f64) -> Self {
        Estimate { value, se }
    }
}

/// The family's shape parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Box window of width `W ≥ T`: `W = T` (windows tile time; then `window_s` is
    /// the period, and counts as no parameter) or wider (a sliding average).
    Box {
        /// Window width `W`, s.
        window_s: Estimate,
    },
    /// Window of its own.
    Partial {
        /// Window width `W`, s.
        window_s: Estimate,
    },
    /// Low pass.
    Exponential {
        /// Time constant `τ`, s.
        tau_s: Estimate,
    },
    /// Staircase response: `h_per_s[i]` acts on `[u − (i+1)·spacing_s, u − i·spacing_s]`
    /// before the update instant `u`, with `Σ h_per_s · spacing_s = 1`.
    Response {
        /// Bin width `Δ`, s.
        spacing_s: f64,
        /// Normalised response per bin, 1/s (non-negative; leading zero bins are folded
        /// into the delay, trailing ones dropped).
        h_per_s: Vec<f64>,
        /// Standard error of each bin, 1/s.
        h_se_per_s: Vec<f64>,
    },
}

/// One family's fit (see the [module documentation](self) for the model).
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyFit {
    /// Shape parameters (and so the family).
    pub shape: Shape,
    /// Update period `T`, s.
    pub period_s: Estimate,
    /// An update instant `u_k` (the end of the response's reach) near the middle of the
    /// readings used, on the caller's timeline, s.
    pub phase_s: Estimate,
    /// Delay `d` from an update instant to the first reading that may show it: the
    /// largest delay consistent with the readings, s.
    pub delay_s: Estimate,
    /// The readings are equally consistent with any delay in `(delay_min_s, delay_s]`.
    pub delay_min_s: f64,
    /// Mean lag of the response behind the reading's visibility instant, s: `d + W/2`,
    /// `d + τ`, or `d +` the response's centroid.
    pub centroid_s: f64,
    /// Gain `g` (for the response family, the area of the response before
    /// normalisation).
    pub gain: Estimate,
    /// Offset `c`, W.
    pub offset_w: Estimate,
    /// Sum of squared reading residuals, W².
    pub rss_w2: f64,
    /// RMS of the reading residuals, W.
    pub rms_w: f64,
    /// Readings used.
    pub readings: usize,
    /// Distinct updates the readings show (`n_u` of the criterion).
    pub updates: usize,
    /// Parameter count `k` of the criterion.
    pub params: usize,
    /// `n_u · ln(RSS / n) + k · ln n_u`.
    pub bic: f64,
    /// The largest factor by which the load steps' shared errors widened a standard error
    /// beyond the independent readings' (≥ 1).
    pub se_inflation: f64,
    /// The degrees of freedom the standard errors rest on: the run's load-step blocks
    /// less one (see [`FamilyFit::interval`]).
    pub se_dof: f64,
    /// True if the delay or the shape lies at an end of its search range (the delay's
    /// bracket reaches `−max_advance_periods·T` and the delay is within half a period of
    /// it, or the delay reaches `max_delay_periods·T`; a window at
    /// `T/64` or `12·T`, a time constant at `T/64` or `4·T`): the data do not pin the fit
    /// down within the range searched (usually a family that does not describe the logger).
    pub at_search_edge: bool,
}

impl FamilyFit {
    /// The family.
    pub fn family(&self) -> Family {
        match self.shape {
            Shape::Box { .. } => Family::Box,
            Shape::Partial { .. } => Family::Partial,
            Shape::Exponential { .. } => Family::Exponential,
            Shape::Response { .. } => Family::Response,
        }
    }

    /// The window width of a box (the period) or partial fit.
    pub fn window_s(&self) -> Option<Estimate> {
        match &self.shape {
            Shape::Box { window_s } | Shape::Partial { window_s } => Some(*window_s),
            _ => None,
        }
    }

    /// The time constant of an exponential fit.
    pub fn tau_s(&self) -> Option<Estimate> {
        match &self.shape {
            Shape::Exponential { tau_s } => Some(*tau_s),
            _ => None,
        }
    }

    /// The interval that holds the parameter `e` of this fit at `confidence`:
    /// `value ± t·se`, Student's t on the fit's [`se_dof`](Self::se_dof) (infinite where
    /// its standard error is not known).
    pub fn interval(&self, e: Estimate, confidence: f64) -> (f64, f64) {
        let half = crate::stats::two_sided_t(confidence, self.se_dof) * e.se;
        if half.is_finite() {
            (e.value - half, e.value + half)
        } else {
            (f64::NEG_INFINITY, f64::INFINITY)
        }
    }

    /// The delay's interval at `confidence`: the readings are equally consistent with
    /// any delay in `(delay_min_s, delay_s]`, and that bracket's ends are known to the
    /// delay's standard error.
    pub fn delay_interval(&self, confidence: f64) -> (f64, f64) {
        let (lo, hi) = self.interval(self.delay_s, confidence);
        (lo - (self.delay_s.value - self.delay_min_s), hi)
    }

    /// Why this fit does not identify the logger, if it does not: a parameter the
    /// readings leave undetermined (its standard error a large fraction of its value, or
    /// none computable), at an end of the range searched, or outside what a power sensor
    /// can be. `mean_reading_w` is the mean of the readings fitted. Empty for a fit whose
    /// parameters mean what they say.
    ///
    /// The physical bounds: a GPU's power sensor reads its shunts to within a few percent
    /// of scale and a few watts of zero (the published studies find gains of 0.9-1.1 and
    /// offsets of a few W), so a gain outside [`GAIN_RANGE`] or an offset beyond a fifth
    /// of the mean reading is a shape that does not describe the logger, compensated by
    /// scale. A standard error above a quarter of the gain, half of a window or time
    /// constant, or a whole update period of the delay leaves the parameter undetermined.
    pub fn doubts(&self, mean_reading_w: f64) -> Vec<String> {
        let mut out = Vec::new();
        let g = self.gain;
        let ses = [self.period_s.se, self.delay_s.se, g.se, self.offset_w.se];
        if ses.iter().any(|s| !s.is_finite()) {
            out.push(
                "its standard errors could not be computed (the fit's curvature is singular)"
                    .into(),
            );
        }
        if !(GAIN_RANGE.0..=GAIN_RANGE.1).contains(&g.value) {
            out.push(format!(
                "gain {:.3} is outside {}-{}, where a power sensor's scale lies",
                g.value, GAIN_RANGE.0, GAIN_RANGE.1
            ));
        } else if g.se > 0.25 * g.value.abs() {
            out.push(format!(
                "gain {:.3} ± {:.3} is not determined by the readings",
                g.value, g.se
            ));
        }
        if mean_reading_w.is_finite() && self.offset_w.value.abs() > 0.2 * mean_reading_w.abs() {
            out.push(format!(
                "offset {:.1} W is more than a fifth of the mean reading ({:.1} W)",
                self.offset_w.value, mean_reading_w
            ));
        }
        let shape = match &self.shape {
            Shape::Box { window_s } if window_s.value != self.period_s.value => {
                Some(("window", *window_s))
            }
            Shape::Partial { window_s } => Some(("window", *window_s)),
            Shape::Exponential { tau_s } => Some(("time constant", *tau_s)),
            _ => None,
        };
        if let Some((name, e)) = shape {
            if e.se.is_nan() || e.se > 0.5 * e.value {
                out.push(format!(
                    "{name} {:.3} ± {:.3} ms is not determined by the readings",
                    e.value * 1e3,
                    e.se * 1e3
                ));
            }
        }
        if self.delay_s.se > self.period_s.value {
            out.push(format!(
                "delay {:.3} ± {:.3} ms is not determined to within an update period",
                self.delay_s.value * 1e3,
                self.delay_s.se * 1e3
            ));
        }
        if self.at_search_edge {
            out.push("its delay or shape lies at an end of the range searched".into());
        }
        out
    }

    /// The update instant shown by a reading at `t_s`: the latest `phase_s + k·period_s
    /// ≤ t_s − delay_s`.
    pub fn update_for(&self, t_s: f64) -> f64 {
        let (t, p) = (self.period_s.value, self.phase_s.value);
        p + update_index(t_s, t, p, self.delay_s.value) * t
    }

    /// The model's response `r(u)` (before gain and offset) at update instant `u_s`.
    pub fn response_at(&self, reference: &Reference, u_s: f64) -> f64 {
        let u = u_s - reference.origin_s;
        match &self.shape {
            Shape::Box { window_s } | Shape::Partial { window_s } => {
                reference.mean_rel(u - window_s.value, u)
            }
            Shape::Exponential { tau_s } => LowPass::new(reference, tau_s.value).at_rel(u),
            Shape::Response {
                spacing_s, h_per_s, ..
            } => h_per_s
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let hi = u - i as f64 * spacing_s;
                    h * (reference.e_rel(hi) - reference.e_rel(hi - spacing_s))
                })
                .sum(),
        }
    }

    /// What the model reads at each of `times_s`: `gain · r(update_for(t)) + offset`.
    pub fn predict(&self, reference: &Reference, times_s: &[f64]) -> Vec<f64> {
        let lp = match &self.shape {
            Shape::Exponential { tau_s } => Some(LowPass::new(reference, tau_s.value)),
            _ => None,
        };
        times_s
            .iter()
            .map(|&t| {
                let u = self.update_for(t);
                let r = match &lp {
                    Some(lp) => lp.at(u),
                    None => self.response_at(reference, u),
                };
                self.gain.value * r + self.offset_w.value
            })
            .collect()
    }
}

/// The gains [`FamilyFit::doubts`] accepts as a power sensor's.
pub const GAIN_RANGE: (f64, f64) = (0.7, 1.3);

/// The identification: every family's fit and the one the criterion picks.
#[derive(Debug, Clone, PartialEq)]
pub struct Identification {
    /// Box, partial, exponential, response, in that order.
    pub fits: Vec<FamilyFit>,
    /// Index into `fits` of the lowest BIC.
    pub best: usize,
    /// The period estimated from the readings' change instants (or given), s, with its
    /// standard error.
    pub period_guess_s: Estimate,
    /// Readings used (those whose reach lies within the reference).
    pub readings_used: usize,
    /// Readings given.
    pub readings_given: usize,
}

impl Identification {
    /// The fit the criterion picks.
    pub fn best(&self) -> &FamilyFit {
        &self.fits[self.best]
    }

    /// A family's fit.
    pub fn fit(&self, family: Family) -> Option<&FamilyFit> {
        self.fits.iter().find(|f| f.family() == family)
    }
}

/// Search settings for [`identify`].
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The update period if known, s; by default estimated from the readings
    /// ([`period_from_changes`]) and refined either way.
    pub period_s: Option<f64>,
    /// Delays are searched in `[−max_advance_periods · T, max_delay_periods · T)`.
    /// Default 2.
    pub max_delay_periods: usize,
    /// A negative delay (an advance) is allowed down to `−max_advance_periods · T`, for
    /// timelines whose offset is not known to better than that (a reading can't show
    /// power that comes after it, but its time stamp may be early). Default 1.
    pub max_advance_periods: usize,
    /// Phase grid points over one period. Default 96.
    pub phase_steps: usize,
    /// Window or time-constant grid points. Default 20.
    pub shape_steps: usize,
    /// Bins of the non-parametric response. Default 96.
    pub response_bins: usize,
    /// Readings whose reach touches a gap in the reference longer than this are left
    /// out, s; default 20 × the reference's median spacing.
    pub max_gap_s: Option<f64>,
    /// With more readings than this, the search runs on this many of them and each
    /// family is refined on all (see the module documentation). Default
    /// [`SEARCH_READINGS`].
    pub search_readings: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            period_s: None,
            max_delay_periods: 2,
            max_advance_periods: 1,
            phase_steps: 96,
            shape_steps: 20,
            response_bins: 96,
            max_gap_s: None,
            search_readings: SEARCH_READINGS,
        }
    }
}

/// Why a logger could not be identified.
#[derive(Debug, Clone, PartialEq)]
pub enum IdentifyError {
    /// A parameter or an input is out of range.
    Param(ParamError),
    /// The readings change too rarely to estimate the period (give
    /// [`Options::period_s`]).
    NoPeriod {
        /// Changes seen.
        changes: usize,
    },
    /// Too few readings lie within the reference.
    TooFewReadings {
        /// Readings usable.
        used: usize,
        /// At least this many are needed.
        needed: usize,
    },
}

impl fmt::Display for IdentifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentifyError::Param(e) => e.fmt(f),
            IdentifyError::NoPeriod { changes } => write!(
                f,
                "the readings change only {changes} times: too few to estimate the update period (give it)"
            ),
            IdentifyError::TooFewReadings { used, needed } => write!(
                f,
                "{used} readings lie within the reference; at least {needed} are needed"
            ),
        }
    }
}

impl std::error::Error for IdentifyError {}

impl From<ParamError> for IdentifyError {
    fn from(e: ParamError) -> Self {
        IdentifyError::Param(e)
    }
}

// ----------------------------------------------------------------------------------------
// Period from the readings alone
// ----------------------------------------------------------------------------------------

/// The update period from the instants at which the readings change: `(T, se)`.
///
/// A logger polled faster than it updates repeats its value between updates, so its
/// changes fall on a lattice `c_m ≈ c_0 + n_m·T` plus the poll's wait; one read at its
/// own rate changes (when the value differs) at every reading. From each start (the
/// 10th, 25th and 50th percentiles of the intervals between changes) a line `c ≈ a + n·T`
/// is fitted robustly to the changes that lie within `T/4` of its lattice, over a span
/// that doubles from eight periods to all of them (a stalled poll or a value that
/// flickered between updates lies off the lattice). Of the starts, the longest `T` whose
/// lattice holds at least 90 % as many changes as the best one's wins (a divisor of the
/// period holds as many). None with fewer than 4 changes. `times_s` must be sorted.
pub fn period_from_changes(times_s: &[f64], power_w: &[f64]) -> Option<(f64, f64)> {
    let c: Vec<f64> = (1..times_s.len().min(power_w.len()))
        .filter(|&j| power_w[j] != power_w[j - 1])
        .map(|j| times_s[j])
        .collect();
    if c.len() < 4 {
        return None;
    }
    let mut d: Vec<f64> = c
        .windows(2)
        .map(|w| w[1] - w[0])
        .filter(|&d| d > 0.0)
        .collect();
    if d.len() < 3 {
        return None;
    }
    d.sort_by(f64::total_cmp);
    let fits: Vec<(f64, f64, f64)> = [0.1, 0.25, 0.5]
        .iter()
        .filter_map(|q| lattice(&c, d[((d.len() - 1) as f64 * q) as usize]))
        .collect();
    let most = fits.iter().map(|f| f.2).fold(0.0, f64::max);
    fits.iter()
        .filter(|f| f.2 >= 0.9 * most)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|f| (f.0, f.1))
}

/// The lattice fit of change instants `c` from a start period: `(T, se, fraction of
/// changes on the lattice)`.
///
/// The line `c ≈ a + n·T` is first fitted over about eight periods, then over a span that
/// doubles each time: every change in the span gets the nearest lattice step of the
/// current line, and the first change within `T/4` of each step is kept; the robust line
/// of those ([`crate::align::fit_pairs`]: Tukey's bisquare rejects late polls) is the next
/// line. Extending from the line rather than from change to change keeps a late poll or
/// a flicker from shifting the count.
/// Changes the lattice's line is fitted through on its way to the full span, at most.
const LATTICE_POINTS: usize = 2048;

fn lattice(c: &[f64], start: f64) -> Option<(f64, f64, f64)> {
    if !(start.is_finite() && start > 0.0) {
        return None;
    }
    let (c0, last) = (c[0], c[c.len() - 1]);
    let (mut a, mut b) = (c0, start);
    let mut span = 8.0 * start;
    loop {
        let full = span >= last - c0;
        let mut on: Vec<(f64, f64)> = Vec::new();
        for &cm in c.iter().take_while(|&&cm| cm - c0 <= span) {
            let n = ((cm - a) / b).round();
            let first_at_n = on.last().is_none_or(|p| p.0 < n);
            if first_at_n && (cm - a - n * b).abs() <= 0.25 * b {
                on.push((n, cm));
            }
        }
        if on.len() < 3 {
            if full {
                return None;
            }
            span *= 2.0;
            continue;
        }
        // On the way to the full span the line only has to hold the next span's steps:
        // a robust line through at most LATTICE_POINTS of the changes, evenly spread,
        // does that; the full span's is through at most 8 times as many (the period's
        // error from evenly spread changes falls as 1/√n, its cost grows as n).
        let most = if full {
            8 * LATTICE_POINTS
        } else {
            LATTICE_POINTS
        };
        let stride = on.len().div_ceil(most);
        let thinned: Vec<(f64, f64)>;
        let fitted = if stride > 1 {
            thinned = on.iter().copied().step_by(stride).collect();
            &thinned
        } else {
            &on
        };
        let fit = crate::align::fit_pairs(fitted).ok()?;
        b = fit.map.slope;
        a = fit.map.apply(0.0);
        if !(b.is_finite() && b > 0.0) {
            return None;
        }
        if full {
            let inliers: Vec<f64> = (0..fitted.len())
                .filter(|i| fit.outliers.binary_search(i).is_err())
                .map(|i| fitted[i].0)
                .collect();
            let len = inliers.len() as f64;
            let mn = inliers.iter().sum::<f64>() / len;
            let snn: f64 = inliers.iter().map(|n| (n - mn) * (n - mn)).sum();
            if snn <= 0.0 {
                return None;
            }
            let se = fit.rms_s * (len / (len - 2.0).max(1.0)).sqrt() / snn.sqrt();
            // The share of the changes on the lattice, the thinning undone.
            let share = len / fitted.len() as f64 * on.len() as f64 / c.len() as f64;
            return Some((b, se, share));
        }
        span *= 2.0;
    }
}

// ----------------------------------------------------------------------------------------
// The search engine
// ----------------------------------------------------------------------------------------

/// A response evaluated at update instants (relative time).
enum Feat<'r> {
    Window(f64),
    Exp(LowPass<'r>),
}

impl Feat<'_> {
    fn at(&self, r: &Reference, u: f64) -> f64 {
        match self {
            Feat::Window(w) => r.mean_rel(u - w, u),
            Feat::Exp(lp) => lp.at_rel(u),
        }
    }
}

/// The best assignment for one `(T, φ, shape)`.
#[derive(Debug, Clone, Copy)]
struct Eval {
    rss: f64,
    gain: f64,
    offset: f64,
    /// Whole periods of delay (negative: of advance).
    m: i64,
    /// Readings (in order of their distance to the grid) switched to the previous update.
    state: usize,
    d_hi: f64,
    d_lo: f64,
}

impl Eval {
    fn worst() -> Self {
        Eval {
            rss: f64::INFINITY,
            gain: f64::NAN,
            offset: f64::NAN,
            m: 0,
            state: 0,
            d_hi: f64::NAN,
            d_lo: f64::NAN,
        }
    }
}

struct Engine<'r> {
    reference: &'r Reference,
    /// Reading times relative to the reference's origin.
    s: Vec<f64>,
    /// Readings minus their mean.
    y: Vec<f64>,
    ybar: f64,
    syy: f64,
    /// The lattice origin (middle of the readings), relative.
    t_mid: f64,
    /// Whole periods of delay searched: `m_lo..m_hi` (negative: an advance).
    m_lo: i64,
    m_hi: i64,
}

/// Readings whose distances to the update grid differ by less than this many periods are
/// taken to switch updates together.
const TIE: f64 = 1e-6;

/// The index `k` of the update a reading at `t_s` shows: the latest `phase_s +
/// k·period_s ≤ t_s − delay_s`. A reading at the switch point shows the later update
/// (half the tie tolerance absorbs the rounding of `t_s − delay_s`).
pub fn update_index(t_s: f64, period_s: f64, phase_s: f64, delay_s: f64) -> f64 {
    ((t_s - delay_s - phase_s) / period_s + 0.5 * TIE).floor()
}

/// Per reading: the update index at zero delay and the distance to it.
fn grid_positions(s: &[f64], t_mid: f64, period: f64, phase: f64) -> (Vec<i64>, Vec<f64>) {
    s.iter()
        .map(|&s| {
            let x = (s - t_mid - phase) / period;
            let k = x.floor();
            (k as i64, ((x - k) * period).max(0.0))
        })
        .unzip()
}

/// Reading indices by increasing distance `r ≥ 0` (ties by index, for determinism).
/// Sorted as (bits, index) pairs side by side: a non-negative float's bits order as its
/// value, and the pairs sort without reaching back into `r` (a fifth of an
/// identification's time went to this sort through an index).
fn distance_order(r: &[f64]) -> Vec<usize> {
    let mut keyed: Vec<(u64, u32)> = (r.iter().enumerate())
        .map(|(i, &v)| ((v + 0.0).to_bits(), i as u32))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i as usize).collect()
}

impl<'r> Engine<'r> {
    fn new(reference: &'r Reference, s: Vec<f64>, w: &[f64], advance: usize, delay: usize) -> Self {
        let n = w.len() as f64;
        let ybar = w.iter().sum::<f64>() / n;
        let y: Vec<f64> = w.iter().map(|v| v - ybar).collect();
        let syy = y.iter().map(|v| v * v).sum();
        let t_mid = 0.5 * (s[0] + s[s.len() - 1]);
        Engine {
            reference,
            s,
            y,
            ybar,
            syy,
            t_mid,
            m_lo: -(advance as i64),
            m_hi: (delay as i64).max(1),
        }
    }

    /// Readings closer than this to each other's switch point switch together: no
    /// delay separates them. Exactly periodic readings differ by the rounding of `T`, and
    /// readings stamped on a GPU counter by its tick (10 ns at 100 MHz); a tenth of the
    /// reference's sample spacing is far below the delay the reference can resolve.
    /// Without it, a reading or two set apart by their stamps' rounding made an
    /// assignment one period off for the rest that won by the noise of those readings.
    fn tie(&self, period: f64) -> f64 {
        (TIE * period).max(0.1 * self.reference.median_spacing_s())
    }

    /// The best delay (exactly, over all assignments) with least-squares gain and offset.
    fn evaluate(&self, period: f64, phase: f64, feat: &Feat<'_>) -> Eval {
        let n = self.s.len();
        if !(period.is_finite() && period > 0.0 && phase.is_finite()) || n < 3 {
            return Eval::worst();
        }
        let (kk, rr) = grid_positions(&self.s, self.t_mid, period, phase);
        let kmax = kk.iter().copied().max().unwrap_or(0) - self.m_lo;
        let base = kk.iter().copied().min().unwrap_or(0) - self.m_hi - 1;
        let mut cache = vec![f64::NAN; (kmax - base + 1) as usize];
        let (reference, t_mid, ybar) = (self.reference, self.t_mid, self.ybar);
        let mut f = |k: i64| -> f64 {
            let slot = &mut cache[(k - base) as usize];
            if slot.is_nan() {
                *slot = feat.at(reference, t_mid + phase + k as f64 * period) - ybar;
            }
            *slot
        };
        let order = distance_order(&rr);
        let tie = self.tie(period);
        let nf = n as f64;
        let mut best = Eval::worst();
        for m in self.m_lo..self.m_hi {
            let mi = m;
            let (mut sf, mut sff, mut sfy) = (0.0, 0.0, 0.0);
            for (j, &k) in kk.iter().enumerate() {
                let v = f(k - mi);
                sf += v;
                sff += v * v;
                sfy += v * self.y[j];
            }
            for state in 0..n {
                if state > 0 {
                    let j = order[state - 1];
                    let (old, new) = (f(kk[j] - mi), f(kk[j] - mi - 1));
                    sf += new - old;
                    sff += new * new - old * old;
                    sfy += (new - old) * self.y[j];
                    if rr[order[state]] - rr[j] <= tie {
                        continue; // no delay separates these two readings
                    }
                }
                let cff = sff - sf * sf / nf;
                let (gain, rss) = if cff > 1e-12 * sff.max(1e-300) {
                    let g = sfy / cff;
                    (g, (self.syy - sfy * g).max(0.0))
                } else {
                    (0.0, self.syy)
                };
                if rss < best.rss {
                    let d_hi = m as f64 * period + rr[order[state]];
                    let d_lo = if state > 0 {
                        m as f64 * period + rr[order[state - 1]]
                    } else if m > self.m_lo {
                        (m - 1) as f64 * period + rr[order[n - 1]]
                    } else {
                        m as f64 * period
                    };
                    best = Eval {
                        rss,
                        gain,
                        // y − ȳ = g·(f − ȳ − mean(f − ȳ)): y = g·f + ȳ − g·(ȳ + mean).
                        offset: ybar - gain * (ybar + sf / nf),
                        m,
                        state,
                        d_hi,
                        d_lo,
                    };
                }
            }
        }
        best
    }

    /// [`Engine::evaluate`] at a family's parameter vector `x`.
    fn evaluate_at(&self, kind: Kind, x: &[f64]) -> Eval {
        let (t, phi, shape) = unpack(kind, x);
        self.evaluate(t, phi, &feat_for(self.reference, kind, shape))
    }

    /// The update index each reading shows under an evaluation's assignment.
    fn assignment(&self, period: f64, phase: f64, ev: &Eval) -> Vec<i64> {
        let (mut kk, rr) = grid_positions(&self.s, self.t_mid, period, phase);
        let order = distance_order(&rr);
        for k in kk.iter_mut() {
            *k -= ev.m;
        }
        for &j in &order[..ev.state] {
            kk[j] -= 1;
        }
        kk
    }
}

/// Nelder–Mead minimisation from `x0` with initial steps `step`; `(x, f(x))`.
fn nelder_mead(
    f: &mut dyn FnMut(&[f64]) -> f64,
    x0: &[f64],
    step: &[f64],
    max_evals: usize,
) -> (Vec<f64>, f64) {
    let dim = x0.len();
    let mut pts: Vec<Vec<f64>> = vec![x0.to_vec()];
    for i in 0..dim {
        let mut p = x0.to_vec();
        p[i] += step[i];
        pts.push(p);
    }
    let mut vals: Vec<f64> = pts.iter().map(|p| f(p)).collect();
    let mut evals = dim + 1;
    while evals < max_evals {
        let mut idx: Vec<usize> = (0..=dim).collect();
        idx.sort_by(|&a, &b| vals[a].total_cmp(&vals[b]));
        pts = idx.iter().map(|&i| pts[i].clone()).collect();
        vals = idx.iter().map(|&i| vals[i]).collect();
        // Converged: the simplex is a thousandth of the initial steps and flat.
        let size = (1..=dim)
            .map(|i| {
                (0..dim)
                    .map(|c| ((pts[i][c] - pts[0][c]) / step[c]).abs())
                    .fold(0.0, f64::max)
            })
            .fold(0.0, f64::max);
        let spread = vals[dim] - vals[0];
        if size < 1e-4 || (size < 1e-2 && spread <= 1e-12 * vals[0].abs()) {
            break;
        }
        let centroid: Vec<f64> = (0..dim)
            .map(|c| pts[..dim].iter().map(|p| p[c]).sum::<f64>() / dim as f64)
            .collect();
        let along = |t: f64| -> Vec<f64> {
            (0..dim)
                .map(|c| centroid[c] + t * (pts[dim][c] - centroid[c]))
                .collect()
        };
        let xr = along(-1.0);
        let fr = f(&xr);
        evals += 1;
        if fr < vals[0] {
            let xe = along(-2.0);
            let fe = f(&xe);
            evals += 1;
            if fe < fr {
                pts[dim] = xe;
                vals[dim] = fe;
            } else {
                pts[dim] = xr;
                vals[dim] = fr;
            }
        } else if fr < vals[dim - 1] {
            pts[dim] = xr;
            vals[dim] = fr;
        } else {
            let (xc, fc) = if fr < vals[dim] {
                let xc = along(-0.5);
                let fc = f(&xc);
                (xc, fc)
            } else {
                let xc = along(0.5);
                let fc = f(&xc);
                (xc, fc)
            };
            evals += 1;
            if fc < vals[dim].min(fr) {
                pts[dim] = xc;
                vals[dim] = fc;
            } else {
                for i in 1..=dim {
                    let p: Vec<f64> = (0..dim)
                        .map(|c| pts[0][c] + 0.5 * (pts[i][c] - pts[0][c]))
                        .collect();
                    vals[i] = f(&p);
                    pts[i] = p;
                    evals += 1;
                }
            }
        }
    }
    let best = (0..=dim)
        .min_by(|&a, &b| vals[a].total_cmp(&vals[b]))
        .unwrap_or(0);
    (pts[best].clone(), vals[best])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Box with `W = T`.
    Tiling,
    /// Box with `W ≥ T`.
    Sliding,
    Partial,
    Exp,
}

/// The longest box window and time constant searched, in periods.
const MAX_WINDOW_PERIODS: f64 = 12.0;
const MAX_TAU_PERIODS: f64 = 4.0;

/// Parameter vector → (period, phase, shape value) for a family.
fn unpack(kind: Kind, x: &[f64]) -> (f64, f64, f64) {
    match kind {
        Kind::Tiling => (x[0], x[1], x[0]),
        Kind::Sliding => (x[0], x[1], x[2].exp().max(x[0])),
        Kind::Partial => (x[0], x[1], x[2].exp().min(x[0])),
        Kind::Exp => (x[0], x[1], x[2].exp()),
    }
}

fn feat_for<'r>(reference: &'r Reference, kind: Kind, shape: f64) -> Feat<'r> {
    match kind {
        Kind::Tiling | Kind::Sliding | Kind::Partial => Feat::Window(shape),
        Kind::Exp => Feat::Exp(LowPass::new(reference, shape)),
    }
}

/// A parametric family's optimum.
#[derive(Clone)]
struct Optimum {
    kind: Kind,
    x: Vec<f64>,
    ev: Eval,
    /// The shape's search range (W or τ), s.
    shape_range: (f64, f64),
    /// The search's first steps in `x`.
    steps: Vec<f64>,
}

/// The residual of the best delay at `x` (the search's objective).
fn objective<'e>(engine: &'e Engine<'_>, kind: Kind) -> impl FnMut(&[f64]) -> f64 + 'e {
    move |x: &[f64]| {
        let (t, _, shape) = unpack(kind, x);
        if !(t > 0.0 && shape > 0.0 && shape.is_finite()) {
            return f64::INFINITY;
        }
        engine.evaluate_at(kind, x).rss
    }
}

/// The parametric families, the one whose search and refinement take longest last
/// ([`par_map`] starts it first): the exponential's low pass is a pass over the reference
/// for every time constant tried (on the demo's capture its search took 1.6 s, the
/// sliding and partial windows' 0.7 s each, the tiling box's 0.1 s).
const KINDS: [Kind; 4] = [Kind::Tiling, Kind::Sliding, Kind::Partial, Kind::Exp];

/// Every parametric family's [`search`], side by side on the machine's cores, in the
/// order of [`KINDS`].
fn search_all(engine: &Engine<'_>, t0: f64, t_se: f64, opts: &Options) -> Vec<Optimum> {
    par_map(&KINDS, |&kind| search(engine, kind, t0, t_se, opts))
}

fn search(engine: &Engine<'_>, kind: Kind, t0: f64, t_se: f64, opts: &Options) -> Optimum {
    let reference = engine.reference;
    let nphi = opts.phase_steps.max(8);
    let nshape = if kind == Kind::Tiling {
        1
    } else {
        opts.shape_steps.max(3)
    };
    let (min_shape, max_shape) = match kind {
        Kind::Tiling => (t0, t0),
        Kind::Sliding => (t0, MAX_WINDOW_PERIODS * t0),
        Kind::Partial => ((t0 / 64.0).max(2.0 * reference.median_spacing_s()), t0),
        Kind::Exp => (
            (t0 / 64.0).max(2.0 * reference.median_spacing_s()),
            MAX_TAU_PERIODS * t0,
        ),
    };
    let (ln_lo, ln_hi) = (min_shape.ln(), max_shape.ln().max(min_shape.ln()));
    let ln_step = if nshape > 1 {
        (ln_hi - ln_lo) / (nshape - 1) as f64
    } else {
        0.2
    };
    let shape_at = |i: usize| match kind {
        Kind::Tiling => t0,
        _ => (ln_lo + ln_step * i as f64).exp(),
    };
    let phi_step = t0 / nphi as f64;
    // Coarse grid.
    let mut grid: Vec<(f64, usize, usize)> = Vec::with_capacity(nphi * nshape);
    for is in 0..nshape {
        let feat = feat_for(reference, kind, shape_at(is));
        for ip in 0..nphi {
            let ev = engine.evaluate(t0, ip as f64 * phi_step, &feat);
            grid.push((ev.rss, ip, is));
        }
    }
    grid.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut starts: Vec<(usize, usize)> = Vec::new();
    for &(_, ip, is) in &grid {
        let distinct = starts.iter().all(|&(jp, js)| {
            let dp = (ip as i64 - jp as i64).rem_euclid(nphi as i64);
            let dp = dp.min(nphi as i64 - dp);
            dp >= 3 || (is as i64 - js as i64).abs() >= 3
        });
        if distinct {
            starts.push((ip, is));
        }
        if starts.len() == 3 {
            break;
        }
    }
    // Refinement.
    let mut objective = objective(engine, kind);
    let t_step = (2.0 * t_se).max(1e-7 * t0);
    let mut best: Option<(Vec<f64>, f64)> = None;
    for &(ip, is) in &starts {
        let mut x0 = vec![t0, ip as f64 * phi_step];
        let mut step = vec![t_step, phi_step];
        if kind != Kind::Tiling {
            x0.push(shape_at(is).ln());
            step.push(ln_step);
        }
        let (x1, _) = nelder_mead(&mut objective, &x0, &step, 400);
        let step2: Vec<f64> = step.iter().map(|s| 0.25 * s).collect();
        let (x2, f2) = nelder_mead(&mut objective, &x1, &step2, 300);
        if best.as_ref().is_none_or(|(_, fb)| f2 < *fb) {
            best = Some((x2, f2));
        }
    }
    let (x, _) = best.unwrap_or((vec![t0, 0.0, t0.ln()], f64::INFINITY));
    let ev = engine.evaluate_at(kind, &x);
    let mut steps = vec![t_step, phi_step];
    if kind != Kind::Tiling {
        steps.push(ln_step);
    }
    Optimum {
        kind,
        x,
        ev,
        shape_range: (min_shape, max_shape),
        steps,
    }
}

/// Groups of readings showing one update: `(k, first reading, count, mean reading)`.
fn groups(assign: &[i64], w: &[f64]) -> Vec<(i64, usize, usize, f64)> {
    let mut out: Vec<(i64, usize, usize, f64)> = Vec::new();
    for (j, (&k, &y)) in assign.iter().zip(w).enumerate() {
        match out.last_mut() {
            Some(g) if g.0 == k => {
                g.2 += 1;
                g.3 += y;
            }
            _ => out.push((k, j, 1, y)),
        }
    }
    for g in &mut out {
        g.3 /= g.2 as f64;
    }
    out
}

/// The load steps' blocks of a run of updates, from each update's prediction `pred`:
/// each update's block, counted from 0, and the number of blocks. A step is an update
/// whose prediction moves from the one before by more than a tenth of the predictions'
/// spread (5th to 95th percentile); steps with no steady update between them are one
/// step, and a block runs from a step to the next, the level it steps to with it (a
/// level's readings share its errors: the reference's error over it, the readings'
/// rounding of it).
fn load_blocks(pred: &[f64]) -> (Vec<usize>, usize) {
    let n = pred.len();
    if n == 0 {
        return (Vec::new(), 0);
    }
    let mut sorted = pred.to_vec();
    sorted.sort_by(f64::total_cmp);
    let q = |p: f64| sorted[((n - 1) as f64 * p).round() as usize];
    let threshold = 0.1 * (q(0.95) - q(0.05));
    let moved = |i: usize| i > 0 && (pred[i] - pred[i - 1]).abs() > threshold;
    let mut id = 0;
    let block: Vec<usize> = (0..n)
        .map(|i| {
            id += usize::from(moved(i) && !moved(i - 1));
            id
        })
        .collect();
    (block, id + 1)
}

/// The parameters' covariance for per-update rows and residuals, with the updates'
/// load-step blocks given by their predictions `pred`; the largest factor by which the
/// blocks widened a standard error (≥ 1); and the degrees of freedom the standard errors
/// rest on (the blocks less one).
///
/// The residuals of one load step share its errors (the model's shape at the step, the
/// reference's noise there), so the readings are not as many independent errors as they
/// are: the covariance is the cluster-robust sandwich `(JᵀJ)⁻¹ (Σ_b J_bᵀ r_b r_bᵀ J_b)
/// (JᵀJ)⁻¹` over the blocks (with the small-sample factor `G/(G − 1)·(n − 1)/(n − p)`),
/// beside the independent readings' `s² (JᵀJ)⁻¹` (a few blocks state the sandwich
/// loosely): each variance is the larger ([`Covariance`]), and the intervals take
/// Student's t on `G − 1` degrees of freedom: a run with few load steps gets intervals as
/// wide as those steps allow.
fn curvature_cov(rows: &[Vec<f64>], resid: &[f64], pred: &[f64]) -> (Option<Covariance>, f64, f64) {
    let p = rows.first().map_or(0, Vec::len);
    let n = rows.len();
    if p == 0 || n <= p {
        return (None, 1.0, 0.0);
    }
    let mut jtj = vec![0.0; p * p];
    for r in rows {
        for a in 0..p {
            for b in 0..p {
                jtj[a * p + b] += r[a] * r[b];
            }
        }
    }
    let ss: f64 = resid.iter().map(|r| r * r).sum();
    let s2 = ss / (n - p) as f64;
    // Columns scaled to unit norm first (their scales differ by many decades).
    let scale: Vec<f64> = (0..p)
        .map(|a| {
            let d = jtj[a * p + a];
            if d > 0.0 {
                1.0 / d.sqrt()
            } else {
                0.0
            }
        })
        .collect();
    let scaled: Vec<f64> = (0..p * p)
        .map(|i| jtj[i] * scale[i / p] * scale[i % p])
        .collect();
    let Some(inv) = spd_inverse(&scaled, p) else {
        return (None, 1.0, 0.0);
    };
    let bread: Vec<f64> = (0..p * p)
        .map(|i| inv[i] * scale[i / p] * scale[i % p])
        .collect();
    let (block, g) = load_blocks(pred);
    let mut sums = vec![vec![0.0; p]; g];
    for ((r, e), &b) in rows.iter().zip(resid).zip(&block) {
        for a in 0..p {
            sums[b][a] += r[a] * e;
        }
    }
    let mut meat = vec![0.0; p * p];
    for s in &sums {
        for a in 0..p {
            for b in 0..p {
                meat[a * p + b] += s[a] * s[b];
            }
        }
    }
    let small = if g > 1 {
        g as f64 / (g - 1) as f64 * (n - 1) as f64 / (n - p) as f64
    } else {
        0.0
    };
    // `B M B` as two products (`B` and `M` symmetric).
    let product = |x: &[f64], y: &[f64]| -> Vec<f64> {
        (0..p * p)
            .map(|i| (0..p).map(|k| x[i / p * p + k] * y[k * p + i % p]).sum())
            .collect()
    };
    let sandwich: Vec<f64> = product(&product(&bread, &meat), &bread)
        .iter()
        .map(|v| small * v)
        .collect();
    let cov = Covariance {
        p,
        naive: bread.iter().map(|b| s2 * b).collect(),
        sandwich: (g > 1).then_some(sandwich),
    };
    let inflation = (0..p)
        .map(|a| {
            let naive = cov.naive[a * p + a];
            if naive > 0.0 {
                cov.se(a) / naive.sqrt()
            } else {
                1.0
            }
        })
        .fold(1.0, f64::max);
    let dof = ((g.max(2) - 1) as f64).min((n - p) as f64);
    (Some(cov), inflation, dof)
}

/// A fit's parameters' covariance twice over: the independent readings' `s² (JᵀJ)⁻¹`
/// and the load-step blocks' sandwich ([`curvature_cov`]). A combination's variance is
/// the larger of the two, each from its whole matrix (so that a combination whose terms
/// cancel, as the delay's update instant `φ + k·T` does, keeps its cancellation).
struct Covariance {
    p: usize,
    naive: Vec<f64>,
    sandwich: Option<Vec<f64>>,
}

impl Covariance {
    /// The variance of `Σ w·θ_a` over the `(a, w)` of `terms`.
    fn var(&self, terms: &[(usize, f64)]) -> f64 {
        let form = |m: &[f64]| -> f64 {
            (terms.iter())
                .flat_map(|&(a, x)| terms.iter().map(move |&(b, y)| x * y * m[a * self.p + b]))
                .sum()
        };
        let naive = form(&self.naive);
        (self.sandwich.as_deref())
            .map_or(naive, |s| naive.max(form(s)))
            .max(0.0)
    }

    /// The standard error of parameter `a`.
    fn se(&self, a: usize) -> f64 {
        self.var(&[(a, 1.0)]).sqrt()
    }
}

/// Readings above which the search runs on a part of them and only the refinement on all
/// (see the module documentation).
pub const SEARCH_READINGS: usize = 3000;

/// Readings the search's second pass runs on, at most, before the refinement on all.
pub const POLISH_READINGS: usize = 10_000;

/// Updates the free response's weights are fitted on, at most.
pub const RESPONSE_UPDATES: usize = 10_000;

/// The `n` consecutive readings whose values change the most (the sum of
/// their successive differences): `first..last` indices.
fn busiest(w: &[f64], n: usize) -> std::ops::Range<usize> {
    let n = n.clamp(2, w.len());
    let d: Vec<f64> = w.windows(2).map(|p| (p[1] - p[0]).abs()).collect();
    let mut sum: f64 = d[..n - 1].iter().sum();
    let (mut best, mut at) = (sum, 0);
    for i in 1..=w.len() - n {
        sum += d[i + n - 2] - d[i - 1];
        if sum > best {
            best = sum;
            at = i;
        }
    }
    at..at + n
}

/// The predictions `r(u)` of a family at each update index of `ks`, for the grid of `x`
/// and the response `feat`.
fn features(engine: &Engine<'_>, kind: Kind, x: &[f64], feat: &Feat<'_>, ks: &[i64]) -> Vec<f64> {
    features_of(engine, kind, &[(x, feat)], ks).remove(0)
}

/// [`features`] of several grids and responses at once, in one pass over the updates:
/// the reference's cells around an update are fetched from memory once for all of them,
/// not once each (on a long capture's lattice, larger than any cache, the fetches are
/// what [`features`] costs). Each prediction is computed exactly as [`features`] does.
fn features_of(
    engine: &Engine<'_>,
    kind: Kind,
    at: &[(&[f64], &Feat<'_>)],
    ks: &[i64],
) -> Vec<Vec<f64>> {
    let grids: Vec<(f64, f64)> = (at.iter())
        .map(|(x, _)| {
            let (t, phi, _) = unpack(kind, x);
            (t, phi)
        })
        .collect();
    let mut out: Vec<Vec<f64>> = at.iter().map(|_| Vec::with_capacity(ks.len())).collect();
    for &k in ks {
        for ((o, &(t, phi)), (_, feat)) in out.iter_mut().zip(&grids).zip(at) {
            o.push(feat.at(engine.reference, engine.t_mid + phi + k as f64 * t));
        }
    }
    out
}

/// Weighted least squares of group means `y` (weights `c`) on `f`: `(gain, offset, rss)`
/// (gain 0 and the mean reading where `f` does not vary).
fn weighted_line(f: &[f64], y: &[f64], c: &[f64]) -> (f64, f64, f64) {
    let (off, g) = crate::align::weighted_ls(f, y, c).unwrap_or_else(|_| {
        let sw: f64 = c.iter().sum();
        (y.iter().zip(c).map(|(y, c)| y * c).sum::<f64>() / sw, 0.0)
    });
    let rss = f
        .iter()
        .zip(y)
        .zip(c)
        .map(|((f, y), c)| c * (y - g * f - off).powi(2))
        .sum();
    (g, off, rss)
}

/// Refines a parametric family found on part of the readings over all of them:
/// Levenberg–Marquardt on `(T, φ, ln W or ln τ)` and the gain and offset with the
/// readings' assignment to updates held, then the delay optimised exactly again at the
/// new point (as the search does), until the residual stops falling.
fn refine(
    engine: &Engine<'_>,
    kind: Kind,
    x0: Vec<f64>,
    w: &[f64],
    range: (f64, f64),
    steps: Vec<f64>,
) -> Optimum {
    let reference = engine.reference;
    // The response at `x` is kept with its fit: building an exponential's low pass is a
    // pass over the whole reference, and each step below needs it again.
    let mut feat = feat_for(reference, kind, unpack(kind, &x0).2);
    let (t0, phi0, _) = unpack(kind, &x0);
    let (mut x, mut ev) = (x0.clone(), engine.evaluate(t0, phi0, &feat));
    let dim = x.len();
    let h_u = (2.0 * reference.resolution_s()).max(1e-6 * x[0]);
    // An improvement of the residual by less than a hundredth of one reading's noise
    // variance (Δχ² < 0.01) moves the parameters by less than a tenth of their standard
    // errors: the refinement stops there.
    let negligible = 0.01 / w.len().max(1) as f64;
    for _ in 0..4 {
        let (t, phi, _) = unpack(kind, &x);
        let gr = groups(&engine.assignment(t, phi, &ev), w);
        let ks: Vec<i64> = gr.iter().map(|g| g.0).collect();
        let y: Vec<f64> = gr.iter().map(|g| g.3).collect();
        let c: Vec<f64> = gr.iter().map(|g| g.2 as f64).collect();
        let line_at = |x: &[f64], feat| {
            let f = features(engine, kind, x, &feat, &ks);
            let (g, off, rss) = weighted_line(&f, &y, &c);
            (f, g, off, rss, feat)
        };
        let rss_at = |x: &[f64]| line_at(x, feat_for(reference, kind, unpack(kind, x).2));
        let (mut xi, mut cur) = (x.clone(), line_at(&x, feat));
        let mut lambda = 1e-3;
        for _ in 0..8 {
            let (f0, g, off, rss0) = (&cur.0, cur.1, cur.2, cur.3);
            // Columns: ∂(g·f)/∂x_i by central differences, then f and 1. The period and
            // the phase move the grid, not the response: one for both.
            let here = &cur.4;
            let hs: Vec<f64> = (1..dim)
                .map(|i| match i {
                    1 => h_u,
                    _ => (h_u / unpack(kind, &xi).2).max(1e-4),
                })
                .collect();
            let moved: Vec<Vec<f64>> = (1..dim)
                .flat_map(|i| {
                    let (mut xp, mut xm) = (xi.clone(), xi.clone());
                    xp[i] += hs[i - 1];
                    xm[i] -= hs[i - 1];
                    [xp, xm]
                })
                .collect();
            let shaped: Vec<Feat<'_>> = (moved[2..].iter())
                .map(|x| feat_for(reference, kind, unpack(kind, x).2))
                .collect();
            let at: Vec<(&[f64], &Feat<'_>)> = (moved.iter().enumerate())
                .map(|(j, x)| (&x[..], if j < 2 { here } else { &shaped[j - 2] }))
                .collect();
            let fs = features_of(engine, kind, &at, &ks);
            let mut cols: Vec<Vec<f64>> = Vec::with_capacity(dim + 2);
            for (pm, h) in fs.chunks(2).zip(&hs) {
                cols.push(
                    (pm[0].iter().zip(&pm[1]))
                        .map(|(a, b)| g * (a - b) / (2.0 * h))
                        .collect(),
                );
            }
            // The period moves update k as the phase does, k times over: its column is
            // the phase's times k, with no evaluation of its own.
            let period_col = (cols[0].iter().zip(&ks))
                .map(|(d, &k)| d * k as f64)
                .collect();
            cols.insert(0, period_col);
            cols.push(f0.clone());
            cols.push(vec![1.0; f0.len()]);
            let p = dim + 2;
            let mut jtj = vec![0.0; p * p];
            let mut jtr = vec![0.0; p];
            for u in 0..f0.len() {
                let r = y[u] - (g * f0[u] + off);
                for a in 0..p {
                    jtr[a] += c[u] * cols[a][u] * r;
                    for b in 0..p {
                        jtj[a * p + b] += c[u] * cols[a][u] * cols[b][u];
                    }
                }
            }
            // The columns scaled to unit norm: the period's is the phase's times the
            // update's index, up to 1e5 and more on a long capture, and unscaled the
            // normal matrix is not numerically positive definite at any damping.
            // A column of zeros (a shape at the edge of its range, where it is clamped)
            // is held: its row and column become the identity's, its step 0.
            let scale: Vec<f64> = (0..p)
                .map(|i| {
                    let d = jtj[i * p + i].sqrt();
                    if d > 0.0 && d.is_finite() {
                        1.0 / d
                    } else {
                        0.0
                    }
                })
                .collect();
            let scaled: Vec<f64> = (0..p * p)
                .map(|ab| jtj[ab] * scale[ab / p] * scale[ab % p])
                .collect();
            let rhs: Vec<f64> = (0..p).map(|i| jtr[i] * scale[i]).collect();
            let mut improved = false;
            while lambda < 1e12 {
                let mut a = scaled.clone();
                for i in 0..p {
                    a[i * p + i] = if scale[i] > 0.0 {
                        a[i * p + i] * (1.0 + lambda)
                    } else {
                        1.0
                    };
                }
                let mut step = rhs.clone();
                if !cholesky_solve(&mut a, p, &mut step) {
                    lambda *= 10.0;
                    continue;
                }
                // The linear model's reduction of the residual by this step: below the
                // negligible, no smaller step can do better, and none is tried.
                let gain_pred: f64 = (0..p)
                    .map(|i| {
                        let ai: f64 = (0..p).map(|j| scaled[i * p + j] * step[j]).sum();
                        step[i] * (2.0 * rhs[i] - ai)
                    })
                    .sum();
                if gain_pred.is_nan() || gain_pred < negligible * rss0 {
                    break;
                }
                let xn: Vec<f64> = (0..dim).map(|i| xi[i] + step[i] * scale[i]).collect();
                let next = rss_at(&xn);
                if next.3 < rss0 {
                    let small = rss0 - next.3 < negligible * rss0;
                    xi = xn;
                    cur = next;
                    lambda = (lambda / 10.0).max(1e-9);
                    improved = !small;
                    break;
                }
                lambda *= 10.0;
            }
            if !improved {
                break;
            }
        }
        let (ti, phi_i, _) = unpack(kind, &xi);
        let next = engine.evaluate(ti, phi_i, &cur.4);
        if next.rss.partial_cmp(&ev.rss) != Some(std::cmp::Ordering::Less) {
            break;
        }
        // Another round only where the readings' assignment to updates moved, which the
        // round held: the residual with them reassigned is clearly below the round's.
        let reassigned = cur.3 - next.rss >= negligible * cur.3;
        x = xi;
        ev = next;
        feat = cur.4;
        if !reassigned {
            break;
        }
    }
    Optimum {
        kind,
        x,
        ev,
        shape_range: range,
        steps,
    }
}

/// A family whose residual on the part of a long capture's readings is more than this
/// many times the best family's there is not refined on all of them.
pub const UNREFINED_RSS_RATIO: f64 = 1.5;

/// Origins of the free response's bins tried, evenly over one bin.
const RESPONSE_SHIFTS: usize = 8;

/// How much lower (relative) the free response's residual must be than the best
/// parametric family's for it to be chosen (see the criterion above).
pub const RESPONSE_MIN_GAIN: f64 = 0.5;

fn bic(rss: f64, n: usize, n_u: usize, k: usize) -> f64 {
    let n_u = n_u.max(1) as f64;
    n_u * (rss.max(1e-300) / n as f64).ln() + k as f64 * n_u.ln()
}

/// Turns a parametric optimum into a [`FamilyFit`] with curvature uncertainties; also
/// returns the per-reading update indices.
fn finish_parametric(engine: &Engine<'_>, opt: &Optimum, w: &[f64]) -> (FamilyFit, Vec<i64>) {
    let reference = engine.reference;
    let (t, phi, shape) = unpack(opt.kind, &opt.x);
    let ev = opt.ev;
    let assign = engine.assignment(t, phi, &ev);
    let gr = groups(&assign, w);
    let n = w.len();
    // Prediction per update for nonlinear parameters `x` (same parametrisation).
    let ks: Vec<i64> = gr.iter().map(|g| g.0).collect();
    let here = feat_for(reference, opt.kind, shape);
    let kmax = gr
        .iter()
        .map(|g| g.0.unsigned_abs())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let h_u = (2.0 * reference.median_spacing_s()).max(1e-6 * t);
    // Derivatives in natural units: T, φ, then W or τ (not their logs), by differences
    // `(x + h) − (x − hm)`.
    let nl = if opt.kind == Kind::Tiling { 2 } else { 3 };
    let mut moved: Vec<Vec<f64>> = Vec::with_capacity(2 * nl);
    let mut widths: Vec<f64> = Vec::with_capacity(nl);
    for c in 0..nl {
        let (mut xp, mut xm) = (opt.x.clone(), opt.x.clone());
        let h = match c {
            0 => h_u / kmax,
            1 => h_u,
            _ => h_u.max(1e-3 * shape),
        };
        if c < 2 {
            xp[c] += h;
            xm[c] -= h;
            widths.push(2.0 * h);
        } else {
            xp[c] = (shape + h).ln();
            xm[c] = (shape - h).max(0.5 * shape).ln();
            widths.push(h + shape - (shape - h).max(0.5 * shape));
        }
        moved.extend([xp, xm]);
    }
    // The shape moves with the third parameter, and with the period where the windows
    // tile time (a tiling box's window is its period).
    let moves_shape = |j: usize| j >= 4 || (opt.kind == Kind::Tiling && j < 2);
    let shaped: Vec<Option<Feat<'_>>> = (moved.iter().enumerate())
        .map(|(j, x)| moves_shape(j).then(|| feat_for(reference, opt.kind, unpack(opt.kind, x).2)))
        .collect();
    let at: Vec<(&[f64], &Feat<'_>)> = std::iter::once((&opt.x[..], &here))
        .chain((moved.iter().zip(&shaped)).map(|(x, f)| (&x[..], f.as_ref().unwrap_or(&here))))
        .collect();
    let mut fs = features_of(engine, opt.kind, &at, &ks);
    let f0 = fs.remove(0);
    let cols: Vec<Vec<f64>> = (fs.chunks(2).zip(&widths))
        .map(|(pm, width)| {
            (pm[0].iter().zip(&pm[1]))
                .map(|(a, b)| ev.gain * (a - b) / width)
                .collect()
        })
        .collect();
    let rows: Vec<Vec<f64>> = (0..gr.len())
        .map(|i| {
            let mut r: Vec<f64> = cols.iter().map(|c| c[i]).collect();
            r.push(f0[i]);
            r.push(1.0);
            r
        })
        .collect();
    let resid: Vec<f64> = gr
        .iter()
        .zip(&f0)
        .map(|(g, f)| g.3 - (ev.gain * f + ev.offset))
        .collect();
    let (cov, inflation, dof) = curvature_cov(&rows, &resid, &f0);
    let se = |a: usize| cov.as_ref().map_or(f64::NAN, |c| c.se(a));
    // The reading that sets the delay (smallest lag) and its update's uncertainty.
    let (_, rr) = grid_positions(&engine.s, engine.t_mid, t, phi);
    let order = distance_order(&rr);
    let j_star = order[ev.state.min(n - 1)];
    let k_star = assign[j_star] as f64;
    let d_se = (cov.as_ref()).map_or(f64::NAN, |c| c.var(&[(1, 1.0), (0, k_star)]).sqrt());
    let shape_out = match opt.kind {
        Kind::Tiling => Shape::Box {
            window_s: Estimate::new(t, se(0)),
        },
        Kind::Sliding => Shape::Box {
            window_s: Estimate::new(shape, se(2)),
        },
        Kind::Partial => Shape::Partial {
            window_s: Estimate::new(shape, se(2)),
        },
        Kind::Exp => Shape::Exponential {
            tau_s: Estimate::new(shape, se(2)),
        },
    };
    let centroid = ev.d_hi
        + match opt.kind {
            Kind::Tiling | Kind::Sliding | Kind::Partial => 0.5 * shape,
            Kind::Exp => shape,
        };
    let params = if opt.kind == Kind::Tiling { 5 } else { 6 };
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs().max(t * 1e-3);
    let (lo, hi) = opt.shape_range;
    let shape_edge = match opt.kind {
        Kind::Tiling => false,
        Kind::Sliding => near(shape, hi),
        Kind::Partial => near(shape, lo),
        Kind::Exp => near(shape, lo) || near(shape, hi),
    };
    // The lowest bracket of a logger read in phase with its updates spans almost a whole
    // period (the twin's demo: −1 ms to −5 µs, the rig's input-filter lag), so being in it
    // says nothing of the edge; a delay in its lower half does.
    let delay_edge =
        (ev.m == engine.m_lo && ev.state == 0 && ev.d_hi <= (engine.m_lo as f64 + 0.5) * t)
            || ev.d_hi >= (engine.m_hi as f64 - 1e-3) * t;
    let fit = FamilyFit {
        shape: shape_out,
        period_s: Estimate::new(t, se(0)),
        phase_s: Estimate::new(reference.origin_s + engine.t_mid + phi, se(1)),
        delay_s: Estimate::new(ev.d_hi, d_se),
        delay_min_s: ev.d_lo,
        centroid_s: centroid,
        gain: Estimate::new(ev.gain, se(nl)),
        offset_w: Estimate::new(ev.offset, se(nl + 1)),
        rss_w2: ev.rss,
        rms_w: (ev.rss / n as f64).sqrt(),
        readings: n,
        updates: gr.len(),
        params,
        bic: bic(ev.rss, n, gr.len(), params),
        se_inflation: inflation,
        se_dof: dof,
        at_search_edge: shape_edge || delay_edge,
    };
    (fit, assign)
}

/// The non-parametric family on the parent's update grid and delay.
fn fit_response(
    engine: &Engine<'_>,
    parent: &FamilyFit,
    period: Estimate,
    assign: &[i64],
    w: &[f64],
    bins: usize,
    reach_s: f64,
) -> FamilyFit {
    let reference = engine.reference;
    let n = w.len();
    let t = period.value;
    let u0 = parent.phase_s.value - reference.origin_s;
    // The delay on this grid: the smallest lag from an update to a reading showing it
    // (the parent's, measured on its own period, is off by the periods' difference times
    // the updates from the middle to the reading that set it).
    let d = engine
        .s
        .iter()
        .zip(assign)
        .map(|(&s, &k)| s - (u0 + k as f64 * t))
        .fold(f64::INFINITY, f64::min);
    // Bins reach back from the anchor `u + max(d, 0)`: the later of the parent's update
    // instant and the reading's visibility (a negative delay is a timeline offset).
    let dplus = d.max(0.0);
    let nb = bins.max(2);
    let span = (1.5 * (dplus + reach_s)).min(MAX_WINDOW_PERIODS * t);
    let dx = span / nb as f64;
    let all = groups(assign, w);
    // The weights are fitted on at most RESPONSE_UPDATES updates, evenly spread over the
    // readings; the residual (and so the criterion) is over every reading.
    let stride = all.len().div_ceil(RESPONSE_UPDATES).max(1);
    let gr: Vec<(i64, usize, usize, f64)> = all.iter().copied().step_by(stride).collect();
    // Design per update: bin i's mean over [a − (i+1)Δ, a − iΔ], a = u + max(d, 0) − σ;
    // the bins' origin σ is searched over one bin in RESPONSE_SHIFTS steps, so that the
    // response's start (its delay) is not tied to the parent's grid.
    let row = |k: i64, sigma: f64, from: usize| -> Vec<f64> {
        let v = u0 + k as f64 * t + dplus - sigma;
        let edges: Vec<f64> = (0..=nb)
            .map(|i| reference.e_rel(v - i as f64 * dx))
            .collect();
        (0..nb)
            .map(|i| {
                if i < from {
                    0.0 // held at zero
                } else {
                    (edges[i] - edges[i + 1]) / dx
                }
            })
            .collect()
    };
    // The residual sum of squares over every reading of `groups`.
    // Bins held at zero have no weight: the rows need not hold them again.
    let rss_over = |groups: &[(i64, usize, usize, f64)], sigma: f64, coef: &[f64], offset: f64| {
        let mut rss = 0.0;
        for g in groups {
            let p = offset
                + row(g.0, sigma, 0)
                    .iter()
                    .zip(coef)
                    .map(|(x, c)| x * c)
                    .sum::<f64>();
            for y in &w[g.1..g.1 + g.2] {
                rss += (y - p) * (y - p);
            }
        }
        rss
    };
    let solve = |sigma: f64, from: usize| {
        let design: Vec<Vec<f64>> = gr.iter().map(|g| row(g.0, sigma, from)).collect();
        // Reading-weighted centred normal equations (the offset is free).
        let wsum: f64 = gr.iter().map(|g| g.2 as f64).sum();
        let abar: Vec<f64> = (0..nb)
            .map(|i| {
                gr.iter()
                    .zip(&design)
                    .map(|(g, a): (_, &Vec<f64>)| g.2 as f64 * a[i])
                    .sum::<f64>()
                    / wsum
            })
            .collect();
        let ybar = gr.iter().map(|g| g.2 as f64 * g.3).sum::<f64>() / wsum;
        let mut gram = vec![0.0; nb * nb];
        let mut rhs = vec![0.0; nb];
        for (g, a) in gr.iter().zip(&design) {
            let c = g.2 as f64;
            for i in 0..nb {
                let ai = a[i] - abar[i];
                rhs[i] += c * ai * (g.3 - ybar);
                for j in i..nb {
                    gram[i * nb + j] += c * ai * (a[j] - abar[j]);
                }
            }
        }
        for i in 0..nb {
            for j in 0..i {
                gram[i * nb + j] = gram[j * nb + i];
            }
        }
        let coef = nnls_gram(&gram, &rhs, nb);
        let offset = ybar - coef.iter().zip(&abar).map(|(c, a)| c * a).sum::<f64>();
        let pred_u: Vec<f64> = design
            .iter()
            .map(|a| offset + a.iter().zip(&coef).map(|(x, c)| x * c).sum::<f64>())
            .collect();
        // The residual over the updates fitted (those it is chosen by).
        let mut rss = 0.0;
        for (g, p) in gr.iter().zip(&pred_u) {
            for y in &w[g.1..g.1 + g.2] {
                rss += (y - p) * (y - p);
            }
        }
        (sigma, design, coef, offset, pred_u, rss)
    };
    let best = (0..RESPONSE_SHIFTS)
        .map(|j| solve(j as f64 * dx / RESPONSE_SHIFTS as f64, 0))
        .min_by(|a, b| a.5.total_cmp(&b.5))
        .expect("RESPONSE_SHIFTS > 0");
    // Curvature on the active bins and the offset, per update.
    let curvature = |design: &[Vec<f64>], coef: &[f64], pred_u: &[f64]| {
        let active: Vec<usize> = (0..nb).filter(|&i| coef[i] > 0.0).collect();
        let rows: Vec<Vec<f64>> = design
            .iter()
            .map(|a| {
                let mut r: Vec<f64> = active.iter().map(|&i| a[i]).collect();
                r.push(1.0);
                r
            })
            .collect();
        let resid: Vec<f64> = gr.iter().zip(pred_u).map(|(g, p)| g.3 - p).collect();
        let (cov, inflation, dof) = curvature_cov(&rows, &resid, pred_u);
        (active, cov, inflation, dof)
    };
    let (active, cov, ..) = curvature(&best.1, &best.2, &best.4);
    let sd = |cov: &Option<Covariance>, a: usize| cov.as_ref().map_or(0.0, |c| c.se(a));
    // The response starts at its first bin that is significantly non-zero (two standard
    // errors) and holds at least a tenth of the peak bin's weight (the onset, as a rise
    // time is read): NNLS leaves small positive weights in leading bins from noise, from
    // the reference's input filter and from its linear interpolation, which spreads a
    // step over the sample interval before it. Those are held at zero and the weights
    // solved again.
    let peak = best.2.iter().copied().fold(0.0, f64::max);
    let first = active
        .iter()
        .enumerate()
        .find(|&(a, &i)| best.2[i] > 2.0 * sd(&cov, a) && best.2[i] >= 0.1 * peak)
        .map_or(0, |(_, &i)| i);
    let (sigma, design, coef, offset, pred_u, rss) = if active.first().is_some_and(|&f| f < first) {
        solve(best.0, first)
    } else {
        best
    };
    let gain: f64 = coef.iter().sum();
    let (active, cov, inflation, dof) = curvature(&design, &coef, &pred_u);
    let dof = dof.min(parent.se_dof);
    let rss = if stride > 1 {
        rss_over(&all, sigma, &coef, offset)
    } else {
        rss
    };
    let p = active.len() + 1;
    let every_bin: Vec<(usize, f64)> = (0..active.len()).map(|a| (a, 1.0)).collect();
    let gain_se = (cov.as_ref()).map_or(f64::NAN, |c| c.var(&every_bin).sqrt());
    let first = active.first().copied().unwrap_or(0);
    let last = active.last().copied().unwrap_or(0);
    let norm = if gain > 0.0 { 1.0 / (gain * dx) } else { 0.0 };
    let h: Vec<f64> = coef[first..=last].iter().map(|c| c * norm).collect();
    let h_se: Vec<f64> = (first..=last)
        .map(|i| {
            active
                .iter()
                .position(|&a| a == i)
                .map_or(0.0, |a| sd(&cov, a) * norm)
        })
        .collect();
    let lead = sigma + first as f64 * dx;
    // The response's update instant is the anchor less the leading empty bins.
    let delay = d - dplus + lead;
    let centroid = if gain > 0.0 {
        d - dplus
            + sigma
            + coef
                .iter()
                .enumerate()
                .map(|(i, c)| c * (i as f64 + 0.5) * dx)
                .sum::<f64>()
                / gain
    } else {
        f64::NAN
    };
    let params = 4 + active.len();
    FamilyFit {
        shape: Shape::Response {
            spacing_s: dx,
            h_per_s: h,
            h_se_per_s: h_se,
        },
        period_s: period,
        phase_s: Estimate::new(parent.phase_s.value + dplus - lead, parent.phase_s.se),
        delay_s: Estimate::new(delay, parent.delay_s.se.hypot(dx / 12f64.sqrt())),
        delay_min_s: delay - (d - parent.delay_min_s),
        centroid_s: centroid,
        gain: Estimate::new(gain, gain_se),
        offset_w: Estimate::new(offset, sd(&cov, p - 1)),
        rss_w2: rss,
        rms_w: (rss / n as f64).sqrt(),
        readings: n,
        updates: all.len(),
        params,
        bic: bic(rss, n, all.len(), params),
        se_inflation: inflation,
        se_dof: dof,
        at_search_edge: parent.at_search_edge,
    }
}

/// Identifies a logger from a reference trace and the logger's readings (`read_times_s`,
/// `read_power_w`, on the reference's timeline): every family's fit, and the one with
/// the lowest BIC (see the [module documentation](self)).
///
/// Readings are used if their reach (`(max_delay_periods + 13)·T` back, which covers
/// every window, delay and `3τ` searched, and `max_advance_periods·T` ahead) lies within
/// the reference and touches no gap in it.
/// The logger must be read at least as often as it updates, and the reference must span
/// many updates with changes in power (steps, a square wave) for the window and delay to
/// show.
///
/// # Errors
///
/// Mismatched lengths, non-finite readings, an option out of range, too few changes in
/// the readings to estimate the period (without [`Options::period_s`]), or fewer than 20
/// usable readings.
pub fn identify(
    reference: &Reference,
    read_times_s: &[f64],
    read_power_w: &[f64],
    opts: &Options,
) -> Result<Identification, IdentifyError> {
    if read_times_s.len() != read_power_w.len() {
        return Err(ParamError::new(
            "read_power_w.len()",
            read_power_w.len() as f64,
            "must equal read_times_s.len()",
        )
        .into());
    }
    if let Some(&bad) = read_times_s
        .iter()
        .chain(read_power_w)
        .find(|v| !v.is_finite())
    {
        return Err(ParamError::new("readings", bad, "must be finite").into());
    }
    if opts.max_delay_periods == 0 || opts.phase_steps < 8 || opts.response_bins < 2 {
        return Err(ParamError::new(
            "options",
            f64::NAN,
            "need max_delay_periods ≥ 1, phase_steps ≥ 8, response_bins ≥ 2",
        )
        .into());
    }
    let mut order: Vec<usize> = (0..read_times_s.len()).collect();
    order.sort_by(|&a, &b| read_times_s[a].total_cmp(&read_times_s[b]));
    let rt: Vec<f64> = order.iter().map(|&i| read_times_s[i]).collect();
    let rw: Vec<f64> = order.iter().map(|&i| read_power_w[i]).collect();
    let (t0, t_se) = match opts.period_s {
        Some(p) if p.is_finite() && p > 0.0 => (p, 0.0),
        Some(p) => return Err(ParamError::new("period_s", p, "must be finite and > 0").into()),
        None => period_from_changes(&rt, &rw).ok_or(IdentifyError::NoPeriod {
            changes: rw.windows(2).filter(|w| w[1] != w[0]).count(),
        })?,
    };
    // Readings whose reach lies within the reference and crosses no gap.
    let reach = (opts.max_delay_periods as f64 + 1.0 + MAX_WINDOW_PERIODS) * t0;
    let advance = opts.max_advance_periods as f64 * t0;
    let max_gap = opts
        .max_gap_s
        .unwrap_or(20.0 * reference.median_spacing_s());
    let gaps = reference.gaps_over(max_gap);
    let end = reference.last_rel();
    let (mut s, mut w) = (Vec::new(), Vec::new());
    for (&t, &p) in rt.iter().zip(&rw) {
        let x = t - reference.origin_s;
        let ok = x - reach >= 0.0
            && x + advance <= end
            && gaps
                .iter()
                .all(|&(a, b)| b <= x - reach || a >= x + advance);
        if ok {
            s.push(x);
            w.push(p);
        }
    }
    const NEEDED: usize = 20;
    if s.len() < NEEDED {
        return Err(IdentifyError::TooFewReadings {
            used: s.len(),
            needed: NEEDED,
        });
    }
    let (adv, del) = (opts.max_advance_periods, opts.max_delay_periods);
    // Many readings: the search runs on the busiest SEARCH_READINGS of them against the
    // part of the reference they reach, and each family is then refined on all of them.
    let part_of = |n: usize| {
        let r = busiest(&w, n);
        let (sub, shift) = reference.part(s[r.start] - reach, s[r.end - 1] + advance);
        let sub_s: Vec<f64> = s[r.clone()].iter().map(|x| x - shift).collect();
        (sub, shift, sub_s, w[r].to_vec())
    };
    let searched = opts.search_readings.max(NEEDED);
    let part = (w.len() > searched).then(|| part_of(searched));
    let polish_part = (w.len() > POLISH_READINGS.max(searched)).then(|| part_of(POLISH_READINGS));
    let engine = Engine::new(reference, s, &w, adv, del);
    fn part_engine(
        p: &Option<(Reference, f64, Vec<f64>, Vec<f64>)>,
        adv: usize,
        del: usize,
    ) -> Option<Engine<'_>> {
        p.as_ref()
            .map(|(sub, _, sub_s, sub_w)| Engine::new(sub, sub_s.clone(), sub_w, adv, del))
    }
    let search_engine = part_engine(&part, adv, del);
    let polish_engine = part_engine(&polish_part, adv, del);
    // An update instant of `x`'s grid on one engine (its middle at `from`, relative to the
    // reference's origin) as the one nearest the middle `to` of another.
    let moved = |mut x: Vec<f64>, from: f64, to: f64| {
        let u = from + x[1] - to;
        x[1] = u - (u / x[0]).round() * x[0];
        x
    };
    let opts_all: Vec<Optimum> = match (&part, &search_engine) {
        (Some((_, shift, ..)), Some(e)) => {
            // The search's second pass again (the exact delay, every assignment the
            // simplex reaches), on all the readings or the busiest POLISH_READINGS; then,
            // if those were not all, the refinement on all of them.
            let (on, mid) = match (&polish_engine, &polish_part) {
                (Some(p), Some(part)) => (p, part.1 + p.t_mid),
                _ => (&engine, engine.t_mid),
            };
            // Each stage's families side by side on the machine's cores.
            let searched = search_all(e, t0, t_se, opts);
            let best_searched = (searched.iter().map(|o| o.ev.rss)).fold(f64::INFINITY, f64::min);
            let polished: Vec<(Vec<f64>, f64)> = par_map(&searched, |o| {
                let kind = o.kind;
                // The grid's update instant nearest the middle of all the readings,
                // on the period from all of their changes where it was estimated (a
                // span of many times the part's), on the part's otherwise.
                let mut x = o.x.clone();
                if t_se > 0.0 {
                    x[0] = t0;
                }
                let x = moved(x, shift + e.t_mid, mid);
                let step: Vec<f64> = o.steps.iter().map(|s| 0.25 * s).collect();
                let (x, rss) = if o.ev.rss > UNREFINED_RSS_RATIO * best_searched {
                    // Far worse than the best already on the search's readings: not
                    // polished, and not refined below.
                    (x, f64::INFINITY)
                } else if polish_engine.is_some() {
                    // On a part, the period is held: a part of seconds resolves it
                    // far worse than the changes over all the readings (or the
                    // period given), and the phase moved from the part's middle to
                    // all the readings' would carry its error times that distance (a
                    // few µs at 100 s for 3e-8 of a period). The refinement on all
                    // the readings moves both.
                    let mut f = objective(on, kind);
                    let mut held = |r: &[f64]| f(&[&x[..1], r].concat());
                    let (r, rss) = nelder_mead(&mut held, &x[1..], &step[1..], 300);
                    ([&x[..1], &r[..]].concat(), rss)
                } else {
                    nelder_mead(&mut objective(on, kind), &x, &step, 300)
                };
                (x, rss)
            });
            let best_rss = (polished.iter().map(|p| p.1)).fold(f64::INFINITY, f64::min);
            let polished: Vec<(Optimum, Vec<f64>, f64)> = (searched.into_iter().zip(polished))
                .map(|(o, (x, rss))| (o, x, rss))
                .collect();
            par_map(&polished, |(o, x, rss)| {
                let o = o.clone();
                if polish_engine.is_none() {
                    let ev = engine.evaluate_at(o.kind, x);
                    return Optimum {
                        x: x.clone(),
                        ev,
                        ..o
                    };
                }
                let x = moved(x.clone(), mid, engine.t_mid);
                // A family whose residual on the part is well above the best one's
                // cannot be chosen: it is not refined on all the readings (its
                // parameters are the part's, its uncertainties all the readings').
                if *rss > UNREFINED_RSS_RATIO * best_rss {
                    let ev = engine.evaluate_at(o.kind, &x);
                    return Optimum { x, ev, ..o };
                }
                refine(&engine, o.kind, x, &w, o.shape_range, o.steps)
            })
        }
        _ => search_all(&engine, t0, t_se, opts),
    };
    let (mut fits, mut assigns): (Vec<FamilyFit>, Vec<_>) =
        par_map(&opts_all, |opt| finish_parametric(&engine, opt, &w))
            .into_iter()
            .unzip();
    // The box family: tiling (W = T, one parameter fewer) or sliding (W > T), by BIC.
    if fits[1].bic < fits[0].bic {
        fits.swap(0, 1);
        assigns.swap(0, 1);
    }
    fits.remove(1);
    assigns.remove(1);
    let mut parent = (0..fits.len())
        .min_by(|&a, &b| fits[a].bic.total_cmp(&fits[b].bic))
        .unwrap_or(0);
    // A partial window short of the period by less than a reference sample is the box
    // at this reference's resolution: the simpler family is kept.
    if let Shape::Partial { window_s } = &fits[parent].shape {
        let tiling = fits[0].window_s().map(|w| w.value) == Some(fits[0].period_s.value);
        if tiling && fits[parent].period_s.value - window_s.value < reference.median_spacing_s() {
            parent = 0;
        }
    }
    // At least a period: a parent that fits badly (a shape none of them has) may have
    // locked onto a part of the response.
    let reach_s = match &fits[parent].shape {
        Shape::Exponential { tau_s } => 3.0 * tau_s.value,
        _ => fits[parent].window_s().map_or(t0, |e| e.value),
    }
    .max(t0)
    .min(MAX_WINDOW_PERIODS * t0 / 1.5);
    // The update grid of the parent, on the better-known period: the readings' own lattice
    // (or the period given) where it is tighter than the parent's fit, which a shape that
    // fits badly pulls off by ppm (16 µs over 1500 updates of a 1 ms logger).
    let period = if t_se < fits[parent].period_s.se {
        Estimate::new(t0, t_se)
    } else {
        fits[parent].period_s
    };
    let response = fit_response(
        &engine,
        &fits[parent],
        period,
        &assigns[parent],
        &w,
        opts.response_bins,
        reach_s,
    );
    fits.push(response);
    // The free response only where it explains clearly more than every parametric shape.
    let last = fits.len() - 1;
    let best = if fits[last].bic < fits[parent].bic
        && fits[last].rms_w < (1.0 - RESPONSE_MIN_GAIN) * fits[parent].rms_w
    {
        last
    } else {
        parent
    };
    Ok(Identification {
        fits,
        best,
        period_guess_s: Estimate::new(t0, t_se),
        readings_used: w.len(),
        readings_given: read_times_s.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64, for seeded test data.
    struct Rng(u64);
    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
        }
    }

    /// The sample index finds the cell a binary search over every sample finds, at sample
    /// times exactly, between them, before the first and past the last, on evenly spaced
    /// samples with their times' rounding, and on samples with jitter, bursts and gaps
    /// of thousands of spacings.
    #[test]
    fn the_sample_index_finds_what_a_search_over_every_sample_finds() {
        let mut rng = Rng(7);
        let even: Vec<f64> = (0..5000).map(|i| 3.7 + f64::from(i) * 1e-5).collect();
        let mut t = 0.0;
        let ragged: Vec<f64> = (0..5000)
            .map(|i| {
                t += match i % 1000 {
                    999 => 0.05 * (1.0 + rng.uniform()),
                    500..=540 => 1e-7 * (0.5 + rng.uniform()),
                    _ => 1e-5 * (0.5 + rng.uniform()),
                };
                t
            })
            .collect();
        for times in [even, ragged] {
            let p = vec![1.0; times.len()];
            let r = Reference::new(&times, &p).unwrap();
            let n = r.t.len();
            let slow = |x: f64| r.t.partition_point(|&ti| ti <= x).clamp(1, n - 1) - 1;
            let last = r.t[n - 1];
            let mut queries = vec![-1.0, 0.0, last, last + 1.0, -1e-300, 1e300];
            queries.extend(r.t.iter().copied());
            queries.extend((0..20_000).map(|_| (rng.uniform() * 1.1 - 0.05) * last));
            for x in queries {
                assert_eq!(r.locate(x), slow(x), "x = {x}");
            }
        }
    }

    /// The refinement over many updates moves the period and the phase together back to
    /// the optimum. The period moves update k by k times what the phase does: over 25 000
    /// updates its column of the normal equations is 1e8 and more times the phase's, and
    /// the offset's and gain's are tiny beside it; unscaled, no damping made that matrix
    /// numerically positive definite and the refinement returned its start unchanged.
    /// Here it starts 5 µs off in phase and 3e-8 off in period (the error of a period
    /// polished on 10 s of readings) and must land within 30 ns and 5e-9 of the truth:
    /// the readings' 0.09 W of noise, against a slope of about 1e5 W/s at each window's
    /// ends over 24 880 readings, gives the phase a standard error of about 6 ns and the
    /// period one of about 1e-9 of itself.
    #[test]
    fn the_refinement_moves_period_and_phase_together_over_many_updates() {
        let mut rng = Rng(11);
        // A load of random levels held 0.3-5 ms, sampled every 40 µs for 25 s.
        let mut level = 100.0;
        let mut next = 0.0;
        let (mut times, mut power) = (Vec::new(), Vec::new());
        for i in 0..625_000 {
            let t = f64::from(i) * 40e-6;
            if t >= next {
                level = 80.0 + 300.0 * rng.uniform();
                next = t + 0.3e-3 + 4.7e-3 * rng.uniform();
            }
            times.push(t);
            power.push(level);
        }
        let reference = Reference::new(&times, &power).unwrap();
        // A 1 ms box read at its reports, 180 µs after each update.
        let (period, phase, d) = (1e-3, 0.2137e-3, 0.18e-3);
        let s: Vec<f64> = (20..24_900)
            .map(|k| phase + f64::from(k) * period)
            .collect();
        let w: Vec<f64> = (s.iter())
            .map(|&t| {
                0.95 * reference.mean(t - d - period, t - d) - 3.0 + 0.3 * (rng.uniform() - 0.5)
            })
            .collect();
        let engine = Engine::new(&reference, s.clone(), &w, 1, 2);
        let truth = phase - d - engine.t_mid;
        let start = vec![period * (1.0 + 3e-8), truth + 5e-6];
        let before = engine.evaluate_at(Kind::Tiling, &start);
        let got = refine(
            &engine,
            Kind::Tiling,
            start,
            &w,
            (period, period),
            vec![1e-10, 1e-5],
        );
        let off = got.x[1] - truth;
        let off = off - (off / period).round() * period;
        assert!(off.abs() < 30e-9, "phase {off} s off the truth");
        assert!(
            (got.x[0] / period - 1.0).abs() < 5e-9,
            "period {}",
            got.x[0]
        );
        let at_truth = engine.evaluate_at(Kind::Tiling, &[period, truth]);
        assert!(
            got.ev.rss <= at_truth.rss * (1.0 + 1e-6) && at_truth.rss < 0.1 * before.rss,
            "{} against {} at the truth and {} at the start",
            got.ev.rss,
            at_truth.rss,
            before.rss
        );
        assert!((got.ev.gain - 0.95).abs() < 1e-3, "{:?}", got.ev);
    }

    /// The exact delay scan equals a brute-force search over every distinct delay.
    #[test]
    fn delay_scan_matches_brute_force() {
        let mut rng = Rng(7);
        let times: Vec<f64> = (0..4000).map(|i| f64::from(i) * 1e-3).collect();
        let power: Vec<f64> = times
            .iter()
            .map(|&t| if (t * 7.3).sin() > 0.2 { 300.0 } else { 100.0 })
            .collect();
        let reference = Reference::new(&times, &power).unwrap();
        // Readings polled irregularly, a 40 ms window updated every 100 ms, delay 23 ms.
        let (period, phase, d, win) = (0.1, 0.0371, 0.023, 0.04);
        let mut s = Vec::new();
        let mut t = 0.5;
        while t < 3.9 {
            s.push(t);
            t += 0.005 + 0.015 * rng.uniform();
        }
        let w: Vec<f64> = s
            .iter()
            .map(|&t: &f64| {
                let u = phase + ((t - d - phase) / period).floor() * period;
                0.9 * reference.mean(u - win, u) - 2.0 + 0.3 * (rng.uniform() - 0.5)
            })
            .collect();
        let engine = Engine::new(&reference, s.clone(), &w, 1, 2);
        let feat = Feat::Window(win);
        for trial in 0..5 {
            let ph = phase - engine.t_mid + 0.004 * f64::from(trial);
            let ev = engine.evaluate(period, ph, &feat);
            // Brute force: every candidate delay (each reading's switch point, and 0).
            let (_, rr) = grid_positions(&engine.s, engine.t_mid, period, ph);
            let mut cands = vec![-period];
            for m in -1..2 {
                cands.extend(rr.iter().map(|r| f64::from(m) * period + r));
            }
            let mut best = f64::INFINITY;
            for &dd in &cands {
                let f: Vec<f64> = s
                    .iter()
                    .map(|&t| {
                        let u0 = engine.t_mid + ph;
                        let u = u0 + ((t - dd - u0) / period).floor() * period;
                        reference.mean(u - win, u)
                    })
                    .collect();
                let n = f.len() as f64;
                let (mf, my) = (f.iter().sum::<f64>() / n, w.iter().sum::<f64>() / n);
                let (mut sff, mut sfy, mut syy) = (0.0, 0.0, 0.0);
                for (a, b) in f.iter().zip(&w) {
                    sff += (a - mf) * (a - mf);
                    sfy += (a - mf) * (b - my);
                    syy += (b - my) * (b - my);
                }
                best = best.min(syy - sfy * sfy / sff);
            }
            assert!(
                (ev.rss - best).abs() <= 1e-6 * best.max(1.0),
                "trial {trial}: scan {} vs brute force {best}",
                ev.rss
            );
        }
        // At the truth the delay bracket holds the true delay.
        let ev = engine.evaluate(period, phase - engine.t_mid, &feat);
        assert!(ev.d_lo < d && d <= ev.d_hi + 1e-12, "{ev:?}");
        assert!(
            (ev.gain - 0.9).abs() < 0.01 && (ev.offset + 2.0).abs() < 1.0,
            "{ev:?}"
        );
    }
}
