//! Profiling runs recorded on a real NVIDIA H200 (driver 580.159.04, CUDA 13.0, on
//! 2026-12-04), without a rig: `railtrace profile --gpu cuda --logger nvml --kernel
//! two_phase --runs 1000`, and `--kernel compute --runs 300`. Analysed again here, they
//! must read as they did there: one behaviour of each kernel, the GPU's clock tied to the
//! host's within a microsecond, NVML's buffer read every 20 ms, and its energy counter
//! agreeing with its power samples.

mod common;

use std::path::PathBuf;

use common::{railtrace, TempDir};

fn recording() -> PathBuf {
    data("h200-two-phase.arrow")
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn json(args: &[&str]) -> serde_json::Value {
    let dir = TempDir::new("h200");
    let o = railtrace(&dir.0, args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_h200_run_reads_as_one_kernel_on_a_tight_clock_link() {
    let path = recording();
    let a = json(&["report", path.to_str().unwrap(), "--json"]);
    // %globaltimer steps in 32 ns there, and the executions span 342.5-350.0 µs: one
    // cluster holding all of them (a clock that coarse once split a kernel in five).
    let clusters = a["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 1, "{clusters:?}");
    assert_eq!(clusters[0][2], 1000);
    let (lo, hi) = (
        clusters[0][0].as_f64().unwrap(),
        clusters[0][1].as_f64().unwrap(),
    );
    assert!(lo > 340e-6 && hi < 352e-6, "{lo} {hi}");
    // The GPU link: each read bracketed by two host reads a few µs apart, the tightest
    // fifth fitted: well under a microsecond RMS, and a rate error of a crystal's ppm.
    let gpu = &a["gpu"];
    assert!(gpu["rms_s"].as_f64().unwrap() < 1e-6, "{gpu}");
    assert!(gpu["rate_error_ppm"].as_f64().unwrap().abs() < 5.0, "{gpu}");
    // The logger's profile is its raw readings, and the report says so.
    let notes = a["support"]["notes"].to_string();
    assert!(
        notes.contains("no rig") && notes.contains("not deconvolved"),
        "{notes}"
    );
}

#[test]
fn the_h200_loggers_buffer_and_energy_counter_agree() {
    let path = recording();
    let i = json(&["inspect", path.to_str().unwrap(), "--json"]);
    let logger = &i["logger"];
    assert_eq!(logger["sources"], serde_json::json!(["nvml-samples"]));
    assert_eq!(logger["readings"], 184);
    // 184 samples of NVML's buffer over the 3.7 s run: one every 20 ms.
    let counter = &logger["energy_counter"];
    let span = counter["span_s"].as_f64().unwrap();
    assert!((span / 183.0 - 0.020).abs() < 0.001, "{span}");
    // The counter and the samples (their mean over the run is 147.36 W) are two of the
    // driver's views of one power. The counter moved in steps every 100 ms there, so the
    // energy between its first and last reads is that of a span up to 0.1 s off the
    // 3.66 s between them: 2.7 %, hence 3 % (measured there: 1.0 %).
    let mean_w = counter["mean_w"].as_f64().unwrap();
    assert!((mean_w / 147.36 - 1.0).abs() < 0.03, "{mean_w}");
}

/// The compute kernel alone runs in 111.2-111.7 µs there, stamped in 32 ns steps: a few
/// exact values with no spread of their own, which once split it into five clusters
/// (97 of 300 kept). One cluster holding all of them.
#[test]
fn the_h200_compute_kernel_on_its_coarse_clock_is_one_cluster() {
    let path = data("h200-compute.arrow");
    let a = json(&["report", path.to_str().unwrap(), "--json"]);
    let clusters = a["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 1, "{clusters:?}");
    assert_eq!(clusters[0][2], 300);
}
