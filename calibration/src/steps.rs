//! Power steps in a reference trace: where a level change happened (DVFS
//! switching latency).
//!
//! [`find_step`] fits one step to the samples in a window: the split of the samples into
//! a before and an after part that minimises the sum of squared deviations from the two
//! parts' means (the least-squares change point, exact over every split, O(n) with running
//! sums). The step's instant is then placed where the trace, linearly interpolated
//! between samples, first crosses the midpoint of the two levels after the last sample of
//! the before part's level band: a step that an input filter smooths over a few samples
//! is timed at its half-way point, as a rise time is read. The step is reported only if
//! its size is at least `min_step_w` and at least `z` standard errors of the two means'
//! difference (the residual scatter pooled), so that noise in a flat window is not called
//! a step.

use crate::ParamError;

/// A step found in a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// When the trace crossed half-way between the two levels, s.
    pub time_s: f64,
    /// Mean power before, W.
    pub before_w: f64,
    /// Mean power after, W.
    pub after_w: f64,
    /// The samples' scatter about the two levels, W (RMS).
    pub rms_w: f64,
    /// The step's size in standard errors of the difference of the two means.
    pub z: f64,
}

/// The least-squares step among `times_s` / `power_w` (in time order) within `[from_s,
/// to_s)`, if one of at least `min_step_w` and `min_z` standard errors is there.
///
/// # Errors
///
/// Mismatched lengths, values that are not finite, times out of order, or a window with
/// fewer than four samples.
pub fn find_step(
    times_s: &[f64],
    power_w: &[f64],
    from_s: f64,
    to_s: f64,
    min_step_w: f64,
    min_z: f64,
) -> Result<Option<Step>, ParamError> {
    if times_s.len() != power_w.len() {
        return Err(ParamError::new(
            "power_w.len()",
            power_w.len() as f64,
            "must equal times_s.len()",
        ));
    }
    let a = times_s.partition_point(|&t| t < from_s);
    let b = times_s.partition_point(|&t| t < to_s);
    let (t, p) = (&times_s[a..b], &power_w[a..b]);
    if let Some(&bad) = t.iter().chain(p).find(|v| !v.is_finite()) {
        return Err(ParamError::new("samples", bad, "must be finite"));
    }
    if t.windows(2).any(|w| w[1] < w[0]) {
        return Err(ParamError::new(
            "times_s",
            f64::NAN,
            "must be in time order",
        ));
    }
    let n = p.len();
    if n < 4 {
        return Err(ParamError::new(
            "window",
            n as f64,
            "needs at least four samples",
        ));
    }
    // Split k: before = p[..k], after = p[k..]; SSE from running sums.
    let total: f64 = p.iter().sum();
    let total2: f64 = p.iter().map(|v| v * v).sum();
    let (mut s, mut s2) = (0.0, 0.0);
    let mut best: Option<(usize, f64)> = None;
    for k in 1..n {
        s += p[k - 1];
        s2 += p[k - 1] * p[k - 1];
        if k < 2 || n - k < 2 {
            continue;
        }
        let (nb, na) = (k as f64, (n - k) as f64);
        let sse = (s2 - s * s / nb) + ((total2 - s2) - (total - s) * (total - s) / na);
        if best.is_none_or(|(_, e)| sse < e) {
            best = Some((k, sse));
        }
    }
    let Some((k, sse)) = best else {
        return Ok(None);
    };
    let before = p[..k].iter().sum::<f64>() / k as f64;
    let after = p[k..].iter().sum::<f64>() / (n - k) as f64;
    let var = (sse / (n as f64 - 2.0)).max(0.0);
    let se = (var * (1.0 / k as f64 + 1.0 / (n - k) as f64)).sqrt();
    let size = (after - before).abs();
    let z = if se > 0.0 { size / se } else { f64::INFINITY };
    if size < min_step_w || z < min_z {
        return Ok(None);
    }
    // Half-way crossing: the first after the before part's last sample within its band,
    // searched from a little before the split (a filtered edge starts before it).
    let mid = 0.5 * (before + after);
    let up = after > before;
    let above = |v: f64| if up { v >= mid } else { v <= mid };
    let start = (0..k).rev().find(|&i| !above(p[i])).unwrap_or(0);
    let time_s = (start..n - 1)
        .find(|&i| !above(p[i]) && above(p[i + 1]))
        .map(|i| t[i] + (t[i + 1] - t[i]) * (mid - p[i]) / (p[i + 1] - p[i]))
        .unwrap_or(t[k]);
    Ok(Some(Step {
        time_s,
        before_w: before,
        after_w: after,
        rms_w: var.sqrt(),
        z,
    }))
}
