//! Symmetric matrices kept by their envelope, and their Cholesky factors.
//!
//! Row `i` keeps its columns from `first[i]` to the diagonal; every entry left of
//! `first[i]` is 0. A Cholesky factor has the envelope of its matrix (no fill outside it),
//! so a matrix whose rows reach back `b` columns factors in `O(n·b²)` and solves in
//! `O(n·b)` instead of `O(n³)` and `O(n²)`. The deconvolution's least squares in the
//! segments' levels is such a matrix: two segments further apart than the logger's
//! response is long see no reading in common.

/// A symmetric `n × n` matrix (or a lower-triangular factor) by its envelope.
#[derive(Debug, Clone)]
pub(crate) struct Envelope {
    /// First kept column of each row, `≤` the row.
    first: Vec<usize>,
    /// Where each row's entries start in `v`.
    start: Vec<usize>,
    v: Vec<f64>,
}

impl Envelope {
    /// The matrix with row `i` kept from `first[i]`, entry `(i, j)` (`j ≤ i`) from
    /// `entry(i, j)`.
    pub(crate) fn new(first: Vec<usize>, mut entry: impl FnMut(usize, usize) -> f64) -> Envelope {
        let mut start = Vec::with_capacity(first.len() + 1);
        let mut v = Vec::new();
        for (i, &f) in first.iter().enumerate() {
            debug_assert!(f <= i);
            start.push(v.len());
            v.extend((f..=i).map(|j| entry(i, j)));
        }
        start.push(v.len());
        Envelope { first, start, v }
    }

    pub(crate) fn len(&self) -> usize {
        self.first.len()
    }

    fn row(&self, i: usize) -> &[f64] {
        &self.v[self.start[i]..self.start[i + 1]]
    }

    /// Entry `(i, j)` of the symmetric matrix.
    pub(crate) fn get(&self, i: usize, j: usize) -> f64 {
        let (i, j) = if j > i { (j, i) } else { (i, j) };
        if j < self.first[i] {
            0.0
        } else {
            self.row(i)[j - self.first[i]]
        }
    }

    /// The rows and columns `keep` (ascending) of the symmetric matrix.
    pub(crate) fn restrict(&self, keep: &[usize]) -> Envelope {
        let first = keep
            .iter()
            .map(|&i| keep.partition_point(|&j| j < self.first[i]))
            .collect();
        Envelope::new(first, |a, b| self.get(keep[a], keep[b]))
    }

    /// `A x` for the symmetric matrix.
    pub(crate) fn mul(&self, x: &[f64]) -> Vec<f64> {
        let mut y = vec![0.0; self.len()];
        for i in 0..self.len() {
            let f = self.first[i];
            let row = self.row(i);
            let (diag, left) = row.split_last().expect("a row holds its diagonal");
            y[i] += diag * x[i];
            for (j, a) in (f..i).zip(left) {
                y[i] += a * x[j];
                y[j] += a * x[i];
            }
        }
        y
    }

    /// The Cholesky factor `L` (`A = L Lᵀ`), or None where a pivot is at or below
    /// `1e-15` of the largest diagonal entry (numerically singular).
    pub(crate) fn cholesky(&self) -> Option<Envelope> {
        let n = self.len();
        let scale = (0..n).map(|i| self.get(i, i).abs()).fold(0.0, f64::max);
        if n > 0 && !(scale.is_finite() && scale > 0.0) {
            return None;
        }
        let mut l = self.clone();
        for i in 0..n {
            let fi = l.first[i];
            for j in fi..=i {
                let fj = l.first[j];
                let lo = fi.max(fj);
                let (ri, rj) = (l.start[i], l.start[j]);
                let mut s = l.v[ri + j - fi];
                for p in lo..j {
                    s -= l.v[ri + p - fi] * l.v[rj + p - fj];
                }
                if j < i {
                    s /= l.v[rj + j - fj];
                } else if s.is_nan() || s <= 1e-15 * scale {
                    return None;
                } else {
                    s = s.sqrt();
                }
                l.v[ri + j - fi] = s;
            }
        }
        Some(l)
    }

    /// `L⁻¹ b` for this lower-triangular factor `L`, from `b`'s first entry that is not
    /// 0 (those before it stay 0).
    pub(crate) fn forward(&self, b: &[f64]) -> Vec<f64> {
        let mut y = b.to_vec();
        let from = b.iter().position(|&v| v != 0.0).unwrap_or(b.len());
        for i in from..self.len() {
            let row = self.row(i);
            let (diag, left) = row.split_last().expect("a row holds its diagonal");
            let lo = self.first[i].max(from);
            let acc: f64 = (lo..i)
                .zip(&left[lo - self.first[i]..])
                .map(|(p, a)| a * y[p])
                .sum();
            y[i] = (y[i] - acc) / diag;
        }
        y
    }

    /// `A⁻¹ b` by this Cholesky factor of `A`.
    pub(crate) fn solve(&self, b: &[f64]) -> Vec<f64> {
        let n = self.len();
        let mut y = self.forward(b);
        for i in (0..n).rev() {
            let row = self.row(i);
            let (diag, left) = row.split_last().expect("a row holds its diagonal");
            y[i] /= diag;
            let xi = y[i];
            for (p, a) in (self.first[i]..i).zip(left) {
                y[p] -= a * xi;
            }
        }
        y
    }

    /// `A⁻¹ b` with one step of iterative refinement, or None where `A` is numerically
    /// singular or the result not finite.
    pub(crate) fn solve_refined(&self, b: &[f64]) -> Option<Vec<f64>> {
        let l = self.cholesky()?;
        let mut x = l.solve(b);
        let ax = self.mul(&x);
        let r: Vec<f64> = b.iter().zip(&ax).map(|(b, a)| b - a).collect();
        let dx = l.solve(&r);
        x.iter_mut().zip(&dx).for_each(|(x, d)| *x += d);
        x.iter().all(|v| v.is_finite()).then_some(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        }
    }

    /// A random banded SPD matrix `BᵀB + I` (dense), `B` with `w` entries a row, and the
    /// envelope each row needs.
    fn banded(n: usize, w: usize, rng: &mut Rng) -> (Vec<f64>, Vec<usize>) {
        let mut b = vec![0.0; n * n];
        for i in 0..n {
            for j in i..(i + w).min(n) {
                b[i * n + j] = rng.next();
            }
        }
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (0..n).map(|k| b[k * n + i] * b[k * n + j]).sum::<f64>();
            }
            a[i * n + i] += 1.0;
        }
        let first = (0..n)
            .map(|i| (0..=i).find(|&j| a[i * n + j] != 0.0).unwrap_or(i))
            .collect();
        (a, first)
    }

    /// Against the dense matrix it keeps, to rounding: the product, Cholesky's solve and
    /// a restriction, on banded matrices with a full last row (the offset's).
    #[test]
    fn envelope_solves_as_the_dense_matrix_does() {
        let mut rng = Rng(7);
        for (n, w) in [(1, 1), (5, 2), (40, 4), (120, 9), (60, 60)] {
            let (mut a, mut first) = banded(n, w, &mut rng);
            // A dense last row and column.
            for j in 0..n {
                let v = 0.1 * rng.next();
                if j + 1 < n {
                    a[(n - 1) * n + j] = v;
                    a[j * n + n - 1] = v;
                }
            }
            first[n - 1] = 0;
            let e = Envelope::new(first, |i, j| a[i * n + j]);
            let x: Vec<f64> = (0..n).map(|_| rng.next()).collect();
            let ax: Vec<f64> = (0..n)
                .map(|i| (0..n).map(|j| a[i * n + j] * x[j]).sum())
                .collect();
            for (got, want) in e.mul(&x).iter().zip(&ax) {
                assert!((got - want).abs() <= 1e-12 * (1.0 + want.abs()));
            }
            let solved = e.solve_refined(&ax).unwrap();
            for (got, want) in solved.iter().zip(&x) {
                assert!((got - want).abs() <= 1e-10, "n {n}: {got} against {want}");
            }
            let keep: Vec<usize> = (0..n).filter(|i| i % 3 != 1).collect();
            let r = e.restrict(&keep);
            for (a_, &i) in keep.iter().enumerate() {
                for (b_, &j) in keep.iter().enumerate() {
                    assert_eq!(r.get(a_, b_), a[i * n + j]);
                }
            }
        }
    }

    #[test]
    fn a_singular_matrix_has_no_factor() {
        let e = Envelope::new(vec![0, 0], |_, _| 1.0);
        assert!(e.cholesky().is_none());
        let zero = Envelope::new(vec![0], |_, _| 0.0);
        assert!(zero.solve_refined(&[1.0]).is_none());
    }
}
