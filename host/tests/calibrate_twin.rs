//! `railtrace calibrate logger` on the twin, as a user runs it: for each of the four logger
//! families, a seeded scenario with a 1 ms logger of that family, a profiling run beside
//! the rig, and the identification against the rig held to the scenario's logger: the
//! right family; width (window or τ) within 2 %; delay within 20 µs; gain within 1 %;
//! offset within 0.5 W.
//!
//! The reference is the rig, not the GPU's own power: its 5 µs input filter makes the
//! logger look about 5 µs early (well inside 20 µs), its sensors read about 0.1 % and
//! 0.4 W off (inside 1 % and 0.5 W).

use std::path::Path;
use std::process::Command;

mod common;
use common::TempDir;

struct Case {
    family: &'static str,
    /// The scenario's `[logger]` lines, besides period, stamp and quantum.
    logger: &'static str,
    /// Window or τ, s (none for the free response).
    width_s: Option<f64>,
    delay_s: f64,
    gain: f64,
    offset_w: f64,
}

const CASES: [Case; 4] = [
    Case {
        family: "box",
        logger: "kind = \"box\"\nwindow_s = 1e-3\ndelay_s = 50e-6\ngain = 0.97\noffset_w = -2.0",
        width_s: Some(1e-3),
        delay_s: 50e-6,
        gain: 0.97,
        offset_w: -2.0,
    },
    Case {
        family: "partial",
        logger: "kind = \"partial\"\nwindow_s = 0.25e-3\ndelay_s = 30e-6\ngain = 1.02\noffset_w = 1.5",
        width_s: Some(0.25e-3),
        delay_s: 30e-6,
        gain: 1.02,
        offset_w: 1.5,
    },
    Case {
        family: "exponential",
        logger: "kind = \"exponential\"\ntau_s = 0.3e-3\ndelay_s = 20e-6\ngain = 0.95\noffset_w = -1.0",
        width_s: Some(0.3e-3),
        delay_s: 20e-6,
        gain: 0.95,
        offset_w: -1.0,
    },
    Case {
        // A two-humped response no parametric family has.
        family: "response",
        logger: "kind = \"response\"\nsamples = [3.0, 1.0, 0.0, 0.0, 2.0, 2.0]\nspacing_s = 0.1e-3\ndelay_s = 40e-6\ngain = 1.0\noffset_w = 0.5",
        width_s: None,
        delay_s: 40e-6,
        gain: 1.0,
        offset_w: 0.5,
    },
];

/// The default scenario with its logger replaced (1 ms period, 10 mW quantum, stamped on
/// the GPU clock), its rig named by absolute path, and the rig's channel offsets zeroed:
/// a lab zeroes its reference before calibrating a logger against it (the scenario's
/// offsets put the rig 0.35 W high at idle, most of the 0.5 W the offset check allows).
/// A 1 W quantum would also do that: with most readings at one idle level, their common
/// rounding error is an offset no fit can tell from the logger's own.
fn scenario(dir: &TempDir, logger: &str) -> std::path::PathBuf {
    let text = railtrace_twin::scenario::DEFAULT_SCENARIO;
    let head: String = text[..text.find("[logger]").unwrap()]
        .lines()
        .filter(|l| !l.starts_with("offset_v"))
        .map(|l| format!("{l}\n"))
        .collect();
    let rig = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hardware/rigs/pcie-2x8pin-hs.toml");
    let text = format!(
        "{}[logger]\n{logger}\nperiod_s = 1e-3\nphase_s = 1e-3\nquantum_w = 0.01\nstamp = {{ kind = \"gpu_clock\" }}\n",
        head.replace("../rigs/pcie-2x8pin-hs.toml", rig.to_str().unwrap())
    );
    let path = dir.join("scenario.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn railtrace(args: &[&str]) -> std::process::Output {
    let o = Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(args)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "railtrace {args:?} failed");
    o
}

#[test]
fn each_logger_family_is_identified_against_the_rig() {
    for case in &CASES {
        let dir = TempDir::new(&format!("calibrate-{}", case.family));
        let sc = scenario(&dir, case.logger);
        let profile = dir.join("profile.arrow");
        let (sc, profile) = (sc.to_str().unwrap(), profile.to_str().unwrap());
        railtrace(&[
            "profile",
            "--scenario",
            sc,
            "--runs",
            "300",
            "--delay-ms",
            "1.5",
            "3",
            "-o",
            profile,
        ]);
        let model = dir.join("logger.toml");
        let o = railtrace(&[
            "calibrate",
            "logger",
            profile,
            "-o",
            model.to_str().unwrap(),
            "--json",
        ]);
        let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let num = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
        eprintln!(
            "{}: chose {}, width {:?} / {:?} s, delay {:.1} µs (scenario {:.1}), gain {:.4} ({}), offset {:.2} W ({})",
            case.family,
            m["family"],
            m.get("window_s").or(m.get("tau_s")),
            case.width_s,
            num("delay_s") * 1e6,
            case.delay_s * 1e6,
            num("gain"),
            case.gain,
            num("offset_w"),
            case.offset_w
        );
        assert_eq!(m["family"], case.family, "{m}");
        assert!((num("period_s") - 1e-3).abs() < 1e-6, "{m}");
        if let Some(w) = case.width_s {
            let got = m["window_s"].as_f64().or(m["tau_s"].as_f64()).unwrap();
            assert!(
                (got / w - 1.0).abs() <= 0.02,
                "width {got} s, scenario {w} s"
            );
        }
        assert!(
            (num("delay_s") - case.delay_s).abs() <= 20e-6,
            "delay {} s",
            num("delay_s")
        );
        assert!(
            (num("gain") / case.gain - 1.0).abs() <= 0.01,
            "gain {}",
            num("gain")
        );
        assert!(
            (num("offset_w") - case.offset_w).abs() <= 0.5,
            "offset {} W",
            num("offset_w")
        );
    }
}
