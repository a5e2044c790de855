//! Scenarios: a whole bench in one TOML file (documented field by field in
//! `hardware/twin/SCENARIOS.md`; examples in `hardware/scenarios/`). A malformed scenario
//! gets an error naming the file, the line and the field.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::clock::McuClockConfig;
use crate::gpu::{ConfigError, GpuConfig, KernelConfig, WorkloadConfig};
use crate::logger::LoggerConfig;
use crate::mcu::{FaultConfig, FirmwareConfig, TriggerPathConfig};
use crate::rig::{RigDescription, RigTruth};

/// The default scenario (MI300X-like: a 1 ms box logger every 1 ms, a ~200 µs two-phase
/// kernel), built in so that the twin runs without any file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/default.toml");
/// The rig the default scenario names: the fast rig (AD7606C-16 on a Teensy 4.1, USB high
/// speed).
pub const DEFAULT_RIG: &str = include_str!("../../rigs/pcie-2x8pin-hs.toml");

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
        std::fs::read_to_string(rig_path)
            .map(|t| (rig_path.display().to_string(), t))
            .map_err(|e| format!("cannot read the rig {}: {e}", rig_path.display()))
    };
    // A rig given apart from the scenario is read first, so that its errors name it alone.
    let chosen = rig
        .map(|r| {
            std::fs::read_to_string(r)
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
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
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
    let t = &scenario.rig_truth;
    for (i, r) in t.rails.iter().enumerate() {
        if !(r.share >= 0.0
            && r.source_v > 0.0
            && r.resistance_ohm >= 0.0
            && r.source_v.is_finite())
        {
            return Err(at(
                &format!("rig_truth.rail[{i}]"),
                "share and resistance_ohm must be >= 0, source_v > 0".into(),
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
        if !(c.noise_v_rms >= 0.0 && c.bandwidth_hz.is_none_or(|b| b > 0.0) && c.gain_error > -1.0)
        {
            return Err(at(
                &field,
                "noise_v_rms >= 0, bandwidth_hz > 0, gain_error > -1".into(),
            ));
        }
    }
    if !(0.0..).contains(&t.input_tau_s) {
        return Err(at("rig_truth.input_tau_s", "must be >= 0".into()));
    }
    let f = &scenario.faults;
    let probabilities = [f.corrupt_frame_probability, f.drop_byte_probability];
    if probabilities.iter().any(|p| !(0.0..=1.0).contains(p))
        || probabilities.iter().sum::<f64>() > 1.0
    {
        return Err(at(
            "faults",
            "probabilities within 0..=1, adding up to at most 1".into(),
        ));
    }
    if f.link_bytes_per_s.is_some_and(|r| r.is_nan() || r <= 0.0)
        || !(0.0..).contains(&f.disconnected_s)
    {
        return Err(at(
            "faults",
            "link_bytes_per_s > 0 and disconnected_s >= 0".into(),
        ));
    }
    let tr = &scenario.trigger;
    if !(tr.latency_s >= 0.0 && tr.jitter_s >= 0.0) {
        return Err(at("trigger", "latency_s and jitter_s must be >= 0".into()));
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
    if !m.error_ppm.is_finite() || m.error_ppm.abs() > 1e4 || !m.drift_ppm_per_s.is_finite() {
        return Err(at("mcu", "|error_ppm| <= 10000, finite drift".into()));
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
        let field = e.path().to_string();
        toml_error(file, text, e.inner(), &field)
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
