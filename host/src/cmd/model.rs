//! `railtrace model fit` and `railtrace model validate`: power models fitted on profiling
//! runs by the rig, the raw logger or the corrected logger, and held against the rig.

use std::path::{Path, PathBuf};

use anyhow::bail;
use railtrace::analysis::logger_model::LoggerModel;
use railtrace::analysis::model::{
    fit_runs, is_rig_capture, observe_all, plot, score, validation, validation_table, Against, Gpu,
    ModelKind, PowerModel, Run,
};

/// Power models.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Fits a power model on profiling runs (`railtrace profile --dvfs LEVEL`, one kernel at
    /// one level each, the rig's capture beside each), by the rig's power, the GPU
    /// logger's as it stands, or the logger's corrected with its identified model.
    Fit {
        /// `util` (static + Σ c·u·f·V²) or `dvfs` (constant + (clock + Σ a·u)·f·V² +
        /// leakage growing with temperature, and each kernel's time against frequency).
        #[arg(long)]
        kind: ModelKind,
        /// The power the model is fitted on.
        #[arg(long)]
        against: Against,
        /// The profiling runs.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// The model file.
        #[arg(long, short, default_value = "model.toml")]
        output: PathBuf,
        /// The GPU description (kernels' utilisation, DVFS levels' frequency and
        /// voltage); the built-in hardware/scenarios/dvfs.toml when not given.
        #[arg(long)]
        gpu: Option<PathBuf>,
        /// The logger's model (`railtrace calibrate`), for `--against corrected`.
        #[arg(long)]
        logger: Option<PathBuf>,
        /// Width of the stitched profiles' bins, µs.
        #[arg(value_parser = super::bin_us, long, default_value_t = 10.0)]
        bin_us: f64,
        /// Print the observations and the model as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Holds power models against the rig on profiling runs: per run, per kernel and
    /// overall, power, time and energy error, held-out kernels and levels apart, and the
    /// DVFS model's temperature term's share.
    Validate {
        /// Model files (`.toml`, `railtrace model fit`), then the profiling runs.
        #[arg(required = true, value_name = "MODEL.toml... INPUT")]
        files: Vec<PathBuf>,
        /// The GPU description; the built-in hardware/scenarios/dvfs.toml when not given.
        #[arg(long)]
        gpu: Option<PathBuf>,
        /// Width of the stitched profiles' bins, µs.
        #[arg(value_parser = super::bin_us, long, default_value_t = 10.0)]
        bin_us: f64,
        /// A picture: predicted against measured power, time against frequency (PNG or
        /// SVG by extension).
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print everything as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Says of each run as it is observed, after a word on the rig captures among `inputs`.
fn observed(inputs: &[PathBuf]) -> impl FnMut(usize, usize, &Path, &Run, f64) {
    let rigs = inputs.iter().filter(|p| is_rig_capture(p)).count();
    if rigs > 0 {
        eprintln!("railtrace model: {rigs} rig captures among the inputs are read with their runs");
    }
    |i, n, path, run, s| {
        eprintln!(
            "railtrace model: [{}/{n}] {}: {} ({s:.1} s)",
            i + 1,
            path.display(),
            run.describe()
        )
    }
}

/// Runs `railtrace model`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Fit {
            kind,
            against,
            inputs,
            output,
            gpu,
            logger,
            bin_us,
            json,
        } => {
            let gpu = Gpu::read(gpu.as_deref())?;
            let logger = match (against, logger) {
                (Against::Corrected, None) => bail!(
                    "--against corrected needs the logger's model: --logger logger.toml (from `railtrace calibrate`)"
                ),
                (_, Some(p)) => Some((LoggerModel::read(&p)?, p)),
                (_, None) => None,
            };
            let (m, runs) = fit_runs(
                kind,
                against,
                &inputs,
                &gpu,
                logger.as_ref(),
                bin_us * 1e-6,
                observed(&inputs),
            )?;
            m.write(&output)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"runs": runs, "model": m}))?
                );
            }
            eprint!(
                "railtrace model fit: {} on {} runs ({} kernels: {}; levels {}) -> {}\n{}",
                m.label(),
                runs.len(),
                m.kernels.len(),
                m.kernels.join(", "),
                m.levels.join(", "),
                output.display(),
                m.describe()
            );
            Ok(())
        }
        What::Validate {
            files,
            gpu,
            bin_us,
            plot: picture,
            json,
        } => {
            let is_model = |p: &PathBuf| p.extension().is_some_and(|e| e == "toml");
            let (models, inputs): (Vec<PathBuf>, Vec<PathBuf>) =
                files.into_iter().partition(is_model);
            if models.is_empty() {
                bail!("no model given: name at least one model.toml (`railtrace model fit`) before the runs");
            }
            if inputs.is_empty() {
                bail!("no profiling runs given to validate on");
            }
            let models: Vec<PowerModel> = (models.iter())
                .map(|p| PowerModel::read(p))
                .collect::<Result<_, _>>()?;
            let gpu = Gpu::read(gpu.as_deref())?;
            let runs = observe_all(&inputs, &gpu, None, bin_us * 1e-6, observed(&inputs))?;
            let mut scored = Vec::new();
            for m in models {
                let s = score(&m, &runs)?;
                scored.push((m, s));
            }
            let mut report = Vec::new();
            for (m, s) in &scored {
                let j = validation(m, s);
                eprint!("{}", validation_table(m, s, &j));
                report.push(j);
            }
            if let Some(p) = &picture {
                plot(&scored, &runs, p)?;
                eprintln!("railtrace model validate: picture -> {}", p.display());
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"runs": runs, "models": report})
                    )?
                );
            }
            Ok(())
        }
    }
}
