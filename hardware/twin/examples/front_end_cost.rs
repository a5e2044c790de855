//! What the twin's analog chain costs: the default scenario's GPU through each rig's front
//! end, sampled at a rate for a stretch of true time, as fast as it goes.
//!
//! ```text
//! cargo run --release -p railtrace-twin --example front_end_cost [RATE_HZ] [SECONDS]
//! ```
//!
//! Prints, per rig file, the CPU time per simulated second and per conversion, and the GPU
//! segments walked (each a piece of the chain's exact solution).
use std::time::Instant;

use railtrace_twin::adc::Analog;
use railtrace_twin::gpu::Gpu;
use railtrace_twin::random::rng;
use railtrace_twin::rig::FrontEnd;

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rate = args.first().copied().unwrap_or(100e3);
    let seconds = args.get(1).copied().unwrap_or(5.0);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rigs");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    for file in files {
        let Ok(loaded) = railtrace_twin::scenario::load_with(None, Some(&file)) else {
            eprintln!("{}: not a rig this scenario runs on", file.display());
            continue;
        };
        let s = &loaded.scenario;
        let Ok(mut gpu) = Gpu::new(s.gpu.clone(), s.kernels.clone(), s.workload.clone(), s.seed)
        else {
            return;
        };
        let segments = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let count = segments.clone();
        let next = move || {
            count.set(count.get() + 1);
            gpu.next_segment()
        };
        let Ok(mut fe) = FrontEnd::new(&loaded.rig, &s.rig_truth, next, rng(s.seed, 1)) else {
            return;
        };
        let n = (rate * seconds) as u64;
        let started = Instant::now();
        let mut sum = 0.0;
        for k in 1..=n {
            fe.set_time(k as f64 / rate);
            sum += fe.sample()[0];
        }
        let cpu = started.elapsed().as_secs_f64();
        println!(
            "{}: {n} conversions at {rate} S/s over {seconds} s: {:.3} s of CPU per simulated s, {:.0} ns a conversion, {} GPU segments (mean {:.4})",
            loaded.rig.name,
            cpu / seconds,
            cpu / n as f64 * 1e9,
            segments.get(),
            sum / n as f64
        );
    }
}
