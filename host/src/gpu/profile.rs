//! Profiling runs: FinGraV's recipe on a GPU beside the rig. The GPU side of a run (each
//! execution on the GPU's clock, the GPU clock read between host clock reads, every
//! trigger edge the host drove, the GPU logger's readings) goes into a recording of its
//! own; the rig's capture of the same run into another. The analysis aligns the three
//! clocks and stitches both power traces onto the kernel's time axis.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use railtrace_calibration::align::{fit_brackets, Bracket};

use crate::analysis::stitch::{gpu_view, GpuSide, LoggerStamp};
use crate::gpu::{host_now_ns, ExecutionRecord, GpuError, GpuRunner, Launch, PowerLogger, Stamp};
use crate::link::capture::{capture, CaptureError, Config, Counters, RigFile, Summary};
use crate::link::trigger::{Driven, Quiet, TriggerError, TriggerOut};
use crate::store::recording::{rig_path, Event, Meta, RecordingError, Writer, FORMAT_VERSION};

/// Why a profiling run failed.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The GPU.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The recording.
    #[error(transparent)]
    Recording(#[from] RecordingError),
    /// The rig's capture failed.
    #[error("the rig's capture failed: {0}")]
    Capture(#[from] CaptureError),
    /// The rig's capture gave no sample.
    #[error("the rig's capture did not start: {0}")]
    RigDidNotStart(String),
    /// The rig's capture panicked.
    #[error("the rig's capture panicked")]
    RigPanicked,
    /// The rig's description file does not read.
    #[error("{0}")]
    Rig(String),
    /// Ended early on Ctrl-C, SIGTERM or SIGHUP.
    #[error("interrupted after {runs} of {planned} trains; {kept}")]
    Interrupted {
        /// Trains run.
        runs: usize,
        /// Trains planned.
        planned: usize,
        /// What keeps them.
        kept: String,
    },
    /// The twin's scenario or rig.
    #[error(transparent)]
    Scenario(#[from] railtrace_twin::ScenarioError),
    /// The twin did not start, or failed.
    #[error("the twin: {0}")]
    Twin(#[from] railtrace_twin::mcu::TwinError),
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The kernel, its delay, warm-up and train length.
    pub launch: Launch,
    /// Trains to run.
    pub runs: usize,
    /// GPU clock reads around each train.
    pub clock_reads: usize,
    /// The rig's trigger input the trigger output is wired to.
    pub trigger_line: u8,
    /// Keep running until the logger's stitched profile reaches a target error (then
    /// `runs` is the most to run).
    pub target: Option<Target>,
    /// The kernel was run back to back for this long first, s of its own execution time
    /// ([`preheat`], before the rig's capture starts: nothing of it recorded), the GPU
    /// brought to the temperature that work holds it at; in the settings.
    pub preheat_s: f64,
}

/// The keep-running mode: stop once every considered bin of the logger's stitched
/// profile has a confidence interval within `rel_err` of its mean, all bins at once
/// (Bonferroni over the bins), checked every `every` runs after a pilot of `pilot`.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Relative error, e.g. 0.02.
    pub rel_err: f64,
    /// Confidence, e.g. 0.95.
    pub confidence: f64,
    /// Runs before the first check.
    pub pilot: usize,
    /// Runs between checks.
    pub every: usize,
    /// The stitching (bin width, horizon).
    pub options: crate::analysis::stitch::Options,
}

/// What a run produced.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Acquired {
    /// Trains run.
    pub runs: usize,
    /// Executions recorded, warm-up included.
    pub executions: usize,
    /// Logger readings.
    pub logger_readings: usize,
    /// GPU clock reads.
    pub clock_reads: usize,
    /// Trigger edges driven.
    pub driven: usize,
    /// The planner's estimate of the runs the target needs, after the last check.
    pub planned_runs: Option<u64>,
    /// The target error was reached.
    pub reached: bool,
    /// Ended early on Ctrl-C, SIGTERM or SIGHUP (see [`crate::link::stop`]).
    pub interrupted: bool,
}

/// A trigger output that remembers the edges it drove.
struct Recorded<'a> {
    inner: &'a mut dyn TriggerOut,
    driven: Vec<Driven>,
}

impl TriggerOut for Recorded<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn set(&mut self, high: bool) -> Result<Driven, TriggerError> {
        let d = self.inner.set(high)?;
        self.driven.push(d);
        Ok(d)
    }
}

/// The GPU side of a profiling run, written as it goes.
#[derive(Debug)]
struct Out {
    w: Writer,
    epoch_ns: i64,
    hz: f64,
    n: Acquired,
    /// What the keep-running mode checks.
    side: GpuSide,
    /// GPU clock (s) → host (s since the epoch), from the reads so far.
    link: Option<railtrace_calibration::align::LinearMap>,
}

impl Out {
    /// The keep-running test on the run so far; records the planner's estimate.
    fn check(&mut self, t: &Target) -> bool {
        use railtrace_calibration::plan::{
            considered_bins, reached, runs_needed, simultaneous_confidence,
        };
        use railtrace_calibration::stitch::profile;
        let Ok(view) = gpu_view(&self.side, &t.options) else {
            return false; // not enough clock reads or executions yet
        };
        let bin = t.options.bin_s;
        let Ok(first) = profile(&view.stitched, bin, t.confidence) else {
            return false;
        };
        let together = simultaneous_confidence(t.confidence, considered_bins(&first).len().max(1));
        let Ok(bins) = profile(&view.stitched, bin, together) else {
            return false;
        };
        if let Ok(plan) = runs_needed(&first, t.rel_err, t.confidence) {
            self.n.planned_runs = Some(plan.runs_at_yield(&first, self.n.runs as u64));
        }
        reached(&bins, t.rel_err)
    }

    fn host_s(&self, ns: i64) -> f64 {
        (ns - self.epoch_ns) as f64 * 1e-9
    }

    fn clock(&mut self, runner: &mut dyn GpuRunner, reads: usize) -> Result<(), ProfileError> {
        for _ in 0..reads {
            let r = runner.read_clock()?;
            let mid = r.host_before_ns + (r.host_after_ns - r.host_before_ns) / 2;
            self.side.brackets.push(Bracket {
                before: self.host_s(r.host_before_ns),
                reading: r.gpu_ticks as f64 / self.hz,
                after: self.host_s(r.host_after_ns),
            });
            self.w.event(&Event::ClockRead {
                time_s: self.host_s(mid),
                host_before_ns: r.host_before_ns,
                host_after_ns: r.host_after_ns,
                gpu_ticks: r.gpu_ticks,
            });
            self.n.clock_reads += 1;
        }
        // The GPU link so far, for the rows' time_s (the analysis fits it again on all):
        // fitted again as the reads double, then every 1 024 of them (fitting all of
        // them after every train made a long run's trains slower and slower).
        let n = self.side.brackets.len();
        let crossed = |every: usize| n / every != n.saturating_sub(reads) / every;
        let doubled = n.max(1).ilog2() != n.saturating_sub(reads).max(1).ilog2();
        if self.link.is_none() || n <= 64 || (n < 1024 && doubled) || crossed(1024) {
            self.link = fit_brackets(&self.side.brackets, 0.2).ok().map(|f| f.map);
        }
        Ok(())
    }

    /// A GPU clock reading on the host's timeline, by the link so far (NaN before one).
    fn gpu_s(&self, ticks: u64) -> f64 {
        self.link
            .map_or(f64::NAN, |m| m.apply(ticks as f64 / self.hz))
    }

    fn logger(&mut self, logger: &mut dyn PowerLogger) -> Result<(), ProfileError> {
        for r in logger.poll()? {
            let stamp = match r.stamp {
                Stamp::GpuTicks(t) => LoggerStamp::Gpu(t),
                Stamp::HostNs(ns) => LoggerStamp::Host(self.host_s(ns)),
                Stamp::Own { ticks, hz } => {
                    LoggerStamp::Own(ticks as f64 / hz, self.host_s(r.host_ns))
                }
            };
            self.side.logger.push((stamp, r.power_w));
            self.w.event(&r.event(match stamp {
                LoggerStamp::Gpu(t) => self.gpu_s(t),
                LoggerStamp::Host(t) => t,
                LoggerStamp::Own(..) => f64::NAN, // linked in the analysis
            }));
            self.n.logger_readings += 1;
        }
        Ok(())
    }

    fn train(&mut self, execs: &[ExecutionRecord], driven: &[Driven], line: u8) {
        for d in driven {
            self.w.event(&d.event(line, self.epoch_ns));
            self.n.driven += 1;
        }
        for e in execs {
            self.side
                .executions
                .push((e.start_ticks, e.end_ticks, e.train, e.index_in_train));
            self.w.event(&Event::Execution {
                time_s: self.gpu_s(e.start_ticks),
                kernel: e.kernel.clone(),
                train: e.train,
                index_in_train: e.index_in_train,
                start_ticks: e.start_ticks,
                end_ticks: e.end_ticks,
                duration_s: e.end_ticks.saturating_sub(e.start_ticks) as f64 / self.hz,
            });
            self.n.executions += 1;
        }
    }
}

/// Runs `plan` on `runner`, driving `trigger` at each launch and polling `logger`, into
/// the recording `output`; `settings` goes into its metadata beside the plan. Calls
/// `progress` after each train.
pub fn acquire(
    runner: &mut dyn GpuRunner,
    logger: &mut dyn PowerLogger,
    trigger: &mut dyn TriggerOut,
    plan: &Plan,
    output: &Path,
    settings: serde_json::Value,
    mut progress: impl FnMut(&Acquired),
) -> Result<Acquired, ProfileError> {
    let kernels = runner.kernels();
    if !kernels.contains(&plan.launch.kernel) {
        return Err(GpuError::UnknownKernel(plan.launch.kernel.clone(), kernels.join(", ")).into());
    }
    if let Some(level) = &plan.launch.dvfs {
        crate::gpu::check_dvfs_level(runner, level)?;
    }
    let epoch_ns = host_now_ns();
    let hz = runner.clock_hz();
    let l = &plan.launch;
    let line = plan.trigger_line;
    let meta = Meta {
        version: FORMAT_VERSION,
        source: format!("profile {} on {}", l.kernel, runner.describe()),
        epoch_utc_ns: epoch_ns,
        timebase: "host clock (UTC); executions are on the GPU's clock until aligned".into(),
        rails: Vec::new(),
        code_channels: Vec::new(),
        device: None,
        rig: None,
        derive: None,
        settings: Some(serde_json::json!({
            "kernel": l.kernel,
            "runs": plan.runs,
            "warmup": l.warmup,
            "count": l.count,
            "dvfs": l.dvfs,
            "preheat_s": plan.preheat_s,
            "delay_s": [l.delay_s.0, l.delay_s.1],
            "gpu": runner.describe(),
            "gpu_clock_hz": hz,
            "logger": logger.describe(),
            "trigger": trigger.describe(),
            "trigger_line": line,
            "more": settings,
        })),
    };
    let mut out = Out {
        w: Writer::create(output, &meta)?,
        epoch_ns,
        hz,
        n: Acquired::default(),
        side: GpuSide {
            epoch_ns,
            hz,
            line,
            ..GpuSide::default()
        },
        link: None,
    };
    out.clock(runner, plan.clock_reads)?;
    for _ in 0..plan.runs {
        if crate::link::stop::requested() {
            out.n.interrupted = true;
            break;
        }
        let mut rec = Recorded {
            inner: &mut *trigger,
            driven: Vec::new(),
        };
        let execs = runner.run(l, &mut rec)?;
        let driven = rec.driven;
        out.train(&execs, &driven, line);
        out.clock(runner, plan.clock_reads)?;
        out.logger(logger)?;
        out.n.runs += 1;
        out.w.maybe_flush()?;
        if let Some(t) = &plan.target {
            let due = out.n.runs >= t.pilot && (out.n.runs - t.pilot) % t.every.max(1) == 0;
            if due && out.check(t) {
                out.n.reached = true;
                progress(&out.n);
                break;
            }
        }
        progress(&out.n);
    }
    // The logger reports a window after the last kernel: wait for it.
    std::thread::sleep(Duration::from_millis(50));
    out.logger(logger)?;
    let n = out.n.clone();
    out.w.finish()?;
    Ok(n)
}

/// Runs `launch`'s kernel back to back (at its DVFS level) until `seconds` of execution
/// time have passed, in trains of about 50 ms, the trigger not driven; the logger's
/// readings meanwhile are read and dropped.
pub fn preheat(
    runner: &mut dyn GpuRunner,
    logger: &mut dyn PowerLogger,
    launch: &Launch,
    seconds: f64,
) -> Result<(), ProfileError> {
    let hz = runner.clock_hz();
    let (mut done, mut count) = (0.0, 1u32);
    while done < seconds {
        let train = Launch {
            delay_s: (0.0, 0.0),
            warmup: 0,
            count,
            ..launch.clone()
        };
        let execs = runner.run(&train, &mut Quiet)?;
        let busy: f64 = (execs.iter())
            .map(|e| e.end_ticks.saturating_sub(e.start_ticks) as f64 / hz)
            .sum();
        if execs.is_empty() || busy <= 0.0 {
            break;
        }
        done += busy;
        count = ((50e-3 * execs.len() as f64 / busy) as u32).clamp(1, 100_000);
        logger.poll()?;
    }
    Ok(())
}

/// Runs `run` while the rig on `port` is captured into `rig_out` (at `rate_hz`, the
/// device's highest when not given) in the background, from its first sample to `run`'s
/// end. With the rig's description (`rig`), a rate its link cannot carry is refused
/// unless `allow_drops` (see [`Config::allow_drops`]).
pub fn with_rig<T, E: From<ProfileError>>(
    port: &Path,
    rig_out: &Path,
    (rate_hz, rate_at_least_hz): (Option<u32>, Option<u32>),
    (rig, allow_drops): (Option<RigFile>, bool),
    run: impl FnOnce() -> Result<T, E>,
) -> Result<(T, Summary), E> {
    let config = Config {
        rig,
        rate_hz,
        rate_at_least_hz,
        allow_drops,
        replace: true, // checked by the command before it starts
        ..Config::new(port, rig_out)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let rig = {
        let (stop, counters) = (stop.clone(), counters.clone());
        std::thread::spawn(move || capture(&config, &stop, &counters, |_| {}))
    };
    let started = Instant::now();
    while counters.samples.load(Ordering::Relaxed) == 0 {
        if rig.is_finished() || started.elapsed() > Duration::from_secs(10) {
            stop.store(true, Ordering::Relaxed);
            let why = match rig.join() {
                Ok(Err(e)) => e.to_string(),
                _ => "no samples within 10 s".into(),
            };
            return Err(ProfileError::RigDidNotStart(why).into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let result = run();
    stop.store(true, Ordering::Relaxed);
    let summary = rig.join().map_err(|_| ProfileError::RigPanicked)?;
    let result = result?;
    Ok((result, summary.map_err(ProfileError::from)?))
}

/// Where a profiling run goes and how the rig captures it.
#[derive(Debug, Clone)]
pub struct Run {
    /// The profile recording (the rig's capture beside it).
    pub output: PathBuf,
    /// The rig's sample rate, Hz (when not given, the lowest the device offers that puts a
    /// sample in every bin, or its highest).
    pub rate_hz: Option<u32>,
    /// The profile's bin, s.
    pub bin_s: f64,
    /// The twin's scenario file, if one was given.
    pub scenario: Option<PathBuf>,
    /// The rig's description file (the twin's, or the real rig's), if one was given: its
    /// link's capacity is checked against the rate.
    pub rig: Option<PathBuf>,
    /// Capture at a rate the rig's link cannot carry (see [`Config::allow_drops`]).
    pub allow_drops: bool,
    /// The rig's 10-90 % rise (its sensors and ADC filter), s, where its description is
    /// known: kept in the profile, so that a report draws no bin finer than it.
    pub rig_rise_s: Option<f64>,
    /// The keep-running target, for the summary line.
    pub target_error: Option<(f64, f64)>,
}

/// A profiling run on the digital twin of `run.scenario` (the built-in default when
/// none) built on `run.rig`: the twin's GPU (its random delays drawn from `seed`), its
/// logger and its trigger line, its rig captured beside it unless `rig` is false.
///
/// # Errors
///
/// As [`profile`], and a scenario or rig file that does not load.
pub fn on_twin(
    run: &Run,
    plan: &Plan,
    seed: u64,
    rig: bool,
    progress: impl FnMut(&Acquired),
) -> Result<Profiled, ProfileError> {
    let loaded = railtrace_twin::scenario::load_with(run.scenario.as_deref(), run.rig.as_deref())?;
    on_loaded_twin(&loaded, None, run, plan, seed, rig, progress)
}

/// As [`on_twin`], on a scenario already loaded; the twin writes its truth (its true GPU
/// power and executions) into `truth` when given, closed when this returns.
///
/// # Errors
///
/// As [`profile`], and a twin that does not start or fails.
pub fn on_loaded_twin(
    loaded: &railtrace_twin::scenario::Loaded,
    truth: Option<&Path>,
    run: &Run,
    plan: &Plan,
    seed: u64,
    rig: bool,
    progress: impl FnMut(&Acquired),
) -> Result<Profiled, ProfileError> {
    let twin = railtrace_twin::Twin::start_with(loaded, truth)?;
    let gpu = crate::gpu::twin::TwinGpu::new(&twin);
    let run = Run {
        rig_rise_s: Some(loaded.rig.rise_s()),
        ..run.clone()
    };
    let result = profile(
        &run,
        plan,
        rig.then(|| twin.path()),
        &mut gpu.runner(seed),
        &mut gpu.logger(),
        &mut crate::gpu::twin::TwinTrigger::new(&twin, plan.trigger_line),
        progress,
    );
    twin.stop()?;
    result
}

/// A profiling run's outcome.
#[derive(Debug, Clone)]
pub struct Profiled {
    /// What the GPU side recorded.
    pub acquired: Acquired,
    /// The rig's capture, where there was a rig.
    pub rig: Option<Summary>,
}

/// A profiling run: `plan` run on `runner` (after its preheat), the rig captured from
/// `port` in the background meanwhile; `progress` is told of each train.
///
/// # Errors
///
/// The rig's capture, the GPU or its logger failing, or a run interrupted (Ctrl-C):
/// each recording is closed and keeps what came before.
pub fn profile(
    args: &Run,
    plan: &Plan,
    port: Option<&Path>,
    runner: &mut dyn GpuRunner,
    logger: &mut dyn PowerLogger,
    trigger: &mut dyn TriggerOut,
    mut progress: impl FnMut(&Acquired),
) -> Result<Profiled, ProfileError> {
    let rig_out = rig_path(&args.output);
    if plan.preheat_s > 0.0 {
        preheat(runner, logger, &plan.launch, plan.preheat_s)?;
    }
    let least = (args.bin_s > 0.0).then(|| (1.0 / args.bin_s).ceil() as u32);
    let mut run = || {
        acquire(
            runner,
            logger,
            trigger,
            plan,
            &args.output,
            serde_json::json!({
                "scenario": args.scenario.as_ref().map(|p| p.display().to_string()),
                "rig": args.rig.as_ref().map(|p| p.display().to_string()),
                "rig_recording": port.map(|_| rig_out.display().to_string()),
                "rig_port": port.map(|p| p.display().to_string()),
                "rig_rise_s": args.rig_rise_s,
            }),
            &mut progress,
        )
    };
    let (acquired, rig_summary) = match port {
        Some(port) => {
            let rig = (args.rig.as_deref())
                .map(RigFile::read)
                .transpose()
                .map_err(|e| ProfileError::Rig(e.to_string()))?;
            let (a, s) = with_rig(
                port,
                &rig_out,
                (args.rate_hz, least),
                (rig, args.allow_drops),
                run,
            )?;
            (a, Some(s))
        }
        None => (run()?, None),
    };
    let kept = if rig_summary.is_some() {
        format!(
            "{} and {} are closed and keep them",
            args.output.display(),
            rig_out.display()
        )
    } else {
        format!("{} is closed and keeps them", args.output.display())
    };
    if acquired.interrupted {
        return Err(ProfileError::Interrupted {
            runs: acquired.runs,
            planned: plan.runs,
            kept,
        });
    }
    Ok(Profiled {
        acquired,
        rig: rig_summary,
    })
}
