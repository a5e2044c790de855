//! `railtrace profile`: FinGraV's profiling run on a GPU beside the rig.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use railtrace::analysis::Options;
use railtrace::capture::{capture, Config, Counters};
use railtrace::gpu::twin::{TwinGpu, TwinTrigger};
use railtrace::gpu::Launch;
use railtrace::profile::{acquire, rig_path, Plan, Target};

/// Runs a kernel many times with random delays, recording the GPU's executions, its
/// clock, its own power logger and the rig's capture of the same run.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU: `twin` (the digital twin's, with its rig; no hardware needed).
    #[arg(long, default_value = "twin")]
    gpu: String,
    /// The kernel to run (the twin's default scenario has `gemm`).
    #[arg(long, default_value = "gemm")]
    kernel: String,
    /// Trains to run (200); with --target-error, the most to run (20000).
    #[arg(long)]
    runs: Option<usize>,
    /// Keep running until the GPU logger's stitched profile is within this relative error
    /// (e.g. 0.02) in every bin at once, at --confidence.
    #[arg(long)]
    target_error: Option<f64>,
    /// Confidence of --target-error.
    #[arg(long, default_value_t = 0.95)]
    confidence: f64,
    /// Runs before the first --target-error check (the planner's pilot).
    #[arg(long, default_value_t = 30)]
    pilot: usize,
    /// Width of the stitched profile's bins for --target-error, µs.
    #[arg(long, default_value_t = 20.0)]
    bin_us: f64,
    /// Executions per train (back to back; 1 for single executions).
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Warm-up executions before each train's counted ones.
    #[arg(long, default_value_t = 0)]
    warmup: u32,
    /// Shortest and longest random delay before each launch, ms.
    #[arg(long, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [1.0, 3.0])]
    delay_ms: Vec<f64>,
    /// The twin's scenario (hardware/twin/SCENARIOS.md); the built-in default when not
    /// given.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// The rig's trigger input the runner's trigger output is wired to.
    #[arg(long, default_value_t = 0)]
    trigger_line: u8,
    /// The profile recording; the rig's capture goes beside it as `<name>.rig.arrow`.
    #[arg(long, short, default_value = "profile.arrow")]
    output: PathBuf,
    /// Seed of the runner's random delays.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs `railtrace profile`.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.gpu == "twin",
        "--gpu {}: this railtrace drives `twin` (ROCm needs the `rocm` feature and a device)",
        args.gpu
    );
    let (lo, hi) = (args.delay_ms[0], args.delay_ms[1]);
    anyhow::ensure!(
        lo >= 0.0 && hi >= lo,
        "--delay-ms {lo} {hi}: need 0 <= MIN <= MAX"
    );
    let loaded = match &args.scenario {
        Some(p) => railtrace_twin::load_scenario(p)?,
        None => railtrace_twin::default_scenario(),
    };
    let twin = railtrace_twin::Twin::start(&loaded).context("the twin did not start")?;
    // The rig: captured in the background for the whole run.
    let rig_out = rig_path(&args.output);
    let config = Config {
        port: twin.path().to_path_buf(),
        output: rig_out.clone(),
        rig: None,
        rate_hz: None,
        channels: None,
        averaging: 1,
        duration: None,
        reconnect_wait: Duration::from_secs(10),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let rig = {
        let (stop, counters) = (stop.clone(), counters.clone());
        std::thread::spawn(move || capture(&config, &stop, &counters, |_| {}))
    };
    let started = Instant::now();
    while counters.samples.load(Ordering::Relaxed) == 0 {
        anyhow::ensure!(
            !rig.is_finished() && started.elapsed() < Duration::from_secs(10),
            "the rig's capture did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let gpu = TwinGpu::new(&twin);
    let mut runner = gpu.runner(args.seed);
    let mut logger = gpu.logger();
    let mut trigger = TwinTrigger::new(&twin, args.trigger_line);
    let plan = Plan {
        launch: Launch {
            kernel: args.kernel.clone(),
            delay_s: (lo * 1e-3, hi * 1e-3),
            warmup: args.warmup,
            count: args.count,
        },
        runs: args.runs.unwrap_or(if args.target_error.is_some() {
            20_000
        } else {
            200
        }),
        clock_reads: 5,
        trigger_line: args.trigger_line,
        target: args.target_error.map(|rel_err| Target {
            rel_err,
            confidence: args.confidence,
            pilot: args.pilot,
            every: (args.pilot / 2).max(10),
            options: Options {
                bin_s: args.bin_us * 1e-6,
                ..Options::default()
            },
        }),
    };
    if let Some(e) = args.target_error {
        anyhow::ensure!(
            e > 0.0 && e < 1.0 && args.confidence > 0.0 && args.confidence < 1.0,
            "--target-error {e} --confidence {}: both must be between 0 and 1",
            args.confidence
        );
    }
    let bar = indicatif::ProgressBar::new(plan.runs as u64);
    let acquired = acquire(
        &mut runner,
        &mut logger,
        &mut trigger,
        &plan,
        &args.output,
        serde_json::json!({
            "scenario": args.scenario.as_ref().map(|p| p.display().to_string()),
            "rig_recording": rig_out.display().to_string(),
        }),
        |n| {
            bar.set_position(n.runs as u64);
            if let Some(p) = n.planned_runs {
                bar.set_message(format!("the planner estimates {p} runs for the target"));
            }
        },
    );
    bar.finish_and_clear();
    stop.store(true, Ordering::Relaxed);
    let rig_summary = rig
        .join()
        .map_err(|_| anyhow::anyhow!("the rig's capture panicked"))?;
    twin.stop().context("the twin failed")?;
    let acquired = acquired?;
    let rig_summary = rig_summary.context("the rig's capture failed")?;
    if let Some(e) = args.target_error {
        eprintln!(
            "railtrace profile: target {:.2} % at {:.0} % confidence {} after {} runs (planner's estimate: {})",
            e * 100.0,
            args.confidence * 100.0,
            if acquired.reached { "reached" } else { "NOT reached" },
            acquired.runs,
            acquired.planned_runs.map_or("none".to_string(), |p| p.to_string())
        );
    }
    eprintln!(
        "railtrace profile: {} trains, {} executions, {} logger readings, {} clock reads, {} edges driven in {}; rig: {} samples, {} frames lost, {} gaps in {}",
        acquired.runs,
        acquired.executions,
        acquired.logger_readings,
        acquired.clock_reads,
        acquired.driven,
        args.output.display(),
        rig_summary.progress.samples,
        rig_summary.progress.frames_lost,
        rig_summary.progress.gaps,
        rig_out.display()
    );
    Ok(())
}
