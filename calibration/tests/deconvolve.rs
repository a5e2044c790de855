//! Deconvolution of stitched logger profiles against known truth (fixed seeds); the
//! kernels and the forward model against slow, obvious references (numerical bin
//! averages, a direct convolution sum); the solver against its optimality conditions.

mod common;

use common::Rng;
use railtrace_calibration::deconvolve::{
    box_kernel, deconvolve, exponential_kernel, fit_at, kernel, sampled_kernel, Deconvolved, Fit,
    Input, LoggerKernel, Options, Profile, Response, Rule,
};
use railtrace_calibration::stats::median;
use railtrace_calibration::stitch::{profile, ProfileBin, Stitched};

// ---------------------------------------------------------------------------------------
// Truth and a simulated logger
// ---------------------------------------------------------------------------------------

/// Piecewise-constant power: `phases` `(start, end, W)` on an idle level.
#[derive(Debug, Clone)]
struct Truth {
    idle: f64,
    phases: Vec<(f64, f64, f64)>,
}

impl Truth {
    /// Two phases of `phase_s` each: 620 W then 430 W, on 140 W idle (the FinGraV
    /// reviewers' compute-heavy then memory-heavy kernel).
    fn two_phase(phase_s: f64) -> Truth {
        Truth {
            idle: 140.0,
            phases: vec![(0.0, phase_s, 620.0), (phase_s, 2.0 * phase_s, 430.0)],
        }
    }

    fn duration(&self) -> f64 {
        self.phases.last().unwrap().1
    }

    /// `∫ P` over `[a, b]`, J.
    fn integral(&self, a: f64, b: f64) -> f64 {
        let mut e = self.idle * (b - a);
        for &(s, t, p) in &self.phases {
            let lo = a.max(s);
            let hi = b.min(t);
            if hi > lo {
                e += (p - self.idle) * (hi - lo);
            }
        }
        e
    }

    fn mean(&self, a: f64, b: f64) -> f64 {
        self.integral(a, b) / (b - a)
    }
}

/// A logger's response, as the twin documents them.
#[derive(Debug, Clone)]
enum Family {
    /// Box average over the last `W` (also the partial-window logger's reading).
    Box(f64),
    /// First-order low pass `τ`.
    Exp(f64),
    /// Staircase response: weights on steps of `Δ`.
    Stairs(f64, Vec<f64>),
}

impl Family {
    /// Step response `G(u)`: the fraction of a unit step at lag `u` seen.
    fn step_response(&self, u: f64) -> f64 {
        if u <= 0.0 {
            return 0.0;
        }
        match self {
            Family::Box(w) => (u / w).min(1.0),
            Family::Exp(tau) => 1.0 - (-u / tau).exp(),
            Family::Stairs(step, w) => {
                let total: f64 = w.iter().sum();
                let mut g = 0.0;
                for (i, wi) in w.iter().enumerate() {
                    let lo = i as f64 * step;
                    g += wi / total * ((u - lo) / step).clamp(0.0, 1.0);
                }
                g
            }
        }
    }

    /// The response for [`kernel`]; the exponential's `len` taps cover `τ_taps·τ`.
    fn response(&self, dt: f64, tau_taps: f64) -> Response<'_> {
        match self {
            Family::Box(w) => Response::Box { width_s: *w },
            Family::Exp(tau) => Response::Exponential {
                tau_s: *tau,
                len: (tau_taps * tau / dt) as usize,
            },
            Family::Stairs(step, w) => Response::Piecewise {
                step_s: *step,
                weights: w,
            },
        }
    }

    /// How long after a change the logger still shows it.
    fn reach(&self) -> f64 {
        match self {
            Family::Box(w) => *w,
            Family::Exp(tau) => 5.0 * tau,
            Family::Stairs(step, w) => step * w.len() as f64,
        }
    }
}

/// The logger's reading stamped at `t`: `gain·(response ∗ P)(t − delay) + offset`,
/// exactly for piecewise-constant power: `P_idle + Σ (P_i − P_idle)·(G(u − s_i) −
/// G(u − e_i))`.
fn reading(truth: &Truth, fam: &Family, logger: (f64, f64, f64), t: f64) -> f64 {
    let (delay, gain, offset) = logger;
    let u = t - delay;
    let mut p = truth.idle;
    for &(s, e, w) in &truth.phases {
        p += (w - truth.idle) * (fam.step_response(u - s) - fam.step_response(u - e));
    }
    gain * p + offset
}

/// A stitched profile: `per_bin` readings per bin of `dt` from `t0` (TOIs uniform in
/// the bin, as random delays give), each with normal noise `sd` and quantised to 1 W,
/// then [`profile`].
struct Stitch {
    t0: f64,
    dt: f64,
    bins: usize,
    per_bin: usize,
    sd: f64,
}

fn stitched(
    rng: &mut Rng,
    truth: &Truth,
    fam: &Family,
    logger: (f64, f64, f64),
    s: &Stitch,
) -> Profile {
    let k0 = (s.t0 / s.dt).round() as i64;
    let mut points = Vec::new();
    for k in 0..s.bins as i64 {
        for _ in 0..s.per_bin {
            let toi = ((k0 + k) as f64 + rng.range(0.001, 0.999)) * s.dt;
            let v = reading(truth, fam, logger, toi) + s.sd * rng.normal();
            points.push(Stitched {
                execution: 0,
                toi,
                power_w: v.round(),
            });
        }
    }
    let bins = profile(&points, s.dt, 0.95).unwrap();
    Profile::from_bins(&bins).unwrap()
}

// ---------------------------------------------------------------------------------------
// Figures of merit
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Figures {
    step_s: f64,
    phase_w: [f64; 2],
    energy_j: f64,
    rms_w: f64,
    raw_rms_w: f64,
}

/// Mean of a cell profile over `[a, b]`.
fn cell_mean(t: &[f64], dt: f64, p: &[f64], a: f64, b: f64) -> f64 {
    let mut e = 0.0;
    for (&tc, &v) in t.iter().zip(p) {
        let lo = (tc - 0.5 * dt).max(a);
        let hi = (tc + 0.5 * dt).min(b);
        if hi > lo {
            e += v * (hi - lo);
        }
    }
    e / (b - a)
}

/// Step time: where the profile, linearly interpolated between cell centres, first
/// falls through the midpoint of its two phases' levels (each the median of the cells
/// in the middle half of its nominal phase).
fn step_time(t: &[f64], p: &[f64], phase: f64) -> f64 {
    let level = |a: f64, b: f64| {
        let v: Vec<f64> = t
            .iter()
            .zip(p)
            .filter(|(&tc, _)| tc > a && tc < b)
            .map(|(_, &v)| v)
            .collect();
        median(&v)
    };
    let mid = 0.5 * (level(0.25 * phase, 0.75 * phase) + level(1.25 * phase, 1.75 * phase));
    for i in 1..t.len() {
        if t[i - 1] > 0.0 && p[i - 1] >= mid && p[i] < mid {
            return t[i - 1] + (t[i] - t[i - 1]) * (p[i - 1] - mid) / (p[i - 1] - p[i]);
        }
    }
    f64::NAN
}

/// RMS error of the corrected cells and of the raw profile's bins against the truth's
/// mean over each, over TOI `[0, end)`.
fn rms(truth: &Truth, d: &Deconvolved, raw: &Profile, end: f64) -> (f64, f64) {
    let dt = d.dt_s;
    let (mut s, mut n) = (0.0, 0.0);
    for (&tc, &v) in d.t.iter().zip(&d.power_w) {
        if tc > 0.0 && tc < end {
            let e = v - truth.mean(tc - 0.5 * dt, tc + 0.5 * dt);
            s += e * e;
            n += 1.0;
        }
    }
    let (mut sr, mut nr) = (0.0, 0.0);
    for (k, &y) in raw.power_w.iter().enumerate() {
        let lo = raw.t0_s + k as f64 * raw.dt_s;
        let tc = lo + 0.5 * raw.dt_s;
        if tc > 0.0 && tc < end && y.is_finite() {
            let e = y - truth.mean(lo, lo + raw.dt_s);
            sr += e * e;
            nr += 1.0;
        }
    }
    ((s / n).sqrt(), (sr / nr).sqrt())
}

fn figures(truth: &Truth, d: &Deconvolved, raw: &Profile, end: f64) -> Figures {
    let phase = truth.phases[0].1;
    let (rms_w, raw_rms_w) = rms(truth, d, raw, end);
    Figures {
        step_s: step_time(&d.t, &d.power_w, phase),
        phase_w: [
            cell_mean(&d.t, d.dt_s, &d.power_w, 0.0, phase),
            cell_mean(&d.t, d.dt_s, &d.power_w, phase, 2.0 * phase),
        ],
        energy_j: d.energy_j,
        rms_w,
        raw_rms_w,
    }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

// ---------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------

/// A seeded stitched profile of a two-phase kernel through a logger, and its input.
struct Scenario {
    truth: Truth,
    family: Family,
    /// Delay, gain, offset.
    logger: (f64, f64, f64),
    dt: f64,
    /// TOI range of the profile.
    t0: f64,
    t1: f64,
    per_bin: usize,
    /// Per-bin standard error aimed at, W.
    se: f64,
}

impl Scenario {
    /// The demo: 2 × 100 µs, a 1 ms box logger with 20 µs delay, gain 0.97, −1.5 W.
    fn demo(dt: f64, se: f64) -> Scenario {
        Scenario {
            truth: Truth::two_phase(100e-6),
            family: Family::Box(1e-3),
            logger: (20e-6, 0.97, -1.5),
            dt,
            t0: -100e-6,
            t1: 1.4e-3,
            per_bin: 16,
            se,
        }
    }

    fn kernel(&self) -> Vec<f64> {
        kernel(&self.family.response(self.dt, 12.0), self.dt, 0.0).unwrap()
    }

    fn input(&self, seed: u64) -> (Input, Profile) {
        let mut rng = Rng::new(seed);
        let stitch = Stitch {
            t0: self.t0,
            dt: self.dt,
            bins: ((self.t1 - self.t0) / self.dt).round() as usize,
            per_bin: self.per_bin,
            sd: self.se * (self.per_bin as f64).sqrt(),
        };
        let raw = stitched(&mut rng, &self.truth, &self.family, self.logger, &stitch);
        let input = Input {
            profile: raw.clone(),
            logger: LoggerKernel {
                kernel: self.kernel(),
                delay_s: self.logger.0,
                gain: self.logger.1,
                offset_w: self.logger.2,
            },
            idle_w: self.truth.idle,
            duration_s: self.truth.duration(),
            gain_sd: 0.0,
            offset_sd_w: 0.0,
            timing_sd_s: 0.0,
            delay_sd_s: 0.0,
        };
        (input, raw)
    }

    fn run(&self, seed: u64, options: &Options) -> (Figures, Deconvolved) {
        let (input, raw) = self.input(seed);
        let start = std::time::Instant::now();
        let d = deconvolve(&input, options).unwrap();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let end = self.truth.duration() + self.family.reach();
        let f = figures(&self.truth, &d, &raw, end);
        let energy = self.truth.integral(0.0, self.truth.duration());
        println!(
            "  dt {:>5.1} µs se {:.1} W seed {:>2}: step {:8.1} µs, phases {:6.1} / {:6.1} W, \
             energy {:+.2} %, rms {:5.1} W vs raw {:5.1} W (ratio {:.3}), λ {:.2e} ({}), \
             χ² {:.0}/{}, {} segments, {:.0} ms",
            self.dt * 1e6,
            self.se,
            seed,
            f.step_s * 1e6,
            f.phase_w[0],
            f.phase_w[1],
            100.0 * (f.energy_j / energy - 1.0),
            f.rms_w,
            f.raw_rms_w,
            f.rms_w / f.raw_rms_w,
            d.lambda,
            d.rule,
            d.chi2,
            d.bins,
            d.segments,
            ms
        );
        (f, d)
    }

    /// The demo's checks.
    fn check_demo(&self, seed: u64, options: &Options) -> Figures {
        let (f, d) = self.run(seed, options);
        let phase = self.truth.phases[0].1;
        let energy = self.truth.integral(0.0, self.truth.duration());
        assert!(d.converged);
        assert!((f.step_s - phase).abs() <= 20e-6, "step {:?}", f);
        assert!(rel(f.phase_w[0], 620.0) <= 0.05, "{:?}", f);
        assert!(rel(f.phase_w[1], 430.0) <= 0.05, "{:?}", f);
        assert!(rel(f.energy_j, energy) <= 0.02, "{:?}", f);
        assert!(f.rms_w <= f.raw_rms_w / 3.0, "{:?}", f);
        f
    }
}

// ---------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------

#[test]
fn two_phase_kernel_through_a_1ms_box_logger() {
    // Per-bin standard errors of 0.5-2 W (16 readings per bin, quantised to 1 W); at
    // 10 µs a 2 W error per bin is at the information limit for the 430 W phase (see
    // the sweep below), so 10 µs bins are checked up to 1 W.
    let cases = [
        (5e-6, 0.5),
        (5e-6, 1.0),
        (5e-6, 2.0),
        (10e-6, 0.5),
        (10e-6, 1.0),
    ];
    let options = Options::default();
    for (dt, se) in cases {
        for seed in 1..=5 {
            Scenario::demo(dt, se).check_demo(seed, &options);
        }
    }
}

#[test]
fn the_raw_profile_is_the_trapezoid() {
    // What the correction is up against: the raw stitched profile of the demo is the
    // 1 ms box average, a trapezoid far from the truth.
    let sc = Scenario::demo(10e-6, 0.5);
    let (input, raw) = sc.input(1);
    let peak = raw.power_w.iter().cloned().fold(f64::MIN, f64::max);
    let expect = 0.97 * (140.0 + (620.0 - 140.0) * 0.1 + (430.0 - 140.0) * 0.1) - 1.5;
    assert!(
        (peak - expect).abs() < 3.0,
        "peak {peak} vs plateau {expect}"
    );
    let d = deconvolve(&input, &Options::default()).unwrap();
    let f = figures(&sc.truth, &d, &raw, 1.2e-3);
    assert!(f.raw_rms_w > 150.0 && f.rms_w < 15.0, "{f:?}");
}

#[test]
fn partial_window_logger_with_a_5ms_kernel() {
    // 25 ms window every 100 ms: each reading is a 25 ms box average (the period only
    // decides which TOIs get readings; stitching spreads them). 5 ms kernel of two
    // phases, 100 µs bins.
    for se in [0.5, 1.0, 2.0] {
        for seed in 1..=3 {
            let sc = Scenario {
                truth: Truth::two_phase(2.5e-3),
                family: Family::Box(25e-3),
                logger: (0.5e-3, 0.954, -1.2),
                dt: 100e-6,
                t0: -2e-3,
                t1: 33e-3,
                per_bin: 16,
                se,
            };
            let (f, d) = sc.run(seed, &Options::default());
            let energy = sc.truth.integral(0.0, sc.truth.duration());
            assert!(d.converged);
            assert!(rel(f.energy_j, energy) <= 0.02, "{f:?}");
            assert!(rel(f.phase_w[0], 620.0) <= 0.10, "{f:?}");
            assert!(rel(f.phase_w[1], 430.0) <= 0.10, "{f:?}");
            assert!(f.rms_w <= f.raw_rms_w / 3.0, "{f:?}");
        }
    }
}

#[test]
fn exponential_logger() {
    // A first-order logger (τ = 300 µs): no zeros in its response, so the same checks
    // as the demo hold.
    for (dt, se) in [(5e-6, 1.0), (10e-6, 1.0), (10e-6, 2.0)] {
        for seed in 1..=3 {
            let sc = Scenario {
                family: Family::Exp(300e-6),
                t1: 1.8e-3,
                ..Scenario::demo(dt, se)
            };
            sc.check_demo(seed, &Options::default());
        }
    }
}

#[test]
fn staircase_response() {
    // A non-parametric response: a staircase rising then falling over 800 µs.
    let stairs = Family::Stairs(100e-6, vec![0.5, 1.0, 2.0, 3.0, 2.0, 1.0, 0.5, 0.2]);
    for seed in 1..=3 {
        let sc = Scenario {
            family: stairs.clone(),
            ..Scenario::demo(5e-6, 1.0)
        };
        sc.check_demo(seed, &Options::default());
    }
}

#[test]
fn without_standard_errors_the_noise_comes_from_the_data() {
    for seed in 1..=3 {
        let sc = Scenario::demo(5e-6, 1.0);
        let (mut input, raw) = sc.input(seed);
        input.profile.se_w = None;
        let d = deconvolve(&input, &Options::default()).unwrap();
        assert_eq!(d.rule, "discrepancy (noise from the residuals)");
        // Second differences see the readings' scatter: about 1 W per bin.
        assert!((d.noise_scale - 1.0).abs() < 0.25, "{}", d.noise_scale);
        let f = figures(&sc.truth, &d, &raw, 1.2e-3);
        println!("  no standard errors, seed {seed}: {f:?}");
        assert!((f.step_s - 100e-6).abs() <= 20e-6, "{f:?}");
        assert!(rel(f.phase_w[0], 620.0) <= 0.05 && rel(f.phase_w[1], 430.0) <= 0.05);
        assert!(rel(f.energy_j, sc.truth.integral(0.0, 200e-6)) <= 0.02);
        assert!(f.rms_w <= f.raw_rms_w / 3.0);
    }
}

#[test]
fn misstated_standard_errors_give_way_to_the_data() {
    // Standard errors off by 3× either way: the second differences show it, and the
    // rule scales the noise by what the data show.
    for factor in [1.0 / 3.0, 3.0] {
        let sc = Scenario::demo(5e-6, 1.0);
        let (mut input, raw) = sc.input(3);
        if let Some(se) = input.profile.se_w.as_mut() {
            se.iter_mut().for_each(|s| *s *= factor);
        }
        let d = deconvolve(&input, &Options::default()).unwrap();
        assert_eq!(d.rule, "discrepancy (noise scaled from the residuals)");
        assert!(rel(d.noise_scale, 1.0 / factor) < 0.25, "{}", d.noise_scale);
        let f = figures(&sc.truth, &d, &raw, 1.2e-3);
        assert!((f.step_s - 100e-6).abs() <= 20e-6, "{f:?}");
        assert!(rel(f.phase_w[0], 620.0) <= 0.05 && rel(f.phase_w[1], 430.0) <= 0.05);
    }
}

#[test]
fn a_misfit_logger_still_returns() {
    // A delay 200 µs off: no λ meets the discrepancy; the fallback still answers, fast.
    let sc = Scenario::demo(5e-6, 1.0);
    let (mut input, _) = sc.input(3);
    input.logger.delay_s += 200e-6;
    let start = std::time::Instant::now();
    let d = deconvolve(&input, &Options::default()).unwrap();
    println!(
        "  misfit: rule {}, {} segments, χ² {:.0}/{}, {:.0} ms",
        d.rule,
        d.segments,
        d.chi2,
        d.bins,
        start.elapsed().as_secs_f64() * 1e3
    );
    assert!(d.power_w.iter().all(|p| p.is_finite() && *p >= 0.0));
}

/// The `n` bins from `t0`, `dt` wide, of noise-free readings: each the bin's average by
/// the midpoint rule on 4000 points (the reading is piecewise smooth, so this is exact to
/// ~1e-8).
fn bin_averages(
    truth: &Truth,
    fam: &Family,
    logger: (f64, f64, f64),
    t0: f64,
    dt: f64,
    n: usize,
) -> Vec<f64> {
    let m: usize = 4000;
    (0..n)
        .map(|k| {
            let lo = t0 + k as f64 * dt;
            (0..m)
                .map(|i| reading(truth, fam, logger, lo + (i as f64 + 0.5) * dt / m as f64))
                .sum::<f64>()
                / m as f64
        })
        .collect()
}

#[test]
fn noise_free_readings_are_inverted_exactly() {
    // Exact bin averages of the two-phase kernel: the steps are recovered to rounding.
    for fam in [
        Family::Box(1e-3),
        Family::Exp(300e-6),
        Family::Box(1.0037e-3),
    ] {
        let dt = 10e-6;
        let truth = Truth::two_phase(100e-6);
        let logger = (30e-6, 1.0, 0.0);
        let t0 = -100e-6;
        let n = 150;
        let y = bin_averages(&truth, &fam, logger, t0, dt, n);
        let h = match fam {
            Family::Exp(tau) => exponential_kernel(tau, dt, 2000).unwrap(),
            Family::Box(w) => box_kernel(w, dt).unwrap(),
            Family::Stairs(..) => unreachable!(),
        };
        let input = Input {
            profile: Profile {
                t0_s: t0,
                dt_s: dt,
                power_w: y,
                se_w: Some(vec![1e-6; n]),
                exact: Vec::new(),
            },
            logger: LoggerKernel {
                kernel: h,
                delay_s: logger.0,
                gain: 1.0,
                offset_w: 0.0,
            },
            idle_w: truth.idle,
            duration_s: 200e-6,
            gain_sd: 0.0,
            offset_sd_w: 0.0,
            timing_sd_s: 0.0,
            delay_sd_s: 0.0,
        };
        let d = deconvolve(
            &input,
            &Options {
                bootstrap: 0,
                ..Options::default()
            },
        )
        .unwrap();
        let worst =
            d.t.iter()
                .zip(&d.power_w)
                .filter(|(&tc, _)| tc < 1.0e-3)
                .map(|(&tc, &p)| (p - truth.mean(tc - 0.5 * dt, tc + 0.5 * dt)).abs())
                .fold(0.0, f64::max);
        println!(
            "  noise-free {fam:?}: worst cell error {worst:.2e} W, {} segments",
            d.segments
        );
        assert!(worst < 1e-3, "{fam:?}: {worst}");
    }
}

#[test]
fn the_energy_is_exact_when_the_kernel_ends_inside_a_cell() {
    // Cells of 30 µs on a 200 µs kernel: the last free cell, [180, 210) µs, holds 20 µs of
    // the second phase and 10 µs of idle. Its whole excess over idle is the kernel's, so
    // noise-free readings give the kernel's energy to rounding; cut at the end, the cell
    // would lose a third of its excess (about 1 % of the energy here).
    let (dt, t0, n) = (30e-6, -90e-6, 60);
    let truth = Truth::two_phase(100e-6);
    let fam = Family::Box(1e-3);
    let logger = (30e-6, 1.0, 0.0);
    let y = bin_averages(&truth, &fam, logger, t0, dt, n);
    let input = Input {
        profile: Profile {
            t0_s: t0,
            dt_s: dt,
            power_w: y,
            se_w: Some(vec![1e-6; n]),
            exact: Vec::new(),
        },
        logger: LoggerKernel {
            kernel: box_kernel(1e-3, dt).unwrap(),
            delay_s: logger.0,
            gain: 1.0,
            offset_w: 0.0,
        },
        idle_w: truth.idle,
        duration_s: 200e-6,
        gain_sd: 0.0,
        offset_sd_w: 0.0,
        timing_sd_s: 0.0,
        delay_sd_s: 0.0,
    };
    let d = deconvolve(
        &input,
        &Options {
            bootstrap: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let energy = truth.integral(0.0, 200e-6);
    let cut: f64 = (d.t.iter().zip(&d.power_w))
        .map(|(&tc, &p)| p * ((tc + 0.5 * dt).min(200e-6) - (tc - 0.5 * dt).max(0.0)).max(0.0))
        .sum();
    println!(
        "  energy {:+.4} % off the truth; cut at the end {:+.4} %",
        100.0 * (d.energy_j / energy - 1.0),
        100.0 * (cut / energy - 1.0)
    );
    // The cells that hold a step (at 100 µs and at the end) are fitted as flat, which the
    // 1 ms box reads to within dt/window of its exact position: a few parts in 10⁴.
    assert!(
        rel(d.energy_j, energy) < 1e-3,
        "{} J, truth {energy} J",
        d.energy_j
    );
}

// ---------------------------------------------------------------------------------------
// Kernels against a slow bin average
// ---------------------------------------------------------------------------------------

/// The stitched bin `k`'s mean reading for unit power in cell `c = k − j` (others 0),
/// by the midpoint rule: `(1/dt)∫_bin G(t − d − lo_c) − G(t − d − hi_c) dt`.
fn slow_tap(fam: &Family, dt: f64, delay: f64, j: usize) -> f64 {
    let m: usize = 20_000;
    (0..m)
        .map(|i| {
            let t = (j as f64 + (i as f64 + 0.5) / m as f64) * dt - delay;
            fam.step_response(t) - fam.step_response(t - dt)
        })
        .sum::<f64>()
        / m as f64
}

#[test]
fn kernels_match_a_slow_bin_average() {
    let dt = 10e-6;
    let cases: Vec<(Family, f64)> = vec![
        (Family::Box(1e-3), 0.0),
        (Family::Box(1.0037e-3), 0.0),
        (Family::Box(1.0037e-3), 23.4e-6),
        (Family::Box(4.3e-6), 0.0), // narrower than a bin
        (Family::Exp(300e-6), 0.0),
        (Family::Exp(300e-6), 17e-6),
        (
            Family::Stairs(37e-6, vec![0.0, 1.0, 3.0, 0.5, 0.0, 2.0]),
            5e-6,
        ),
    ];
    for (fam, delay) in cases {
        let h = kernel(&fam.response(dt, 130.0), dt, delay).unwrap();
        let sum: f64 = h.iter().sum();
        assert!((sum - 1.0).abs() < 1e-12, "{fam:?}: sum {sum}");
        let mut worst: f64 = 0.0;
        for (j, &hj) in h.iter().enumerate().take(200) {
            worst = worst.max((hj - slow_tap(&fam, dt, delay, j)).abs());
        }
        // The midpoint rule on 20 000 points: ~1e-9 on a piecewise-linear integrand.
        assert!(worst < 1e-7, "{fam:?} delay {delay}: {worst}");
        if let Family::Box(w) = fam {
            // Taps j with (j − 1)·dt < W + d.
            let x = (w + delay) / dt;
            let last = if (x - x.round()).abs() < 1e-9 {
                x.round()
            } else {
                x.ceil()
            };
            assert_eq!(h.len(), last as usize + 1);
        }
    }
    // A whole number of bins: half taps at both ends.
    let h = box_kernel(1e-3, 10e-6).unwrap();
    assert_eq!(h.len(), 101);
    assert!((h[0] - 0.005).abs() < 1e-15 && (h[100] - 0.005).abs() < 1e-15);
    assert!(h[1..100].iter().all(|&v| (v - 0.01).abs() < 1e-15));
    // The helpers are `kernel` with no delay.
    assert_eq!(
        exponential_kernel(300e-6, 10e-6, 50).unwrap(),
        kernel(
            &Response::Exponential {
                tau_s: 300e-6,
                len: 50
            },
            10e-6,
            0.0
        )
        .unwrap()
    );
    // A one-step staircase is a box.
    let a = kernel(
        &Response::Piecewise {
            step_s: 1.0037e-3,
            weights: &[2.0],
        },
        dt,
        0.0,
    )
    .unwrap();
    let b = box_kernel(1.0037e-3, dt).unwrap();
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-15));
}

/// A logger read at its update instants, the ends of cells of random power: each reading
/// by the logger's own definition (a box's mean from the cells' overlaps with its window,
/// a low pass stepped exactly through each cell, a staircase as a sum of windows) against
/// `Σ_j h_j·P_{k−j}` with the sampled kernel.
#[test]
fn sampled_kernels_read_at_the_ends_of_cells() {
    let dt = 0.1;
    let mut rng = Rng::new(0x5A3D);
    let cells: Vec<f64> = (0..400).map(|_| rng.range(100.0, 400.0)).collect();
    // ∫ P over [a, b] from the cells' overlaps (cell c on [c·dt, (c+1)·dt)).
    let integral = |a: f64, b: f64| -> f64 {
        (cells.iter().enumerate())
            .map(|(c, p)| {
                let (lo, hi) = (c as f64 * dt, (c + 1) as f64 * dt);
                p * (b.min(hi) - a.max(lo)).max(0.0)
            })
            .sum()
    };
    let stairs = [0.0, 1.0, 3.0, 0.5, 2.0];
    type Reading<'a> = Box<dyn Fn(usize) -> f64 + 'a>;
    let cases: Vec<(Family, Reading<'_>)> = vec![
        (
            Family::Box(1.1137),
            Box::new(|k| {
                let u = (k + 1) as f64 * dt;
                integral(u - 1.1137, u) / 1.1137
            }),
        ),
        (
            Family::Box(0.25),
            Box::new(|k| {
                let u = (k + 1) as f64 * dt;
                integral(u - 0.25, u) / 0.25
            }),
        ),
        (
            Family::Exp(0.053),
            Box::new(|k| {
                // Exactly through each cell of constant power, from the first cell's
                // level (the kernel's earlier cells are taken at it too).
                let mut y = cells[0];
                for p in &cells[..=k] {
                    y = p + (y - p) * (-dt / 0.053f64).exp();
                }
                y
            }),
        ),
        (
            Family::Stairs(0.037, stairs.to_vec()),
            Box::new(|k| {
                let u = (k + 1) as f64 * dt;
                let total: f64 = stairs.iter().sum();
                (stairs.iter().enumerate())
                    .map(|(i, w)| {
                        let hi = u - i as f64 * 0.037;
                        w / total * integral(hi - 0.037, hi) / 0.037
                    })
                    .sum()
            }),
        ),
    ];
    for (fam, reading) in cases {
        let h = sampled_kernel(&fam.response(dt, 40.0), dt).unwrap();
        assert!((h.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{fam:?}");
        let mut worst: f64 = 0.0;
        for k in h.len()..cells.len() {
            let conv: f64 = h.iter().enumerate().map(|(j, hj)| hj * cells[k - j]).sum();
            worst = worst.max((conv - reading(k)).abs());
        }
        // Both exact; the kernel's exponential tail is cut at e^{−40}.
        assert!(worst < 1e-9, "{fam:?}: {worst} W");
    }
    // A box of one cell reads each cell alone; readings spread through bins do not.
    assert_eq!(
        sampled_kernel(&Family::Box(dt).response(dt, 1.0), dt).unwrap(),
        vec![1.0]
    );
    assert_eq!(
        kernel(&Family::Box(dt).response(dt, 1.0), dt, 0.0).unwrap(),
        vec![0.5, 0.5]
    );
}

// ---------------------------------------------------------------------------------------
// The forward model and the optimality conditions, against a direct convolution sum
// ---------------------------------------------------------------------------------------

/// Direct sum `ŷ_k = offset + δ + gain·Σ_j h_j P(k − s − j)` (cells before the fit's
/// first cell at idle), a fractional delay as the mix of the two whole shifts.
fn direct_readings(input: &Input, fit_t: &[f64], power: &[f64], delta: f64) -> Vec<f64> {
    let p = &input.profile;
    let dt = p.dt_s;
    let c_start = ((fit_t[0] - 0.5 * dt - p.t0_s) / dt).round() as i64;
    let cell = |c: i64| -> f64 {
        if c < c_start {
            input.idle_w
        } else {
            power[(c - c_start) as usize]
        }
    };
    let x = input.logger.delay_s / dt;
    let s = (x + 1e-9).floor();
    let f = x - s;
    let h = &input.logger.kernel;
    (0..p.power_w.len() as i64)
        .map(|k| {
            let conv = |shift: i64| -> f64 {
                h.iter()
                    .enumerate()
                    .map(|(j, hj)| hj * cell(k - shift - j as i64))
                    .sum()
            };
            let v = (1.0 - f) * conv(s as i64)
                + if f > 1e-9 {
                    f * conv(s as i64 + 1)
                } else {
                    0.0
                };
            input.logger.offset_w + delta + input.logger.gain * v
        })
        .collect()
}

/// Gradient of `½ Σ w (ŷ − y)²` in each fitted cell by the direct sum
/// `∇_i = Σ_k w_k (ŷ_k − y_k)·∂ŷ_k/∂P_i`, `∂ŷ_k/∂P_i = gain·h_{k − s − c_i}` (mixed over
/// the two whole shifts for a fractional delay).
fn direct_gradient(input: &Input, fit: &Fit) -> Vec<f64> {
    let p = &input.profile;
    let dt = p.dt_s;
    let yhat = direct_readings(input, &fit.t, &fit.power_w, fit.offset_fit_w);
    let x = input.logger.delay_s / dt;
    let s = (x + 1e-9).floor() as i64;
    let f = x - s as f64;
    let h = &input.logger.kernel;
    let tap = |j: i64| -> f64 {
        let at = |j: i64| {
            if j >= 0 && (j as usize) < h.len() {
                h[j as usize]
            } else {
                0.0
            }
        };
        if f > 1e-9 {
            (1.0 - f) * at(j) + f * at(j - 1)
        } else {
            at(j)
        }
    };
    let c_start = ((fit.t[0] - 0.5 * dt - p.t0_s) / dt).round() as i64;
    (0..fit.t.len())
        .map(|i| {
            if i < fit.first_free {
                return 0.0;
            }
            let c = c_start + i as i64;
            (0..p.power_w.len())
                .filter(|&k| fit.weights[k] > 0.0)
                .map(|k| {
                    fit.weights[k]
                        * (yhat[k] - p.power_w[k])
                        * input.logger.gain
                        * tap(k as i64 - s - c)
                })
                .sum()
        })
        .collect()
}

/// The KKT conditions of `½χ² + λ Σ_pen |P_i − P_{i−1}|`, `P ≥ 0`, in the jumps:
/// `g_m = Σ_{i ≥ m} ∇_i`, `R_m = Σ_{i ≥ m} μ_i`: free jumps `g − R = 0`; penalised
/// nonzero jumps `g − R = −λ·sign`; zero jumps `|g − R| ≤ λ`; `μ ≥ 0`, `μ·P = 0`.
/// Returns the worst violation relative to `max |g| + λ`.
fn kkt_violation(input: &Input, fit: &Fit) -> f64 {
    let grad = direct_gradient(input, fit);
    let n = fit.t.len();
    let lambda = fit.lambda;
    // The offset correction is free: Σ w (ŷ − y) = 0.
    let yhat = direct_readings(input, &fit.t, &fit.power_w, fit.offset_fit_w);
    let (mut d_offset, mut d_scale) = (0.0, 0.0);
    for (k, y) in input.profile.power_w.iter().enumerate() {
        if fit.weights[k] > 0.0 {
            d_offset += fit.weights[k] * (yhat[k] - y);
            d_scale += fit.weights[k] * (yhat[k] - y).abs();
        }
    }
    assert!(fit.offset_fit_w != 0.0, "the offset correction was fitted");
    assert!(
        d_offset.abs() < 1e-9 * d_scale,
        "offset gradient {d_offset}"
    );
    let pmax = fit.power_w.iter().fold(input.idle_w, |m, v| m.max(v.abs()));
    // Past the free cells the power is held at idle: a jump moves the cells up to
    // there only.
    let e = fit.free_end;
    let (mut g, mut r) = (vec![0.0; e + 1], vec![0.0; e + 1]);
    for i in (0..e).rev() {
        g[i] = g[i + 1] + grad[i];
        r[i] = r[i + 1] + fit.multipliers[i];
    }
    let scale = g.iter().fold(0.0_f64, |m, v| m.max(v.abs())) + lambda;
    let mut worst: f64 = 0.0;
    assert!(fit.power_w[e..n].iter().all(|&p| p == input.idle_w));
    for m in fit.first_free..e {
        let prev = if m == fit.first_free {
            input.idle_w
        } else {
            fit.power_w[m - 1]
        };
        let u = fit.power_w[m] - prev;
        let d = g[m] - r[m];
        let v = if !fit.penalised[m] {
            d.abs()
        } else if u.abs() > 1e-9 * pmax {
            (d + lambda * u.signum()).abs()
        } else {
            (d.abs() - lambda).max(0.0)
        };
        worst = worst.max(v / scale);
        let mu = fit.multipliers[m];
        assert!(mu >= 0.0, "multiplier {mu} at {m}");
        assert!(
            fit.power_w[m] >= -1e-9 * pmax,
            "P {} at {m}",
            fit.power_w[m]
        );
        if mu > 0.0 {
            assert!(fit.power_w[m].abs() <= 1e-9 * pmax, "μ > 0 where P > 0");
        }
    }
    worst
}

#[test]
fn fitted_readings_match_a_direct_convolution_sum() {
    for delay in [20e-6, 23.7e-6, -10e-6] {
        let sc = Scenario {
            logger: (delay, 0.97, -1.5),
            ..Scenario::demo(10e-6, 1.0)
        };
        let (input, _) = sc.input(7);
        for lambda in [1.0, 0.05] {
            let fit = fit_at(&input, &Options::default(), lambda).unwrap();
            let direct = direct_readings(&input, &fit.t, &fit.power_w, fit.offset_fit_w);
            let worst = fit
                .fitted_w
                .iter()
                .zip(&direct)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-9, "delay {delay}, λ {lambda}: {worst}");
            let chi2: f64 = (0..direct.len())
                .map(|k| fit.weights[k] * (direct[k] - input.profile.power_w[k]).powi(2))
                .sum();
            assert!(rel(fit.chi2, chi2) < 1e-9, "χ² {} vs {chi2}", fit.chi2);
        }
    }
}

#[test]
fn the_solver_meets_its_optimality_conditions() {
    // Along λ on the demo's data, down to λ small enough that P ≥ 0 binds.
    let sc = Scenario::demo(10e-6, 2.0);
    let (input, _) = sc.input(23);
    let mut held_seen = false;
    for lambda in [10.0, 1.0, 0.1, 0.02, 5e-3, 2e-3, 5e-4, 1e-4] {
        let fit = fit_at(&input, &Options::default(), lambda).unwrap();
        let held = fit.multipliers.iter().filter(|&&m| m > 0.0).count();
        held_seen |= held > 0;
        let v = kkt_violation(&input, &fit);
        println!(
            "  λ {lambda:.0e}: {} segments, {held} cells held at 0, {} iterations, KKT {v:.1e}",
            fit.segments, fit.iterations
        );
        assert!(fit.converged);
        assert!(v < 1e-8, "λ {lambda}: KKT violation {v}");
    }
    assert!(held_seen, "P ≥ 0 never bound");

    // A kernel that really goes to 0 W, from 0 W idle, with a fractional delay and no
    // free jump at the end.
    let sc = Scenario {
        truth: Truth {
            idle: 0.0,
            phases: vec![(0.0, 100e-6, 300.0), (100e-6, 200e-6, 0.0)],
        },
        logger: (12.5e-6, 1.0, 0.0),
        ..Scenario::demo(10e-6, 2.0)
    };
    let (input, _) = sc.input(3);
    let options = Options {
        end_jump_free: false,
        ..Options::default()
    };
    held_seen = false;
    for lambda in [1.0, 0.1, 0.01] {
        let fit = fit_at(&input, &options, lambda).unwrap();
        let v = kkt_violation(&input, &fit);
        let zeros = fit.power_w[fit.first_free..]
            .iter()
            .filter(|&&p| p == 0.0)
            .count();
        let held = fit.multipliers.iter().filter(|&&m| m > 0.0).count();
        held_seen |= held > 0;
        println!(
            "  zero idle, λ {lambda:.0e}: {} segments, {zeros} cells at 0 W, {held} held, \
             KKT {v:.1e}",
            fit.segments
        );
        assert!(fit.converged && v < 1e-8, "λ {lambda}: {v}");
        assert!(fit.power_w.iter().all(|&p| p >= 0.0));
    }
    assert!(held_seen, "P ≥ 0 never bound");
}

#[test]
fn the_refit_is_least_squares_on_its_segments() {
    // Each segment's level of the refitted profile zeroes the gradient summed over its
    // cells (or, at 0 W, the gradient points up).
    for seed in [1, 2] {
        let sc = Scenario::demo(5e-6, 1.0);
        let (input, _) = sc.input(seed);
        let d = deconvolve(
            &input,
            &Options {
                bootstrap: 0,
                ..Options::default()
            },
        )
        .unwrap();
        let first_free = d.t.iter().position(|&t| t > 0.0).unwrap();
        let fit = Fit {
            lambda: d.lambda,
            t: d.t.clone(),
            power_w: d.power_w.clone(),
            first_free,
            free_end: d.free_end,
            penalised: vec![true; d.t.len()],
            multipliers: vec![0.0; d.t.len()],
            weights: fit_at(&input, &Options::default(), 1.0).unwrap().weights,
            fitted_w: d.fitted_w.clone(),
            offset_fit_w: d.offset_fit_w,
            chi2: d.chi2,
            segments: d.segments,
            iterations: 0,
            converged: true,
        };
        let grad = direct_gradient(&input, &fit);
        let scale = grad.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
        let mut start = first_free;
        let mut segments = 0;
        for i in first_free + 1..=d.free_end {
            if i == d.free_end || d.power_w[i] != d.power_w[i - 1] {
                let sum: f64 = grad[start..i].iter().sum();
                assert!(sum.abs() < 1e-8 * scale, "segment {start}..{i}: {sum}");
                segments += 1;
                start = i;
            }
        }
        assert_eq!(segments, d.segments);
    }
}

// ---------------------------------------------------------------------------------------
// Band, rules, determinism, errors, timing
// ---------------------------------------------------------------------------------------

#[test]
fn the_band_is_a_seeded_bootstrap() {
    let sc = Scenario::demo(5e-6, 1.0);
    let (input, _) = sc.input(4);
    let options = Options::default();
    let a = deconvolve(&input, &options).unwrap();
    let b = deconvolve(&input, &options).unwrap();
    assert_eq!(a, b, "same seed, same result");
    let c = deconvolve(
        &input,
        &Options {
            seed: 99,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(a.power_w, c.power_w);
    assert_ne!(a.lo_w, c.lo_w);
    assert!(a
        .lo_w
        .iter()
        .zip(&a.power_w)
        .zip(&a.hi_w)
        .all(|((l, p), h)| l <= p && p <= h && *l >= 0.0));
    let energy = sc.truth.integral(0.0, 200e-6);
    println!(
        "  energy {:.5} J, band [{:.5}, {:.5}] J, truth {energy:.5} J",
        a.energy_j, a.energy_lo_j, a.energy_hi_j
    );
    // How often the band holds the truth is the coverage tests' to say; this one band
    // holds its estimate and has a width.
    assert!(a.energy_lo_j <= a.energy_j && a.energy_j <= a.energy_hi_j);
    assert!(a.energy_hi_j - a.energy_lo_j > 1e-4 * energy);
    // Cells before TOI 0 are the idle level, exactly.
    for (i, &t) in a.t.iter().enumerate() {
        if t < 0.0 {
            assert_eq!((a.power_w[i], a.lo_w[i], a.hi_w[i]), (140.0, 140.0, 140.0));
        }
    }
    let none = deconvolve(
        &input,
        &Options {
            bootstrap: 0,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(none.lo_w, none.power_w);
    assert_eq!(none.power_w, a.power_w);
}

#[test]
fn other_rules() {
    let sc = Scenario::demo(10e-6, 1.0);
    let (input, _) = sc.input(5);
    let fixed = deconvolve(
        &input,
        &Options {
            rule: Rule::Fixed(0.5),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!((fixed.lambda, fixed.rule), (0.5, "fixed"));
    let gcv = deconvolve(
        &input,
        &Options {
            rule: Rule::Gcv,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(gcv.rule, "gcv");
    assert!(gcv.converged && gcv.lambda > 0.0);
    // Without the refit the TV solution itself (steps shrunk by the penalty).
    let tv = deconvolve(
        &input,
        &Options {
            refit: false,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(tv.converged);
    assert!(rel(tv.energy_j, sc.truth.integral(0.0, 200e-6)) < 0.02);
}

#[test]
fn bad_input_is_an_error() {
    let sc = Scenario::demo(10e-6, 1.0);
    let (input, _) = sc.input(1);
    let o = Options::default();
    let bad = |f: &dyn Fn(&mut Input)| {
        let mut i = input.clone();
        f(&mut i);
        deconvolve(&i, &o).is_err()
    };
    assert!(bad(&|i| i.profile.dt_s = 0.0));
    assert!(bad(&|i| i.profile.t0_s = f64::NAN));
    assert!(bad(&|i| i
        .profile
        .power_w
        .iter_mut()
        .for_each(|y| *y = f64::NAN)));
    assert!(bad(&|i| i.profile.se_w = Some(vec![1.0; 3])));
    assert!(bad(&|i| i.logger.kernel = vec![]));
    assert!(bad(&|i| i.logger.kernel = vec![0.5, -0.1]));
    assert!(bad(&|i| i.logger.gain = 0.0));
    assert!(bad(&|i| i.logger.delay_s = f64::INFINITY));
    assert!(bad(&|i| i.idle_w = -1.0));
    assert!(bad(&|i| i.duration_s = 0.0));
    assert!(bad(&|i| i.duration_s = 1.0)); // past the last cell seen
    assert!(bad(&|i| i.profile.t0_s = -10e-3)); // no reading sees TOI ≥ 0
    assert!(bad(&|i| i.profile.t0_s = 10.0)); // a million cells from TOI 0
    assert!(deconvolve(
        &input,
        &Options {
            confidence: 1.0,
            ..o.clone()
        }
    )
    .is_err());
    assert!(deconvolve(
        &input,
        &Options {
            rule: Rule::Fixed(-1.0),
            ..o.clone()
        }
    )
    .is_err());
    assert!(fit_at(&input, &o, f64::NAN).is_err());
    assert!(box_kernel(0.0, 1e-6).is_err());
    assert!(box_kernel(1e-3, -1e-6).is_err());
    assert!(exponential_kernel(1e-3, 1e-5, 0).is_err());
    assert!(kernel(&Response::Box { width_s: 1e-3 }, 1e-5, -1e-6).is_err());
    assert!(kernel(
        &Response::Piecewise {
            step_s: 1e-4,
            weights: &[0.0, 0.0]
        },
        1e-5,
        0.0
    )
    .is_err());
    assert!(Profile::from_bins(&[]).is_err());
}

#[test]
fn timing() {
    // Not a benchmark (figures vary with the machine): printed for the README. A
    // release build solves the demo's 300 bins with the λ search and 100 bootstrap
    // replicates in milliseconds.
    for (dt, se) in [(5e-6, 1.0), (10e-6, 1.0)] {
        let sc = Scenario::demo(dt, se);
        let (input, _) = sc.input(1);
        for bootstrap in [0, 100] {
            let start = std::time::Instant::now();
            let d = deconvolve(
                &input,
                &Options {
                    bootstrap,
                    ..Options::default()
                },
            )
            .unwrap();
            println!(
                "  {} bins, {} bootstrap: {:.1} ms",
                d.bins,
                bootstrap,
                start.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

/// Failure rates over 30 seeds per configuration, for the README (slow in a debug
/// build): `cargo test --release -p railtrace-calibration --test deconvolve sweep --
/// --ignored --nocapture`. The partial-window rows check phases to 10 %.
#[test]
#[ignore]
fn sweep() {
    let mut configs: Vec<(String, Scenario, f64)> = Vec::new();
    for fam in [Family::Box(1e-3), Family::Exp(300e-6)] {
        for dt in [5e-6, 10e-6] {
            for se in [0.5, 1.0, 2.0] {
                let sc = Scenario {
                    family: fam.clone(),
                    t1: 1.2e-3 + fam.reach(),
                    ..Scenario::demo(dt, se)
                };
                configs.push((format!("{fam:?} dt {:.0} µs se {se} W", dt * 1e6), sc, 5.0));
            }
        }
    }
    for se in [0.5, 1.0, 2.0] {
        let sc = Scenario {
            truth: Truth::two_phase(2.5e-3),
            family: Family::Box(25e-3),
            logger: (0.5e-3, 0.954, -1.2),
            dt: 100e-6,
            t0: -2e-3,
            t1: 33e-3,
            per_bin: 16,
            se,
        };
        configs.push((
            format!("partial 25 ms, 5 ms kernel, dt 100 µs se {se} W"),
            sc,
            10.0,
        ));
    }
    for (name, sc, phase_tol) in configs {
        let phase = sc.truth.phases[0].1;
        let energy = sc.truth.integral(0.0, sc.truth.duration());
        let (mut worst, mut fails, mut ms) = ([0.0_f64; 4], 0, 0.0);
        for seed in 100..130 {
            let (input, raw) = sc.input(seed);
            let start = std::time::Instant::now();
            let d = deconvolve(&input, &Options::default()).unwrap();
            ms += start.elapsed().as_secs_f64() * 1e3 / 30.0;
            let f = figures(&sc.truth, &d, &raw, sc.truth.duration() + sc.family.reach());
            let e = [
                (f.step_s - phase).abs() * 1e6,
                100.0 * rel(f.phase_w[0], 620.0).max(rel(f.phase_w[1], 430.0)),
                100.0 * rel(f.energy_j, energy),
                f.rms_w / f.raw_rms_w,
            ];
            let step_ok = phase_tol > 5.0 || e[0] <= 20.0;
            if !step_ok || e[1] > phase_tol || e[2] > 2.0 || e[3] > 1.0 / 3.0 {
                fails += 1;
            }
            for (w, v) in worst.iter_mut().zip(e) {
                *w = w.max(v);
            }
        }
        println!(
            "{name}: worst step {:.1} µs, phase {:.1} %, energy {:.2} %, RMS ratio {:.3}; \
             {fails}/30 fail a check; {ms:.1} ms each",
            worst[0], worst[1], worst[2], worst[3]
        );
    }
}

/// Coverage of the bootstrap bands over 30 seeds: a band labelled 95 % must hold the
/// truth about that often. Of 30 draws at a true 95 %, 26 or more hold it with
/// probability 0.94, so fewer than 26 for the energy fails; the cells pool about 1 500
/// draws per configuration (correlated within a run), held to 95 %.
/// The scale's and the level's uncertainty (`gain_sd`, `offset_sd_w`) reach every cell,
/// those held at the idle level too: each replicate draws one scale and one offset, so
/// before TOI 0 the band is the normal quantiles of `√((P·gain_sd)² + offset_sd²)`. The
/// 2.5 % and 97.5 % quantiles of 100 draws scatter by about 0.27 standard deviations,
/// and the band takes the wider of two intervals: its half-width lies within 1.96 ± 0.7
/// deviations (the seed is fixed; any seed passes with probability above 98 %).
#[test]
fn the_band_carries_the_scales_and_the_levels_uncertainty() {
    let sc = Scenario::demo(5e-6, 1.0);
    let (mut input, _) = sc.input(4);
    input.gain_sd = 0.002;
    input.offset_sd_w = 0.5;
    let a = deconvolve(&input, &Options::default()).unwrap();
    let sd = (140.0f64 * 0.002).hypot(0.5);
    let before: Vec<usize> = (0..a.t.len()).filter(|&i| a.t[i] < 0.0).collect();
    assert!(!before.is_empty());
    for i in before {
        let half = 0.5 * (a.hi_w[i] - a.lo_w[i]);
        assert!(
            (1.3 * sd..=2.7 * sd).contains(&half),
            "{half} W against {sd} W"
        );
        assert_eq!(a.power_w[i], 140.0);
    }
    let plain = deconvolve(
        &Input {
            gain_sd: 0.0,
            offset_sd_w: 0.0,
            timing_sd_s: 0.0,
            delay_sd_s: 0.0,
            ..input.clone()
        },
        &Options::default(),
    )
    .unwrap();
    assert_eq!(plain.power_w, a.power_w, "the estimate is the same");
    let width = |d: &Deconvolved| d.energy_hi_j - d.energy_lo_j;
    assert!(width(&a) > width(&plain));
    for (name, v) in [("gain_sd", -0.1), ("offset_sd_w", f64::NAN)] {
        let mut bad = input.clone();
        if name == "gain_sd" {
            bad.gain_sd = v;
        } else {
            bad.offset_sd_w = v;
        }
        let e = deconvolve(&bad, &Options::default()).unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
}

#[test]
fn coverage() {
    for (dt, se) in [(5e-6, 1.0), (10e-6, 1.0), (5e-6, 2.0)] {
        let (mut e_in, mut cells_in, mut cells, mut width) = (0, 0usize, 0usize, 0.0);
        for seed in 200..230 {
            let sc = Scenario::demo(dt, se);
            let (input, _) = sc.input(seed);
            let d = deconvolve(&input, &Options::default()).unwrap();
            let energy = sc.truth.integral(0.0, 200e-6);
            if d.energy_lo_j <= energy && energy <= d.energy_hi_j {
                e_in += 1;
            }
            width += (d.energy_hi_j - d.energy_lo_j) / energy;
            for (i, &tc) in d.t.iter().enumerate() {
                if tc > 0.0 && tc < 1.2e-3 {
                    let p = sc.truth.mean(tc - 0.5 * dt, tc + 0.5 * dt);
                    cells += 1;
                    if d.lo_w[i] <= p + 1e-9 && p <= d.hi_w[i] + 1e-9 {
                        cells_in += 1;
                    }
                }
            }
        }
        println!(
            "dt {:.0} µs se {se}: energy in band {e_in}/30 (mean width {:.2} %), cells in band {:.1} %",
            dt * 1e6,
            100.0 * width / 30.0,
            100.0 * cells_in as f64 / cells as f64
        );
        assert!(e_in >= 26, "energy in its band {e_in}/30");
        assert!(
            cells_in as f64 >= 0.95 * cells as f64,
            "{cells_in}/{cells} cells"
        );
    }
}

/// The demo with a misidentified logger (slow in a debug build).
#[test]
#[ignore]
fn misidentified() {
    let energy = Truth::two_phase(100e-6).integral(0.0, 200e-6);
    let errs: [(&str, f64, f64, f64, f64); 7] = [
        ("exact", 1.0, 0.0, 1.0, 0.0),
        ("width +1 %", 1.01, 0.0, 1.0, 0.0),
        ("width -2 %", 0.98, 0.0, 1.0, 0.0),
        ("delay +5 µs", 1.0, 5e-6, 1.0, 0.0),
        ("delay -10 µs", 1.0, -10e-6, 1.0, 0.0),
        ("gain +1 %", 1.0, 0.0, 1.01, 0.0),
        ("offset +0.5 W", 1.0, 0.0, 1.0, 0.5),
    ];
    for (name, w, d, g, o) in errs {
        for (dt, se) in [(5e-6, 1.0), (10e-6, 1.0)] {
            let (mut worst, mut fails) = ([0.0_f64; 4], 0);
            for seed in 100..120 {
                let sc = Scenario::demo(dt, se);
                let (mut input, raw) = sc.input(seed);
                input.logger.kernel = box_kernel(1e-3 * w, dt).unwrap();
                input.logger.delay_s += d;
                input.logger.gain *= g;
                input.logger.offset_w += o;
                let d = deconvolve(
                    &input,
                    &Options {
                        bootstrap: 0,
                        ..Options::default()
                    },
                )
                .unwrap();
                let f = figures(&sc.truth, &d, &raw, 1.2e-3);
                let e = [
                    (f.step_s - 100e-6).abs() * 1e6,
                    100.0 * rel(f.phase_w[0], 620.0).max(rel(f.phase_w[1], 430.0)),
                    100.0 * rel(f.energy_j, energy),
                    f.rms_w / f.raw_rms_w,
                ];
                if e[0] > 20.0 || e[1] > 5.0 || e[2] > 2.0 || e[3] > 1.0 / 3.0 {
                    fails += 1;
                }
                for (w, v) in worst.iter_mut().zip(e) {
                    *w = w.max(v);
                }
            }
            println!(
                "{name:>14} dt {:.0} µs: worst step {:.1} µs, phase {:.1} %, energy {:.2} %, \
                 RMS ratio {:.3}; {fails}/20 fail",
                dt * 1e6,
                worst[0],
                worst[1],
                worst[2],
                worst[3]
            );
        }
    }
}

#[test]
fn a_logger_far_longer_than_the_kernel_solves_for_the_kernel_only() {
    // An exponential of τ = 1 ms behind the 200 µs kernel, read in whole watts to 8 ms:
    // with every cell the readings see free the rule chased the tail's roundings with
    // hundreds of segments; with the kernel's end held only its cells are free.
    for seed in 1..=3 {
        let sc = Scenario {
            family: Family::Exp(1e-3),
            t1: 8e-3,
            per_bin: 3,
            ..Scenario::demo(10e-6, 0.3)
        };
        let (input, raw) = sc.input(seed);
        let exact = input.profile.exact.iter().filter(|&&e| e).count();
        let d = deconvolve(&input, &Options::default()).unwrap();
        let first_free = d.t.iter().position(|&t| t > 0.0).unwrap();
        let f = figures(&sc.truth, &d, &raw, 1.2e-3);
        println!(
            "  seed {seed}: {exact} exact bins, {} free cells, {} segments, noise {:.2} ({}), {f:?}",
            d.free_end - first_free,
            d.segments,
            d.noise_scale,
            d.rule
        );
        assert!(
            exact > 100,
            "the tail repeats whole watts: {exact} exact bins"
        );
        assert_eq!(d.free_end - first_free, 20);
        assert!(d.power_w[d.free_end..].iter().all(|&p| p == 140.0));
        assert!(d.segments <= 4, "{} segments", d.segments);
        assert!((f.step_s - 100e-6).abs() <= 10e-6, "{f:?}");
        assert!(rel(f.phase_w[0], 620.0) <= 0.05 && rel(f.phase_w[1], 430.0) <= 0.05);
        assert!(rel(f.energy_j, sc.truth.integral(0.0, 200e-6)) <= 0.02);
    }
}

#[test]
fn bins_that_repeat_one_reading_do_not_count_as_noise() {
    // A logger whose idle reading is a whole number of watts, read to 30 ms: from about
    // 10 ms on every reading is exactly the idle one, as the model says, so those bins
    // have no residual at all. Counted as noise, they pull the scale down (on the twin's
    // demo to about half, which bought 10-18 spurious segments).
    let sc = Scenario {
        family: Family::Exp(1e-3),
        logger: (20e-6, 1.0, 0.0),
        t1: 30e-3,
        per_bin: 3,
        ..Scenario::demo(10e-6, 0.05)
    };
    let (input, _) = sc.input(2);
    let counted_out = deconvolve(&input, &Options::default()).unwrap();
    let mut diluted = input.clone();
    diluted.profile.exact.clear();
    let counted_in = deconvolve(&diluted, &Options::default()).unwrap();
    println!(
        "  counted out: noise {:.2}, {} segments; counted in: noise {:.2}, {} segments",
        counted_out.noise_scale, counted_out.segments, counted_in.noise_scale, counted_in.segments
    );
    assert!(counted_in.noise_scale < 0.6 * counted_out.noise_scale);
    assert!(
        counted_out.segments <= 4,
        "{} segments",
        counted_out.segments
    );
}

#[test]
fn a_quantised_steady_reading_is_not_known_better_than_its_quantum() {
    // Bins of identical whole-watt readings (three values, so the quantum shows) and
    // one of scattered readings: the exact ones are floored at 1/√12 W, the other keeps
    // its pooled error.
    let bin = |k: usize, n: usize, mean_w: f64, std_w: f64| ProfileBin {
        lo: k as f64 * 1e-5,
        hi: (k + 1) as f64 * 1e-5,
        n,
        mean_w,
        std_w,
        ci_half_w: f64::NAN,
    };
    let mut bins: Vec<ProfileBin> = (0..30)
        .map(|k| bin(k, 4, 140.0 + (k / 10) as f64, 0.0))
        .collect();
    bins.push(bin(30, 4, 150.3, 2.0));
    let p = Profile::from_bins(&bins).unwrap();
    let se = p.se_w.unwrap();
    assert_eq!(p.exact.iter().filter(|&&e| e).count(), 30);
    for s in &se[..25] {
        assert!((s - 1.0 / 12f64.sqrt()).abs() < 1e-12, "{s}");
    }
    // The last bin pools its own scatter with five exact neighbours: √(3·4/18)/2.
    assert!(
        (se[30] - (12.0f64 / 18.0).sqrt() / 2.0).abs() < 1e-12,
        "{}",
        se[30]
    );
}
