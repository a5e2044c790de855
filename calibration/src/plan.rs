//! Run planning, as STEM derives it from the central limit theorem.
//!
//! For a bin with standard deviation `s_b` and mean `m_b`, the mean of `n` independent
//! samples is within `E·|m_b|` of the truth with two-sided probability `c` once
//! `n ≥ (z·s_b / (E·|m_b|))²`, `z` the two-sided normal quantile of `c`.
//!
//! Choices made here (see `README.md`):
//!
//! - **Which bins count.** The *considered* bins are those with at least one reading
//!   whose `|mean|` is at least [`PEAK_FRACTION`] (10 %) of the largest `|mean|`: a
//!   relative error near zero power would demand unbounded runs and means nothing for
//!   energy.
//! - **Simultaneous, not per bin.** The promise is that *every* considered bin is within
//!   `E` at once, so `z` is taken at the Bonferroni level `1 − (1 − c)/B` for `B`
//!   considered bins. Were each bin given exactly its per-bin need, the chance that all
//!   `B` hold would be about `c^B` (0.36 for `c = 0.95`, `B = 20`), far below the
//!   promise; in the tests (30 bins alike, 30-run pilot) the per-bin `z` held in 16 of
//!   20 repetitions, short of the 90 % asked. Bonferroni is tight for independent bins
//!   (`(1 − α/B)^B ≈ 1 − α`), conservative only by their correlation, and costs a factor
//!   `(z_B / z)²` in runs (2.4 for `B = 20` at 0.95).
//! - **The max over bins of a noisy pilot.** Each bin's need comes from its pilot
//!   standard deviation (about ±13 % from 30 normal runs, more for skewed noise), and the
//!   plan is their max, so with many similar bins the plan is biased upwards: in the
//!   tests a 30-run pilot planned 913 runs on average where 393 suffice (the promise
//!   then held in 20 of 20). A plan is a safe budget; to stop as soon as the data allow,
//!   use [`reached`] (keep-running mode) with the plan as a cap.
//! - **Runs versus samples.** `runs` counts samples per bin, which is runs when each
//!   run gives one sample per bin (a rig trace, or a run-averaged logger profile). When
//!   runs give a bin fewer samples (a stitched logger), see [`Plan::runs_at_yield`].

use crate::stats::normal_quantile;
use crate::stitch::ProfileBin;
use crate::ParamError;

/// Bins whose `|mean|` is below this fraction of the peak `|mean|` are not considered.
pub const PEAK_FRACTION: f64 = 0.1;

/// A run plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Samples needed in every considered bin (runs, when a run gives one sample per
    /// bin); at least 2.
    pub runs: u64,
    /// Index (into the pilot) of the bin that needs the most.
    pub worst_bin: usize,
    /// Samples needed per pilot bin; `None` for bins not considered.
    pub per_bin: Vec<Option<u64>>,
    /// The normal quantile used (Bonferroni-adjusted over the considered bins).
    pub z: f64,
}

impl Plan {
    /// Runs needed when a run gives a bin fewer (or more) than one sample: with a pilot
    /// of `pilot_runs` runs, bin `b` got `pilot[b].n / pilot_runs` samples per run, so it
    /// needs `ceil(per_bin[b] · pilot_runs / pilot[b].n)` runs; the max over bins, at
    /// least 2. `pilot` must be the profile the plan was made from.
    pub fn runs_at_yield(&self, pilot: &[ProfileBin], pilot_runs: u64) -> u64 {
        self.per_bin
            .iter()
            .zip(pilot)
            .filter_map(|(need, b)| need.map(|need| (need, b.n as f64)))
            .map(|(need, n)| (need as f64 * pilot_runs as f64 / n).ceil() as u64)
            .fold(2, u64::max)
    }
}

/// Samples a single bin needs: `ceil((z·std / (rel_err·|mean|))²)`; saturates at
/// `u64::MAX`, and is 0 for `std = 0`. NaN input gives 0.
pub fn samples_needed(std: f64, mean: f64, rel_err: f64, z: f64) -> u64 {
    let n = (z * std / (rel_err * mean.abs())).powi(2).ceil();
    // `as` saturates (and maps NaN to 0).
    n as u64
}

/// Indices of the considered bins of a profile: at least one reading and `|mean|` at
/// least [`PEAK_FRACTION`] of the peak `|mean|`.
pub fn considered_bins(profile: &[ProfileBin]) -> Vec<usize> {
    let peak = profile
        .iter()
        .filter(|b| b.n >= 1 && b.mean_w.is_finite())
        .map(|b| b.mean_w.abs())
        .fold(0.0, f64::max);
    if peak <= 0.0 {
        return Vec::new();
    }
    (0..profile.len())
        .filter(|&i| {
            let b = &profile[i];
            b.n >= 1 && b.mean_w.is_finite() && b.mean_w.abs() >= PEAK_FRACTION * peak
        })
        .collect()
}

/// Plans the number of runs (samples per bin) for a relative error `target_rel_err`
/// (e.g. 0.01) in every considered bin at once, with probability `confidence` (e.g.
/// 0.95), from a pilot profile (see the [module documentation](self)).
///
/// # Errors
///
/// `target_rel_err` not finite and > 0, `confidence` not in `(0, 1)`, no considered
/// bin, or a considered bin with fewer than 2 readings (the pilot is too small).
pub fn runs_needed(
    pilot: &[ProfileBin],
    target_rel_err: f64,
    confidence: f64,
) -> Result<Plan, ParamError> {
    if !(target_rel_err.is_finite() && target_rel_err > 0.0) {
        return Err(ParamError::new(
            "target_rel_err",
            target_rel_err,
            "must be finite and > 0",
        ));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(ParamError::new(
            "confidence",
            confidence,
            "must be in (0, 1)",
        ));
    }
    let considered = considered_bins(pilot);
    if considered.is_empty() {
        return Err(ParamError::new(
            "pilot",
            pilot.len() as f64,
            "no bin with readings and a non-zero mean",
        ));
    }
    if let Some(&i) = considered.iter().find(|&&i| pilot[i].n < 2) {
        return Err(ParamError::new(
            "pilot[].n",
            pilot[i].n as f64,
            "a considered bin needs at least 2 readings",
        ));
    }
    let bins = considered.len() as f64;
    let z = -normal_quantile(0.5 * (1.0 - confidence) / bins);
    let mut per_bin = vec![None; pilot.len()];
    let (mut runs, mut worst_bin) = (0, considered[0]);
    for &i in &considered {
        let need = samples_needed(pilot[i].std_w, pilot[i].mean_w, target_rel_err, z);
        per_bin[i] = Some(need);
        if need > runs {
            runs = need;
            worst_bin = i;
        }
    }
    Ok(Plan {
        runs: runs.max(2),
        worst_bin,
        per_bin,
        z,
    })
}

/// The keep-running test: true when every considered bin has `ci_half_w ≤ target_rel_err
/// · |mean_w|`, and no bin of the profile is empty. False for an empty profile.
///
/// The intervals are those the profile was built with: for the simultaneous promise of
/// [`runs_needed`], build it at [`simultaneous_confidence`].
pub fn reached(profile: &[ProfileBin], target_rel_err: f64) -> bool {
    let considered = considered_bins(profile);
    !considered.is_empty()
        && profile.iter().all(|b| b.n > 0)
        && considered.iter().all(|&i| {
            let b = &profile[i];
            b.ci_half_w <= target_rel_err * b.mean_w.abs()
        })
}

/// The per-bin confidence that makes `bins` intervals hold together with probability
/// `confidence` (Bonferroni): `1 − (1 − confidence) / bins`.
pub fn simultaneous_confidence(confidence: f64, bins: usize) -> f64 {
    1.0 - (1.0 - confidence) / bins.max(1) as f64
}

/// The levels of a profile's phases as a logger's readings tell them, with the boundaries
/// known ([`phase_levels`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseLevels {
    /// Each phase's level, W of the reference.
    pub level_w: Vec<f64>,
    /// Its standard deviation from the readings' standard errors, W: it falls as one over
    /// the square root of the readings.
    pub sd_w: Vec<f64>,
    /// The readings' scatter about the fit against their standard errors,
    /// `√(χ²/(N − k))` (about 1 where the phases and the logger's model explain them;
    /// NaN with no degree of freedom left).
    pub scale: f64,
    /// The degrees of freedom `scale` rests on, `N − k`.
    pub dof: usize,
}

/// Fits a stitched logger profile with the power constant over each of `phases`
/// (`[start, end)` s on the profile's time axis, as a reference resolves them), `idle_w`
/// outside them, seen through `response` delayed by `delay_s` and scaled by `gain`, with
/// a free offset: weighted least squares on the bins with readings, each bin's row the
/// mean over it of the response to each phase (as [`crate::deconvolve::kernel`] makes
/// its taps: readings spread through their bins). The levels' standard deviations are
/// the square roots of the diagonal of `(AᵀWA)⁻¹`: what the readings alone tell of each
/// level when every step is where the reference puts it, the precision a correction that
/// finds those steps reaches. `None` without standard errors, or where the phases are not
/// all seen (a singular system).
pub fn phase_levels(
    profile: &crate::deconvolve::Profile,
    response: &crate::deconvolve::Response<'_>,
    delay_s: f64,
    gain: f64,
    idle_w: f64,
    phases: &[(f64, f64)],
) -> Option<PhaseLevels> {
    use crate::deconvolve::mean_step_response;
    let se = profile.se_w.as_ref()?;
    let k = phases.len() + 1; // the phases, then the offset
    let (mut normal, mut rhs) = (vec![0.0; k * k], vec![0.0; k]);
    let mut rows = Vec::new();
    for (i, (&y, &s)) in profile.power_w.iter().zip(se).enumerate() {
        if !(y.is_finite() && s.is_finite() && s > 0.0) {
            continue;
        }
        let lo = profile.t0_s + i as f64 * profile.dt_s;
        let hi = lo + profile.dt_s;
        let seen = |t: f64| mean_step_response(response, lo - t - delay_s, hi - t - delay_s);
        let mut a: Vec<f64> = (phases.iter())
            .map(|&(start, end)| gain * (seen(start) - seen(end)))
            .collect();
        a.push(1.0);
        // The readings less what the idle level gives them everywhere.
        let y = y - gain * idle_w;
        let w = 1.0 / (s * s);
        for r in 0..k {
            rhs[r] += w * a[r] * y;
            for c in 0..k {
                normal[r * k + c] += w * a[r] * a[c];
            }
        }
        rows.push((a, y, w));
    }
    let cov = crate::power::invert(&normal, k)?;
    let x: Vec<f64> = (0..k)
        .map(|r| (0..k).map(|c| cov[r * k + c] * rhs[c]).sum())
        .collect();
    let chi2: f64 = (rows.iter())
        .map(|(a, y, w)| w * (y - a.iter().zip(&x).map(|(a, x)| a * x).sum::<f64>()).powi(2))
        .sum();
    let dof = rows.len().saturating_sub(k);
    let sd_w: Vec<f64> = (0..phases.len()).map(|j| cov[j * k + j].sqrt()).collect();
    if sd_w.iter().any(|s| !s.is_finite()) {
        return None;
    }
    Some(PhaseLevels {
        level_w: x[..phases.len()].iter().map(|v| v + idle_w).collect(),
        sd_w,
        scale: if dof > 0 {
            (chi2 / dof as f64).sqrt()
        } else {
            f64::NAN
        },
        dof,
    })
}
