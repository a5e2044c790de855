//! Power and execution-time models, fitted from observations.
//!
//! - [`fit_util`]: a utilization model in the spirit of EnergAIzer,
//!   `P = P_static + Σ_m c_m·u_m·f·V²` over the modules compute, memory and other,
//!   every coefficient ≥ 0 (non-negative least squares).
//! - [`fit_dvfs`]: a frequency- and temperature-aware model in the spirit of the DVFS
//!   paper (Wang et al., ASPLOS 2025), `P = P_const + (a_clk + Σ_m a_m·u_m)·f·V² +
//!   b·V·e^{γ(T − T_ref)}`: a load-independent dynamic part (clock tree, always-on
//!   logic) and a load-dependent one over the modules of [`MODULES`]; NNLS in
//!   `(P_const, a_clk, a_m, b)` for each `γ`, `γ` by a grid and golden-section search;
//!   or without the temperature term (`γ = 0`).
//! - [`fit_time`] / [`fit_time_pieces`]: a kernel's cycles against the core clock as a
//!   maximum of affine functions, `cycles(f) = max_j (α_j + β_j·f)` (convex, piecewise
//!   linear), fitted exactly for one to three pieces, the number chosen by BIC.
//! - [`mean_abs_pct_error`], [`energy_pct_error`]: validation metrics.
//!
//! SI units throughout: W, Hz, V, °C, s, J. The coefficients `c_m`, `a_clk`, `a_m` are in
//! W/(Hz·V²) = F (an effective switched capacitance), `b` in W/V, `γ` in 1/°C, `α` in
//! cycles and `β` in s. See `README.md` for the assumptions.

use crate::logger::nnls_gram;
use crate::ParamError;

/// The modules of a [`UtilModel`] and a [`DvfsModel`], in the order of
/// [`Observation::util`], [`UtilModel::coef`], [`DvfsObservation::util`] and
/// [`DvfsModel::dyn_coef`].
pub const MODULES: [&str; 3] = ["compute", "memory", "other"];

/// Reference temperature of the DVFS model's leakage term, °C: `b` is the leakage per
/// volt at this temperature.
pub const T_REF_C: f64 = 25.0;

/// Upper end of the search for the leakage's temperature coefficient `γ`, 1/°C (leakage
/// doubling every 4.6 °C; silicon's subthreshold leakage doubles every 10-25 °C, γ ≈
/// 0.03-0.07).
pub const GAMMA_MAX_PER_C: f64 = 0.15;

/// Points of the coarse grid over `[0, GAMMA_MAX_PER_C]` (step 0.001 /°C).
const GAMMA_GRID: usize = 151;

/// Temperatures accepted by [`fit_dvfs`], °C (keeps `e^{γ(T − T_ref)}` finite).
const TEMP_RANGE_C: (f64, f64) = (-100.0, 200.0);

/// Most pieces [`fit_time`] and [`fit_time_pieces`] accept.
pub const MAX_PIECES: usize = 3;

/// The usual `max_pieces` for [`fit_time`]: a compute-bound and a memory-bound piece.
/// Three allow a third regime (loads and stores saturating at different clocks, or a
/// smooth bend; the DVFS paper's cycle equation has as many pieces as such regimes).
pub const DEFAULT_MAX_PIECES: usize = 2;

// ----------------------------------------------------------------------------------------
// Input checks
// ----------------------------------------------------------------------------------------

fn finite(name: &'static str, v: f64) -> Result<(), ParamError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(ParamError::new(name, v, "must be finite"))
    }
}

fn positive(name: &'static str, v: f64) -> Result<(), ParamError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ParamError::new(name, v, "must be finite and > 0"))
    }
}

fn unit(name: &'static str, v: f64) -> Result<(), ParamError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(ParamError::new(name, v, "must lie in [0, 1]"))
    }
}

fn weight(v: f64) -> Result<(), ParamError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(ParamError::new("weight", v, "must be finite and ≥ 0"))
    }
}

/// At least `need` observations of positive weight (one more than the parameters, so
/// that the residual variance is defined).
fn enough(weights: impl Iterator<Item = f64>, need: usize) -> Result<usize, ParamError> {
    let n = weights.filter(|&w| w > 0.0).count();
    if n < need {
        return Err(ParamError::new(
            "observations",
            n as f64,
            "too few with weight > 0 (one more than the parameters needed)",
        ));
    }
    Ok(n)
}

// ----------------------------------------------------------------------------------------
// Weighted least squares helpers
// ----------------------------------------------------------------------------------------

/// The weighted norm `√(Σ w·c²)` of each column (1 for an all-zero column).
fn column_norms(cols: &[Vec<f64>], w: &[f64]) -> Vec<f64> {
    cols.iter()
        .map(|c| {
            let s: f64 = c.iter().zip(w).map(|(x, w)| w * x * x).sum();
            if s > 0.0 {
                s.sqrt()
            } else {
                1.0
            }
        })
        .collect()
}

/// Weighted non-negative least squares, `min Σ w (y − Σ_j x_j c_j)²` over `x ≥ 0`, with
/// the columns scaled to unit weighted norm first ([`nnls_gram`] on the scaled normal
/// equations). Returns the solution and its weighted residual sum of squares.
fn nnls_weighted(cols: &[Vec<f64>], y: &[f64], w: &[f64]) -> (Vec<f64>, f64) {
    let k = cols.len();
    let norms = column_norms(cols, w);
    let mut gram = vec![0.0; k * k];
    let mut rhs = vec![0.0; k];
    for i in 0..k {
        rhs[i] = cols[i]
            .iter()
            .zip(y)
            .zip(w)
            .map(|((c, y), w)| w * c * y)
            .sum::<f64>()
            / norms[i];
        for j in 0..=i {
            let g = cols[i]
                .iter()
                .zip(&cols[j])
                .zip(w)
                .map(|((a, b), w)| w * a * b)
                .sum::<f64>()
                / (norms[i] * norms[j]);
            gram[i * k + j] = g;
            gram[j * k + i] = g;
        }
        if gram[i * k + i] == 0.0 {
            gram[i * k + i] = 1.0; // an all-zero column: its coefficient stays 0
        }
    }
    let z = nnls_gram(&gram, &rhs, k);
    let x: Vec<f64> = z.iter().zip(&norms).map(|(z, n)| z / n).collect();
    let rss = weighted_rss(cols, &x, y, w);
    (x, rss)
}

fn weighted_rss(cols: &[Vec<f64>], x: &[f64], y: &[f64], w: &[f64]) -> f64 {
    (0..y.len())
        .map(|i| {
            let p: f64 = cols.iter().zip(x).map(|(c, x)| c[i] * x).sum();
            w[i] * (y[i] - p).powi(2)
        })
        .sum()
}

/// The inverse of a small square matrix (row-major) by Gauss–Jordan elimination with
/// partial pivoting; None if singular.
pub fn invert(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut m = a.to_vec();
    let mut inv = vec![0.0; n * n];
    for i in 0..n {
        inv[i * n + i] = 1.0;
    }
    let scale = (0..n).map(|i| a[i * n + i].abs()).fold(0.0, f64::max);
    for col in 0..n {
        let p = (col..n).max_by(|&r, &s| m[r * n + col].abs().total_cmp(&m[s * n + col].abs()))?;
        if m[p * n + col].abs() <= 1e-12 * scale {
            return None;
        }
        for c in 0..n {
            m.swap(col * n + c, p * n + c);
            inv.swap(col * n + c, p * n + c);
        }
        let d = m[col * n + col];
        for c in 0..n {
            m[col * n + c] /= d;
            inv[col * n + c] /= d;
        }
        for r in 0..n {
            if r != col {
                let f = m[r * n + col];
                if f != 0.0 {
                    for c in 0..n {
                        m[r * n + c] -= f * m[col * n + c];
                        inv[r * n + c] -= f * inv[col * n + c];
                    }
                }
            }
        }
    }
    Some(inv)
}

/// Standard errors from the curvature: `√diag(s²·(JᵀWJ)⁻¹)` for the Jacobian columns
/// `jac` (scaled to unit norm before inverting); None if `JᵀWJ` is singular.
fn standard_errors(jac: &[Vec<f64>], w: &[f64], s2: f64) -> Option<Vec<f64>> {
    let k = jac.len();
    let norms = column_norms(jac, w);
    let mut g = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..k {
            g[i * k + j] = jac[i]
                .iter()
                .zip(&jac[j])
                .zip(w)
                .map(|((a, b), w)| w * a * b)
                .sum::<f64>()
                / (norms[i] * norms[j]);
        }
    }
    let inv = invert(&g, k)?;
    Some(
        (0..k)
            .map(|i| (s2 * inv[i * k + i]).max(0.0).sqrt() / norms[i])
            .collect(),
    )
}

/// Standard errors of the parameters flagged `active` (the others, held at a bound,
/// get NaN); `cols` are the Jacobian columns of all parameters.
fn active_standard_errors(cols: &[Vec<f64>], active: &[bool], w: &[f64], s2: f64) -> Vec<f64> {
    let jac: Vec<Vec<f64>> = cols
        .iter()
        .zip(active)
        .filter(|(_, &a)| a)
        .map(|(c, _)| c.clone())
        .collect();
    let mut se = vec![f64::NAN; cols.len()];
    if let Some(s) = standard_errors(&jac, w, s2) {
        let mut it = s.into_iter();
        for (e, &a) in se.iter_mut().zip(active) {
            if a {
                *e = it.next().unwrap_or(f64::NAN);
            }
        }
    }
    se
}

/// Residual variance `Σ w r² / (n − k)` with `n` the observations of positive weight
/// (NaN without degrees of freedom).
fn residual_variance(rss: f64, n: usize, k: usize) -> f64 {
    if n > k {
        rss / (n - k) as f64
    } else {
        f64::NAN
    }
}

// ----------------------------------------------------------------------------------------
// Utilization model
// ----------------------------------------------------------------------------------------

/// One power observation for [`fit_util`]: module utilizations, the operating point
/// and the measured power (for example the steady-state power of one kernel).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Utilization of compute, memory and other (see [`MODULES`]), each in `[0, 1]`.
    pub util: [f64; 3],
    /// Core clock, Hz (> 0).
    pub freq_hz: f64,
    /// Core voltage, V (> 0).
    pub volt_v: f64,
    /// Measured power, W.
    pub power_w: f64,
    /// Least-squares weight (≥ 0; 1 for all when unweighted, `1/σ²` for a known noise).
    pub weight: f64,
}

impl Observation {
    /// An observation of weight 1.
    pub fn new(util: [f64; 3], freq_hz: f64, volt_v: f64, power_w: f64) -> Self {
        Observation {
            util,
            freq_hz,
            volt_v,
            power_w,
            weight: 1.0,
        }
    }
}

/// `P = static_w + Σ_m coef[m]·util[m]·f·V²`, fitted by [`fit_util`].
#[derive(Debug, Clone, PartialEq)]
pub struct UtilModel {
    /// Static (utilization-independent) power, W (≥ 0).
    pub static_w: f64,
    /// Per-module coefficient, W/(Hz·V²) = F (≥ 0), in the order of [`MODULES`].
    pub coef: [f64; 3],
    /// Standard error of `static_w`, W (NaN if held at 0).
    pub static_se_w: f64,
    /// Standard errors of `coef` (NaN for a coefficient held at 0).
    pub coef_se: [f64; 3],
    /// Weighted RMS residual `√(Σ w r² / Σ w)`, W.
    pub rms_w: f64,
    /// Observations of positive weight used.
    pub observations: usize,
}

impl UtilModel {
    /// Predicted power, W, at utilizations `util` and the operating point `(f, V)`.
    pub fn predict(&self, util: [f64; 3], freq_hz: f64, volt_v: f64) -> f64 {
        let fv2 = freq_hz * volt_v * volt_v;
        self.static_w + (0..3).map(|m| self.coef[m] * util[m] * fv2).sum::<f64>()
    }

    /// Predicted power, W, at an observation's utilizations and operating point.
    pub fn predict_obs(&self, o: &Observation) -> f64 {
        self.predict(o.util, o.freq_hz, o.volt_v)
    }
}

/// Fits [`UtilModel`] by weighted non-negative least squares on the columns `1` and
/// `u_m·f·V²` (each scaled to unit weighted norm before the Lawson–Hanson solve, since
/// `f·V²` is ~1e9). Standard errors from `s²·(XᵀWX)⁻¹` on the parameters away from 0,
/// `s² = Σ w r² / (n − k)`, `k` those parameters (weights are relative: their scale does
/// not change the fit or the errors).
///
/// Errors: fewer than 5 observations of positive weight (`observations`); a utilization
/// outside `[0, 1]` (`util`); `freq_hz`, `volt_v` not finite and > 0; `power_w` not
/// finite; `weight` negative or not finite.
pub fn fit_util(obs: &[Observation]) -> Result<UtilModel, ParamError> {
    for o in obs {
        for &u in &o.util {
            unit("util", u)?;
        }
        positive("freq_hz", o.freq_hz)?;
        positive("volt_v", o.volt_v)?;
        finite("power_w", o.power_w)?;
        weight(o.weight)?;
    }
    let n = enough(obs.iter().map(|o| o.weight), 5)?;
    let w: Vec<f64> = obs.iter().map(|o| o.weight).collect();
    let y: Vec<f64> = obs.iter().map(|o| o.power_w).collect();
    let mut cols = vec![vec![1.0; obs.len()]];
    for m in 0..3 {
        cols.push(
            obs.iter()
                .map(|o| o.util[m] * o.freq_hz * o.volt_v * o.volt_v)
                .collect(),
        );
    }
    let (x, rss) = nnls_weighted(&cols, &y, &w);
    let active: Vec<bool> = x.iter().map(|&v| v > 0.0).collect();
    let k = active.iter().filter(|&&a| a).count();
    let se = active_standard_errors(&cols, &active, &w, residual_variance(rss, n, k));
    let wsum: f64 = w.iter().sum();
    Ok(UtilModel {
        static_w: x[0],
        coef: [x[1], x[2], x[3]],
        static_se_w: se[0],
        coef_se: [se[1], se[2], se[3]],
        rms_w: (rss / wsum).sqrt(),
        observations: n,
    })
}

// ----------------------------------------------------------------------------------------
// DVFS model with temperature
// ----------------------------------------------------------------------------------------

/// One power observation for [`fit_dvfs`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DvfsObservation {
    /// Utilization of compute, memory and other (see [`MODULES`]), each in `[0, 1]`.
    pub util: [f64; 3],
    /// Core clock, Hz (> 0).
    pub freq_hz: f64,
    /// Core voltage, V (> 0).
    pub volt_v: f64,
    /// Die temperature, °C (in `[−100, 200]`).
    pub temp_c: f64,
    /// Measured power, W.
    pub power_w: f64,
    /// Least-squares weight (≥ 0).
    pub weight: f64,
}

impl DvfsObservation {
    /// An observation of weight 1.
    pub fn new(util: [f64; 3], freq_hz: f64, volt_v: f64, temp_c: f64, power_w: f64) -> Self {
        DvfsObservation {
            util,
            freq_hz,
            volt_v,
            temp_c,
            power_w,
            weight: 1.0,
        }
    }
}

/// `P = const_w + (clock_coef + Σ_m dyn_coef[m]·util[m])·f·V² +
/// leak_w_per_v·V·e^{γ(T − t_ref_c)}`, fitted by [`fit_dvfs`].
#[derive(Debug, Clone, PartialEq)]
pub struct DvfsModel {
    /// Load- and voltage-independent power, W (≥ 0).
    pub const_w: f64,
    /// Load-independent dynamic coefficient `a_clk` (clock tree, always-on logic),
    /// W/(Hz·V²) = F (≥ 0).
    pub clock_coef: f64,
    /// Load-dependent dynamic coefficient `a_m` per module, in the order of [`MODULES`],
    /// W/(Hz·V²) = F (≥ 0).
    pub dyn_coef: [f64; 3],
    /// Leakage per volt at `t_ref_c`, W/V (≥ 0).
    pub leak_w_per_v: f64,
    /// Temperature coefficient of the leakage `γ`, 1/°C, in `[0, GAMMA_MAX_PER_C]`; 0
    /// without the temperature term, or when the leakage is 0 (γ then means nothing).
    pub gamma_per_c: f64,
    /// Reference temperature, °C ([`T_REF_C`]).
    pub t_ref_c: f64,
    /// Whether `γ` was fitted (false: held at 0, leakage ∝ V).
    pub with_temperature: bool,
    /// Standard errors of `(const_w, clock_coef, dyn_coef[0], dyn_coef[1], dyn_coef[2],
    /// leak_w_per_v, gamma_per_c)` from the curvature (Gauss–Newton); NaN for a
    /// parameter at a bound or not fitted.
    pub se: [f64; 7],
    /// Weighted RMS residual `√(Σ w r² / Σ w)`, W.
    pub rms_w: f64,
    /// `γ` at the top of the search range (the data want more: a leakage that grows
    /// faster than the range allows, or a temperature term standing in for something
    /// else).
    pub at_search_edge: bool,
    /// Observations of positive weight used.
    pub observations: usize,
}

impl DvfsModel {
    /// The leakage term `b·V·e^{γ(T − T_ref)}`, W.
    pub fn leakage_w(&self, volt_v: f64, temp_c: f64) -> f64 {
        self.leak_w_per_v * volt_v * (self.gamma_per_c * (temp_c - self.t_ref_c)).exp()
    }

    /// The dynamic term `(a_clk + Σ_m a_m·u_m)·f·V²`, W.
    pub fn dynamic_w(&self, util: [f64; 3], freq_hz: f64, volt_v: f64) -> f64 {
        let c = self.clock_coef
            + self
                .dyn_coef
                .iter()
                .zip(util)
                .map(|(a, u)| a * u)
                .sum::<f64>();
        c * freq_hz * volt_v * volt_v
    }

    /// Predicted power, W.
    pub fn predict(&self, util: [f64; 3], freq_hz: f64, volt_v: f64, temp_c: f64) -> f64 {
        self.const_w + self.dynamic_w(util, freq_hz, volt_v) + self.leakage_w(volt_v, temp_c)
    }

    /// Predicted power at an observation's inputs, W.
    pub fn predict_obs(&self, o: &DvfsObservation) -> f64 {
        self.predict(o.util, o.freq_hz, o.volt_v, o.temp_c)
    }
}

/// Index of the leakage among [`dvfs_columns`] (and in [`DvfsModel::se`]).
const LEAK: usize = 5;

/// The DVFS model's columns at a fixed `γ`: `1`, `f·V²`, `u_m·f·V²` (three),
/// `V·e^{γ(T − T_ref)}`.
fn dvfs_columns(obs: &[DvfsObservation], gamma: f64) -> Vec<Vec<f64>> {
    let fv2 = |o: &DvfsObservation| o.freq_hz * o.volt_v * o.volt_v;
    let mut cols = vec![vec![1.0; obs.len()], obs.iter().map(fv2).collect()];
    for m in 0..3 {
        cols.push(obs.iter().map(|o| o.util[m] * fv2(o)).collect());
    }
    cols.push(leak_column(obs, gamma));
    cols
}

/// The leakage column `V·e^{γ(T − T_ref)}`.
fn leak_column(obs: &[DvfsObservation], gamma: f64) -> Vec<f64> {
    obs.iter()
        .map(|o| o.volt_v * (gamma * (o.temp_c - T_REF_C)).exp())
        .collect()
}

/// Fits [`DvfsModel`]. For a fixed `γ` the model is linear in `(P_const, a_clk, a_m,
/// b)`, solved by weighted NNLS (columns scaled to unit norm); the profile `RSS(γ)` is
/// minimised over `[0, GAMMA_MAX_PER_C]` by a 151-point grid (step 0.001 /°C) and
/// golden-section search between the best grid point's neighbours (to 1e-9 /°C). With
/// `with_temperature = false`, `γ = 0`: leakage ∝ V, the variant without the
/// temperature term.
///
/// `a_clk` and `a_m` are told apart only if the utilizations vary independently of
/// each other (`a_clk` is the dynamic coefficient at zero load), and `P_const` and `b`
/// only if the voltage does; a coefficient the data cannot tell from the others shows up
/// as a large standard error (or NaN, if `JᵀWJ` is singular).
///
/// Standard errors: `s²·(JᵀWJ)⁻¹` over the parameters away from their bounds (`γ`
/// included when fitted, strictly inside its range and `b > 0`), `s² = Σ w r²/(n − k)`.
///
/// Errors: fewer than 8 (with temperature) or 7 observations of positive weight
/// (`observations`: one more than the parameters); a utilization outside `[0, 1]`
/// (`util`); `freq_hz`, `volt_v` not finite and > 0; `temp_c` outside `[−100, 200]`;
/// `power_w` not finite; `weight` negative or not finite.
pub fn fit_dvfs(obs: &[DvfsObservation], with_temperature: bool) -> Result<DvfsModel, ParamError> {
    for o in obs {
        for &u in &o.util {
            unit("util", u)?;
        }
        positive("freq_hz", o.freq_hz)?;
        positive("volt_v", o.volt_v)?;
        if !(TEMP_RANGE_C.0..=TEMP_RANGE_C.1).contains(&o.temp_c) {
            return Err(ParamError::new(
                "temp_c",
                o.temp_c,
                "must lie in [-100, 200] °C",
            ));
        }
        finite("power_w", o.power_w)?;
        weight(o.weight)?;
    }
    let n = enough(
        obs.iter().map(|o| o.weight),
        if with_temperature { 8 } else { 7 },
    )?;
    let w: Vec<f64> = obs.iter().map(|o| o.weight).collect();
    let y: Vec<f64> = obs.iter().map(|o| o.power_w).collect();
    // Only the leakage column depends on γ.
    let mut cols = dvfs_columns(obs, 0.0);
    let mut profile = |g: f64| {
        cols[LEAK] = leak_column(obs, g);
        nnls_weighted(&cols, &y, &w)
    };

    let mut gamma = 0.0;
    let (mut x, mut rss) = profile(0.0);
    if with_temperature {
        // Coarse grid.
        let grid: Vec<f64> = (0..GAMMA_GRID)
            .map(|i| GAMMA_MAX_PER_C * i as f64 / (GAMMA_GRID - 1) as f64)
            .collect();
        let mut best = 0;
        for (i, &g) in grid.iter().enumerate().skip(1) {
            let (xi, ri) = profile(g);
            if ri < rss {
                (best, x, rss, gamma) = (i, xi, ri, g);
            }
        }
        // Golden section between the neighbours of the best grid point.
        let (mut a, mut b) = (
            grid[best.saturating_sub(1)],
            grid[(best + 1).min(GAMMA_GRID - 1)],
        );
        let r = (5f64.sqrt() - 1.0) / 2.0;
        let (mut c, mut d) = (b - r * (b - a), a + r * (b - a));
        let (mut fc, mut fd) = (profile(c).1, profile(d).1);
        while b - a > 1e-9 {
            if fc < fd {
                (b, d, fd) = (d, c, fc);
                c = b - r * (b - a);
                fc = profile(c).1;
            } else {
                (a, c, fc) = (c, d, fd);
                d = a + r * (b - a);
                fd = profile(d).1;
            }
        }
        let g = 0.5 * (a + b);
        let (xg, rg) = profile(g);
        if rg < rss {
            (x, rss, gamma) = (xg, rg, g);
        }
        if x[LEAK] == 0.0 {
            gamma = 0.0; // no leakage term: γ means nothing
        }
    }
    let at_search_edge = with_temperature && gamma >= GAMMA_MAX_PER_C * (1.0 - 1e-6);

    // Standard errors from the Jacobian at the solution.
    let mut jac = dvfs_columns(obs, gamma);
    jac.push(
        obs.iter()
            .map(|o| {
                let dt = o.temp_c - T_REF_C;
                x[LEAK] * o.volt_v * dt * (gamma * dt).exp()
            })
            .collect(),
    );
    let mut active: Vec<bool> = x.iter().map(|&v| v > 0.0).collect();
    active.push(with_temperature && x[LEAK] > 0.0 && gamma > 0.0 && !at_search_edge);
    let k = active.iter().filter(|&&a| a).count();
    let se = active_standard_errors(&jac, &active, &w, residual_variance(rss, n, k));
    let wsum: f64 = w.iter().sum();
    Ok(DvfsModel {
        const_w: x[0],
        clock_coef: x[1],
        dyn_coef: [x[2], x[3], x[4]],
        leak_w_per_v: x[LEAK],
        gamma_per_c: gamma,
        t_ref_c: T_REF_C,
        with_temperature,
        se: [se[0], se[1], se[2], se[3], se[4], se[5], se[6]],
        rms_w: (rss / wsum).sqrt(),
        at_search_edge,
        observations: n,
    })
}

// ----------------------------------------------------------------------------------------
// Execution time against frequency
// ----------------------------------------------------------------------------------------

/// A kernel's execution time against the core clock: `cycles(f) = max_j (α_j + β_j·f)`,
/// `t(f) = cycles(f)/f = max_j (α_j/f + β_j)`. A piece with `β ≈ 0` is compute-bound
/// (time ∝ 1/f), one with `α ≈ 0` memory-bound (time flat in f). Fitted by
/// [`fit_time`] or [`fit_time_pieces`].
#[derive(Debug, Clone, PartialEq)]
pub struct TimeModel {
    /// The pieces `(α cycles, β s)`, in order of increasing `β` (= increasing
    /// frequency: piece `j` is the maximum between `knots_hz()[j − 1]` and
    /// `knots_hz()[j]`).
    pub pieces: Vec<(f64, f64)>,
    /// Residual sum of squares in relative time, `Σ_i ((t_i − t(f_i))/t̄_{f_i})²`, `t̄_f`
    /// the mean of the runs at `f`.
    pub rss: f64,
    /// `√(rss/runs)`: the RMS relative error of a run.
    pub rms_rel: f64,
    /// `runs·ln(rss/runs) + 2·pieces·ln(runs)` (rss floored at `runs·1e-20`).
    pub bic: f64,
    /// Runs fitted.
    pub runs: usize,
    /// Distinct frequencies among them.
    pub frequencies: usize,
}

impl TimeModel {
    /// Cycles at core clock `f`: `max_j (α_j + β_j·f)`.
    pub fn cycles(&self, freq_hz: f64) -> f64 {
        self.pieces
            .iter()
            .map(|(a, b)| a + b * freq_hz)
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// Execution time at core clock `f`, s.
    pub fn time_s(&self, freq_hz: f64) -> f64 {
        self.cycles(freq_hz) / freq_hz
    }

    /// The frequencies where consecutive pieces meet, Hz (one fewer than the pieces).
    pub fn knots_hz(&self) -> Vec<f64> {
        self.pieces
            .windows(2)
            .map(|p| (p[0].0 - p[1].0) / (p[1].1 - p[0].1))
            .collect()
    }
}

/// Runs grouped by distinct frequency, in scaled units: `x = (f − f_0)/(f_{D−1} − f_0)`,
/// cycles / `c_scale`, each run weighted by `(c_scale/m_d)²` for `m_d` the mean cycles at
/// its frequency (so that the residuals are relative times).
struct TimeData {
    /// Distinct frequencies, ascending, Hz.
    f: Vec<f64>,
    /// Scaled frequencies.
    x: Vec<f64>,
    /// Total weight at each frequency.
    w: Vec<f64>,
    /// Weighted mean scaled cycles at each frequency.
    y: Vec<f64>,
    /// Residual sum of squares within the frequencies (the floor of any fit).
    within: f64,
    c_scale: f64,
    runs: usize,
}

impl TimeData {
    fn new(samples: &[(f64, f64)]) -> Result<Self, ParamError> {
        if samples.is_empty() {
            return Err(ParamError::new("samples", 0.0, "no samples"));
        }
        for &(f, t) in samples {
            positive("f_hz", f)?;
            positive("t_s", t)?;
        }
        let mut s: Vec<(f64, f64)> = samples.iter().map(|&(f, t)| (f, t * f)).collect();
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Groups: frequencies within 1e-9 relative of the group's first are one setting.
        let mut groups: Vec<(f64, Vec<f64>)> = Vec::new();
        for (f, c) in s {
            match groups.last_mut() {
                Some((f0, cs)) if f - *f0 <= 1e-9 * *f0 => cs.push(c),
                _ => groups.push((f, vec![c])),
            }
        }
        if groups.len() < 2 {
            return Err(ParamError::new(
                "samples",
                groups.len() as f64,
                "need at least 2 distinct frequencies",
            ));
        }
        let means: Vec<f64> = groups
            .iter()
            .map(|(_, cs)| cs.iter().sum::<f64>() / cs.len() as f64)
            .collect();
        let c_scale = means.iter().fold(0.0, |m: f64, v| m.max(*v));
        let (f0, f1) = (groups[0].0, groups[groups.len() - 1].0);
        let mut d = TimeData {
            f: Vec::new(),
            x: Vec::new(),
            w: Vec::new(),
            y: Vec::new(),
            within: 0.0,
            c_scale,
            runs: samples.len(),
        };
        for ((f, cs), m) in groups.iter().zip(&means) {
            let wr = (c_scale / m).powi(2);
            let ys: Vec<f64> = cs.iter().map(|c| c / c_scale).collect();
            let ybar = ys.iter().sum::<f64>() / ys.len() as f64;
            d.within += wr * ys.iter().map(|v| (v - ybar).powi(2)).sum::<f64>();
            d.f.push(*f);
            d.x.push((f - f0) / (f1 - f0));
            d.w.push(wr * cs.len() as f64);
            d.y.push(ybar);
        }
        Ok(d)
    }

    /// The weighted projection of `v` onto the complement of `span{1, x}`, and the
    /// coefficients `(a, b)` of its projection onto `a + b·x`.
    fn detrend(&self, v: &[f64]) -> (Vec<f64>, f64, f64) {
        let (mut s0, mut s1, mut s2, mut t0, mut t1) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for ((&w, &x), &v) in self.w.iter().zip(&self.x).zip(v) {
            s0 += w;
            s1 += w * x;
            s2 += w * x * x;
            t0 += w * v;
            t1 += w * x * v;
        }
        let det = s0 * s2 - s1 * s1;
        let a = (s2 * t0 - s1 * t1) / det;
        let b = (s0 * t1 - s1 * t0) / det;
        let r = (0..self.x.len())
            .map(|i| v[i] - a - b * self.x[i])
            .collect();
        (r, a, b)
    }

    /// The best fit with hinges `(x − x_q)_+` at the interior indices `hinges` (sorted,
    /// distinct), coefficients ≥ 0, `a + b·x` free.
    fn fit_hinges(&self, hinges: &[usize]) -> HingeFit {
        let d = self.x.len();
        let (yr, _, _) = self.detrend(&self.y);
        let cols: Vec<Vec<f64>> = hinges
            .iter()
            .map(|&q| {
                let h: Vec<f64> = (0..d).map(|i| (self.x[i] - self.x[q]).max(0.0)).collect();
                self.detrend(&h).0
            })
            .collect();
        let (c, _) = nnls_weighted(&cols, &yr, &self.w);
        // The linear part: least squares of y − Σ c_q h_q on 1, x.
        let rest: Vec<f64> = (0..d)
            .map(|i| {
                self.y[i]
                    - hinges
                        .iter()
                        .zip(&c)
                        .map(|(&q, c)| c * (self.x[i] - self.x[q]).max(0.0))
                        .sum::<f64>()
            })
            .collect();
        let (r, a, b) = self.detrend(&rest);
        let rss = (0..d).map(|i| self.w[i] * r[i] * r[i]).sum();
        HingeFit { c, a, b, rss }
    }
}

/// A fit of `a + b·x + Σ c_q (x − x_q)_+` in [`TimeData`]'s scaled units.
struct HingeFit {
    /// Hinge coefficients (≥ 0), in the order of the hinges.
    c: Vec<f64>,
    /// Intercept.
    a: f64,
    /// Slope.
    b: f64,
    /// RSS over the distinct frequencies (without the within-frequency part).
    rss: f64,
}

/// Every choice of `k` distinct items from `0..n`, in lexicographic order.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::with_capacity(k);
    fn rec(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            rec(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    rec(0, n, k, &mut cur, &mut out);
    out
}

/// The exact best max-affine fit of at most `pieces` pieces (see [`fit_time_pieces`]).
fn fit_exact(d: &TimeData, pieces: usize) -> TimeModel {
    let nd = d.x.len();
    let knots = (pieces - 1).min(nd - 1);
    // Best over every choice of `knots` gaps [x_p, x_{p+1}] of the D − 1 gaps.
    let mut best: Option<(Vec<usize>, Vec<usize>, HingeFit)> = None;
    for gaps in combinations(nd - 1, knots) {
        // Hinges at the gaps' ends, interior points only (a hinge at x_0 is linear on the
        // data, one at x_{D−1} is zero there).
        let mut hinges: Vec<usize> = gaps
            .iter()
            .flat_map(|&p| [p, p + 1])
            .filter(|&q| q >= 1 && q + 1 < nd)
            .collect();
        hinges.dedup();
        let fit = d.fit_hinges(&hinges);
        if best
            .as_ref()
            .is_none_or(|bst| fit.rss < bst.2.rss * (1.0 - 1e-12))
        {
            best = Some((gaps, hinges, fit));
        }
    }
    let (gaps, hinges, HingeFit { c, a, b, rss }) = best.expect("at least one choice of gaps");
    // Each gap's knot from its end hinges' coefficients: slope jump c_p + c_{p+1} at the
    // weighted mean of x_p, x_{p+1} (equal on the data); a hinge shared by two gaps goes
    // to the left one.
    let mut coef = vec![0.0; nd];
    for (&q, &v) in hinges.iter().zip(&c) {
        coef[q] = v;
    }
    let tiny = 1e-12 * (b.abs() + c.iter().sum::<f64>()).max(1e-300);
    let mut knots_x: Vec<(f64, f64)> = Vec::new(); // (position, slope jump), scaled units
    for &p in &gaps {
        let (l, r) = (coef[p], coef[p + 1]);
        coef[p] = 0.0;
        coef[p + 1] = 0.0;
        let jump = l + r;
        if jump > tiny {
            knots_x.push(((l * d.x[p] + r * d.x[p + 1]) / jump, jump));
        }
    }
    // Pieces in scaled units, then cycles = c_scale·(a + b·x), x = (f − f_0)/span.
    let mut scaled = vec![(a, b)];
    for &(pos, jump) in &knots_x {
        let &(pa, pb) = scaled.last().expect("one piece");
        scaled.push((pa - jump * pos, pb + jump));
    }
    let f0 = d.f[0];
    let span = d.f[nd - 1] - f0;
    let pieces: Vec<(f64, f64)> = scaled
        .iter()
        .map(|&(a, b)| (d.c_scale * (a - b * f0 / span), d.c_scale * b / span))
        .collect();
    let rss = rss + d.within;
    let n = d.runs as f64;
    let bic = n * (rss.max(n * 1e-20) / n).ln() + 2.0 * pieces.len() as f64 * n.ln();
    TimeModel {
        rms_rel: (rss / n).sqrt(),
        pieces,
        rss,
        bic,
        runs: d.runs,
        frequencies: nd,
    }
}

fn check_pieces(name: &'static str, k: usize) -> Result<(), ParamError> {
    if (1..=MAX_PIECES).contains(&k) {
        Ok(())
    } else {
        Err(ParamError::new(name, k as f64, "must be 1, 2 or 3"))
    }
}

/// The best fit of `cycles(f) = max_j (α_j + β_j·f)` with at most `pieces` pieces
/// (1 to 3) to runs `(f_hz, t_s)`, exactly (the global minimum of the criterion below,
/// not a local one).
///
/// Criterion: least squares on cycles `t·f` weighted by `1/m_f²`, `m_f` the mean cycles
/// of the runs at `f`; that is, on relative time errors `(t − t̂)/t̄_f`. Timing noise is
/// roughly proportional to the duration, and cycles keep the model linear in `(α, β)`.
///
/// Method: on the data a convex piecewise-linear function with a knot anywhere in a gap
/// `[f_p, f_{p+1}]` between consecutive distinct frequencies equals `a + b·f` plus
/// non-negative multiples of the hinges `(f − f_p)_+` and `(f − f_{p+1})_+`. So for each
/// choice of `pieces − 1` gaps the best fit is a small NNLS (hinge coefficients ≥ 0,
/// `a`, `b` free, projected out), and the best over all `C(D − 1, pieces − 1)` choices
/// is the global optimum. This covers both kinds of optimum: pieces that are the
/// separate least-squares lines of contiguous groups meeting between two frequencies,
/// and lines forced to meet at a measured frequency (Hudson 1966). A knot's position
/// within its gap is where the weights put it; a piece resting on one frequency is
/// avoided by putting knots in the first or last gap at `f_1` or `f_{D−2}`. Fewer pieces
/// come back where more do not fit better.
///
/// Errors: no samples or fewer than 2 distinct frequencies (`samples`, frequencies
/// within 1e-9 relative are one); `f_hz` or `t_s` not finite and > 0; `pieces` outside
/// 1..=3.
pub fn fit_time_pieces(samples: &[(f64, f64)], pieces: usize) -> Result<TimeModel, ParamError> {
    check_pieces("pieces", pieces)?;
    let d = TimeData::new(samples)?;
    Ok(fit_exact(&d, pieces))
}

/// [`fit_time_pieces`] for 1 up to `max_pieces` pieces (1 to 3), choosing the number by
/// BIC, `n·ln(RSS/n) + 2K·ln n` over the `n` runs for `K` pieces used (each piece an
/// `(α, β)`), ties to fewer pieces. Pieces are limited to half the distinct frequencies
/// (a piece needs two to rest on). Assumes independent runs with one relative noise level
/// at every frequency: runs correlated within a frequency (a per-setting offset) make
/// every frequency's mean count as many runs and BIC takes too many pieces; average
/// them first then.
///
/// Errors: as [`fit_time_pieces`], `max_pieces` outside 1..=3.
pub fn fit_time(samples: &[(f64, f64)], max_pieces: usize) -> Result<TimeModel, ParamError> {
    check_pieces("max_pieces", max_pieces)?;
    let d = TimeData::new(samples)?;
    let kmax = max_pieces.min((d.x.len() / 2).max(1));
    let mut best = fit_exact(&d, 1);
    for k in 2..=kmax {
        let m = fit_exact(&d, k);
        if m.bic < best.bic {
            best = m;
        }
    }
    Ok(best)
}

// ----------------------------------------------------------------------------------------
// Validation metrics
// ----------------------------------------------------------------------------------------

fn paired(predicted: &[f64], measured: &[f64]) -> Result<(), ParamError> {
    if predicted.len() != measured.len() {
        return Err(ParamError::new(
            "predicted",
            predicted.len() as f64,
            "length differs from measured",
        ));
    }
    if measured.is_empty() {
        return Err(ParamError::new("measured", 0.0, "empty"));
    }
    for &p in predicted {
        finite("predicted", p)?;
    }
    for &m in measured {
        finite("measured", m)?;
    }
    Ok(())
}

/// Mean absolute percentage error, `100·mean_i |p_i − m_i|/|m_i|`, %.
///
/// Errors: lengths differ (`predicted`), empty or zero (`measured`), not finite.
pub fn mean_abs_pct_error(predicted: &[f64], measured: &[f64]) -> Result<f64, ParamError> {
    paired(predicted, measured)?;
    let mut s = 0.0;
    for (&p, &m) in predicted.iter().zip(measured) {
        if m == 0.0 {
            return Err(ParamError::new("measured", m, "must be non-zero"));
        }
        s += ((p - m) / m).abs();
    }
    Ok(100.0 * s / measured.len() as f64)
}

/// Signed error of the total energy, `100·(Σ p_i·d_i − Σ m_i·d_i)/Σ m_i·d_i`, %: powers
/// (W) held over durations `d_i` (s), for example per kernel.
///
/// Errors: lengths differ (`predicted`, `durations_s`), empty (`measured`), not finite,
/// a duration < 0, a measured energy of 0 (`measured`).
pub fn energy_pct_error(
    predicted_w: &[f64],
    measured_w: &[f64],
    durations_s: &[f64],
) -> Result<f64, ParamError> {
    paired(predicted_w, measured_w)?;
    if durations_s.len() != measured_w.len() {
        return Err(ParamError::new(
            "durations_s",
            durations_s.len() as f64,
            "length differs from measured",
        ));
    }
    for &d in durations_s {
        if !(d.is_finite() && d >= 0.0) {
            return Err(ParamError::new("durations_s", d, "must be finite and ≥ 0"));
        }
    }
    let e_p: f64 = predicted_w
        .iter()
        .zip(durations_s)
        .map(|(p, d)| p * d)
        .sum();
    let e_m: f64 = measured_w.iter().zip(durations_s).map(|(m, d)| m * d).sum();
    if e_m == 0.0 {
        return Err(ParamError::new(
            "measured",
            e_m,
            "total energy must be non-zero",
        ));
    }
    Ok(100.0 * (e_p - e_m) / e_m)
}
