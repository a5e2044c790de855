//! `railtrace view`: the rails, triggers and the GPU's logger in a browser, live or from
//! a recording.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use railtrace::capture::{capture, Config, Counters, RigFile};
use railtrace::view::{Live, Server, Source};

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
    /// Where the page is served. A loopback address serves this machine only; any other
    /// serves whoever can reach it (with a warning).
    #[arg(long, default_value = "127.0.0.1:8050")]
    listen: SocketAddr,
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
    if let Some(out) = &args.output {
        railtrace::recording::check_output(out, args.force)?;
    }
    let ctrl_c = railtrace::view::ctrl_c()?;
    let done = Arc::new(AtomicBool::new(false));
    if let Some(file) = &args.file {
        // A missing or foreign file is said here, not only on the page.
        railtrace::recording::open(file)?;
        let server = Server::bind(args.listen, Source::File(file.clone()))?;
        announce(&server, &format!("browsing {}", file.display()))?;
        stop_after(args.seconds, &done);
        return server.run(done, Some(ctrl_c));
    }

    // Live: the twin's rig or a real one, captured as `railtrace capture` does.
    let twin = if args.twin {
        let loaded =
            railtrace_twin::scenario::load_with(args.scenario.as_deref(), args.rig.as_deref())?;
        Some(railtrace_twin::Twin::start_with(&loaded, None).context("the twin did not start")?)
    } else {
        None
    };
    let port = match (&twin, &args.port) {
        (Some(t), _) => t.path().to_path_buf(),
        (None, Some(p)) => p.clone(),
        (None, None) => unreachable!("clap requires one of file, --port and --twin"),
    };
    let temporary = args.output.is_none();
    let output = args.output.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("railtrace-view-{}.arrow", std::process::id()))
    });
    let live = Arc::new(Live::default());
    let counters = Arc::new(Counters::default());
    let config = Config {
        port: port.clone(),
        output: output.clone(),
        rig: match (&twin, &args.rig) {
            (None, Some(r)) => Some(RigFile::read(r)?),
            _ => None,
        },
        rate_hz: args.rate,
        rate_at_least_hz: None,
        channels: None,
        averaging: 1,
        duration: None,
        reconnect_wait: Duration::from_secs(600),
        replace: args.force || temporary,
        tap: Some(live.clone()),
    };
    let name = match &twin {
        Some(_) => format!("the twin's rig on {}", port.display()),
        None => port.display().to_string(),
    };
    let source = Source::Live {
        live: live.clone(),
        counters: counters.clone(),
        name: name.clone(),
        recording: args.output.clone(),
    };
    let server = Server::bind(args.listen, source)?;
    let capturing = {
        let (done, counters) = (done.clone(), counters.clone());
        std::thread::spawn(move || {
            let r = capture(&config, &done, &counters, |_| {});
            done.store(true, Ordering::Relaxed);
            r
        })
    };
    // The stop flags: Ctrl-C and --seconds end the capture, which ends the server.
    {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if ctrl_c.load(Ordering::Relaxed) {
                    done.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    stop_after(args.seconds, &done);
    let gpu = twin.map(|twin| {
        let (done, live) = (done.clone(), live.clone());
        std::thread::spawn(move || twin_gpu(twin, &live, &done))
    });
    announce(&server, &format!("viewing {name} live"))?;
    let served = server.run(done.clone(), None);
    done.store(true, Ordering::Relaxed);
    let captured = capturing
        .join()
        .map_err(|_| anyhow::anyhow!("the capture panicked"))?;
    if let Some(gpu) = gpu {
        gpu.join()
            .map_err(|_| anyhow::anyhow!("the twin panicked"))?
            .context("the twin failed")?;
    }
    let summary = captured.with_context(|| format!("capture from {name} stopped"));
    if temporary {
        let _ = std::fs::remove_file(&output);
    }
    let summary = summary?;
    served?;
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
fn announce(server: &Server, what: &str) -> anyhow::Result<()> {
    let addr = server.local_addr()?;
    println!("http://{addr}/");
    eprintln!("railtrace view: {what}; open http://{addr}/ in a browser; Ctrl-C stops");
    Ok(())
}

fn stop_after(seconds: Option<f64>, done: &Arc<AtomicBool>) {
    if let Some(s) = seconds {
        let done = done.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(s));
            done.store(true, Ordering::Relaxed);
        });
    }
}

/// The twin driven as a bench's runner drives a GPU, for the page: a train of 10 of its
/// first kernel every 10-30 ms, the trigger line 0 high from just before the launch to
/// just after the train; its kernels' executions and its logger's readings go to the page
/// on the recording's timeline. Until `done`; then stops the twin.
fn twin_gpu(twin: railtrace_twin::Twin, live: &Live, done: &AtomicBool) -> anyhow::Result<()> {
    let kernel = twin
        .kernels()
        .first()
        .cloned()
        .context("the twin's scenario has no kernel")?;
    let mut draw = 0x9e37_79b9_7f4a_7c15u64;
    while !done.load(Ordering::Relaxed) && twin.is_running() {
        twin.trigger(0, true);
        twin.launch(&kernel, 10, None)?;
        std::thread::sleep(Duration::from_millis(3));
        twin.trigger(0, false);
        draw ^= draw << 13;
        draw ^= draw >> 7;
        draw ^= draw << 17;
        std::thread::sleep(Duration::from_millis(7 + draw % 20));
        let out = twin.take_outputs();
        let Some(epoch) = live.epoch_ns() else {
            continue;
        };
        let at = |t: f64| (twin.unix_ns(t) - epoch) as f64 * 1e-9;
        let logger: Vec<(f64, f64)> = (out.logger.iter())
            .map(|r| (at(r.true_time_s), r.power_w))
            .collect();
        let executions: Vec<(f64, f64)> = (out.executions.iter())
            .map(|e| (at(e.start_s), at(e.end_s)))
            .collect();
        live.gpu(&logger, &executions);
    }
    twin.stop()?;
    Ok(())
}
