//! A survey of paired traces: every paired-trace run folder under the folders given,
//! imported, every logger column calibrated and compared with the meter, a step run's
//! model cross-validated on the same GPU's other runs; one table (`railtrace survey`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::analysis::calibrate::{calibrate, Request};
use crate::analysis::logger_model::LoggerModel;
use crate::analysis::paired::{self, Energy};
use crate::store::recording::LoggerColumn;

/// One run folder: its GPU and what kind of run.
#[derive(Debug, Clone)]
pub struct Found {
    /// The folder.
    pub dir: PathBuf,
    /// The GPU.
    pub gpu: String,
    /// The run: `step` (load steps), `square` (a 50 % square wave), or its folder's name.
    pub kind: String,
}

/// Run folders under `dir`, `depth` levels deep.
pub fn find(dir: &Path, depth: usize, out: &mut Vec<Found>) -> anyhow::Result<()> {
    if dir.join("PMD_data.bin").is_file() {
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let folder = name(dir);
        let parent = dir.parent().map(name).unwrap_or_default();
        // The study's layout: Transient_Response/<GPU>_TR (load steps), 5050/<GPU> (a
        // 50 % square wave); elsewhere the folder is the GPU and its parent the run.
        let (gpu, kind) = match (folder.strip_suffix("_TR"), parent.as_str()) {
            (Some(g), _) => (g.to_string(), "step".to_string()),
            (None, "5050") => (folder, "square".to_string()),
            (None, _) => (folder, parent),
        };
        out.push(Found {
            dir: dir.to_path_buf(),
            gpu,
            kind,
        });
        return Ok(());
    }
    if depth == 0 {
        return Ok(());
    }
    let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    subs.sort();
    for s in subs {
        find(&s, depth - 1, out)?;
    }
    Ok(())
}

/// One column of one run, calibrated and compared.
#[derive(Debug, Clone)]
pub struct Row {
    /// The GPU.
    pub gpu: String,
    /// The run (see [`Found::kind`]).
    pub kind: String,
    /// The logger's column.
    pub column: LoggerColumn,
    /// The logger identified from this run.
    pub model: LoggerModel,
    /// The energy error, raw and through the model.
    pub energy: Option<Energy>,
    /// The logger's median delay at the load's steps, s.
    pub delay_s: Option<f64>,
    /// The logger's steady state against the meter, as a line.
    pub steady: Option<paired::Line>,
    /// The energy error through the same GPU's step-run model, on the other runs.
    pub cross: Option<f64>,
    /// The readings deconvolved with the run's own model, where they allow: the steps'
    /// median delay and the energy error.
    pub deconvolved: Option<(Option<f64>, Option<f64>)>,
    /// The energy error deconvolved with the same GPU's step-run model.
    pub cross_deconvolved: Option<f64>,
}

/// The deconvolved readings' step delay and energy error, where the readings allow.
fn deconvolved(
    run: &paired::PairedRun<'_>,
    model: &LoggerModel,
) -> Option<(Option<f64>, Option<f64>)> {
    let d = paired::deconvolve(run, model, 0).ok()?;
    Some((d.measures.delay_s, d.measures.energy.map(|e| e.error)))
}

fn file_name(gpu: &str, kind: &str, column: LoggerColumn) -> String {
    let suffix = match column {
        LoggerColumn::Power => "",
        LoggerColumn::Instant => "-instant",
        LoggerColumn::Average => "-average",
    };
    format!("{}-{kind}{suffix}.toml", gpu.to_lowercase())
}

/// Surveys the run folders under `dirs` (three levels deep), by GPU, its step run first:
/// each imported into a scratch folder (removed after), every logger column it logs
/// calibrated (each model written into `models` when given, as
/// `<gpu>-<run>[-instant|-average].toml`) and compared with the meter, and each step
/// run's model applied to the same GPU's other runs. `progress` is told of the runs done,
/// of how many, and what is being done.
///
/// # Errors
///
/// A folder that is not there or holds no run, a run that does not import or calibrate,
/// a model that cannot be written.
pub fn survey(
    dirs: &[PathBuf],
    models: Option<&Path>,
    progress: impl Fn(usize, usize, &str),
) -> anyhow::Result<Vec<Row>> {
    let mut found = Vec::new();
    for d in dirs {
        anyhow::ensure!(d.is_dir(), "{}: no such folder", d.display());
        find(d, 3, &mut found)?;
    }
    // By GPU, its step run first.
    found.sort_by(|a, b| {
        (&a.gpu, a.kind != "step", &a.kind).cmp(&(&b.gpu, b.kind != "step", &b.kind))
    });
    anyhow::ensure!(
        !found.is_empty(),
        "no paired-trace run folders (with PMD_data.bin) under {}",
        (dirs.iter().map(|d| d.display().to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(m) = models {
        std::fs::create_dir_all(m).map_err(|e| anyhow::anyhow!("{}: {e}", m.display()))?;
    }
    let scratch = std::env::temp_dir().join(format!("railtrace-survey-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = survey_found(&found, &scratch, models, &progress);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn survey_found(
    found: &[Found],
    scratch: &Path,
    models: Option<&Path>,
    progress: &dyn Fn(usize, usize, &str),
) -> anyhow::Result<Vec<Row>> {
    let mut rows: Vec<Row> = Vec::new();
    let mut recordings = Vec::new();
    for (i, f) in found.iter().enumerate() {
        progress(i, found.len(), &format!("{} {}", f.gpu, f.kind));
        let rec = scratch.join(format!("run{i}.arrow"));
        crate::store::import::pmd_run(&f.dir, &rec, None)
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", f.dir.display()))?;
        for column in LoggerColumn::ALL {
            let data = paired::read(&rec, column)?;
            if data.logger_t.len() < 20 {
                continue; // not logged on this GPU
            }
            let req = Request {
                column,
                ..Request::default()
            };
            let what = format!("{} {} {column}", f.gpu, f.kind);
            let c = calibrate(&rec, None, req, |m| {
                progress(i, found.len(), &format!("{what}: {m}"))
            })
            .map_err(|e| anyhow::anyhow!("{} {}: {e:#}", f.dir.display(), column))?;
            let mut model = c.model;
            model.provenance.input = f.dir.display().to_string();
            if let Some(dir) = models {
                model.write(&dir.join(file_name(&f.gpu, &f.kind, column)))?;
            }
            let m = paired::measure(&data.run(), Some(&|w: f64| model.invert(w)))
                .map_err(|e| anyhow::anyhow!("{}: the meter's samples: {e}", f.dir.display()))?;
            rows.push(Row {
                gpu: f.gpu.clone(),
                kind: f.kind.clone(),
                column,
                energy: m.energy,
                delay_s: m.delay_s,
                steady: m.steady,
                cross: None,
                deconvolved: deconvolved(&data.run(), &model),
                model,
                cross_deconvolved: None,
            });
        }
        recordings.push(rec);
        progress(i + 1, found.len(), "");
    }
    // Each step run's model applied to the same GPU's other runs, column by column.
    for (i, f) in found.iter().enumerate() {
        if f.kind == "step" {
            continue;
        }
        for r in 0..rows.len() {
            let (gpu, kind, column) = (&rows[r].gpu, &rows[r].kind, rows[r].column);
            if gpu != &f.gpu || kind != &f.kind {
                continue;
            }
            let Some(step) = rows
                .iter()
                .find(|s| &s.gpu == gpu && s.kind == "step" && s.column == column)
            else {
                continue;
            };
            let data = paired::read(&recordings[i], column)?;
            let m = paired::measure(&data.run(), Some(&|w: f64| step.model.invert(w)))
                .map_err(|e| anyhow::anyhow!("{}: the meter's samples: {e}", f.dir.display()))?;
            let cross_deconvolved = deconvolved(&data.run(), &step.model).and_then(|d| d.1);
            rows[r].cross = m.energy.and_then(|e| e.corrected_error);
            rows[r].cross_deconvolved = cross_deconvolved;
        }
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let pct = |v: Option<f64>| v.map_or("—".into(), |v| format!("{:+.2} %", v * 100.0));
    let pm = |v: f64, se: f64, scale: f64, digits: usize| {
        format!("{:.*} ± {:.*}", digits, v * scale, digits, se * scale)
    };
    let mut s = String::from(
        "| GPU | run | column | family | period (ms) | window / τ (ms) | model delay (ms) | gain | offset (W) | steady state | step delay (ms) | energy error raw | corrected | deconvolved: step delay (ms), energy error | with the step run's model | identified |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let m = &r.model;
        let shape = match (m.window_s, m.tau_s) {
            (Some(w), _) if w != m.period_s => {
                format!("W {}", pm(w, m.window_se_s.unwrap_or(f64::NAN), 1e3, 1))
            }
            (_, Some(t)) => format!("τ {}", pm(t, m.tau_se_s.unwrap_or(f64::NAN), 1e3, 1)),
            _ => "—".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.gpu,
            r.kind,
            r.column.smi_name(),
            m.family,
            pm(m.period_s, m.period_se_s, 1e3, 3),
            shape,
            pm(m.delay_s, m.delay_se_s, 1e3, 1),
            pm(m.gain, m.gain_se, 1.0, 4),
            pm(m.offset_w, m.offset_se_w, 1.0, 2),
            r.steady.map_or("—".into(), |l| format!(
                "{:.4}·P {:+.2} W (R² {:.4})",
                l.gradient, l.intercept_w, l.r2
            )),
            r.delay_s.map_or("—".into(), |d| format!("{:.0}", d * 1e3)),
            pct(r.energy.map(|e| e.error)),
            pct(r.energy.and_then(|e| e.corrected_error)),
            r.deconvolved.map_or("—".into(), |(d, e)| format!(
                "{}, {}",
                d.map_or("—".into(), |d| format!("{:.0}", d * 1e3)),
                pct(e)
            )),
            match (r.cross, r.cross_deconvolved) {
                (Some(c), Some(d)) => format!("{}; deconvolved {}", pct(Some(c)), pct(Some(d))),
                (c, _) => pct(c),
            },
            if m.doubts.is_empty() {
                "yes".to_string()
            } else {
                format!("no: {}", m.doubts.join("; "))
            },
        );
    }
    s
}
