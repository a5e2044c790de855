//! `railtrace demo`: the whole job on the digital twin, no hardware, as the composition of
//! the stages ([`run`]): a profiling run of a kernel beside the rig (captured over the
//! twin's pseudo-terminal, the twin writing its truth beside it), the GPU logger
//! calibrated from the rig, the stitched logger profile corrected, every profile scored
//! against the twin's truth ([`score`]), and the table, the HTML report with its
//! pictures and the exports ([`report`]).

pub mod report;
pub mod score;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Instant;

use railtrace_twin::scenario::{Loaded, ScenarioError};

use crate::analysis::calibrate::{self, CalibrateError, Calibrated};
use crate::analysis::correct::{self, CorrectError, Corrected, RunPlan};
use crate::gpu::profile::{Acquired, Plan, ProfileError, Profiled, Run};
use crate::gpu::Launch;
use crate::store::recording::rig_path;
pub use report::{picture, Curve};
pub use score::{Score, Scored, Stitched, TrueExecution, Truth};

/// What a demo runs, and what it checks.
#[derive(Debug, Clone)]
pub struct Request {
    /// Where everything goes (made if missing; files of an earlier demo are replaced).
    pub out: PathBuf,
    /// The twin's scenario; the built-in default when none.
    pub scenario: Option<PathBuf>,
    /// The rig description the twin is built on, instead of the one the scenario names.
    pub rig: Option<PathBuf>,
    /// The kernel to profile.
    pub kernel: String,
    /// Executions to profile, each after a random delay.
    pub runs: usize,
    /// Executions of a pilot run first, whose correction plans the run's executions and
    /// bins ([`Corrected::run_plan`]) in place of `runs` and `bin_s`.
    pub pilot: Option<usize>,
    /// Shortest and longest random delay before each launch, s.
    pub delay_s: (f64, f64),
    /// The profiles' bin, s; the finest the rig resolves (at least 10 µs) when none.
    pub bin_s: Option<f64>,
    /// The rig's sample rate, Hz; the lowest that puts a sample in every bin when none.
    pub rate_hz: Option<u32>,
    /// The logger's update period if known, ms (identified from its readings otherwise).
    pub period_ms: Option<f64>,
    /// The checks' tolerances.
    pub tolerances: Tolerances,
    /// What the correction's planner plans for.
    pub plan: correct::PlanFor,
    /// Seed of the runner's random delays.
    pub seed: u64,
}

/// What the demo's checks allow.
#[derive(Debug, Clone, Copy)]
pub struct Tolerances {
    /// Each corrected phase's power, relative (0.05: within 5 %).
    pub phase: f64,
    /// Each corrected step's time, s.
    pub step_s: f64,
    /// The corrected profile's RMS error, as a fraction of the raw stitched profile's.
    pub rms_ratio: f64,
}

/// Why a demo could not run to its end (its checks failing is not an error: see
/// [`Demo::failed`]).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The request is out of range, or the rig cannot carry it.
    #[error("{0}")]
    Request(String),
    /// The twin's scenario or rig does not load.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The profiling run failed.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The logger could not be identified.
    #[error(transparent)]
    Calibrate(#[from] CalibrateError),
    /// The profile could not be corrected.
    #[error(transparent)]
    Correct(#[from] CorrectError),
    /// The twin's truth could not be read, or does not hold the run.
    #[error("the twin's truth: {0}")]
    Truth(String),
    /// A file of the demo could not be written.
    #[error("{0}")]
    Write(String),
}

/// The finest bin a stitched profile from a rig resolves: its slowest channel's 10-90 %
/// rise (sensor and ADC input filter), or the width that gathers [`Resolution::SAMPLES`]
/// samples a bin over the runs if wider (the runs' random delays spread the conversions
/// over the kernel, so the sample period itself is no limit), rounded up to whole µs.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Resolution {
    /// The rig's 10-90 % rise, s.
    pub rise_s: f64,
    /// Samples a µs of the kernel gets over all the runs.
    pub samples_per_us: f64,
    /// The finest bin, s.
    pub finest_s: f64,
}

impl Resolution {
    /// Samples a bin needs for its mean (the noise falls as 1/√n).
    pub const SAMPLES: f64 = 30.0;

    /// The resolution of `rig` at `rate_hz` over `runs` executions.
    pub fn of(rig: &railtrace_rig::RigDescription, rate_hz: u32, runs: usize) -> Resolution {
        let rise_s = rig.rise_s();
        let per_s = f64::from(rate_hz) * runs as f64;
        let finest_s = (rise_s.max(Self::SAMPLES / per_s) * 1e6 - 1e-9).ceil() * 1e-6;
        Resolution {
            rise_s,
            samples_per_us: per_s * 1e-6,
            finest_s,
        }
    }
}

/// The twin, its rig's rate and the profiles' bins.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The scenario and its rig.
    pub loaded: Loaded,
    /// The rig's sample rate, Hz.
    pub rate_hz: u32,
    /// The profiles' bin, s.
    pub bin_s: f64,
    /// What the rig resolves at that rate.
    pub resolution: Resolution,
}

impl Setup {
    /// The rig, its rate and the bins in a few lines, for people.
    pub fn describe(&self) -> String {
        let (rig, r) = (&self.loaded.rig, &self.resolution);
        let mut s = format!(
            "rig {}: {}\n  {} samples/s; finest bin it resolves {:.0} µs (10-90 % rise {:.2} µs; {:.1} samples a µs over the runs); bins of {:.1} µs",
            rig.name,
            railtrace_rig::summary(rig),
            self.rate_hz,
            r.finest_s * 1e6,
            r.rise_s * 1e6,
            r.samples_per_us,
            self.bin_s * 1e6
        );
        if self.bin_s < r.finest_s * (1.0 - 1e-9) {
            s += &format!(
                "\n  warning: {:.1} µs bins are finer than this rig resolves ({:.1} µs)",
                self.bin_s * 1e6,
                r.finest_s * 1e6
            );
        }
        s
    }
}

/// What a demo is doing, for a progress display.
#[derive(Debug)]
pub enum Stage<'a> {
    /// A pilot run of so many executions starts (its stages follow, then
    /// [`Stage::Planned`]).
    Pilot(usize),
    /// The pilot's plan, for the run that follows.
    Planned(&'a RunPlan),
    /// Set up.
    Setup(&'a Setup),
    /// Profiling: a train done.
    Train(&'a Acquired),
    /// Profiled.
    Profiled(&'a Run, &'a Profiled),
    /// Calibrating the logger: what it is doing now.
    Calibrating(&'a str),
    /// The logger identified, its model written to the path.
    Calibrated(&'a Calibrated, &'a Path),
    /// Correcting the logger's profile.
    Correcting,
    /// The logger's profile corrected with the logger's model, and the run it plans
    /// ([`Corrected::run_plan`]; none where it cannot plan).
    Corrected(&'a Corrected, Option<&'a RunPlan>),
    /// The conditions that put the correction outside the range where it can be trusted
    /// ([`Corrected::outside_range`]; none: within it).
    Judged(&'a [String]),
    /// Scoring and writing the report.
    Reporting,
}

/// One of the demo's checks, with what was measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// What is checked.
    pub what: String,
    /// What was measured.
    pub measured: String,
    /// Whether it passed.
    pub pass: bool,
}

/// A demo's outcome.
#[derive(Debug, Clone)]
pub struct Demo {
    /// Every figure (`figures.json`).
    pub figures: serde_json::Value,
    /// The profiles against the truth, as a table for a terminal.
    pub table: String,
    /// The checks.
    pub checks: Vec<Check>,
    /// The HTML report.
    pub report: PathBuf,
    /// Seconds spent profiling, calibrating, correcting, reporting and in all.
    pub seconds: [f64; 5],
}

impl Demo {
    /// The checks that failed.
    pub fn failed(&self) -> Vec<&str> {
        (self.checks.iter())
            .filter(|c| !c.pass)
            .map(|c| c.what.as_str())
            .collect()
    }
}

/// The demo of `req`: its stages in turn, each told to `on`.
///
/// # Errors
///
/// A request out of range, a scenario or rig that does not load, or a stage failing
/// (the twin, the capture, the identification, the correction, writing the files).
pub fn run(req: &Request, on: &mut dyn FnMut(Stage<'_>)) -> Result<Demo, DemoError> {
    let started = Instant::now();
    let (lo, hi) = req.delay_s;
    if !(lo >= 0.0 && hi >= lo) {
        return Err(DemoError::Request(format!(
            "delays {} ms to {} ms: need 0 <= shortest <= longest",
            lo * 1e3,
            hi * 1e3
        )));
    }
    if !(req.bin_s.is_none_or(|b| b > 0.0) && req.runs > 0) {
        return Err(DemoError::Request(
            "the bin and the runs must be > 0".into(),
        ));
    }
    let planned = match req.pilot {
        Some(runs) => Some((runs, pilot(req, runs, on)?)),
        None => None,
    };
    let req = &match &planned {
        Some((_, p)) => Request {
            runs: p.executions as usize,
            bin_s: Some(p.bin_s),
            pilot: None,
            ..req.clone()
        },
        None => req.clone(),
    };
    let out = &req.out;
    let write = |e: anyhow::Error| DemoError::Write(format!("{e:#}"));
    std::fs::create_dir_all(out)
        .map_err(|e| DemoError::Write(format!("cannot create {}: {e}", out.display())))?;
    let setup = setup(req)?;
    on(Stage::Setup(&setup));

    let t = Instant::now();
    let (run, profiled) = profile(req, &setup, on)?;
    on(Stage::Profiled(&run, &profiled));
    let profile_s = t.elapsed().as_secs_f64();

    let (cal, logger_path) = identify(req, &run.output, on)?;
    on(Stage::Calibrated(&cal, &logger_path));

    on(Stage::Correcting);
    let t = Instant::now();
    let rig_recording = rig_path(&run.output);
    let c = correct::correct(
        &run.output,
        &rig_recording,
        &cal.model,
        &logger_path,
        setup.bin_s,
        setup.loaded.rig.accuracy,
    )?;
    let correct_s = t.elapsed().as_secs_f64();
    let run_plan = c.run_plan(&cal.model, &req.plan);
    on(Stage::Corrected(&c, run_plan.as_ref()));
    let outside = c.outside_range(&cal.model, run_plan.as_ref());
    on(Stage::Judged(&outside));

    on(Stage::Reporting);
    let t = Instant::now();
    let untrue = |e: anyhow::Error| DemoError::Truth(format!("{e:#}"));
    let truth = Truth::read(&out.join("truth")).map_err(untrue)?;
    let scored = score::score(&truth, &c).map_err(untrue)?;
    let checks = checks(&scored.rows, &req.tolerances);
    let mut figures = figures(req, &setup, &cal, &c, &outside, &scored, &checks);
    figures["planned_executions"] = serde_json::json!(run_plan.as_ref().map(|p| p.executions));
    figures["plan"] = serde_json::json!(run_plan.as_ref().map(|p| c.plan(p)));
    figures["run_plan"] = serde_json::json!(run_plan);
    if let Some((runs, p)) = &planned {
        // The pilot's plan beside the one this run makes again from its own capture.
        let again = figures["run_plan"]["executions"].as_f64();
        figures["pilot"] = serde_json::json!({
            "runs": runs,
            "run_plan": p,
            "replanned_ratio": again.map(|n| n / p.executions as f64),
        });
    }
    figures["seconds"] =
        serde_json::json!({"profile": profile_s, "calibrate": cal.seconds, "correct": correct_s});
    let mut title = format!("railtrace demo: {}", setup.loaded.scenario.description);
    if figures["validity"]["within_range"] == false {
        title += " — OUTSIDE the range where the correction can be trusted";
    }
    let table = format!(
        "{}\n{}\n",
        report::table(&scored.rows),
        scored.band.describe(c.d.confidence)
    );
    correct::write(&c, &figures, &out.join("corrected.arrow"))?;
    let report = report::write(
        out,
        &title,
        &figures,
        &scored,
        &table,
        &checks,
        &[&run.output, &rig_recording],
    )
    .map_err(write)?;
    let report_s = t.elapsed().as_secs_f64();
    Ok(Demo {
        figures,
        table,
        checks,
        report,
        seconds: [
            profile_s,
            cal.seconds,
            correct_s,
            report_s,
            started.elapsed().as_secs_f64(),
        ],
    })
}

/// Most executions a demo runs: about a day of the twin's real time.
pub const MAX_RUNS: usize = 1_000_000;

/// A pilot run of `runs` executions into `pilot/` under the demo's folder, profiled,
/// calibrated and corrected as the demo is, for the plan its correction makes.
///
/// # Errors
///
/// As [`run`]'s stages, a pilot whose logger model is not a calibration (its doubts) or
/// whose correction cannot plan, or a plan over [`MAX_RUNS`].
fn pilot(req: &Request, runs: usize, on: &mut dyn FnMut(Stage<'_>)) -> Result<RunPlan, DemoError> {
    on(Stage::Pilot(runs));
    // Its delays drawn from a seed of its own, so that the run it plans is no replay of
    // its first executions.
    let req = Request {
        out: req.out.join("pilot"),
        runs,
        pilot: None,
        seed: !req.seed,
        ..req.clone()
    };
    std::fs::create_dir_all(&req.out)
        .map_err(|e| DemoError::Write(format!("cannot create {}: {e}", req.out.display())))?;
    let setup = setup(&req)?;
    on(Stage::Setup(&setup));
    let (run, profiled) = profile(&req, &setup, on)?;
    on(Stage::Profiled(&run, &profiled));
    let (cal, logger_path) = identify(&req, &run.output, on)?;
    on(Stage::Calibrated(&cal, &logger_path));
    if !cal.model.doubts.is_empty() {
        return Err(DemoError::Request(format!(
            "the pilot of {runs} executions did not calibrate the logger ({}): try a longer pilot",
            cal.model.doubts.join("; ")
        )));
    }
    let c = correct::correct(
        &run.output,
        &rig_path(&run.output),
        &cal.model,
        &logger_path,
        setup.bin_s,
        setup.loaded.rig.accuracy,
    )?;
    let plan = c.run_plan(&cal.model, &req.plan).ok_or_else(|| {
        DemoError::Request(format!(
            "the pilot of {runs} executions cannot plan the run (its rig's reference or its logger's readings tell no phase): try a longer pilot"
        ))
    })?;
    if let Some(why) = plan.unreachable() {
        return Err(DemoError::Request(format!(
            "the pilot finds {why}: ask for a looser --phase-tolerance"
        )));
    }
    if plan.executions > MAX_RUNS as u64 {
        return Err(DemoError::Request(format!(
            "the pilot plans {}, more than the demo runs ({MAX_RUNS}, about a day of the twin's real time)",
            plan.asks()
        )));
    }
    on(Stage::Planned(&plan));
    Ok(plan)
}

/// The scenario loaded; bins of 10 µs, or the finest the rig resolves at the top rate its
/// link carries; then the lowest rate that puts a sample in every bin.
///
/// # Errors
///
/// A scenario or rig that does not load, or a rig whose link carries none of its rates.
pub fn setup(req: &Request) -> Result<Setup, DemoError> {
    let loaded = railtrace_twin::scenario::load_with(req.scenario.as_deref(), req.rig.as_deref())?;
    let rig = &loaded.rig;
    let channels = rig.channels.len();
    let carried = rig.carried_rate_hz(channels).ok_or_else(|| {
        DemoError::Request(format!(
            "the rig {}'s link carries none of its rates with {channels} channels",
            rig.name
        ))
    })?;
    let bin_s = (req.bin_s).unwrap_or(Resolution::of(rig, carried, req.runs).finest_s.max(10e-6));
    let rate_hz = req.rate_hz.unwrap_or_else(|| {
        (rig.board.sample_rates_hz.iter().copied())
            .filter(|&r| r <= carried && f64::from(r) * bin_s >= 1.0 - 1e-9)
            .min()
            .unwrap_or(carried)
    });
    let resolution = Resolution::of(rig, rate_hz, req.runs);
    Ok(Setup {
        loaded,
        rate_hz,
        bin_s,
        resolution,
    })
}

/// The profiling run on the twin into `profile.arrow`, the rig's capture beside it and
/// the twin's truth in `truth/`.
fn profile(
    req: &Request,
    setup: &Setup,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<(Run, Profiled), DemoError> {
    let plan = Plan {
        launch: Launch {
            kernel: req.kernel.clone(),
            delay_s: req.delay_s,
            warmup: 0,
            count: 1,
            dvfs: None,
        },
        runs: req.runs,
        clock_reads: 5,
        trigger_line: 0,
        target: None,
        preheat_s: 0.0,
    };
    let run = Run {
        output: req.out.join("profile.arrow"),
        rate_hz: Some(setup.rate_hz),
        bin_s: setup.bin_s,
        scenario: req.scenario.clone(),
        rig: req.rig.clone(),
        allow_drops: false,
        rig_rise_s: None,
        target_error: None,
    };
    let truth = req.out.join("truth");
    let profiled = crate::gpu::profile::on_loaded_twin(
        &setup.loaded,
        Some(&truth),
        &run,
        &plan,
        req.seed,
        true,
        |a| on(Stage::Train(a)),
    )?;
    Ok((run, profiled))
}

/// The logger identified from the rig, its model written to `logger.toml`.
fn identify(
    req: &Request,
    profile: &Path,
    on: &mut dyn FnMut(Stage<'_>),
) -> Result<(Calibrated, PathBuf), DemoError> {
    let path = req.out.join("logger.toml");
    let on = RefCell::new(on);
    let request = calibrate::Request {
        period_ms: req.period_ms,
        ..calibrate::Request::default()
    };
    let cal = calibrate::calibrate(profile, None, request, |m| {
        (on.borrow_mut())(Stage::Calibrating(m))
    })?;
    cal.model
        .write(&path)
        .map_err(|e| DemoError::Write(format!("{e:#}")))?;
    Ok((cal, path))
}

/// The checks the demo exists for: the corrected profile's steps, phases, energy and RMS
/// error against the truth's (the rows' first is the truth, the third the raw stitched
/// profile, the fourth the corrected one).
fn checks(rows: &[(&str, Score)], tol: &Tolerances) -> Vec<Check> {
    let (truth, raw, cor) = (&rows[0].1, &rows[2].1, &rows[3].1);
    let rel = |a: f64, b: f64| (a - b) / b;
    let mut checks = Vec::new();
    for (j, (got, want)) in cor.step_s.iter().zip(&truth.step_s).enumerate() {
        let err = got.zip(*want).map(|(g, w)| g - w);
        checks.push(Check {
            what: format!("step {} within {} µs of the truth", j + 1, tol.step_s * 1e6),
            measured: err.map_or("no step".into(), |e| format!("{:+.1} µs", e * 1e6)),
            pass: err.is_some_and(|e| e.abs() <= tol.step_s),
        });
    }
    for (j, (&got, &want)) in cor.phase_w.iter().zip(&truth.phase_w).enumerate() {
        let e = rel(got, want);
        checks.push(Check {
            what: format!(
                "phase {} power within {} % of the truth",
                j + 1,
                tol.phase * 100.0
            ),
            measured: format!("{:+.2} %", e * 100.0),
            pass: e.abs() <= tol.phase,
        });
    }
    let e = rel(cor.energy_j, truth.energy_j);
    checks.push(Check {
        what: "energy per execution within 2 % of the truth".into(),
        measured: format!("{:+.2} %", e * 100.0),
        pass: e.abs() <= 0.02,
    });
    checks.push(Check {
        what: format!(
            "RMS error at most {:.3} of the raw stitched profile's",
            tol.rms_ratio
        ),
        measured: format!(
            "{:.2} W against {:.2} W ({:.3})",
            cor.rms_w,
            raw.rms_w,
            cor.rms_w / raw.rms_w
        ),
        pass: cor.rms_w <= raw.rms_w * tol.rms_ratio,
    });
    checks
}

/// Every figure of the demo, as `figures.json` holds them, but the run's plan (its
/// caller's, made once) and the pilot's.
fn figures(
    req: &Request,
    setup: &Setup,
    cal: &Calibrated,
    c: &Corrected,
    outside: &[String],
    scored: &Scored,
    checks: &[Check],
) -> serde_json::Value {
    let (a, d, rig) = (&c.analysis, &c.d, &setup.loaded.rig);
    let raw = &scored.profiles.raw;
    serde_json::json!({
        "scenario": setup.loaded.scenario.description,
        "rig": {"name": rig.name, "summary": railtrace_rig::summary(rig)},
        "rate_hz": setup.rate_hz,
        "resolution": setup.resolution,
        "runs": req.runs,
        "executions_kept": a.executions.iter().filter(|e| e.kept).count(),
        "bin_s": d.dt_s,
        "requested_bin_s": c.requested_bin_s,
        "readings_per_bin": c.readings_per_bin,
        "widened": c.widened(),
        "validity": correct::validity(outside),
        "logger": cal.model,
        "idle_w": c.idle_w,
        "reference_lag_s": c.reference_lag_s,
        "duration_s": scored.duration_s,
        "lambda": d.lambda,
        "rule": d.rule,
        "noise_scale": d.noise_scale,
        "segments": d.segments,
        "energy_band_j": [d.energy_lo_j, d.energy_hi_j],
        "band_carries": correct::band_carries(c),
        "band": scored.band,
        "rows": scored.rows.iter().map(|(n, s)| serde_json::json!({"profile": n, "score": s})).collect::<Vec<_>>(),
        "raw_peak_w": raw.iter().map(|c| c.w).filter(|w| w.is_finite()).fold(f64::NAN, f64::max),
        "checks": checks,
    })
}
