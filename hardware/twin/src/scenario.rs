//! Scenarios: a whole bench in one TOML file (documented field by field in
//! `hardware/twin/SCENARIOS.md`; examples in `hardware/scenarios/`). A malformed scenario
//! gets an error naming the file, the line and the field.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::clock::McuClockConfig;
use crate::gpu::{ConfigError, GpuConfig, KernelConfig, WorkloadConfig, MAX_UPTIME_S};
use crate::logger::LoggerConfig;
use crate::mcu::{FaultConfig, FirmwareConfig, TriggerPathConfig};
use crate::rig::{RigDescription, RigTruth};

/// The default scenario (MI300X-like: a 1 ms box logger every 1 ms, a ~200 µs two-phase
/// kernel), built in so that the twin runs without any file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/default.toml");
/// The rig the default scenario names: the fast rig (AD7606C-16 on a Teensy 4.1, USB high
/// speed).
pub const DEFAULT_RIG: &str = include_str!("../../rigs/pcie-2x8pin-hs.toml");

/// The longest a trigger edge may take from the host to the rig, and its RMS jitter, s:
/// 1 s. An edge reaches a rig in microseconds (a GPIO) to milliseconds (a USB-serial
/// adapter's latency timer, 255 ms at most); a second is a trigger path that is broken.
pub const MAX_TRIGGER_S: f64 = 1.0;

/// The latest a fault may come, and the longest the link may stay away, s: a week,
/// longer than a bench session runs.
pub const MAX_FAULT_S: f64 = 7.0 * 86_400.0;

/// An injected link's rate, bytes/s: from 100 (a 1000-baud line, a sample frame every ten
/// seconds) to 1e9 (above any link the twin models; the rig's own link caps it anyway).
pub const LINK_BYTES_PER_S: RangeInclusive<f64> = 100.0..=1e9;

/// The longest time constant of the GPU board's input filter as seen from the rails, s:
/// 1 s. Its input capacitance against the rails' impedance settles in microseconds.
pub const MAX_INPUT_TAU_S: f64 = 1.0;

pub use railtrace_rig::SENSOR_BANDWIDTH_HZ;

/// The largest drift of the MCU clock's frequency error, ppm/s: 1. A crystal's frequency
/// moves well under 1 ppm per °C, and a board warms well under 1 °C a second. (The model's
/// drift is linear: at this bound a clock still runs at 40 % of its rate after a week,
/// longer than a bench session.)
pub const MAX_DRIFT_PPM_PER_S: f64 = 1.0;

/// A whole bench.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What the scenario is for, for people.
    #[serde(default)]
    pub description: String,
    /// Seed of every random draw (GPU timeline, sensor noise, trigger jitter, faults).
    #[serde(default)]
    pub seed: u64,
    /// The rig description, relative to the scenario file.
    pub rig: PathBuf,
    /// The MCU's clock.
    #[serde(default)]
    pub mcu: McuClockConfig,
    /// The firmware's settings.
    #[serde(default)]
    pub firmware: FirmwareConfig,
    /// The trigger path from host to rig.
    #[serde(default)]
    pub trigger: TriggerPathConfig,
    /// Faults to inject.
    #[serde(default)]
    pub faults: FaultConfig,
    /// What the twin knows about the rig that the host does not.
    pub rig_truth: RigTruth,
    /// The GPU.
    pub gpu: GpuConfig,
    /// Its kernels.
    pub kernels: Vec<KernelConfig>,
    /// What it runs, repeated forever.
    pub workload: WorkloadConfig,
    /// Its own power logger.
    pub logger: LoggerConfig,
}

/// A scenario that cannot be used, with where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{file}{}{}: {message}",
    line.map(|l| format!(":{l}")).unwrap_or_default(),
    if field.is_empty() { String::new() } else { format!(": {field}") }
)]
pub struct ScenarioError {
    /// The file.
    pub file: String,
    /// The line, 1-based, where known.
    pub line: Option<usize>,
    /// The field's path, e.g. `kernels[0].phases[1].duration_s`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// A scenario with its rig, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The scenario.
    pub scenario: Scenario,
    /// The rig it names.
    pub rig: RigDescription,
}

/// Reads and checks the scenario at `path`, and the rig it names.
pub fn load(path: &Path) -> Result<Loaded, ScenarioError> {
    load_with(Some(path), None)
}

/// Reads and checks the scenario at `path` (the built-in default when none) on the rig
/// file `rig` (the one the scenario names when none).
pub fn load_with(path: Option<&Path>, rig: Option<&Path>) -> Result<Loaded, ScenarioError> {
    let read_rig = |rig_path: &Path| {
        read_text(rig_path)
            .map(|t| (rig_path.display().to_string(), t))
            .map_err(|e| format!("cannot read the rig {}: {e}", rig_path.display()))
    };
    // A rig given apart from the scenario is read first, so that its errors name it alone.
    let chosen = rig
        .map(|r| {
            read_text(r)
                .map(|t| (r.display().to_string(), t))
                .map_err(|e| ScenarioError {
                    file: r.display().to_string(),
                    line: None,
                    field: String::new(),
                    message: format!("cannot read the rig: {e}"),
                })
        })
        .transpose()?;
    let Some(path) = path else {
        let rig = chosen.unwrap_or_else(|| {
            (
                "<built-in rig pcie-2x8pin-hs>".into(),
                DEFAULT_RIG.to_string(),
            )
        });
        return parse("<built-in default scenario>", DEFAULT_SCENARIO, |_| Ok(rig));
    };
    let text = read_text(path).map_err(|e| ScenarioError {
        file: path.display().to_string(),
        line: None,
        field: String::new(),
        message: format!("cannot read: {e}"),
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&path.display().to_string(), &text, |named| match chosen {
        Some(c) => Ok(c),
        None => read_rig(&base.join(named)),
    })
}

/// The largest scenario or rig file read, bytes: 1 MiB, forty times the largest shipped
/// (`dvfs.toml`, 23 kB). A bench description is text that a person writes; a larger
/// file is none, and one that never ends (`/dev/zero`) would be read for ever.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The text of the scenario or rig file at `path`: a regular file of at most
/// [`MAX_FILE_BYTES`] (see [`read_file`]).
fn read_text(path: &Path) -> std::io::Result<String> {
    let bytes = read_file(path, MAX_FILE_BYTES, "a bench description")?;
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Opens the file at `path` to read it, without waiting (a pipe with no writer would
/// hold the open), refusing anything but a regular file (a device such as /dev/zero, a
/// pipe, a directory): every file a user names is read this way.
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a device, a pipe or a folder)",
        ));
    }
    Ok(file)
}

/// The bytes of the regular file at `path` ([`open_regular`]), at most `max_bytes`, more
/// than `what` (e.g. "a logger model") ever has: a larger file is refused unread.
pub fn read_file(path: &Path, max_bytes: u64, what: &str) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    let file = open_regular(path)?;
    let too_large = || {
        Error::new(
            ErrorKind::InvalidData,
            format!("larger than {max_bytes} bytes, more than {what} has"),
        )
    };
    if file.metadata()?.len() > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(bytes)
}

/// The built-in default scenario.
pub fn default_scenario() -> Loaded {
    // The built-in files are checked by this crate's tests.
    #[allow(clippy::expect_used)]
    load_with(None, None).expect("the built-in scenario is valid")
}

/// Parses scenario `text` (named `file` in errors); `read_rig` fetches the rig file it
/// names as (name, text).
pub fn parse(
    file: &str,
    text: &str,
    read_rig: impl FnOnce(&Path) -> Result<(String, String), String>,
) -> Result<Loaded, ScenarioError> {
    let mut scenario: Scenario = from_toml(file, text)?;
    let at = |field: &str, message: String| ScenarioError {
        file: file.to_string(),
        line: line_of(text, field),
        field: field.to_string(),
        message,
    };
    let (rig_file, rig_text) = read_rig(&scenario.rig).map_err(|m| at("rig", m))?;
    let rig: RigDescription = from_toml(&rig_file, &rig_text)?;
    rig.validate().map_err(|e| ScenarioError {
        file: rig_file.clone(),
        line: None,
        field: String::new(),
        message: e.to_string(),
    })?;
    let config_error = |e: ConfigError| {
        let field = match &e {
            ConfigError::Invalid { field, .. } | ConfigError::Structure { field, .. } => {
                field.clone()
            }
            ConfigError::UnknownKernel { step, .. } => format!("workload.steps[{step}].kernel"),
            _ => String::new(),
        };
        at(&field, e.to_string())
    };
    scenario.gpu.validate().map_err(config_error)?;
    scenario.logger.validate().map_err(config_error)?;
    crate::gpu::Gpu::new(
        scenario.gpu.clone(),
        scenario.kernels.clone(),
        scenario.workload.clone(),
        scenario.seed,
    )
    .map_err(config_error)?;
    // The rig truth against the rig.
    let names: Vec<&str> = rig.rails.iter().map(|r| r.name.as_str()).collect();
    for (i, r) in scenario.rig_truth.rails.iter().enumerate() {
        if !names.contains(&r.name.as_str()) {
            return Err(at(
                &format!("rig_truth.rail[{i}].name"),
                format!(
                    "rail `{}` is not in the rig {rig_file} ({})",
                    r.name,
                    names.join(", ")
                ),
            ));
        }
    }
    for name in &names {
        if !scenario.rig_truth.rails.iter().any(|r| r.name == *name) {
            return Err(at(
                "rig_truth.rail",
                format!("no entry for the rig's rail `{name}`"),
            ));
        }
    }
    let total: f64 = scenario.rig_truth.rails.iter().map(|r| r.share).sum();
    if (total - 1.0).abs() > 1e-9 {
        return Err(at(
            "rig_truth.rail",
            format!("the shares add up to {total}, not 1"),
        ));
    }
    // A value within what a bench can have, or an error naming it.
    let bounded = |field: &str, value: f64, range: RangeInclusive<f64>, rule: &str| {
        if value.is_finite() && range.contains(&value) {
            Ok(())
        } else {
            Err(at(field, format!("{field} = {value:?}: {rule}")))
        }
    };
    let t = &scenario.rig_truth;
    for (i, r) in t.rails.iter().enumerate() {
        if !(r.share >= 0.0
            && r.source_v > 0.0
            && r.resistance_ohm >= 0.0
            && r.source_v.is_finite()
            && r.resistance_ohm.is_finite())
        {
            return Err(at(
                &format!("rig_truth.rail[{i}]"),
                "share and resistance_ohm must be >= 0, source_v > 0, all finite".into(),
            ));
        }
    }
    let mut indices = Vec::new();
    for (i, c) in t.channels.iter().enumerate() {
        let field = format!("rig_truth.channel[{i}]");
        if !rig.channels.iter().any(|d| d.index == c.index) || indices.contains(&c.index) {
            return Err(at(
                &field,
                format!("channel {} is not in the rig, or listed twice", c.index),
            ));
        }
        indices.push(c.index);
        if !(c.noise_v_rms >= 0.0
            && c.noise_v_rms.is_finite()
            && c.bandwidth_hz
                .is_none_or(|b| SENSOR_BANDWIDTH_HZ.contains(&b))
            && c.gain_error > -1.0
            && c.gain_error.is_finite()
            && c.offset_v.is_finite())
        {
            return Err(at(
                &field,
                "noise_v_rms >= 0, bandwidth_hz within 1 Hz to 1 GHz, gain_error > -1, \
                 all finite"
                    .into(),
            ));
        }
    }
    bounded(
        "rig_truth.input_tau_s",
        t.input_tau_s,
        0.0..=MAX_INPUT_TAU_S,
        "must be >= 0, at most 1 s",
    )?;
    let f = &scenario.faults;
    let probabilities = [f.corrupt_frame_probability, f.drop_byte_probability];
    if probabilities.iter().any(|p| !(0.0..=1.0).contains(p))
        || probabilities.iter().sum::<f64>() > 1.0
    {
        return Err(at(
            "faults",
            "probabilities within 0 to 1, adding up to at most 1".into(),
        ));
    }
    for (field, value) in [
        ("faults.damage_until_s", f.damage_until_s),
        ("faults.disconnect_after_s", f.disconnect_after_s),
        ("faults.disconnected_s", Some(f.disconnected_s)),
        ("faults.reset_after_s", f.reset_after_s),
    ] {
        if let Some(v) = value {
            bounded(
                field,
                v,
                0.0..=MAX_FAULT_S,
                "must be >= 0, at most a week (604800 s)",
            )?;
        }
    }
    if let Some(r) = f.link_bytes_per_s {
        bounded(
            "faults.link_bytes_per_s",
            r,
            LINK_BYTES_PER_S,
            "must be within 100 to 1e9 bytes/s",
        )?;
    }
    let tr = &scenario.trigger;
    for (field, value) in [
        ("trigger.latency_s", tr.latency_s),
        ("trigger.jitter_s", tr.jitter_s),
    ] {
        bounded(
            field,
            value,
            0.0..=MAX_TRIGGER_S,
            "must be >= 0, at most 1 s",
        )?;
    }
    if !(1..=1000).contains(&scenario.firmware.busy_polls) {
        return Err(at(
            "firmware.busy_polls",
            "must be 1 to 1000 (the driver polls 2000 times)".into(),
        ));
    }
    let board = &rig.board;
    let m = &mut scenario.mcu;
    if m.tick_hz == 0 {
        m.tick_hz = board.tick_hz;
    } else if m.tick_hz != board.tick_hz {
        return Err(at(
            "mcu.tick_hz",
            format!(
                "the rig's {} counts at {} Hz (leave tick_hz out to take the rig's)",
                board.mcu, board.tick_hz
            ),
        ));
    }
    bounded(
        "mcu.error_ppm",
        m.error_ppm,
        -1e4..=1e4,
        "must be within ±10000 ppm",
    )?;
    bounded(
        "mcu.drift_ppm_per_s",
        m.drift_ppm_per_s,
        -MAX_DRIFT_PPM_PER_S..=MAX_DRIFT_PPM_PER_S,
        "must be within ±1 ppm/s",
    )?;
    let most_ticks = MAX_UPTIME_S * f64::from(m.tick_hz);
    if m.offset_ticks as f64 > most_ticks {
        return Err(at(
            "mcu.offset_ticks",
            format!(
                "mcu.offset_ticks = {}: must be at most ten years of the clock's ticks \
                 ({most_ticks:.0} at {} Hz)",
                m.offset_ticks, m.tick_hz
            ),
        ));
    }
    let rates = &mut scenario.firmware.sample_rates_hz;
    if rates.is_empty() {
        rates.clone_from(&board.sample_rates_hz);
    } else if let Some(r) = rates.iter().find(|r| !board.sample_rates_hz.contains(r)) {
        let offered: Vec<String> = board.sample_rates_hz.iter().map(u32::to_string).collect();
        return Err(at(
            "firmware.sample_rates_hz",
            format!(
                "{r} Hz is not a rate the rig's board offers ({} Hz); leave the list out to offer them all",
                offered.join(", ")
            ),
        ));
    }
    Ok(Loaded { scenario, rig })
}

fn from_toml<T: for<'de> Deserialize<'de>>(file: &str, text: &str) -> Result<T, ScenarioError> {
    let de = toml::de::Deserializer::parse(text).map_err(|e| toml_error(file, text, &e, ""))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let mut error = toml_error(file, text, e.inner(), &path);
        // A table that checks its ranges as it is read (the logger) starts its message
        // with the key at fault: name that key, and its line.
        let key = error.message.split([' ', ':']).next().unwrap_or_default();
        if key.starts_with(&format!("{path}.")) {
            error.field = key.to_string();
            error.line = line_of(text, key).or(error.line);
        }
        error
    })
}

fn toml_error(file: &str, text: &str, e: &toml::de::Error, field: &str) -> ScenarioError {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
        .or_else(|| line_of(text, field));
    ScenarioError {
        file: file.to_string(),
        line,
        field: if field == "." {
            String::new()
        } else {
            field.to_string()
        },
        message: e.message().to_string(),
    }
}

/// The line of the deepest part of `field` (e.g. `kernels[0].phases[1].duration_s`) that
/// the TOML text has.
fn line_of(text: &str, field: &str) -> Option<usize> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut best = None;
    for part in field.split('.').filter(|p| !p.is_empty()) {
        let (key, index) = match part.split_once('[') {
            Some((k, rest)) => (k, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        let Some((k, v)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == key) else {
            break;
        };
        best = Some(k.span().start);
        let mut value = v.get_ref();
        if let (Some(i), DeValue::Array(items)) = (index, value) {
            let Some(item) = items.get(i) else { break };
            best = Some(item.span().start);
            value = item.get_ref();
        }
        match value {
            DeValue::Table(t) => table = t,
            _ => break,
        }
    }
    best.map(|b| text[..b.min(text.len())].matches('\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scenario_and_every_example_load() {
        let d = default_scenario();
        assert_eq!(d.rig.channels.len(), 8);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                load(&path).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 2);
    }

    fn broken(edit: impl FnOnce(&str) -> String) -> ScenarioError {
        let text = edit(DEFAULT_SCENARIO);
        parse("s.toml", &text, |_| {
            Ok(("rig.toml".into(), DEFAULT_RIG.into()))
        })
        .unwrap_err()
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        // An unknown field.
        let e = broken(|t| t.replacen("idle_power_w", "idle_powr_w", 1));
        assert_eq!(
            (e.file.as_str(), e.field.as_str()),
            ("s.toml", "gpu.idle_powr_w")
        );
        let line = DEFAULT_SCENARIO[..DEFAULT_SCENARIO.find("idle_power_w").unwrap()]
            .matches('\n')
            .count()
            + 1;
        assert_eq!(e.line, Some(line), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("s.toml:{line}: gpu.idle_powr_w: unknown field")),
            "{e}"
        );
        // A wrong type.
        let e = broken(|t| t.replacen("seed = 1", "seed = \"one\"", 1));
        assert_eq!(
            (e.field.as_str(), e.line),
            ("seed", Some(line_no(DEFAULT_SCENARIO, "seed = 1")))
        );
        // A value out of range, found after parsing.
        let e = broken(|t| t.replacen("duration_s = 100e-6", "duration_s = -1.0", 1));
        assert_eq!(e.field, "kernels[0].phases[0].duration_s", "{e}");
        assert_eq!(
            e.line,
            Some(line_no(DEFAULT_SCENARIO, "duration_s = 100e-6")),
            "{e}"
        );
        // A rail the rig does not have.
        let e = broken(|t| t.replacen("name = \"slot_3v3\"", "name = \"slot_5v\"", 1));
        assert!(e.field.starts_with("rig_truth.rail"), "{e}");
        // Not TOML at all.
        let e = broken(|t| format!("{t}\n[gpu\n"));
        assert!(e.line.is_some(), "{e}");
    }

    fn line_no(text: &str, needle: &str) -> usize {
        text[..text.find(needle).unwrap()].matches('\n').count() + 1
    }

    #[test]
    fn values_no_bench_has_are_refused_at_their_field_and_line() {
        for (from, to, field) in [
            // Each of these once ran the twin out of memory, deaf to Ctrl-C.
            (
                "max_delay_s = 1.5e-3",
                "max_delay_s = 1e30",
                "workload.steps[0].max_delay_s",
            ),
            (
                "duration_s = 100e-6",
                "duration_s = 1e30",
                "kernels[0].phases[0].duration_s",
            ),
            ("period_s = 1e-3", "period_s = 1e-12", "logger.period_s"),
            // Other sizes, rates and durations past a bench's.
            (
                "duration_s = 100e-6",
                "duration_s = 1e-12",
                "kernels[0].phases[0].duration_s",
            ),
            (
                "duration_s = 5e-3",
                "duration_s = 1e30",
                "workload.steps[1].duration_s",
            ),
            (
                "count = 20",
                "count = 4_000_000_000",
                "workload.steps[0].count",
            ),
            (
                "launch_overhead_s = 5e-6",
                "launch_overhead_s = 1e30",
                "gpu.launch_overhead_s",
            ),
            (
                "read_latency_s = 2e-6",
                "read_latency_s = inf",
                "gpu.clock.read_latency_s",
            ),
            ("rate_hz = 100e6", "rate_hz = 1e300", "gpu.clock.rate_hz"),
            (
                "frequency_hz = 1.3e9",
                "frequency_hz = 1e3",
                "gpu.dvfs[2].frequency_hz",
            ),
            (
                "scale = 1.08",
                "scale = 1e30",
                "kernels[0].time.modes[1].scale",
            ),
            (
                "outlier_scale = 1.5",
                "outlier_scale = 1e30",
                "kernels[0].time.outlier_scale",
            ),
            (
                "first_time_scale = 1.3",
                "first_time_scale = 1e-30",
                "kernels[0].warmup.first_time_scale",
            ),
            ("window_s = 1e-3", "window_s = 1e30", "logger.window_s"),
            ("phase_s = 1e-3", "phase_s = inf", "logger.phase_s"),
            (
                "delay_s = 0.0\ngain",
                "delay_s = -1.0\ngain",
                "logger.delay_s",
            ),
            // NaN, infinities and negatives where they mean nothing.
            ("latency_s = 2e-6", "latency_s = inf", "trigger.latency_s"),
            ("jitter_s = 1e-6", "jitter_s = nan", "trigger.jitter_s"),
            (
                "drift_ppm_per_s = 0.0",
                "drift_ppm_per_s = nan",
                "mcu.drift_ppm_per_s",
            ),
            (
                "input_tau_s = 5e-6",
                "input_tau_s = inf",
                "rig_truth.input_tau_s",
            ),
            (
                "[faults]\n",
                "[faults]\nreset_after_s = -1.0\n",
                "faults.reset_after_s",
            ),
            (
                "[faults]\n",
                "[faults]\ndisconnect_after_s = nan\n",
                "faults.disconnect_after_s",
            ),
            (
                "[faults]\n",
                "[faults]\nlink_bytes_per_s = inf\n",
                "faults.link_bytes_per_s",
            ),
        ] {
            let text = DEFAULT_SCENARIO.replacen(from, to, 1);
            let e = broken(|_| text.clone());
            assert_eq!(e.field, field, "{from} -> {to}: {e}");
            let line = line_no(&text, to.trim_start_matches("[faults]\n"));
            assert_eq!(e.line, Some(line), "{from} -> {to}: {e}");
            assert!(e.message.contains("must be"), "{e}");
        }
    }

    /// A scenario file in a folder of its own, naming `rig`.
    fn scenario_file(name: &str, rig: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("railtrace-scenario-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("s.toml");
        let text = DEFAULT_SCENARIO.replacen("../rigs/pcie-2x8pin-hs.toml", rig, 1);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `load_with(scenario, rig)`, or a panic if it takes more than 10 s.
    fn load_soon(scenario: &Path, rig: Option<&Path>) -> Result<Loaded, ScenarioError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (scenario, rig) = (scenario.to_path_buf(), rig.map(Path::to_path_buf));
        std::thread::spawn(move || {
            let _ = tx.send(load_with(Some(&scenario), rig.as_deref()));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the scenario is read in good time")
    }

    #[test]
    fn only_a_plain_file_of_at_most_a_mebibyte_is_read() {
        let path = scenario_file("files", "/dev/zero");
        let e = load_soon(&path, None).unwrap_err();
        assert_eq!(e.field, "rig", "{e}");
        assert_eq!(e.line, Some(line_no(DEFAULT_SCENARIO, "rig = ")), "{e}");
        assert!(e.message.contains("not a regular file"), "{e}");
        let e = load_soon(Path::new("/dev/zero"), None).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        let e = load_soon(&path, Some(Path::new("/dev/zero"))).unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("/dev/zero", None), "{e}");
        // A pipe no one writes to: opening it must not wait for a writer.
        let dir = path.parent().unwrap();
        let fifo = dir.join("rig.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = load_soon(&path, Some(&fifo)).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        // Too large, and just large enough (a mebibyte of comment after the scenario).
        let rig = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rigs/pcie-2x8pin-hs.toml");
        let text =
            DEFAULT_SCENARIO.replacen("../rigs/pcie-2x8pin-hs.toml", rig.to_str().unwrap(), 1);
        let padded = |n: usize| format!("{text}#{}\n", "x".repeat(n - text.len() - 2));
        let big = dir.join("big.toml");
        std::fs::write(&big, padded(1 << 20)).unwrap();
        load_soon(&big, None).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&big, padded((1 << 20) + 1)).unwrap();
        let e = load_soon(&big, None).unwrap_err();
        assert!(e.message.contains("larger than 1048576 bytes"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn rig_file_errors_give_the_rig_files_line() {
        for (from, to) in [
            ("bits = 16", "bits = \"16\""),
            ("packet_bytes = 512", "packet_bytez = 512"),
            ("measures = \"voltage\"", "measures = \"volts\""),
            ("nominal_v = 3.3", "nominal_v == 3.3"),
        ] {
            let rig = DEFAULT_RIG.replacen(from, to, 1);
            let e = parse("s.toml", DEFAULT_SCENARIO, |_| {
                Ok(("rig.toml".into(), rig.clone()))
            })
            .unwrap_err();
            assert_eq!(e.file, "rig.toml", "{e}");
            assert_eq!(e.line, Some(line_no(&rig, to)), "{to}: {e}");
        }
    }

    #[test]
    fn a_scenario_offers_only_its_rigs_rates_and_clock() {
        let e = broken(|t| t.replacen("[mcu]\n", "[mcu]\ntick_hz = 84_000_000\n", 1));
        assert_eq!(e.field, "mcu.tick_hz", "{e}");
        assert!(e.message.contains("counts at 24000000 Hz"), "{e}");
        let e = broken(|t| {
            t.replacen(
                "[firmware]\n",
                "[firmware]\nsample_rates_hz = [300_000]\n",
                1,
            )
        });
        assert_eq!(e.field, "firmware.sample_rates_hz", "{e}");
        assert!(e.message.starts_with("300000 Hz is not a rate"), "{e}");
        // Left out, both come from the rig; a subset of the rig's rates is kept.
        let d = default_scenario();
        assert_eq!(d.scenario.mcu.tick_hz, d.rig.board.tick_hz);
        assert_eq!(
            d.scenario.firmware.sample_rates_hz,
            d.rig.board.sample_rates_hz
        );
        let text = DEFAULT_SCENARIO.replacen(
            "[firmware]\n",
            "[firmware]\nsample_rates_hz = [10_000]\n",
            1,
        );
        let l = parse("s.toml", &text, |_| {
            Ok(("rig.toml".into(), DEFAULT_RIG.into()))
        })
        .unwrap();
        assert_eq!(l.scenario.firmware.sample_rates_hz, vec![10_000]);
    }
}
