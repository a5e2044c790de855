//! Clock alignment: each link between two clocks is a straight line
//! `y = offset + slope·(x − x0)`, fitted robustly from paired observations.
//!
//! The estimator ([`fit_pairs`]):
//!
//! 1. centre: `x0` is the mean of `x`, and `y` is taken relative to its own mean, so
//!    that times of ~1e4 s keep their µs (and ns) digits through the sums;
//! 2. start: Theil–Sen (median of the pairwise slopes; above 1000 points, of the slopes
//!    between points `n/2` apart in `x`), intercept the median of `y − slope·u`;
//! 3. iteratively reweighted least squares with Tukey's bisquare weights, `c = 4.685`
//!    robust standard deviations, the scale re-estimated each pass as 1.4826 × the
//!    median absolute residual; a gross outlier (a dropped or spurious edge) gets weight
//!    0 and no influence;
//! 4. finish: points beyond `c` scales are flagged as outliers and the line is refitted
//!    by plain least squares on the rest, so that the result is exactly the ordinary
//!    least-squares line of the inliers.
//!
//! [`fit_brackets`] turns reads of another clock bracketed by host clock reads into
//! pairs (reading, host midpoint), keeping the tightest brackets, and fits them the same
//! way.

use std::fmt;

use crate::stats::median;

/// Tukey bisquare tuning constant, in robust standard deviations (95 % efficiency at
/// the normal distribution). Residuals beyond it are outliers.
pub const TUKEY_C: f64 = 4.685;

/// Above this many points the Theil–Sen start uses `n/2`-apart pairs instead of all
/// `n(n − 1)/2` pairs.
const FULL_THEIL_SEN_MAX: usize = 1000;

/// A linear map between two clocks: `y = offset + slope·(x − x0)`, all in s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearMap {
    /// The reference point on the `x` clock, s (the mean `x` of the fit).
    pub x0: f64,
    /// The `y` time at `x0`, s.
    pub offset: f64,
    /// `dy/dx` (dimensionless; `1 + 50e-6` for a `y` clock 50 ppm fast against `x`).
    pub slope: f64,
}

impl LinearMap {
    /// The `y` time of `x`.
    pub fn apply(&self, x: f64) -> f64 {
        self.offset + self.slope * (x - self.x0)
    }

    /// The `x` time of `y` (the inverse of [`LinearMap::apply`]).
    pub fn inverse(&self, y: f64) -> f64 {
        self.x0 + (y - self.offset) / self.slope
    }
}

/// A fitted clock link with its residuals.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The fitted map from the `x` clock to the `y` clock.
    pub map: LinearMap,
    /// `y − map.apply(x)` for every observation, in input order, s (for
    /// [`fit_brackets`]: one per read, kept or not).
    pub residuals: Vec<f64>,
    /// Root mean square of the inliers' residuals, s.
    pub rms_s: f64,
    /// Number of observations the final least-squares fit used.
    pub inliers: usize,
    /// Indices (into the input, ascending) of the observations flagged as outliers.
    pub outliers: Vec<usize>,
    /// Indices (into the input, ascending) of the observations the fit considered: all of
    /// them for [`fit_pairs`], the tightest brackets for [`fit_brackets`].
    pub used: Vec<usize>,
}

/// Why a clock link could not be fitted.
#[derive(Debug, Clone, PartialEq)]
pub enum AlignError {
    /// Fewer than two observations (or, for brackets, fewer than two kept).
    TooFew {
        /// How many there were.
        got: usize,
    },
    /// An observation holds a NaN or an infinity.
    NonFinite {
        /// Its index in the input.
        index: usize,
    },
    /// All (inlying) `x` values are equal: the slope is undetermined.
    DegenerateX,
    /// A bracket whose host read after is earlier than the one before.
    BadBracket {
        /// Its index in the input.
        index: usize,
    },
    /// `keep` is not in `(0, 1]`.
    BadKeep {
        /// The value given.
        keep: f64,
    },
}

impl fmt::Display for AlignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AlignError::TooFew { got } => {
                write!(f, "{got} observation(s): a clock link needs at least 2")
            }
            AlignError::NonFinite { index } => {
                write!(f, "observation {index} is not finite")
            }
            AlignError::DegenerateX => write!(f, "all x values are equal: no slope"),
            AlignError::BadBracket { index } => {
                write!(
                    f,
                    "bracket {index}: host read after precedes host read before"
                )
            }
            AlignError::BadKeep { keep } => write!(f, "keep = {keep}: must be in (0, 1]"),
        }
    }
}

impl std::error::Error for AlignError {}

/// One read of another clock bracketed by two host clock reads, all in s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bracket {
    /// Host clock read just before the read was issued.
    pub before: f64,
    /// The other clock's reading (for example GPU ticks / tick_hz).
    pub reading: f64,
    /// Host clock read just after the read returned.
    pub after: f64,
}

/// Fits `y = offset + slope·(x − x0)` to `(x, y)` pairs robustly (see the
/// [module documentation](self)).
///
/// `x` is one clock's time and `y` the other's, in s: for example `x` = device ticks /
/// tick_hz of each trigger edge, `y` = the host time that drove it. Outliers are flagged
/// in [`Fit::outliers`] and do not influence the map.
///
/// # Errors
///
/// [`AlignError::TooFew`] for fewer than 2 pairs, [`AlignError::NonFinite`],
/// [`AlignError::DegenerateX`] when all `x` (or all inlying `x`) are equal.
pub fn fit_pairs(pairs: &[(f64, f64)]) -> Result<Fit, AlignError> {
    if pairs.len() < 2 {
        return Err(AlignError::TooFew { got: pairs.len() });
    }
    if let Some(index) = pairs
        .iter()
        .position(|(x, y)| !x.is_finite() || !y.is_finite())
    {
        return Err(AlignError::NonFinite { index });
    }
    let n = pairs.len() as f64;
    let x0 = pairs.iter().map(|p| p.0).sum::<f64>() / n;
    let y0 = pairs.iter().map(|p| p.1).sum::<f64>() / n;
    let u: Vec<f64> = pairs.iter().map(|p| p.0 - x0).collect();
    let v: Vec<f64> = pairs.iter().map(|p| p.1 - y0).collect();

    let (mut a, mut b) = theil_sen(&u, &v)?;
    // A floor for the scale, so that exact (noise-free) data do not divide by zero:
    // far below any clock's resolution, relative to the magnitudes involved.
    let floor = 1e-13 * v.iter().fold(0.0_f64, |m, x| m.max(x.abs())) + f64::MIN_POSITIVE;
    let span = u.iter().fold(0.0_f64, |m, x| m.max(x.abs()));
    let mut weights = vec![1.0; u.len()];
    let mut scale = floor;
    for _ in 0..100 {
        let r: Vec<f64> = u.iter().zip(&v).map(|(u, v)| v - (a + b * u)).collect();
        let abs_r: Vec<f64> = r.iter().map(|r| r.abs()).collect();
        scale = (1.482_602_218_505_602 * median(&abs_r)).max(floor);
        for (w, r) in weights.iter_mut().zip(&r) {
            let z = r / (TUKEY_C * scale);
            *w = if z.abs() < 1.0 {
                (1.0 - z * z).powi(2)
            } else {
                0.0
            };
        }
        let (na, nb) = weighted_ls(&u, &v, &weights)?;
        let change = (na - a).abs() + (nb - b).abs() * span;
        a = na;
        b = nb;
        if change <= 1e-9 * scale {
            break;
        }
    }
    // Flag, then refit the inliers by ordinary least squares.
    let outliers: Vec<usize> = (0..u.len())
        .filter(|&i| (v[i] - (a + b * u[i])).abs() > TUKEY_C * scale)
        .collect();
    let inlier_w: Vec<f64> = (0..u.len())
        .map(|i| {
            if outliers.binary_search(&i).is_ok() {
                0.0
            } else {
                1.0
            }
        })
        .collect();
    let (a, b) = weighted_ls(&u, &v, &inlier_w)?;
    let map = LinearMap {
        x0,
        offset: y0 + a,
        slope: b,
    };
    let residuals: Vec<f64> = u.iter().zip(&v).map(|(u, v)| v - (a + b * u)).collect();
    let inliers = u.len() - outliers.len();
    let ss: f64 = residuals
        .iter()
        .zip(&inlier_w)
        .map(|(r, w)| w * r * r)
        .sum();
    Ok(Fit {
        map,
        residuals,
        rms_s: (ss / inliers as f64).sqrt(),
        inliers,
        outliers,
        used: (0..pairs.len()).collect(),
    })
}

/// Fits a clock link from reads bracketed by host clock reads: keeps the `keep`
/// fraction (in `(0, 1]`, e.g. 0.2; at least 2 reads) with the tightest brackets
/// (smallest `after − before`), takes the host midpoint as `y` and the reading as `x`,
/// and fits them with [`fit_pairs`].
///
/// The midpoint is right when the other clock latches halfway through the bracket; any
/// asymmetry is an error of at most half the bracket, which is why tight brackets are
/// kept. In the returned [`Fit`], `residuals` has one entry per read (kept or not),
/// `outliers` and `used` index `reads`.
///
/// # Errors
///
/// [`AlignError::BadKeep`], [`AlignError::NonFinite`], [`AlignError::BadBracket`], and
/// those of [`fit_pairs`].
pub fn fit_brackets(reads: &[Bracket], keep: f64) -> Result<Fit, AlignError> {
    if !(keep > 0.0 && keep <= 1.0) {
        return Err(AlignError::BadKeep { keep });
    }
    for (index, r) in reads.iter().enumerate() {
        if !(r.before.is_finite() && r.reading.is_finite() && r.after.is_finite()) {
            return Err(AlignError::NonFinite { index });
        }
        if r.after < r.before {
            return Err(AlignError::BadBracket { index });
        }
    }
    if reads.len() < 2 {
        return Err(AlignError::TooFew { got: reads.len() });
    }
    let n_keep = ((keep * reads.len() as f64).ceil() as usize).clamp(2, reads.len());
    let mut order: Vec<usize> = (0..reads.len()).collect();
    // Stable: equal widths keep input order.
    order.sort_by(|&i, &j| width(&reads[i]).total_cmp(&width(&reads[j])));
    let mut used = order[..n_keep].to_vec();
    used.sort_unstable();
    let pairs: Vec<(f64, f64)> = used
        .iter()
        .map(|&i| (reads[i].reading, midpoint(&reads[i])))
        .collect();
    let fit = fit_pairs(&pairs)?;
    let residuals = reads
        .iter()
        .map(|r| midpoint(r) - fit.map.apply(r.reading))
        .collect();
    Ok(Fit {
        map: fit.map,
        residuals,
        rms_s: fit.rms_s,
        inliers: fit.inliers,
        outliers: fit.outliers.iter().map(|&k| used[k]).collect(),
        used,
    })
}

fn width(r: &Bracket) -> f64 {
    r.after - r.before
}

fn midpoint(r: &Bracket) -> f64 {
    r.before + 0.5 * (r.after - r.before)
}

/// Theil–Sen line `v = a + b·u`: `b` the median of pairwise slopes, `a` the median of
/// `v − b·u`.
fn theil_sen(u: &[f64], v: &[f64]) -> Result<(f64, f64), AlignError> {
    let n = u.len();
    let mut slopes = Vec::new();
    if n <= FULL_THEIL_SEN_MAX {
        for i in 0..n {
            for j in i + 1..n {
                if u[j] != u[i] {
                    slopes.push((v[j] - v[i]) / (u[j] - u[i]));
                }
            }
        }
    } else {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&i, &j| u[i].total_cmp(&u[j]));
        let h = n / 2;
        for k in 0..n - h {
            let (i, j) = (order[k], order[k + h]);
            if u[j] != u[i] {
                slopes.push((v[j] - v[i]) / (u[j] - u[i]));
            }
        }
    }
    if slopes.is_empty() {
        return Err(AlignError::DegenerateX);
    }
    let b = median(&slopes);
    let intercepts: Vec<f64> = u.iter().zip(v).map(|(u, v)| v - b * u).collect();
    Ok((median(&intercepts), b))
}

/// Weighted least squares `v = a + b·u`; centred sums.
pub(crate) fn weighted_ls(u: &[f64], v: &[f64], w: &[f64]) -> Result<(f64, f64), AlignError> {
    let sw: f64 = w.iter().sum();
    if sw <= 0.0 {
        return Err(AlignError::DegenerateX);
    }
    let mu = u.iter().zip(w).map(|(u, w)| w * u).sum::<f64>() / sw;
    let mv = v.iter().zip(w).map(|(v, w)| w * v).sum::<f64>() / sw;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for ((u, v), w) in u.iter().zip(v).zip(w) {
        sxx += w * (u - mu) * (u - mu);
        sxy += w * (u - mu) * (v - mv);
    }
    if sxx <= 0.0 {
        return Err(AlignError::DegenerateX);
    }
    let b = sxy / sxx;
    Ok((mv - b * mu, b))
}
