//! `railtrace model fit` and `railtrace model validate`: power models fitted on profiling
//! runs by the rig, the raw logger or the corrected logger, and held against the rig.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::bail;
use railtrace::logger_model::LoggerModel;
use railtrace::model::{
    fit, mae, observe, plot, score, Against, Correction, Gpu, ModelKind, PowerModel, Run, Scored,
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

/// Observes each run, saying so as it goes.
fn observe_all(
    inputs: &[PathBuf],
    gpu: &Gpu,
    correct: Option<Correction<'_>>,
    bin_s: f64,
) -> anyhow::Result<Vec<Run>> {
    // A glob over a folder of runs also names the rig's captures beside them.
    let (rigs, inputs): (Vec<&PathBuf>, Vec<&PathBuf>) = inputs
        .iter()
        .partition(|p| p.to_string_lossy().ends_with(".rig.arrow"));
    if !rigs.is_empty() {
        eprintln!(
            "railtrace model: {} rig captures among the inputs are read with their runs",
            rigs.len()
        );
    }
    let mut runs = Vec::new();
    for (i, p) in inputs.iter().enumerate() {
        let t0 = std::time::Instant::now();
        let r = observe(p, gpu, correct, bin_s)?;
        let na = |x: f64| {
            if x.is_finite() {
                format!("{x:.1}")
            } else {
                "-".into()
            }
        };
        eprintln!(
            "railtrace model: [{}/{}] {}: {} at {}, {} °C, {} executions of {:.1} µs; power W rig {} logger {} corrected {}; idle W rig {} logger {} corrected {} ({:.1} s)",
            i + 1,
            inputs.len(),
            p.display(),
            r.kernel,
            r.level.name,
            r.temp_c.map_or("-".into(), |t| format!("{t:.1}")),
            r.executions,
            r.time_s * 1e6,
            na(r.power.rig_w),
            na(r.power.logger_w),
            na(r.power.corrected_w),
            na(r.idle.rig_w),
            na(r.idle.logger_w),
            na(r.idle.corrected_w),
            t0.elapsed().as_secs_f64()
        );
        runs.push(r);
    }
    Ok(runs)
}

/// The model, for people.
fn describe(m: &PowerModel) -> String {
    let mut s = String::new();
    let nf = 1e-9; // W/(Hz·V²) shown as W/(GHz·V²)
    if let Some(u) = &m.util {
        let _ = writeln!(
            s,
            "  P = {:.1} W + ({:.1}·u_compute + {:.1}·u_memory + {:.1}·u_other) W/(GHz·V²) · f·V²   (rms {:.2} W)",
            u.static_w,
            u.coef[0] / nf,
            u.coef[1] / nf,
            u.coef[2] / nf,
            u.rms_w
        );
    }
    for (name, d) in [
        ("with temperature", &m.dvfs),
        ("without", &m.dvfs_without_temperature),
    ] {
        if let Some(d) = d {
            let _ = writeln!(
                s,
                "  {name:<16} P = {:.1} W + ({:.1} + {:.1}·u_c + {:.1}·u_m + {:.1}·u_o) W/(GHz·V²) · f·V² + {:.1} W/V · V·e^({:.4}·(T − {:.0} °C))   (rms {:.2} W)",
                d.const_w,
                d.clock_coef / nf,
                d.dyn_coef[0] / nf,
                d.dyn_coef[1] / nf,
                d.dyn_coef[2] / nf,
                d.leak_w_per_v,
                d.gamma_per_c,
                d.t_ref_c,
                d.rms_w
            );
        }
    }
    if let Some(d) = &m.dvfs {
        let _ = writeln!(
            s,
            "  leakage temperature coefficient γ = {:.4} ± {:.4} /°C",
            d.gamma_per_c, d.se[6]
        );
    }
    for t in &m.time {
        let pieces: Vec<String> = (t.pieces.iter())
            .map(|p| format!("{:.0} cycles/f + {:.2} µs", p[0], p[1] * 1e6))
            .collect();
        let _ = writeln!(
            s,
            "  time {:<12} max({})   (rms {:.2} %, {} frequencies)",
            t.kernel,
            pieces.join(", "),
            t.rms_rel * 100.0,
            t.frequencies_hz.len()
        );
    }
    s
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
            let correct_fn = |run: &Path, rig: &Path| -> anyhow::Result<_> {
                let (m, p) = logger.as_ref().expect("a logger model");
                let c = super::correct::correct(run, rig, m, p, bin_us * 1e-6)?;
                Ok((c.analysis, c.d.energy_j / c.duration_s, c.idle_w))
            };
            let correct: Option<Correction<'_>> =
                (against == Against::Corrected).then_some(&correct_fn);
            let runs = observe_all(&inputs, &gpu, correct, bin_us * 1e-6)?;
            let m = fit(kind, against, &runs, &gpu)?;
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
                describe(&m)
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
                .collect::<anyhow::Result<_>>()?;
            let gpu = Gpu::read(gpu.as_deref())?;
            let runs = observe_all(&inputs, &gpu, None, bin_us * 1e-6)?;
            let mut scored = Vec::new();
            for m in models {
                let s = score(&m, &runs)?;
                scored.push((m, s));
            }
            let mut report = Vec::new();
            for (m, s) in &scored {
                let j = summary(m, s);
                eprint!("{}", table(m, s, &j));
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

/// The errors over `rows`: power, energy and time MAE, %.
fn errors(rows: &[&Scored]) -> serde_json::Value {
    let timed: Vec<&Scored> = rows.iter().copied().filter(|r| r.time_modelled).collect();
    serde_json::json!({
        "runs": rows.len(),
        "power_mae_pct": mae(rows, Scored::power_pct),
        "energy_mae_pct": mae(rows, Scored::energy_pct),
        "time_mae_pct": if timed.is_empty() { None } else { Some(mae(&timed, Scored::time_pct)) },
        "power_mae_no_temp_pct": if rows.iter().all(|r| r.predicted_no_temp_w.is_finite()) {
            Some(mae(rows, |r| 100.0 * (r.predicted_no_temp_w - r.measured_w) / r.measured_w))
        } else {
            None
        },
    })
}

/// One model's validation as JSON: every run, per kernel, overall, held-out apart.
fn summary(m: &PowerModel, s: &[Scored]) -> serde_json::Value {
    let all: Vec<&Scored> = s.iter().collect();
    let pick =
        |f: &dyn Fn(&Scored) -> bool| -> Vec<&Scored> { s.iter().filter(|r| f(r)).collect() };
    let mut kernels: Vec<&str> = s.iter().map(|r| r.kernel.as_str()).collect();
    kernels.sort();
    kernels.dedup();
    let per_kernel: serde_json::Map<String, serde_json::Value> = kernels
        .iter()
        .map(|k| (k.to_string(), errors(&pick(&|r| r.kernel == *k))))
        .collect();
    let rows: Vec<serde_json::Value> = s
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            v["power_pct"] = r.power_pct().into();
            v["energy_pct"] = r.energy_pct().into();
            v["time_pct"] = r.time_pct().into();
            v
        })
        .collect();
    serde_json::json!({
        "label": m.label(),
        "kind": m.kind,
        "against": m.against,
        "kernels_fitted": m.kernels,
        "levels_fitted": m.levels,
        "gamma_per_c": m.dvfs.as_ref().map(|d| d.gamma_per_c),
        "gamma_se_per_c": m.dvfs.as_ref().map(|d| d.se[6]),
        "overall": errors(&all),
        "held_out_kernels": errors(&pick(&|r| !r.kernel_seen)),
        "held_out_levels": errors(&pick(&|r| !r.level_seen)),
        "seen": errors(&pick(&|r| r.kernel_seen && r.level_seen)),
        "per_kernel": per_kernel,
        "rows": rows,
    })
}

/// One model's validation for people (`j`: its [`summary`]).
fn table(m: &PowerModel, s: &[Scored], j: &serde_json::Value) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{} (fitted on {}; levels {}):",
        m.label(),
        m.kernels.join(", "),
        m.levels.join(", ")
    );
    let _ = writeln!(
        t,
        "  {:<12} {:<6} {:>6} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8}  held out",
        "kernel", "level", "°C", "rig W", "model W", "power", "time µs", "time", "energy"
    );
    for r in s {
        let held = match (r.kernel_seen, r.level_seen) {
            (true, true) => "",
            (false, true) => "kernel",
            (true, false) => "level",
            (false, false) => "kernel, level",
        };
        let _ = writeln!(
            t,
            "  {:<12} {:<6} {:>6} {:>9.1} {:>9.1} {:>+7.2}% {:>9.1} {:>8} {:>+7.2}%  {held}",
            r.kernel,
            r.level,
            r.temp_c.map_or("-".into(), |x| format!("{x:.1}")),
            r.measured_w,
            r.predicted_w,
            r.power_pct(),
            r.measured_s * 1e6,
            if r.time_modelled {
                format!("{:+.2}%", r.time_pct())
            } else {
                "-".into()
            },
            r.energy_pct(),
        );
    }
    let line = |name: &str, e: &serde_json::Value| {
        if e["runs"].as_u64().unwrap_or(0) == 0 {
            return String::new();
        }
        let f = |k: &str| e[k].as_f64().map_or("-".into(), |x| format!("{x:.2} %"));
        format!(
            "  {name:<22} power MAE {:>8}, energy MAE {:>8}, time MAE {:>8}{}  ({} runs)\n",
            f("power_mae_pct"),
            f("energy_mae_pct"),
            f("time_mae_pct"),
            if e["power_mae_no_temp_pct"].is_f64() {
                format!(
                    ", without the temperature term {}",
                    f("power_mae_no_temp_pct")
                )
            } else {
                String::new()
            },
            e["runs"]
        )
    };
    if let Some(k) = j["per_kernel"].as_object() {
        for (name, e) in k {
            t.push_str(&line(name, e));
        }
    }
    t.push_str(&line("overall", &j["overall"]));
    t.push_str(&line("held-out kernels", &j["held_out_kernels"]));
    t.push_str(&line("held-out levels", &j["held_out_levels"]));
    t
}
