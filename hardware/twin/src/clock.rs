//! The microcontroller's clock: a nominal rate with a frequency error and a drift, as a
//! real crystal has. The twin's reference time ("true time", seconds since the twin
//! started) is the host's monotonic clock; device ticks are derived from it.

use serde::Deserialize;

/// The MCU clock's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McuClockConfig {
    /// Nominal tick rate, Hz: what DeviceInfo reports (84 MHz on the STM32F405). In a
    /// scenario, 0 or left out takes the rig's `board.tick_hz`.
    #[serde(default)]
    pub tick_hz: u32,
    /// Frequency error at start, parts per million (a crystal: ±10 to ±50); at most
    /// ±10 000 in a scenario.
    #[serde(default)]
    pub error_ppm: f64,
    /// Change of the frequency error, ppm per second (temperature drift); at most
    /// [`MAX_DRIFT_PPM_PER_S`](crate::scenario::MAX_DRIFT_PPM_PER_S) either way in a
    /// scenario.
    #[serde(default)]
    pub drift_ppm_per_s: f64,
    /// Ticks already counted at true time 0 (the MCU booted earlier); at most
    /// [`MAX_UPTIME_S`](crate::gpu::MAX_UPTIME_S) of ticks in a scenario.
    #[serde(default)]
    pub offset_ticks: u64,
}

fn default_tick_hz() -> u32 {
    84_000_000
}

impl Default for McuClockConfig {
    fn default() -> Self {
        McuClockConfig {
            tick_hz: default_tick_hz(),
            error_ppm: 0.0,
            drift_ppm_per_s: 0.0,
            offset_ticks: 0,
        }
    }
}

impl McuClockConfig {
    /// Ticks counted at true time `t_s` (the integral of the instantaneous rate
    /// `tick_hz × (1 + (error_ppm + drift_ppm_per_s × t) × 1e-6)`), rounded down.
    pub fn ticks_at(&self, t_s: f64) -> u64 {
        self.offset_ticks + self.elapsed(t_s).max(0.0).floor() as u64
    }

    fn elapsed(&self, t_s: f64) -> f64 {
        let f = f64::from(self.tick_hz);
        f * (t_s + 1e-6 * (self.error_ppm * t_s + 0.5 * self.drift_ppm_per_s * t_s * t_s))
    }

    /// The true time at which the clock reaches `ticks` (the inverse of [`Self::ticks_at`],
    /// by Newton's method: the rate changes by parts per million, so three steps reach
    /// double precision).
    pub fn time_at(&self, ticks: u64) -> f64 {
        let target = ticks.saturating_sub(self.offset_ticks) as f64;
        let f = f64::from(self.tick_hz);
        let mut t = target / f;
        for _ in 0..4 {
            let rate = f * (1.0 + 1e-6 * (self.error_ppm + self.drift_ppm_per_s * t));
            t -= (self.elapsed(t) - target) / rate;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_error_and_drift_are_what_they_say() {
        let c = McuClockConfig {
            tick_hz: 84_000_000,
            error_ppm: 50.0,
            drift_ppm_per_s: 0.0,
            offset_ticks: 7,
        };
        // 100 s at +50 ppm: 84e8 ticks and 50e-6 of that more.
        assert_eq!(c.ticks_at(100.0), 7 + 8_400_000_000 + 420_000);
        let d = McuClockConfig {
            drift_ppm_per_s: 0.1,
            ..c
        };
        // The error grows to 60 ppm over 100 s: on average 55 ppm.
        let extra = d.ticks_at(100.0) as f64 - 7.0 - 8.4e9;
        assert!((extra - 8.4e9 * 55e-6).abs() < 1.0, "{extra}");
    }

    #[test]
    fn time_at_inverts_ticks_at() {
        let c = McuClockConfig {
            tick_hz: 84_000_000,
            error_ppm: -37.0,
            drift_ppm_per_s: 0.02,
            offset_ticks: 1_000_000,
        };
        for t in [0.0, 1e-6, 0.5, 10.0, 3600.0] {
            let ticks = c.ticks_at(t);
            let back = c.time_at(ticks);
            // ticks_at rounds down: back is at most one tick (12 ns) before t.
            assert!(
                back <= t + 1e-12 && t - back < 1.0 / 84e6 + 1e-12,
                "{t} -> {back}"
            );
        }
    }
}
