//! `railtrace calibrate logger INPUT -o logger.toml`: the GPU logger's response, identified
//! against the rig (or an external meter).

use std::path::{Path, PathBuf};

use anyhow::Context;
use railtrace::analysis::{reduced_timeline, Options, Reduced, EXACT_SAMPLES};
use railtrace::logger_model::{LoggerModel, Provenance};
use railtrace::paired;
use railtrace::profile::rig_path;
use railtrace::recording::{self, iso_utc, LoggerColumn};
use railtrace_calibration::logger::{
    identify, period_from_changes, Family, LatticeBuilder, Options as IdentifyOptions,
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
        /// The logger's readings to fit: `power.draw` (the default), `power.draw.instant`
        /// or `power.draw.average`, or the recording's names (`logger_w`,
        /// `logger_instant_w`, `logger_average_w`).
        #[arg(long, default_value = "power.draw")]
        column: LoggerColumn,
        /// Write this family's fit as the model instead of the one the criterion picks:
        /// `box`, `partial`, `exponential` or `response`.
        #[arg(long, value_parser = family)]
        family: Option<Family>,
        /// Print the model as JSON too.
        #[arg(long)]
        json: bool,
    },
}

/// A family by name.
fn family(s: &str) -> Result<Family, String> {
    Family::ALL
        .into_iter()
        .find(|f| f.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
            format!("{s:?} is not a logger family; one of {}", names.join(", "))
        })
}

/// What to identify: the readings, the period if known, the family if forced.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request {
    /// The logger's update period if known, ms.
    pub period_ms: Option<f64>,
    /// The logger's readings to fit.
    pub column: LoggerColumn,
    /// The family to write instead of the criterion's choice.
    pub family: Option<Family>,
}

/// Reference samples and logger readings (of `column`) of a recording with both (an
/// import): the reference kept as its samples, or reduced to a lattice beyond
/// [`EXACT_SAMPLES`].
fn from_recording(
    path: &Path,
    period_ms: Option<f64>,
    column: LoggerColumn,
) -> anyhow::Result<(Reduced, String, String)> {
    let rec = paired::read(path, column)?;
    let spacing = median_spacing(&rec.meter_t);
    let cell = cell_for(&rec.logger_t, &rec.logger_w, period_ms, spacing);
    let mut lattice = LatticeBuilder::new(cell)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        .exact_up_to(EXACT_SAMPLES);
    for (&t, &w) in rec.meter_t.iter().zip(&rec.meter_w) {
        lattice
            .push(t, w)
            .map_err(|e| anyhow::anyhow!("{}: the reference: {e}", path.display()))?;
    }
    let samples = lattice.samples();
    let reference = lattice
        .finish()
        .map_err(|e| anyhow::anyhow!("{}: the reference: {e}", path.display()))?;
    let device = rec.meter.as_deref().unwrap_or("its samples");
    let described = format!("{device} ({})", rec.source);
    let logger = rec.logger.unwrap_or_else(|| "its logger rows".into());
    let reduced = Reduced {
        reference,
        samples,
        logger_t: rec.logger_t,
        logger_w: rec.logger_w,
    };
    Ok((reduced, described, logger))
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
pub fn calibrate(input: &Path, rig: Option<PathBuf>, req: Request) -> anyhow::Result<Calibrated> {
    let Request {
        period_ms,
        column,
        family,
    } = req;
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
            &Options {
                logger_column: column,
                ..Options::default()
            },
            |t, w, rate| cell_for(t, w, period_ms, rate.map(|r| 1.0 / r)),
            |n| bar.set_message(format!("reading the rig's capture: {n} samples")),
        )?;
        (
            reduced,
            format!("the rig's capture {}", rig.display()),
            logger,
        )
    } else {
        from_recording(input, period_ms, column)?
    };
    drop(head);
    anyhow::ensure!(
        !t.logger_t.is_empty(),
        "{}: needs reference samples and logger readings ({} samples here, and no readings of the logger's {column})",
        input.display(),
        t.samples,
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
    let fit = match family {
        Some(f) => ident
            .fit(f)
            .with_context(|| format!("{}: no {f} fit to write", input.display()))?,
        None => ident.best(),
    };
    let mean_w = t.logger_w.iter().sum::<f64>() / t.logger_w.len() as f64;
    let model = LoggerModel::new(
        &ident,
        fit,
        mean_w,
        Provenance {
            input: input.display().to_string(),
            reference,
            logger,
            created_utc: iso_utc(railtrace::gpu::host_now_ns()),
            railtrace: env!("CARGO_PKG_VERSION").into(),
            column: column.column().into(),
            period_given_s: period_ms.map(|p| p * 1e-3),
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
        column,
        family,
        json,
    } = args.what;
    let req = Request {
        period_ms,
        column,
        family,
    };
    let c = calibrate(&input, rig, req)?;
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
    let best = ident.best().family().name();
    let ms = |v: [f64; 2]| format!("{:.3} ± {:.3}", v[0] * 1e3, v[1] * 1e3);
    eprintln!(
        "railtrace calibrate: {} readings of {} against {} reference samples in {:.1} s{}",
        ident.readings_used,
        model.provenance.column,
        c.reference_samples,
        c.seconds,
        model
            .provenance
            .period_given_s
            .map_or(String::new(), |p| format!(
                " (the period given: {:.3} ms, not estimated)",
                p * 1e3
            ))
    );
    eprintln!(
        "  {:<12} {:>11} {:>9}  {:<18} {:<18} {:<18} {:<17} {:<15}",
        "family", "BIC", "resid. W", "period ms", "window/τ ms", "delay ms", "gain", "offset W"
    );
    for f in &model.families {
        let mark = match (f.family == best, f.family == model.family) {
            (true, true) => "  <- chosen",
            (true, false) => "  (the criterion's choice)",
            (false, true) => "  <- written (as asked)",
            _ => "",
        };
        eprintln!(
            "  {:<12} {:>11.1} {:>9.3}  {:<18} {:<18} {:<18} {:<17} {:<15}{}{}",
            f.family,
            f.bic,
            f.residual_rms_w,
            ms(f.period_s),
            f.window_s.or(f.tau_s).map_or("-".into(), ms),
            ms(f.delay_s),
            format!("{:.4} ± {:.4}", f.gain[0], f.gain[1]),
            format!("{:.2} ± {:.2}", f.offset_w[0], f.offset_w[1]),
            mark,
            if f.doubts.is_empty() {
                ""
            } else {
                "  not identified"
            }
        );
    }
    let figures = format!(
        "period {} ms, {}delay {} ms, gain {:.4} ± {:.4}, offset {:.2} ± {:.2} W",
        ms([model.period_s, model.period_se_s]),
        match (model.window_s, model.tau_s) {
            (Some(w), _) => format!(
                "window {} ms, ",
                ms([w, model.window_se_s.unwrap_or(f64::NAN)])
            ),
            (_, Some(tau)) => format!("τ {} ms, ", ms([tau, model.tau_se_s.unwrap_or(f64::NAN)])),
            _ => String::new(),
        },
        ms([model.delay_s, model.delay_se_s]),
        model.gain,
        model.gain_se,
        model.offset_w,
        model.offset_se_w,
    );
    if model.doubts.is_empty() {
        eprintln!(
            "railtrace calibrate: {} logger: {figures} -> {}",
            model.family,
            output.display()
        );
    } else {
        eprintln!(
            "railtrace calibrate: NOT IDENTIFIED: the {} fit ({figures}) does not calibrate this logger:",
            model.family
        );
        for d in &model.doubts {
            eprintln!("  - {d}");
        }
        eprintln!(
            "railtrace calibrate: written with these doubts to {} (its `doubts`); it is not a calibration",
            output.display()
        );
        let sound: Vec<&str> = (model.families.iter())
            .filter(|f| f.doubts.is_empty())
            .map(|f| f.family.as_str())
            .collect();
        if let Some(f) = sound.first() {
            eprintln!(
                "railtrace calibrate: identified without doubts: {} (--family {f} writes that fit)",
                sound.join(", ")
            );
        }
    }
}
