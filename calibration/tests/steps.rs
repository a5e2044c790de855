//! `steps::find_step` against a brute-force change point and against steps of known time,
//! with and without an input filter, and its refusal to call noise a step.

mod common;

use common::Rng;
use railtrace_calibration::steps::find_step;

/// A step from `lo` to `hi` W at `t0` through a first-order filter `tau` (0: none),
/// sampled every `dt` from 0 to `end`, plus normal noise `sigma`.
fn trace(
    rng: &mut Rng,
    t0: f64,
    (lo, hi): (f64, f64),
    tau: f64,
    dt: f64,
    end: f64,
    sigma: f64,
) -> (Vec<f64>, Vec<f64>) {
    let n = (end / dt) as usize;
    let t: Vec<f64> = (0..n).map(|i| i as f64 * dt).collect();
    let p = t
        .iter()
        .map(|&x| {
            let clean = if x < t0 {
                lo
            } else if tau > 0.0 {
                hi + (lo - hi) * (-(x - t0) / tau).exp()
            } else {
                hi
            };
            clean + sigma * rng.normal()
        })
        .collect();
    (t, p)
}

/// The split minimising the two-mean SSE, by recomputing every split from scratch.
fn brute_split(p: &[f64]) -> usize {
    let sse = |v: &[f64]| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        v.iter().map(|x| (x - m) * (x - m)).sum::<f64>()
    };
    (2..p.len() - 1)
        .min_by(|&a, &b| (sse(&p[..a]) + sse(&p[a..])).total_cmp(&(sse(&p[..b]) + sse(&p[b..]))))
        .unwrap()
}

#[test]
fn the_split_is_the_brute_force_change_point() {
    let mut rng = Rng::new(81);
    for _ in 0..200 {
        let t0 = rng.range(0.2e-3, 0.8e-3);
        let step = rng.range(5.0, 100.0) * if rng.uniform() < 0.5 { 1.0 } else { -1.0 };
        let (t, p) = trace(&mut rng, t0, (200.0, 200.0 + step), 0.0, 10e-6, 1e-3, 2.0);
        let s = find_step(&t, &p, 0.0, 1.0, 0.0, 0.0).unwrap().unwrap();
        let k = brute_split(&p);
        let before = p[..k].iter().sum::<f64>() / k as f64;
        let after = p[k..].iter().sum::<f64>() / (p.len() - k) as f64;
        assert!((s.before_w - before).abs() < 1e-9 && (s.after_w - after).abs() < 1e-9);
    }
}

#[test]
fn a_clean_step_is_timed_within_half_a_sample() {
    // No filter: the crossing is interpolated between the last sample before and the
    // first after the step, so it lies within half a sample interval (5 µs) of it; with
    // 2 W noise on a 100 W step the midpoint crossing moves by under 0.3 µs more.
    let mut rng = Rng::new(82);
    let mut worst: f64 = 0.0;
    for _ in 0..300 {
        let t0 = rng.range(0.2e-3, 0.8e-3);
        let (t, p) = trace(&mut rng, t0, (150.0, 250.0), 0.0, 10e-6, 1e-3, 2.0);
        let s = find_step(&t, &p, 0.0, 1.0, 10.0, 5.0).unwrap().unwrap();
        // The sample grid's own ambiguity: the step is anywhere between two samples.
        let grid = (t0 / 10e-6).ceil() * 10e-6 - 5e-6;
        worst = worst.max((s.time_s - grid).abs());
        assert!((s.time_s - t0).abs() <= 10e-6, "{} vs {t0}", s.time_s);
    }
    eprintln!(
        "clean steps: crossing within {:.2} µs of the samples' midpoint",
        worst * 1e6
    );
    assert!(worst < 0.5e-6, "{worst}");
}

#[test]
fn a_filtered_step_is_timed_at_its_half_way_point() {
    // A first-order filter τ reaches half-way τ·ln 2 after the step. Sampled at 10 µs and
    // interpolated linearly, the chord from the last sample before the step to the first
    // after it misplaces the half-way point by up to 0.5/(1 − e^(−2))·10 − 5·ln 2 = 2.3 µs
    // for τ = 5 µs (a step just after a sample), less for slower filters; 1 W noise on a
    // 200 W step adds about 0.1 µs.
    let mut rng = Rng::new(83);
    for tau in [5e-6, 20e-6] {
        let mut errs = Vec::new();
        for _ in 0..200 {
            let t0 = rng.range(0.2e-3, 0.8e-3);
            let (t, p) = trace(&mut rng, t0, (400.0, 200.0), tau, 10e-6, 1e-3, 1.0);
            let s = find_step(&t, &p, 0.0, 1.0, 10.0, 5.0).unwrap().unwrap();
            errs.push(s.time_s - (t0 + tau * std::f64::consts::LN_2));
        }
        let mean = errs.iter().sum::<f64>() / errs.len() as f64;
        let worst = errs.iter().fold(0.0f64, |m, e| m.max(e.abs()));
        eprintln!(
            "τ {:.0} µs: half-way point found {:+.2} µs on average, worst {:.2} µs",
            tau * 1e6,
            mean * 1e6,
            worst * 1e6
        );
        assert!(worst < 3e-6, "τ {tau}: worst {worst}");
    }
}

#[test]
fn noise_is_not_a_step() {
    // 1000 flat windows of 100 samples, 2 W noise: the best split of pure noise has a
    // z of about 3 at most; none reaches 6.
    let mut rng = Rng::new(84);
    let mut found = 0;
    for _ in 0..1000 {
        let (t, p) = trace(&mut rng, 2.0, (150.0, 150.0), 0.0, 10e-6, 1e-3, 2.0);
        if find_step(&t, &p, 0.0, 1.0, 0.0, 6.0).unwrap().is_some() {
            found += 1;
        }
    }
    assert_eq!(found, 0);
}

#[test]
fn bad_input_is_an_error() {
    let t = [0.0, 1.0, 2.0, 3.0, 4.0];
    let p = [1.0, 1.0, 2.0, 2.0, 2.0];
    assert!(find_step(&t, &p[..4], 0.0, 5.0, 0.0, 0.0).is_err());
    assert!(find_step(&t, &[1.0, f64::NAN, 2.0, 2.0, 2.0], 0.0, 5.0, 0.0, 0.0).is_err());
    assert!(find_step(&[0.0, 2.0, 1.0, 3.0, 4.0], &p, 0.0, 5.0, 0.0, 0.0).is_err());
    assert!(find_step(&t, &p, 0.0, 2.5, 0.0, 0.0).is_err()); // three samples
    let s = find_step(&t, &p, 0.0, 5.0, 0.0, 0.0).unwrap().unwrap();
    assert!((s.time_s - 1.5).abs() < 1e-12, "{s:?}");
}
