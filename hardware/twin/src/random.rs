//! Seeded random draws shared by the models: the PCG-64 generator (`rand_pcg::Pcg64`, a
//! stable algorithm, so a seed gives the same twin on every machine and version).

use std::f64::consts::TAU;

use rand_core::{Rng as _, SeedableRng};
pub use rand_pcg::Pcg64 as Rng;

/// A generator for `seed`, with `stream` separating independent uses of one seed.
pub fn rng(seed: u64, stream: u64) -> Rng {
    Rng::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Uniform in `[0, 1)` from the top 53 bits of one output.
pub fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Standard normal by Box-Muller (two uniforms per draw, the sine half discarded).
pub fn normal(rng: &mut Rng) -> f64 {
    let u1 = 1.0 - uniform(rng); // (0, 1]
    let u2 = uniform(rng);
    (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos()
}
