//! The distribution functions against tabulated values and closed forms.

use railtrace_calibration::stats::{
    mad_sigma, median, normal_cdf, normal_quantile, student_t_cdf, student_t_quantile,
    two_sided_normal, two_sided_t,
};

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs().max(1e-300)
    }
}

#[test]
fn normal_quantile_matches_tables() {
    // Values to 16-17 digits from standard tables (e.g. Wichura 1988, NIST); AS 241 is
    // accurate to about 1e-16, so 1e-14 leaves room for the last few bits.
    let table = [
        (0.5, 0.0),
        (0.9, 1.281_551_565_544_600_5),
        (0.95, 1.644_853_626_951_472_2),
        (0.975, 1.959_963_984_540_054),
        (0.025, -1.959_963_984_540_054),
        (0.995, 2.575_829_303_548_900_4),
        (0.999, 3.090_232_306_167_813_5),
        (0.841_344_746_068_542_9, 1.0),
        (1e-10, -6.361_340_902_404_056),
        (1e-300, -37.047_096_299_361_2),
    ];
    for (p, z) in table {
        let got = normal_quantile(p);
        assert!(
            (got - z).abs() <= 1e-14 * z.abs().max(1.0),
            "p={p}: {got} vs {z}"
        );
    }
    assert_eq!(normal_quantile(0.0), f64::NEG_INFINITY);
    assert_eq!(normal_quantile(1.0), f64::INFINITY);
    assert!(normal_quantile(1.5).is_nan() && normal_quantile(f64::NAN).is_nan());
    assert!((two_sided_normal(0.95) - 1.959_963_984_540_054).abs() < 1e-14);
}

#[test]
fn normal_cdf_matches_tables_and_inverts_the_quantile() {
    // Φ from tables (17 digits); the series / continued fraction reach ~1e-15.
    let table = [
        (0.0, 0.5),
        (1.0, 0.841_344_746_068_542_9),
        (2.0, 0.977_249_868_051_820_8),
        (-3.0, 1.349_898_031_630_094_6e-3),
        (-10.0, 7.619_853_024_160_527e-24),
    ];
    for (t, p) in table {
        assert!(rel(normal_cdf(t), p) < 1e-13, "t={t}: {}", normal_cdf(t));
    }
    // Two independent algorithms (AS 241 and the incomplete gamma function) agree: the
    // relative error of p after a round trip is the quantile's error times the
    // density-to-probability ratio, < 1e-12 over the range.
    for i in 1..200 {
        let p = f64::from(i) / 200.0;
        for p in [p, p * 1e-6, p * 1e-12] {
            let back = normal_cdf(normal_quantile(p));
            assert!(rel(back, p) < 1e-12, "p={p}: {back}");
        }
    }
}

/// Closed-form Student-t CDF for an integer `dof`, by the finite series in
/// `θ = atan(t/√ν)` (Abramowitz & Stegun 26.7.3-4): the slow, obviously-correct reference.
fn t_cdf_series(t: f64, dof: u32) -> f64 {
    let theta = (t / f64::from(dof).sqrt()).atan();
    let (s, c) = (theta.sin(), theta.cos());
    let a = if dof % 2 == 1 {
        let mut sum = 0.0;
        if dof > 1 {
            let mut term = c;
            sum = term;
            let mut k = 3;
            while k < dof {
                term *= c * c * f64::from(k - 1) / f64::from(k);
                sum += term;
                k += 2;
            }
        }
        2.0 / std::f64::consts::PI * (theta + s * sum)
    } else {
        let mut term = 1.0;
        let mut sum = 1.0;
        let mut k = 2;
        while k < dof {
            term *= c * c * f64::from(k - 1) / f64::from(k);
            sum += term;
            k += 2;
        }
        s * sum
    };
    0.5 + 0.5 * a
}

#[test]
fn t_cdf_matches_the_closed_form_for_integer_dof() {
    // The continued fraction converges to ~1e-15; the closed form is exact up to its own
    // rounding (~1e-15), so 1e-12 relative on the smaller tail is generous.
    for dof in 1..=15 {
        for t in [
            -40.0, -6.0, -2.5, -1.0, -0.3, 0.0, 0.2, 1.0, 2.0, 3.5, 10.0, 100.0,
        ] {
            let got = student_t_cdf(t, f64::from(dof));
            let want = t_cdf_series(t, dof);
            let (g, w) = if want > 0.5 {
                (1.0 - got, 1.0 - want)
            } else {
                (got, want)
            };
            // The closed form itself cancels in the far tails (θ + sinθ·… → −π/2 + …),
            // losing a few ulp of 1 in absolute terms: hence the 1e-15 absolute term.
            assert!(
                (g - w).abs() <= 1e-12 * w + 1e-15,
                "dof={dof} t={t}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn t_quantile_matches_closed_forms() {
    // ν = 1: tan(π(p − ½)) = −cot(πp) (written so that no π/2 cancels); ν = 2: (2p − 1)/√(2p(1 − p)); ν = 4: 2 sign √(q − 1) with
    // q = cos(acos(√α)/3)/√α, α = 4p(1 − p). Newton is run to 1e-15 relative; the tail
    // evaluations limit it to ~1e-13, hence 1e-10.
    let ps = [
        1e-8, 1e-4, 0.01, 0.025, 0.1, 0.3, 0.45, 0.55, 0.7, 0.9, 0.975, 0.99, 0.9999,
    ];
    for p in ps {
        let pi = std::f64::consts::PI;
        let c1 = if p < 0.5 {
            -1.0 / (pi * p).tan()
        } else {
            1.0 / (pi * (1.0 - p)).tan()
        };
        let c2 = (2.0 * p - 1.0) / (2.0 * p * (1.0 - p)).sqrt();
        let alpha = 4.0 * p * (1.0 - p);
        let q = (alpha.sqrt().acos() / 3.0).cos() / alpha.sqrt();
        let c4 = (p - 0.5).signum() * 2.0 * (q - 1.0).sqrt();
        for (dof, want) in [(1.0, c1), (2.0, c2), (4.0, c4)] {
            let got = student_t_quantile(p, dof);
            assert!(rel(got, want) < 1e-10, "dof={dof} p={p}: {got} vs {want}");
        }
    }
}

#[test]
fn t_quantile_matches_tables() {
    // Printed tables give 3 decimals: tolerance 5e-4 (half a unit of the last digit
    // plus the table's own rounding).
    let table = [
        (0.975, 1.0, 12.706),
        (0.975, 3.0, 3.182),
        (0.975, 5.0, 2.571),
        (0.975, 10.0, 2.228),
        (0.975, 30.0, 2.042),
        (0.975, 60.0, 2.000),
        (0.975, 120.0, 1.980),
        (0.995, 1.0, 63.657),
        (0.995, 5.0, 4.032),
        (0.995, 10.0, 3.169),
        (0.995, 30.0, 2.750),
        (0.95, 5.0, 2.015),
        (0.95, 10.0, 1.812),
        (0.95, 30.0, 1.697),
        (0.9, 2.0, 1.886),
        (0.9995, 3.0, 12.924),
    ];
    for (p, dof, want) in table {
        let got = student_t_quantile(p, dof);
        assert!((got - want).abs() < 5e-4, "p={p} dof={dof}: {got}");
    }
    // More digits where they are well known.
    assert!((two_sided_t(0.95, 4.0) - 2.776_445_105_197_799).abs() < 1e-11);
    assert!((two_sided_t(0.95, 10.0) - 2.228_138_851_986_273_5).abs() < 1e-11);
    // Large dof tends to the normal quantile: t ≈ z + (z³ + z)/(4ν), the next term of
    // the expansion is ~1e-11 at ν = 1e6.
    let z = normal_quantile(0.975);
    let t = student_t_quantile(0.975, 1e6);
    assert!((t - (z + (z * z * z + z) / 4e6)).abs() < 1e-10, "{t} {z}");
    assert_eq!(student_t_quantile(0.975, f64::INFINITY), z);
    assert!(student_t_quantile(0.5, 3.0) == 0.0);
    assert!(student_t_quantile(0.9, 0.0).is_nan() && student_t_quantile(-0.1, 3.0).is_nan());
}

#[test]
fn t_quantile_inverts_the_cdf_for_fractional_dof() {
    for dof in [0.7, 1.5, 2.5, 7.3, 33.3, 1234.5] {
        for p in [1e-6, 0.01, 0.2, 0.5, 0.8, 0.99, 1.0 - 1e-6] {
            let t = student_t_quantile(p, dof);
            let back = student_t_cdf(t, dof);
            let (b, w) = if p > 0.5 {
                (1.0 - back, 1.0 - p)
            } else {
                (back, p)
            };
            assert!(rel(b, w) < 1e-10, "dof={dof} p={p}: t={t} back={back}");
        }
    }
}

#[test]
fn large_dof_is_continuous_across_the_switch_to_the_expansion() {
    // Below 1e6 the continued fraction, from 1e6 the expansion to 1/ν²: they must agree
    // where they meet (the expansion's neglected term is ~t¹¹/ν³ relative, 1e-12 at
    // t = 6; the fraction's own error ~1e-11).
    for p in [1e-9, 0.01, 0.2, 0.975, 0.9999] {
        let below = student_t_quantile(p, 999_999.0);
        let above = student_t_quantile(p, 1e6);
        assert!(rel(below, above) < 1e-10, "p={p}: {below} vs {above}");
    }
    for t in [-6.0, -2.0, 0.5, 1.96, 4.0] {
        let (below, above) = (student_t_cdf(t, 999_999.0), student_t_cdf(t, 1e6));
        let (b, a) = if t > 0.0 {
            (1.0 - below, 1.0 - above)
        } else {
            (below, above)
        };
        assert!(rel(b, a) < 1e-9, "t={t}: {below} vs {above}");
    }
    // The expansion's 1/ν² coefficient, checked against the continued fraction at a
    // moderate ν where the next term (~t¹¹/ν³) is still visible but small: the
    // residual after the 1/ν term, times ν², approaches (3t⁷ − 7t⁵ − 5t³ − 3t)/96.
    let nu = 5000.0;
    for t in [-3.0_f64, -2.0, -1.0, -0.5] {
        let phi = (-0.5 * t * t).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let r =
            ((normal_cdf(t) - student_t_cdf(t, nu)) / phi - (t.powi(3) + t) / (4.0 * nu)) * nu * nu;
        let g2 = (3.0 * t.powi(7) - 7.0 * t.powi(5) - 5.0 * t.powi(3) - 3.0 * t) / 96.0;
        assert!(
            (r - g2).abs() < 0.01 * g2.abs().max(1.0),
            "t={t}: {r} vs {g2}"
        );
    }
    // And tends to the normal distribution.
    assert_eq!(student_t_cdf(1.5, f64::INFINITY), normal_cdf(1.5));
    let z = normal_quantile(0.999);
    assert!(rel(student_t_quantile(0.999, 1e15), z) < 1e-14);
}

#[test]
fn median_and_mad() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    assert_eq!(median(&[f64::NAN, 1.0, 5.0, 3.0]), 3.0);
    assert!(median(&[]).is_nan());
    // |x − 3| = 2, 1, 0, 1, 2 → MAD 1.
    assert!((mad_sigma(&[1.0, 2.0, 3.0, 4.0, 5.0]) - 1.482_602_218_505_602).abs() < 1e-15);
}
