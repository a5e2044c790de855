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
