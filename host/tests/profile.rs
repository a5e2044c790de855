//! A profiling run on the twin, analysed and scored against the twin's truth: the clock
//! links recover the true clocks within 5 µs RMS with a 50 ppm MCU clock error and 20 µs
//! RMS trigger jitter.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use railtrace::analysis::stitch::{analyse, Analysis, Options};
use railtrace::gpu::profile::{acquire, Plan};
use railtrace::gpu::twin::{TwinGpu, TwinTrigger};
use railtrace::gpu::Launch;
use railtrace::link::capture::{capture, Config, Counters};
use railtrace::store::recording::rig_path;
use railtrace_calibration::binning::cluster;
use railtrace_calibration::stitch::{assign, profile, Execution, Policy, Reading};

mod common;
use common::{f64_columns, TempDir};

/// The default scenario with its MCU clock and trigger path replaced.
fn scenario(error_ppm: f64, latency_s: f64, jitter_s: f64) -> railtrace_twin::Loaded {
    let text = railtrace_twin::scenario::DEFAULT_SCENARIO
        .replace("error_ppm = 30.0", &format!("error_ppm = {error_ppm:?}"))
        .replace(
            "[trigger]\nlatency_s = 2e-6\njitter_s = 1e-6",
            &format!("[trigger]\nlatency_s = {latency_s:e}\njitter_s = {jitter_s:e}"),
        );
    assert!(text.contains(&format!("jitter_s = {jitter_s:e}")));
    railtrace_twin::scenario::parse("profile.toml", &text, |_| {
        Ok(("rig".into(), railtrace_twin::scenario::DEFAULT_RIG.into()))
    })
    .expect("a valid scenario")
}

/// Runs `runs` trains of `count` executions on the twin, captures the rig meanwhile,
/// analyses.
fn run_trains(
    loaded: &railtrace_twin::Loaded,
    runs: usize,
    count: u32,
    dir: &TempDir,
    options: &Options,
) -> (Analysis, railtrace_twin::Twin, i64) {
    let truth = dir.join("truth");
    std::fs::create_dir_all(&truth).unwrap();
    let twin = railtrace_twin::Twin::start_with(loaded, Some(&truth)).unwrap();
    let out = dir.join("profile.arrow");
    let config = Config {
        port: twin.path().to_path_buf(),
        output: rig_path(&out),
        rig: None,
        rate_hz: None,
        // A sample in every 10 µs bin, as `railtrace profile` asks by default.
        rate_at_least_hz: Some(100_000),
        channels: None,
        averaging: 1,
        duration: None,
        reconnect_wait: Duration::from_secs(5),
        replace: true,
        allow_drops: false,
        tap: None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let rig = {
        let (stop, counters) = (stop.clone(), counters.clone());
        std::thread::spawn(move || capture(&config, &stop, &counters, |_| {}))
    };
    while counters.samples.load(Ordering::Relaxed) == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let gpu = TwinGpu::new(&twin);
    let plan = Plan {
        launch: Launch {
            kernel: "gemm".into(),
            delay_s: (1e-3, 3e-3),
            warmup: 0,
            count,
            dvfs: None,
        },
        runs,
        clock_reads: 5,
        trigger_line: 0,
        target: None,
        preheat_s: 0.0,
    };
    acquire(
        &mut gpu.runner(3),
        &mut gpu.logger(),
        &mut TwinTrigger::new(&twin, 0),
        &plan,
        &out,
        serde_json::Value::Null,
        |_| {},
    )
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    rig.join().unwrap().unwrap();
    let a = analyse(&out, &rig_path(&out), options).unwrap();
    let epoch = railtrace::store::recording::read(&out)
        .unwrap()
        .meta
        .epoch_utc_ns;
    (a, twin, epoch)
}

#[test]
fn clocks_align_within_5_us_with_a_50_ppm_mcu_and_20_us_trigger_jitter() {
    // A USB-UART's modem line: 100 µs from the host's call to the edge, 20 µs RMS jitter;
    // the mean latency is the trigger output's known calibration.
    let loaded = scenario(50.0, 100e-6, 20e-6);
    let dir = TempDir::new("profile-align");
    let options = Options {
        trigger_latency_s: 100e-6,
        ..Options::default()
    };
    let (a, twin, epoch) = run(&loaded, 300, &dir, &options);
    // The truth: device ticks → true time (the MCU clock model), GPU ticks → true time
    // (the counter's model), true time → host time (the twin's own mapping).
    let host = |t: f64| (twin.unix_ns(t) - epoch) as f64 * 1e-9;
    let mcu = loaded.scenario.mcu;
    let gpu = twin.gpu_clock();
    let (mut dev_sq, mut gpu_sq, mut n) = (0.0, 0.0, 0);
    for e in &a.executions {
        // Over the run's span: at each execution's start, on both links.
        // The true instant (s since the twin started) of the execution's start, as
        // the GPU link put it on the host's timeline (s since the profile's epoch).
        let true_t = e.start_s - (twin.unix_ns(0.0) - epoch) as f64 * 1e-9;
        let dev_ticks = mcu.ticks_at(true_t);
        let dev_err = a.device.to_host(dev_ticks as f64 / f64::from(mcu.tick_hz))
            - host(mcu.time_at(dev_ticks));
        let gpu_ticks = gpu.ticks_at(true_t);
        let gpu_true =
            (gpu_ticks as f64 / gpu.rate_hz() - gpu.offset_s()) / (1.0 + gpu.drift_ppm() * 1e-6);
        let gpu_err = a.gpu.to_host(gpu_ticks as f64 / gpu.rate_hz()) - host(gpu_true);
        dev_sq += dev_err * dev_err;
        gpu_sq += gpu_err * gpu_err;
        n += 1;
    }
    twin.stop().unwrap();
    let (dev_rms, gpu_rms) = (
        (dev_sq / f64::from(n)).sqrt(),
        (gpu_sq / f64::from(n)).sqrt(),
    );
    eprintln!(
        "device→host: {:.2} µs RMS against the truth (fit residual {:.2} µs, {:+.2} ppm); GPU→host: {:.3} µs RMS ({:+.2} ppm)",
        dev_rms * 1e6,
        a.device.rms_s * 1e6,
        a.device.rate_error_ppm,
        gpu_rms * 1e6,
        a.gpu.rate_error_ppm
    );
    eprintln!(
        "device link: {} used, {} outliers, residual RMS over all {:.2} µs",
        a.device.used,
        a.device.outliers,
        (a.device.residuals_s.iter().map(|r| r * r).sum::<f64>()
            / a.device.residuals_s.len() as f64)
            .sqrt()
            * 1e6
    );
    assert!(dev_rms < 5e-6, "device↔host {dev_rms} s RMS");
    assert!(gpu_rms < 5e-6, "GPU↔host {gpu_rms} s RMS");
    // The fits see the clocks' rate errors: the MCU's 50 ppm, the GPU counter's 20 ppm.
    // A slope from n edges with jitter σ over a span T has a standard error of about
    // σ / (T·√(n/12)): 20 µs over ~1 s with 600 edges is ~3 ppm; allow 4 of those.
    let span = a.executions.last().unwrap().start_s - a.executions[0].start_s;
    let se_ppm = 20e-6 / (span * (a.device.used as f64 / 12.0).sqrt()) * 1e6;
    assert!(
        (a.device.rate_error_ppm - 50.0).abs() < 4.0 * se_ppm,
        "{} ppm (standard error {se_ppm} ppm)",
        a.device.rate_error_ppm
    );
    assert!(
        (a.gpu.rate_error_ppm - 20.0).abs() < 0.5,
        "{}",
        a.gpu.rate_error_ppm
    );
}

/// Runs `runs` single executions.
fn run(
    loaded: &railtrace_twin::Loaded,
    runs: usize,
    dir: &TempDir,
    options: &Options,
) -> (Analysis, railtrace_twin::Twin, i64) {
    run_trains(loaded, runs, 1, dir, options)
}

#[test]
fn the_loggers_stitched_profile_is_the_true_power_through_the_loggers_response() {
    let loaded = railtrace_twin::default_scenario();
    let dir = TempDir::new("profile-logger");
    let (a, twin, _) = run(&loaded, 400, &dir, &Options::default());
    twin.stop().unwrap(); // closes the truth files
                          // The reference, from the truth alone: each report's true response (the true power
                          // through the logger's true response, before its gain, offset and quantisation) at
                          // its true instant, stitched onto the true executions of the dominant duration cluster.
    let truth = dir.join("truth");
    let e = f64_columns(
        &truth.join("executions.arrow"),
        &["launch_s", "start_s", "end_s"],
    );
    let first = a.executions.len();
    let n = e[0].len();
    // The host's executions are the last ones (the scenario's workload ran before).
    let execs: Vec<Execution> = (n - first..n)
        .map(|i| Execution {
            start: e[1][i],
            end: e[2][i],
        })
        .collect();
    let durations: Vec<f64> = execs.iter().map(|x| x.end - x.start).collect();
    let c = cluster(&durations, (durations.len() / 50).max(3));
    let mut kept = vec![false; execs.len()];
    for &i in &c.dominant().unwrap().indices {
        kept[i] = true;
    }
    let l = f64_columns(&truth.join("logger.arrow"), &["true_time_s", "response_w"]);
    let readings: Vec<Reading> = l[0]
        .iter()
        .zip(&l[1])
        .map(|(&time, &power_w)| Reading { time, power_w })
        .collect();
    let o = &a.options;
    // Each reading belongs to the latest execution before it, kept or not; those of
    // dropped executions are left out.
    let policy = Policy::Following {
        horizon: o.horizon_s,
    };
    let mut stitched = assign(&readings, &execs, policy);
    stitched.retain(|p| kept[p.execution]);
    let reference = profile(&stitched, o.bin_s, o.confidence).unwrap();
    let peak = reference
        .iter()
        .map(|b| b.mean_w)
        .filter(|w| w.is_finite())
        .fold(0.0, f64::max);
    let (mut sq, mut bins) = (0.0, 0);
    for (got, want) in a.logger.iter().zip(&reference) {
        assert!((got.lo_s - want.lo).abs() < 1e-12, "the same bins");
        if got.n > 0 && want.n > 0 {
            sq += (got.mean_w - want.mean_w).powi(2);
            bins += 1;
        }
    }
    let rms = (sq / f64::from(bins)).sqrt();
    eprintln!(
        "logger profile: {bins} bins, RMS {rms:.3} W against the truth = {:.3} % of its {peak:.1} W peak",
        100.0 * rms / peak
    );
    assert!(bins > 50, "{bins} bins compared");
    assert!(rms <= 0.02 * peak, "RMS {rms} W, peak {peak} W");
    // The default kernel's durations are bimodal (85 % at 1.0, 15 % at 1.08, 1 % spread,
    // and rare outliers; every single execution is a first one, ×1.3): the clustering
    // keeps the dominant mode's runs. The truth's time factor tells each run's mode.
    let f = f64_columns(&truth.join("executions.arrow"), &["time_factor"]);
    let dominant: Vec<bool> = f[0][n - first..].iter().map(|t| t / 1.3 < 1.04).collect();
    let kept: Vec<bool> = a.executions.iter().map(|e| e.kept).collect();
    let precision = |keep: &dyn Fn(usize) -> bool| {
        let k: Vec<usize> = (0..kept.len()).filter(|&i| keep(i)).collect();
        k.iter().filter(|&&i| dominant[i]).count() as f64 / k.len() as f64
    };
    let clustered = precision(&|i| kept[i]);
    let (lo, hi, _) = a.fixed_margin;
    let fixed = precision(&|i| (lo..=hi).contains(&a.executions[i].duration_s));
    eprintln!(
        "dominant mode: clustering keeps {} runs at precision {clustered:.4}; the fixed margin {} at {fixed:.4}",
        kept.iter().filter(|k| **k).count(),
        a.fixed_margin.2
    );
    assert!(clustered >= 0.95, "{clustered}");
}

#[test]
fn sse_and_ssp_energies_per_execution_are_the_twins_within_3_percent() {
    let loaded = railtrace_twin::default_scenario();
    let dir = TempDir::new("profile-energy");
    // Trains of 60 back to back (12 ms): the power settles over the first ~9 ms (τ 3 ms).
    let (a, twin, _) = run_trains(&loaded, 25, 60, &dir, &Options::default());
    twin.stop().unwrap();
    let e = f64_columns(&dir.join("truth/executions.arrow"), &["energy_j"]);
    let truth = &e[0][e[0].len() - a.executions.len()..];
    let tau = a
        .settling_tau_s
        .expect("trains long enough to see the settling");
    eprintln!(
        "settling: τ {:.2} ms, SSP from {:.2} ms",
        tau * 1e3,
        a.settle_s * 1e3
    );
    assert!(
        (tau - 3e-3).abs() < 0.5e-3,
        "τ {tau} s (the scenario's 3 ms)"
    );
    for ssp in [false, true] {
        let (mut got, mut want, mut n) = (0.0, 0.0, 0);
        for (x, t) in a.executions.iter().zip(truth) {
            if x.kept && x.ssp == ssp {
                got += x.rig_energy_j;
                want += t;
                n += 1;
            }
        }
        let err = (got - want) / want;
        eprintln!(
            "{}: {n} executions, rig {:.3} mJ, truth {:.3} mJ per execution: {:+.2} %",
            if ssp { "SSP" } else { "SSE" },
            got / f64::from(n) * 1e3,
            want / f64::from(n) * 1e3,
            err * 100.0
        );
        assert!(n > 50, "{n} executions");
        assert!(err.abs() < 0.03, "{err}");
    }
    let mean = |ssp: bool| if ssp { a.ssp_energy_j } else { a.sse_energy_j };
    assert!(
        mean(false).unwrap() < mean(true).unwrap(),
        "unsettled executions draw less"
    );
}

#[test]
fn correct_undoes_the_twins_box_logger_and_keeps_the_energy() {
    use railtrace::analysis::logger_model::{LoggerModel, Provenance, FORMAT, VERSION};
    let loaded = railtrace_twin::default_scenario();
    let dir = TempDir::new("profile-correct");
    let (a, twin, _) = run(&loaded, 600, &dir, &Options::default());
    twin.stop().unwrap();
    // The twin's logger as the scenario sets it: a 1 ms box every 1 ms, no delay, gain 1.
    let model = LoggerModel {
        format: FORMAT.into(),
        version: VERSION,
        family: "box".into(),
        period_s: 1e-3,
        period_se_s: 0.0,
        phase_s: 0.0,
        delay_s: 0.0,
        delay_se_s: 0.0,
        window_s: Some(1e-3),
        window_se_s: Some(0.0),
        tau_s: None,
        tau_se_s: None,
        response_spacing_s: None,
        response_per_s: None,
        gain: 1.0,
        gain_se: 0.0,
        offset_w: 0.0,
        offset_se_w: 0.0,
        residual_rms_w: 0.0,
        readings: 0,
        se_dof: None,
        intervals: Default::default(),
        doubts: Vec::new(),
        bic: Default::default(),
        families: Vec::new(),
        provenance: Provenance {
            input: "the scenario".into(),
            reference: String::new(),
            logger: String::new(),
            created_utc: String::new(),
            railtrace: String::new(),
            column: "logger_w".into(),
            period_given_s: None,
        },
    };
    let toml = dir.join("logger.toml");
    model.write(&toml).unwrap();
    assert_eq!(LoggerModel::read(&toml).unwrap(), model);
    let out = dir.join("corrected.arrow");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .arg("correct")
        .arg(dir.join("profile.arrow"))
        .arg("--logger")
        .arg(&toml)
        .arg("-o")
        .arg(&out)
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let energy = figures["energy_j"].as_f64().unwrap();
    eprintln!(
        "corrected energy per execution {:.3} mJ, the rig's {:.3} mJ",
        energy * 1e3,
        a.rig_energy_j * 1e3
    );
    // The energy is the best-determined figure of a deconvolution (the kernel keeps it):
    // within 2 % of the truth's, the twin's true energy over the kept executions. (Not the
    // rig's own [start, end] energy: what the board's 5 µs input filter, the sensor and
    // the ADC's filter carry past each end, several µs of the kernel's excess power, is
    // missing from it.)
    let truth = railtrace::demo::Truth::read(&dir.join("truth")).unwrap();
    let mine = truth.executions_of(&a.executions).unwrap();
    let true_j = railtrace::demo::Stitched::of_kept(&truth, &a.executions, mine)
        .unwrap()
        .energy_j;
    eprintln!("the truth's {:.3} mJ", true_j * 1e3);
    assert!(
        (energy / true_j - 1.0).abs() < 0.02,
        "{energy} J, truth {true_j} J"
    );
    let file = std::fs::File::open(&out).unwrap();
    let r = arrow_ipc::reader::StreamReader::try_new(file, None).unwrap();
    let names: Vec<String> = r
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        ["t_s", "logger_w", "corrected_w", "lo_w", "hi_w", "rig_w"]
    );
}

/// A run without a rig, as a bench without one records it: the logger's stitched profile
/// alone, reported as raw readings with nothing to hold them against; a logger cannot be
/// identified from it, and the command says so in one line.
#[test]
fn a_run_without_a_rig_is_the_loggers_profile_alone() {
    let dir = TempDir::new("profile-no-rig");
    let railtrace = |args: &[&str]| common::railtrace(&dir.0, args);
    let o = railtrace(&["profile", "--runs", "80", "--no-rig", "-o", "nr.arrow"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("no rig: the logger's readings alone"), "{err}");
    assert!(!dir.join("nr.rig.arrow").exists());
    let o = railtrace(&["report", "nr.arrow", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let a: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(a["device"]["used"], 0);
    assert!(a["rig"].as_array().unwrap().is_empty());
    let filled = (a["logger"].as_array().unwrap().iter())
        .filter(|p| p["n"].as_u64().unwrap_or(0) > 0)
        .count();
    assert!(filled > 20, "{filled} logger bins");
    let notes = a["support"]["notes"].to_string();
    assert!(
        notes.contains("no rig") && notes.contains("not deconvolved"),
        "{notes}"
    );
    let o = railtrace(&["report", "nr.arrow"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("device→host: no rig"), "{text}");
    let o = railtrace(&["calibrate", "logger", "nr.arrow", "-o", "l.toml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("recorded without a rig"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
