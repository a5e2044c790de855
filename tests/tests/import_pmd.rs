//! The PMD importer on the real paired traces in `../shared/data/gpu-power-benchmark/`:
//! the external meter's records decode to the documented timing, the GPU's own readings
//! land on the same timeline (UTC+1 for the A100 runs), and the two agree as the published
//! study says (nvidia-smi ≈ 0.954 × meter − 1.2 W on the A100 PCIe 40 GB).

use std::path::PathBuf;

use railtrace::store::import::pmd::read_run;

fn data(run: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/gpu-power-benchmark")
        .join(run);
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} is not here (the shared data folder sits beside the repository)",
            dir.display()
        );
        None
    }
}

#[test]
fn a100_transient_response_imports_onto_one_timeline() {
    let Some(dir) = data("Transient_Response/A100_TR") else {
        return;
    };
    let run = read_run(&dir, 1.0).unwrap();
    let t = &run.pmd.time_us;
    assert_eq!(t.len(), 67_051);
    let span_s = (t[t.len() - 1] - t[0]) / 1e6;
    // Mean record spacing "about 209 µs" over about 14 s.
    let spacing_us = span_s * 1e6 / (t.len() - 1) as f64;
    assert!((spacing_us - 209.0).abs() < 2.0, "{spacing_us} µs");
    assert!((13.5..14.5).contains(&span_s), "{span_s} s");
    assert!(
        t.windows(2).all(|w| w[1] > w[0]),
        "the unwrapped tick counter only increases"
    );
    // The GPU's readings and the load's edges fall within the meter's span.
    let smi: Vec<_> = run
        .smi
        .iter()
        .filter(|r| r.time_us >= t[0] && r.time_us <= t[t.len() - 1])
        .collect();
    // nvidia-smi logged from before the meter started to after it stopped, every ~13 ms:
    // with the right time zone its readings cover the meter's whole span.
    assert!(
        smi.len() > 1000,
        "{} of {} readings overlap",
        smi.len(),
        run.smi.len()
    );
    assert!(
        smi[0].time_us - t[0] < 50_000.0 && t[t.len() - 1] - smi[smi.len() - 1].time_us < 50_000.0
    );
    assert!(run
        .edges_us
        .iter()
        .all(|e| *e > t[0] && *e < t[t.len() - 1]));
    // Means over the overlap: the GPU reads low by the published gain and offset, to a
    // few percent (its 25 ms window sees a quarter of the time, which averages out over
    // the 14 s of steps).
    let (a, b) = (smi[0].time_us, smi[smi.len() - 1].time_us);
    let meter: Vec<f64> = (0..t.len())
        .filter(|&i| t[i] >= a && t[i] <= b)
        .map(|i| run.pmd.power_w(i))
        .collect();
    let meter_w = meter.iter().sum::<f64>() / meter.len() as f64;
    let gpu_w = smi.iter().map(|r| r.power_draw_w).sum::<f64>() / smi.len() as f64;
    let predicted = 0.954 * meter_w - 1.2;
    assert!(
        (gpu_w / predicted - 1.0).abs() < 0.05,
        "GPU {gpu_w:.1} W, meter {meter_w:.1} W"
    );
    assert!(meter_w > 50.0 && meter_w < 300.0, "{meter_w}");
}

#[test]
fn a_broken_folder_gets_an_error_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("railtrace-pmd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("PMD_start_ts.txt"), "1689325827417571\n").unwrap();
    std::fs::write(dir.join("PMD_data.bin"), [0u8; 20]).unwrap();
    let e = read_run(&dir, 0.0).unwrap_err().to_string();
    assert!(
        e.contains("PMD_data.bin")
            && e.contains("20 bytes is not a whole number of 18-byte records"),
        "{e}"
    );
    // Two plausible records (12.1 V on every pair, 209 µs apart), so that gpudata.csv is
    // read next.
    let record = |tick: u16| -> Vec<u8> {
        let mut b = tick.to_le_bytes().to_vec();
        for w in [1600u16, 100, 1600, 100, 1613, 100, 1600, 100] {
            b.extend((w << 4).to_le_bytes());
        }
        b
    };
    std::fs::write(dir.join("PMD_data.bin"), [record(0), record(613)].concat()).unwrap();
    std::fs::write(
        dir.join("gpudata.csv"),
        "timestamp, power.draw [W]\n2023/07/14 10:10:26.905, lots\n",
    )
    .unwrap();
    let e = read_run(&dir, 0.0).unwrap_err().to_string();
    assert!(e.contains("gpudata.csv:2: bad power.draw"), "{e}");
    std::fs::write(dir.join("PMD_start_ts.txt"), "yesterday").unwrap();
    let e = read_run(&dir, 0.0).unwrap_err().to_string();
    assert!(e.contains("PMD_start_ts.txt:1: not a time"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
