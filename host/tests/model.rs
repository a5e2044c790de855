//! `railtrace model fit` and `railtrace model validate` as a user runs them on the twin's
//! DVFS bench (hardware/scenarios/dvfs.toml: a true power model over utilisation, f, V(f)
//! and temperature, a thermal model, a 1 ms box logger), with the checks:
//! - fitted on the rig, held-out kernels' power within 5 % MAE, held-out frequencies'
//!   execution time within 3 %;
//! - fitted on the raw 1 ms logger with ~0.2 ms kernels, clearly worse (each reading
//!   averages a kernel with ~0.8 ms of idle: the logger sees about half the kernel's
//!   power); fitted on the corrected logger, within 2 points of the rig-fitted model;
//! - the temperature term's coefficient within 20 % of the twin's (the twin's leakage is
//!   `leak_w·(V/V0)·e^{leak_per_c·(T − t_ref)}`, the model's form exactly), and its share
//!   of the error reported.
//!
//! One test profiles every run once (the cost) and fits and validates on them.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::TempDir;

fn railtrace(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = railtrace(args);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "railtrace {args:?}: {err}");
    eprintln!("{err}");
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn fails(args: &[&str]) -> String {
    let o = railtrace(args);
    assert!(!o.status.success(), "railtrace {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn scenario() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hardware/scenarios/dvfs.toml")
}

/// Profiles `kernel` at `level` (after `preheat_s` of it back to back) into `dir`.
fn profile(dir: &TempDir, kernel: &str, level: &str, preheat_s: f64) -> String {
    let name = format!(
        "{kernel}-{level}{}.arrow",
        if preheat_s > 0.0 { "-hot" } else { "" }
    );
    let out = dir.join(&name);
    let (sc, out_s, pre) = (
        scenario().display().to_string(),
        out.display().to_string(),
        preheat_s.to_string(),
    );
    ok(&[
        "profile",
        "--gpu",
        "twin",
        "--scenario",
        &sc,
        "--kernel",
        kernel,
        "--dvfs",
        level,
        "--runs",
        "200",
        "--preheat-s",
        &pre,
        "-o",
        &out_s,
    ]);
    out_s
}

fn num(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// Fits `kind` by `against` on `runs` into `dir/<kind>-<against><tag>.toml`.
fn fit(dir: &TempDir, kind: &str, against: &str, tag: &str, runs: &[&String]) -> String {
    let out = dir
        .join(&format!("{kind}-{against}{tag}.toml"))
        .display()
        .to_string();
    let logger = dir.join("logger.toml").display().to_string();
    let mut args = vec![
        "model",
        "fit",
        "--kind",
        kind,
        "--against",
        against,
        "-o",
        &out,
    ];
    if against == "corrected" {
        args.extend(["--logger", logger.as_str()]);
    }
    args.extend(runs.iter().map(|s| s.as_str()));
    ok(&args);
    out
}

/// Validates `models` on `runs`: each model's summary.
fn validate(models: &[&String], runs: &[String], plot: &Path) -> Vec<serde_json::Value> {
    let plot = plot.display().to_string();
    let mut args = vec!["model", "validate", "--json", "--plot", plot.as_str()];
    args.extend(models.iter().map(|s| s.as_str()));
    args.extend(runs.iter().map(|s| s.as_str()));
    let out: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    out["models"].as_array().unwrap().clone()
}

/// The checks on one model fitted on the rig, the raw logger and the corrected
/// logger (`v`, in that order), over the runs `held` out: the rig's power MAE within
/// 5 %, the raw logger's at least 10 points worse, the corrected within 2 points of the
/// rig's.
fn three_ways(v: &[serde_json::Value], held: &str, what: &str) {
    let mae = |m: &serde_json::Value| num(&m[held]["power_mae_pct"]);
    let (rig, raw, cor) = (mae(&v[0]), mae(&v[1]), mae(&v[2]));
    eprintln!("{what}: power MAE rig {rig:.2} %, logger {raw:.2} %, corrected {cor:.2} %");
    assert_eq!(v[0][held]["runs"], 6, "{what}");
    assert!(rig <= 5.0, "{what}: fitted on the rig, {rig} %");
    assert!(
        raw >= rig + 10.0,
        "{what}: the raw logger's is not clearly worse: {raw} % vs {rig} %"
    );
    assert!(
        (cor - rig).abs() <= 2.0,
        "{what}: corrected {cor} % vs rig {rig} %"
    );
}

#[test]
fn power_models_fitted_three_ways_and_held_against_the_rig() {
    let dir = TempDir::new("model");
    let kernels = ["gemm", "stream", "attention", "layernorm"];
    let levels = ["high", "mid", "low"];
    let mut runs: Vec<(String, String, bool, String)> = Vec::new(); // kernel, level, hot, path
    for k in kernels {
        for l in levels {
            runs.push((k.into(), l.into(), false, profile(&dir, k, l, 0.0)));
        }
    }
    // Hot runs: 8 s of the kernel first heats the die (τ 3 s) by up to ~18 °C.
    for k in ["gemm", "attention"] {
        for l in levels {
            runs.push((k.into(), l.into(), true, profile(&dir, k, l, 8.0)));
        }
    }
    let paths: Vec<String> = runs.iter().map(|r| r.3.clone()).collect();
    let logger = dir.join("logger.toml").display().to_string();
    ok(&["calibrate", "logger", &runs[0].3, "-o", &logger]);

    // The utilisation model fitted on three kernels (the fourth held out), the DVFS model
    // at the highest and lowest clocks (the middle held out), each three ways, and the
    // DVFS model on all the rig's runs (for its temperature term); then all held against
    // the rig on every run, in one validation.
    let util_runs: Vec<&String> = runs
        .iter()
        .filter(|r| r.0 != "attention")
        .map(|r| &r.3)
        .collect();
    let dvfs_runs: Vec<&String> = runs.iter().filter(|r| r.1 != "mid").map(|r| &r.3).collect();
    let all: Vec<&String> = paths.iter().collect();
    let mut models = Vec::new();
    for (kind, fitted_on) in [("util", &util_runs), ("dvfs", &dvfs_runs)] {
        for against in ["rig", "logger", "corrected"] {
            models.push(fit(&dir, kind, against, "", fitted_on));
        }
    }
    models.push(fit(&dir, "dvfs", "rig", "-all", &all));
    let picture = dir.join("models.png");
    let v = validate(&models.iter().collect::<Vec<_>>(), &paths, &picture);
    assert!(std::fs::read(&picture).unwrap().starts_with(b"\x89PNG"));

    // Utilisation: attention's 6 runs held out; DVFS: the middle clock's 6.
    three_ways(&v[0..3], "held_out_kernels", "util, held-out kernel");
    three_ways(&v[3..6], "held_out_levels", "dvfs, held-out clock");
    let time = num(&v[3]["held_out_levels"]["time_mae_pct"]);
    eprintln!("dvfs, held-out clock: time MAE {time:.3} %");
    assert!(
        time <= 3.0,
        "held-out frequency's execution time MAE {time} %"
    );
    // Every kernel's time model predicts the middle clock (one piece: t = α/f + β).
    for k in kernels {
        let t = num(&v[3]["per_kernel"][k]["time_mae_pct"]);
        assert!(t <= 3.0, "{k}: time MAE {t} %");
    }

    // The temperature term, on all the rig's runs: γ within 20 % of the twin's, and the
    // model without it worse.
    let gamma = num(&v[6]["gamma_per_c"]);
    let twin: toml::Table = toml::from_str(&std::fs::read_to_string(scenario()).unwrap()).unwrap();
    let truth = twin["gpu"]["power_model"]["leak_per_c"].as_float().unwrap();
    eprintln!("γ {gamma:.5} /°C, the twin's {truth}");
    assert!((gamma - truth).abs() <= 0.2 * truth, "γ {gamma} vs {truth}");
    let (with, without) = (
        num(&v[6]["overall"]["power_mae_pct"]),
        num(&v[6]["overall"]["power_mae_no_temp_pct"]),
    );
    eprintln!("temperature term: power MAE {with:.3} % with, {without:.3} % without");
    assert!(without > with, "{without} vs {with}");
}

#[test]
fn bad_inputs_are_named() {
    let dir = TempDir::new("model-bad");
    let sc = scenario().display().to_string();
    let run = dir.join("plain.arrow").display().to_string();
    ok(&[
        "profile",
        "--gpu",
        "twin",
        "--scenario",
        &sc,
        "--kernel",
        "gemm",
        "--runs",
        "20",
        "-o",
        &run,
    ]);
    // Profiled without a level: its frequency and voltage are unknown.
    let e = fails(&["model", "fit", "--kind", "util", "--against", "rig", &run]);
    assert!(e.contains("plain.arrow") && e.contains("--dvfs"), "{e}");
    // Corrected without the logger's model.
    let e = fails(&[
        "model",
        "fit",
        "--kind",
        "util",
        "--against",
        "corrected",
        &run,
    ]);
    assert!(e.contains("--logger"), "{e}");
    // A model file that is not one.
    let bogus = dir.join("bogus.toml");
    std::fs::write(&bogus, "format = \"something else\"\n").unwrap();
    let e = fails(&["model", "validate", bogus.to_str().unwrap(), &run]);
    assert!(
        e.contains("bogus.toml") && e.contains("not a railtrace power model"),
        "{e}"
    );
    // No model at all.
    let e = fails(&["model", "validate", &run]);
    assert!(e.contains("no model"), "{e}");
    // A GPU description without levels.
    let gpu = dir.join("gpu.toml");
    std::fs::write(&gpu, "[gpu]\n").unwrap();
    let e = fails(&[
        "model",
        "fit",
        "--kind",
        "util",
        "--against",
        "rig",
        "--gpu",
        gpu.to_str().unwrap(),
        &run,
    ]);
    assert!(
        e.contains("gpu.toml") && e.contains("no [[gpu.dvfs]] levels"),
        "{e}"
    );
}
