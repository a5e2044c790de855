//! `railtrace dvfs latency` on the twin, as a user runs it: the switching latency from the
//! host's request to the power step on the rig, recovered within 100 µs of the twin's for
//! a 1 ms and a 15 ms switch (the check). The rig's own delay (its 5 µs input
//! filter, the half-way point of a filtered step) and the request's bracket (a few µs)
//! are far inside that.

use std::path::Path;
use std::process::Command;

mod common;
use common::TempDir;

/// The shipped DVFS scenario with its switching latency replaced and its rig named by
/// absolute path.
fn scenario(dir: &TempDir, latency_s: f64) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("hardware/scenarios/dvfs.toml")).unwrap();
    let rig = root.join("hardware/rigs/pcie-2x8pin-hs.toml");
    let old = text
        .lines()
        .find(|l| l.starts_with("dvfs_switch_latency_s"))
        .expect("the scenario sets dvfs_switch_latency_s")
        .to_string();
    let text = text
        .replace(&old, &format!("dvfs_switch_latency_s = {latency_s:e}"))
        .replace("../rigs/pcie-2x8pin-hs.toml", rig.to_str().unwrap());
    let path = dir.join("dvfs.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn latency(latency_s: f64, wait_ms: (f64, f64), window_ms: f64) -> serde_json::Value {
    let dir = TempDir::new("dvfs");
    let sc = scenario(&dir, latency_s);
    let out = dir.join("dvfs.arrow");
    let o = Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(["dvfs", "latency", "--switches", "40", "--json"])
        .arg("--scenario")
        .arg(&sc)
        .arg("--wait-ms")
        .arg(wait_ms.0.to_string())
        .arg(wait_ms.1.to_string())
        .arg("--window-ms")
        .arg(window_ms.to_string())
        .arg("-o")
        .arg(&out)
        .arg("--plot")
        .arg(dir.join("dvfs.png"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    eprintln!("{stderr}");
    assert!(o.status.success(), "{stderr}");
    assert!(dir.join("dvfs.png").is_file());
    // The run can be analysed again from its files.
    let again = Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(["dvfs", "latency", "--json", "--window-ms"])
        .arg(window_ms.to_string())
        .arg("--input")
        .arg(&out)
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(again.stdout, o.stdout, "the same figures from the files");
    serde_json::from_slice(&o.stdout).unwrap()
}

fn check(l: &serde_json::Value, latency_s: f64) {
    let switches = l["switches"].as_array().unwrap();
    let found = l["found"].as_u64().unwrap() as usize;
    // Every request changes the level except the first (the GPU starts at the first
    // level, which the first request asks for).
    assert!(found >= switches.len() - 1, "{found} of {}", switches.len());
    // Each switch within 100 µs, plus the half-width of its request's host bracket: the
    // request's instant is known only to within it (a host thread descheduled between its
    // two clock reads widens it).
    for s in switches.iter().filter(|s| !s["latency_s"].is_null()) {
        let x = s["latency_s"].as_f64().unwrap();
        let half = s["request_half_width_s"].as_f64().unwrap();
        assert!(
            (x - latency_s).abs() < 100e-6 + half,
            "a switch took {x} s (request known to ±{half} s), the twin's {latency_s}"
        );
    }
    let median = l["median_s"].as_f64().unwrap();
    eprintln!(
        "twin {:.3} ms: median {:.4} ms, 5-95 % {:.4}-{:.4} ms",
        latency_s * 1e3,
        median * 1e3,
        l["p05_s"].as_f64().unwrap() * 1e3,
        l["p95_s"].as_f64().unwrap() * 1e3
    );
    assert!((median - latency_s).abs() < 100e-6);
}

#[test]
fn a_1ms_switch_is_measured_within_100_us() {
    check(&latency(1e-3, (20.0, 30.0), 10.0), 1e-3);
}

#[test]
fn a_15ms_switch_is_measured_within_100_us() {
    check(&latency(15e-3, (40.0, 60.0), 30.0), 15e-3);
}
