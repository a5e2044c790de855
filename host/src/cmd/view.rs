//! `railtrace view`: the rails, triggers and the GPU's logger in a browser, live or from
//! a recording.

use std::net::SocketAddr;
use std::path::PathBuf;

use railtrace::link::view::LiveOptions;

/// Shows a rig live in a web browser (or a recording, over its whole length): power per
/// rail and in total with min/max envelopes, trigger edges, gaps, the device's status, and
/// on the twin its kernels and its GPU logger's readings. The page is served by railtrace
/// itself on this machine; open the address it prints.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["file", "port", "twin"])))]
pub struct Args {
    /// A recording to browse (zoom and pan over its whole length).
    file: Option<PathBuf>,
    /// The rig's serial port, to view live.
    #[arg(long)]
    port: Option<PathBuf>,
    /// View the digital twin's rig live (its GPU's kernels and logger too).
    #[arg(long)]
    twin: bool,
    /// The twin's scenario (hardware/twin/SCENARIOS.md); the built-in default when not given.
    #[arg(long, requires = "twin")]
    scenario: Option<PathBuf>,
    /// The rig description (hardware/rigs/*.toml): with --port, which channel senses which
    /// rail; with --twin, the rig the twin is built on.
    #[arg(long)]
    rig: Option<PathBuf>,
    /// Sample rate in Hz; the device's highest when not given.
    #[arg(long)]
    rate: Option<u32>,
    /// Record while viewing, exactly as `railtrace capture` does. Without it the capture
    /// goes to a temporary file, removed when the view ends.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Replace the --output recording if it exists.
    #[arg(long)]
    force: bool,
    /// Capture at a rate the rig's link cannot carry (with --rig), the device dropping
    /// whole blocks (each a gap row); without it such a rate is refused.
    #[arg(long)]
    allow_drops: bool,
    /// Where the page is served. A loopback address serves this machine only; any other
    /// serves whoever can reach it (with a warning).
    #[arg(long, default_value = "127.0.0.1:8050")]
    listen: SocketAddr,
    /// A real GPU's own power logger to draw over the rails, with --port: `nvml` (NVIDIA;
    /// built with --features nvml), `hwmon` or `gpu-metrics` (AMD).
    #[arg(long)]
    logger: Option<String>,
    /// The GPU of --logger: NVML's index, or the DRM card (/sys/class/drm/cardN) of an AMD
    /// logger (the first amdgpu when not given).
    #[arg(long, requires = "logger")]
    device: Option<u32>,
    /// Stop after this many seconds (Ctrl-C stops it otherwise).
    #[arg(value_parser = super::seconds, long)]
    seconds: Option<f64>,
}

/// Runs `railtrace view`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() {
        eprintln!(
            "railtrace view: warning: serving {} to anyone who can reach it, with no password; the page can see the rig's data",
            args.listen
        );
    }
    if let (Some(l), None) = (&args.logger, &args.port) {
        anyhow::bail!("--logger {l}: a real GPU's logger, drawn beside a rig on --port (the twin's is drawn already; a recording's are in it)");
    }
    if let Some(out) = &args.output {
        railtrace::store::recording::check_output(out, args.force)?;
    }
    let ctrl_c = railtrace::link::view::ctrl_c()?;
    if let Some(file) = &args.file {
        return railtrace::link::view::browse(file, args.listen, args.seconds, ctrl_c, announce);
    }
    let opts = LiveOptions {
        twin: args.twin.then(|| (args.scenario.clone(), args.rig.clone())),
        port: args.port.clone(),
        rig: args.rig.clone(),
        rate_hz: args.rate,
        output: args.output.clone(),
        force: args.force,
        allow_drops: args.allow_drops,
        listen: args.listen,
        seconds: args.seconds,
    };
    let logger = match &args.logger {
        Some(name) => {
            let d = args.device;
            let card = d.map(|d| d as usize).filter(|_| name != "nvml");
            Some(railtrace::gpu::open_logger(name, card, d.unwrap_or(0))?)
        }
        None => None,
    };
    let (summary, temporary) = railtrace::link::view::live(&opts, logger, ctrl_c, announce)?;
    let p = &summary.progress;
    eprintln!(
        "railtrace view: {} samples; frames lost {}, device drops {}, host drops {}, gaps {}{}",
        p.samples,
        p.frames_lost,
        p.device_drops,
        p.host_drops,
        p.gaps,
        match temporary {
            true => String::new(),
            false => format!("; recorded in {}", summary.output.display()),
        }
    );
    Ok(())
}

/// Prints the page's address (the first line of standard output, for scripts).
fn announce(addr: SocketAddr, what: &str) {
    println!("http://{addr}/");
    eprintln!("railtrace view: {what}; open http://{addr}/ in a browser; Ctrl-C stops");
}
