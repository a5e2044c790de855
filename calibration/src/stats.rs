//! Distribution functions and small robust statistics, written out so that the crate
//! needs nothing beyond `std`.
//!
//! - [`normal_quantile`]: Wichura's AS 241 (`PPND16`), about 1e-16 relative accuracy.
//! - [`normal_cdf`]: through the incomplete gamma function (series or continued fraction).
//! - [`student_t_cdf`]: through the regularised incomplete beta function (continued
//!   fraction, modified Lentz), with `ln Γ` from Stirling's series (and the difference
//!   `ln Γ(a + ½) − ln Γ(a)` formed without cancellation, so that a huge `dof` keeps
//!   full precision).
//! - [`student_t_quantile`]: Newton's method on [`student_t_cdf`] from a Cornish–Fisher
//!   start, kept inside a bracket by bisection; about 1e-12 relative accuracy. Above
//!   1e6 degrees of freedom both use the normal distribution's expansion in `1/dof`.
//! - [`two_sided_normal`] and [`two_sided_t`]: the multipliers of two-sided intervals.
//! - [`median`] and [`mad_sigma`]: the median and the normal-consistent median absolute
//!   deviation.

/// Quantile of the standard normal distribution: the `z` with `Φ(z) = p`.
///
/// Wichura's algorithm AS 241 (Applied Statistics 37(3), 1988), the 16-digit version.
/// Returns −∞ for `p = 0`, +∞ for `p = 1` and NaN outside `[0, 1]` or for NaN.
// The coefficients are written as published (20 digits), so they can be checked
// against the paper; f64 rounds them.
#[allow(clippy::excessive_precision)]
pub fn normal_quantile(p: f64) -> f64 {
    if p.is_nan() || !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    const A: [f64; 8] = [
        3.387_132_872_796_366_608,
        1.331_416_678_917_843_774_5e2,
        1.971_590_950_306_551_442_7e3,
        1.373_169_376_550_946_112_5e4,
        4.592_195_393_154_987_145_7e4,
        6.726_577_092_700_870_085_3e4,
        3.343_057_558_358_812_810_5e4,
        2.509_080_928_730_122_672_7e3,
    ];
    const B: [f64; 8] = [
        1.0,
        4.231_333_070_160_091_125_2e1,
        6.871_870_074_920_579_083e2,
        5.394_196_021_424_751_107_7e3,
        2.121_379_430_158_659_586_7e4,
        3.930_789_580_009_271_061e4,
        2.872_908_573_572_194_267_4e4,
        5.226_495_278_852_854_561e3,
    ];
    const C: [f64; 8] = [
        1.423_437_110_749_683_577_34,
        4.630_337_846_156_545_295_9,
        5.769_497_221_460_691_405_5,
        3.647_848_324_763_204_605_04,
        1.270_458_252_452_368_382_58,
        2.417_807_251_774_506_117_7e-1,
        2.272_384_498_926_918_458_33e-2,
        7.745_450_142_783_414_076_4e-4,
    ];
    const D: [f64; 8] = [
        1.0,
        2.053_191_626_637_758_821_87,
        1.676_384_830_183_803_849_4,
        6.897_673_349_851_000_045_5e-1,
        1.481_039_764_274_800_745_9e-1,
        1.519_866_656_361_645_719_66e-2,
        5.475_938_084_995_344_946e-4,
        1.050_750_071_644_416_843_24e-9,
    ];
    const E: [f64; 8] = [
        6.657_904_643_501_103_777_2,
        5.463_784_911_164_114_369_9,
        1.784_826_539_917_291_335_8,
        2.965_605_718_285_048_912_3e-1,
        2.653_218_952_657_612_309_3e-2,
        1.242_660_947_388_078_438_6e-3,
        2.711_555_568_743_487_578_15e-5,
        2.010_334_399_292_288_132_65e-7,
    ];
    const F: [f64; 8] = [
        1.0,
        5.998_322_065_558_879_376_9e-1,
        1.369_298_809_227_358_053_1e-1,
        1.487_536_129_085_061_485_25e-2,
        7.868_691_311_456_132_591e-4,
        1.846_318_317_510_054_681_8e-5,
        1.421_511_758_316_445_888_7e-7,
        2.044_263_103_389_939_785_64e-15,
    ];
    fn poly(c: &[f64; 8], x: f64) -> f64 {
        c.iter().rev().fold(0.0, |acc, &k| acc * x + k)
    }
    let q = p - 0.5;
    if q.abs() <= 0.425 {
        let r = 0.180625 - q * q;
        return q * poly(&A, r) / poly(&B, r);
    }
    let r = if q < 0.0 { p } else { 1.0 - p };
    let r = (-r.ln()).sqrt();
    let z = if r <= 5.0 {
        let r = r - 1.6;
        poly(&C, r) / poly(&D, r)
    } else {
        let r = r - 5.0;
        poly(&E, r) / poly(&F, r)
    };
    if q < 0.0 {
        -z
    } else {
        z
    }
}

/// The multiplier `z` of a two-sided normal interval at `confidence` (e.g. 1.96 at
/// 0.95): `normal_quantile(1 - (1 - confidence) / 2)`. NaN unless `0 < confidence < 1`.
pub fn two_sided_normal(confidence: f64) -> f64 {
    if !(confidence > 0.0 && confidence < 1.0) {
        return f64::NAN;
    }
    -normal_quantile(0.5 * (1.0 - confidence))
}

/// The multiplier of a two-sided Student-t interval at `confidence` with `dof` degrees
/// of freedom (e.g. 2.776 at 0.95 with 4). NaN unless `0 < confidence < 1` and `dof > 0`.
pub fn two_sided_t(confidence: f64, dof: f64) -> f64 {
    if !(confidence > 0.0 && confidence < 1.0) {
        return f64::NAN;
    }
    -student_t_quantile(0.5 * (1.0 - confidence), dof)
}

/// Stirling's correction `ln Γ(x) − [(x − ½) ln x − x + ½ ln 2π]` for `x ≥ 10`: the
/// series through the `x^-13` term (truncation error below 1e-16 there).
fn stirling_correction(x: f64) -> f64 {
    let x2 = 1.0 / (x * x);
    // B_2k / (2k (2k - 1)) for k = 1..7.
    (1.0 / 12.0
        + x2 * (-1.0 / 360.0
            + x2 * (1.0 / 1260.0
                + x2 * (-1.0 / 1680.0
                    + x2 * (1.0 / 1188.0 + x2 * (-691.0 / 360_360.0 + x2 * (1.0 / 156.0)))))))
        / x
}

/// `ln Γ(x)` for `x > 0`: shifted up to `x ≥ 10` by the recurrence, then Stirling's
/// series.
fn ln_gamma(x: f64) -> f64 {
    let mut x = x;
    let mut shift = 1.0;
    while x < 10.0 {
        shift *= x;
        x += 1.0;
    }
    (x - 0.5) * x.ln() - x + 0.5 * (2.0 * std::f64::consts::PI).ln() + stirling_correction(x)
        - shift.ln()
}

/// `ln Γ(a + ½) − ln Γ(a)`, accurate in absolute terms even where each `ln Γ` is huge
/// (`a` up to 1e15 and beyond): for `a ≥ 10`, the Stirling forms subtracted by hand,
/// `a·ln(1 + 1/(2a)) + ½ ln a − ½ + S(a + ½) − S(a)`.
fn ln_gamma_half_step(a: f64) -> f64 {
    if a < 10.0 {
        return ln_gamma(a + 0.5) - ln_gamma(a);
    }
    a * (0.5 / a).ln_1p() + 0.5 * a.ln() - 0.5 + stirling_correction(a + 0.5)
        - stirling_correction(a)
}

/// Upper tail `P(T > t)` of Student's t for `t ≥ 0`: `½ I_x(ν/2, ½)` with
/// `x = ν/(ν + t²)`, the regularised incomplete beta function by its continued fraction
/// (Numerical Recipes' `betacf`, modified Lentz) on the side where it converges fast.
/// `ln x`, `ln(1 − x)` and `ln B(ν/2, ½)` are formed without cancellation, so that large
/// `ν` keeps full precision.
fn t_upper_tail(t: f64, dof: f64) -> f64 {
    let r = t * t / dof;
    if r == 0.0 {
        return 0.5;
    }
    let (x, y) = (1.0 / (1.0 + r), r / (1.0 + r));
    let (ln_x, ln_y) = (-r.ln_1p(), r.ln() - r.ln_1p());
    let (a, b) = (0.5 * dof, 0.5);
    // ln B(a, ½) = ln Γ(a) + ln Γ(½) − ln Γ(a + ½).
    let ln_beta = 0.5 * std::f64::consts::PI.ln() - ln_gamma_half_step(a);
    let front = (a * ln_x + b * ln_y - ln_beta).exp();
    let i = if x < (a + 1.0) / (a + b + 2.0) {
        (front * beta_fraction(x, a, b) / a).min(1.0)
    } else {
        (1.0 - front * beta_fraction(y, b, a) / b).max(0.0)
    };
    0.5 * i
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..100_000 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-16 {
            break;
        }
    }
    h
}

/// Cumulative distribution function of Student's t with `dof > 0` degrees of freedom
/// (not necessarily an integer; above 1e6, including ∞, by the normal distribution and
/// the first term of its expansion in `1/dof`). NaN for NaN input or `dof ≤ 0`.
pub fn student_t_cdf(t: f64, dof: f64) -> f64 {
    if t.is_nan() || dof.is_nan() || dof <= 0.0 {
        return f64::NAN;
    }
    if t.is_infinite() {
        return if t > 0.0 { 1.0 } else { 0.0 };
    }
    if dof >= LARGE_DOF {
        // The expansion to 1/ν² (Fisher 1925; its coefficients checked in the tests
        // against the continued fraction); the next term is O(φ(t)·t¹¹/ν³).
        let t2 = t * t;
        let g1 = (t2 + 1.0) * t / 4.0;
        let g2 = (((3.0 * t2 - 7.0) * t2 - 5.0) * t2 - 3.0) * t / 96.0;
        return normal_cdf(t) - normal_pdf(t) * (g1 / dof + g2 / (dof * dof));
    }
    if t >= 0.0 {
        1.0 - t_upper_tail(t, dof)
    } else {
        t_upper_tail(-t, dof)
    }
}

/// Cumulative distribution function of the standard normal distribution, `Φ(t)`.
///
/// `Φ(t) = ½ erfc(-t/√2)` with `erfc(x) = Q(½, x²)`, the regularised upper incomplete
/// gamma function, by its series (`x² < 1.5`) or its continued fraction (beyond), about
/// 1e-15 relative accuracy in either tail. NaN for NaN.
pub fn normal_cdf(t: f64) -> f64 {
    if t.is_nan() {
        return f64::NAN;
    }
    if t.is_infinite() {
        return if t > 0.0 { 1.0 } else { 0.0 };
    }
    // Φ(t) = ½ erfc(-t/√2); erfc(x) = Γ(½, x²)/√π.
    let x = t.abs() / std::f64::consts::SQRT_2;
    let a = x * x;
    let ln_pref = -a + 0.5 * a.ln() - 0.5 * std::f64::consts::PI.ln();
    let tail = if a < 1.5 {
        // Lower series: γ(½, a)/Γ(½) = e^{-a} a^{½} Σ a^n / Γ(n + 3/2).
        let mut term = 1.0 / ln_gamma(1.5).exp();
        let mut sum = term;
        let mut k = 1.5;
        for _ in 0..200 {
            term *= a / k;
            k += 1.0;
            sum += term;
            if term < sum * 1e-17 {
                break;
            }
        }
        let lower = (ln_pref + 0.5 * std::f64::consts::PI.ln()).exp() * sum;
        1.0 - lower
    } else {
        // Upper continued fraction (Lentz) for Γ(½, a)/Γ(½).
        let tiny = 1e-300;
        let mut b = a + 0.5;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..500 {
            let an = -f64::from(i) * (f64::from(i) - 0.5);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-16 {
                break;
            }
        }
        ln_pref.exp() * h
    };
    // `tail` is erfc(x) = P(|Z| > |t|).
    if t >= 0.0 {
        1.0 - 0.5 * tail
    } else {
        0.5 * tail
    }
}

/// Above this many degrees of freedom the t distribution is computed from the normal
/// one by its asymptotic expansion in `1/ν`: the incomplete beta function's continued
/// fraction loses precision there (a parameter of ~1e6 or more, `x` within 1e-6 of 1).
const LARGE_DOF: f64 = 1e6;

fn normal_pdf(t: f64) -> f64 {
    (-0.5 * t * t).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// Density of Student's t.
fn t_pdf(t: f64, dof: f64) -> f64 {
    let ln_c = ln_gamma_half_step(0.5 * dof) - 0.5 * (dof * std::f64::consts::PI).ln();
    (ln_c - 0.5 * (dof + 1.0) * (t * t / dof).ln_1p()).exp()
}

/// Quantile of Student's t with `dof > 0` degrees of freedom: the `t` with
/// `student_t_cdf(t, dof) = p`. ±∞ at `p = 0, 1`; NaN for `p` outside `[0, 1]`, NaN, or
/// `dof ≤ 0`; the normal quantile for `dof = ∞`.
///
/// Works on the smaller tail `q = min(p, 1 - p)`: starts from the Cornish–Fisher
/// expansion in the normal quantile (Abramowitz & Stegun 26.7.5), which is the answer
/// above 1e6 degrees of freedom; below, Newton's method on the tail probability,
/// falling back to bisection whenever a step would leave the current bracket.
pub fn student_t_quantile(p: f64, dof: f64) -> f64 {
    if p.is_nan() || dof.is_nan() || dof <= 0.0 || !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    if p == 0.5 {
        return 0.0;
    }
    let q = p.min(1.0 - p);
    // Cornish–Fisher start (Abramowitz & Stegun 26.7.5), on the upper side.
    let z = -normal_quantile(q);
    let (z2, n) = (z * z, dof);
    let g1 = (z2 + 1.0) * z / 4.0;
    let g2 = ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0;
    let g3 = (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0;
    let mut t = z + g1 / n + g2 / (n * n) + g3 / (n * n * n);
    if dof >= LARGE_DOF {
        // The expansion's next term is O(z⁹/ν⁴): exact in f64 here.
        return if p < 0.5 { -t } else { t };
    }
    if !(t.is_finite() && t > 0.0) {
        t = z.max(1.0);
    }
    // Bracket [lo, hi] with tail(lo) >= q >= tail(hi).
    let (mut lo, mut hi) = (0.0_f64, t);
    while t_upper_tail(hi, dof) > q {
        lo = hi;
        hi *= 2.0;
        if !hi.is_finite() {
            return if p < 0.5 {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            };
        }
    }
    t = t.clamp(lo, hi);
    for _ in 0..200 {
        let f = t_upper_tail(t, dof) - q;
        if f > 0.0 {
            lo = t;
        } else {
            hi = t;
        }
        // tail'(t) = -pdf(t): Newton step towards tail(t) = q.
        let mut next = t + f / t_pdf(t, dof);
        if !(next > lo && next < hi) {
            next = 0.5 * (lo + hi);
        }
        let done = (next - t).abs() <= 1e-15 * next.abs() || hi - lo <= 1e-15 * hi;
        t = next;
        if done {
            break;
        }
    }
    if p < 0.5 {
        -t
    } else {
        t
    }
}

/// Median of the finite values of `values` (the mean of the two middle ones for an even
/// count); NaN if there are none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    // Selection, not a sort: the middle value (and for an even count the largest below
    // it, the greatest of the lower half) in linear time.
    let (lower, mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let mid = *mid;
    if n % 2 == 1 {
        mid
    } else {
        let below = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        0.5 * (below + mid)
    }
}

/// Median of an already sorted slice of finite values; NaN if empty.
pub(crate) fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Median absolute deviation from the median, scaled by 1.4826 so that it estimates
/// the standard deviation of normal data; NaN if there are no finite values.
pub fn mad_sigma(values: &[f64]) -> f64 {
    let m = median(values);
    let dev: Vec<f64> = values
        .iter()
        .filter(|x| x.is_finite())
        .map(|x| (x - m).abs())
        .collect();
    1.482_602_218_505_602 * median(&dev)
}

/// Mean and sample standard deviation (divisor `n - 1`) by two passes; the standard
/// deviation is NaN for fewer than two values, both are NaN for none.
pub(crate) fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, f64::NAN);
    }
    let ss: f64 = values.iter().map(|v| (v - mean) * (v - mean)).sum();
    (mean, (ss / (n - 1) as f64).sqrt())
}
