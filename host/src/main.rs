//! The `railtrace` command.

use clap::{Parser, Subcommand};

mod cmd;

/// railtrace: an external power meter for GPU power rails, and its digital twin.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serial ports, their USB ids, and which are railtrace rigs.
    Devices(cmd::devices::Args),
    /// What a rig is: its DeviceInfo.
    Info(cmd::info::Args),
    /// Records a rig's stream into a recording (Arrow IPC stream).
    Capture(cmd::capture::Args),
    /// What a recording holds.
    Inspect(cmd::inspect::Args),
    /// A recording as Parquet, CSV or a Perfetto (Chrome trace-event JSON) trace.
    Export(cmd::export::Args),
    /// Power per rail and in total against time, as SVG or PNG.
    Plot(cmd::plot::Args),
    /// A rig live in a web browser (or a recording over its whole length).
    View(cmd::view::Args),
    /// Another instrument's traces as a recording.
    Import(cmd::import::Args),
    /// A profiling run: a kernel many times, the GPU's logger and the rig side by side.
    Profile(cmd::profile::Args),
    /// The analysis of a profiling run: clocks aligned, executions binned, profiles stitched.
    Report(cmd::report::Args),
    /// Identifies the GPU's power logger against the rig.
    Calibrate(cmd::calibrate::Args),
    /// Undoes the GPU logger's response in a profiling run's stitched profile.
    Correct(cmd::correct::Args),
    /// A GPU's logger against the reference meter of a paired run: update period, rise
    /// time, delay, steady-state error and energy error, raw, corrected and deconvolved.
    Compare(cmd::compare::Args),
    /// Every paired run under some folders: each logger column calibrated and compared
    /// with the meter, step-run models cross-validated; one table.
    Survey(cmd::survey::Args),
    /// The whole job on the twin: profile, calibrate the logger from the rig, correct, and
    /// score it all against the twin's truth (a table, an HTML report, the exports).
    Demo(cmd::demo::Args),
    /// DVFS measurements: the switching latency from the host's request to the rig.
    Dvfs(cmd::dvfs::Args),
    /// Power models fitted on profiling runs and held against the rig.
    Model(cmd::model::Args),
    /// The digital twin of the bench.
    Twin(cmd::twin::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => cmd::devices::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Capture(args) => cmd::capture::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Plot(args) => cmd::plot::run(args),
        Command::View(args) => cmd::view::run(args),
        Command::Import(args) => cmd::import::run(args),
        Command::Profile(args) => cmd::profile::run(args),
        Command::Report(args) => cmd::report::run(args),
        Command::Calibrate(args) => cmd::calibrate::run(args),
        Command::Correct(args) => cmd::correct::run(args),
        Command::Compare(args) => cmd::compare::run(args),
        Command::Survey(args) => cmd::survey::run(args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::Dvfs(args) => cmd::dvfs::run(args),
        Command::Model(args) => cmd::model::run(args),
        Command::Twin(args) => cmd::twin::run(args),
    };
    if let Err(e) = result {
        eprintln!("railtrace: {e:#}");
        std::process::exit(1);
    }
}
