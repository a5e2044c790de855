//! How often the corrected profile's band and the energy's interval hold the twin's truth,
//! over benches of every logger family, kernels of 50 µs to 1.5 ms and the faults a bench
//! has (the logger's delay, gain and offset, clock errors and jitter), each seed a rig
//! whose sensors' errors are drawn within the accuracy its description states.
//!
//! `cargo test --release -p railtrace --test coverage -- --ignored --nocapture` prints the
//! table calibration/README.md holds; the test that is not ignored runs two benches of
//! four seeds each (about 2 minutes on 2 cores).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{f64_columns, TempDir};
use railtrace_calibration::stats::median;

/// A bench: a shipped scenario, changed by text replacements, and how far the logger
/// reaches after the kernel's end (its window, or three time constants).
struct Bench {
    name: &'static str,
    scenario: &'static str,
    edits: &'static [(&'static str, &'static str)],
    reach_s: f64,
    /// The demo's arguments beyond the seed and scenario.
    args: &'static [&'static str],
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "box 1 ms, 200 µs kernel",
        scenario: "default.toml",
        edits: &[],
        reach_s: 1e-3,
        args: &[],
    },
    Bench {
        name: "exponential τ 1 ms, 200 µs",
        scenario: "exponential-logger.toml",
        edits: &[],
        reach_s: 3e-3,
        // Delays longer than the logger's reach (five time constants), so that its
        // readings after each kernel see no other.
        args: &["--delay-ms", "5", "7"],
    },
    Bench {
        name: "partial 0.7 ms, 1.5 ms kernel",
        scenario: "long-kernel-partial.toml",
        edits: &[],
        reach_s: 0.7e-3,
        args: &[],
    },
    Bench {
        name: "box, delay 300 µs",
        scenario: "late-logger.toml",
        edits: &[],
        reach_s: 1e-3,
        args: &[],
    },
    Bench {
        name: "box, gain 0.95, offset −4 W",
        scenario: "default.toml",
        edits: &[("gain = 1.0\noffset_w = 0.0", "gain = 0.95\noffset_w = -4.0")],
        reach_s: 1e-3,
        args: &[],
    },
    Bench {
        name: "box, clocks 200 ppm, 5 µs jitter",
        scenario: "default.toml",
        edits: &[
            ("error_ppm = 30.0", "error_ppm = 200.0"),
            ("\njitter_s = 1e-6", "\njitter_s = 5e-6"),
            ("drift_ppm = 20.0", "drift_ppm = 150.0"),
            ("read_jitter_s = 1e-6", "read_jitter_s = 5e-6"),
        ],
        reach_s: 1e-3,
        args: &[],
    },
    Bench {
        name: "box, 50 µs kernel (25 µs phases)",
        scenario: "default.toml",
        edits: &[
            (
                "duration_s = 100e-6\npower_w = 620.0",
                "duration_s = 25e-6\npower_w = 620.0",
            ),
            (
                "duration_s = 100e-6\npower_w = 430.0",
                "duration_s = 25e-6\npower_w = 430.0",
            ),
        ],
        reach_s: 1e-3,
        args: &[],
    },
    Bench {
        name: "exponential τ 0.3 ms, 400 µs, delay 50 µs",
        scenario: "exponential-logger.toml",
        edits: &[
            ("tau_s = 1e-3", "tau_s = 0.3e-3"),
            ("delay_s = 0.0", "delay_s = 50e-6"),
            (
                "duration_s = 100e-6\npower_w = 620.0",
                "duration_s = 200e-6\npower_w = 620.0",
            ),
            (
                "duration_s = 100e-6\npower_w = 430.0",
                "duration_s = 200e-6\npower_w = 430.0",
            ),
        ],
        reach_s: 0.9e-3,
        args: &[],
    },
];

/// The rig's sensors' errors for `seed`, uniform within the limits the shipped rigs'
/// accuracy is worked out from (hardware/rigs/*.toml): current channels ±0.5 % and
/// ±2 mV, voltage channels ±0.25 % and ±2 mV.
fn rig_truth(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        2.0 * ((x >> 11) as f64 / (1u64 << 53) as f64) - 1.0
    };
    (0..8)
        .map(|i| {
            let gain = if i % 2 == 0 { 0.005 } else { 0.0025 };
            format!(
                "[[rig_truth.channel]]\nindex = {i}\ngain_error = {}\noffset_v = {}\nnoise_v_rms = {}\n\n",
                gain * uniform(),
                0.002 * uniform(),
                if i % 2 == 0 { 0.001 } else { 0.0005 }
            )
        })
        .collect()
}

/// `bench`'s scenario for `seed` in `dir`: its edits, the twin's seed, and the rig's
/// errors drawn for the bench and the seed in place of the shipped ones.
fn scenario(bench: &Bench, seed: u64, dir: &Path) -> PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hardware/scenarios");
    let mut text = std::fs::read_to_string(shipped.join(bench.scenario)).unwrap();
    for (from, to) in bench.edits {
        assert!(text.contains(from), "{}: no `{from}`", bench.name);
        text = text.replace(from, to);
    }
    // The shipped channel errors go; the seed's are appended.
    let mut kept = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.starts_with('[') {
            skipping = line == "[[rig_truth.channel]]";
        }
        if !skipping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let rigs = shipped.join("../rigs/");
    let kept = kept
        .replace("rig = \"../rigs/", &format!("rig = \"{}/", rigs.display()))
        .replacen("\nseed = 1\n", &format!("\nseed = {seed}\n"), 1);
    let path = dir.join("bench.toml");
    // Every bench and seed a rig of its own.
    let bench_index = BENCHES.iter().position(|b| b.name == bench.name).unwrap() as u64;
    let rig = rig_truth(seed + 1000 * bench_index);
    std::fs::write(&path, kept + "\n" + &rig).unwrap();
    path
}

/// One bench's tally.
#[derive(Default)]
struct Tally {
    runs: usize,
    inside: (usize, usize),
    after: (usize, usize),
    half_widths: Vec<f64>,
    errors: Vec<f64>,
    energy_in: usize,
    energy_half: Vec<f64>,
    energy_err: Vec<f64>,
    within_range: usize,
    checks_pass: usize,
    /// Each run's fraction of cells inside the band, over the kernel and after it.
    run_inside: Vec<(f64, f64)>,
}

/// The demo on `bench` for `seed` with `extra` arguments: its folder, its figures, and
/// whether its checks passed (a demo whose checks fail still writes its figures: they
/// count like the others).
fn demo(bench: &Bench, seed: u64, extra: &[&str]) -> (TempDir, serde_json::Value, bool) {
    let dir = TempDir::new("coverage");
    let path = scenario(bench, seed, &dir.0);
    let o = Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(["demo", "--json", "--seed", &seed.to_string(), "--scenario"])
        .arg(&path)
        .arg("--out")
        .arg(&dir.0)
        .args(bench.args)
        .args(extra)
        .output()
        .unwrap();
    let f: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("{}: {}", bench.name, String::from_utf8_lossy(&o.stderr)));
    (dir, f, o.status.success())
}

/// Runs the demo on `bench` for `seed` and adds what its band held to `tally`.
fn run(bench: &Bench, seed: u64, extra: &[&str], tally: &mut Tally) {
    let (dir, f, passed) = demo(bench, seed, extra);
    tally.checks_pass += usize::from(passed);
    let failed: Vec<&str> = (f["checks"].as_array().unwrap().iter())
        .filter(|c| c["pass"] != true)
        .map(|c| c["what"].as_str().unwrap())
        .collect();
    eprintln!(
        "  {} seed {seed}: outside the range: {}; failed checks: {failed:?}",
        bench.name, f["validity"]["outside"]
    );
    let rows = f["rows"].as_array().unwrap();
    let score = |name: &str| &rows.iter().find(|r| r["profile"] == name).unwrap()["score"];
    let e = score("truth")["energy_j"].as_f64().unwrap();
    let band = f["energy_band_j"].as_array().unwrap();
    let (lo, hi) = (band[0].as_f64().unwrap(), band[1].as_f64().unwrap());
    let corrected = score("corrected")["energy_j"].as_f64().unwrap();
    tally.runs += 1;
    tally.energy_in += usize::from(lo <= e && e <= hi);
    tally.energy_half.push(0.5 * (hi - lo) / e);
    tally.energy_err.push((corrected - e).abs() / e);
    tally.within_range += usize::from(f["validity"]["within_range"] == true);
    // The truth per cell from profiles.csv, the band from corrected.arrow.
    let csv = std::fs::read_to_string(dir.0.join("profiles.csv")).unwrap();
    let truth: BTreeMap<i64, f64> = (csv.lines().skip(1))
        .map(|l| {
            let v: Vec<f64> = (l.split(',').take(2)).map(|x| x.parse().unwrap()).collect();
            ((v[0] * 1e3).round() as i64, v[1])
        })
        .collect();
    let duration = f["duration_s"].as_f64().unwrap();
    let c = f64_columns(
        &dir.0.join("corrected.arrow"),
        &["t_s", "lo_w", "hi_w", "corrected_w"],
    );
    let before = (tally.inside, tally.after);
    for (((&t, &lo), &hi), &w) in c[0].iter().zip(&c[1]).zip(&c[2]).zip(&c[3]) {
        let Some(&p) = truth.get(&((t * 1e9).round() as i64)) else {
            continue;
        };
        let held = usize::from(lo - 1e-9 <= p && p <= hi + 1e-9);
        if t > 0.0 && t < duration {
            tally.inside.0 += held;
            tally.inside.1 += 1;
            tally.half_widths.push(0.5 * (hi - lo));
            tally.errors.push((w - p).abs());
        } else if t >= duration && t < duration + bench.reach_s {
            tally.after.0 += held;
            tally.after.1 += 1;
        }
    }
    let fraction =
        |(a, b): (usize, usize), (a0, b0): (usize, usize)| (a - a0) as f64 / (b - b0).max(1) as f64;
    tally.run_inside.push((
        fraction(tally.inside, before.0),
        fraction(tally.after, before.1),
    ));
}

/// Runs `one` on `benches` × `seeds` into a tally a bench, printing `header` and then
/// `line` of each bench's tally: a table.
fn tabulate<T: Default>(
    benches: &[&Bench],
    seeds: std::ops::Range<u64>,
    header: &str,
    one: impl Fn(&Bench, u64, &mut T),
    line: impl Fn(&Bench, &mut T) -> String,
) -> Vec<T> {
    println!("{header}");
    println!("|{}", " --- |".repeat(header.matches(" | ").count() + 1));
    let mut out = Vec::new();
    for bench in benches {
        let mut t = T::default();
        for seed in seeds.clone() {
            one(bench, seed, &mut t);
        }
        println!("{}", line(bench, &mut t));
        out.push(t);
    }
    out
}

/// Runs `benches` × `seeds` and prints the table.
fn table(benches: &[&Bench], seeds: std::ops::Range<u64>, extra: &[&str]) -> Vec<Tally> {
    let header = "| bench | runs | cells inside the band, kernel | after it | median half-width / median error | energy in its interval | energy half-width / error | within range | checks pass |";
    tabulate(
        benches,
        seeds,
        header,
        |b, seed, t| run(b, seed, extra, t),
        |bench, t| {
            let pct = |(a, b): (usize, usize)| 100.0 * a as f64 / b.max(1) as f64;
            let (hw, err) = (median(&t.half_widths), median(&t.errors));
            let (ehw, eerr) = (median(&t.energy_half), median(&t.energy_err));
            format!(
            "| {} | {} | {:.1} % ({}/{}) | {:.1} % ({}/{}) | {hw:.2} W / {err:.2} W ({:.1}×) | {}/{} | {:.3} % / {:.3} % | {}/{} | {}/{} |",
            bench.name,
            t.runs,
            pct(t.inside),
            t.inside.0,
            t.inside.1,
            pct(t.after),
            t.after.0,
            t.after.1,
            hw / err,
            t.energy_in,
            t.runs,
            100.0 * ehw,
            100.0 * eerr,
            t.within_range,
            t.runs,
            t.checks_pass,
            t.runs
        )
        },
    )
}

/// The full table: 8 benches × 10 seeds (about 20 minutes on 2 cores, release build);
/// `COVERAGE_SEEDS=n` runs `n` seeds, `COVERAGE_BENCH=text` the benches whose name holds
/// it.
#[test]
#[ignore]
fn coverage() {
    let seeds: u64 = std::env::var("COVERAGE_SEEDS").map_or(10, |s| s.parse().unwrap());
    let only = std::env::var("COVERAGE_BENCH").unwrap_or_default();
    let benches: Vec<&Bench> = BENCHES.iter().filter(|b| b.name.contains(&only)).collect();
    table(&benches, 1..1 + seeds, &[]);
}

/// Two benches (a box and an exponential logger) × 4 seeds, each its own rig: the energy's
/// 95 % interval holds the truth in at least 6 of the 8 runs (at a true 95 %, 5 or fewer
/// happen with probability 0.006); the band holds the truth in at least 70 % of the
/// cells over the kernel and after it, each run's fraction averaged over the runs (the
/// cells of a run miss together, since its scale's and level's errors are shared: a run
/// whose level is off beyond its band misses them all, and three of eight such runs,
/// probability under 0.01 at a true 95 %, are needed to fall below); and the band is
/// no wider than 6 times the median error (a calibrated band is about 3 times; one whose
/// replicates kept the estimate's λ was 89 times, on the default demo).
#[test]
fn the_band_and_the_energys_interval_hold_the_truth_as_often_as_they_say() {
    let benches: Vec<&Bench> = BENCHES[..2].iter().collect();
    let tallies = table(&benches, 1..5, &[]);
    let runs: usize = tallies.iter().map(|t| t.runs).sum();
    let held: usize = tallies.iter().map(|t| t.energy_in).sum();
    assert!(held >= 6, "energy held in {held} of {runs} runs");
    let per_run: Vec<(f64, f64)> = tallies.iter().flat_map(|t| t.run_inside.clone()).collect();
    let mean = |f: fn(&(f64, f64)) -> f64| per_run.iter().map(f).sum::<f64>() / runs as f64;
    let (kernel, after) = (mean(|r| r.0), mean(|r| r.1));
    assert!(
        kernel >= 0.7 && after >= 0.7,
        "cells inside: kernel {kernel}, after it {after}"
    );
    for t in tallies {
        let ratio = median(&t.half_widths) / median(&t.errors);
        assert!(ratio <= 6.0, "half-width {ratio} times the error");
    }
}

/// One bench's planner tally.
#[derive(Default)]
struct Planned {
    runs: usize,
    /// Runs at the pilot's plan whose every phase came within the tolerance.
    held: usize,
    /// Runs whose own plan asked for at most 1.5 times the pilot's.
    kept: usize,
    /// The pilot's plans, executions.
    plans: Vec<u64>,
    /// Each run's own plan over the pilot's.
    ratios: Vec<f64>,
    bins_us: Vec<f64>,
}

/// Runs the demo on `bench` for `seed` with a pilot of `pilot` executions planning the
/// run, and adds whether the run held its plan to `tally`.
fn run_planned(bench: &Bench, seed: u64, pilot: usize, tally: &mut Planned) {
    let (_dir, f, _) = demo(bench, seed, &["--pilot", &pilot.to_string()]);
    let phases: Vec<&serde_json::Value> = (f["checks"].as_array().unwrap().iter())
        .filter(|c| c["what"].as_str().unwrap().starts_with("phase"))
        .collect();
    let held = phases.iter().all(|c| c["pass"] == true);
    let p = &f["pilot"];
    let ratio = p["replanned_ratio"].as_f64().unwrap_or(f64::INFINITY);
    eprintln!(
        "  {} seed {seed}: the pilot planned {} at {:.1} µs; phases {:?}; its own plan {ratio:.2} of it",
        bench.name,
        p["run_plan"]["executions"],
        p["run_plan"]["bin_s"].as_f64().unwrap() * 1e6,
        phases.iter().map(|c| c["measured"].as_str().unwrap()).collect::<Vec<_>>(),
    );
    tally.runs += 1;
    tally.held += usize::from(held);
    tally.kept += usize::from(ratio <= 1.5);
    tally
        .plans
        .push(p["run_plan"]["executions"].as_u64().unwrap());
    tally.ratios.push(ratio);
    tally
        .bins_us
        .push(p["run_plan"]["bin_s"].as_f64().unwrap() * 1e6);
}

/// Runs `benches` × `seeds` with a pilot each and prints the planner's table.
fn planner_table(benches: &[&Bench], seeds: std::ops::Range<u64>, pilot: usize) -> Vec<Planned> {
    let header = "| bench | runs | pilot | planned executions | bins | phases within the tolerance at the plan | own plan at most 1.5× the pilot's (range) |";
    let one = |b: &Bench, seed, t: &mut Planned| run_planned(b, seed, pilot, t);
    tabulate(benches, seeds, header, one, |bench, t| {
        let span = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            (lo, v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
        };
        let plans: Vec<f64> = t.plans.iter().map(|&p| p as f64).collect();
        let ((p0, p1), (b0, b1), (r0, r1)) = (span(&plans), span(&t.bins_us), span(&t.ratios));
        format!(
            "| {} | {} | {pilot} | {p0:.0}-{p1:.0} | {b0:.1}-{b1:.1} µs | {}/{} | {}/{} ({r0:.2}-{r1:.2}) |",
            bench.name, t.runs, t.held, t.runs, t.kept, t.runs,
        )
    })
}

/// The planner's table: 8 benches × 10 seeds, a pilot of 200 executions each
/// (`COVERAGE_PILOT` for another), planning the run that follows; `COVERAGE_SEEDS` and
/// `COVERAGE_BENCH` as for [`coverage`].
#[test]
#[ignore]
fn planner() {
    let seeds: u64 = std::env::var("COVERAGE_SEEDS").map_or(10, |s| s.parse().unwrap());
    let pilot: usize = std::env::var("COVERAGE_PILOT").map_or(200, |s| s.parse().unwrap());
    let only = std::env::var("COVERAGE_BENCH").unwrap_or_default();
    let benches: Vec<&Bench> = BENCHES.iter().filter(|b| b.name.contains(&only)).collect();
    planner_table(&benches, 1..1 + seeds, pilot);
}

/// Two benches (the default box logger, and an exponential one with a delay) × 2 seeds, a
/// pilot of 200 executions planning each run: at the planned count every phase comes
/// within the tolerance, and the run's own plan asks for at most 1.5 times the pilot's,
/// in at least 3 of the 4 runs each (were either true in only 90 % of runs, 2 or fewer of
/// 4 would happen with probability 0.05; the planner that asked for more at each run
/// asked 1.2-3.8 times). The 50 µs kernel of 25 µs phases is not here: there the plan
/// holds in about four runs of five on each count (4/6 and 5/6 over six seeds; the table
/// in calibration/README.md), which this check would fail in about one run of twelve.
#[test]
fn the_planner_holds_its_plan() {
    let benches: Vec<&Bench> = vec![&BENCHES[0], &BENCHES[7]];
    let tallies = planner_table(&benches, 1..3, 200);
    let (held, kept): (usize, usize) =
        (tallies.iter()).fold((0, 0), |(h, k), t| (h + t.held, k + t.kept));
    assert!(held >= 3, "phases held at the plan in {held} of 4 runs");
    assert!(
        kept >= 3,
        "the plan held (at most 1.5 times again) in {kept} of 4 runs"
    );
}
