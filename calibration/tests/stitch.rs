//! Stitching, profiles, energies and SSE/SSP against slow references.

mod common;

use common::Rng;
use railtrace_calibration::stats::two_sided_t;
use railtrace_calibration::stitch::{
    assign, classify, energy, energy_trapezoid, estimate_settling, profile, Execution, Policy,
    ProfileAccumulator, ProfileBin, Reading, Regime, Stitched, TrainPosition, WindowEnergies,
};

/// Back-to-back trains of ~200 µs executions with random gaps, and logger-like readings
/// every ~1 ms with jitter, over ~0.5 s.
fn timeline(rng: &mut Rng) -> (Vec<Execution>, Vec<Reading>) {
    let mut execs = Vec::new();
    let mut t = 10.0;
    while t < 10.5 {
        t += rng.range(0.0, 2e-3); // random delay
        for _ in 0..1 + rng.below(8) {
            let d = 200e-6 * (1.0 + 0.02 * rng.normal());
            execs.push(Execution {
                start: t,
                end: t + d,
            });
            t += d + 5e-6;
        }
    }
    let mut readings = Vec::new();
    let mut r = 9.999;
    while r < 10.51 {
        readings.push(Reading {
            time: r,
            power_w: 300.0 + 100.0 * rng.normal(),
        });
        r += 1e-3 * rng.range(0.2, 1.8);
    }
    (execs, readings)
}

/// O(n·m) reference: scan every execution for every reading.
fn assign_reference(readings: &[Reading], execs: &[Execution], policy: Policy) -> Vec<Stitched> {
    let mut out = Vec::new();
    for r in readings {
        // The latest start ≤ t (last index on ties, as a stable sort puts it last).
        let mut best: Option<usize> = None;
        for (i, e) in execs.iter().enumerate() {
            if e.start <= r.time && best.is_none_or(|b| e.start >= execs[b].start) {
                best = Some(i);
            }
        }
        let Some(i) = best else { continue };
        let e = execs[i];
        let ok = match policy {
            Policy::Containing => e.start <= r.time && r.time < e.end,
            Policy::Following { horizon } => r.time - e.start < horizon,
        };
        if ok {
            out.push(Stitched {
                execution: i,
                toi: r.time - e.start,
                power_w: r.power_w,
            });
        }
    }
    out
}

#[test]
fn assign_matches_the_quadratic_reference() {
    for seed in 1..=5 {
        let mut rng = Rng::new(seed);
        let (execs, readings) = timeline(&mut rng);
        for policy in [
            Policy::Containing,
            Policy::Following { horizon: 1.2e-3 },
            Policy::Following { horizon: 1e9 },
        ] {
            let got = assign(&readings, &execs, policy);
            assert_eq!(got, assign_reference(&readings, &execs, policy));
            assert!(!got.is_empty());
            // Unsorted input: the same assignment, indices into the shuffled slice.
            let mut perm: Vec<usize> = (0..execs.len()).collect();
            rng.shuffle(&mut perm);
            let shuffled: Vec<Execution> = perm.iter().map(|&i| execs[i]).collect();
            let again = assign(&readings, &shuffled, policy);
            assert_eq!(again.len(), got.len());
            for (a, b) in again.iter().zip(&got) {
                assert_eq!(perm[a.execution], b.execution);
                assert_eq!((a.toi, a.power_w), (b.toi, b.power_w));
            }
        }
        // Containing keeps TOIs within the execution; Following may exceed it.
        let c = assign(&readings, &execs, Policy::Containing);
        assert!(c
            .iter()
            .all(|s| s.toi < execs[s.execution].end - execs[s.execution].start));
    }
    // Edge cases: before the first start, at a start, at an end, NaN.
    let execs = [
        Execution {
            start: 1.0,
            end: 2.0,
        },
        Execution {
            start: 3.0,
            end: 4.0,
        },
    ];
    let at = |t: f64| Reading {
        time: t,
        power_w: 1.0,
    };
    let r = [at(0.5), at(1.0), at(2.0), at(f64::NAN), at(3.5)];
    let c = assign(&r, &execs, Policy::Containing);
    assert_eq!(
        c.iter().map(|s| (s.execution, s.toi)).collect::<Vec<_>>(),
        vec![(0, 0.0), (1, 0.5)]
    );
    let f = assign(&r, &execs, Policy::Following { horizon: 1.0 });
    assert_eq!(
        f.iter().map(|s| (s.execution, s.toi)).collect::<Vec<_>>(),
        vec![(0, 0.0), (1, 0.5)]
    );
    let f = assign(&r, &execs, Policy::Following { horizon: 1.5 });
    assert_eq!(f.len(), 3);
}

#[test]
fn profile_matches_a_straightforward_reference() {
    let mut rng = Rng::new(11);
    let points: Vec<Stitched> = (0..5000)
        .map(|i| Stitched {
            execution: i,
            toi: rng.range(0.0, 1e-3),
            power_w: 400.0 + 50.0 * rng.normal(),
        })
        .chain([Stitched {
            execution: 0,
            toi: 2.05e-3, // leaves empty bins between 1 ms and 2.05 ms
            power_w: 7.0,
        }])
        .collect();
    let bin = 50e-6;
    let bins = profile(&points, bin, 0.95).unwrap();
    assert_eq!(bins.len(), 42);
    for (k, b) in bins.iter().enumerate() {
        // Reference: filter, two-pass mean and variance, t from the tested quantile.
        let v: Vec<f64> = points
            .iter()
            .filter(|p| (p.toi / bin).floor() as usize == k)
            .map(|p| p.power_w)
            .collect();
        assert_eq!(b.n, v.len(), "bin {k}");
        assert!((b.lo - k as f64 * bin).abs() < 1e-18 && (b.hi - b.lo - bin).abs() < 1e-15);
        if v.is_empty() {
            assert!(b.mean_w.is_nan() && b.ci_half_w.is_nan());
            continue;
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        if v.len() == 1 {
            assert_eq!(b.mean_w, mean);
            assert!(b.std_w.is_nan() && b.ci_half_w.is_nan());
            continue;
        }
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let half = two_sided_t(0.95, n - 1.0) * var.sqrt() / n.sqrt();
        // Same formulas in a different order: agreement to ~1e-13 relative.
        assert!((b.mean_w - mean).abs() < 1e-12 * mean.abs());
        assert!((b.std_w - var.sqrt()).abs() < 1e-12 * var.sqrt());
        assert!((b.ci_half_w - half).abs() < 1e-12 * half);
    }
    // About 250 readings per bin at σ = 50 W: half-width ≈ 1.97·50/√250 ≈ 6.2 W.
    assert!(bins[5].ci_half_w > 5.0 && bins[5].ci_half_w < 7.5);
    assert!(profile(&points, 0.0, 0.95).is_err());
    assert!(profile(&points, 1e-3, 1.0).is_err());
    assert!(profile(&[], 1e-3, 0.9).unwrap().is_empty());
}

/// A long capture's bins: hundreds of thousands of points a bin, 1 mW of scatter on
/// 500 W, times before zero. The accumulated count, mean and scatter match the two-pass
/// reference: the mean to 1e-12 of the level, the standard deviation to 1e-6 of itself
/// (sums over 2e5 points of deviations from the bin's first point, a few mW: their
/// rounding is far below that).
#[test]
fn the_accumulator_keeps_a_tiny_scatter_on_a_large_level_over_many_points() {
    let mut rng = Rng::new(5);
    let bin = 10e-6;
    let mut acc = ProfileAccumulator::new(bin, 0.95).unwrap();
    let mut by_bin: Vec<Vec<f64>> = vec![Vec::new(); 4];
    for _ in 0..800_000 {
        let toi = rng.range(-20e-6, 20e-6);
        let w = 500.0 + 1e-3 * rng.normal();
        acc.push(toi, w);
        by_bin[((toi / bin).floor() + 2.0) as usize].push(w);
    }
    let bins = acc.finish().unwrap();
    assert_eq!(bins.len(), 4);
    for (b, v) in bins.iter().zip(&by_bin) {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        assert_eq!(b.n, v.len());
        assert!(
            (b.mean_w - mean).abs() < 1e-12 * mean,
            "{} against {mean}",
            b.mean_w
        );
        assert!((b.std_w - sd).abs() < 1e-6 * sd, "{} against {sd}", b.std_w);
    }
    assert!((bins[0].lo + 20e-6).abs() < 1e-18);
}

fn bin(lo: f64, hi: f64, n: usize, mean_w: f64) -> ProfileBin {
    ProfileBin {
        lo,
        hi,
        n,
        mean_w,
        std_w: 0.0,
        ci_half_w: 0.0,
    }
}

#[test]
fn energy_of_a_profile_by_hand() {
    let p = [
        bin(0.0, 1.0, 3, 10.0),
        bin(1.0, 2.0, 3, 20.0),
        bin(2.0, 3.0, 3, 30.0),
    ];
    // 0.5·10 + 1·20 + 0.25·30 = 32.5 J.
    assert!((energy(&p, 0.5, 2.25) - 32.5).abs() < 1e-12);
    assert!((energy(&p, 0.0, 3.0) - 60.0).abs() < 1e-12);
    assert!((energy(&p, 2.25, 0.5) + 32.5).abs() < 1e-12);
    assert_eq!(energy(&p, 1.0, 1.0), 0.0);
    // Beyond the profile, or over an empty bin: NaN, not a silent zero.
    assert!(energy(&p, -0.1, 1.0).is_nan());
    assert!(energy(&p, 2.0, 3.5).is_nan());
    let holed = [bin(0.0, 1.0, 3, 10.0), bin(1.0, 2.0, 0, f64::NAN)];
    assert!(energy(&holed, 0.0, 1.5).is_nan());
    assert!((energy(&holed, 0.0, 1.0) - 10.0).abs() < 1e-12);
}

#[test]
fn energy_trapezoid_by_hand_and_exact_on_lines() {
    let t = [0.0, 1.0, 2.0, 4.0];
    let w = [0.0, 10.0, 10.0, 30.0];
    // [0.5, 3]: 0.5·(5 + 10)/2 + 1·(10 + 10)/2 + 1·(10 + 20)/2 = 3.75 + 10 + 15.
    assert!((energy_trapezoid(&t, &w, 0.5, 3.0) - 28.75).abs() < 1e-12);
    // Whole range: 5 + 10 + 40.
    assert!((energy_trapezoid(&t, &w, 0.0, 4.0) - 55.0).abs() < 1e-12);
    // Within one interval: (2.5 → 15 W, 3.5 → 25 W) → 20 J.
    assert!((energy_trapezoid(&t, &w, 2.5, 3.5) - 20.0).abs() < 1e-12);
    // Bounds on samples.
    assert!((energy_trapezoid(&t, &w, 1.0, 2.0) - 10.0).abs() < 1e-12);
    assert!((energy_trapezoid(&t, &w, 3.0, 0.5) + 28.75).abs() < 1e-12);
    assert!(energy_trapezoid(&t, &w, -1.0, 2.0).is_nan());
    assert!(energy_trapezoid(&t, &w[..3], 0.0, 1.0).is_nan());
    assert!(energy_trapezoid(&[0.0, 2.0, 1.0], &[1.0; 3], 0.0, 1.0).is_nan());
    // Piecewise-linear power is integrated exactly: p = a + b·t on a random grid, the
    // closed form a(to − from) + b(to² − from²)/2; rounding ~1e-13 relative.
    let mut rng = Rng::new(3);
    let mut times = vec![0.0];
    for _ in 0..10_000 {
        times.push(times.last().unwrap() + rng.range(1e-6, 20e-6));
    }
    let (a, b) = (250.0, 3e4);
    let watts: Vec<f64> = times.iter().map(|t| a + b * t).collect();
    let (from, to) = (times[17] + 3.3e-6, times[9_000] - 1.1e-6);
    let exact = a * (to - from) + b * (to * to - from * from) / 2.0;
    let got = energy_trapezoid(&times, &watts, from, to);
    assert!((got - exact).abs() < 1e-12 * exact, "{got} {exact}");
}

#[test]
fn classify_by_train_position() {
    let pos = |index_in_train, since_train_start_s| TrainPosition {
        index_in_train,
        since_train_start_s,
    };
    let r = classify(
        &[
            pos(0, 0.0),
            pos(1, 2e-3),
            pos(5, 9e-3),
            pos(6, 9.2e-3),
            pos(0, 0.5),
        ],
        9e-3,
    );
    use Regime::{Sse, Ssp};
    assert_eq!(r, vec![Sse, Sse, Ssp, Ssp, Sse]);
}

/// Synthetic trains like the twin's default kernel: 200 µs executions back to back,
/// per-execution mean power `idle + dyn·(1 + (ratio − 1)·exp(−u/τ))` with τ = 3 ms and
/// ratio 0.85, plus 5 W of measurement noise per execution.
fn trains(rng: &mut Rng, n_trains: usize, per_train: usize) -> (Vec<f64>, Vec<f64>) {
    let (idle, dynamic, ratio, tau): (f64, f64, f64, f64) = (100.0, 425.0, 0.85, 3e-3);
    let mut u = Vec::new();
    let mut p = Vec::new();
    for _ in 0..n_trains {
        let mut t = 0.0;
        for _ in 0..per_train {
            u.push(t);
            p.push(idle + dynamic * (1.0 + (ratio - 1.0) * (-t / tau).exp()) + 5.0 * rng.normal());
            t += 200e-6 * (1.0 + 0.01 * rng.normal()) + 5e-6;
        }
    }
    (u, p)
}

#[test]
fn settling_is_estimated_on_synthetic_trains() {
    let mut taus = Vec::new();
    for seed in 1..=10 {
        let mut rng = Rng::new(seed);
        let (u, p) = trains(&mut rng, 10, 100); // u up to ~20 ms
        let s = estimate_settling(&u, &p).unwrap();
        // Truth: τ = 3 ms, p_ssp = 525 W, amplitude −63.75 W. With 1000 points at 5 W
        // noise the τ standard error is ~2.5 % (2.4 % observed over 30 seeds): 10 % is
        // 4 standard errors.
        assert!(
            (s.tau_s - 3e-3).abs() < 0.1 * 3e-3,
            "seed {seed}: τ {}",
            s.tau_s
        );
        taus.push(s.tau_s);
        assert!((s.settle_s - 3.0 * s.tau_s).abs() < 1e-15);
        assert!((s.p_ssp_w - 525.0).abs() < 1.0, "{}", s.p_ssp_w);
        assert!((s.amplitude_w + 63.75).abs() < 4.0, "{}", s.amplitude_w);
        assert!((s.rms_w - 5.0).abs() < 0.5);
        assert!(!s.at_search_edge);
        // Reference: brute force over 4 000 log-spaced τ in [0.1, 10] ms with the 2×2 normal equations
        // solved by Cramer's rule; the search must do at least as well, to 1e-9.
        let sse = |tau: f64| {
            let n = u.len() as f64;
            let e: Vec<f64> = u.iter().map(|u| (-u / tau).exp()).collect();
            let (se, see) = (e.iter().sum::<f64>(), e.iter().map(|e| e * e).sum::<f64>());
            let (sp, sep) = (
                p.iter().sum::<f64>(),
                e.iter().zip(&p).map(|(e, p)| e * p).sum::<f64>(),
            );
            let det = n * see - se * se;
            let c = (sp * see - se * sep) / det;
            let a = (n * sep - se * sp) / det;
            u.iter()
                .zip(&p)
                .map(|(u, p)| (p - c - a * (-u / tau).exp()).powi(2))
                .sum::<f64>()
        };
        let best = (0..4_000)
            .map(|i| 1e-4 * (1e-2f64 / 1e-4).powf(f64::from(i) / 3_999.0))
            .map(sse)
            .fold(f64::INFINITY, f64::min);
        let ours = sse(s.tau_s);
        assert!(ours <= best * (1.0 + 1e-9), "{ours} vs {best}");
        if seed == 1 {
            println!(
                "settling seed 1: τ = {:.3} ms (true 3), settle_s = {:.2} ms, \
                 p_ssp = {:.2} W (true 525), amplitude = {:.2} W (true −63.75)",
                s.tau_s * 1e3,
                s.settle_s * 1e3,
                s.p_ssp_w,
                s.amplitude_w
            );
        }
    }
    let mean = taus.iter().sum::<f64>() / taus.len() as f64;
    let sd = (taus.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / 9.0).sqrt();
    println!(
        "settling over 10 seeds: τ mean {:.3} ms, sd {:.3} ms",
        mean * 1e3,
        sd * 1e3
    );
    assert!(estimate_settling(&[0.0, 1.0, 2.0], &[1.0, 2.0, 3.0]).is_err());
    assert!(estimate_settling(&[1.0; 5], &[1.0; 5]).is_err());
    assert!(estimate_settling(&[0.0, 1.0], &[1.0]).is_err());
}

/// A recording's gap is samples that are missing, never interpolated: a window that
/// overlaps one has no energy (where a straight line across it would give an execution
/// inside it the idle level's energy, biasing the mean low), and every other window's is
/// the trapezoid rule's on its own stretch of the trace.
#[test]
fn window_energies_are_nan_across_a_gap_and_exact_elsewhere() {
    let ts: Vec<f64> = (0..1000).map(|i| f64::from(i) * 1e-5).collect();
    let ws: Vec<f64> = ts
        .iter()
        .map(|t| 100.0 + 300.0 * (t * 1e3).sin().abs())
        .collect();
    // Samples 400..600 lost: the hole is from sample 399 to sample 600.
    let (hole_lo, hole_hi) = (ts[399], ts[600]);
    let windows = [
        (ts[10], ts[300]),  // before
        (ts[350], ts[399]), // ends at the hole's edge
        (ts[380], ts[420]), // into it
        (ts[450], ts[550]), // inside
        (ts[590], ts[700]), // out of it
        (ts[600], ts[900]), // starts at its far edge
        (ts[100], ts[800]), // across it
        (ts[700], ts[350]), // across it, reversed
        (ts[620], ts[990]), // after
    ];
    let mut acc = WindowEnergies::new(&windows);
    for (i, (&t, &w)) in ts.iter().zip(&ws).enumerate() {
        if (400..600).contains(&i) {
            continue;
        }
        if i == 600 {
            acc.gap();
        }
        acc.push(t, w);
    }
    let got = acc.finish();
    for (&(a, b), e) in windows.iter().zip(got) {
        let (lo, hi) = (a.min(b), a.max(b));
        if lo < hole_hi && hi > hole_lo {
            assert!(e.is_nan(), "[{a}, {b}] overlaps the gap: {e}");
        } else {
            let want = energy_trapezoid(&ts, &ws, a, b);
            assert!(
                (e - want).abs() <= 1e-9 * want.abs(),
                "[{a}, {b}]: {e} vs {want}"
            );
        }
    }
}

/// Energies over many windows in one pass over the samples equal the trapezoid rule over
/// the whole trace, window by window: inside, at samples, reversed, and NaN outside.
#[test]
fn window_energies_in_one_pass_equal_the_trapezoid_rule() {
    let mut rng = Rng::new(5);
    let mut t = 3.0;
    let (mut ts, mut ws) = (Vec::new(), Vec::new());
    for _ in 0..20_000 {
        ts.push(t);
        ws.push(100.0 + 400.0 * rng.uniform());
        t += rng.range(5e-6, 15e-6);
    }
    let (t0, t1) = (ts[0], ts[ts.len() - 1]);
    let mut windows: Vec<(f64, f64)> = (0..3000)
        .map(|_| {
            let a = rng.range(t0, t1);
            (a, (a + rng.range(0.0, 2e-3)).min(t1))
        })
        .collect();
    windows.extend([
        (ts[10], ts[500]),
        (ts[700], ts[600]),
        (t0, t1),
        (t0 - 1e-3, ts[5]),
    ]);
    windows.extend([(ts[5], t1 + 1e-3), (ts[9], ts[9])]);
    let mut acc = WindowEnergies::new(&windows);
    for (&t, &w) in ts.iter().zip(&ws) {
        acc.push(t, w);
    }
    let got = acc.finish();
    for (&(a, b), e) in windows.iter().zip(got) {
        let want = energy_trapezoid(&ts, &ws, a, b);
        if want.is_nan() {
            assert!(e.is_nan(), "[{a}, {b}]: {e}");
        } else {
            assert!(
                (e - want).abs() <= 1e-9 * want.abs().max(1e-3),
                "[{a}, {b}]: {e} vs {want}"
            );
        }
    }
}
