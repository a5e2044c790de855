//! A rig as built, from `hardware/rigs/*.toml`: its ADC and board, its link, its rails,
//! which ADC channel senses what with its nominal sensitivity and bandwidth, and its
//! trigger lines; parsed, validated against the parts it names, and what follows from
//! them (the rates its link carries, its 10-90 % rise). The host reads these files to
//! turn codes into amperes, volts and watts, and the digital twin builds its rig from
//! them: both use this crate, so that capturing from a real rig needs nothing of the twin.
//!
//! The analog chain's model ([`Shape`], [`Chain`]) is here too, since a rig's rise time
//! is that chain's response to a step.

use serde::Deserialize;

/// ADC channels a rig has.
pub const CHANNELS: usize = 8;

/// A sensor's real bandwidth, Hz: 1 Hz to 1 GHz. The current sensors and dividers of a
/// bench have kHz to MHz.
pub const SENSOR_BANDWIDTH_HZ: std::ops::RangeInclusive<f64> = 1.0..=1e9;

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
    /// The microcontroller board.
    pub board: BoardDescription,
    /// The host link.
    pub link: LinkDescription,
    /// The rails the rig measures.
    #[serde(rename = "rail")]
    pub rails: Vec<RailDescription>,
    /// What each ADC channel senses.
    #[serde(rename = "channel")]
    pub channels: Vec<ChannelDescription>,
    /// Trigger lines.
    #[serde(rename = "trigger", default)]
    pub triggers: Vec<TriggerDescription>,
    /// How well the rig's total power is known; not given: unknown.
    #[serde(default)]
    pub accuracy: Option<Accuracy>,
}

/// The rig's accuracy on the total power it reads, as standard uncertainties (k = 1): from
/// its calibration certificate, or from its parts' data-sheet limits before it has one (a
/// limit `±a` taken as a rectangular distribution, `a/√3`). A corrected profile's band
/// carries it: the logger's model is identified against the rig, so the rig's scale and
/// offset are the correction's too.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Accuracy {
    /// Relative standard uncertainty of the total power's scale (0.002: 0.2 %).
    pub gain_sd: f64,
    /// Standard uncertainty of the total power's offset, W.
    pub offset_sd_w: f64,
}

/// The ADC of the rig, with what its datasheet says it can do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdcDescription {
    /// Part number: `AD7606` or `AD7606C-16` (the parts the twin models).
    pub part: String,
    /// Input range: ± this many volts.
    pub range_v: f64,
    /// Resolution in bits.
    pub bits: u8,
    /// Conversion time, s: CONVST to BUSY falling (the datasheet's maximum).
    pub conversion_s: f64,
    /// Highest throughput on all channels, samples/s (the datasheet's).
    pub max_rate_hz: f64,
    /// −3 dB frequency of the ADC's own second-order analog input filter at this range,
    /// Hz (the datasheet's typical value).
    pub filter_hz: f64,
    /// Quality factor of that filter (1/√2: Butterworth).
    #[serde(default = "butterworth_q")]
    pub filter_q: f64,
    /// Where the figures come from.
    #[serde(default)]
    pub datasheet: String,
}

fn butterworth_q() -> f64 {
    std::f64::consts::FRAC_1_SQRT_2
}

/// The microcontroller board.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoardDescription {
    /// The microcontroller, for people (e.g. `STM32F405`).
    pub mcu: String,
    /// Rate of the device clock that stamps samples and edges, Hz.
    pub tick_hz: u32,
    /// Sample rates the board's firmware offers, Hz.
    pub sample_rates_hz: Vec<u32>,
}

/// The kind of host link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkKind {
    /// A UART, 8N1, through a USB-serial adapter.
    Uart,
    /// USB full speed (12 Mbit/s), CDC-ACM bulk endpoints.
    UsbFullSpeed,
    /// USB high speed (480 Mbit/s), CDC-ACM bulk endpoints.
    UsbHighSpeed,
}

impl LinkKind {
    /// The link's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Uart => "UART",
            LinkKind::UsbFullSpeed => "USB full-speed",
            LinkKind::UsbHighSpeed => "USB high-speed",
        }
    }

    /// The most payload the link's signalling can carry, bytes/s, and the largest packet:
    /// a UART 8N1 moves a byte in 10 bit times; a USB bulk endpoint at most 19 packets of
    /// 64 bytes per 1 ms frame (full speed) or 13 of 512 bytes per 125 µs microframe (high
    /// speed; USB 2.0 §5.8.4).
    pub fn ceiling(self, baud: Option<u32>) -> (f64, u32) {
        match self {
            LinkKind::Uart => (f64::from(baud.unwrap_or(0)) / 10.0, 1),
            LinkKind::UsbFullSpeed => (19.0 * 64.0 * 1000.0, 64),
            LinkKind::UsbHighSpeed => (13.0 * 512.0 * 8000.0, 512),
        }
    }
}

/// The link from the board to the host.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkDescription {
    /// UART, USB full speed or USB high speed.
    pub kind: LinkKind,
    /// Baud rate (UART only).
    #[serde(default)]
    pub baud: Option<u32>,
    /// Payload the link sustains, bytes/s (at most its signalling's ceiling).
    pub payload_bytes_per_s: f64,
    /// Bytes moved as one unit (a USB packet; 1 for a UART).
    pub packet_bytes: u32,
    /// From the device's write to the host's read, s (a USB frame, an adapter's latency
    /// timer).
    pub latency_s: f64,
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
    /// Nominal bandwidth of the sensor, Hz (first-order); within
    /// [`SENSOR_BANDWIDTH_HZ`].
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
        self.validate_parts()?;
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
            if !(c.sensitivity.is_finite() && c.sensitivity > 0.0) {
                return Err(RigError::NotPositive(format!(
                    "channel {} sensitivity",
                    c.index
                )));
            }
            // What the ADC's range reads at full scale: a rail's current sensor 1 mA to
            // 10 kA, a voltage divider 0.1 V to 1 kV (a GPU's rails: up to ~100 A, 12-54 V).
            let full_scale = self.adc.range_v / c.sensitivity;
            let (unit, lo, hi) = match c.measures {
                Measures::Current => ("A", 1e-3, 1e4),
                Measures::Voltage => ("V", 0.1, 1e3),
            };
            if !(lo..=hi).contains(&full_scale) {
                return Err(RigError::Mismatch(format!(
                    "channel {}: sensitivity = {:?} V/{unit} reads ±{full_scale:.3e} {unit} at the ADC's ±{} V: a rail's sensor reads {lo} to {hi} {unit} full scale",
                    c.index, c.sensitivity, self.adc.range_v
                )));
            }
            if !SENSOR_BANDWIDTH_HZ.contains(&c.bandwidth_hz) {
                return Err(RigError::Mismatch(format!(
                    "channel {}: bandwidth_hz must be within 1 Hz to 1 GHz, not {:?}",
                    c.index, c.bandwidth_hz
                )));
            }
        }
        for r in &self.rails {
            if !(r.nominal_v.is_finite() && r.nominal_v > 0.0) {
                return Err(RigError::NotPositive(format!("rail {} nominal_v", r.name)));
            }
        }
        if let Some(a) = self.accuracy {
            for (name, v) in [
                ("accuracy.gain_sd", a.gain_sd),
                ("accuracy.offset_sd_w", a.offset_sd_w),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(RigError::Mismatch(format!(
                        "{name} must be finite and ≥ 0, not {v}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// What the twin knows of each ADC part, from its datasheet: input ranges, fastest
/// conversion, highest throughput and its input filter's widest −3 dB frequency per
/// range (AD7606/AD7606-6/AD7606-4 data sheet Rev. C: tCONV 3.45-4.15 µs, 200 kSPS,
/// second-order filter at 15 kHz on ±5 V and 23 kHz on ±10 V; AD7606C-16 data sheet
/// Rev. A: 1 MSPS on all channels, 25 kHz or 220 kHz bandwidth per channel).
struct Part {
    name: &'static str,
    ranges_v: &'static [(f64, f64)],
    min_conversion_s: f64,
    max_rate_hz: f64,
}

const PARTS: [Part; 2] = [
    Part {
        name: "AD7606",
        ranges_v: &[(5.0, 15e3), (10.0, 23e3)],
        min_conversion_s: 3.45e-6,
        max_rate_hz: 200e3,
    },
    Part {
        name: "AD7606C-16",
        ranges_v: &[
            (2.5, 220e3),
            (5.0, 220e3),
            (6.25, 220e3),
            (10.0, 220e3),
            (12.5, 220e3),
        ],
        min_conversion_s: 0.0,
        max_rate_hz: 1e6,
    },
];

impl RigDescription {
    /// The ADC, board and link against what their parts can do.
    fn validate_parts(&self) -> Result<(), RigError> {
        let a = &self.adc;
        let bad = |m: String| Err(RigError::Mismatch(m));
        let Some(part) = PARTS.iter().find(|p| p.name == a.part) else {
            let known: Vec<&str> = PARTS.iter().map(|p| p.name).collect();
            return bad(format!(
                "adc.part: the twin models the {}, not {:?}",
                known.join(" and the "),
                a.part
            ));
        };
        let Some(&(_, widest_hz)) = part.ranges_v.iter().find(|r| r.0 == a.range_v) else {
            let ranges: Vec<String> = part
                .ranges_v
                .iter()
                .map(|r| format!("±{} V", r.0))
                .collect();
            return bad(format!(
                "adc: the {} has 16 bits and a {} range, not {} bits ±{} V",
                part.name,
                ranges.join(", "),
                a.bits,
                a.range_v
            ));
        };
        if a.bits != 16 {
            return bad(format!(
                "adc: the {} has 16 bits, not {}",
                part.name, a.bits
            ));
        }
        for (what, v) in [
            ("adc.conversion_s", a.conversion_s),
            ("adc.max_rate_hz", a.max_rate_hz),
            ("adc.filter_hz", a.filter_hz),
            ("adc.filter_q", a.filter_q),
            ("link.payload_bytes_per_s", self.link.payload_bytes_per_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(RigError::NotPositive(what.into()));
            }
        }
        if a.conversion_s < part.min_conversion_s || a.max_rate_hz > part.max_rate_hz {
            return bad(format!(
                "adc: the {} converts in at least {} µs and at most {} samples/s",
                part.name,
                part.min_conversion_s * 1e6,
                part.max_rate_hz
            ));
        }
        if a.filter_hz > widest_hz * 1.001 {
            return bad(format!(
                "adc.filter_hz: the {}'s input filter is {widest_hz} Hz wide at most on ±{} V, not {}",
                part.name, a.range_v, a.filter_hz
            ));
        }
        if !(0.3..=2.0).contains(&a.filter_q) {
            return bad("adc.filter_q must be within 0.3-2 (0.707: Butterworth)".into());
        }
        let b = &self.board;
        let top = a.max_rate_hz.min(1.0 / a.conversion_s);
        if b.tick_hz == 0
            || b.sample_rates_hz.is_empty()
            || b.sample_rates_hz.len() > 8
            || b.sample_rates_hz
                .iter()
                .any(|&r| r == 0 || f64::from(r) > top || b.tick_hz / r == 0)
        {
            return bad(format!(
                "board: 1 to 8 sample rates, each above 0, at most tick_hz and at most the ADC's {top:.0} samples/s"
            ));
        }
        let l = &self.link;
        if (l.kind == LinkKind::Uart) != l.baud.is_some() {
            return bad(
                "link.baud: a UART link needs its baud rate, and only a UART has one".into(),
            );
        }
        let (ceiling, packet) = l.kind.ceiling(l.baud);
        if l.payload_bytes_per_s > ceiling * 1.000_001 {
            return bad(format!(
                "link.payload_bytes_per_s: a {:?} link carries at most {ceiling:.0} bytes/s, not {}",
                l.kind, l.payload_bytes_per_s
            ));
        }
        if l.packet_bytes == 0 || l.packet_bytes > packet {
            return bad(format!(
                "link.packet_bytes: 1 to {packet} on a {:?} link, not {}",
                l.kind, l.packet_bytes
            ));
        }
        if !(l.latency_s.is_finite() && (0.0..=1.0).contains(&l.latency_s)) {
            return bad("link.latency_s must be within 0-1 s".into());
        }
        Ok(())
    }

    /// Bytes the link carries per sample of `channels` channels in full sample blocks:
    /// frame header, the block's 25 bytes before its codes, CRC, COBS overhead and
    /// delimiter (`protocol/SPEC.md`). 16.7 with 8 channels.
    pub fn wire_bytes_per_sample(channels: usize) -> f64 {
        use railtrace_protocol::{cobs::max_encoded_len, max_block_samples, CRC_LEN, HEADER_LEN};
        let n = max_block_samples(channels).max(1);
        let raw = HEADER_LEN + 25 + 2 * channels * n + CRC_LEN;
        (max_encoded_len(raw) + 1) as f64 / n as f64
    }

    /// The highest rate the board offers whose stream of `channels` channels the link
    /// carries with 5 % to spare (status, edges and time-sync replies share the link).
    pub fn carried_rate_hz(&self, channels: usize) -> Option<u32> {
        let most = 0.95 * self.link.payload_bytes_per_s / Self::wire_bytes_per_sample(channels);
        self.board
            .sample_rates_hz
            .iter()
            .copied()
            .filter(|&r| f64::from(r) <= most)
            .max()
    }

    /// The slowest channel's 10-90 % rise ([`RigDescription::rise_time_s`]), s: the finest
    /// time the rig places a step to.
    pub fn rise_s(&self) -> f64 {
        (self.channels.iter())
            .map(|c| self.rise_time_s(c.index))
            .fold(0.0, f64::max)
    }

    /// The 10-90 % rise of a current or voltage step through channel `index`'s chain (its
    /// sensor's bandwidth, then the ADC's input filter), s: the finest time a step can be
    /// placed to, whatever the sample rate. Simulated with the twin's exact chain on a
    /// grid of a thousandth of the rise.
    pub fn rise_time_s(&self, index: u8) -> f64 {
        let Some(c) = self.channels.iter().find(|c| c.index == index) else {
            return 0.0;
        };
        let tau = 1.0 / (std::f64::consts::TAU * c.bandwidth_hz);
        let (w0, _) = self.adc_filter();
        let mut shape = Shape::new(0.0, tau, self.adc_filter());
        let mut chain = Chain {
            shape: 0,
            rail: 0,
            x: [0.0; 4],
        };
        let dt = (tau + 1.0 / w0) / 1000.0;
        let e = shape.exp(dt);
        let (mut t, mut last, mut t10) = (0.0, 0.0, None);
        while t < 1e4 * (tau + 1.0 / w0) {
            chain.advance(&e, 1.0, false);
            t += dt;
            let v = chain.x[2];
            let cross = |level: f64| t - dt * (v - level) / (v - last);
            if t10.is_none() && v >= 0.1 {
                t10 = Some(cross(0.1));
            }
            if v >= 0.9 {
                return cross(0.9) - t10.unwrap_or(0.0);
            }
            last = v;
        }
        t
    }

    /// The ADC's input filter as (ω0, Q): a second-order low-pass whose magnitude falls
    /// to 1/√2 at `filter_hz` (for Q = 1/√2, ω0 = 2π·filter_hz).
    pub fn adc_filter(&self) -> (f64, f64) {
        let q = self.adc.filter_q;
        // |H(jω)|² = 1 / ((1 - x²)² + x²/Q²) = 1/2 with x = ω/ω0: x² solves
        // x⁴ + (1/Q² - 2) x² - 1 = 0.
        let b = 1.0 / (q * q) - 2.0;
        let x2 = (-b + (b * b + 4.0).sqrt()) / 2.0;
        (std::f64::consts::TAU * self.adc.filter_hz / x2.sqrt(), q)
    }
}

/// One line on what a rig can do: its ADC and filter, its board's top rate, its link.
pub fn summary(rig: &RigDescription) -> String {
    let link = match rig.link.kind {
        LinkKind::Uart => format!("UART {} baud", rig.link.baud.unwrap_or(0)),
        LinkKind::UsbFullSpeed => "USB full speed".to_string(),
        LinkKind::UsbHighSpeed => "USB high speed".to_string(),
    };
    format!(
        "{} with a {:.0} kHz input filter, up to {} kS/s on {}, {} at {:.0} kB/s",
        rig.adc.part,
        rig.adc.filter_hz / 1e3,
        rig.board.sample_rates_hz.iter().max().copied().unwrap_or(0) / 1000,
        rig.board.mcu,
        link,
        rig.link.payload_bytes_per_s / 1e3
    )
}

/// The analog chain from a rail's current to the ADC's track-and-hold, with unit gain, as a
/// linear system with state `[I, s, y, ẏ/ω0]`: the rail current behind the board's input
/// filter (first order, τ_in), the sensor's output (first order, τ_s), and the ADC's input
/// filter (second order, ω0 and Q). A channel reads `a·y + b`: its sensitivity, gain error
/// and offset (or, for a voltage channel, its rail's source voltage less the drop) are
/// linear in the current, so channels of one rail and one bandwidth share one chain. The
/// input, the rail current the GPU draws, is constant over each step, so each step is
/// exact: `x ← Ad x + Bd I*` with `Ad`, `Bd` from the matrix exponential of the
/// augmented system.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The continuous system [A | B] over the state and the input I*.
    m: [[f64; AUG]; AUG],
    /// The last step's length and its exponential.
    step: Option<(f64, [[f64; AUG]; AUG])>,
}

/// States plus the input of a chain.
pub const AUG: usize = 5;

impl Shape {
    pub fn new(input_tau_s: f64, sensor_tau_s: f64, (w0, q): (f64, f64)) -> Shape {
        let mut m = [[0.0; AUG]; AUG];
        if input_tau_s > 0.0 {
            m[0][0] = -1.0 / input_tau_s;
            m[0][4] = 1.0 / input_tau_s;
        }
        m[1][0] = 1.0 / sensor_tau_s;
        m[1][1] = -1.0 / sensor_tau_s;
        m[2][3] = w0;
        m[3][1] = w0;
        m[3][2] = -w0;
        m[3][3] = -w0 / q;
        Shape { m, step: None }
    }

    /// The exponential for a step of `dt` seconds (the last one's again if `dt` is the
    /// same within a part in 10⁹: conversions are one period apart).
    #[inline]
    pub fn exp(&mut self, dt: f64) -> [[f64; AUG]; AUG] {
        match self.step {
            Some((len, e)) if (len - dt).abs() <= 1e-9 * dt => e,
            _ => {
                let e = expm(&self.m, dt);
                self.step = Some((dt, e));
                e
            }
        }
    }
}

/// One rail's chain of one shape, in motion.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Its shape's index.
    pub shape: usize,
    /// Its rail's index.
    pub rail: usize,
    /// The state `[I, s, y, ẏ/ω0]`.
    pub x: [f64; 4],
}

impl Chain {
    /// Every filter at rest for a rail current of `current_a`.
    #[inline]
    pub fn settle(&mut self, current_a: f64) {
        self.x = [current_a, current_a, current_a, 0.0];
    }

    /// Advances by the step whose exponential is `e`, with the rail drawing `target_a`
    /// (through the input filter) throughout.
    #[inline]
    pub fn advance(&mut self, e: &[[f64; AUG]; AUG], target_a: f64, input_filter: bool) {
        if !input_filter {
            self.x[0] = target_a; // no input filter: the current follows at once
        }
        let z = [self.x[0], self.x[1], self.x[2], self.x[3], target_a];
        let mut x = [0.0; 4];
        for (xi, row) in x.iter_mut().zip(e) {
            *xi = row.iter().zip(&z).map(|(r, z)| r * z).sum();
        }
        self.x = x;
    }
}

/// `exp(m·t)` by scaling and squaring of its Taylor series (the chain's matrices are
/// stable and of norm ω0·t; after scaling to norm ≤ 1/2, 16 terms reach double precision).
pub fn expm(m: &[[f64; AUG]; AUG], t: f64) -> [[f64; AUG]; AUG] {
    let norm = m
        .iter()
        .map(|r| r.iter().map(|v| (v * t).abs()).sum::<f64>())
        .fold(0.0, f64::max);
    let squarings = if norm > 0.5 {
        (norm / 0.5).log2().ceil() as i32
    } else {
        0
    };
    let h = t / 2f64.powi(squarings);
    let mut a = [[0.0; AUG]; AUG];
    for (ar, mr) in a.iter_mut().zip(m) {
        for (av, mv) in ar.iter_mut().zip(mr) {
            *av = mv * h;
        }
    }
    let mut result = identity();
    let mut term = identity();
    for k in 1..=16 {
        term = matmul(&term, &a);
        for row in &mut term {
            for v in row.iter_mut() {
                *v /= f64::from(k);
            }
        }
        for (rr, tr) in result.iter_mut().zip(&term) {
            for (rv, tv) in rr.iter_mut().zip(tr) {
                *rv += tv;
            }
        }
    }
    for _ in 0..squarings {
        result = matmul(&result, &result);
    }
    result
}

fn identity() -> [[f64; AUG]; AUG] {
    let mut i = [[0.0; AUG]; AUG];
    for (k, row) in i.iter_mut().enumerate() {
        row[k] = 1.0;
    }
    i
}

fn matmul(x: &[[f64; AUG]; AUG], y: &[[f64; AUG]; AUG]) -> [[f64; AUG]; AUG] {
    let mut z = [[0.0; AUG]; AUG];
    for (zr, xr) in z.iter_mut().zip(x) {
        for (k, xv) in xr.iter().enumerate() {
            if *xv != 0.0 {
                for (zv, yv) in zr.iter_mut().zip(&y[k]) {
                    *zv += xv * yv;
                }
            }
        }
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The F405 UART rig's file with `from` replaced by `to`, validated.
    fn edited(from: &str, to: &str) -> Result<(), String> {
        let text = include_str!("../../rigs/pcie-2x8pin.toml");
        assert!(text.contains(from), "{from}");
        let rig: RigDescription =
            toml::from_str(&text.replacen(from, to, 1)).map_err(|e| e.to_string())?;
        rig.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn a_rig_claiming_more_than_its_parts_give_is_refused() {
        edited("bits = 16", "bits = 16").unwrap();
        let refused = [
            (
                "part = \"AD7606\"",
                "part = \"ADS8688\"",
                "the twin models the AD7606",
            ),
            ("bits = 16", "bits = 12", "has 16 bits, not 12"),
            ("range_v = 10.0", "range_v = 2.5", "a ±5 V, ±10 V range"),
            (
                "filter_hz = 23e3",
                "filter_hz = 200e3",
                "23000 Hz wide at most",
            ),
            (
                "conversion_s = 4.15e-6",
                "conversion_s = 1e-6",
                "converts in at least 3.45",
            ),
            (
                "max_rate_hz = 200e3",
                "max_rate_hz = 1e6",
                "at most 200000 samples/s",
            ),
            ("50_000]", "50_000, 500_000]", "at most the ADC's 200000"),
            (
                "payload_bytes_per_s = 92_160",
                "payload_bytes_per_s = 200_000",
                "at most 92160",
            ),
            ("baud = 921_600\n", "", "a UART link needs its baud rate"),
            (
                "packet_bytes = 1",
                "packet_bytes = 64",
                "1 to 1 on a Uart link",
            ),
            (
                "latency_s = 1e-3",
                "latency_s = -1.0",
                "latency_s must be within",
            ),
            (
                "sensitivity = 0.05",
                "sensitivity = 1e-308",
                "sensitivity = 1e-308 V/A reads",
            ),
            (
                "sensitivity = 0.5",
                "sensitivity = 1e6",
                "a rail's sensor reads 0.1 to 1000 V full scale",
            ),
            (
                "gain_sd = 0.0021",
                "gain_sd = -0.0021",
                "accuracy.gain_sd must be finite and ≥ 0",
            ),
        ];
        for (from, to, words) in refused {
            let e = edited(from, to).unwrap_err();
            assert!(e.contains(words), "{from} -> {to}: {e}");
        }
        // A USB high-speed link may not claim more than 13 × 512 bytes a microframe.
        let hs: RigDescription =
            toml::from_str(include_str!("../../rigs/pcie-2x8pin-hs.toml")).unwrap();
        let mut fast = hs.clone();
        fast.link.payload_bytes_per_s = 60e6;
        assert!(fast
            .validate()
            .unwrap_err()
            .to_string()
            .contains("53248000"));
        hs.validate().unwrap();
    }
}
