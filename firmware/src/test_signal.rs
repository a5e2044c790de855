//! A deterministic signal in place of the ADC, for boards without one (QEMU) and for
//! tests. DeviceInfo reports it with the `TEST_SIGNAL` flag.
//!
//! Conversion `n` (counted from the start of the run) gives channel `c` the code
//! `test_code(c, n)`: a sawtooth that climbs by `64 × (c + 1)` per conversion and wraps in
//! the i16 range, so a host can check every sample exactly and see any gap or swap.

use crate::hw::{ErrorKind, SampleSource, CHANNELS};

/// The code of channel `channel` at conversion `n`.
pub fn test_code(channel: usize, n: u64) -> i16 {
    let step = 64u64 * (channel as u64 + 1);
    (n.wrapping_mul(step) & 0xFFFF) as u16 as i16
}

/// The test signal source.
#[derive(Debug, Default, Clone)]
pub struct TestSignal {
    n: u64,
}

impl TestSignal {
    /// Starts at conversion 0.
    pub fn new() -> Self {
        Self::default()
    }
    /// Conversions made so far in this run.
    pub fn conversions(&self) -> u64 {
        self.n
    }
    /// Starts over at conversion 0.
    pub fn restart(&mut self) {
        self.n = 0;
    }
}

impl SampleSource for TestSignal {
    type Error = ErrorKind;
    fn restart(&mut self) {
        TestSignal::restart(self);
    }
    fn convert(&mut self) -> Result<[i16; CHANNELS], ErrorKind> {
        let n = self.n;
        self.n += 1;
        let mut codes = [0i16; CHANNELS];
        for (c, code) in codes.iter_mut().enumerate() {
            *code = test_code(c, n);
        }
        Ok(codes)
    }
}
