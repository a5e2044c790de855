//! railtrace's mathematics: pure, deterministic functions on plain numbers, no I/O.
//!
//! Clocks and profiles (alignment, stitching, binning, run planning):
//!
//! - [`align`]: clock links `y = offset + slope·(x − x0)` fitted robustly from paired
//!   observations (trigger edges) or bracketed timestamp reads, with residuals.
//! - [`stitch`]: FinGraV stitching: readings assigned to executions (a time of interest
//!   per reading), per-bin profiles with Student-t intervals, energies, SSE vs SSP.
//! - [`binning`]: execution-time binning: FinGraV's fixed margin around the median and a
//!   STEM+ROOT-like recursive split with no preset number of clusters.
//! - [`plan`]: the CLT bound on the number of runs (STEM), and the keep-running test.
//! - [`stats`]: normal and Student-t distribution functions, median, MAD.
//!
//! The logger's response, and undoing it:
//!
//! - [`logger`]: identification of a power logger's response against a reference trace
//!   (box, partial window, exponential, non-parametric), chosen by BIC, each parameter
//!   with its standard error.
//! - [`deconvolve`]: a stitched logger profile deconvolved with an identified response
//!   (total variation, power ≥ 0, the idle level before the kernel, λ by a discrepancy
//!   test), with a bootstrap band and the energy per execution.
//!
//! Power and execution-time models:
//!
//! - [`power`]: a utilization model `P_static + Σ c_m·u_m·f·V²` and a DVFS model with a
//!   temperature-dependent leakage, both by non-negative least squares, the execution
//!   time's cycles as an exact max-affine (convex piecewise-linear) fit in frequency,
//!   and error metrics.
//! - [`steps`]: the least-squares step in a window of a reference trace, timed at its
//!   half-way point (DVFS switching latency).
//!
//! All times are in s, powers in W, energies in J. See `README.md` for the assumptions
//! behind each function.

#![warn(missing_docs)]

pub mod align;
pub mod binning;
pub mod deconvolve;
mod envelope;
pub mod logger;
mod par;
pub mod plan;
pub mod power;
pub mod stats;
pub mod steps;
pub mod stitch;

use std::fmt;

/// A parameter out of its documented range (for example a bin width ≤ 0 or a confidence
/// outside `(0, 1)`), or input that leaves nothing to compute with.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamError {
    /// Name of the parameter.
    pub name: &'static str,
    /// The offending value (NaN where the problem is not a single number).
    pub value: f64,
    /// What the value must satisfy.
    pub reason: &'static str,
}

impl ParamError {
    pub(crate) fn new(name: &'static str, value: f64, reason: &'static str) -> Self {
        ParamError {
            name,
            value,
            reason,
        }
    }
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.name, self.value, self.reason)
    }
}

impl std::error::Error for ParamError {}
