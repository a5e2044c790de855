//! `railtrace twin serve`: a virtual rig on a pseudo-terminal.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// The digital twin.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: TwinCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TwinCommand {
    /// Runs the twin and serves its rig on a pseudo-terminal until interrupted (Ctrl-C).
    ///
    /// Prints the serial port's path on the first line of standard output; open it with
    /// `railtrace`, pyserial or a terminal program as you would a USB-serial rig.
    Serve {
        /// Scenario file (see hardware/twin/SCENARIOS.md); the built-in MI300X-like default
        /// when not given.
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// Rig description file (hardware/rigs/*.toml) instead of the one the scenario
        /// names: the twin's ADC, sample rates and host link are that rig's.
        #[arg(long)]
        rig: Option<PathBuf>,
        /// Stop after this many seconds.
        #[arg(value_parser = super::seconds, long)]
        seconds: Option<f64>,
        /// Write the truth (the GPU's true power, the rails at every conversion, kernel
        /// executions, the logger's reports, the clocks) as Arrow files into this
        /// directory.
        #[arg(long)]
        truth: Option<PathBuf>,
    },
}

/// Runs `railtrace twin ...`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        TwinCommand::Serve {
            scenario,
            rig,
            seconds,
            truth,
        } => serve(scenario, rig, seconds, truth),
    }
}

fn serve(
    scenario: Option<PathBuf>,
    rig: Option<PathBuf>,
    seconds: Option<f64>,
    truth: Option<PathBuf>,
) -> anyhow::Result<()> {
    let loaded = railtrace_twin::scenario::load_with(scenario.as_deref(), rig.as_deref())?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))
        .context("cannot install the Ctrl-C handler")?;
    let twin = railtrace_twin::Twin::start_with(&loaded, truth.as_deref())
        .context("the twin did not start")?;
    println!("{}", twin.path().display());
    let name = scenario
        .as_ref()
        .map_or("the built-in default scenario".to_string(), |p| {
            p.display().to_string()
        });
    eprintln!(
        "railtrace twin: serving {} ({}) on rig {} ({}) on {} -> {}; Ctrl-C stops",
        name,
        loaded.scenario.description,
        loaded.rig.name,
        railtrace_rig::summary(&loaded.rig),
        twin.path().display(),
        std::fs::read_link(twin.path())
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) && twin.is_running() {
        if seconds.is_some_and(|s| started.elapsed().as_secs_f64() >= s) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        // Nobody reads the GPU side here: keep its buffers from growing.
        let _ = twin.take_outputs();
    }
    twin.stop().context("the twin failed")?;
    match truth {
        Some(dir) => eprintln!("railtrace twin: stopped; truth in {}", dir.display()),
        None => eprintln!("railtrace twin: stopped"),
    }
    Ok(())
}
