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
//! Every parameter has its standard error beside it (`*_se`) and its 95 % interval in
//! `[intervals]` (`lo`, `hi`, `level`; Student's t on `se_dof`, the run's load-step
//! blocks less one); `bic` lists the criterion
//! of each family tried (the lowest wins), `residual_rms_w` the fit's residual;
//! `[[families]]` every family's parameters as `[value, standard error]`. A model whose
//! parameters the readings do not determine, or that no power sensor could have, lists
//! why in `doubts` (absent when there are none): such a model is not a calibration.
//! `provenance` names the input, the logger's column fitted (`column`) and a period
//! given instead of estimated (`period_given_s`).

use std::collections::BTreeMap;
use std::path::Path;

use railtrace_calibration::deconvolve::{LoggerKernel, Response};
use railtrace_calibration::logger::{FamilyFit, Identification, Shape};
use serde::{Deserialize, Serialize};

/// The first line of every model file.
const MODEL_HEADER: &str =
    "# A GPU power logger's identified model (railtrace; see host/src/analysis/logger_model.rs).\n";

/// The value of `format`.
pub const FORMAT: &str = "railtrace-logger-model";
/// The version this code writes and reads.
pub const VERSION: u32 = 1;

/// Where a model came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The logger's readings fitted: the recording's column (`logger_w`,
    /// `logger_instant_w`, `logger_average_w`).
    #[serde(default = "default_column")]
    pub column: String,
    /// The update period the identification was given instead of estimating it, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_given_s: Option<f64>,
}

/// The column of a model written before models named theirs.
fn default_column() -> String {
    "logger_w".into()
}

/// An identified logger model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The degrees of freedom the standard errors rest on: the load-step blocks of the
    /// run they were fitted on, less one (few load steps, few degrees of freedom).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub se_dof: Option<f64>,
    /// Each parameter's interval at [`INTERVAL_LEVEL`] (`period_s`, `delay_s`,
    /// `window_s` or `tau_s`, `gain`, `offset_w`): Student's t on `se_dof` times the
    /// standard error either side, the delay's from the least to the greatest delay the
    /// readings are consistent with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub intervals: BTreeMap<String, Interval>,
    /// Why this model does not identify the logger (see [`FamilyFit::doubts`]); empty
    /// for a model whose figures mean what they say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub doubts: Vec<String>,
    /// The criterion of each family tried (BIC; the lowest is the family chosen).
    pub bic: BTreeMap<String, f64>,
    /// Every family's fit, the chosen one among them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub families: Vec<FamilySummary>,
    /// Where it came from.
    pub provenance: Provenance,
}

/// The level of a model's intervals.
pub const INTERVAL_LEVEL: f64 = 0.95;

/// An interval that holds a parameter with probability `level`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interval {
    /// Its lower end.
    pub lo: f64,
    /// Its upper end.
    pub hi: f64,
    /// The probability it holds the parameter.
    pub level: f64,
}

/// One family's fit, as a model file lists it beside the chosen one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilySummary {
    /// `box`, `partial`, `exponential` or `response`.
    pub family: String,
    /// Its criterion (BIC).
    pub bic: f64,
    /// RMS of the readings' residuals, W.
    pub residual_rms_w: f64,
    /// Update period and its standard error, s.
    pub period_s: [f64; 2],
    /// Delay and its standard error, s.
    pub delay_s: [f64; 2],
    /// Window width and its standard error (box, partial), s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<[f64; 2]>,
    /// Time constant and its standard error (exponential), s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau_s: Option<[f64; 2]>,
    /// Gain and its standard error.
    pub gain: [f64; 2],
    /// Offset and its standard error, W.
    pub offset_w: [f64; 2],
    /// Why it does not identify the logger; empty if it does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub doubts: Vec<String>,
}

impl FamilySummary {
    fn new(f: &FamilyFit, mean_reading_w: f64) -> FamilySummary {
        let pair = |e: railtrace_calibration::logger::Estimate| [e.value, e.se];
        FamilySummary {
            family: f.family().name().into(),
            bic: f.bic,
            residual_rms_w: f.rms_w,
            period_s: pair(f.period_s),
            delay_s: pair(f.delay_s),
            window_s: f.window_s().map(pair),
            tau_s: f.tau_s().map(pair),
            gain: pair(f.gain),
            offset_w: pair(f.offset_w),
            doubts: f.doubts(mean_reading_w),
        }
    }
}

/// `fit`'s parameters' intervals at [`INTERVAL_LEVEL`].
fn intervals(fit: &FamilyFit) -> BTreeMap<String, Interval> {
    let at = |(lo, hi): (f64, f64)| Interval {
        lo,
        hi,
        level: INTERVAL_LEVEL,
    };
    let each = |e| at(fit.interval(e, INTERVAL_LEVEL));
    let mut out = BTreeMap::from([
        ("period_s".to_string(), each(fit.period_s)),
        (
            "delay_s".to_string(),
            at(fit.delay_interval(INTERVAL_LEVEL)),
        ),
        ("gain".to_string(), each(fit.gain)),
        ("offset_w".to_string(), each(fit.offset_w)),
    ]);
    if let Some(w) = fit.window_s() {
        out.insert("window_s".into(), each(w));
    }
    if let Some(t) = fit.tau_s() {
        out.insert("tau_s".into(), each(t));
    }
    out
}

impl LoggerModel {
    /// The model of `fit`, one of `ident`'s fits, whose readings averaged
    /// `mean_reading_w`.
    pub fn new(
        ident: &Identification,
        fit: &FamilyFit,
        mean_reading_w: f64,
        provenance: Provenance,
    ) -> LoggerModel {
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
            se_dof: Some(fit.se_dof),
            intervals: intervals(fit),
            doubts: fit.doubts(mean_reading_w),
            bic: ident
                .fits
                .iter()
                .map(|f| (f.family().name().to_string(), f.bic))
                .collect(),
            families: (ident.fits.iter())
                .map(|f| FamilySummary::new(f, mean_reading_w))
                .collect(),
            provenance,
        }
    }

    /// The power a reading stands for, the model's gain and offset inverted:
    /// `(reading − offset) / gain`, W.
    pub fn invert(&self, reading_w: f64) -> f64 {
        (reading_w - self.offset_w) / self.gain
    }

    /// The model's response to power as the deconvolution takes it: for a grid of `dt` s,
    /// an exponential's taps reaching ten time constants past `delay_s`.
    ///
    /// # Errors
    ///
    /// A family this version does not know.
    pub fn response(&self, dt: f64, delay_s: f64) -> anyhow::Result<Response<'_>> {
        Ok(match self.family.as_str() {
            "box" | "partial" => Response::Box {
                width_s: self.window_s.unwrap_or(self.period_s),
            },
            "exponential" => {
                let tau = self.tau_s.unwrap_or(self.period_s);
                Response::Exponential {
                    tau_s: tau,
                    len: (10.0 * tau / dt) as usize + 2 + (delay_s.max(0.0) / dt) as usize,
                }
            }
            "response" => Response::Piecewise {
                step_s: self.response_spacing_s.unwrap_or(dt),
                weights: self.response_per_s.as_deref().unwrap_or_default(),
            },
            other => anyhow::bail!("unknown family {other:?}"),
        })
    }

    /// What the logger would read of power `power_w`, constant over each cell of a uniform
    /// grid `dt_s` wide (steady at `idle_w` before it): `gain·(h ∗ P)(t − delay) + offset`
    /// averaged over each cell (as a stitched profile's bin averages readings), the delay
    /// folded into the response exactly (a negative one taken as none).
    ///
    /// # Errors
    ///
    /// A family this version does not know, or a grid the response cannot be sampled on.
    pub fn through(&self, power_w: &[f64], dt_s: f64, idle_w: f64) -> anyhow::Result<Vec<f64>> {
        let delay = self.delay_s.max(0.0);
        let h =
            railtrace_calibration::deconvolve::kernel(&self.response(dt_s, delay)?, dt_s, delay)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        let logger = LoggerKernel {
            kernel: h,
            delay_s: 0.0,
            gain: self.gain,
            offset_w: self.offset_w,
        };
        let grid: Vec<(f64, f64)> = (power_w.iter().enumerate())
            .map(|(k, &w)| (k as f64 * dt_s, w))
            .collect();
        Ok(through_logger(&grid, dt_s, &logger, idle_w)
            .into_iter()
            .map(|p| p.1)
            .collect())
    }

    /// The model file's text (TOML, with its header).
    pub fn to_toml(&self) -> anyhow::Result<String> {
        Ok(format!("{MODEL_HEADER}{}", toml::to_string(self)?))
    }

    /// Writes the model as TOML.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        crate::store::write_output(path, self.to_toml()?)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Reads a model, checking its format and version.
    pub fn read(path: &Path) -> anyhow::Result<LoggerModel> {
        // A model with a response of 100 000 bins is a few MB of text.
        let bytes = railtrace_twin::scenario::read_file(path, 16 << 20, "a logger model")
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let text = String::from_utf8(bytes).map_err(|_| {
            anyhow::anyhow!("{}: not a logger model: not UTF-8 text", path.display())
        })?;
        LoggerModel::parse(path, &text)
    }

    /// Parses the text of a model file (`path` for its errors), as [`LoggerModel::read`].
    pub fn parse(path: &Path, text: &str) -> anyhow::Result<LoggerModel> {
        let m: LoggerModel = toml::from_str(text).map_err(|e| {
            // The line of the span the parser names (a missing field: the whole file).
            let line = e.span().map_or(1, |s| {
                text.get(..s.start)
                    .map_or(1, |t| t.matches('\n').count() + 1)
            });
            anyhow::anyhow!(
                "{}:{line}: not a railtrace logger model: {}",
                path.display(),
                e.message().trim_end()
            )
        })?;
        anyhow::ensure!(
            m.format == FORMAT && m.version == VERSION,
            "{}: {} version {}; this railtrace reads {FORMAT} version {VERSION}",
            path.display(),
            m.format,
            m.version
        );
        m.check()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(m)
    }

    /// Every figure within what a GPU's logger can have: a period of 10 µs to a minute,
    /// windows, time constants and response bins of 1 µs to 100 periods, a response of at
    /// most 100 000 bins, a delay from a period early to 10 s late, a gain of 0.1 to 10, an
    /// offset within ±10 kW, finite uncertainties at least 0; and the family's own figure
    /// given.
    fn check(&self) -> Result<(), String> {
        let field = |name: &str, v: f64, ok: bool, rule: &str| {
            if ok && v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} = {v:?}: {rule}"))
            }
        };
        let p = self.period_s;
        field(
            "period_s",
            p,
            (1e-5..=60.0).contains(&p),
            "must be 10 µs to 60 s",
        )?;
        let reach = 100.0 * p;
        field(
            "delay_s",
            self.delay_s,
            (-p..=10.0).contains(&self.delay_s),
            "must be from a period early (-period_s) to 10 s late",
        )?;
        field("phase_s", self.phase_s, true, "must be finite")?;
        field(
            "gain",
            self.gain,
            (0.1..=10.0).contains(&self.gain),
            "must be 0.1 to 10 (readings over true power)",
        )?;
        field(
            "offset_w",
            self.offset_w,
            self.offset_w.abs() <= 1e4,
            "must be within ±10 kW",
        )?;
        for (name, v) in [
            ("period_se_s", self.period_se_s),
            ("delay_se_s", self.delay_se_s),
            ("gain_se", self.gain_se),
            ("offset_se_w", self.offset_se_w),
            ("residual_rms_w", self.residual_rms_w),
        ] {
            field(name, v, v >= 0.0, "must be >= 0")?;
        }
        for (name, v) in [
            ("window_s", self.window_s),
            ("tau_s", self.tau_s),
            ("response_spacing_s", self.response_spacing_s),
        ] {
            if let Some(v) = v {
                field(
                    name,
                    v,
                    (1e-6..=reach).contains(&v),
                    "must be 1 µs to 100 periods",
                )?;
            }
        }
        for (name, i) in &self.intervals {
            if !(i.lo <= i.hi && i.level > 0.0 && i.level < 1.0) {
                return Err(format!(
                    "intervals.{name} = [{}, {}] at {}: must run from lo up to hi at a level between 0 and 1",
                    i.lo, i.hi, i.level
                ));
            }
        }
        let needs = match self.family.as_str() {
            "box" | "partial" => ("window_s", self.window_s.is_some()),
            "exponential" => ("tau_s", self.tau_s.is_some()),
            "response" => (
                "response_per_s",
                self.response_spacing_s.is_some() && self.response_per_s.is_some(),
            ),
            other => {
                return Err(format!(
                    "family = {other:?}: must be box, partial, exponential or response"
                ))
            }
        };
        if !needs.1 {
            return Err(format!(
                "a model of family {} needs {}",
                self.family, needs.0
            ));
        }
        if let Some(r) = &self.response_per_s {
            if r.len() > 100_000 || r.iter().any(|v| !v.is_finite()) {
                return Err(format!(
                    "response_per_s: {} values; must be at most 100 000, all finite",
                    r.len()
                ));
            }
        }
        Ok(())
    }
}

/// What the logger would read of a profile `(bin start, mean power)` on a uniform grid
/// `dt` wide: `gain·(h ∗ P)(t − delay) + offset`, with `idle_w` before the first bin and
/// the delay rounded to whole bins.
pub fn through_logger(
    power: &[(f64, f64)],
    dt: f64,
    logger: &LoggerKernel,
    idle_w: f64,
) -> Vec<(f64, f64)> {
    let shift = (logger.delay_s / dt).round() as i64;
    let at = |k: i64| {
        usize::try_from(k)
            .ok()
            .and_then(|k| power.get(k))
            .map_or(idle_w, |p| p.1)
    };
    (0..power.len() as i64)
        .map(|k| {
            let conv: f64 = (logger.kernel.iter().enumerate())
                .map(|(j, h)| h * at(k - shift - j as i64))
                .sum();
            (power[k as usize].0, logger.gain * conv + logger.offset_w)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../../calibration/loggers/a100-step.toml");

    /// Reads `text` as a model file; the error's words.
    fn read_text(name: &str, text: &str) -> Result<LoggerModel, String> {
        let p = std::env::temp_dir().join(format!(
            "railtrace-model-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&p, text).unwrap();
        let r = LoggerModel::read(&p).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&p);
        r
    }

    /// A box logger through [`LoggerModel::through`] against the slow way: each cell's
    /// mean, by a 500-point midpoint rule, of the window's exact mean of the power.
    #[test]
    fn a_box_logger_reads_a_step_as_the_slow_reference_does() {
        let mut m = read_text("shipped", SHIPPED).unwrap();
        m.family = "box".into();
        (m.period_s, m.window_s, m.delay_s) = (1e-3, Some(1e-3), 0.23e-3);
        (m.gain, m.offset_w) = (0.97, 4.0);
        let dt = 10e-6;
        let p: Vec<f64> = (0..400)
            .map(|k| if k < 50 { 100.0 } else { 300.0 })
            .collect();
        let got = m.through(&p, dt, 100.0).unwrap();
        // The power's integral from −∞ (idle) to t, exactly.
        let integral = |t: f64| -> f64 {
            let mut e = 100.0 * t.min(0.0);
            for (k, &w) in p.iter().enumerate() {
                let a = k as f64 * dt;
                e += w * (t.min(a + dt) - a).max(0.0);
            }
            e
        };
        for (k, g) in got.iter().enumerate() {
            let n = 500u32;
            let mean = (0..n)
                .map(|i| {
                    let t = (k as f64 + (f64::from(i) + 0.5) / f64::from(n)) * dt - m.delay_s;
                    (integral(t) - integral(t - 1e-3)) / 1e-3
                })
                .sum::<f64>()
                / f64::from(n);
            let want = 0.97 * mean + 4.0;
            assert!((g - want).abs() < 1e-6 * 300.0, "cell {k}: {g} vs {want}");
        }
        assert!((got[0] - (0.97 * 100.0 + 4.0)).abs() < 1e-9);
        assert!((got[399] - (0.97 * 300.0 + 4.0)).abs() < 1e-9);
    }

    #[test]
    fn every_family_its_doubts_and_the_column_survive_the_file() {
        // A model from before models named their column reads as `logger_w`.
        let old = SHIPPED.replace("column = \"logger_w\"\n", "");
        assert!(!old.contains("column ="));
        let mut m = read_text("shipped-again", &old).unwrap();
        assert_eq!(
            m.provenance.column, "logger_w",
            "a model from before columns"
        );
        m.provenance.column = "logger_instant_w".into();
        m.provenance.period_given_s = Some(0.1);
        m.doubts = vec!["gain 1.409 is outside 0.7-1.3".into()];
        m.families = vec![FamilySummary {
            family: "partial".into(),
            bic: -349.4,
            residual_rms_w: 0.215,
            period_s: [0.101, 1e-5],
            delay_s: [-5e-4, 9e-4],
            window_s: Some([0.032, 8.7e-4]),
            tau_s: None,
            gain: [0.958, 4e-4],
            offset_w: [-2.17, 0.05],
            doubts: vec!["its delay or shape lies at an end of the range searched".into()],
        }];
        let text = toml::to_string(&m).unwrap();
        assert_eq!(read_text("families", &text).unwrap(), m);
    }

    #[test]
    fn nonsense_in_a_model_file_is_refused_where_it_is() {
        assert!(read_text("shipped", SHIPPED).is_ok());
        for (from, to, says) in [
            (
                "period_s = 0.10114966120748106",
                "period_s = -1",
                "period_s = -1.0: must be 10 µs to 60 s",
            ),
            (
                "period_s = 0.10114966120748106",
                "period_s = 1e-9",
                "period_s",
            ),
            (
                "period_s = 0.10114966120748106",
                "period_s = nan",
                "period_s = NaN",
            ),
            (
                "tau_s = 0.013115793672219232",
                "tau_s = 1e9",
                "tau_s = 1000000000.0: must be 1 µs",
            ),
            ("gain = 0.9589395813069554", "gain = 0.0", "gain = 0.0"),
            (
                "gain = 0.9589395813069554",
                "gain = 1e308",
                "gain = 1e308: must be 0.1 to 10",
            ),
            (
                "delay_s = 0.0003670560402126761",
                "delay_s = -1",
                "delay_s = -1.0: must be from",
            ),
            (
                "tau_s = 0.013115793672219232",
                "tau_s = 1e-308",
                "tau_s = 1e-308: must be 1 µs to 100 periods",
            ),
            (
                "offset_w = -2.2614100626230993",
                "offset_w = 1e300",
                "offset_w = 1e300: must be within",
            ),
            (
                "family = \"exponential\"",
                "family = \"magic\"",
                "family = \"magic\"",
            ),
            (
                "tau_s = 0.013115793672219232\n",
                "",
                "a model of family exponential needs tau_s",
            ),
            (
                "readings = 920",
                "readings = 920\nreadngs = 3",
                ":18: not a railtrace logger model: unknown field `readngs`",
            ),
            (
                "gain = 0.9589395813069554",
                "gain = \"high\"",
                ":12: not a railtrace logger model: invalid type",
            ),
        ] {
            let text = SHIPPED.replacen(from, to, 1);
            assert_ne!(text, SHIPPED, "{from}");
            let e = read_text("bad", &text).unwrap_err();
            assert!(e.contains(says), "{to:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
