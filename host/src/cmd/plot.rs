//! `railtrace plot FILE -o out.svg|png`: power per rail and in total against time.

use std::path::{Path, PathBuf};
use std::time::Instant;

use railtrace::analysis::logger_model::LoggerModel;
use railtrace::analysis::paired;
use railtrace::store::recording::LoggerColumn;
use railtrace::store::{plot, recording};

/// Plots a recording: each rail's power and the total against time (min/max band per
/// pixel column, mean line), gaps shaded, trigger edges marked, the GPU logger's readings
/// as steps.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The recording (.arrow).
    file: PathBuf,
    /// The picture to write: .svg or .png.
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    /// Start of the window, s (time_s); default: the first sample.
    #[arg(value_parser = super::instant_s, long, value_name = "S", allow_negative_numbers = true)]
    from: Option<f64>,
    /// End of the window, s; default: the last sample.
    #[arg(value_parser = super::instant_s, long, value_name = "S", allow_negative_numbers = true)]
    to: Option<f64>,
    /// Picture width, px (640 to 16384).
    #[arg(long, value_name = "W", default_value_t = 1600)]
    width: u32,
    /// Picture height, px (360 to 16384).
    #[arg(long, value_name = "H", default_value_t = 900)]
    height: u32,
    /// A logger model (`railtrace calibrate logger`) of a paired run's logger: its
    /// readings deconvolved with it are drawn over the run, where they allow it.
    #[arg(long, value_name = "MODEL")]
    logger: Option<PathBuf>,
    /// The logger's readings the model is applied to (with --logger).
    #[arg(long, default_value = "power.draw", requires = "logger")]
    column: LoggerColumn,
}

/// The run's logger readings deconvolved with the model at `model`, as an overlay.
fn deconvolved(file: &Path, model: &Path, column: LoggerColumn) -> anyhow::Result<plot::Overlay> {
    let m = LoggerModel::read(model)?;
    let rec = paired::read(file, column)?;
    let d = paired::deconvolve(&rec.run(), &m, 0)
        .map_err(|e| anyhow::anyhow!("{}: not deconvolved: {e}", file.display()))?;
    Ok(plot::Overlay {
        label: format!(
            "GPU logger deconvolved ({}, {:.1} ms updates)",
            model.file_name().unwrap_or_default().to_string_lossy(),
            d.cell_s * 1e3
        ),
        steps: d
            .t_s
            .iter()
            .copied()
            .zip(d.power_w.iter().copied())
            .collect(),
    })
}

/// Runs `railtrace plot`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut opts = plot::Options {
        from: args.from,
        to: args.to,
        width: args.width,
        height: args.height,
        title: String::new(),
        overlay: None,
    };
    // A wrong extension or size fails before a large recording is read.
    plot::check(&args.output, &opts)?;
    let started = Instant::now();
    let title = |m: &recording::Meta| {
        let name = args.file.file_name().unwrap_or_default().to_string_lossy();
        let mut title = format!("{name} — {}", m.source);
        if let Some(d) = &m.device {
            let words: Vec<&str> = ["board", "serial"]
                .iter()
                .filter_map(|k| d.get(k)?.as_str())
                .collect();
            if !words.is_empty() {
                title += &format!(" — {}", words.join(" "));
            }
        }
        title + &format!(" — start {}", recording::iso_utc(m.epoch_utc_ns))
    };
    // A closed recording's overview, its coarse summaries then its fine ones, where they
    // are fine enough for the window: the samples are not read at all.
    let mut from_overview = None;
    if let Some(model) = &args.logger {
        opts.overlay = Some(deconvolved(&args.file, model, args.column)?);
    }
    // An overlay is drawn over the samples, not over the summaries.
    let mut level = match opts.overlay {
        Some(_) => None,
        None => recording::overview(&args.file)?,
    };
    let mut read = 0;
    while let Some(ov) = level {
        opts.title = title(&ov.recording.meta);
        read += ov.bytes_read;
        if let Some(p) = plot::render_overview(&ov, &args.output, &opts)? {
            from_overview = Some((p, read));
            break;
        }
        level = ov.finer()?;
    }
    let (p, how) = match from_overview {
        Some((p, bytes)) => {
            let size = std::fs::metadata(&args.file).map_or(0, |m| m.len());
            let how = format!(
                " (from the recording's summaries, which hold no edges nor logger readings: {:.1} MB read of {:.1} MB; the samples were neither read nor checked for damage, as `railtrace inspect` checks them)",
                bytes as f64 / 1e6,
                size as f64 / 1e6
            );
            (p, how)
        }
        None => {
            // Only the schema is read here; the plot reads the rows a batch at a time.
            let rec = recording::open(&args.file)?;
            opts.title = title(&rec.meta);
            (plot::render(&rec, &args.output, &opts)?, String::new())
        }
    };
    eprintln!(
        "wrote {} ({}×{} px): {} samples, {:.6} s to {:.6} s, {} gaps, {} edges, {} logger readings, in {:.2} s{how}",
        args.output.display(),
        args.width,
        args.height,
        p.samples,
        p.from,
        p.to,
        p.gaps,
        p.edges,
        p.logger,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
