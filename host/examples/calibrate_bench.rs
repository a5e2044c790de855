//! How `railtrace calibrate logger` and `railtrace correct` scale with the capture's
//! length: a profiling run and its rig capture are written for 1, 5 and 10 minutes at
//! 100 kS/s × 8 channels (a 200 µs two-phase kernel every 1.5-3 ms, a 1 ms box logger
//! read every 1 ms), then the release binary calibrates and corrects each, and the wall
//! time and peak resident memory of each command are printed, with the growth exponent
//! between the shortest and the longest.
//!
//! ```text
//! cargo build --release -p railtrace
//! cargo run --release -p railtrace --example calibrate_bench [MINUTES...]
//! ```
//!
//! The files go to a temporary folder (`RAILTRACE_BENCH_DIR` to choose it) and are removed
//! afterwards (`RAILTRACE_BENCH_KEEP=1` keeps them); a 10-minute rig capture is about 1 GB.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use railtrace::store::recording::{Derive, Event, Meta, Writer, FORMAT_VERSION};

const RATE: u64 = 100_000;
const TICK_HZ: u64 = 100_000_000;
const GPU_HZ: f64 = 100e6;
const IDLE_W: f64 = 120.0;
/// The kernel's phases: (length s, power W).
const PHASES: [(f64, f64); 2] = [(130e-6, 548.0), (70e-6, 386.5)];
/// The logger: a box average over its period, reported `DELAY` after each update.
const PERIOD: f64 = 1e-3;
const DELAY: f64 = 0.3e-3;
const GAIN: f64 = 0.97;
const OFFSET: f64 = 4.0;
/// Rates of the GPU's and the rig's clocks against the host's.
const GPU_PPM: f64 = 20.0;
const DEVICE_PPM: f64 = -30.0;

/// SplitMix64.
struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// The true power: executions' starts (host s), sorted.
struct Truth {
    starts: Vec<f64>,
}

impl Truth {
    fn duration() -> f64 {
        PHASES.iter().map(|p| p.0).sum()
    }
    /// Power at `t` given the latest execution start `s` at or before it.
    fn power_after(s: f64, t: f64) -> f64 {
        let mut x = t - s;
        for (len, w) in PHASES {
            if x < len {
                return w;
            }
            x -= len;
        }
        IDLE_W
    }
    /// `∫ P` from 0 to `t`.
    fn energy(&self, t: f64) -> f64 {
        let extra: f64 = PHASES.iter().map(|(l, w)| l * (w - IDLE_W)).sum();
        let k = self.starts.partition_point(|&s| s <= t);
        let mut e = IDLE_W * t + extra * k.saturating_sub(1) as f64;
        if k > 0 {
            let s = self.starts[k - 1];
            let mut x = (t - s).min(Self::duration());
            for (len, w) in PHASES {
                let part = x.min(len);
                e += part * (w - IDLE_W);
                x -= part;
            }
        }
        e
    }
}

fn meta(source: &str, epoch_ns: i64) -> Meta {
    Meta {
        version: FORMAT_VERSION,
        source: source.into(),
        epoch_utc_ns: epoch_ns,
        timebase: "written by the calibration benchmark".into(),
        rails: Vec::new(),
        code_channels: Vec::new(),
        device: None,
        rig: None,
        settings: None,
        derive: None,
    }
}

/// Writes `profile.arrow` and `profile.rig.arrow` for `seconds` of profiling.
fn write_run(dir: &Path, seconds: f64) -> PathBuf {
    let epoch_ns = 1_700_000_000_000_000_000i64;
    let mut rng = Rng(42);
    // Executions: one a train, each after a random 1.5-3 ms delay.
    let mut starts = Vec::new();
    let mut t = 0.02;
    while t < seconds - 0.02 {
        t += 1.5e-3 + 1.5e-3 * rng.uniform();
        starts.push(t);
        t += Truth::duration();
    }
    let truth = Truth { starts };
    let ns = |t: f64| epoch_ns + (t * 1e9).round() as i64;
    let gpu_ticks = |t: f64| ((t * (1.0 + GPU_PPM * 1e-6) + 5.0) * GPU_HZ).round() as u64;
    // The profile: executions, clock reads, driven edges and logger readings.
    let profile = dir.join("profile.arrow");
    let mut m = meta("calibration benchmark profile", epoch_ns);
    m.settings = Some(serde_json::json!({
        "kernel": "two-phase", "gpu_clock_hz": GPU_HZ, "trigger_line": 0,
        "logger": "a 1 ms box logger (benchmark)",
    }));
    let mut w = Writer::create(&profile, &m).unwrap();
    let mut next_update = 0.02 + 0.37e-3;
    for (i, &s) in truth.starts.iter().enumerate() {
        let e = s + Truth::duration();
        for (edge_t, rising) in [(s, true), (e, false)] {
            w.event(&Event::Driven {
                time_s: edge_t,
                line: 0,
                rising,
                host_before_ns: ns(edge_t - 2e-6),
                host_after_ns: ns(edge_t + 2e-6),
            });
        }
        w.event(&Event::Execution {
            time_s: s,
            kernel: "two-phase".into(),
            train: i as u64,
            index_in_train: 0,
            start_ticks: gpu_ticks(s),
            end_ticks: gpu_ticks(e),
            duration_s: e - s,
        });
        let read = e + 0.2e-3;
        let half = 1e-6 + 4e-6 * rng.uniform();
        w.event(&Event::ClockRead {
            time_s: read,
            host_before_ns: ns(read - half),
            host_after_ns: ns(read + half),
            gpu_ticks: gpu_ticks(read),
        });
        // The logger's readings up to the next execution.
        let until = truth.starts.get(i + 1).copied().unwrap_or(seconds);
        while next_update + DELAY < until {
            let u = next_update;
            let r = GAIN * (truth.energy(u) - truth.energy(u - PERIOD)) / PERIOD
                + OFFSET
                + 0.5 * rng.normal();
            let at = u + DELAY;
            w.event(&Event::Logger {
                time_s: at,
                power_w: r,
                instant_w: None,
                average_w: None,
                temperature_c: None,
                energy_j: None,
                source: None,
                gpu_ticks: Some(gpu_ticks(at)),
                host_ns: None,
                own_s: None,
                polled_ns: Some(ns(at + 50e-6)),
            });
            next_update += PERIOD;
        }
        w.maybe_flush().unwrap();
    }
    w.finish().unwrap();
    // The rig: 4 rails (V and A each), their power in fixed shares of the total.
    let rig = dir.join("profile.rig.arrow");
    let (v_scale, a_scale) = (0.0005f32, 0.002f32);
    let mut m = meta("calibration benchmark rig", epoch_ns);
    m.rails = ["slot_12v", "slot_3v3", "cable1_12v", "cable2_12v"]
        .map(String::from)
        .to_vec();
    m.device = Some(serde_json::json!({ "tick_hz": TICK_HZ, "board": "benchmark" }));
    m.derive = Some(Derive {
        tick_hz: TICK_HZ as f64,
        channels: (0..8).collect(),
        cal: (0..8)
            .map(|c| {
                if c % 2 == 0 {
                    (v_scale, 0.0)
                } else {
                    (a_scale, 0.0)
                }
            })
            .collect(),
        rails: (0..4).map(|r| (Some(2 * r), Some(2 * r + 1))).collect(),
    });
    let mut w = Writer::create(&rig, &m).unwrap();
    let shares = [(12.0, 0.2), (3.3, 0.05), (12.0, 0.375), (12.0, 0.375)];
    let period_ticks = (TICK_HZ / RATE) as u32;
    // Device seconds → host seconds: the device's clock runs DEVICE_PPM off.
    let host_of = |d: f64| d / (1.0 + DEVICE_PPM * 1e-6) + 0.25;
    let device_of = |h: f64| (h - 0.25) * (1.0 + DEVICE_PPM * 1e-6);
    let total = (device_of(seconds) * RATE as f64) as u64;
    let mut edges = truth
        .starts
        .iter()
        .flat_map(|&s| [(s, true), (s + Truth::duration(), false)]);
    let mut next_edge = edges.next();
    let mut edge_count = 0u64;
    let (chunk, mut k, mut exec) = (1000u64, 0u64, 0usize);
    let mut codes = Vec::with_capacity(chunk as usize * 8);
    while k < total {
        codes.clear();
        let n = chunk.min(total - k);
        for j in k..k + n {
            let h = host_of(j as f64 / RATE as f64);
            while exec + 1 < truth.starts.len() && truth.starts[exec + 1] <= h {
                exec += 1;
            }
            let p = match truth.starts.get(exec) {
                Some(&s) if s <= h => Truth::power_after(s, h),
                _ => IDLE_W,
            } + 2.0 * rng.normal();
            for (v, share) in shares {
                codes.push((v / f64::from(v_scale)).round() as i16);
                codes.push((p * share / v / f64::from(a_scale)).round() as i16);
            }
        }
        let time_s = host_of(k as f64 / RATE as f64);
        w.block(
            time_s,
            k,
            k * u64::from(period_ticks),
            period_ticks,
            1.0 / RATE as f64,
            &codes,
        );
        k += n;
        let reached = host_of(k as f64 / RATE as f64);
        while let Some((et, rising)) = next_edge.filter(|e| e.0 < reached) {
            edge_count += 1;
            let d = device_of(et + 1e-6);
            w.event(&Event::Edge {
                time_s: et,
                tick: Some((d * TICK_HZ as f64).round() as u64),
                index: Some((d * RATE as f64) as u64),
                line: 0,
                rising,
                count: Some(edge_count),
                label: "trigger".into(),
            });
            next_edge = edges.next();
        }
        w.maybe_flush().unwrap();
    }
    w.finish().unwrap();
    profile
}

/// Runs the command; its wall time and peak resident memory (MiB: the kernel's high-water
/// mark of the child's resident set, `VmHWM`, read every 5 ms while it runs).
fn measure(cmd: &mut Command, log: &Path) -> (f64, f64) {
    let t = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("run railtrace");
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0.0f64;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text.lines().find_map(|l| l.strip_prefix("VmHWM:"));
            if let Some(kib) = hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let secs = t.elapsed().as_secs_f64();
    if !status.success() {
        panic!(
            "{cmd:?} failed:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    (secs, peak_kib / 1024.0)
}

fn main() {
    let minutes: Vec<f64> = {
        let given: Vec<f64> = std::env::args()
            .skip(1)
            .map(|a| a.parse().unwrap())
            .collect();
        if given.is_empty() {
            vec![1.0, 5.0, 10.0]
        } else {
            given
        }
    };
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("railtrace"))
        .filter(|p| p.exists())
        .expect("build the release binary first: cargo build --release -p railtrace");
    let base =
        std::env::var_os("RAILTRACE_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    println!("| capture | rig samples | write s | calibrate s | calibrate peak MiB | correct s | correct peak MiB |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for m in minutes {
        let dir = base.join(format!(
            "railtrace-calibrate-bench-{}-{m}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let t = Instant::now();
        let profile = write_run(&dir, m * 60.0);
        let write_s = t.elapsed().as_secs_f64();
        let model = dir.join("logger.toml");
        let (cal_s, cal_mib) = measure(
            Command::new(&bin)
                .args(["calibrate", "logger"])
                .arg(&profile)
                .arg("-o")
                .arg(&model),
            &dir.join("calibrate.log"),
        );
        let (cor_s, cor_mib) = measure(
            Command::new(&bin)
                .arg("correct")
                .arg(&profile)
                .arg("--logger")
                .arg(&model)
                .arg("-o")
                .arg(dir.join("corrected.arrow")),
            &dir.join("correct.log"),
        );
        let samples = (m * 60.0 * RATE as f64) as u64;
        println!(
            "| {m} min | {samples} | {write_s:.1} | {cal_s:.2} | {cal_mib:.0} | {cor_s:.2} | {cor_mib:.0} |"
        );
        rows.push((m, cal_s, cor_s));
        if std::env::var_os("RAILTRACE_BENCH_KEEP").is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        } else {
            println!("kept {}", dir.display());
        }
    }
    if let (Some(a), Some(b)) = (rows.first(), rows.last()) {
        if b.0 > a.0 {
            let k = |x: f64, y: f64| (y / x).ln() / (b.0 / a.0).ln();
            println!(
                "growth exponent from {} to {} min: calibrate {:.2}, correct {:.2}",
                a.0,
                b.0,
                k(a.1, b.1),
                k(a.2, b.2)
            );
        }
    }
}
