//! `railtrace dvfs latency`: how long a DVFS switch takes, from the host's request to the
//! power step on the rig.

use std::path::PathBuf;

use railtrace::gpu::dvfs::{latencies, on_twin, Latencies, Options, Plan};
use railtrace::store::recording::rig_path;

/// DVFS measurements.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Asks the GPU for DVFS levels in turn, the rig capturing, and measures each switch's
    /// latency: from the host's request to the power step on the rig (half-way between
    /// the two levels); prints the distribution.
    Latency {
        /// Analyse this run (`railtrace dvfs latency -o FILE` made it) instead of making
        /// one.
        #[arg(long)]
        input: Option<PathBuf>,
        /// The GPU: `twin` (the digital twin's; no hardware needed).
        #[arg(long, default_value = "twin")]
        gpu: String,
        /// The twin's scenario; the built-in `hardware/scenarios/dvfs.toml` (three levels,
        /// a power model, a 1 ms switch) when not given.
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// The levels to ask for in turn, comma-separated; every level of the GPU when
        /// not given.
        #[arg(long, value_delimiter = ',')]
        levels: Vec<String>,
        /// Requests to make.
        #[arg(long, default_value_t = 100)]
        switches: usize,
        /// Shortest and longest random wait before each request, ms (longer than a
        /// switch takes).
        #[arg(value_parser = super::millis, long, allow_hyphen_values = true, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [30.0, 50.0])]
        wait_ms: Vec<f64>,
        /// Look for each step at most this long after its request, ms.
        #[arg(value_parser = super::millis, long, default_value_t = 25.0)]
        window_ms: f64,
        /// The rig's sample rate, Hz; the device's highest when not given.
        #[arg(long)]
        rate: Option<u32>,
        /// The run's recording; the rig's capture goes beside it as `<name>.rig.arrow`.
        #[arg(long, short, default_value = "dvfs.arrow")]
        output: PathBuf,
        /// Replace the recordings if they exist.
        #[arg(long)]
        force: bool,
        /// A picture of the distribution and of the steps (PNG or SVG by extension).
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Seed of the waits.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print every switch and the summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `railtrace dvfs`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let What::Latency {
        input,
        gpu,
        scenario,
        levels,
        switches,
        wait_ms,
        window_ms,
        rate,
        output,
        force,
        plot,
        seed,
        json,
    } = args.what;
    let o = Options {
        window_s: window_ms * 1e-3,
        ..Options::default()
    };
    anyhow::ensure!(o.window_s > 0.0, "--window-ms {window_ms}: must be > 0");
    if input.is_none() {
        for out in [output.clone(), rig_path(&output)] {
            railtrace::store::recording::check_output(&out, force)?;
        }
        railtrace::link::stop::install().map_err(anyhow::Error::msg)?;
    }
    let run = match input {
        Some(p) => p,
        None => {
            anyhow::ensure!(
                gpu == "twin",
                "--gpu {gpu}: only `twin` can be switched here so far"
            );
            let (lo, hi) = (wait_ms[0], wait_ms[1]);
            anyhow::ensure!(
                lo >= 0.0 && hi >= lo,
                "--wait-ms {lo} {hi}: need 0 <= MIN <= MAX"
            );
            let plan = Plan {
                levels,
                switches,
                wait_s: (lo * 1e-3, hi * 1e-3),
                trigger_line: 0,
                seed,
            };
            let bar = indicatif::ProgressBar::new(switches as u64);
            let result = on_twin(scenario.as_deref(), plan, &output, rate, |i| {
                bar.set_position(i as u64)
            });
            bar.finish_and_clear();
            let (n, rig) = result?;
            let rig_out = rig_path(&output);
            eprintln!(
                "railtrace dvfs: {n} requests in {}; rig: {} samples, {} frames lost, {} gaps in {}",
                output.display(),
                rig.progress.samples,
                rig.progress.frames_lost,
                rig.progress.gaps,
                rig_out.display()
            );
            anyhow::ensure!(
                n == switches,
                "interrupted after {n} of {switches} requests; {} and {} are closed and keep them",
                output.display(),
                rig_out.display()
            );
            output
        }
    };
    let l = latencies(&run, &rig_path(&run), &o)?;
    if let Some(p) = &plot {
        railtrace::gpu::dvfs::plot(&l, &run, p)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&l)?);
    }
    print(&l);
    Ok(())
}

fn print(l: &Latencies) {
    let ms = |s: f64| s * 1e3;
    eprintln!(
        "railtrace dvfs: {} of {} switches seen; latency median {:.3} ms, 5-95 % {:.3}-{:.3} ms, mean {:.3} ± {:.3} ms (SD); device link {:.2} µs RMS",
        l.found,
        l.switches.len(),
        ms(l.median_s),
        ms(l.p05_s),
        ms(l.p95_s),
        ms(l.mean_s),
        ms(l.sd_s),
        l.device.rms_s * 1e6
    );
    let mut levels: Vec<&str> = l.switches.iter().map(|s| s.level.as_str()).collect();
    levels.sort_unstable();
    levels.dedup();
    for level in levels {
        let v: Vec<f64> = l
            .switches
            .iter()
            .filter(|s| s.level == level)
            .filter_map(|s| s.latency_s)
            .collect();
        if let Some(step) = l
            .switches
            .iter()
            .find(|s| s.level == level && s.before_w.is_some())
        {
            eprintln!(
                "  to {level:<8} {} switches, mean {:.3} ms (e.g. {:.1} W -> {:.1} W)",
                v.len(),
                ms(v.iter().sum::<f64>() / v.len().max(1) as f64),
                step.before_w.unwrap_or(f64::NAN),
                step.after_w.unwrap_or(f64::NAN)
            );
        }
    }
}
