//! `railtrace profile`: FinGraV's profiling run on a GPU beside the rig.

use std::path::PathBuf;

use railtrace::analysis::stitch::Options;
use railtrace::gpu::profile::{Acquired, Plan, ProfileError, Profiled, Run, Target};
use railtrace::gpu::Launch;
#[cfg(any(feature = "rocm", feature = "cuda"))]
use railtrace::gpu::{GpuRunner, PowerLogger};
#[cfg(any(feature = "rocm", feature = "cuda"))]
use railtrace::link::trigger::TriggerOut;
use railtrace::store::recording::rig_path;

/// Runs a kernel many times with random delays, recording the GPU's executions, its
/// clock, its own power logger and the rig's capture of the same run.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU: `twin` (the digital twin's, with its rig; no hardware needed), `rocm`
    /// (an AMD GPU through HIP; built with --features rocm) or `cuda` (an NVIDIA GPU
    /// through the CUDA driver; built with --features cuda,nvml), with the rig on --port.
    #[arg(long, default_value = "twin")]
    gpu: String,
    /// The rig's serial port (with a real GPU; the twin brings its own rig). Without it a
    /// real GPU's run records the logger's readings alone, not deconvolved.
    #[arg(long)]
    port: Option<PathBuf>,
    /// Record the GPU's logger alone, without the rig (as a bench without one does; with
    /// a real GPU, leave out --port).
    #[arg(long)]
    no_rig: bool,
    /// The GPU's index (with a real GPU).
    #[arg(long)]
    device: Option<usize>,
    /// The GPU's own power logger: with an AMD GPU `hwmon` (power1_average/input,
    /// host-stamped; the default) or `gpu-metrics`; with an NVIDIA GPU `nvml` (the
    /// default).
    #[arg(long)]
    logger: Option<String>,
    /// The DRM card of --logger (/sys/class/drm/cardN); the first amdgpu when not given.
    #[arg(long)]
    card: Option<usize>,
    /// The runner's trigger output wired to the rig's input (with a real GPU):
    /// `serial:/dev/ttyUSB0:rts`, `serial:PATH:dtr` or `gpio:/dev/gpiochip0:17`; add
    /// `:active-low` for an inverted line.
    #[arg(long)]
    trigger: Option<String>,
    /// The kernel to run (the twin's default scenario has `gemm`).
    #[arg(long, default_value = "gemm")]
    kernel: String,
    /// Trains to run (200); with --target-error, the most to run (20000). At most
    /// 1 000 000.
    #[arg(long, value_parser = super::count(1, 1_000_000))]
    runs: Option<usize>,
    /// Keep running until the GPU logger's stitched profile is within this relative error
    /// (e.g. 0.02) in every bin at once, at --confidence.
    #[arg(long)]
    target_error: Option<f64>,
    /// Confidence of --target-error.
    #[arg(long, default_value_t = 0.95)]
    confidence: f64,
    /// Runs before the first --target-error check (the planner's pilot).
    #[arg(long, default_value_t = 30, value_parser = super::count(1, 1_000_000))]
    pilot: usize,
    /// Width of the stitched profile's bins for --target-error, µs.
    #[arg(value_parser = super::bin_us, long, default_value_t = 20.0)]
    bin_us: f64,
    /// Executions per train (back to back; 1 for single executions; at most 10 000).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    count: u32,
    /// Warm-up executions before each train's counted ones (at most 10 000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    warmup: u32,
    /// Shortest and longest random delay before each launch, ms.
    #[arg(value_parser = super::millis, long, allow_hyphen_values = true, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [1.0, 3.0])]
    delay_ms: Vec<f64>,
    /// The twin's scenario (hardware/twin/SCENARIOS.md); the built-in default when not
    /// given.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// The twin's rig description (hardware/rigs/*.toml) instead of the one its scenario
    /// names.
    #[arg(long)]
    rig: Option<PathBuf>,
    /// The rig's trigger input the runner's trigger output is wired to.
    #[arg(long, default_value_t = 0)]
    trigger_line: u8,
    /// The profile recording; the rig's capture goes beside it as `<name>.rig.arrow`.
    #[arg(long, short, default_value = "profile.arrow")]
    output: PathBuf,
    /// Replace the recordings if they exist.
    #[arg(long)]
    force: bool,
    /// Seed of the runner's random delays.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The rig's sample rate, Hz; when not given, the lowest the device offers that puts a
    /// sample in every --bin-us bin (100 kS/s for 10 µs), or its highest if none does.
    #[arg(long)]
    rate: Option<u32>,
    /// Capture at a rate the rig's link cannot carry (with --rig), the device dropping
    /// whole blocks (each a gap row); without it such a rate is refused.
    #[arg(long)]
    allow_drops: bool,
    /// The DVFS level to run the kernel at (the twin's scenario names them, e.g. `high`,
    /// `mid`, `low`); the GPU's current one when not given.
    #[arg(long)]
    dvfs: Option<String>,
    /// Run the kernel back to back for this long first, s of execution time (not
    /// recorded): profile the GPU at the temperature that work holds it at.
    #[arg(value_parser = super::seconds, long, default_value_t = 0.0)]
    preheat_s: f64,
}

/// Runs `railtrace profile`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (lo, hi) = (args.delay_ms[0], args.delay_ms[1]);
    anyhow::ensure!(
        lo >= 0.0 && hi >= lo,
        "--delay-ms {lo} {hi}: need 0 <= MIN <= MAX"
    );
    if let Some(e) = args.target_error {
        anyhow::ensure!(
            e > 0.0 && e < 1.0 && args.confidence > 0.0 && args.confidence < 1.0,
            "--target-error {e} --confidence {}: both must be between 0 and 1",
            args.confidence
        );
    }
    // Every execution is a row in memory until the run ends (about 100 bytes each).
    let executions = args.runs.unwrap_or(20_000) as u64 * u64::from(args.warmup + args.count);
    anyhow::ensure!(
        executions <= 50_000_000,
        "--runs × (--warmup + --count) = {executions} executions: at most 50 000 000 (about 5 GB of records) in one run"
    );
    anyhow::ensure!(
        args.preheat_s >= 0.0 && args.preheat_s.is_finite(),
        "--preheat-s {}: need a duration >= 0",
        args.preheat_s
    );
    for out in [args.output.clone(), rig_path(&args.output)] {
        railtrace::store::recording::check_output(&out, args.force)?;
    }
    railtrace::link::stop::install().map_err(anyhow::Error::msg)?;
    let plan = Plan {
        launch: Launch {
            kernel: args.kernel.clone(),
            delay_s: (lo * 1e-3, hi * 1e-3),
            warmup: args.warmup,
            count: args.count,
            dvfs: args.dvfs.clone(),
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
        preheat_s: args.preheat_s,
    };
    match args.gpu.as_str() {
        "twin" => {
            if let Some(l) = &args.logger {
                anyhow::bail!(
                    "--logger {l}: the twin's GPU has its own logger, the one its scenario's [logger] describes; --logger names a real GPU's"
                );
            }
            let run = run_of(&args);
            profile_with(&run, &plan, |progress| {
                railtrace::gpu::profile::on_twin(&run, &plan, args.seed, !args.no_rig, progress)
            })
        }
        #[cfg(feature = "rocm")]
        "rocm" => real_gpu(
            &args,
            &plan,
            &mut railtrace::gpu::rocm::RocmRunner::open(args.device)?,
        ),
        #[cfg(feature = "cuda")]
        "cuda" => real_gpu(
            &args,
            &plan,
            &mut railtrace::gpu::cuda::CudaRunner::open(args.device)?,
        ),
        other => {
            let built: Vec<&str> = [
                ("twin", true),
                ("rocm", cfg!(feature = "rocm")),
                ("cuda", cfg!(feature = "cuda")),
            ]
            .iter()
            .filter(|(_, b)| *b)
            .map(|(g, _)| *g)
            .collect();
            anyhow::bail!(
                "--gpu {other}: this railtrace drives {} (build with --features rocm for AMD GPUs, --features cuda,nvml for NVIDIA GPUs)",
                built.join(", ")
            )
        }
    }
}

/// A profiling run on a real GPU's `runner`, with the rig on `--port`, the logger of
/// `--logger` and the trigger output of `--trigger`; without `--port`, the logger's
/// readings alone (no rig, no trigger).
#[cfg(any(feature = "rocm", feature = "cuda"))]
fn real_gpu(args: &Args, plan: &Plan, runner: &mut dyn GpuRunner) -> anyhow::Result<()> {
    let mut logger = open_logger(args)?;
    let mut trigger: Box<dyn TriggerOut + Send> = match &args.port {
        Some(_) => open_trigger(args)?,
        None => {
            eprintln!(
                "railtrace profile: no --port: the GPU's logger alone, without a rig (its profile is not deconvolved)"
            );
            Box::new(railtrace::link::trigger::Quiet)
        }
    };
    let (port, run) = (args.port.as_deref(), run_of(args));
    profile_with(&run, plan, |progress| {
        railtrace::gpu::profile::profile(
            &run,
            plan,
            port,
            runner,
            &mut *logger,
            &mut *trigger,
            progress,
        )
    })
}

/// The GPU's logger named by `--logger`.
#[cfg(any(feature = "rocm", feature = "cuda"))]
fn open_logger(args: &Args) -> anyhow::Result<Box<dyn PowerLogger + Send>> {
    let default = if args.gpu == "cuda" { "nvml" } else { "hwmon" };
    let name = args.logger.as_deref().unwrap_or(default);
    railtrace::gpu::open_logger(name, args.card, args.device.unwrap_or(0) as u32)
}

/// The trigger output named by `--trigger` (see [`railtrace::link::trigger::open`]).
#[cfg(any(feature = "rocm", feature = "cuda"))]
fn open_trigger(args: &Args) -> anyhow::Result<Box<dyn TriggerOut + Send>> {
    let spec = args.trigger.as_deref().ok_or_else(|| {
        anyhow::anyhow!(
            "--gpu {} needs --trigger serial:PATH:rts|dtr or gpio:CHIP:LINE",
            args.gpu
        )
    })?;
    railtrace::link::trigger::open(spec).map_err(|e| anyhow::anyhow!("--trigger: {e}"))
}

fn run_of(args: &Args) -> Run {
    Run {
        output: args.output.clone(),
        rate_hz: args.rate,
        bin_s: args.bin_us * 1e-6,
        scenario: args.scenario.clone(),
        rig: args.rig.clone(),
        allow_drops: args.allow_drops,
        rig_rise_s: None,
        target_error: args.target_error.map(|e| (e, args.confidence)),
    }
}

/// Runs `go` (a profiling run told of each train) with a progress bar, and prints its
/// summary line.
fn profile_with(
    args: &Run,
    plan: &Plan,
    go: impl FnOnce(&mut dyn FnMut(&Acquired)) -> Result<Profiled, ProfileError>,
) -> anyhow::Result<()> {
    if plan.preheat_s > 0.0 {
        eprintln!(
            "railtrace profile: preheating: {} back to back for {} s",
            plan.launch.kernel, plan.preheat_s
        );
    }
    let bar = indicatif::ProgressBar::new(plan.runs as u64);
    let profiled = go(&mut |n: &Acquired| {
        bar.set_position(n.runs as u64);
        if let Some(p) = n.planned_runs {
            bar.set_message(format!("the planner estimates {p} runs for the target"));
        }
    });
    bar.finish_and_clear();
    summary(args, &profiled?);
    Ok(())
}

/// A profiling run's summary lines, on stderr.
pub fn summary(args: &Run, profiled: &Profiled) {
    let Profiled { acquired, rig } = profiled;
    let rig_out = rig_path(&args.output);
    if let Some((e, confidence)) = args.target_error {
        eprintln!(
            "railtrace profile: target {:.2} % at {:.0} % confidence {} after {} runs (planner's estimate: {})",
            e * 100.0,
            confidence * 100.0,
            if acquired.reached { "reached" } else { "NOT reached" },
            acquired.runs,
            acquired.planned_runs.map_or("none".to_string(), |p| p.to_string())
        );
    }
    let rig = match &rig {
        Some(r) => format!(
            "rig: {} samples, {} frames lost, {} gaps in {}",
            r.progress.samples,
            r.progress.frames_lost,
            r.progress.gaps,
            rig_out.display()
        ),
        None => "no rig: the logger's readings alone, not deconvolved".into(),
    };
    eprintln!(
        "railtrace profile: {} trains, {} executions, {} logger readings, {} clock reads, {} edges driven in {}; {rig}",
        acquired.runs,
        acquired.executions,
        acquired.logger_readings,
        acquired.clock_reads,
        acquired.driven,
        args.output.display(),
    );
}
