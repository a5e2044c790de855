//! Execution-time binning: which executions of a kernel to stitch together.
//!
//! - [`fixed_margin`] is FinGraV's: keep executions within ±margin (2-5 %) of the
//!   median duration.
//! - [`cluster`] is in the spirit of STEM+ROOT: recursive splitting with no preset
//!   number of clusters. A group (sorted) is split at its best two-means (Otsu) point,
//!   computed on values winsorised at the group's median ± 10 robust standard
//!   deviations (so that a few far outliers cannot choose the split). The split is
//!   kept when both sides hold at least `min_size` members and their medians differ by
//!   at least [`SEPARATION`] pooled robust standard deviations (1.4826 × MAD of each
//!   side, pooled as the root mean square of the two) and by at least [`MIN_GAP`] of the
//!   group's median; both sides are then split again
//!   in turn. The best split is sought over all points and then checked for size,
//!   rather than sought among the sizes allowed: a split forced to respect `min_size`
//!   would cut through a mode instead of between modes. So a few outliers (fewer than
//!   `min_size`) stay with their neighbours, and a group whose best split would cut
//!   them off stays whole.
//!
//! Why these constants: splitting a single normal sample at its two-means point gives
//! sides whose medians differ by about 2.3 pooled robust SDs (2.8 for a uniform, about
//! 3 for an exponential tail; in simulation, at most 4.7 for a normal group of 40 and
//! 3.3 for one of 100), so 5 does not split unimodal groups, while two modes 8 % apart
//! with 1 % spread (the twin's default kernel) sit about 7.5 apart. Modes closer than
//! about 5 standard deviations overlap too much to be told apart by duration alone
//! anyway. The relative floor [`MIN_GAP`] is for real clocks: an H200's `%globaltimer`
//! stamps a ~112 µs kernel's executions in steps of 32 ns, so a group can hold a few
//! exact values, each side's MAD is zero and any split looks infinitely significant
//! (one real run fell into 5 clusters between 111.6 and 112.4 µs and kept 97 of 300).
//! Executions within 1 % of each other are one behaviour for the stitched profile: the
//! smear is 1 µs on a 100 µs kernel, a tenth of a 10 µs bin, and FinGraV's own margin
//! (2-5 %) keeps them together. Non-finite durations are ignored by both functions.

use crate::stats::{mad_sigma, mean_std, median, median_sorted};

/// Default separation for [`cluster`], in pooled robust standard deviations.
pub const SEPARATION: f64 = 5.0;

/// The least difference of two clusters' medians, relative to their group's median.
pub const MIN_GAP: f64 = 0.01;

/// Winsorising half-width for the split search, in robust standard deviations.
const CLIP: f64 = 10.0;

/// The executions kept by [`fixed_margin`].
#[derive(Debug, Clone, PartialEq)]
pub struct Bin {
    /// Indices of the kept durations, ascending.
    pub indices: Vec<usize>,
    /// The median duration, s (NaN if there are no finite durations).
    pub centre: f64,
    /// `centre · (1 − margin)`, s.
    pub lo: f64,
    /// `centre · (1 + margin)`, s.
    pub hi: f64,
}

/// FinGraV's binning: keeps the durations within `[median·(1 − margin),
/// median·(1 + margin)]` (e.g. `margin` 0.02-0.05). A negative or NaN margin keeps
/// nothing.
pub fn fixed_margin(durations: &[f64], margin: f64) -> Bin {
    let centre = median(durations);
    let (lo, hi) = (centre * (1.0 - margin), centre * (1.0 + margin));
    let indices = (0..durations.len())
        .filter(|&i| durations[i] >= lo && durations[i] <= hi)
        .collect();
    Bin {
        indices,
        centre,
        lo,
        hi,
    }
}

/// One cluster of durations.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Shortest member, s.
    pub lo: f64,
    /// Longest member, s.
    pub hi: f64,
    /// Indices of the members, ascending.
    pub indices: Vec<usize>,
    /// Mean duration, s.
    pub mean: f64,
    /// Sample standard deviation, s (NaN for a single member).
    pub std: f64,
}

/// The result of [`cluster`].
#[derive(Debug, Clone, PartialEq)]
pub struct Clusters {
    /// The clusters, by increasing duration; they do not overlap.
    pub clusters: Vec<Cluster>,
    /// Index in `clusters` of the one with the most members (the shorter one on a tie);
    /// `None` when there are no finite durations.
    pub dominant: Option<usize>,
}

impl Clusters {
    /// The dominant cluster, if any.
    pub fn dominant(&self) -> Option<&Cluster> {
        self.dominant.map(|i| &self.clusters[i])
    }
}

/// Clusters durations by recursive splitting with the default [`SEPARATION`] (see the
/// [module documentation](self)). `min_size` (treated as at least 1) is the smallest
/// cluster a split may create.
pub fn cluster(durations: &[f64], min_size: usize) -> Clusters {
    cluster_with(durations, min_size, SEPARATION)
}

/// [`cluster`] with a chosen separation threshold, in pooled robust standard deviations.
pub fn cluster_with(durations: &[f64], min_size: usize, separation: f64) -> Clusters {
    let min_size = min_size.max(1);
    let mut order: Vec<usize> = (0..durations.len())
        .filter(|&i| durations[i].is_finite())
        .collect();
    order.sort_by(|&i, &j| durations[i].total_cmp(&durations[j]));
    let sorted: Vec<f64> = order.iter().map(|&i| durations[i]).collect();

    // Groups are ranges of `sorted`; split until no split is significant.
    let mut done: Vec<(usize, usize)> = Vec::new();
    let mut todo = vec![(0, sorted.len())];
    while let Some((a, b)) = todo.pop() {
        if b == a {
            continue;
        }
        match split(&sorted[a..b], min_size, separation) {
            Some(k) => {
                todo.push((a, a + k));
                todo.push((a + k, b));
            }
            None => done.push((a, b)),
        }
    }
    done.sort_unstable();
    let clusters: Vec<Cluster> = done
        .iter()
        .map(|&(a, b)| {
            let mut indices = order[a..b].to_vec();
            indices.sort_unstable();
            let (mean, std) = mean_std(&sorted[a..b]);
            Cluster {
                lo: sorted[a],
                hi: sorted[b - 1],
                indices,
                mean,
                std,
            }
        })
        .collect();
    let mut dominant: Option<usize> = None;
    for (i, c) in clusters.iter().enumerate() {
        if dominant.is_none_or(|d| c.indices.len() > clusters[d].indices.len()) {
            dominant = Some(i);
        }
    }
    Clusters { clusters, dominant }
}

/// The split point `k` (left side `x[..k]`) of a sorted group, if a significant one
/// exists.
fn split(x: &[f64], min_size: usize, separation: f64) -> Option<usize> {
    let n = x.len();
    if n < 2 * min_size {
        return None;
    }
    // Winsorise around the median (centred values keep the sums accurate).
    let m = median_sorted(x);
    let s = mad_sigma(x);
    let half = if s > 0.0 { CLIP * s } else { f64::INFINITY };
    let c: Vec<f64> = x.iter().map(|v| (v - m).clamp(-half, half)).collect();
    let (mut s1, mut s2) = (vec![0.0; n + 1], vec![0.0; n + 1]);
    for i in 0..n {
        s1[i + 1] = s1[i] + c[i];
        s2[i + 1] = s2[i] + c[i] * c[i];
    }
    // Two-means: least within-group sum of squares.
    let within = |k: usize| {
        let (l, r) = (k as f64, (n - k) as f64);
        let (sl, sr) = (s1[k], s1[n] - s1[k]);
        (s2[k] - sl * sl / l) + (s2[n] - s2[k] - sr * sr / r)
    };
    // The best split over all points, then the size check: a split forced to respect
    // `min_size` would cut through a mode instead of between modes.
    let k = (1..n).min_by(|&i, &j| within(i).total_cmp(&within(j)))?;
    if k < min_size || n - k < min_size {
        return None;
    }
    let (left, right) = (&x[..k], &x[k..]);
    let gap = median_sorted(right) - median_sorted(left);
    let (sl, sr) = (mad_sigma(left), mad_sigma(right));
    let pooled = (0.5 * (sl * sl + sr * sr)).sqrt();
    // Equal medians with zero spread give NaN: no split.
    (gap / pooled >= separation && gap >= MIN_GAP * m.abs()).then_some(k)
}
