//! `railtrace capture`: a rig's stream into a recording.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use railtrace::link::capture::{capture, Config, Counters, Progress, RigFile};

/// Records a rig's stream into an Arrow IPC stream file until Ctrl-C or --duration.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The rig's serial port (e.g. /dev/ttyACM0, or the path `railtrace twin serve`
    /// prints).
    #[arg(long)]
    port: PathBuf,
    /// The rig description (hardware/rigs/*.toml): which channel senses which rail. Without
    /// it, rails come from the device's channel names (`<rail>_I`, `<rail>_V`).
    #[arg(long)]
    rig: Option<PathBuf>,
    /// Sample rate in Hz; the device's highest when not given.
    #[arg(long)]
    rate: Option<u32>,
    /// Channels to capture, e.g. `0,1,4,5`; all when not given.
    #[arg(long, value_delimiter = ',')]
    channels: Option<Vec<u8>>,
    /// Conversions averaged into each sample.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    averaging: u16,
    /// Stop after this many seconds.
    #[arg(value_parser = super::seconds, long)]
    duration: Option<f64>,
    /// When the device goes away, wait this many seconds for it before giving up.
    #[arg(value_parser = super::seconds, long, default_value_t = 600.0)]
    reconnect_wait: f64,
    /// The recording to write; an existing one is refused unless --force.
    #[arg(long, short, default_value = "run.arrow")]
    output: PathBuf,
    /// Replace the output if it exists.
    #[arg(long)]
    force: bool,
    /// Capture at a rate the rig's link cannot carry (with --rig), the device dropping
    /// whole blocks (each a gap row); without it such a rate is refused.
    #[arg(long)]
    allow_drops: bool,
    /// No progress line; print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn line(p: &Progress) -> String {
    let rate = if p.elapsed_s > 0.0 {
        p.samples as f64 / p.elapsed_s
    } else {
        0.0
    };
    format!(
        "{}{:>9.0} samples/s  {:>7.1} s  {} samples  frames lost {}  bytes rejected {}  device drops {}  gaps {}  {:.1} MB",
        if p.connected { "" } else { "[waiting for the device] " },
        rate,
        p.elapsed_s,
        p.samples,
        p.frames_lost,
        p.bytes_rejected,
        p.device_drops,
        p.gaps,
        p.bytes_written as f64 / 1e6
    )
}

/// Runs `railtrace capture`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rig = args.rig.as_deref().map(RigFile::read).transpose()?;
    if let Some(dir) = args.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        anyhow::ensure!(
            dir.is_dir(),
            "{}: the output's folder does not exist",
            args.output.display()
        );
    }
    let config = Config {
        port: args.port,
        output: args.output,
        rig,
        rate_hz: args.rate,
        rate_at_least_hz: None,
        channels: args.channels,
        averaging: args.averaging,
        duration: args.duration.map(Duration::from_secs_f64),
        reconnect_wait: Duration::from_secs_f64(args.reconnect_wait),
        replace: args.force,
        allow_drops: args.allow_drops,
        tap: None,
    };
    let stop = railtrace::link::stop::install().map_err(anyhow::Error::msg)?;
    let counters = Arc::new(Counters::default());
    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner()
    };
    let result = capture(&config, stop, &counters, |p| bar.set_message(line(p)));
    bar.finish_and_clear();
    let summary = result.with_context(|| {
        if counters.bytes_written.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            format!(
                "capture stopped; {} keeps every record batch written before this (railtrace inspect says up to when)",
                config.output.display()
            )
        } else {
            "capture failed".to_string()
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        let p = &summary.progress;
        eprintln!("{}", line(p));
        eprintln!(
            "railtrace capture: {} rows ({} samples) in {}; frames lost {}, device drops {}, host drops {}, gaps {}, reconnects {}",
            summary.rows,
            p.samples,
            summary.output.display(),
            p.frames_lost,
            p.device_drops,
            p.host_drops,
            p.gaps,
            p.reconnects
        );
        if let Some(why) = &summary.drops_cause {
            eprintln!("railtrace capture: {why}");
        }
    }
    anyhow::ensure!(
        !summary.progress.ended_away,
        "the capture ended while the device was away or silent: {} keeps everything before, and its last gap row marks the outage",
        summary.output.display()
    );
    Ok(())
}
