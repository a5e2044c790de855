//! The true power of the twin's GPU as a piecewise-constant signal of time.
//!
//! Everything the twin simulates downstream of the GPU (rails, probes, the ADC, the GPU's
//! own power logger) reads this signal, and every estimate railtrace makes is scored
//! against it. Times are the twin's *true* time in seconds (the reference no real clock
//! reads), powers are in watts and energies in joules.
//!
//! - [`Segment`]: one constant piece, `[start_s, end_s)`, with its [`Util`]isation;
//! - [`PowerTrace`]: a finite, stored run of contiguous segments with exact
//!   [`energy_between`](PowerTrace::energy_between) and [`power_at`](PowerTrace::power_at),
//!   plus a forward [`TraceCursor`];
//! - [`StreamCursor`]: a bounded window over an endless stream of segments (such as
//!   [`Gpu::next_segment`](crate::gpu::Gpu::next_segment)) for walking time forward at a
//!   fixed sample rate in O(1) amortised per query.
//!
//! A segment covers `[start_s, end_s)`: at a boundary the *later* segment's power applies.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Utilisation of the GPU's units during a segment, each a fraction in `0..=1`.
///
/// This is the ground truth a utilisation-based power model (EnergAIzer-style) is fitted
/// against; the twin itself never derives power from it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Util {
    /// Compute-unit utilisation, fraction in `0..=1` (dimensionless).
    #[serde(default)]
    pub compute: f64,
    /// Memory (HBM bandwidth) utilisation, fraction in `0..=1` (dimensionless).
    #[serde(default)]
    pub memory: f64,
    /// Utilisation of everything else (interconnect, caches, ...), fraction in `0..=1`
    /// (dimensionless).
    #[serde(default)]
    pub other: f64,
}

impl Util {
    /// All units idle.
    pub const IDLE: Util = Util {
        compute: 0.0,
        memory: 0.0,
        other: 0.0,
    };

    /// A utilisation vector from its three fractions.
    pub const fn new(compute: f64, memory: f64, other: f64) -> Self {
        Util {
            compute,
            memory,
            other,
        }
    }

    /// Whether every fraction is finite and within `0..=1`.
    pub fn is_valid(&self) -> bool {
        [self.compute, self.memory, self.other]
            .iter()
            .all(|u| (0.0..=1.0).contains(u))
    }
}

/// One constant piece of the true power: `power_w` over `[start_s, end_s)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Segment {
    /// Start of the piece, true time in s (inclusive).
    pub start_s: f64,
    /// End of the piece, true time in s (exclusive); always greater than `start_s`.
    pub end_s: f64,
    /// Power drawn over the whole piece, in W.
    pub power_w: f64,
    /// Utilisation over the whole piece.
    pub util: Util,
}

impl Segment {
    /// Length of the piece, in s.
    pub fn duration_s(&self) -> f64 {
        self.end_s - self.start_s
    }

    /// Energy of the piece, in J (`power_w * duration_s`).
    pub fn energy_j(&self) -> f64 {
        self.power_w * self.duration_s()
    }

    /// Whether `t_s` lies in `[start_s, end_s)`.
    pub fn contains(&self, t_s: f64) -> bool {
        self.start_s <= t_s && t_s < self.end_s
    }

    /// Energy of the part of the piece inside `[a_s, b_s]`, in J (0 when they do not
    /// overlap or `b_s <= a_s`).
    pub fn energy_within(&self, a_s: f64, b_s: f64) -> f64 {
        let lo = a_s.max(self.start_s);
        let hi = b_s.min(self.end_s);
        if hi > lo {
            self.power_w * (hi - lo)
        } else {
            0.0
        }
    }

    fn check(&self) -> Result<(), TraceError> {
        if !(self.start_s.is_finite() && self.end_s.is_finite() && self.end_s > self.start_s) {
            return Err(TraceError::BadSegment {
                start_s: self.start_s,
                end_s: self.end_s,
            });
        }
        if !self.power_w.is_finite() {
            return Err(TraceError::BadPower {
                power_w: self.power_w,
            });
        }
        Ok(())
    }
}

/// Why a segment was refused.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum TraceError {
    /// The segment does not start where the previous one ended.
    #[error(
        "segment starts at {start_s} s but the previous one ended at {prev_end_s} s: \
         segments must be contiguous and in order"
    )]
    NotContiguous {
        /// End of the previous segment, s.
        prev_end_s: f64,
        /// Start of the refused segment, s.
        start_s: f64,
    },
    /// The segment's bounds are not finite or it is empty or reversed.
    #[error("segment [{start_s}, {end_s}) s is empty, reversed or not finite")]
    BadSegment {
        /// Start of the refused segment, s.
        start_s: f64,
        /// End of the refused segment, s.
        end_s: f64,
    },
    /// The segment's power is not finite.
    #[error("segment power {power_w} W is not finite")]
    BadPower {
        /// The refused power, W.
        power_w: f64,
    },
}

fn check_next(prev_end_s: Option<f64>, seg: &Segment) -> Result<(), TraceError> {
    seg.check()?;
    match prev_end_s {
        Some(prev_end_s) if prev_end_s != seg.start_s => Err(TraceError::NotContiguous {
            prev_end_s,
            start_s: seg.start_s,
        }),
        _ => Ok(()),
    }
}

/// Below this many segments between the ends of an interval, [`PowerTrace::energy_between`]
/// sums the segments directly instead of differencing the prefix sums, so that short
/// intervals late in a long trace keep full relative precision.
const DIRECT_SUM_MAX: usize = 64;

/// A finite run of contiguous segments, stored, with exact integrals.
///
/// `cum_j[i]` holds the energy of segments `0..i`, so the energy up to any time is one
/// binary search and one multiply-add away.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PowerTrace {
    segments: Vec<Segment>,
    cum_j: Vec<f64>,
}

impl PowerTrace {
    /// An empty trace.
    pub fn new() -> Self {
        PowerTrace {
            segments: Vec::new(),
            cum_j: vec![0.0],
        }
    }

    /// A trace of the given segments, which must be contiguous and in order.
    pub fn from_segments<I: IntoIterator<Item = Segment>>(segments: I) -> Result<Self, TraceError> {
        let mut trace = PowerTrace::new();
        for seg in segments {
            trace.push(seg)?;
        }
        Ok(trace)
    }

    /// Appends a segment; it must start exactly where the last one ended.
    pub fn push(&mut self, seg: Segment) -> Result<(), TraceError> {
        check_next(self.end_s(), &seg)?;
        if self.cum_j.is_empty() {
            self.cum_j.push(0.0);
        }
        let last = self.cum_j.last().copied().unwrap_or(0.0);
        self.cum_j.push(last + seg.energy_j());
        self.segments.push(seg);
        Ok(())
    }

    /// The segments, in time order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether the trace holds no segment.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Start of the first segment, s.
    pub fn start_s(&self) -> Option<f64> {
        self.segments.first().map(|s| s.start_s)
    }

    /// End of the last segment, s.
    pub fn end_s(&self) -> Option<f64> {
        self.segments.last().map(|s| s.end_s)
    }

    /// Energy of the whole trace, in J.
    pub fn total_energy_j(&self) -> f64 {
        self.cum_j.last().copied().unwrap_or(0.0)
    }

    /// Index of the segment holding `t_s` (`[start_s, end_s)`), if any.
    pub fn index_at(&self, t_s: f64) -> Option<usize> {
        let i = self.segments.partition_point(|s| s.end_s <= t_s);
        self.segments.get(i).filter(|s| s.start_s <= t_s).map(|_| i)
    }

    /// The segment holding `t_s`, if any.
    pub fn segment_at(&self, t_s: f64) -> Option<&Segment> {
        self.index_at(t_s).and_then(|i| self.segments.get(i))
    }

    /// Power at `t_s` in W, or `None` outside `[start_s, end_s)`.
    pub fn power_at(&self, t_s: f64) -> Option<f64> {
        self.segment_at(t_s).map(|s| s.power_w)
    }

    /// The exact integral of the power over `[a_s, b_s]`, in J.
    ///
    /// Only the part of the interval the trace covers counts (outside it the power is
    /// unknown and contributes nothing). The integral is signed: `b_s < a_s` gives the
    /// negative of the integral over `[b_s, a_s]`. Short intervals (up to 64 segments)
    /// are summed segment by segment, longer ones from the prefix sums, so the result
    /// is exact up to a few units of rounding of the energies involved.
    pub fn energy_between(&self, a_s: f64, b_s: f64) -> f64 {
        if b_s < a_s {
            return -self.energy_between(b_s, a_s);
        }
        let (Some(start), Some(end)) = (self.start_s(), self.end_s()) else {
            return 0.0;
        };
        let a = a_s.max(start);
        let b = b_s.min(end);
        if b <= a {
            return 0.0;
        }
        let ia = self.segments.partition_point(|s| s.end_s <= a);
        // Last segment starting before b.
        let ib = self
            .segments
            .partition_point(|s| s.start_s < b)
            .saturating_sub(1);
        if ib < ia {
            return 0.0;
        }
        if ib - ia <= DIRECT_SUM_MAX {
            return self.segments[ia..=ib]
                .iter()
                .map(|s| s.energy_within(a, b))
                .sum();
        }
        let sa = &self.segments[ia];
        let sb = &self.segments[ib];
        // Energy up to a and up to b, each from the prefix sum of whole segments.
        let up_to_a = self.cum_j[ia] + sa.power_w * (a - sa.start_s);
        let up_to_b = self.cum_j[ib] + sb.power_w * (b - sb.start_s);
        up_to_b - up_to_a
    }

    /// Mean power over `[a_s, b_s]` in W, if the trace covers all of it and `b_s > a_s`.
    pub fn mean_power(&self, a_s: f64, b_s: f64) -> Option<f64> {
        let (start, end) = (self.start_s()?, self.end_s()?);
        (b_s > a_s && a_s >= start && b_s <= end)
            .then(|| self.energy_between(a_s, b_s) / (b_s - a_s))
    }

    /// A cursor for reading the power at times that mostly move forward.
    pub fn cursor(&self) -> TraceCursor<'_> {
        TraceCursor {
            trace: self,
            index: 0,
        }
    }
}

/// Reads a [`PowerTrace`] at a sequence of times in O(1) amortised per read when the
/// times move forward (any order is correct, backward steps just cost more).
#[derive(Debug, Clone)]
pub struct TraceCursor<'a> {
    trace: &'a PowerTrace,
    index: usize,
}

impl TraceCursor<'_> {
    /// The segment holding `t_s`, if the trace covers it.
    pub fn segment_at(&mut self, t_s: f64) -> Option<&Segment> {
        let segs = self.trace.segments();
        let first = segs.first()?;
        let last = segs.last()?;
        if t_s < first.start_s || t_s >= last.end_s {
            return None;
        }
        self.index = self.index.min(segs.len() - 1);
        while segs[self.index].end_s <= t_s {
            self.index += 1;
        }
        while segs[self.index].start_s > t_s {
            self.index -= 1;
        }
        segs.get(self.index)
    }

    /// Power at `t_s` in W, if the trace covers it.
    pub fn power_at(&mut self, t_s: f64) -> Option<f64> {
        self.segment_at(t_s).map(|s| s.power_w)
    }
}

/// A sliding window over an endless stream of contiguous segments.
///
/// Push segments as they are produced; query the power (or energy) at times that move
/// forward. Each query forgets the segments that end at or before its (start) time, so
/// memory stays bounded however long the stream runs, and a walk at a fixed sample rate
/// costs O(1) amortised per query. Queries before the oldest retained time or at or after
/// the end of the last pushed segment answer `None`: push more (see
/// [`fill_until`](StreamCursor::fill_until)) and ask again.
#[derive(Debug, Clone, Default)]
pub struct StreamCursor {
    window: VecDeque<Segment>,
    last_end_s: Option<f64>,
}

impl StreamCursor {
    /// An empty cursor.
    pub fn new() -> Self {
        StreamCursor::default()
    }

    /// Appends the next segment of the stream; it must start where the last one ended.
    pub fn push(&mut self, seg: Segment) -> Result<(), TraceError> {
        check_next(self.last_end_s, &seg)?;
        self.last_end_s = Some(seg.end_s);
        self.window.push_back(seg);
        Ok(())
    }

    /// Pulls segments from `next` until the window reaches past `t_s` (so that
    /// [`power_at`](StreamCursor::power_at)`(t_s)` can answer). `next` is typically
    /// `|| gpu.next_segment()`, possibly also feeding a logger on the way.
    pub fn fill_until<F: FnMut() -> Segment>(
        &mut self,
        t_s: f64,
        mut next: F,
    ) -> Result<(), TraceError> {
        while self.last_end_s.is_none_or(|end| end <= t_s) {
            self.push(next())?;
        }
        Ok(())
    }

    /// End of the last pushed segment, s (the stream is known up to here).
    pub fn end_s(&self) -> Option<f64> {
        self.last_end_s
    }

    /// Oldest time still retained, s.
    pub fn start_s(&self) -> Option<f64> {
        self.window.front().map(|s| s.start_s)
    }

    /// Number of segments retained.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    /// Whether no segment is retained.
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    fn forget_before(&mut self, t_s: f64) {
        while self.window.front().is_some_and(|s| s.end_s <= t_s) {
            self.window.pop_front();
        }
    }

    /// The segment holding `t_s`, forgetting every segment that ends at or before `t_s`.
    pub fn segment_at(&mut self, t_s: f64) -> Option<&Segment> {
        self.forget_before(t_s);
        self.window.front().filter(|s| s.contains(t_s))
    }

    /// Power at `t_s` in W, forgetting every segment that ends at or before `t_s`.
    pub fn power_at(&mut self, t_s: f64) -> Option<f64> {
        self.segment_at(t_s).map(|s| s.power_w)
    }

    /// The exact energy over `[a_s, b_s]` in J, forgetting every segment that ends at or
    /// before `a_s`; `None` unless `a_s <= b_s` and the window covers the whole interval.
    pub fn energy_between(&mut self, a_s: f64, b_s: f64) -> Option<f64> {
        if a_s.is_nan() || b_s.is_nan() || a_s > b_s {
            return None;
        }
        self.forget_before(a_s);
        let start = self.start_s()?;
        let end = self.last_end_s?;
        if a_s < start || b_s > end {
            return None;
        }
        Some(
            self.window
                .iter()
                .take_while(|s| s.start_s < b_s)
                .map(|s| s.energy_within(a_s, b_s))
                .sum(),
        )
    }

    /// Mean power over `[a_s, b_s]` in W (see [`energy_between`](StreamCursor::energy_between));
    /// `None` also when `b_s <= a_s`.
    pub fn mean_power(&mut self, a_s: f64, b_s: f64) -> Option<f64> {
        if a_s.is_nan() || b_s.is_nan() || b_s <= a_s {
            return None;
        }
        self.energy_between(a_s, b_s).map(|e| e / (b_s - a_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start_s: f64, end_s: f64, power_w: f64) -> Segment {
        Segment {
            start_s,
            end_s,
            power_w,
            util: Util::IDLE,
        }
    }

    #[test]
    fn rejects_gaps_overlaps_and_empty_segments() {
        let mut t = PowerTrace::new();
        t.push(seg(0.0, 1.0, 1.0)).unwrap();
        assert!(matches!(
            t.push(seg(1.5, 2.0, 1.0)),
            Err(TraceError::NotContiguous { .. })
        ));
        assert!(matches!(
            t.push(seg(1.0, 1.0, 1.0)),
            Err(TraceError::BadSegment { .. })
        ));
        assert!(matches!(
            t.push(seg(1.0, 2.0, f64::NAN)),
            Err(TraceError::BadPower { .. })
        ));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn boundaries_belong_to_the_later_segment() {
        let t = PowerTrace::from_segments([seg(0.0, 1.0, 1.0), seg(1.0, 2.0, 2.0)]).unwrap();
        assert_eq!(t.power_at(1.0), Some(2.0));
        assert_eq!(t.power_at(0.0), Some(1.0));
        assert_eq!(t.power_at(2.0), None);
        assert_eq!(t.power_at(-0.1), None);
    }

    #[test]
    fn energy_is_signed_and_clipped_to_the_trace() {
        let t = PowerTrace::from_segments([seg(0.0, 1.0, 1.0), seg(1.0, 2.0, 3.0)]).unwrap();
        assert_eq!(t.energy_between(-5.0, 5.0), 4.0);
        assert_eq!(t.energy_between(0.5, 1.5), 2.0);
        assert_eq!(t.energy_between(1.5, 0.5), -2.0);
        assert_eq!(t.energy_between(3.0, 4.0), 0.0);
        assert_eq!(t.mean_power(0.5, 1.5), Some(2.0));
        assert_eq!(t.mean_power(-0.5, 1.5), None);
    }

    #[test]
    fn long_intervals_use_prefix_sums_and_agree_with_direct_sums() {
        let segs: Vec<Segment> = (0..1000)
            .map(|i| seg(f64::from(i), f64::from(i + 1), f64::from(i % 7) + 0.5))
            .collect();
        let t = PowerTrace::from_segments(segs.clone()).unwrap();
        for &(a, b) in &[(0.25, 999.75), (10.5, 500.125), (3.0, 70.0), (0.0, 1000.0)] {
            let direct: f64 = segs.iter().map(|s| s.energy_within(a, b)).sum();
            let got = t.energy_between(a, b);
            assert!(
                (got - direct).abs() <= 1e-12 * direct,
                "{a}..{b}: {got} vs {direct}"
            );
        }
    }

    #[test]
    fn cursors_walk_both_ways() {
        let t = PowerTrace::from_segments(
            (0..10).map(|i| seg(f64::from(i), f64::from(i + 1), f64::from(i))),
        )
        .unwrap();
        let mut c = t.cursor();
        assert_eq!(c.power_at(7.5), Some(7.0));
        assert_eq!(c.power_at(2.0), Some(2.0));
        assert_eq!(c.power_at(9.999), Some(9.0));
        assert_eq!(c.power_at(10.0), None);
    }

    #[test]
    fn stream_cursor_forgets_the_past() {
        let mut c = StreamCursor::new();
        let mut i = 0.0;
        let mut next = || {
            i += 1.0;
            seg(i - 1.0, i, i)
        };
        c.fill_until(2.5, &mut next).unwrap();
        assert_eq!(c.end_s(), Some(3.0));
        assert_eq!(c.energy_between(0.5, 2.5), Some(0.5 + 2.0 + 1.5));
        assert_eq!(c.power_at(1.0), Some(2.0));
        assert_eq!(c.len(), 2);
        assert_eq!(c.power_at(0.5), None);
        assert_eq!(c.power_at(3.0), None);
        c.fill_until(3.0, &mut next).unwrap();
        assert_eq!(c.power_at(3.0), Some(4.0));
        assert_eq!(c.len(), 1);
    }
}
