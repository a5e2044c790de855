//! `railtrace demo [--out DIR]`: the whole job on the twin, no hardware. A profiling run of
//! a two-phase kernel beside the rig (captured over the twin's pseudo-terminal), the GPU
//! logger calibrated from the rig, the stitched logger profile deconvolved, and every
//! profile scored against the twin's truth: a table on the terminal, an HTML report with
//! the pictures, and the exports.

use std::path::PathBuf;

use railtrace::analysis::correct::PlanFor;
use railtrace::demo::{Request, Stage, Tolerances, MAX_RUNS};

use super::{calibrate, profile};

/// Runs the twin's scenario through profiling, logger calibration and correction, and
/// scores each profile against the twin's truth.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where everything goes (made if missing; files of an earlier demo are replaced).
    #[arg(long, default_value = "railtrace-demo")]
    out: PathBuf,
    /// The twin's scenario; the built-in default (an MI300X-like 1 ms box logger and a
    /// 200 µs two-phase kernel) when not given.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// The rig description (hardware/rigs/*.toml) the twin is built on, instead of the
    /// one the scenario names: its ADC's filter, its board's rates and its link.
    #[arg(long)]
    rig: Option<PathBuf>,
    /// The kernel to profile.
    #[arg(long, default_value = "gemm")]
    kernel: String,
    /// Executions to profile, each after a random delay (at most 1 000 000: about a day
    /// of the twin's real time).
    #[arg(long, default_value_t = 1000, value_parser = super::count(1, MAX_RUNS as u64))]
    runs: usize,
    /// Run a pilot of this many executions first and let its correction plan the run:
    /// the executions and the bins that hold every phase the rig resolves within
    /// --phase-tolerance at 95 % (in place of --runs and --bin-us); the pilot, its delays
    /// drawn from a seed of its own, goes to pilot/ under --out
    #[arg(long, conflicts_with_all = ["runs", "bin_us"], value_parser = super::count(2, MAX_RUNS as u64))]
    pilot: Option<usize>,
    /// Shortest and longest random delay before each launch, ms (longer than the kernel
    /// plus the logger's window, so that no reading sees two executions).
    #[arg(value_parser = super::millis, long, allow_hyphen_values = true, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [1.5, 3.0])]
    delay_ms: Vec<f64>,
    /// Width of the profiles' bins, µs; 10 µs, or the finest the rig resolves when that
    /// is coarser (its analog chain's 10-90 % rise, or the width that gathers 30 samples a
    /// bin over the runs). The correction widens its bins where they would hold fewer
    /// than 3 of the logger's readings each, and says so.
    #[arg(value_parser = super::bin_us, long)]
    bin_us: Option<f64>,
    /// The rig's sample rate, Hz; when not given, the lowest that puts a sample in every
    /// bin, within what the rig's link carries with every channel.
    #[arg(long)]
    rate: Option<u32>,
    /// The logger's update period if known, ms (identified from its readings otherwise).
    #[arg(value_parser = super::period_ms, long)]
    period_ms: Option<f64>,
    /// The check on each corrected phase's power, relative (0.05: within 5 %).
    #[arg(long, default_value_t = 0.05)]
    phase_tolerance: f64,
    /// The shortest phase the correction's planner plans bins for, µs, in place of the
    /// shortest the rig's reference resolves: it says the bins and runs that would hold
    /// every phase within --phase-tolerance at 95 %.
    #[arg(value_parser = super::bin_us, long)]
    phase_us: Option<f64>,
    /// The check on each corrected step's time, µs.
    #[arg(long, default_value_t = 20.0)]
    step_tolerance_us: f64,
    /// The check on the corrected profile's RMS error, as a fraction of the raw stitched
    /// profile's (a third, for a logger of about the kernel's length; a logger whose window is
    /// much longer than the kernel leaves the corrected tail after the kernel
    /// noise-limited, and 1 asks only that correction not be worse than none).
    #[arg(long, default_value_t = 1.0 / 3.0)]
    rms_ratio: f64,
    /// Seed of the runner's random delays.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the figures as JSON too.
    #[arg(long)]
    json: bool,
}

/// Runs `railtrace demo`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let plan = PlanFor {
        rel_err: args.phase_tolerance,
        phase_s: args.phase_us.map(|p| p * 1e-6),
        ..PlanFor::default()
    };
    let req = Request {
        out: args.out,
        scenario: args.scenario,
        rig: args.rig,
        kernel: args.kernel,
        runs: args.runs,
        pilot: args.pilot,
        delay_s: (args.delay_ms[0] * 1e-3, args.delay_ms[1] * 1e-3),
        bin_s: args.bin_us.map(|b| b * 1e-6),
        rate_hz: args.rate,
        period_ms: args.period_ms,
        tolerances: Tolerances {
            phase: args.phase_tolerance,
            step_s: args.step_tolerance_us * 1e-6,
            rms_ratio: args.rms_ratio,
        },
        plan,
        seed: args.seed,
    };
    // A bar for each profiling run (the pilot's, then the planned one).
    let mut length = req.runs;
    let mut bar = indicatif::ProgressBar::hidden();
    let spinner = indicatif::ProgressBar::new_spinner();
    let demo = railtrace::demo::run(&req, &mut |stage| match stage {
        Stage::Pilot(runs) => {
            length = runs;
            eprintln!("railtrace demo: a pilot of {runs} executions first, to plan the run");
        }
        Stage::Planned(p) => {
            length = p.executions as usize;
            eprintln!(
                "railtrace demo: the pilot plans {} for {}; running them",
                p.asks(),
                p.describe()
            );
        }
        Stage::Setup(s) => {
            eprintln!(
                "railtrace demo: {} -> {}\n  {}",
                s.loaded.scenario.description,
                req.out.display(),
                s.describe()
            );
            bar = indicatif::ProgressBar::new(length as u64);
        }
        Stage::Train(a) => bar.set_position(a.runs as u64),
        Stage::Profiled(run, p) => {
            bar.finish_and_clear();
            profile::summary(run, p);
        }
        Stage::Calibrating(m) => {
            spinner.enable_steady_tick(std::time::Duration::from_millis(120));
            spinner.set_message(m.to_string());
        }
        Stage::Calibrated(c, path) => {
            spinner.finish_and_clear();
            calibrate::print(c, path);
        }
        Stage::Corrected(c, run_plan) => {
            if let Some(why) = c.widened() {
                eprintln!("railtrace correct: {why}");
            }
            if let Some(p) = run_plan {
                eprintln!("railtrace correct: {}", c.plan(p));
            }
        }
        Stage::Judged(outside) => super::correct::print_validity(outside),
        Stage::Correcting | Stage::Reporting => {}
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&demo.figures)?);
    }
    eprintln!("\n{}", demo.table);
    for ch in &demo.checks {
        eprintln!(
            "  [{}] {}: {}",
            if ch.pass { "pass" } else { "FAIL" },
            ch.what,
            ch.measured
        );
    }
    let [profile_s, calibrate_s, correct_s, report_s, all_s] = demo.seconds;
    eprintln!(
        "\nrailtrace demo: profile {profile_s:.1} s, calibration {calibrate_s:.1} s, correction {correct_s:.1} s, report and exports {report_s:.1} s; {all_s:.1} s in all. Open {}",
        demo.report.display()
    );
    let failed = demo.failed();
    anyhow::ensure!(
        failed.is_empty(),
        "the demo's checks failed: {}",
        failed.join("; ")
    );
    Ok(())
}
