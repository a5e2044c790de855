//! The rig: how the GPU's power reaches the ADC.
//!
//! Two kinds of data, kept apart:
//! - [`RigDescription`]: the rig as built, from `hardware/rigs/*.toml` (the
//!   `railtrace-rig` crate, re-exported here): its rails, which ADC channel senses what,
//!   and each sensor's nominal sensitivity. The host reads the same file to turn codes
//!   into amperes, volts and watts.
//! - [`RigTruth`]: what the twin knows and the host does not: how the GPU's power splits
//!   over the rails, each rail's source resistance, the board's input filtering, and each
//!   sensor's real gain error, offset, bandwidth and noise.
//!
//! [`FrontEnd`] combines them with the GPU's true power into the eight voltages at the
//! ADC's inputs, at any instant, walking time forward.

use serde::Deserialize;

pub use railtrace_rig::*;

use crate::adc::Analog;
use crate::random::{normal, Rng};
use crate::trace::{Segment, StreamCursor};
/// What the twin knows about the rig and the host does not.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RigTruth {
    /// Time constant of the GPU board's input filter as seen from the rails (its input
    /// capacitance against the rail's impedance), s: the rail current is the GPU's
    /// current through a first-order low-pass of this time constant. 0 (none) to
    /// [`MAX_INPUT_TAU_S`](crate::scenario::MAX_INPUT_TAU_S) in a scenario.
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
    /// Real bandwidth, Hz (default: the nominal one); within
    /// [`SENSOR_BANDWIDTH_HZ`](crate::scenario::SENSOR_BANDWIDTH_HZ) in a scenario.
    #[serde(default)]
    pub bandwidth_hz: Option<f64>,
}

struct Rail {
    share: f64,
    source_v: f64,
    resistance_ohm: f64,
    current_a: f64,
}

/// One ADC channel: `a·y + b` of its chain's output, plus noise.
#[derive(Debug, Clone)]
struct Channel {
    index: usize,
    chain: usize,
    a: f64,
    b: f64,
    noise_v_rms: f64,
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
    shapes: Vec<Shape>,
    chains: Vec<Chain>,
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
        let input_tau_s = truth.input_tau_s.max(0.0);
        let adc = rig.adc_filter();
        let (mut shapes, mut taus) = (Vec::new(), Vec::new());
        let mut chains: Vec<Chain> = Vec::new();
        let mut channels = Vec::new();
        for c in &rig.channels {
            let t = truth.channels.iter().find(|t| t.index == c.index);
            let bandwidth = t.and_then(|t| t.bandwidth_hz).unwrap_or(c.bandwidth_hz);
            let tau = 1.0 / (std::f64::consts::TAU * bandwidth);
            let shape = taus.iter().position(|&x| x == tau).unwrap_or_else(|| {
                taus.push(tau);
                shapes.push(Shape::new(input_tau_s, tau, adc));
                shapes.len() - 1
            });
            let rail = rig.rails.iter().position(|r| r.name == c.rail).unwrap_or(0);
            let chain = chains
                .iter()
                .position(|k| k.shape == shape && k.rail == rail)
                .unwrap_or_else(|| {
                    chains.push(Chain {
                        shape,
                        rail,
                        x: [0.0; 4],
                    });
                    chains.len() - 1
                });
            let volts_per_unit = c.sensitivity * (1.0 + t.map_or(0.0, |t| t.gain_error));
            let offset_v = t.map_or(0.0, |t| t.offset_v);
            let (a, b) = match (c.measures, rails.get(rail)) {
                (Measures::Current, _) => (volts_per_unit, offset_v),
                (Measures::Voltage, Some(r)) => (
                    -r.resistance_ohm * volts_per_unit,
                    r.source_v * volts_per_unit + offset_v,
                ),
                (Measures::Voltage, None) => (0.0, offset_v),
            };
            channels.push(Channel {
                index: usize::from(c.index),
                chain,
                a,
                b,
                noise_v_rms: t.map_or(0.0, |t| t.noise_v_rms),
            });
        }
        let mut fe = FrontEnd {
            next_segment,
            trace: StreamCursor::new(),
            rails,
            shapes,
            chains,
            channels,
            input_tau_s,
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
        for k in &mut self.chains {
            k.settle(self.rails.get(k.rail).map_or(0.0, |r| r.current_a));
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

    /// Advances the filters from the last instant to the current time, piece by piece of
    /// the GPU's power trace (constant over each piece, so each piece is exact: an ADC
    /// sample is its input filter's output at that instant, not an average since the last
    /// one).
    fn advance(&mut self) {
        let (mut a, b) = (self.last_s, self.t_s);
        if b <= a {
            return;
        }
        let next = &mut self.next_segment;
        let filled = self.trace.fill_until(b, &mut *next).is_ok();
        while a < b {
            let (end, p) = match self.trace.segment_at(a) {
                Some(seg) if filled => (seg.end_s.min(b), seg.power_w),
                _ => (b, 0.0),
            };
            let dt = end - a;
            if dt <= 0.0 {
                break;
            }
            let k_in = if self.input_tau_s > 0.0 {
                1.0 - (-dt / self.input_tau_s).exp()
            } else {
                1.0
            };
            let target = |r: &Rail| current(p * r.share, r.source_v, r.resistance_ohm);
            let filtered = self.input_tau_s > 0.0;
            let mut exps = [[[0.0; AUG]; AUG]; CHANNELS];
            for (e, shape) in exps.iter_mut().zip(&mut self.shapes) {
                *e = shape.exp(dt);
            }
            for k in &mut self.chains {
                let i = self.rails.get(k.rail).map_or(0.0, target);
                if let Some(e) = exps.get(k.shape) {
                    k.advance(e, i, filtered);
                }
            }
            for r in &mut self.rails {
                r.current_a += (target(r) - r.current_a) * k_in;
            }
            a = end;
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
            let y = self.chains.get(c.chain).map_or(0.0, |k| k.x[2]);
            if let Some(slot) = v.get_mut(c.index) {
                *slot = c.a * y + c.b + n;
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
}
