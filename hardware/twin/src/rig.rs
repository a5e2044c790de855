//! The rig: how the GPU's power reaches the ADC.
//!
//! Two kinds of data, kept apart:
//! - [`RigDescription`]: the rig as built, from `hardware/rigs/*.toml`: its rails, which
//!   ADC channel senses what, and each sensor's nominal sensitivity. The host reads the
//!   same file to turn codes into amperes, volts and watts.
//! - [`RigTruth`]: what the twin knows and the host does not: how the GPU's power splits
//!   over the rails, each rail's source resistance, the board's input filtering, and each
//!   sensor's real gain error, offset, bandwidth and noise.
//!
//! [`FrontEnd`] combines them with the GPU's true power into the eight voltages at the
//! ADC's inputs, at any instant, walking time forward.

use serde::Deserialize;

use crate::adc::Analog;
use crate::random::{normal, Rng};
use crate::trace::{Segment, StreamCursor};
use railtrace_firmware::CHANNELS;

/// A rig description (`hardware/rigs/*.toml`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RigDescription {
    /// Short name.
    pub name: String,
    /// What the rig is, for people.
    #[serde(default)]
    pub description: String,
    /// The ADC.
    pub adc: AdcDescription,
    /// The rails the rig measures.
    #[serde(rename = "rail")]
    pub rails: Vec<RailDescription>,
    /// What each ADC channel senses.
    #[serde(rename = "channel")]
    pub channels: Vec<ChannelDescription>,
    /// Trigger lines.
    #[serde(rename = "trigger", default)]
    pub triggers: Vec<TriggerDescription>,
}

/// The ADC of the rig.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdcDescription {
    /// Part number, e.g. `AD7606`.
    pub part: String,
    /// Input range: ± this many volts.
    pub range_v: f64,
    /// Resolution in bits.
    pub bits: u8,
}

/// One power rail.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RailDescription {
    /// Name, e.g. `slot_12v`.
    pub name: String,
    /// Nominal voltage, V.
    pub nominal_v: f64,
}

/// What a channel measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Measures {
    /// The rail's current.
    Current,
    /// The rail's voltage.
    Voltage,
}

/// One ADC channel.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelDescription {
    /// ADC channel, 0-7.
    pub index: u8,
    /// The rail it senses (a `rail.name`).
    pub rail: String,
    /// Current or voltage.
    pub measures: Measures,
    /// The sensor, for people (e.g. `INA240A1 + 2.5 mΩ shunt`).
    #[serde(default)]
    pub sensor: String,
    /// Volts at the ADC per ampere (current) or per volt of the rail (voltage, i.e. the
    /// divider ratio).
    pub sensitivity: f64,
    /// Nominal bandwidth of the sensor, Hz (first-order).
    pub bandwidth_hz: f64,
}

/// One trigger line.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerDescription {
    /// Line number.
    pub line: u8,
    /// `input` (to the rig) or `output` (from the rig).
    pub direction: String,
    /// What it is wired to.
    #[serde(default)]
    pub name: String,
}

/// Why a rig description is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RigError {
    /// A channel names a rail the description does not have.
    #[error("channel {channel} senses rail `{rail}`, which is not among the rails")]
    UnknownRail {
        /// The channel.
        channel: u8,
        /// The rail named.
        rail: String,
    },
    /// A channel index out of range or used twice.
    #[error("channel {0} is out of range (0-7) or described twice")]
    BadChannel(u8),
    /// A value that must be positive and finite is not.
    #[error("{0} must be positive and finite")]
    NotPositive(String),
    /// The rig truth does not match the description.
    #[error("{0}")]
    Mismatch(String),
}

impl RigDescription {
    /// Checks the cross references and values.
    pub fn validate(&self) -> Result<(), RigError> {
        let a = &self.adc;
        if a.bits != 16 || !(a.range_v == 5.0 || a.range_v == 10.0) {
            return Err(RigError::Mismatch(format!(
                "adc: the AD7606 has 16 bits and a ±5 V or ±10 V range, not {} bits ±{} V",
                a.bits, a.range_v
            )));
        }
        for t in &self.triggers {
            if t.direction != "input" && t.direction != "output" {
                return Err(RigError::Mismatch(format!(
                    "trigger line {}: direction must be \"input\" or \"output\", not {:?}",
                    t.line, t.direction
                )));
            }
        }
        let mut rails: Vec<&str> = self.rails.iter().map(|r| r.name.as_str()).collect();
        rails.sort_unstable();
        if let Some(w) = rails.windows(2).find(|w| w[0] == w[1]) {
            return Err(RigError::Mismatch(format!(
                "rail `{}` is described twice",
                w[0]
            )));
        }
        let mut seen = [false; CHANNELS];
        for c in &self.channels {
            let slot = seen
                .get_mut(usize::from(c.index))
                .ok_or(RigError::BadChannel(c.index))?;
            if *slot {
                return Err(RigError::BadChannel(c.index));
            }
            *slot = true;
            if !self.rails.iter().any(|r| r.name == c.rail) {
                return Err(RigError::UnknownRail {
                    channel: c.index,
                    rail: c.rail.clone(),
                });
            }
            for (what, v) in [
                ("sensitivity", c.sensitivity),
                ("bandwidth_hz", c.bandwidth_hz),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(RigError::NotPositive(format!("channel {} {what}", c.index)));
                }
            }
        }
        for r in &self.rails {
            if !(r.nominal_v.is_finite() && r.nominal_v > 0.0) {
                return Err(RigError::NotPositive(format!("rail {} nominal_v", r.name)));
            }
        }
        Ok(())
    }
}

/// What the twin knows about the rig and the host does not.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RigTruth {
    /// Time constant of the GPU board's input filter as seen from the rails (its input
    /// capacitance against the rail's impedance), s: the rail current is the GPU's
    /// current through a first-order low-pass of this time constant.
    #[serde(default = "default_input_tau")]
    pub input_tau_s: f64,
    /// Per rail, in the order of the description's rails.
    #[serde(rename = "rail", default)]
    pub rails: Vec<RailTruth>,
    /// Per channel (by index): the sensor's real imperfections.
    #[serde(rename = "channel", default)]
    pub channels: Vec<ChannelTruth>,
}

fn default_input_tau() -> f64 {
    5e-6
}

/// One rail's truth.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RailTruth {
    /// Rail name (as in the description).
    pub name: String,
    /// Fraction of the GPU's power drawn from this rail (all rails sum to 1).
    pub share: f64,
    /// Supply voltage at no load, V.
    pub source_v: f64,
    /// Source resistance (supply and cabling), Ω: the rail sags by current × this.
    #[serde(default)]
    pub resistance_ohm: f64,
}

/// One sensor's truth.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelTruth {
    /// ADC channel.
    pub index: u8,
    /// Relative gain error (0.01 = reads 1 % high).
    #[serde(default)]
    pub gain_error: f64,
    /// Offset at the ADC input, V.
    #[serde(default)]
    pub offset_v: f64,
    /// White noise at the ADC input, V RMS per sample.
    #[serde(default)]
    pub noise_v_rms: f64,
    /// Real bandwidth, Hz (default: the nominal one).
    #[serde(default)]
    pub bandwidth_hz: Option<f64>,
}

struct Rail {
    share: f64,
    source_v: f64,
    resistance_ohm: f64,
    current_a: f64,
}

struct Channel {
    index: usize,
    rail: usize,
    measures: Measures,
    volts_per_unit: f64,
    offset_v: f64,
    noise_v_rms: f64,
    tau_s: f64,
    out_v: f64,
}

/// The true state of the rails at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RailState {
    /// Current drawn, A.
    pub current_a: f64,
    /// Voltage at the sensing point, V.
    pub voltage_v: f64,
}

/// The analog path from the GPU's power to the ADC inputs, walked forward in time.
pub struct FrontEnd<F> {
    next_segment: F,
    trace: StreamCursor,
    rails: Vec<Rail>,
    channels: Vec<Channel>,
    input_tau_s: f64,
    t_s: f64,
    last_s: f64,
    rng: Rng,
}

impl<F> std::fmt::Debug for FrontEnd<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontEnd")
            .field("t_s", &self.t_s)
            .finish_non_exhaustive()
    }
}

impl<F: FnMut() -> Segment> FrontEnd<F> {
    /// The front end of `rig` with `truth`, drawing the GPU's power from `next_segment`
    /// (which must start at time 0), with sensor noise from `rng`.
    pub fn new(
        rig: &RigDescription,
        truth: &RigTruth,
        next_segment: F,
        rng: Rng,
    ) -> Result<Self, RigError> {
        rig.validate()?;
        let mut rails = Vec::new();
        for r in &rig.rails {
            let t = truth
                .rails
                .iter()
                .find(|t| t.name == r.name)
                .ok_or_else(|| {
                    RigError::Mismatch(format!(
                        "the rig truth has no [[rig.rail]] for rail `{}`",
                        r.name
                    ))
                })?;
            rails.push(Rail {
                share: t.share,
                source_v: t.source_v,
                resistance_ohm: t.resistance_ohm,
                current_a: 0.0,
            });
        }
        let total: f64 = rails.iter().map(|r| r.share).sum();
        if (total - 1.0).abs() > 1e-9 {
            return Err(RigError::Mismatch(format!(
                "the rails' shares add up to {total}, not 1"
            )));
        }
        let mut channels = Vec::new();
        for c in &rig.channels {
            let t = truth.channels.iter().find(|t| t.index == c.index);
            let bandwidth = t.and_then(|t| t.bandwidth_hz).unwrap_or(c.bandwidth_hz);
            channels.push(Channel {
                index: usize::from(c.index),
                rail: rig.rails.iter().position(|r| r.name == c.rail).unwrap_or(0),
                measures: c.measures,
                volts_per_unit: c.sensitivity * (1.0 + t.map_or(0.0, |t| t.gain_error)),
                offset_v: t.map_or(0.0, |t| t.offset_v),
                noise_v_rms: t.map_or(0.0, |t| t.noise_v_rms),
                tau_s: 1.0 / (std::f64::consts::TAU * bandwidth),
                out_v: 0.0,
            });
        }
        let mut fe = FrontEnd {
            next_segment,
            trace: StreamCursor::new(),
            rails,
            channels,
            input_tau_s: truth.input_tau_s.max(0.0),
            t_s: 0.0,
            last_s: 0.0,
            rng,
        };
        fe.settle();
        Ok(fe)
    }

    /// Starts the filters at their steady state for the power at time 0.
    fn settle(&mut self) {
        let p = self.mean_power(0.0, 1e-9);
        for r in &mut self.rails {
            r.current_a = current(p * r.share, r.source_v, r.resistance_ohm);
        }
        for i in 0..self.channels.len() {
            let target = self.target(i);
            if let Some(c) = self.channels.get_mut(i) {
                c.out_v = target;
            }
        }
    }

    fn mean_power(&mut self, a_s: f64, b_s: f64) -> f64 {
        let next = &mut self.next_segment;
        if self.trace.fill_until(b_s, &mut *next).is_err() {
            return 0.0;
        }
        if b_s > a_s {
            self.trace.energy_between(a_s, b_s).unwrap_or(0.0) / (b_s - a_s)
        } else {
            self.trace.power_at(a_s).unwrap_or(0.0)
        }
    }

    fn target(&self, i: usize) -> f64 {
        let Some(c) = self.channels.get(i) else {
            return 0.0;
        };
        let Some(r) = self.rails.get(c.rail) else {
            return 0.0;
        };
        let value = match c.measures {
            Measures::Current => r.current_a,
            Measures::Voltage => r.source_v - r.current_a * r.resistance_ohm,
        };
        value * c.volts_per_unit + c.offset_v
    }

    /// Moves time to `t_s` (never backwards): the next [`Analog::sample`] is taken then.
    pub fn set_time(&mut self, t_s: f64) {
        self.t_s = t_s.max(self.t_s);
    }

    /// Moves time to `t_s` and brings the filters (and the GPU behind them) up to it,
    /// without taking a sample: time goes on while the ADC is idle.
    pub fn catch_up(&mut self, t_s: f64) {
        self.set_time(t_s);
        self.advance();
    }

    /// The rails now.
    pub fn rails(&self) -> Vec<RailState> {
        self.rails
            .iter()
            .map(|r| RailState {
                current_a: r.current_a,
                voltage_v: r.source_v - r.current_a * r.resistance_ohm,
            })
            .collect()
    }

    /// Advances the filters from the last instant to the current time, with the GPU's mean
    /// power over the step as input (exact for a first-order filter when the power is
    /// constant over the step; the steps are one sample period).
    fn advance(&mut self) {
        let (a, b) = (self.last_s, self.t_s);
        if b <= a {
            return;
        }
        let dt = b - a;
        let p = self.mean_power(a, b);
        let k_in = if self.input_tau_s > 0.0 {
            1.0 - (-dt / self.input_tau_s).exp()
        } else {
            1.0
        };
        for r in &mut self.rails {
            let target = current(p * r.share, r.source_v, r.resistance_ohm);
            r.current_a += (target - r.current_a) * k_in;
        }
        for i in 0..self.channels.len() {
            let target = self.target(i);
            if let Some(c) = self.channels.get_mut(i) {
                c.out_v += (target - c.out_v) * (1.0 - (-dt / c.tau_s).exp());
            }
        }
        self.last_s = b;
    }
}

/// Current that delivers `power_w` at the load from a source of `v` volts behind `r` Ω:
/// the smaller root of `r I² - v I + P = 0` (P = I (v - I r)).
fn current(power_w: f64, v: f64, r: f64) -> f64 {
    if r <= 0.0 {
        return power_w / v;
    }
    let disc = (v * v - 4.0 * r * power_w).max(0.0);
    (v - disc.sqrt()) / (2.0 * r)
}

impl<F: FnMut() -> Segment> Analog for FrontEnd<F> {
    fn sample(&mut self) -> [f64; CHANNELS] {
        self.advance();
        let mut v = [0.0; CHANNELS];
        for c in &self.channels {
            let n = if c.noise_v_rms > 0.0 {
                c.noise_v_rms * normal(&mut self.rng)
            } else {
                0.0
            };
            if let Some(slot) = v.get_mut(c.index) {
                *slot = c.out_v + n;
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::rng;
    use crate::trace::Util;

    fn rig() -> RigDescription {
        toml::from_str(include_str!("../../rigs/pcie-2x8pin.toml")).unwrap()
    }

    fn truth(noise: f64) -> RigTruth {
        let mut t: RigTruth = toml::from_str(
            r#"
            input_tau_s = 5e-6
            [[rail]]
            name = "slot_12v"
            share = 0.1
            source_v = 12.0
            [[rail]]
            name = "slot_3v3"
            share = 0.02
            source_v = 3.3
            [[rail]]
            name = "cable1_12v"
            share = 0.44
            source_v = 12.1
            resistance_ohm = 0.004
            [[rail]]
            name = "cable2_12v"
            share = 0.44
            source_v = 12.1
            resistance_ohm = 0.004
            "#,
        )
        .unwrap();
        for index in 0..8 {
            t.channels.push(ChannelTruth {
                index,
                gain_error: 0.0,
                offset_v: 0.0,
                noise_v_rms: noise,
                bandwidth_hz: None,
            });
        }
        t
    }

    /// A constant `p` watts forever, in 1 ms segments.
    fn constant(p: f64) -> impl FnMut() -> Segment {
        let mut t = 0.0;
        move || {
            let s = Segment {
                start_s: t,
                end_s: t + 1e-3,
                power_w: p,
                util: Util::IDLE,
            };
            t += 1e-3;
            s
        }
    }

    #[test]
    fn steady_power_gives_the_exact_rail_currents_and_voltages() {
        let rig = rig();
        let mut fe = FrontEnd::new(&rig, &truth(0.0), constant(500.0), rng(1, 0)).unwrap();
        fe.set_time(0.01);
        let v = fe.sample();
        // Slot 12 V: 50 W from a stiff 12 V source, 50 mV/A sensor: 4.1667 A -> 0.2083 V.
        assert!((v[0] - 50.0 / 12.0 * 0.05).abs() < 1e-9, "{}", v[0]);
        assert!((v[1] - 12.0 * 0.5).abs() < 1e-9);
        // Cable 1: 220 W from 12.1 V behind 4 mΩ: I (12.1 - 0.004 I) = 220.
        let i = v[4] / 0.05;
        assert!((i * (12.1 - 0.004 * i) - 220.0).abs() < 1e-6, "{i}");
        assert!((v[5] - (12.1 - 0.004 * i) * 0.5).abs() < 1e-9);
        // Power computed as the host will, from the nominal sensitivities, adds up.
        let rails = fe.rails();
        let total: f64 = rails.iter().map(|r| r.current_a * r.voltage_v).sum();
        assert!((total - 500.0).abs() < 1e-6, "{total}");
    }

    #[test]
    fn noise_has_the_stated_rms_and_no_bias() {
        let rig = rig();
        let mut fe = FrontEnd::new(&rig, &truth(1e-3), constant(300.0), rng(7, 0)).unwrap();
        let clean = 300.0 * 0.1 / 12.0 * 0.05;
        let n = 20_000;
        let (mut sum, mut sq) = (0.0, 0.0);
        for k in 1..=n {
            fe.set_time(f64::from(k) * 1e-5);
            let e = fe.sample()[0] - clean;
            sum += e;
            sq += e * e;
        }
        let mean = sum / f64::from(n);
        let rms = (sq / f64::from(n)).sqrt();
        // Standard errors: mean 1e-3 / sqrt(n) = 7 µV; RMS 1e-3 / sqrt(2n) = 0.5 %.
        assert!(mean.abs() < 4.0 * 1e-3 / (f64::from(n)).sqrt(), "{mean}");
        assert!((rms / 1e-3 - 1.0).abs() < 0.02, "{rms}");
    }

    #[test]
    fn a_power_step_reaches_the_adc_through_two_first_order_filters() {
        // 100 W until 1 ms, then 400 W; read the slot current every microsecond.
        let mut t = 0.0;
        let steps = move || {
            let (p, end) = if t < 1e-3 {
                (100.0, 1e-3)
            } else {
                (400.0, t + 1.0)
            };
            let s = Segment {
                start_s: t,
                end_s: end,
                power_w: p,
                util: Util::IDLE,
            };
            t = end;
            s
        };
        let rig = rig();
        let mut fe = FrontEnd::new(&rig, &truth(0.0), steps, rng(1, 0)).unwrap();
        let tau_in = 5e-6;
        let tau_s = 1.0 / (std::f64::consts::TAU * 200e3); // the sensor's 200 kHz
        let (lo, hi) = (100.0 * 0.1 / 12.0 * 0.05, 400.0 * 0.1 / 12.0 * 0.05);
        let mut worst: f64 = 0.0;
        for k in 1..=100 {
            let t = 1e-3 + f64::from(k) * 1e-6;
            fe.set_time(t);
            let v = fe.sample()[0];
            let dt = t - 1e-3;
            // Two cascaded first-order low-passes.
            let resp = 1.0
                - (tau_in * (-dt / tau_in).exp() - tau_s * (-dt / tau_s).exp()) / (tau_in - tau_s);
            worst = worst.max((v - (lo + (hi - lo) * resp)).abs() / (hi - lo));
        }
        // Each 1 µs step feeds the sensor filter the input current at the step's end: an
        // error of order dt / tau (1 µs against 5 µs) early on, vanishing later.
        assert!(worst < 0.12, "{worst}");
        fe.set_time(1e-3 + 1e-3);
        assert!((fe.sample()[0] - hi).abs() < 1e-9 * hi);
    }
}
