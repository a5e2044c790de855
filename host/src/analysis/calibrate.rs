//! Calibrating a GPU's power logger: its readings identified against the rig's (or an
//! external meter's) samples, and written as a model (`railtrace calibrate logger`).

use std::path::{Path, PathBuf};

pub use railtrace_calibration::logger::Family;
use railtrace_calibration::logger::{
    identify, period_from_changes, LatticeBuilder, Options as IdentifyOptions,
};

use crate::analysis::logger_model::{LoggerModel, Provenance};
use crate::analysis::paired;
use crate::analysis::stitch::{reduced_timeline, AnalysisError, Options, Reduced, EXACT_SAMPLES};
use crate::store::recording::rig_path;
use crate::store::recording::{self, iso_utc, LoggerColumn, RecordingError};

/// Why a logger could not be calibrated.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// A recording could not be read.
    #[error(transparent)]
    Recording(#[from] RecordingError),
    /// A profiling run's recordings could not be put on one timeline.
    #[error(transparent)]
    Analysis(#[from] AnalysisError),
    /// The reference's samples are unusable.
    #[error("{path}: the reference: {why}")]
    Reference {
        /// The recording.
        path: PathBuf,
        /// What is wrong with them.
        why: String,
    },
    /// No logger readings, or no reference samples.
    #[error("{path}: needs reference samples and logger readings ({samples} samples here, and no readings of the logger's {column})")]
    Empty {
        /// The recording.
        path: PathBuf,
        /// Reference samples found.
        samples: u64,
        /// The logger's readings asked for.
        column: LoggerColumn,
    },
    /// No family fits the readings.
    #[error("{path}: the logger could not be identified: {why}")]
    Identification {
        /// The recording.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The family asked for was not fitted.
    #[error("{path}: no {family} fit to write")]
    NoFit {
        /// The recording.
        path: PathBuf,
        /// The family.
        family: Family,
    },
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
) -> Result<(Reduced, String, String), CalibrateError> {
    let rec = paired::read(path, column)?;
    let unusable = |e: &dyn std::fmt::Display| CalibrateError::Reference {
        path: path.to_path_buf(),
        why: e.to_string(),
    };
    let spacing = median_spacing(&rec.meter_t);
    let cell = cell_for(&rec.logger_t, &rec.logger_w, period_ms, spacing);
    let mut lattice = LatticeBuilder::new(cell)
        .map_err(|e| unusable(&e))?
        .exact_up_to(EXACT_SAMPLES);
    for (&t, &w) in rec.meter_t.iter().zip(&rec.meter_w) {
        lattice.push(t, w).map_err(|e| unusable(&e))?;
    }
    let samples = lattice.samples();
    let reference = lattice.finish().map_err(|e| unusable(&e))?;
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
#[derive(Debug)]
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
/// holding both) against the reference; `progress` is told what is being done (reading
/// the rig's capture, with its samples so far; identifying).
pub fn calibrate(
    input: &Path,
    rig: Option<PathBuf>,
    req: Request,
    progress: impl Fn(&str),
) -> Result<Calibrated, CalibrateError> {
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
            |n| progress(&format!("reading the rig's capture: {n} samples")),
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
    if t.logger_t.is_empty() {
        return Err(CalibrateError::Empty {
            path: input.to_path_buf(),
            samples: t.samples,
            column,
        });
    }
    let opts = IdentifyOptions {
        period_s: period_ms.map(|p| p * 1e-3),
        ..IdentifyOptions::default()
    };
    progress(&format!(
        "identifying the logger from {} readings against {} reference samples",
        t.logger_t.len(),
        t.samples
    ));
    let started = std::time::Instant::now();
    let ident = identify(&t.reference, &t.logger_t, &t.logger_w, &opts).map_err(|e| {
        CalibrateError::Identification {
            path: input.to_path_buf(),
            why: e.to_string(),
        }
    })?;
    let fit = match family {
        Some(f) => ident.fit(f).ok_or_else(|| CalibrateError::NoFit {
            path: input.to_path_buf(),
            family: f,
        })?,
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
            created_utc: iso_utc(recording::host_now_ns()),
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
