//! `railtrace calibrate logger INPUT -o logger.toml`: the GPU logger's response, identified
//! against the rig (or an external meter).

use std::path::{Path, PathBuf};

use anyhow::Context;
use railtrace::analysis::{reduced_timeline, Options, Reduced, EXACT_SAMPLES};
use railtrace::logger_model::{LoggerModel, Provenance};
use railtrace::profile::rig_path;
use railtrace::recording::{self, iso_utc, Kind, Rows};
use railtrace_calibration::logger::{
    identify, period_from_changes, LatticeBuilder, Options as IdentifyOptions,
};

/// Identifies things against the rig.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// The GPU's power logger: its response family (box, partial window, exponential, or a
    /// non-parametric response), update period, window, delay, gain and offset, each with
    /// its uncertainty, chosen by BIC; written as a versioned model file.
    Logger {
        /// A profiling run (`railtrace profile`; its rig capture beside it), or a recording
        /// holding reference samples and logger readings on one timeline (`railtrace
        /// import pmd`).
        input: PathBuf,
        /// The rig's capture of a profiling run; `<input>.rig.arrow` when not given.
        #[arg(long)]
        rig: Option<PathBuf>,
        /// The model file to write.
        #[arg(long, short, default_value = "logger.toml")]
        output: PathBuf,
        /// The logger's update period if known, ms (estimated from the readings otherwise).
        #[arg(value_parser = super::period_ms, long)]
        period_ms: Option<f64>,
        /// Print the model as JSON too.
        #[arg(long)]
        json: bool,
    },
}

/// Reference samples and logger readings of a recording with both (an import): the
/// reference kept as its samples, or reduced to a lattice beyond [`EXACT_SAMPLES`].
fn from_recording(
    path: &Path,
    period_ms: Option<f64>,
) -> anyhow::Result<(Reduced, String, String)> {
    let r = recording::read(path)?;
    let (mut rig_t, mut rig_w, mut logger_t, mut logger_w) = (vec![], vec![], vec![], vec![]);
    for rows in r.rows() {
        let (time, total, logger) = (
            rows.f64("time_s"),
            rows.f32("total_w"),
            rows.f64("logger_w"),
        );
        for i in 0..rows.len() {
            match rows.kind(i) {
                Kind::Sample => {
                    if let Some(w) = Rows::get(total, i) {
                        rig_t.push(time.value(i));
                        rig_w.push(f64::from(w));
                    }
                }
                Kind::Logger => {
                    logger_t.push(time.value(i));
                    logger_w.push(logger.value(i));
                }
                _ => {}
            }
        }
    }
    let spacing = median_spacing(&rig_t);
    let mut lattice = LatticeBuilder::new(cell_for(&logger_t, &logger_w, period_ms, spacing))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        .exact_up_to(EXACT_SAMPLES);
    for (&t, &w) in rig_t.iter().zip(&rig_w) {
        lattice
            .push(t, w)
            .map_err(|e| anyhow::anyhow!("{}: the reference: {e}", path.display()))?;
    }
    let samples = lattice.samples();
    let reference = lattice
        .finish()
        .map_err(|e| anyhow::anyhow!("{}: the reference: {e}", path.display()))?;
    let device = r
        .meta
        .device
        .as_ref()
        .and_then(|d| d["board"].as_str().map(str::to_string))
        .unwrap_or_else(|| "its samples".into());
    let logger = r
        .meta
        .settings
        .as_ref()
        .and_then(|s| s["gpu_logger"].as_str().map(str::to_string))
        .unwrap_or_else(|| "its logger rows".into());
    let reduced = Reduced {
        reference,
        samples,
        logger_t,
        logger_w,
    };
    Ok((reduced, format!("{device} ({})", r.meta.source), logger))
}

/// The median interval of sorted times, s (None for fewer than 2).
fn median_spacing(t: &[f64]) -> Option<f64> {
    let mut d: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
    d.sort_by(f64::total_cmp);
    d.get(d.len() / 2).copied()
}

/// The reference's lattice cell: a 64th of the logger's update period (given, or
/// estimated from the changes of its first readings), the resolution of the finest shape
/// the identification searches (a window or time constant of `T/64`, the free response's
/// bins of `1.5·T/96` for a box), or the reference's own sample spacing where that is
/// coarser.
pub fn cell_for(t: &[f64], w: &[f64], period_ms: Option<f64>, spacing_s: Option<f64>) -> f64 {
    const READINGS: usize = 5000;
    let n = t.len().min(READINGS);
    let period = period_ms
        .map(|p| p * 1e-3)
        .or_else(|| period_from_changes(&t[..n], &w[..n]).map(|p| p.0));
    let model = period.map_or(10e-6, |p| p / 64.0);
    spacing_s.map_or(model, |s| model.max(s))
}

/// A logger identified, and its model.
pub struct Calibrated {
    /// Every family's fit.
    pub ident: railtrace_calibration::logger::Identification,
    /// The chosen family's model.
    pub model: LoggerModel,
    /// Reference samples used.
    pub reference_samples: usize,
    /// Seconds the identification took.
    pub seconds: f64,
}

/// Identifies the logger of `input` (a profiling run with its rig capture, or a recording
/// holding both) against the reference.
pub fn calibrate(
    input: &Path,
    rig: Option<PathBuf>,
    period_ms: Option<f64>,
) -> anyhow::Result<Calibrated> {
    let head = recording::open_columns(input, &[])?;
    let is_profile = head
        .meta
        .settings
        .as_ref()
        .is_some_and(|s| s.get("gpu_clock_hz").is_some());
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let (t, reference, logger) = if is_profile {
        let rig = rig.unwrap_or_else(|| rig_path(input));
        let logger = head
            .meta
            .settings
            .as_ref()
            .and_then(|s| s["logger"].as_str().map(str::to_string))
            .unwrap_or_default();
        let reduced = reduced_timeline(
            input,
            &rig,
            &Options::default(),
            |t, w, rate| cell_for(t, w, period_ms, rate.map(|r| 1.0 / r)),
            |n| bar.set_message(format!("reading the rig's capture: {n} samples")),
        )?;
        (
            reduced,
            format!("the rig's capture {}", rig.display()),
            logger,
        )
    } else {
        from_recording(input, period_ms)?
    };
    drop(head);
    anyhow::ensure!(
        !t.logger_t.is_empty(),
        "{}: needs reference samples and logger readings ({} and {} here)",
        input.display(),
        t.samples,
        t.logger_t.len()
    );
    let opts = IdentifyOptions {
        period_s: period_ms.map(|p| p * 1e-3),
        ..IdentifyOptions::default()
    };
    bar.set_message(format!(
        "identifying the logger from {} readings against {} reference samples",
        t.logger_t.len(),
        t.samples
    ));
    let started = std::time::Instant::now();
    let ident = identify(&t.reference, &t.logger_t, &t.logger_w, &opts)
        .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))
        .context("the logger could not be identified")?;
    bar.finish_and_clear();
    let model = LoggerModel::new(
        &ident,
        ident.best(),
        Provenance {
            input: input.display().to_string(),
            reference,
            logger,
            created_utc: iso_utc(railtrace::gpu::host_now_ns()),
            railtrace: env!("CARGO_PKG_VERSION").into(),
        },
    );
    Ok(Calibrated {
        ident,
        model,
        reference_samples: t.samples as usize,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs `railtrace calibrate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let What::Logger {
        input,
        rig,
        output,
        period_ms,
        json,
    } = args.what;
    let c = calibrate(&input, rig, period_ms)?;
    c.model.write(&output)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&c.model)?);
    }
    print(&c, &output);
    Ok(())
}

/// The identification's summary, on stderr.
pub fn print(c: &Calibrated, output: &Path) {
    let (ident, model) = (&c.ident, &c.model);
    let best = ident.best();
    let ms = |s: f64| s * 1e3;
    eprintln!(
        "railtrace calibrate: {} readings against {} reference samples in {:.1} s",
        ident.readings_used, c.reference_samples, c.seconds
    );
    for f in &ident.fits {
        eprintln!(
            "  {:<12} BIC {:>10.1}  residual {:.3} W{}",
            f.family().name(),
            f.bic,
            f.rms_w,
            if std::ptr::eq(f, best) {
                "  <- chosen"
            } else {
                ""
            }
        );
    }
    eprintln!(
        "railtrace calibrate: {} logger: period {:.3} ± {:.3} ms, {}delay {:.3} ± {:.3} ms, gain {:.4} ± {:.4}, offset {:.2} ± {:.2} W -> {}",
        model.family,
        ms(model.period_s),
        ms(model.period_se_s),
        match (model.window_s, model.tau_s) {
            (Some(w), _) => format!("window {:.3} ± {:.3} ms, ", ms(w), ms(model.window_se_s.unwrap_or(f64::NAN))),
            (_, Some(tau)) => format!("τ {:.3} ± {:.3} ms, ", ms(tau), ms(model.tau_se_s.unwrap_or(f64::NAN))),
            _ => String::new(),
        },
        ms(model.delay_s),
        ms(model.delay_se_s),
        model.gain,
        model.gain_se,
        model.offset_w,
        model.offset_se_w,
        output.display()
    );
}
