//! `railtrace correct PROFILE --logger logger.toml`: the stitched logger profile with the
//! logger's identified response undone.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{ArrayRef, Float64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use railtrace::analysis::{analyse, Options, Point};
use railtrace::logger_model::LoggerModel;
use railtrace::profile::rig_path;
use railtrace_calibration::deconvolve::{
    deconvolve, kernel, Input, LoggerKernel, Options as DeconvolveOptions, Profile, Response,
};
use railtrace_calibration::stitch::ProfileBin;

/// Deconvolves a profiling run's stitched GPU-logger profile with the logger's identified
/// response (regularised, power ≥ 0, the idle level before the kernel imposed), writing
/// the corrected profile with its uncertainty band and the energy per execution.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profiling run (`railtrace profile`).
    profile: PathBuf,
    /// The logger's model (`railtrace calibrate logger`).
    #[arg(long)]
    logger: PathBuf,
    /// The rig's capture of the run (for the executions' timeline and as a comparison);
    /// `<profile>.rig.arrow` when not given.
    #[arg(long)]
    rig: Option<PathBuf>,
    /// The corrected profile (an Arrow IPC stream: t_s, logger_w, corrected_w, lo_w, hi_w,
    /// rig_w).
    #[arg(long, short, default_value = "corrected.arrow")]
    output: PathBuf,
    /// Width of the profile's bins, µs.
    #[arg(long, default_value_t = 10.0)]
    bin_us: f64,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
}

fn bins(points: &[Point]) -> Vec<ProfileBin> {
    points
        .iter()
        .map(|p| ProfileBin {
            lo: p.lo_s,
            hi: p.hi_s,
            n: p.n,
            mean_w: p.mean_w,
            std_w: p.std_w,
            ci_half_w: p.ci_half_w,
        })
        .collect()
}

/// Runs `railtrace correct`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = LoggerModel::read(&args.logger)?;
    let rig = args.rig.unwrap_or_else(|| rig_path(&args.profile));
    let dt = args.bin_us * 1e-6;
    let options = Options {
        bin_s: dt,
        // Readings hold the kernel for up to a window after it: stitch that far and more.
        horizon_s: (model
            .window_s
            .or(model.tau_s.map(|t| 5.0 * t))
            .unwrap_or(model.period_s)
            + model.delay_s.abs())
            * 2.5,
        ..Options::default()
    };
    let a = analyse(&args.profile, &rig, &options)?;
    let kept: Vec<f64> = a
        .executions
        .iter()
        .filter(|e| e.kept)
        .map(|e| e.duration_s)
        .collect();
    anyhow::ensure!(
        !kept.is_empty(),
        "{}: no executions kept",
        args.profile.display()
    );
    let duration = kept.iter().sum::<f64>() / kept.len() as f64;
    let steps = model.response_per_s.clone().unwrap_or_default();
    let response = match model.family.as_str() {
        "box" | "partial" => Response::Box {
            width_s: model.window_s.unwrap_or(model.period_s),
        },
        "exponential" => {
            let tau = model.tau_s.unwrap_or(model.period_s);
            Response::Exponential {
                tau_s: tau,
                len: (10.0 * tau / dt) as usize + 2 + (model.delay_s.max(0.0) / dt) as usize,
            }
        }
        "response" => Response::Piecewise {
            step_s: model.response_spacing_s.unwrap_or(dt),
            weights: &steps,
        },
        other => anyhow::bail!("{}: unknown family {other:?}", args.logger.display()),
    };
    let (fold, rest) = if model.delay_s >= 0.0 {
        (model.delay_s, 0.0)
    } else {
        (0.0, model.delay_s)
    };
    let h = kernel(&response, dt, fold)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.logger.display()))?;
    // The idle level: the logger's readings long after the kernel (its reach over), made
    // reference watts through the model's gain and offset.
    let reach = duration + h.len() as f64 * dt + rest.abs();
    let late: Vec<f64> = a
        .logger
        .iter()
        .filter(|p| p.lo_s > reach && p.n > 0)
        .map(|p| (p.mean_w - model.offset_w) / model.gain)
        .collect();
    anyhow::ensure!(
        !late.is_empty(),
        "{}: no logger readings after the kernel's reach ({:.3} ms) to tell the idle level",
        args.profile.display(),
        reach * 1e3
    );
    let idle = late.iter().sum::<f64>() / late.len() as f64;
    let profile = Profile::from_bins(&bins(&a.logger))
        .map_err(|e| anyhow::anyhow!("the stitched profile: {e}"))?;
    let d = deconvolve(
        &Input {
            profile,
            logger: LoggerKernel {
                kernel: h,
                delay_s: rest,
                gain: model.gain,
                offset_w: model.offset_w,
            },
            idle_w: idle,
            duration_s: duration,
        },
        &DeconvolveOptions::default(),
    )
    .map_err(|e| anyhow::anyhow!("the deconvolution: {e}"))?;
    // The output: one row per cell of the corrected profile.
    let at = |points: &[Point], t: f64| {
        points
            .iter()
            .find(|p| p.lo_s <= t && t < p.hi_s && p.n > 0)
            .map_or(f64::NAN, |p| p.mean_w)
    };
    let col = |v: Vec<f64>| Arc::new(Float64Array::from(v)) as ArrayRef;
    let fields: Vec<Field> = ["t_s", "logger_w", "corrected_w", "lo_w", "hi_w", "rig_w"]
        .iter()
        .map(|n| Field::new(*n, DataType::Float64, true))
        .collect();
    let figures = serde_json::json!({
        "duration_s": duration,
        "idle_w": idle,
        "energy_j": d.energy_j,
        "energy_lo_j": d.energy_lo_j,
        "energy_hi_j": d.energy_hi_j,
        "rig_energy_j": a.rig_energy_j,
        "lambda": d.lambda,
        "rule": d.rule,
        "segments": d.segments,
        "confidence": d.confidence,
        "logger_model": args.logger.display().to_string(),
        "family": model.family,
    });
    let schema = Arc::new(
        Schema::new(fields).with_metadata(std::collections::HashMap::from([(
            "railtrace.corrected".to_string(),
            figures.to_string(),
        )])),
    );
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            col(d.t.clone()),
            col(d.t.iter().map(|&t| at(&a.logger, t)).collect()),
            col(d.power_w.clone()),
            col(d.lo_w.clone()),
            col(d.hi_w.clone()),
            col(d.t.iter().map(|&t| at(&a.rig, t)).collect()),
        ],
    )?;
    let file = std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let mut w = arrow_ipc::writer::StreamWriter::try_new(file, &schema)?;
    w.write(&batch)?;
    w.finish()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    }
    eprintln!(
        "railtrace correct: {} family, idle {:.1} W; energy per execution {:.3} mJ ({:.3}-{:.3} at {:.0} %), the rig's {:.3} mJ ({:+.2} %); {} segments, λ {:.3e} ({}) -> {}",
        model.family,
        idle,
        d.energy_j * 1e3,
        d.energy_lo_j * 1e3,
        d.energy_hi_j * 1e3,
        d.confidence * 100.0,
        a.rig_energy_j * 1e3,
        (d.energy_j / a.rig_energy_j - 1.0) * 100.0,
        d.segments,
        d.lambda,
        d.rule,
        args.output.display()
    );
    Ok(())
}
