//! Clock alignment against synthetic data with known truth.
//!
//! The issue's requirement: device↔host alignment ≤ 5 µs RMS with 50 ppm clock error and
//! 20 µs RMS trigger jitter.

mod common;

use common::Rng;
use railtrace_calibration::align::{fit_brackets, fit_pairs, AlignError, Bracket, LinearMap};

/// The true link: host = HOST0 + (1 + 50 ppm)·(device − DEV0).
const DEV0: f64 = 12_345.678_9;
const HOST0: f64 = 98_765.432_1;
const SLOPE: f64 = 1.0 + 50e-6;

fn truth(x: f64) -> f64 {
    HOST0 + SLOPE * (x - DEV0)
}

/// RMS of `map − truth` over `[lo, hi]` (1001 points): the error the requirement means.
fn rms_error(map: &LinearMap, truth: impl Fn(f64) -> f64, lo: f64, hi: f64) -> f64 {
    let ss: f64 = (0..=1000)
        .map(|i| {
            let x = lo + (hi - lo) * f64::from(i) / 1000.0;
            (map.apply(x) - truth(x)).powi(2)
        })
        .sum();
    (ss / 1001.0).sqrt()
}

/// Ordinary least squares by the textbook formulas (centred on the data): the slow,
/// obvious reference.
fn ols(pairs: &[(f64, f64)]) -> LinearMap {
    let n = pairs.len() as f64;
    let mx = pairs.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pairs.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = pairs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = pairs.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    LinearMap {
        x0: mx,
        offset: my,
        slope: sxy / sxx,
    }
}

/// Trigger edges over ~60 s: x = device time of each edge (10 ns ticks of a 100 MHz
/// timer), y = host time that drove it + 20 µs RMS jitter; 3 % gross outliers (half a
/// mis-paired edge, ± one edge period; half a ±0.5-10 ms glitch). Returns the pairs and
/// the true outlier indices.
fn edges(rng: &mut Rng, n: usize) -> (Vec<(f64, f64)>, Vec<usize>) {
    let period = 60.0 / n as f64;
    let mut pairs: Vec<(f64, f64)> = (0..n)
        .map(|i| {
            let x = DEV0 + 1.5 + period * (i as f64 + rng.range(0.0, 0.5));
            let x = (x * 1e8).floor() / 1e8;
            (x, truth(x) + 20e-6 * rng.normal())
        })
        .collect();
    let n_out = (0.03 * n as f64).round() as usize;
    let mut idx: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut idx);
    let mut out = idx[..n_out].to_vec();
    out.sort_unstable();
    for (k, &i) in out.iter().enumerate() {
        let sign = if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
        pairs[i].1 += if k % 2 == 0 {
            sign * period
        } else {
            sign * rng.range(0.5e-3, 10e-3)
        };
    }
    (pairs, out)
}

/// The requirement holds as an RMS over realizations for 100-300 edges, and in every
/// realization from 200 edges on. Why not in every realization at 100: even the best
/// unbiased line (OLS on the true inliers, which is what the fit returns) has a squared
/// span-RMS error of `σ²/n·(Z₁² + Z₂²)` (offset and slope terms, `Z` standard normal),
/// so with σ = 20 µs and n = 97 inliers it exceeds (5 µs)² with probability
/// `exp(−25·97/800) ≈ 5 %`; at n = 200 that is 0.2 %, at 300 1e-4.
#[test]
fn trigger_edges_meet_5_us_with_outliers() {
    let mut worst: f64 = 0.0;
    for n in [100, 150, 200, 250, 300] {
        let mut errs = Vec::new();
        for seed in 1..=20u64 {
            let mut rng = Rng::new(seed * 1000 + n as u64);
            let (pairs, true_out) = edges(&mut rng, n);
            let fit = fit_pairs(&pairs).unwrap();
            let lo = pairs.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
            let hi = pairs.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
            let err = rms_error(&fit.map, truth, lo, hi);
            errs.push(err);
            if n >= 200 {
                assert!(err <= 5e-6, "n={n} seed={seed}: {:.2} µs", err * 1e6);
            }
            // Every gross outlier (≥ 25 σ) is found, and no inlier is flagged: a 4.685 σ
            // cut flags a normal inlier with probability 3e-6.
            assert_eq!(fit.outliers, true_out, "n={n} seed={seed}");
            assert_eq!(fit.inliers, n - true_out.len());
            // Hence the result is the ordinary least-squares line of the true inliers;
            // both are computed in centred form, so they agree to rounding (1e-9 s is
            // ~1e5 ulp of the ~1e5 s times).
            let inl: Vec<(f64, f64)> = (0..n)
                .filter(|i| !true_out.contains(i))
                .map(|i| pairs[i])
                .collect();
            let reference = ols(&inl);
            for x in [lo, 0.5 * (lo + hi), hi] {
                assert!(
                    (fit.map.apply(x) - reference.apply(x)).abs() < 1e-9,
                    "n={n} seed={seed} x={x}"
                );
            }
            // The reported RMS is that of the inliers' residuals: ~20 µs.
            assert!(fit.rms_s > 15e-6 && fit.rms_s < 25e-6, "{}", fit.rms_s);
            assert!((fit.map.slope - SLOPE).abs() < 2e-6);
        }
        let rms = (errs.iter().map(|e| e * e).sum::<f64>() / errs.len() as f64).sqrt();
        let max = errs.iter().copied().fold(0.0, f64::max);
        let over = errs.iter().filter(|&&e| e > 5e-6).count();
        worst = worst.max(max);
        // The requirement, as an RMS over the realizations (expected σ√(2/n)).
        assert!(rms <= 5e-6, "n={n}: {:.2} µs", rms * 1e6);
        println!(
            "edges n={n}: alignment error RMS over 20 seeds {:.2} µs (σ√(2/n) = {:.2} µs), \
             max {:.2} µs, {over}/20 above 5 µs",
            rms * 1e6,
            20.0 * (2.0 / n as f64).sqrt(),
            max * 1e6,
        );
    }
    println!("edges: worst {:.2} µs (requirement 5 µs)", worst * 1e6);
}

/// GPU timestamp reads bracketed by host clock reads. The GPU clock runs 50 ppm slow
/// against the host, ticks at 100 MHz. A read takes 2 µs + U(0, 50 µs).
fn brackets(rng: &mut Rng, n: usize, latch_anywhere: bool) -> Vec<Bracket> {
    let gpu = |t: f64| ((7_000.0 + (1.0 - 50e-6) * (t - 50_000.0)) * 1e8).floor() / 1e8;
    (0..n)
        .map(|i| {
            let issue = 50_000.0 + 60.0 * (i as f64 + rng.uniform()) / n as f64;
            let mut latency = 2e-6 + rng.range(0.0, 50e-6);
            // 2 % of reads are pre-empted for 0.1-2 ms before or after the latch.
            let (mut pre, mut post) = (0.0, 0.0);
            if rng.uniform() < 0.02 {
                let d = rng.range(0.1e-3, 2e-3);
                if rng.uniform() < 0.5 {
                    pre = d;
                } else {
                    post = d;
                }
                latency += d;
            }
            let fraction = if latch_anywhere { rng.uniform() } else { 0.5 };
            let latch = issue + pre + fraction * (latency - pre - post);
            Bracket {
                before: issue,
                reading: gpu(latch),
                after: issue + latency,
            }
        })
        .collect()
}

fn gpu_to_host_truth(x: f64) -> f64 {
    50_000.0 + (x - 7_000.0) / (1.0 - 50e-6)
}

#[test]
fn bracketed_reads_meet_5_us() {
    for latch_anywhere in [false, true] {
        for keep in [0.2, 1.0] {
            let mut errs = Vec::new();
            for seed in 1..=10u64 {
                let mut rng = Rng::new(seed + 77);
                let reads = brackets(&mut rng, 500, latch_anywhere);
                let fit = fit_brackets(&reads, keep).unwrap();
                assert_eq!(fit.used.len(), (keep * 500.0_f64).ceil() as usize);
                assert_eq!(fit.residuals.len(), 500);
                // Reference: the tightest brackets by plain sorting, midpoints, then the
                // robust fit must equal OLS on them minus the flagged ones, and OLS on
                // all kept when nothing is flagged.
                let mut by_width: Vec<usize> = (0..500).collect();
                by_width.sort_by(|&i, &j| {
                    let (a, b) = (&reads[i], &reads[j]);
                    (a.after - a.before).total_cmp(&(b.after - b.before))
                });
                let mut kept = by_width[..fit.used.len()].to_vec();
                kept.sort_unstable();
                assert_eq!(kept, fit.used);
                let inl: Vec<(f64, f64)> = kept
                    .iter()
                    .filter(|i| !fit.outliers.contains(i))
                    .map(|&i| (reads[i].reading, 0.5 * (reads[i].before + reads[i].after)))
                    .collect();
                let reference = ols(&inl);
                let (lo, hi) = (7_000.0, 7_060.0);
                assert!((fit.map.apply(lo) - reference.apply(lo)).abs() < 1e-9);
                assert!((fit.map.apply(hi) - reference.apply(hi)).abs() < 1e-9);
                if keep == 0.2 {
                    // The tightest 20 % are never pre-empted ones.
                    assert!(fit.outliers.is_empty(), "{:?}", fit.outliers);
                }
                let err = rms_error(&fit.map, gpu_to_host_truth, lo, hi);
                assert!(err <= 5e-6, "keep={keep}: {:.2} µs", err * 1e6);
                errs.push((err, fit.rms_s));
            }
            let mean = errs.iter().map(|e| e.0).sum::<f64>() / errs.len() as f64;
            let max = errs.iter().map(|e| e.0).fold(0.0, f64::max);
            let resid = errs.iter().map(|e| e.1).sum::<f64>() / errs.len() as f64;
            println!(
                "brackets latch {} keep={keep}: alignment RMS error mean {:.3} µs, max {:.3} µs; \
                 per-read residual RMS {:.2} µs",
                if latch_anywhere { "anywhere" } else { "mid" },
                mean * 1e6,
                max * 1e6,
                resid * 1e6
            );
        }
    }
}

#[test]
fn exact_data_give_the_exact_map_and_inverse_round_trips() {
    let pairs: Vec<(f64, f64)> = (0..20)
        .map(|i| {
            let x = 1e4 + f64::from(i);
            (x, truth(x))
        })
        .collect();
    let fit = fit_pairs(&pairs).unwrap();
    assert!(fit.outliers.is_empty());
    assert!((fit.map.slope - SLOPE).abs() < 1e-12);
    for x in [1e4, 1.5e4] {
        assert!((fit.map.apply(x) - truth(x)).abs() < 1e-9);
        assert!((fit.map.inverse(fit.map.apply(x)) - x).abs() < 1e-9);
    }
    // Two points suffice.
    let two = fit_pairs(&pairs[..2]).unwrap();
    assert!((two.map.apply(1e4 + 5.0) - truth(1e4 + 5.0)).abs() < 1e-9);
}

#[test]
fn many_points_use_the_fast_start() {
    // Above 1000 points the start pairs points n/2 apart; the result is still the OLS
    // line of the inliers.
    let mut rng = Rng::new(5);
    let (pairs, true_out) = edges(&mut rng, 3000);
    let fit = fit_pairs(&pairs).unwrap();
    assert_eq!(fit.outliers, true_out);
    let err = rms_error(&fit.map, truth, DEV0 + 1.5, DEV0 + 61.5);
    assert!(err < 1.5e-6, "{err}");
}

#[test]
fn errors() {
    assert_eq!(fit_pairs(&[(1.0, 2.0)]), Err(AlignError::TooFew { got: 1 }));
    assert_eq!(
        fit_pairs(&[(1.0, 2.0), (f64::NAN, 3.0)]),
        Err(AlignError::NonFinite { index: 1 })
    );
    assert_eq!(
        fit_pairs(&[(1.0, 2.0), (1.0, 3.0), (1.0, 4.0)]),
        Err(AlignError::DegenerateX)
    );
    let b = Bracket {
        before: 1.0,
        reading: 5.0,
        after: 1.1,
    };
    assert_eq!(
        fit_brackets(&[b, b], 0.0),
        Err(AlignError::BadKeep { keep: 0.0 })
    );
    assert_eq!(
        fit_brackets(&[b, b], f64::NAN).unwrap_err().to_string(),
        "keep = NaN: must be in (0, 1]"
    );
    let bad = Bracket {
        before: 2.0,
        reading: 5.0,
        after: 1.0,
    };
    assert_eq!(
        fit_brackets(&[b, bad], 1.0),
        Err(AlignError::BadBracket { index: 1 })
    );
    assert_eq!(fit_brackets(&[b], 1.0), Err(AlignError::TooFew { got: 1 }));
}
