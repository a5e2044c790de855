//! `railtrace compare RUN.arrow`: a GPU's logger against the reference meter of a paired
//! run, by the published measures, and the energy error raw and through a logger model,
//! with the model's window deconvolved where the readings allow.

use std::path::PathBuf;

use railtrace::analysis::logger_model::LoggerModel;
use railtrace::analysis::paired::{self, Deconvolution, Measures};
use railtrace::store::recording::LoggerColumn;
use serde::Serialize;

/// Compares the GPU's logger with the reference meter over a paired run.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A recording holding the meter's samples, the logger's readings and the load's
    /// edges on one timeline (`railtrace import pmd`).
    input: PathBuf,
    /// The logger's readings to compare: `power.draw` (the default), `power.draw.instant`
    /// or `power.draw.average`, or the recording's names.
    #[arg(long, default_value = "power.draw")]
    column: LoggerColumn,
    /// A logger model (`railtrace calibrate logger`) whose gain and offset, inverted, map
    /// the readings back to power: the energy error is given raw and corrected. Where the
    /// model's window or time constant spreads a step over several updates, the readings
    /// are deconvolved with it too, and measured again. A model of another run of the
    /// same GPU cross-validates it.
    #[arg(long)]
    logger: Option<PathBuf>,
    /// Write the deconvolved power as CSV (t_s: each update's start, power_w, the band's
    /// lo_w and hi_w, and the meter's mean over the update, meter_w).
    #[arg(long, value_name = "CSV", requires = "logger")]
    deconvolved: Option<PathBuf>,
    /// Bootstrap replicates for the deconvolved power's band (0: none, at most 10 000);
    /// each costs about one solve, a fraction of a second for a thousand updates.
    #[arg(long, default_value_t = 100, value_parser = super::count(0, 10_000))]
    bootstrap: usize,
    /// Print the measures as JSON too.
    #[arg(long)]
    json: bool,
}

/// Runs `railtrace compare`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rec = paired::read(&args.input, args.column)?;
    let name = args.input.display();
    anyhow::ensure!(
        rec.meter_t.len() >= 2,
        "{name}: needs the meter's samples ({} here)",
        rec.meter_t.len()
    );
    anyhow::ensure!(
        rec.logger_t.len() >= 2,
        "{name}: no readings of the logger's {} ({} here)",
        args.column,
        rec.logger_t.len()
    );
    let model = args
        .logger
        .as_ref()
        .map(|p| LoggerModel::read(p))
        .transpose()?;
    if let (Some(m), Some(path)) = (&model, &args.logger) {
        if m.provenance.column != args.column.column() {
            eprintln!(
                "railtrace compare: warning: {} was fitted to {}, applied here to {}",
                path.display(),
                m.provenance.column,
                args.column.column()
            );
        }
        if !m.doubts.is_empty() {
            eprintln!(
                "railtrace compare: warning: {} is not a calibration ({})",
                path.display(),
                m.doubts.join("; ")
            );
        }
    }
    let correct = model.as_ref().map(|m| move |w: f64| m.invert(w));
    let m = paired::measure(
        &rec.run(),
        correct.as_ref().map(|f| f as &dyn Fn(f64) -> f64),
    )
    .map_err(|e| anyhow::anyhow!("{name}: the meter's samples: {e}"))?;
    print(&m, &args, &rec);
    let dec = model.as_ref().map(|m| {
        if args.bootstrap > 0 {
            eprintln!(
                "  deconvolving ...   (its band from {} bootstrap replicates; --bootstrap 0 for none)",
                args.bootstrap
            );
        }
        paired::deconvolve(&rec.run(), m, args.bootstrap)
    });
    match &dec {
        Some(Ok(d)) => {
            print_deconvolved(d);
            if let Some(path) = &args.deconvolved {
                d.write_csv(&rec, path)?;
                eprintln!("  written            {}", path.display());
            }
        }
        Some(Err(e)) => eprintln!("  deconvolved        not: {e}"),
        None => {}
    }
    if args.json {
        let (deconvolved, not_deconvolved) = match &dec {
            Some(Ok(d)) => (Some(d), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, None),
        };
        let report = Report {
            measures: &m,
            deconvolved,
            not_deconvolved,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    // Readings with nothing to deconvolve are a result, not a failure: said, exit 0.
    if let (Some(Err(e)), Some(path)) = (&dec, &args.deconvolved) {
        eprintln!(
            "  not written        {}: nothing deconvolved ({e})",
            path.display()
        );
    }
    Ok(())
}

/// What `--json` prints: the measures, and the deconvolved readings' where they were.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    measures: &'a Measures,
    #[serde(skip_serializing_if = "Option::is_none")]
    deconvolved: Option<&'a Deconvolution>,
    #[serde(skip_serializing_if = "Option::is_none")]
    not_deconvolved: Option<String>,
}

fn print_deconvolved(d: &Deconvolution) {
    let ms = |s: f64| format!("{:.1} ms", s * 1e3);
    let m = &d.measures;
    eprintln!(
        "  deconvolved        {} updates of {} (the first after a step shows {:.0} % of it), noise {:.2} W",
        d.updates,
        ms(d.cell_s),
        d.first_share * 100.0,
        d.noise_w
    );
    if let (Some(rise), Some(delay)) = (m.rise_s, m.delay_s) {
        let each = |f: fn(&paired::Step) -> f64| {
            (m.steps.iter())
                .map(|s| ms(f(s)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        eprintln!(
            "                     rise time {} median (each: {}), delay {} median (each: {}), to within an update",
            ms(rise),
            each(|s| s.logger_rise_s),
            ms(delay),
            each(|s| s.delay_s)
        );
    }
    if let Some(l) = &m.steady {
        eprintln!(
            "                     steady state {:.4} × meter {:+.2} W, R² {:.5}",
            l.gradient, l.intercept_w, l.r2
        );
    }
    if let Some(e) = &m.energy {
        eprintln!(
            "                     energy {:.1} J, error {:+.2} %",
            e.logger_j,
            e.error * 100.0
        );
    }
}

/// The deconvolved power beside the meter's mean over each update, as CSV.
fn print(m: &Measures, args: &Args, rec: &paired::Recorded) {
    let ms = |s: f64| format!("{:.2} ms", s * 1e3);
    let span = rec.meter_t[rec.meter_t.len() - 1] - rec.meter_t[0];
    eprintln!(
        "railtrace compare: {}: {} against the logger's {}: {} samples, {} readings, {} edges over {span:.1} s",
        args.input.display(),
        rec.meter.as_deref().unwrap_or("the reference"),
        args.column,
        rec.meter_t.len(),
        rec.logger_t.len(),
        rec.edges.len()
    );
    match m.period_s {
        Some([p, se]) => eprintln!("  update period      {:.3} ± {:.3} ms", p * 1e3, se * 1e3),
        None => eprintln!("  update period      not found (the readings change too seldom)"),
    }
    let mut left = Vec::new();
    if m.steps_unsettled > 0 {
        left.push(format!(
            "{} too close to a neighbour for the logger to settle",
            m.steps_unsettled
        ));
    }
    if m.steps_flat > 0 {
        left.push(format!(
            "{} where the power changes by under a tenth",
            m.steps_flat
        ));
    }
    eprintln!(
        "  steps              {} measured{}",
        m.steps.len(),
        if left.is_empty() {
            String::new()
        } else {
            format!("; edges left out: {}", left.join(", "))
        }
    );
    let per_step = |f: fn(&paired::Step) -> f64| {
        m.steps
            .iter()
            .map(|s| ms(f(s)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let (Some(rise), Some(delay)) = (m.rise_s, m.delay_s) {
        eprintln!(
            "  rise time 10-90 %  {} median (each: {}; the meter's: {}); 0 where one update holds the whole step",
            ms(rise),
            per_step(|s| s.logger_rise_s),
            per_step(|s| s.meter_rise_s)
        );
        eprintln!(
            "  delay              {} median, positive: the logger lags the meter (each: {})",
            ms(delay),
            per_step(|s| s.delay_s)
        );
    }
    match &m.steady {
        Some(l) => eprintln!(
            "  steady state       reading = {:.4} × meter {:+.2} W, R² {:.5} ({} readings {:.1} s or more after an edge)",
            l.gradient, l.intercept_w, l.r2, l.points, m.settle_s
        ),
        None => eprintln!(
            "  steady state       no line: {} readings settled {:.1} s after an edge, at one power level",
            m.steady_readings, m.settle_s
        ),
    }
    if let Some(e) = &m.energy {
        eprintln!(
            "  energy             meter {:.1} J, logger {:.1} J over {:.1} s: error {:+.2} %",
            e.meter_j,
            e.logger_j,
            e.to_s - e.from_s,
            e.error * 100.0
        );
        if let (Some(j), Some(err), Some(p)) = (e.corrected_j, e.corrected_error, &args.logger) {
            eprintln!(
                "                     corrected by {}: {j:.1} J, error {:+.2} %",
                p.display(),
                err * 100.0
            );
        }
    }
}
