//! The identified model of a GPU's power logger, as a file other tools can apply:
//! `logger.toml`, versioned (`format = "railtrace-logger-model"`, `version = 1`).
//!
//! A reading at time `t` shows the latest update `u = phase_s + k·period_s ≤ t −
//! delay_s`, whose value is `gain · r(u) + offset_w`, with `r(u)` the reference power
//! through the family's response:
//! - `box`: the mean power over `[u − window_s, u]`, `window_s ≥ period_s` (equal: the
//!   windows tile time);
//! - `partial`: the mean power over `[u − window_s, u]` (`window_s ≤ period_s`);
//! - `exponential`: a first-order low pass of time constant `tau_s`, sampled at `u`;
//! - `response`: `Σ_i response_per_s[i] · spacing · mean power over [u − (i+1)·spacing,
//!   u − i·spacing]` with `spacing = response_spacing_s` (the weights integrate to 1).
//!
//! Every parameter has its standard error beside it (`*_se`); `bic` lists the criterion
//! of each family tried (the lowest wins), `residual_rms_w` the fit's residual.

use std::collections::BTreeMap;
use std::path::Path;

use railtrace_calibration::logger::{FamilyFit, Identification, Shape};
use serde::{Deserialize, Serialize};

/// The value of `format`.
pub const FORMAT: &str = "railtrace-logger-model";
/// The version this code writes and reads.
pub const VERSION: u32 = 1;

/// Where a model came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The input the model was identified from.
    pub input: String,
    /// The reference trace (the rig, an external meter).
    pub reference: String,
    /// The logger.
    pub logger: String,
    /// When, UTC.
    pub created_utc: String,
    /// The railtrace that made it.
    pub railtrace: String,
}

/// An identified logger model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggerModel {
    /// `railtrace-logger-model`.
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// `box`, `partial`, `exponential` or `response`.
    pub family: String,
    /// Update period, s.
    pub period_s: f64,
    /// Its standard error, s.
    pub period_se_s: f64,
    /// An update instant, s on the input's timeline.
    pub phase_s: f64,
    /// Delay from an update to the first reading showing it, s.
    pub delay_s: f64,
    /// Its standard error, s.
    pub delay_se_s: f64,
    /// Window width (box: the period; partial), s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Its standard error, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_se_s: Option<f64>,
    /// Time constant (exponential), s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau_s: Option<f64>,
    /// Its standard error, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau_se_s: Option<f64>,
    /// Bin width of the response (response), s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_spacing_s: Option<f64>,
    /// The response per bin, 1/s (response).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_per_s: Option<Vec<f64>>,
    /// Gain.
    pub gain: f64,
    /// Its standard error.
    pub gain_se: f64,
    /// Offset, W.
    pub offset_w: f64,
    /// Its standard error, W.
    pub offset_se_w: f64,
    /// RMS of the readings' residuals, W.
    pub residual_rms_w: f64,
    /// Readings used.
    pub readings: usize,
    /// The criterion of each family tried (BIC; the lowest is the family chosen).
    pub bic: BTreeMap<String, f64>,
    /// Where it came from.
    pub provenance: Provenance,
}

impl LoggerModel {
    /// The model of `fit`, one of `ident`'s fits.
    pub fn new(ident: &Identification, fit: &FamilyFit, provenance: Provenance) -> LoggerModel {
        let (window, tau, spacing, response) = match &fit.shape {
            Shape::Box { window_s } | Shape::Partial { window_s } => {
                (Some(*window_s), None, None, None)
            }
            Shape::Exponential { tau_s } => (None, Some(*tau_s), None, None),
            Shape::Response {
                spacing_s, h_per_s, ..
            } => (None, None, Some(*spacing_s), Some(h_per_s.clone())),
        };
        LoggerModel {
            format: FORMAT.into(),
            version: VERSION,
            family: fit.family().name().into(),
            period_s: fit.period_s.value,
            period_se_s: fit.period_s.se,
            phase_s: fit.phase_s.value,
            delay_s: fit.delay_s.value,
            delay_se_s: fit.delay_s.se,
            window_s: window.map(|w| w.value),
            window_se_s: window.map(|w| w.se),
            tau_s: tau.map(|t| t.value),
            tau_se_s: tau.map(|t| t.se),
            response_spacing_s: spacing,
            response_per_s: response,
            gain: fit.gain.value,
            gain_se: fit.gain.se,
            offset_w: fit.offset_w.value,
            offset_se_w: fit.offset_w.se,
            residual_rms_w: fit.rms_w,
            readings: fit.readings,
            bic: ident
                .fits
                .iter()
                .map(|f| (f.family().name().to_string(), f.bic))
                .collect(),
            provenance,
        }
    }

    /// Writes the model as TOML.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = toml::to_string(self)?;
        let header =
            "# A GPU power logger's identified model (railtrace; see host/src/logger_model.rs).\n";
        std::fs::write(path, format!("{header}{text}"))
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Reads a model, checking its format and version.
    pub fn read(path: &Path) -> anyhow::Result<LoggerModel> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let m: LoggerModel = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a railtrace logger model: {}",
                path.display(),
                e.to_string().lines().next().unwrap_or_default()
            )
        })?;
        anyhow::ensure!(
            m.format == FORMAT && m.version == VERSION,
            "{}: {} version {}; this railtrace reads {FORMAT} version {VERSION}",
            path.display(),
            m.format,
            m.version
        );
        Ok(m)
    }
}
