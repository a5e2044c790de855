//! `railtrace correct PROFILE --logger logger.toml`: the stitched logger profile with the
//! logger's identified response undone.

use std::path::PathBuf;

use railtrace::analysis::correct::{correct, figures, write, PlanFor};
use railtrace::analysis::logger_model::LoggerModel;
use railtrace::store::recording::rig_path;

/// Deconvolves a profiling run's stitched GPU-logger profile with the logger's identified
/// response (regularised, power ≥ 0, the idle level before the kernel imposed), writing
/// the corrected profile with its uncertainty band and the energy per execution.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profiling run (`railtrace profile`).
    profile: PathBuf,
    /// The logger's model (`railtrace calibrate logger`).
    #[arg(long)]
    logger: PathBuf,
    /// The rig's capture of the run (for the executions' timeline and as a comparison);
    /// `<profile>.rig.arrow` when not given.
    #[arg(long)]
    rig: Option<PathBuf>,
    /// The corrected profile (an Arrow IPC stream: t_s, logger_w, corrected_w, lo_w, hi_w,
    /// rig_w).
    #[arg(long, short, default_value = "corrected.arrow")]
    output: PathBuf,
    /// Width of the profile's bins, µs; widened (and said so) where bins this narrow would
    /// hold fewer than 3 of the logger's readings each, too few to tell their scatter.
    #[arg(value_parser = super::bin_us, long, default_value_t = 10.0)]
    bin_us: f64,
    /// The shortest phase the planner plans bins for, µs, in place of the shortest the
    /// rig's reference resolves: it says the bins and runs that would hold every phase
    /// within --plan-error at 95 %.
    #[arg(value_parser = super::bin_us, long)]
    phase_us: Option<f64>,
    /// The relative error the planner plans for (0.05: 5 %).
    #[arg(value_parser = super::rel_err, long, default_value_t = 0.05)]
    plan_error: f64,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `railtrace correct`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = LoggerModel::read(&args.logger)?;
    let rig = args.rig.unwrap_or_else(|| rig_path(&args.profile));
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar.set_message(format!(
        "reading {} and its rig's capture, deconvolving",
        args.profile.display()
    ));
    let c = correct(
        &args.profile,
        &rig,
        &model,
        &args.logger,
        args.bin_us * 1e-6,
        railtrace::analysis::correct::recorded_accuracy(&rig),
    );
    bar.finish_and_clear();
    let c = c?;
    if let Some(why) = c.widened() {
        eprintln!("railtrace correct: {why}");
    }
    let plan = PlanFor {
        rel_err: args.plan_error,
        phase_s: args.phase_us.map(|p| p * 1e-6),
        ..PlanFor::default()
    };
    let run_plan = c.run_plan(&model, &plan);
    if let Some(p) = &run_plan {
        eprintln!("railtrace correct: {}", c.plan(p));
    }
    print_validity(&c.outside_range(&model, run_plan.as_ref()));
    if c.reference.is_none() {
        eprintln!(
            "railtrace correct: {} records no rig description stating its accuracy: the band leaves the rig's own calibration out",
            rig.display()
        );
    }
    let figures = figures(&c, &model, &args.logger, &plan);
    let (a, d, idle) = (&c.analysis, &c.d, c.idle_w);
    write(&c, &figures, &args.output)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    }
    let against = if a.has_rig() {
        format!(
            "the rig's {:.3} mJ ({:+.2} %)",
            a.rig_energy_j * 1e3,
            (d.energy_j / a.rig_energy_j - 1.0) * 100.0
        )
    } else {
        "no rig to hold it against".into()
    };
    eprintln!(
        "railtrace correct: {} family, idle {:.1} W; energy per execution {:.3} mJ ({:.3}-{:.3} at {:.0} %), {against}; {} segments, λ {:.3e} ({}) -> {}",
        model.family,
        idle,
        d.energy_j * 1e3,
        d.energy_lo_j * 1e3,
        d.energy_hi_j * 1e3,
        d.confidence * 100.0,
        d.segments,
        d.lambda,
        d.rule,
        args.output.display()
    );
    Ok(())
}

/// The correction's verdict, one line, or a line per condition that puts it outside the
/// range where it can be trusted.
pub fn print_validity(outside: &[String]) {
    if outside.is_empty() {
        eprintln!("railtrace correct: within the range where it can be trusted");
    }
    for why in outside {
        eprintln!("railtrace correct: OUTSIDE the range where it can be trusted: {why}");
    }
}
