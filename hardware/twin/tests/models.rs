//! The twin's GPU and power-logger models against closed forms.
//!
//! Tolerances. Where the model is exact arithmetic on piecewise-constant input (box,
//! partial and response loggers: sums of a handful of `power * duration` products;
//! exponential: one exact update per piece), the only error is floating-point rounding,
//! a few ulps per operation over at most a few thousand operations: far below 1e-12
//! relative. We assert 1e-9 relative (of the signal's scale), which leaves three orders
//! of margin and still catches any modelling error (a single wrong sample position in a
//! 10 µs grid is a 1e-2 error). Statistical checks use bounds of 4 to 5 standard
//! errors computed from the sample count, with a fixed seed, so they are deterministic
//! and would be unlikely (< 1e-4) to fail for another seed.

use railtrace_twin::gpu::{
    ClockConfig, ConfigError, DvfsLevel, Execution, Gpu, GpuClock, GpuConfig, KernelConfig,
    PhaseConfig, PowerSettling, Step, TimeDistribution, TimeMode, Warmup, WorkloadConfig,
    MAX_STRETCH_S,
};
use railtrace_twin::logger::{Logger, LoggerConfig, LoggerModel, LoggerSample, Stamp, StampConfig};
use railtrace_twin::trace::{PowerTrace, Segment, StreamCursor, Util};

const REL: f64 = 1e-9;

fn seg(start_s: f64, end_s: f64, power_w: f64) -> Segment {
    Segment {
        start_s,
        end_s,
        power_w,
        util: Util::IDLE,
    }
}

/// Contiguous segments from breakpoints `t[0] < t[1] < ...` and the powers between them.
fn steps(bounds: &[f64], powers: &[f64]) -> Vec<Segment> {
    assert_eq!(bounds.len(), powers.len() + 1);
    bounds
        .windows(2)
        .zip(powers)
        .map(|(b, &p)| seg(b[0], b[1], p))
        .collect()
}

fn plain_clock() -> GpuClock {
    GpuClock::new(100e6, 0.0, 0.0).unwrap()
}

fn run_logger(config: LoggerConfig, segments: &[Segment]) -> Vec<LoggerSample> {
    let mut logger = Logger::new(config, plain_clock()).unwrap();
    logger.push_all(segments).unwrap();
    logger.drain_samples().collect()
}

fn close(got: f64, want: f64, scale: f64) -> bool {
    (got - want).abs() <= REL * scale.abs().max(1.0)
}

/// A duration `end - start` measured at absolute time `end_s` carries the rounding of
/// both times, a few ulps of `end_s` (2.2e-16 relative each): allow 4 of them on top of
/// 1e-12 relative.
fn duration_close(got: f64, want: f64, end_s: f64) -> bool {
    (got - want).abs() <= 4.0 * f64::EPSILON * end_s.abs() + 1e-12 * want.abs()
}

fn box_logger(window_s: f64, period_s: f64) -> LoggerConfig {
    LoggerConfig::new(LoggerModel::Box { window_s }, period_s)
}

// ---------------------------------------------------------------- box / partial ----

#[test]
fn box_logger_turns_a_step_into_a_linear_ramp_of_width_w() {
    let (w, lo, hi, t_step) = (1e-3, 100.0, 300.0, 2e-3);
    let segments = steps(&[0.0, t_step, 10e-3], &[lo, hi]);
    let samples = run_logger(box_logger(w, 50e-6), &segments);
    assert_eq!(samples.len(), 200, "reports at 50 µs, 100 µs, ..., 10 ms");
    let mut on_ramp = 0;
    for s in &samples {
        let frac = ((s.true_time_s - t_step) / w).clamp(0.0, 1.0);
        let want = lo + (hi - lo) * frac;
        assert!(
            close(s.power_w, want, hi),
            "t = {}: {} vs {want}",
            s.true_time_s,
            s.power_w
        );
        assert_eq!(s.power_w, s.response_w, "no distortion configured");
        if frac > 0.0 && frac < 1.0 {
            on_ramp += 1;
        }
    }
    // Strictly inside the 1 ms ramp at a 50 µs spacing: 19 reports.
    assert_eq!(on_ramp, 19);
}

/// The trapezoid a rectangular pulse of width `p` and height `h` at `t_on` becomes through
/// a box of width `w >= p`, at report time `t`.
fn trapezoid(t: f64, t_on: f64, p: f64, h: f64, w: f64) -> f64 {
    // Overlap of [t - w, t] with [t_on, t_on + p], over w.
    let overlap = (t.min(t_on + p) - (t - w).max(t_on)).max(0.0);
    h * overlap / w
}

#[test]
fn box_logger_turns_a_200us_pulse_into_a_trapezoid() {
    let (w, base, h, t_on, p) = (1e-3, 100.0, 500.0, 1e-3, 200e-6);
    let segments = steps(&[0.0, t_on, t_on + p, 5e-3], &[base, base + h, base]);
    let dt = 10e-6;
    let samples = run_logger(box_logger(w, dt), &segments);

    let mut plateau = Vec::new();
    let mut rising = Vec::new();
    let mut falling = Vec::new();
    for s in &samples {
        let y = s.power_w - base;
        let want = trapezoid(s.true_time_s, t_on, p, h, w);
        assert!(close(y, want, h), "t = {}: {y} vs {want}", s.true_time_s);
        let at_plateau = (y - 0.2 * h).abs() <= REL * h;
        if at_plateau {
            plateau.push(s.true_time_s);
        } else if y > REL * h && s.true_time_s < t_on + p {
            rising.push(s.true_time_s);
        } else if y > REL * h {
            falling.push(s.true_time_s);
        }
    }
    // Plateau at 20 % of the pulse from t_on + 0.2 ms to t_on + 1.0 ms: 0.8 ms long.
    let (first, last) = (plateau[0], plateau[plateau.len() - 1]);
    assert!(
        (first - (t_on + p)).abs() < 1e-12,
        "plateau starts at {first}"
    );
    assert!((last - (t_on + w)).abs() < 1e-12, "plateau ends at {last}");
    assert!((last - first - 0.8e-3).abs() < 1e-12);
    // Ramps of 0.2 ms: 19 samples strictly inside each at a 10 µs spacing.
    assert_eq!(rising.len(), 19);
    assert_eq!(falling.len(), 19);
    assert!(falling.iter().all(|&t| t > t_on + w && t < t_on + w + p));

    // Energy preserved: the samples are a piecewise-linear function with knots on the
    // report grid, so their sum times the spacing is its integral, which is the pulse's
    // energy (a box of unit area preserves integrals).
    let seen: f64 = samples.iter().map(|s| (s.power_w - base) * dt).sum();
    assert!(close(seen, h * p, h * p), "{seen} J vs {} J", h * p);
}

#[test]
fn box_logger_with_period_equal_to_window_preserves_energy_at_every_phase() {
    let (w, base, h, t_on, p) = (1e-3, 140.0, 480.0, 3.3e-3, 200e-6);
    let segments = steps(&[0.0, t_on, t_on + p, 20e-3], &[base, base + h, base]);
    for phase in [1e-3, 0.37e-3, 0.05e-3, 0.999e-3] {
        let config = LoggerConfig {
            phase_s: phase,
            ..box_logger(w, w)
        };
        let samples = run_logger(config, &segments);
        let seen: f64 = samples.iter().map(|s| (s.power_w - base) * w).sum();
        assert!(close(seen, h * p, h * p), "phase {phase}: {seen} J");
        // At most two windows see the pulse, and their values add up to 20 % of h.
        let nonzero: Vec<f64> = samples
            .iter()
            .map(|s| s.power_w - base)
            .filter(|y| y.abs() > REL * h)
            .collect();
        assert!(nonzero.len() <= 2, "phase {phase}: {nonzero:?}");
    }
}

#[test]
fn partial_window_logger_sees_exactly_w_over_p_of_the_time() {
    // One 0.1 ms pulse per period, swept across all 1000 offsets of a 100 ms period.
    let (w, period, width, periods) = (25e-3, 100e-3, 0.1e-3, 1000u32);
    let mut bounds = vec![0.0];
    let mut powers = Vec::new();
    for j in 0..periods {
        let start = f64::from(j) * period;
        let on = start + f64::from(j) * width;
        let off = on + width;
        if on > *bounds.last().unwrap() {
            bounds.push(on);
            powers.push(0.0);
        }
        bounds.push(off);
        powers.push(1.0);
        let end = f64::from(j + 1) * period;
        if end > off {
            bounds.push(end);
            powers.push(0.0);
        }
    }
    let segments = steps(&bounds, &powers);
    let config = LoggerConfig::new(LoggerModel::Partial { window_s: w }, period);
    let samples = run_logger(config, &segments);
    assert_eq!(samples.len(), periods as usize);
    let seen_energy: f64 = samples.iter().map(|s| s.power_w * w).sum();
    let total_energy = f64::from(periods) * width;
    let fraction = seen_energy / total_energy;
    assert!(
        (fraction - w / period).abs() < REL,
        "seen {fraction} of the pulses"
    );
    // Each seen pulse is seen whole: 250 reports of exactly width / w.
    let seen = samples
        .iter()
        .filter(|s| s.power_w > 0.5 * width / w)
        .count();
    assert_eq!(seen, 250);
}

#[test]
fn partial_window_must_fit_in_the_period() {
    let config = LoggerConfig::new(LoggerModel::Partial { window_s: 0.2 }, 0.1);
    assert!(matches!(
        config.validate(),
        Err(ConfigError::Invalid { .. })
    ));
}

// ------------------------------------------------------------------ exponential ----

#[test]
fn exponential_logger_step_response_is_one_minus_exp() {
    let (tau, t_step, h) = (0.5e-3, 1e-3, 100.0);
    let config = LoggerConfig::new(LoggerModel::Exponential { tau_s: tau }, 10e-6);
    let want = |t: f64| {
        if t <= t_step {
            0.0
        } else {
            h * (1.0 - (-(t - t_step) / tau).exp())
        }
    };

    let coarse = steps(&[0.0, t_step, 6e-3], &[0.0, h]);
    // The same signal cut into 37 µs pieces: exact updates compose exactly.
    let mut bounds = vec![0.0, t_step];
    while *bounds.last().unwrap() < 6e-3 - 1e-12 {
        let next = (bounds.last().unwrap() + 37e-6).min(6e-3);
        bounds.push(next);
    }
    let mut powers = vec![0.0];
    powers.resize(bounds.len() - 1, h);
    let fine = steps(&bounds, &powers);

    for segments in [coarse, fine] {
        let samples = run_logger(config.clone(), &segments);
        assert_eq!(samples.len(), 600);
        for s in &samples {
            assert!(
                close(s.power_w, want(s.true_time_s), h),
                "t = {}: {} vs {}",
                s.true_time_s,
                s.power_w,
                want(s.true_time_s)
            );
        }
    }
}

// -------------------------------------------------------------------- response ----

#[test]
fn flat_response_equals_a_box() {
    // A random-looking piecewise-constant signal.
    let mut bounds = vec![0.0];
    let mut powers = Vec::new();
    let mut x: u64 = 12345;
    for _ in 0..400 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let dt = 5e-6 + (x >> 40) as f64 * 1e-12;
        bounds.push(bounds.last().unwrap() + dt);
        powers.push(100.0 + (x >> 54) as f64);
    }
    let segments = steps(&bounds, &powers);
    let response = LoggerConfig::new(
        LoggerModel::Response {
            samples: vec![3.0; 10],
            spacing_s: 0.1e-3,
        },
        37e-6,
    );
    let a = run_logger(response, &segments);
    let b = run_logger(box_logger(1e-3, 37e-6), &segments);
    assert_eq!(a.len(), b.len());
    assert!(!a.is_empty());
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(a.true_time_s, b.true_time_s);
        assert!(
            close(a.power_w, b.power_w, b.power_w),
            "{} vs {}",
            a.power_w,
            b.power_w
        );
    }
}

#[test]
fn response_step_response_is_the_running_integral_of_the_staircase() {
    let shape = [1.0, 2.0, 3.0, 2.0, 1.0];
    let dt = 0.2e-3;
    let (t_step, base, h) = (1e-3, 50.0, 200.0);
    let segments = steps(&[0.0, t_step, 4e-3], &[base, base + h]);
    for scale in [1.0, 7.0] {
        let config = LoggerConfig::new(
            LoggerModel::Response {
                samples: shape.iter().map(|s| s * scale).collect(),
                spacing_s: dt,
            },
            dt,
        );
        let logger = Logger::new(config.clone(), plain_clock()).unwrap();
        let area: f64 = logger.normalised_response().unwrap().iter().sum::<f64>() * dt;
        assert!(
            (area - 1.0).abs() < 1e-12,
            "normalised to unit area: {area}"
        );
        let samples = run_logger(config, &segments);
        let total: f64 = shape.iter().sum();
        for s in &samples {
            // Report times are multiples of dt; j bins of the response lie after the step.
            let j = ((s.true_time_s - t_step) / dt).round().max(0.0) as usize;
            let want = base + h * shape.iter().take(j).sum::<f64>() / total;
            assert!(
                close(s.power_w, want, h),
                "t = {}: {} vs {want}",
                s.true_time_s,
                s.power_w
            );
        }
    }
}

#[test]
fn every_model_reports_a_constant_input_unchanged() {
    let segments = steps(&[0.0, 1e-3, 3e-3, 10e-3], &[250.0, 250.0, 250.0]);
    for model in [
        LoggerModel::Box { window_s: 2e-3 },
        LoggerModel::Partial { window_s: 0.3e-3 },
        LoggerModel::Exponential { tau_s: 1e-3 },
        LoggerModel::Response {
            samples: vec![0.5, 2.0, -0.25, 1.0],
            spacing_s: 0.7e-3,
        },
    ] {
        let samples = run_logger(LoggerConfig::new(model.clone(), 1e-3), &segments);
        assert_eq!(samples.len(), 10, "{model:?}");
        assert!(
            samples.iter().all(|s| close(s.power_w, 250.0, 250.0)),
            "{model:?}"
        );
    }
}

// ------------------------------------------------------------------ distortions ----

#[test]
fn gain_offset_quantisation_and_delay_apply_as_documented() {
    let segments = steps(&[0.0, 5e-3, 12e-3], &[100.0, 300.0]);
    let config = LoggerConfig {
        delay_s: 0.3e-3,
        gain: 1.1,
        offset_w: -7.3,
        quantum_w: 1.0,
        ..box_logger(1e-3, 1e-3)
    };
    let samples = run_logger(config, &segments);
    assert_eq!(samples.len(), 12);
    for s in &samples {
        // The window ends delay_s before the report: the ramp runs over [5.3, 6.3] ms.
        let frac = ((s.true_time_s - 0.3e-3 - 5e-3) / 1e-3).clamp(0.0, 1.0);
        let r = 100.0 + 200.0 * frac;
        assert!(
            close(s.response_w, r, 300.0),
            "t = {}: {} vs {r}",
            s.true_time_s,
            s.response_w
        );
        assert_eq!(s.power_w, s.power_w.round(), "whole watts");
        assert!((s.power_w - (1.1 * r - 7.3)).abs() <= 0.5 + 1e-9);
    }
    // 1.1 * 100 - 7.3 = 102.7 -> 103; at 6 ms the response is 240: 256.7 -> 257;
    // 1.1 * 300 - 7.3 = 322.7 -> 323.
    let at = |ms: u64| samples.iter().find(|s| s.index + 1 == ms).unwrap().power_w;
    assert_eq!(at(5), 103.0);
    assert_eq!(at(6), 257.0);
    assert_eq!(at(7), 323.0);
}

#[test]
fn samples_are_stamped_by_the_gpu_clock_or_the_host_read() {
    let segments = steps(&[0.0, 10e-3], &[100.0]);
    let clock = GpuClock::new(100e6, 3.0, 25.0).unwrap();
    let mut logger = Logger::new(box_logger(1e-3, 1e-3), clock).unwrap();
    logger.push_all(&segments).unwrap();
    for s in logger.drain_samples() {
        assert_eq!(s.stamp, Stamp::GpuTicks(clock.ticks_at(s.true_time_s)));
    }
    let config = LoggerConfig {
        stamp: StampConfig::HostRead {
            read_latency_s: 40e-6,
        },
        ..box_logger(1e-3, 1e-3)
    };
    for s in run_logger(config, &segments) {
        assert_eq!(
            s.stamp,
            Stamp::HostRead {
                read_s: s.true_time_s + 40e-6
            }
        );
    }
}

#[test]
fn first_report_phase_and_start_time_are_respected() {
    // Reports at phase + k P, only from the first segment's start on.
    let segments = steps(&[2.05e-3, 5e-3], &[10.0]);
    let config = LoggerConfig {
        phase_s: 0.25e-3,
        ..box_logger(1e-3, 1e-3)
    };
    let samples = run_logger(config, &segments);
    assert_eq!(samples[0].index, 2);
    assert_eq!(samples.len(), 3);
    for (s, want) in samples.iter().zip([2.25e-3, 3.25e-3, 4.25e-3]) {
        assert!(
            (s.true_time_s - want).abs() < 1e-15,
            "{} vs {want}",
            s.true_time_s
        );
    }
}

#[test]
fn logger_refuses_gaps() {
    let mut logger = Logger::new(box_logger(1e-3, 1e-3), plain_clock()).unwrap();
    logger.push(&seg(0.0, 1e-3, 1.0)).unwrap();
    assert!(logger.push(&seg(2e-3, 3e-3, 1.0)).is_err());
}

#[test]
fn logger_config_reads_its_flat_toml_form_and_rejects_misplaced_fields() {
    let c: LoggerConfig = toml::from_str(
        r#"
        kind = "partial"
        window_s = 25e-3
        period_s = 100e-3
        quantum_w = 1e-3
        stamp = { kind = "host_read", read_latency_s = 5e-5 }
        "#,
    )
    .unwrap();
    assert_eq!(c.model, LoggerModel::Partial { window_s: 25e-3 });
    assert_eq!(c.phase_s, 100e-3, "phase defaults to the period");
    assert_eq!(c.gain, 1.0);
    assert_eq!(
        c.stamp,
        StampConfig::HostRead {
            read_latency_s: 5e-5
        }
    );
    let c: LoggerConfig = toml::from_str(
        "kind = \"response\"\nperiod_s = 1e-3\nsamples = [1.0, 2.0]\nspacing_s = 1e-4\n",
    )
    .unwrap();
    assert!(matches!(c.model, LoggerModel::Response { .. }));

    for bad in [
        "kind = \"box\"\nwindow_s = 1e-3\nperiod_s = 1e-3\ntau_s = 1e-3\n",
        "kind = \"box\"\nperiod_s = 1e-3\n",
        "kind = \"box\"\nwindow_s = 1e-3\nperiod_s = 1e-3\nwindow = 2\n",
        "kind = \"exponential\"\ntau_s = -1.0\nperiod_s = 1e-3\n",
        "kind = \"sliding\"\nwindow_s = 1e-3\nperiod_s = 1e-3\n",
    ] {
        assert!(toml::from_str::<LoggerConfig>(bad).is_err(), "{bad}");
    }
    for c in [
        LoggerConfig::mi300x_like(),
        LoggerConfig::nvidia_partial_like(),
    ] {
        let text = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<LoggerConfig>(&text).unwrap(), c, "{text}");
    }
}

// ------------------------------------------------------------------------- GPU ----

fn quiet_gpu() -> GpuConfig {
    GpuConfig {
        idle_power_w: 100.0,
        idle_util: Util::IDLE,
        launch_overhead_s: 5e-6,
        back_to_back_gap_s: 0.0,
        dvfs: Vec::new(),
        clock: ClockConfig {
            rate_hz: 100e6,
            offset_s: 0.0,
            drift_ppm: 0.0,
            read_latency_s: 0.0,
            read_jitter_s: 0.0,
            read_latch_fraction: 0.5,
        },
        dvfs_switch_latency_s: 0.0,
        power_model: None,
        thermal: None,
    }
}

fn one_phase_kernel(name: &str, duration_s: f64, power_w: f64) -> KernelConfig {
    KernelConfig {
        name: name.into(),
        phases: vec![PhaseConfig {
            duration_s,
            power_w,
            util: Util::new(1.0, 0.0, 0.0),
        }],
        time: TimeDistribution::default(),
        warmup: Warmup::default(),
        power_settling: PowerSettling::default(),
    }
}

fn launch(kernel: &str, count: u32, min_delay_s: f64, max_delay_s: f64) -> Step {
    Step::Launch {
        kernel: kernel.into(),
        count,
        min_delay_s,
        max_delay_s,
        dvfs: None,
    }
}

/// Runs the GPU until `n` executions are recorded; returns them and the trace.
fn run_gpu(gpu: &mut Gpu, n: usize) -> (Vec<Execution>, PowerTrace) {
    let mut execs = Vec::new();
    let mut trace = PowerTrace::new();
    while execs.len() < n {
        trace.push(gpu.next_segment()).unwrap();
        execs.extend(gpu.drain_executions());
    }
    (execs, trace)
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

#[test]
fn execution_times_follow_the_modes_and_outliers() {
    let mut kernel = one_phase_kernel("k", 100e-6, 400.0);
    kernel.time = TimeDistribution {
        modes: vec![
            TimeMode {
                weight: 0.7,
                scale: 1.0,
                spread: 0.02,
            },
            TimeMode {
                weight: 0.3,
                scale: 1.5,
                spread: 0.02,
            },
        ],
        outlier_probability: 0.02,
        outlier_scale: 3.0,
    };
    let workload = WorkloadConfig {
        steps: vec![launch("k", 1, 0.0, 0.0), Step::Idle { duration_s: 20e-6 }],
    };
    let mut gpu = Gpu::new(quiet_gpu(), vec![kernel], workload, 7).unwrap();
    let n = 20_000;
    let (execs, _) = run_gpu(&mut gpu, n);
    let nf = n as f64;

    for e in &execs {
        let want = 100e-6 * e.time_factor;
        assert!(duration_close(e.duration_s(), want, e.end_s));
    }
    // Mode shares: binomial standard error sqrt(p (1 - p) / n) = 0.0032; 4 of them.
    let second = execs.iter().filter(|e| e.mode == 1).count() as f64 / nf;
    assert!(
        (second - 0.3).abs() < 4.0 * (0.21f64 / nf).sqrt(),
        "mode 1 share {second}"
    );
    let outliers = execs.iter().filter(|e| e.outlier).count() as f64 / nf;
    assert!(
        (outliers - 0.02).abs() < 4.0 * (0.02 * 0.98 / nf).sqrt(),
        "outliers {outliers}"
    );

    // Each mode's mean within 4 standard errors (scale * spread / sqrt(n_mode)), its
    // standard deviation within 5 % (the standard error of a sample standard deviation
    // is sigma / sqrt(2 n), under 1 % here).
    for (m, scale) in [(0, 1.0), (1, 1.5)] {
        let factors: Vec<f64> = execs
            .iter()
            .filter(|e| e.mode == m && !e.outlier)
            .map(|e| e.time_factor)
            .collect();
        let (mean, std) = mean_std(&factors);
        let sigma = scale * 0.02;
        let se = sigma / (factors.len() as f64).sqrt();
        assert!((mean - scale).abs() < 4.0 * se, "mode {m}: mean {mean}");
        assert!((std / sigma - 1.0).abs() < 0.05, "mode {m}: std {std}");
    }
    // Outliers: factor = mode * (1 + (3 - 1) Exp(1)), mean 3 * E[mode] = 3 * 1.15.
    let factors: Vec<f64> = execs
        .iter()
        .filter(|e| e.outlier)
        .map(|e| e.time_factor)
        .collect();
    let (mean, std) = mean_std(&factors);
    let se = std / (factors.len() as f64).sqrt();
    assert!((mean - 3.45).abs() < 5.0 * se, "outlier mean {mean} ± {se}");
    assert!(
        factors.iter().all(|&f| f >= 0.9),
        "outliers are never faster than their mode"
    );
}

#[test]
fn warmup_settles_over_the_first_executions() {
    let mut kernel = one_phase_kernel("k", 100e-6, 400.0);
    kernel.warmup = Warmup {
        first_time_scale: 2.0,
        settle_executions: 1.5,
    };
    let workload = WorkloadConfig {
        steps: vec![launch("k", 10, 0.0, 1e-3)],
    };
    let mut gpu = Gpu::new(quiet_gpu(), vec![kernel], workload, 1).unwrap();
    let (execs, _) = run_gpu(&mut gpu, 30);
    for e in &execs {
        let k = f64::from(e.index_in_train);
        let want = 100e-6 * (1.0 + (-k / 1.5).exp());
        assert!(
            duration_close(e.duration_s(), want, e.end_s),
            "execution {k}: {} vs {want}",
            e.duration_s()
        );
    }
    assert_eq!(execs[29].train, 2);
    assert_eq!(execs[29].index_in_train, 9);
}

#[test]
fn power_settles_from_sse_to_ssp_over_back_to_back_executions() {
    let mut kernel = one_phase_kernel("k", 100e-6, 500.0);
    kernel.power_settling = PowerSettling {
        sse_to_ssp_ratio: 0.8,
        tau_s: 1e-3,
    };
    let workload = WorkloadConfig {
        steps: vec![launch("k", 40, 0.0, 0.0), Step::Idle { duration_s: 1e-3 }],
    };
    let mut gpu = Gpu::new(quiet_gpu(), vec![kernel], workload, 3).unwrap();
    let (execs, trace) = run_gpu(&mut gpu, 80);
    let mut previous = 0.0;
    for e in &execs {
        let train_start = execs
            .iter()
            .find(|o| o.train == e.train && o.index_in_train == 0)
            .unwrap()
            .start_s;
        let u = e.start_s - train_start;
        let want_factor = 1.0 - 0.2 * (-u / 1e-3).exp();
        assert!((e.power_factor - want_factor).abs() < 1e-12);
        let power = trace.power_at(0.5 * (e.start_s + e.end_s)).unwrap();
        let want = 100.0 + 400.0 * want_factor;
        assert!(
            close(power, want, want),
            "execution {}: {power} vs {want}",
            e.index_in_train
        );
        if e.index_in_train == 0 {
            // SSE: the first executions draw 80 % of the settled dynamic power.
            assert!(close(power, 100.0 + 0.8 * 400.0, 500.0));
        } else {
            assert!(power > previous, "power rises towards SSP");
        }
        previous = power;
    }
    // After 40 x 100 µs = 4 tau, within 0.2 exp(-3.9) = 0.4 % of SSP.
    let last = &execs[39];
    assert!(last.power_factor > 0.995 && last.power_factor < 1.0);
}

#[test]
fn dvfs_levels_scale_the_compute_bound_time_and_the_dynamic_power() {
    let mut gpu_config = quiet_gpu();
    gpu_config.dvfs = vec![
        DvfsLevel {
            name: "ref".into(),
            frequency_hz: 2e9,
            voltage_v: 1.0,
            time_scale: None,
            power_scale: None,
        },
        DvfsLevel {
            name: "half".into(),
            frequency_hz: 1e9,
            voltage_v: 0.8,
            time_scale: None,
            power_scale: None,
        },
        DvfsLevel {
            name: "explicit".into(),
            frequency_hz: 1.5e9,
            voltage_v: 0.9,
            time_scale: Some(1.25),
            power_scale: Some(0.9),
        },
    ];
    let kernel = KernelConfig {
        name: "k".into(),
        phases: vec![
            PhaseConfig {
                duration_s: 100e-6,
                power_w: 500.0,
                util: Util::new(1.0, 0.0, 0.2),
            },
            PhaseConfig {
                duration_s: 100e-6,
                power_w: 300.0,
                util: Util::new(0.0, 1.0, 0.2),
            },
            PhaseConfig {
                duration_s: 100e-6,
                power_w: 400.0,
                util: Util::new(0.4, 0.4, 0.0),
            },
        ],
        time: TimeDistribution::default(),
        warmup: Warmup::default(),
        power_settling: PowerSettling::default(),
    };
    let at = |level: &str| Step::Launch {
        kernel: "k".into(),
        count: 1,
        min_delay_s: 0.0,
        max_delay_s: 0.0,
        dvfs: Some(level.into()),
    };
    let workload = WorkloadConfig {
        steps: vec![at("ref"), at("half"), at("explicit")],
    };
    let mut gpu = Gpu::new(gpu_config, vec![kernel], workload, 5).unwrap();
    // Derived: half frequency doubles compute-bound time; power (0.8)^2 * 0.5 = 0.32.
    assert_eq!(gpu.dvfs_scales()[1], (2.0, 0.8 * 0.8 * 0.5));
    let (execs, trace) = run_gpu(&mut gpu, 3);
    for (e, (ts, ps)) in execs.iter().zip([(1.0, 1.0), (2.0, 0.32), (1.25, 0.9)]) {
        let b = &e.phase_bounds_s;
        assert_eq!(b.len(), 4);
        let durations = [b[1] - b[0], b[2] - b[1], b[3] - b[2]];
        // Compute-bound share 1, 0 and 0.5.
        let want = [100e-6 * ts, 100e-6, 100e-6 * (0.5 * ts + 0.5)];
        for (d, w) in durations.iter().zip(want) {
            assert!(
                duration_close(*d, w, e.end_s),
                "level {}: {d} vs {w}",
                e.dvfs_level
            );
        }
        for (j, p) in [500.0, 300.0, 400.0].iter().enumerate() {
            let got = trace.power_at(0.5 * (b[j] + b[j + 1])).unwrap();
            let want = 100.0 + (p - 100.0) * ps;
            assert!(
                close(got, want, want),
                "level {} phase {j}: {got} vs {want}",
                e.dvfs_level
            );
        }
    }
}

#[test]
fn random_delays_are_uniform_and_launch_overhead_is_paid_per_train() {
    let workload = WorkloadConfig {
        steps: vec![launch("k", 3, 1e-3, 3e-3)],
    };
    let mut gpu = Gpu::new(
        quiet_gpu(),
        vec![one_phase_kernel("k", 50e-6, 300.0)],
        workload,
        11,
    )
    .unwrap();
    let (execs, _) = run_gpu(&mut gpu, 3 * 4000);
    let mut delays = Vec::new();
    let mut previous_end = 0.0;
    for e in &execs {
        if e.index_in_train == 0 {
            delays.push(e.launch_s - previous_end);
            assert!(duration_close(e.start_s - e.launch_s, 5e-6, e.start_s));
        } else {
            assert_eq!(e.start_s, previous_end, "back to back, no gap configured");
        }
        previous_end = e.end_s;
    }
    assert!(delays
        .iter()
        .all(|d| (1e-3 - 1e-12..=3e-3 + 1e-12).contains(d)));
    // Uniform on [1, 3] ms: mean 2 ms, standard deviation 2 ms / sqrt(12).
    let (mean, std) = mean_std(&delays);
    let sigma = 2e-3 / 12f64.sqrt();
    assert!((mean - 2e-3).abs() < 4.0 * sigma / (delays.len() as f64).sqrt());
    assert!((std / sigma - 1.0).abs() < 0.05);
}

#[test]
fn the_same_seed_gives_the_same_timeline_and_clock_reads_do_not_perturb_it() {
    let make = |seed| {
        Gpu::new(
            GpuConfig::mi300x_like(),
            vec![KernelConfig::mi300x_like_two_phase("gemm")],
            WorkloadConfig::fingrav_like("gemm"),
            seed,
        )
        .unwrap()
    };
    let (mut a, mut b, mut c) = (make(42), make(42), make(43));
    let mut differs = false;
    for i in 0..20_000 {
        let sa = a.next_segment();
        if i % 3 == 0 {
            let read = b.read_clock(sa.start_s);
            assert!(read.issue_s <= read.latch_s && read.latch_s <= read.return_s);
            let latency = read.return_s - read.issue_s;
            assert!((2e-6 - 1e-15..=3e-6 + 1e-15).contains(&latency));
        }
        let sb = b.next_segment();
        assert_eq!(sa, sb);
        differs |= sa != c.next_segment();
    }
    assert!(differs, "another seed gives another timeline");
    let ea: Vec<Execution> = a.drain_executions().collect();
    let eb: Vec<Execution> = b.drain_executions().collect();
    assert_eq!(ea, eb);
    assert!(!ea.is_empty());
}

#[test]
fn the_default_scenario_is_mi300x_like() {
    let mut gpu = Gpu::new(
        GpuConfig::mi300x_like(),
        vec![KernelConfig::mi300x_like_two_phase("gemm")],
        WorkloadConfig::fingrav_like("gemm"),
        1,
    )
    .unwrap();
    let (execs, trace) = run_gpu(&mut gpu, 200);
    let settled: Vec<&Execution> = execs
        .iter()
        .filter(|e| e.index_in_train >= 5 && !e.outlier)
        .collect();
    for e in &settled {
        assert!(
            e.duration_s() > 180e-6 && e.duration_s() < 240e-6,
            "{}",
            e.duration_s()
        );
        let b = &e.phase_bounds_s;
        let first = trace.power_at(0.5 * (b[0] + b[1])).unwrap();
        let second = trace.power_at(0.5 * (b[1] + b[2])).unwrap();
        assert!(
            first > second,
            "compute-heavy half draws more than the memory-heavy half"
        );
    }
    let logger = LoggerConfig::mi300x_like();
    assert_eq!(logger.model, LoggerModel::Box { window_s: 1e-3 });
    assert_eq!(logger.period_s, 1e-3);
}

#[test]
fn the_workload_runs_forever_with_contiguous_segments() {
    let mut gpu = Gpu::new(
        GpuConfig::mi300x_like(),
        vec![KernelConfig::mi300x_like_two_phase("gemm")],
        WorkloadConfig::fingrav_like("gemm"),
        9,
    )
    .unwrap();
    gpu.set_record_executions(false);
    let mut end = 0.0;
    for s in gpu.by_ref().take(200_000) {
        assert_eq!(s.start_s, end);
        assert!(s.end_s > s.start_s);
        end = s.end_s;
    }
    assert_eq!(gpu.now_s(), end);
    assert_eq!(gpu.drain_executions().count(), 0);
    // 200 000 segments of a ~8.5 ms, ~40-segment cycle: several seconds.
    assert!(end > 5.0, "{end}");
}

#[test]
fn energy_is_conserved() {
    let mut gpu = Gpu::new(
        GpuConfig::mi300x_like(),
        vec![KernelConfig::mi300x_like_two_phase("gemm")],
        WorkloadConfig::fingrav_like("gemm"),
        2,
    )
    .unwrap();
    let (execs, trace) = run_gpu(&mut gpu, 2000);
    let sum: f64 = trace.segments().iter().map(Segment::energy_j).sum();
    let (start, end) = (trace.start_s().unwrap(), trace.end_s().unwrap());
    assert!(close(trace.total_energy_j(), sum, sum));
    assert!(close(trace.energy_between(start, end), sum, sum));
    // Executions plus idle make up the whole.
    let busy: f64 = execs.iter().map(|e| e.energy_j).sum();
    let idle: f64 = trace
        .segments()
        .iter()
        .filter(|s| s.power_w == 140.0)
        .map(Segment::energy_j)
        .sum();
    assert!(close(busy + idle, sum, sum), "{busy} + {idle} vs {sum}");
    // Any interval, long or short, against a brute-force sum.
    for i in 0..50u32 {
        let a = start + (end - start) * (f64::from(i) * 0.0173).fract();
        let b = a + (end - a) * (f64::from(i) * 0.31).fract().powi(3);
        let brute: f64 = trace.segments().iter().map(|s| s.energy_within(a, b)).sum();
        assert!(
            close(trace.energy_between(a, b), brute, brute),
            "[{a}, {b}]"
        );
    }
}

#[test]
fn a_logger_fed_by_the_gpu_matches_window_means_of_the_stored_trace() {
    let mut gpu = Gpu::new(
        GpuConfig::mi300x_like(),
        vec![KernelConfig::mi300x_like_two_phase("gemm")],
        WorkloadConfig::fingrav_like("gemm"),
        4,
    )
    .unwrap();
    let config = LoggerConfig {
        delay_s: 0.2e-3,
        ..box_logger(1e-3, 1e-3)
    };
    let mut logger = Logger::new(config, *gpu.clock()).unwrap();
    let mut trace = PowerTrace::new();
    let mut cursor = StreamCursor::new();
    let mut samples = Vec::new();
    // Walk 0.2 s at 100 kS/s through the streaming cursor, feeding the logger on the way.
    for i in 0..20_000u32 {
        let t = f64::from(i) * 10e-6;
        cursor
            .fill_until(t, || {
                let s = gpu.next_segment();
                logger.push(&s).unwrap();
                trace.push(s).unwrap();
                s
            })
            .unwrap();
        assert_eq!(cursor.power_at(t), trace.power_at(t));
        samples.extend(logger.drain_samples());
    }
    assert!(cursor.len() < 100, "the cursor forgets the past");
    assert!(samples.len() >= 199);
    for s in &samples {
        let hi = s.true_time_s - 0.2e-3;
        let want = trace.mean_power(hi - 1e-3, hi).unwrap_or_else(|| {
            // Before the trace starts the input is held at its first power.
            let covered = trace.energy_between(0.0, hi);
            (covered + trace.segments()[0].power_w * -(hi - 1e-3)) / 1e-3
        });
        assert!(
            close(s.power_w, want, want),
            "t = {}: {} vs {want}",
            s.true_time_s,
            s.power_w
        );
        assert_eq!(
            s.stamp,
            Stamp::GpuTicks(gpu.clock().ticks_at(s.true_time_s))
        );
    }
}

// ----------------------------------------------------------------------- clock ----

#[test]
fn gpu_clock_has_its_own_rate_offset_and_drift() {
    let clock = GpuClock::new(100e6, 5.0, 50.0).unwrap();
    assert_eq!(clock.ticks_at(0.0), 500_000_000);
    // After 1000 s the counter has run 1000 * (1 + 50e-6) s.
    let ticks = clock.ticks_at(1000.0);
    let want = (5.0 + 1000.0 * 1.00005) * 100e6;
    assert!((ticks as f64 - want).abs() <= 1.0, "{ticks} vs {want}");
    let rate = (clock.ticks_at(1000.0) - clock.ticks_at(0.0)) as f64 / 1000.0;
    assert!((rate - clock.effective_rate_hz()).abs() <= 1e-3);
    assert!((clock.effective_rate_hz() - 100e6 * 1.00005).abs() < 1e-6);
    // The inverse is exact: the counter reaches n at true_time_at(n), not a ulp earlier.
    for n in [
        500_000_000u64,
        500_000_001,
        123_456_789_012,
        100_504_999_999,
    ] {
        let t = clock.true_time_at(n);
        assert_eq!(clock.ticks_at(t), n, "n = {n}");
        assert!(clock.ticks_at(t - 1e-6 * t.abs().max(1e-3)) < n);
    }
    // Before the counter's zero it saturates.
    let early = GpuClock::new(1e6, 0.0, -10.0).unwrap();
    assert_eq!(early.ticks_at(-1.0), 0);
    // A read latches the counter between issue and return.
    let read = clock.read(10.0, 2e-6, 0.25);
    assert_eq!(read.latch_s, 10.0 + 0.5e-6);
    assert_eq!(read.return_s, 10.0 + 2e-6);
    assert_eq!(read.ticks, clock.ticks_at(read.latch_s));
    assert!(
        GpuClock::new(100e6, -1.0, 0.0).is_err(),
        "the counter is unsigned"
    );
}

// ---------------------------------------------------------------------- config ----

#[test]
fn a_scenario_reads_from_toml_and_unknown_fields_are_refused() {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Scenario {
        gpu: GpuConfig,
        kernels: Vec<KernelConfig>,
        workload: WorkloadConfig,
        logger: LoggerConfig,
    }
    let text = r#"
        [gpu]
        idle_power_w = 140.0
        launch_overhead_s = 5e-6
        dvfs = [
            { name = "high", frequency_hz = 2.1e9, voltage_v = 0.95 },
            { name = "low", frequency_hz = 1.3e9, voltage_v = 0.75, power_scale = 0.4 },
        ]
        clock = { rate_hz = 100e6, offset_s = 12.0, drift_ppm = 20.0, read_latency_s = 2e-6 }

        [[kernels]]
        name = "gemm"
        phases = [
            { duration_s = 100e-6, power_w = 620.0, util = { compute = 0.9, memory = 0.3 } },
            { duration_s = 100e-6, power_w = 430.0, util = { compute = 0.2, memory = 0.9 } },
        ]
        time = { modes = [{ weight = 0.9, scale = 1.0, spread = 0.01 }, { weight = 0.1, scale = 1.1 }], outlier_probability = 0.01 }
        warmup = { first_time_scale = 1.3 }
        power_settling = { sse_to_ssp_ratio = 0.85, tau_s = 3e-3 }

        [workload]
        steps = [
            { kind = "launch", kernel = "gemm", count = 20, min_delay_s = 0.5e-3, max_delay_s = 1.5e-3 },
            { kind = "launch", kernel = "gemm", dvfs = "low" },
            { kind = "idle", duration_s = 5e-3 },
        ]

        [logger]
        kind = "box"
        window_s = 1e-3
        period_s = 1e-3
        quantum_w = 1.0
    "#;
    let s: Scenario = toml::from_str(text).unwrap();
    assert_eq!(s.kernels[0].warmup.settle_executions, 1.0);
    assert_eq!(s.kernels[0].time.outlier_scale, 2.0);
    assert_eq!(s.gpu.clock.read_latch_fraction, 0.5);
    let gpu = Gpu::new(s.gpu, s.kernels, s.workload, 0).unwrap();
    assert_eq!(gpu.dvfs_scales()[1].1, 0.4);
    assert_eq!(s.logger, LoggerConfig::mi300x_like());

    for (from, to) in [
        ("idle_power_w = 140.0", "idle_power = 140.0"),
        ("count = 20", "count = 20, repeat = 2"),
        (
            "warmup = { first_time_scale = 1.3 }",
            "warmup = { first_scale = 1.3 }",
        ),
        (
            "{ kind = \"idle\", duration_s = 5e-3 }",
            "{ kind = \"sleep\", duration_s = 5e-3 }",
        ),
    ] {
        let bad = text.replace(from, to);
        assert_ne!(bad, text);
        assert!(toml::from_str::<Scenario>(&bad).is_err(), "accepted {to}");
    }

    // Defaults round-trip through their TOML form.
    let gpu = GpuConfig::mi300x_like();
    assert_eq!(
        toml::from_str::<GpuConfig>(&toml::to_string(&gpu).unwrap()).unwrap(),
        gpu
    );
    let kernel = KernelConfig::mi300x_like_two_phase("gemm");
    assert_eq!(
        toml::from_str::<KernelConfig>(&toml::to_string(&kernel).unwrap()).unwrap(),
        kernel
    );
    let workload = WorkloadConfig::fingrav_like("gemm");
    assert_eq!(
        toml::from_str::<WorkloadConfig>(&toml::to_string(&workload).unwrap()).unwrap(),
        workload
    );
}

#[test]
fn a_phase_stretched_past_the_longest_stretch_comes_in_pieces() {
    // A 10 s phase (the longest there is) run ten times slower than nominal: 100 s of
    // one power, which a logger would report all at once, comes in 10 s pieces.
    let mut kernel = one_phase_kernel("k", MAX_STRETCH_S, 300.0);
    kernel.time.modes[0].scale = 10.0;
    let workload = WorkloadConfig {
        steps: vec![launch("k", 1, 0.0, 0.0)],
    };
    let mut gpu = Gpu::new(quiet_gpu(), vec![kernel], workload, 0).unwrap();
    let (execs, trace) = run_gpu(&mut gpu, 1);
    assert!(close(execs[0].duration_s(), 100.0, 100.0), "{execs:?}");
    assert!(close(execs[0].energy_j, 300.0 * 100.0, 3e4), "{execs:?}");
    let pieces: Vec<&Segment> = trace
        .segments()
        .iter()
        .filter(|s| s.power_w == 300.0)
        .collect();
    assert!(pieces.len() >= 10, "{pieces:?}");
    assert!(pieces
        .iter()
        .all(|s| s.duration_s() <= MAX_STRETCH_S * (1.0 + 1e-12)));
}

#[test]
fn invalid_configurations_are_refused_with_the_field_named() {
    let kernel = || one_phase_kernel("k", 100e-6, 300.0);
    let workload = |kernel: &str| WorkloadConfig {
        steps: vec![launch(kernel, 1, 0.0, 0.0)],
    };
    let err = Gpu::new(quiet_gpu(), vec![kernel()], workload("nope"), 0).unwrap_err();
    assert!(
        matches!(err, ConfigError::UnknownKernel { step: 0, .. }),
        "{err}"
    );

    let mut bad = kernel();
    bad.phases[0].duration_s = 0.0;
    let err = Gpu::new(quiet_gpu(), vec![bad], workload("k"), 0).unwrap_err();
    assert!(
        err.to_string().contains("kernels[0].phases[0].duration_s"),
        "{err}"
    );

    let err = Gpu::new(
        quiet_gpu(),
        vec![kernel()],
        WorkloadConfig {
            steps: vec![launch("k", 1, 2e-3, 1e-3)],
        },
        0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("max_delay_s"), "{err}");

    let err = Gpu::new(
        quiet_gpu(),
        vec![kernel()],
        WorkloadConfig {
            steps: vec![Step::Launch {
                kernel: "k".into(),
                count: 1,
                min_delay_s: 0.0,
                max_delay_s: 0.0,
                dvfs: Some("turbo".into()),
            }],
        },
        0,
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::UnknownDvfs { .. }), "{err}");

    let err = Gpu::new(
        quiet_gpu(),
        vec![kernel()],
        WorkloadConfig { steps: vec![] },
        0,
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Structure { .. }), "{err}");
}
