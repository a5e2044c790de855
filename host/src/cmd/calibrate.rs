//! `railtrace calibrate logger INPUT -o logger.toml`: the GPU logger's response, identified
//! against the rig (or an external meter).

use std::path::{Path, PathBuf};

use railtrace::analysis::calibrate::Family;
use railtrace::analysis::calibrate::{calibrate, Calibrated, Request};
use railtrace::analysis::logger_model::LoggerModel;
use railtrace::store::recording::LoggerColumn;

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
    let c = with_spinner(|progress| calibrate(&input, rig, req, progress))?;
    c.model.write(&output)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&c.model)?);
    }
    print(&c, &output);
    Ok(())
}

/// Runs `stage` with a spinner on stderr that shows what it says it is doing.
pub fn with_spinner<T>(stage: impl FnOnce(&dyn Fn(&str)) -> T) -> T {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let r = stage(&|m: &str| bar.set_message(m.to_string()));
    bar.finish_and_clear();
    r
}

/// The model's intervals as a line: which, at what level, on how many degrees of freedom.
fn intervals(model: &LoggerModel) -> Option<String> {
    let level = model.intervals.values().next()?.level;
    let parts: Vec<String> = [
        ("period", "period_s", 1e3, " ms"),
        ("window", "window_s", 1e3, " ms"),
        ("τ", "tau_s", 1e3, " ms"),
        ("delay", "delay_s", 1e3, " ms"),
        ("gain", "gain", 1.0, ""),
        ("offset", "offset_w", 1.0, " W"),
    ]
    .iter()
    .filter_map(|&(name, key, scale, unit)| {
        let i = model.intervals.get(key)?;
        // Two significant digits of the interval's width.
        let width = (i.hi - i.lo) * scale;
        let digits = if width > 0.0 && width.is_finite() {
            (1.0 - width.log10()).ceil().clamp(0.0, 9.0) as usize
        } else {
            3
        };
        Some(format!(
            "{name} {:.digits$} to {:.digits$}{unit}",
            i.lo * scale,
            i.hi * scale
        ))
    })
    .collect();
    Some(format!(
        "{:.0} % intervals ({}): {}",
        level * 100.0,
        model.se_dof.map_or("normal".into(), |d| format!(
            "Student's t on {d:.0} degrees of freedom, the load steps less one"
        )),
        parts.join(", ")
    ))
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
        if let Some(text) = intervals(model) {
            eprintln!("  {text}");
        }
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
