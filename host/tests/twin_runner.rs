//! The twin behind the GPU traits: the host launches trains, gets each execution's start
//! and end on the GPU clock, reads that clock bracketed by host time, and polls the
//! GPU's logger; the trigger edges it drives reach the rig.

use std::time::Duration;

use railtrace::gpu::twin::{TwinGpu, TwinTrigger};
use railtrace::gpu::{GpuRunner, Launch, PowerLogger, Stamp};

#[test]
fn the_host_drives_the_twins_gpu_through_the_runner_trait() {
    let twin = railtrace_twin::Twin::start(&railtrace_twin::default_scenario()).unwrap();
    let gpu = TwinGpu::new(&twin);
    let mut runner = gpu.runner(7);
    let mut logger = gpu.logger();
    let mut trigger = TwinTrigger::new(&twin, 0);
    assert_eq!(runner.kernels(), vec!["gemm".to_string()]);
    let hz = runner.clock_hz();
    // Clock reads: the scenario's 2 µs latency plus up to 1 µs of jitter, latched halfway.
    for _ in 0..20 {
        let r = runner.read_clock().unwrap();
        let width = r.host_after_ns - r.host_before_ns;
        assert!((2_000..=3_001).contains(&width), "{width} ns");
    }
    let launch = Launch {
        kernel: "gemm".into(),
        delay_s: (0.5e-3, 1.5e-3),
        warmup: 2,
        count: 5,
        dvfs: None,
    };
    let mut trains = Vec::new();
    for _ in 0..4 {
        trains.push(runner.run(&launch, &mut trigger).unwrap());
    }
    for t in &trains {
        assert_eq!(t.len(), 7, "warm-up and counted executions");
        for (k, e) in t.iter().enumerate() {
            assert_eq!(e.index_in_train as usize, k);
            let d = (e.end_ticks - e.start_ticks) as f64 / hz;
            // 200 µs nominal; warm-up up to 1.3x, the slow mode 1.08x, rare outliers.
            assert!((150e-6..800e-6).contains(&d), "duration {d} s");
        }
        assert!(t.windows(2).all(|w| w[1].start_ticks >= w[0].end_ticks));
    }
    // Trains follow each other, the runner's delay apart at least.
    for w in trains.windows(2) {
        let gap = (w[1][0].start_ticks - w[0][6].end_ticks) as f64 / hz;
        assert!(gap >= 0.5e-3, "{gap} s between trains");
    }
    std::thread::sleep(Duration::from_millis(20));
    let readings = logger.poll().unwrap();
    assert!(readings.len() > 10, "{} logger readings", readings.len());
    assert!(readings
        .iter()
        .all(|r| matches!(r.stamp, Stamp::GpuTicks(_)) && r.power_w > 100.0));
    twin.stop().unwrap();
}

#[test]
fn trains_run_at_the_dvfs_level_asked_for() {
    // hardware/scenarios/dvfs.toml: gemm's phases (150 µs at c = 0.95/(0.95 + 0.25) of
    // compute-bound work, 50 µs at c = 0.70/1.15) stretch by c·f_high/f_low + (1 − c) at
    // 1.3 GHz against 2.1 GHz: 1.4872 and 1.3746, so the whole kernel by 291.8/200 =
    // 1.459. Both levels draw the same time factors (1 % spread, a 15 % slow mode), so
    // the medians of 30 runs agree with that ratio within 2 %.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let loaded = railtrace_twin::load_scenario(&root.join("hardware/scenarios/dvfs.toml")).unwrap();
    let twin = railtrace_twin::Twin::start(&loaded).unwrap();
    let gpu = TwinGpu::new(&twin);
    let mut runner = gpu.runner(11);
    let mut trigger = TwinTrigger::new(&twin, 0);
    assert_eq!(runner.dvfs_levels(), ["high", "mid", "low"]);
    let hz = runner.clock_hz();
    let mut median = |level: &str| {
        let launch = Launch {
            kernel: "gemm".into(),
            delay_s: (1e-3, 2e-3),
            warmup: 0,
            count: 1,
            dvfs: Some(level.into()),
        };
        let mut d: Vec<f64> = (0..30)
            .map(|_| {
                let e = &runner.run(&launch, &mut trigger).unwrap()[0];
                (e.end_ticks - e.start_ticks) as f64 / hz
            })
            .collect();
        d.sort_by(f64::total_cmp);
        d[d.len() / 2]
    };
    let (high, low) = (median("high"), median("low"));
    let ratio = low / high;
    assert!(
        (ratio / 1.459 - 1.0).abs() < 0.02,
        "{low} / {high} = {ratio}"
    );
    let bad = Launch {
        kernel: "gemm".into(),
        delay_s: (0.0, 0.0),
        warmup: 0,
        count: 1,
        dvfs: Some("turbo".into()),
    };
    let e = runner.run(&bad, &mut trigger).unwrap_err().to_string();
    assert!(e.contains("turbo") && e.contains("high, mid, low"), "{e}");
    twin.stop().unwrap();
}
