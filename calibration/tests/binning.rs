//! Execution-time binning on the twin's default duration distribution.

mod common;

use common::Rng;
use railtrace_calibration::binning::{cluster, fixed_margin, Clusters};

/// The twin's default kernel (`KernelConfig::mi300x_like_two_phase`): 85 % of
/// executions at scale 1.0, 15 % at 1.08, each with 1 % spread; 0.5 % outliers with an
/// extra factor `1 + 0.5·Exp(1)` (mean 1.5). Returns durations (s, 200 µs nominal) and
/// whether each truly belongs to the dominant mode (scale 1.0 and not an outlier).
fn twin_durations(rng: &mut Rng, n: usize) -> (Vec<f64>, Vec<bool>) {
    (0..n)
        .map(|_| {
            let dominant = rng.uniform() < 0.85;
            let scale = if dominant { 1.0 } else { 1.08 };
            let mut f = scale * (1.0 + 0.01 * rng.normal());
            let outlier = rng.uniform() < 0.005;
            if outlier {
                f *= 1.0 + 0.5 * rng.exp();
            }
            (200e-6 * f, dominant && !outlier)
        })
        .unzip()
}

fn precision_recall(kept: &[usize], truth: &[bool]) -> (f64, f64) {
    let hits = kept.iter().filter(|&&i| truth[i]).count() as f64;
    let all = truth.iter().filter(|&&t| t).count() as f64;
    (hits / kept.len() as f64, hits / all)
}

fn check_partition(c: &Clusters, durations: &[f64]) {
    let mut all: Vec<usize> = c.clusters.iter().flat_map(|c| c.indices.clone()).collect();
    all.sort_unstable();
    let finite: Vec<usize> = (0..durations.len())
        .filter(|&i| durations[i].is_finite())
        .collect();
    assert_eq!(all, finite, "the clusters partition the finite durations");
    for w in c.clusters.windows(2) {
        assert!(w[0].hi <= w[1].lo, "ordered, not overlapping");
    }
}

#[test]
fn dominant_cluster_is_precise_on_the_twin_default() {
    for seed in 1..=10 {
        let mut rng = Rng::new(seed);
        let (d, truth) = twin_durations(&mut rng, 2000);
        let c = cluster(&d, 20);
        check_partition(&c, &d);
        let dom = c.dominant().unwrap();
        let (p, r) = precision_recall(&dom.indices, &truth);
        // The check: ≥ 95 % precision for the dominant mode's runs.
        assert!(p >= 0.95, "seed {seed}: precision {p}");
        assert!(r >= 0.95, "seed {seed}: recall {r}");
        assert!((dom.mean / 200e-6 - 1.0).abs() < 0.005);
        let fm2 = fixed_margin(&d, 0.02);
        let fm5 = fixed_margin(&d, 0.05);
        let (p2, r2) = precision_recall(&fm2.indices, &truth);
        let (p5, r5) = precision_recall(&fm5.indices, &truth);
        println!(
            "seed {seed}: cluster: {} clusters {:?}, dominant precision {:.4} recall {:.4} | \
             fixed_margin 2 %: precision {p2:.4} recall {r2:.4} | 5 %: precision {p5:.4} \
             recall {r5:.4}",
            c.clusters.len(),
            c.clusters
                .iter()
                .map(|c| c.indices.len())
                .collect::<Vec<_>>(),
            p,
            r
        );
    }
}

#[test]
fn unimodal_samples_stay_whole() {
    // A single normal, a uniform and an exponential tail are one cluster each (the
    // separation threshold is argued in the module documentation).
    for seed in 1..=5 {
        let mut rng = Rng::new(100 + seed);
        let normal: Vec<f64> = (0..1000).map(|_| 1.0 + 0.01 * rng.normal()).collect();
        let uniform: Vec<f64> = (0..1000).map(|_| rng.range(1.0, 1.1)).collect();
        let exp: Vec<f64> = (0..1000).map(|_| 1.0 + 0.05 * rng.exp()).collect();
        for (name, d) in [("normal", normal), ("uniform", uniform), ("exp", exp)] {
            let c = cluster(&d, 20);
            assert_eq!(c.clusters.len(), 1, "{name} seed {seed}");
            assert_eq!(c.dominant, Some(0));
        }
    }
}

#[test]
fn a_coarse_clock_does_not_split_one_behaviour() {
    // A ~112 µs kernel stamped in 32 ns steps (an H200's %globaltimer): a handful of
    // exact values, each with no spread of its own. One cluster, all kept; two modes
    // 2 % apart on the same clock are still two.
    let mut rng = Rng::new(32);
    let tick = 32e-9;
    let quantised = |v: f64| (v / tick).round() * tick;
    let one: Vec<f64> = (0..300)
        .map(|_| quantised(111.6e-6 + rng.range(0.0, 0.8e-6)))
        .collect();
    let c = cluster(&one, 20);
    assert_eq!(
        c.clusters.len(),
        1,
        "{:?}",
        c.clusters.iter().map(|c| (c.lo, c.hi)).collect::<Vec<_>>()
    );
    assert_eq!(c.dominant().unwrap().indices.len(), 300);
    let steps = [
        vec![quantised(111.6e-6); 150],
        vec![quantised(111.7e-6); 150],
    ]
    .concat();
    assert_eq!(cluster(&steps, 20).clusters.len(), 1);
    let two = [
        vec![quantised(111.6e-6); 150],
        vec![quantised(113.9e-6); 150],
    ]
    .concat();
    assert_eq!(cluster(&two, 20).clusters.len(), 2);
}

#[test]
fn separated_modes_are_found() {
    let mut rng = Rng::new(9);
    let mut d: Vec<f64> = Vec::new();
    for (scale, n) in [(1.0, 500), (1.2, 300), (1.5, 200)] {
        d.extend((0..n).map(|_| scale * (1.0 + 0.01 * rng.normal())));
    }
    rng.shuffle(&mut d);
    d.push(f64::NAN);
    let c = cluster(&d, 10);
    check_partition(&c, &d);
    let sizes: Vec<usize> = c.clusters.iter().map(|c| c.indices.len()).collect();
    assert_eq!(sizes, vec![500, 300, 200]);
    assert_eq!(c.dominant, Some(0));
    for (c, m) in c.clusters.iter().zip([1.0, 1.2, 1.5]) {
        assert!((c.mean - m).abs() < 0.005 * m && (c.std / m - 0.01).abs() < 0.002);
    }
    // Degenerate inputs.
    assert_eq!(cluster(&[], 5).dominant, None);
    assert_eq!(cluster(&[2.0; 50], 5).clusters.len(), 1);
    let two = [vec![1.0; 30], vec![2.0; 20]].concat();
    assert_eq!(cluster(&two, 5).clusters.len(), 2);
    // min_size bounds the smallest cluster a split may create.
    assert_eq!(cluster(&two, 25).clusters.len(), 1);
}

#[test]
fn fixed_margin_matches_a_reference() {
    let mut rng = Rng::new(4);
    let (mut d, _) = twin_durations(&mut rng, 1001);
    d[3] = f64::NAN;
    let b = fixed_margin(&d, 0.03);
    // Reference: sort the finite values, take the middle one(s), filter.
    let mut s: Vec<f64> = d.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    let med = 0.5 * (s[499] + s[500]); // 1000 finite values
    assert_eq!(b.centre, med);
    let want: Vec<usize> = (0..d.len())
        .filter(|&i| (d[i] - med).abs() <= 0.03 * med * (1.0 + 1e-12))
        .collect();
    assert_eq!(b.indices, want);
    assert!((b.lo - 0.97 * med).abs() < 1e-18 && (b.hi - 1.03 * med).abs() < 1e-18);
    assert!(fixed_margin(&d, -0.1).indices.is_empty());
    assert!(fixed_margin(&[], 0.05).centre.is_nan());
}
