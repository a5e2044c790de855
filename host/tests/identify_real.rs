//! Logger identification on the real paired traces in
//! `../shared/data/gpu-power-benchmark/` (Yang, Adamek and Armour, SC24): the external
//! meter (ElmorLabs PMD, its four rails summed) is the reference, `nvidia-smi`'s
//! `power.draw` the logger, both on the host's timeline.
//!
//! Prints every family's fit for every GPU folder (run with `--nocapture`) and checks the
//! A100 PCIe 40 GB against the published figures (see `check_a100` for the tolerances and
//! why). Passes with SKIPPED when the data folder is not there.

mod common;

use std::path::Path;

use common::data_root;
use std::time::Instant;

use railtrace::store::import::pmd::{guess_utc_offset_h, parse_smi, read_run};
use railtrace_calibration::logger::{
    identify, period_from_changes, Estimate, Family, FamilyFit, Identification, LatticeBuilder,
    Options, Reference, Shape,
};

/// The run folders, with the UTC offset of those whose offset is known (the others' is
/// found from the readings).
const RUNS: [(&str, Option<f64>); 7] = [
    ("Transient_Response/A100_TR", Some(1.0)),
    ("5050/A100", Some(1.0)),
    ("Transient_Response/3090_TR", None),
    ("5050/3090", None),
    ("Transient_Response/4090_TR", None),
    ("Transient_Response/A5000_TR", None),
    ("Transient_Response/K40m_TR", None),
];

/// One run folder identified.
struct Run {
    name: String,
    utc_offset_h: f64,
    id: Identification,
    seconds: f64,
    meter_samples: usize,
    readings: usize,
    /// The meter's 5th and 95th percentile power, W.
    power_range_w: (f64, f64),
    reference: Reference,
    read_t: Vec<f64>,
    read_w: Vec<f64>,
}

fn identify_run(root: &Path, name: &str, utc_offset_h: Option<f64>) -> Run {
    let dir = root.join(name);
    // Read as UTC, then shift by the given offset or the one that lines the readings up.
    let run = read_run(&dir, 0.0).unwrap_or_else(|e| panic!("{name}: {e}"));
    let guessed = guess_utc_offset_h(&run.pmd, &run.smi);
    let offset_h = utc_offset_h
        .or(guessed)
        .unwrap_or_else(|| panic!("{name}: no UTC offset lines nvidia-smi up with the meter"));
    if let (Some(given), Some(g)) = (utc_offset_h, guessed) {
        assert_eq!(given, g, "{name}: the readings line up at UTC{g:+}");
    }
    // One timeline: s from the meter's first record (µs since the epoch would lose the
    // sub-µs digits in f64 seconds).
    let t0 = run.pmd.time_us[0];
    let ref_t: Vec<f64> = run.pmd.time_us.iter().map(|t| (t - t0) * 1e-6).collect();
    let ref_w: Vec<f64> = (0..ref_t.len()).map(|i| run.pmd.power_w(i)).collect();
    let shift_us = offset_h * 3600e6;
    let read_t: Vec<f64> = run
        .smi
        .iter()
        .map(|r| (r.time_us - shift_us - t0) * 1e-6)
        .collect();
    let read_w: Vec<f64> = run.smi.iter().map(|r| r.power_draw_w).collect();
    let mut sorted = ref_w.clone();
    sorted.sort_by(f64::total_cmp);
    let power_range_w = (sorted[sorted.len() / 20], sorted[sorted.len() * 19 / 20]);
    let start = Instant::now();
    let reference = Reference::new(&ref_t, &ref_w).unwrap_or_else(|e| panic!("{name}: {e}"));
    let id = identify(&reference, &read_t, &read_w, &Options::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Run {
        name: name.to_string(),
        utc_offset_h: offset_h,
        id,
        seconds: start.elapsed().as_secs_f64(),
        meter_samples: ref_t.len(),
        readings: read_t.len(),
        power_range_w,
        reference,
        read_t,
        read_w,
    }
}

/// The partial family's residual RMS with the window held at each of `widths_s`: the
/// fitted update grid's phase moved by up to ±5 ms (0.25 ms steps) and the delay by up to
/// ±3 ms (0.5 ms steps), gain and offset by least squares; over the fitted readings'
/// span. Shows how well a run's load constrains the window.
fn window_profile(r: &Run, widths_s: &[f64]) -> Vec<(f64, f64)> {
    let fit = r.id.fit(Family::Partial).unwrap();
    // The readings the fit used: the last `readings` of those within the meter's span.
    let end = r.reference.end_s() - fit.period_s.value;
    let inside: Vec<usize> = (0..r.read_t.len())
        .filter(|&i| r.read_t[i] <= end)
        .collect();
    let used = &inside[inside.len().saturating_sub(fit.readings)..];
    let t: Vec<f64> = used.iter().map(|&i| r.read_t[i]).collect();
    let y: Vec<f64> = used.iter().map(|&i| r.read_w[i]).collect();
    widths_s
        .iter()
        .map(|&w| {
            let mut best = f64::INFINITY;
            for dp in -20..=20 {
                for dd in -6..=6 {
                    let mut f = fit.clone();
                    f.shape = Shape::Partial {
                        window_s: Estimate { value: w, se: 0.0 },
                    };
                    f.phase_s.value += f64::from(dp) * 0.25e-3;
                    f.delay_s.value += f64::from(dd) * 0.5e-3;
                    f.gain.value = 1.0;
                    f.offset_w.value = 0.0;
                    let x = f.predict(&r.reference, &t);
                    let n = x.len() as f64;
                    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
                    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
                    for (a, b) in x.iter().zip(&y) {
                        sxx += (a - mx) * (a - mx);
                        sxy += (a - mx) * (b - my);
                        syy += (b - my) * (b - my);
                    }
                    best = best.min(syy - sxy * sxy / sxx);
                }
            }
            (w, (best / y.len() as f64).sqrt())
        })
        .collect()
}

fn ms(e: Estimate) -> String {
    format!("{:.3} ± {:.3} ms", e.value * 1e3, e.se * 1e3)
}

fn describe(f: &FamilyFit) -> String {
    let shape = match &f.shape {
        Shape::Box { window_s } | Shape::Partial { window_s } => format!("W = {}", ms(*window_s)),
        Shape::Exponential { tau_s } => format!("τ = {}", ms(*tau_s)),
        Shape::Response {
            spacing_s, h_per_s, ..
        } => format!(
            "{} bins of {:.3} ms, centroid {:.3} ms",
            h_per_s.len(),
            spacing_s * 1e3,
            f.centroid_s * 1e3
        ),
    };
    format!(
        "{:<11} T = {}, {shape}, d = {}, gain = {:.4} ± {:.4}, offset = {:.2} ± {:.2} W, rms {:.3} W, {} readings of {} updates, k = {}, BIC {:.1}{}",
        f.family().name(),
        ms(f.period_s),
        ms(f.delay_s),
        f.gain.value,
        f.gain.se,
        f.offset_w.value,
        f.offset_w.se,
        f.rms_w,
        f.readings,
        f.updates,
        f.params,
        f.bic,
        if f.at_search_edge { ", at the search edge" } else { "" },
    )
}

fn report(r: &Run) {
    println!(
        "\n== {} (nvidia-smi at UTC{:+}): {} meter samples, {} readings ({} used), identified in {:.2} s; chosen: {}",
        r.name,
        r.utc_offset_h,
        r.meter_samples,
        r.readings,
        r.id.readings_used,
        r.seconds,
        r.id.best().family()
    );
    println!(
        "   period from the readings' changes alone: {}",
        ms(r.id.period_guess_s)
    );
    for f in &r.id.fits {
        println!("   {}", describe(f));
        if let Shape::Response {
            h_per_s, spacing_s, ..
        } = &f.shape
        {
            let pct: Vec<String> = h_per_s
                .iter()
                .map(|h| format!("{:.0}", h * spacing_s * 100.0))
                .collect();
            println!(
                "               response, % of the area per {:.2} ms bin from lag {:.2} ms: {}",
                spacing_s * 1e3,
                f.delay_s.value * 1e3,
                pct.join(" ")
            );
        }
    }
}

/// The A100's update period from `pwr_update_freq/A100_gpudata.csv` (200 s of nvidia-smi
/// alone), and the median interval between changes as nvidia-smi's ~13 ms poll shows it.
fn a100_update_log(root: &Path) -> Option<(f64, f64, f64)> {
    let path = root.join("pwr_update_freq/A100_gpudata.csv");
    let text = std::fs::read_to_string(&path).ok()?;
    let smi = parse_smi(&path, &text, 0.0).ok()?;
    let t: Vec<f64> = smi
        .iter()
        .map(|r| (r.time_us - smi[0].time_us) * 1e-6)
        .collect();
    let w: Vec<f64> = smi.iter().map(|r| r.power_draw_w).collect();
    let (period, se) = period_from_changes(&t, &w)?;
    let c: Vec<f64> = (1..w.len())
        .filter(|&j| w[j] != w[j - 1])
        .map(|j| t[j])
        .collect();
    let mut d: Vec<f64> = c.windows(2).map(|p| p[1] - p[0]).collect();
    d.sort_by(f64::total_cmp);
    Some((period, se, d[d.len() / 2]))
}

/// The published A100 PCIe 40 GB figures: update period 102-104 ms, window 24-26 ms,
/// gain 0.954, offset -1.2 W. Tolerances and why:
///
/// - period: 101.0-104.0 ms, and within 0.1 ms of the 200 s update-period log in the same
///   folder. The published 102-104 ms is read off nvidia-smi's change intervals, which a
///   ~13 ms poll quantises (their median is 104 ms in these files too); the fit measures
///   the mean lattice spacing, which the independent log puts at 101.15 ms.
/// - gain: 0.954 ± 0.01 (1 %), on the family the criterion picks.
/// - gain and offset together: `g·P + c` within 1.5 W of `0.954·P − 1.2` over the meter's
///   5-95 % power range (gain and offset trade against each other: 0.005 of gain is 0.6 W
///   of offset at 120 W; 1.5 W is under 1 % of full load and about two of the meter's
///   current codes).
/// - window: the partial family's on the 50 % square wave (`5050/A100`), within 24-26 ms
///   widened by twice its standard error. The transient-response run's three steps hardly
///   constrain the window (printed, not checked: its residual RMS stays within 20 % from
///   20 to 36 ms, see `window_profile`).
fn check_a100(runs: &[Run], log: Option<(f64, f64, f64)>) {
    for r in runs {
        let f = r.id.best();
        let t = f.period_s.value;
        assert!((0.101..=0.104).contains(&t), "{}: period {t}", r.name);
        if let Some((log_t, _, _)) = log {
            assert!(
                (t - log_t).abs() < 1e-4,
                "{}: period {t} vs log {log_t}",
                r.name
            );
        }
        let g = f.gain.value;
        assert!((g - 0.954).abs() <= 0.01, "{}: gain {g}", r.name);
        let (lo, hi) = r.power_range_w;
        let worst = [lo, hi]
            .iter()
            .map(|p| (g * p + f.offset_w.value - (0.954 * p - 1.2)).abs())
            .fold(0.0, f64::max);
        assert!(
            worst <= 1.5,
            "{}: g·P + c is {worst:.2} W from the published map over {lo:.0}-{hi:.0} W",
            r.name
        );
        println!(
            "   {}: chosen {} with gain {:.4}, offset {:.2} W: within {worst:.2} W of 0.954·P − 1.2 over {lo:.0}-{hi:.0} W",
            r.name,
            f.family(),
            g,
            f.offset_w.value
        );
    }
    for r in runs {
        let p = window_profile(r, &[0.020, 0.025, 0.028, 0.032, 0.036]);
        let text: Vec<String> = p
            .iter()
            .map(|(w, rms)| format!("{:.0} ms: {rms:.3} W", w * 1e3))
            .collect();
        println!(
            "   {}: partial-window rms with W held at {}",
            r.name,
            text.join(", ")
        );
    }
    if let Some(r) = runs.iter().find(|r| r.name == "5050/A100") {
        let w = r.id.fit(Family::Partial).unwrap().window_s().unwrap();
        assert!(
            w.value >= 0.024 - 2.0 * w.se && w.value <= 0.026 + 2.0 * w.se,
            "5050/A100: window {}",
            ms(w)
        );
    }
    // Both runs agree on the exponential's time constant.
    let taus: Vec<Estimate> = runs
        .iter()
        .filter_map(|r| r.id.fit(Family::Exponential).and_then(FamilyFit::tau_s))
        .collect();
    if let [a, b] = taus[..] {
        let z = (a.value - b.value).abs() / a.se.hypot(b.se);
        println!(
            "   A100 τ: {} and {}: {z:.1} standard errors apart",
            ms(a),
            ms(b)
        );
        assert!(z < 3.0);
    }
}

#[test]
fn identifies_every_gpu_logger_and_the_a100_as_published() {
    let Some(root) = data_root() else {
        return;
    };
    let mut done = Vec::new();
    for (name, offset) in RUNS {
        if !root.join(name).is_dir() {
            println!("SKIPPED: {name} is not here");
            continue;
        }
        let r = identify_run(&root, name, offset);
        report(&r);
        done.push(r);
    }
    let log = a100_update_log(&root);
    if let Some((t, se, median)) = log {
        println!(
            "\n== pwr_update_freq/A100_gpudata.csv: update period {:.3} ± {:.3} ms from the changes' lattice; median change interval {:.1} ms",
            t * 1e3,
            se * 1e3,
            median * 1e3
        );
    }
    println!("\n== chosen, per run:");
    for r in &done {
        let f = r.id.best();
        println!(
            "   {:<28} {:<11} T {:.2} ms, {}gain {:.4}, offset {:.2} W, rms {:.3} W ({:.2} s)",
            r.name,
            f.family().name(),
            f.period_s.value * 1e3,
            match (&f.shape, f.window_s(), f.tau_s()) {
                (_, Some(w), _) => format!("W {:.1} ms, ", w.value * 1e3),
                (_, _, Some(t)) => format!("τ {:.1} ms, ", t.value * 1e3),
                _ => format!("centroid {:.1} ms, ", f.centroid_s * 1e3),
            },
            f.gain.value,
            f.offset_w.value,
            f.rms_w,
            r.seconds
        );
    }
    println!("\n== A100 PCIe 40 GB against the published figures:");
    let a100: Vec<Run> = done
        .into_iter()
        .filter(|r| r.name.contains("A100"))
        .collect();
    check_a100(&a100, log);
}

/// A long run's search on the real runs: the search on a third of the readings, each
/// family then refined on all, against the whole search, on the meter's samples. On the
/// A100 runs, whose chosen fits are identified, every parameter of the chosen family
/// within a tenth of its standard error, and the same family; on every run the chosen
/// family's residual within 1 %. Also printed, not held: the same on a lattice of `T/64`
/// cells, which `railtrace calibrate` uses only for a reference of more than 4 million
/// samples (on these runs' few sharp steps a 1.6 ms cell moves the A100's period by most
/// of a standard error: the lattice's error does not average out over a handful of
/// steps, as it does over a long capture's thousands).
#[test]
fn a_long_runs_search_gives_the_real_runs_answers() {
    let Some(root) = data_root() else {
        return;
    };
    // Both A100 runs, and the 3090's and the 4090's transient runs.
    for (name, offset) in [RUNS[0], RUNS[1], RUNS[2], RUNS[4]] {
        if !root.join(name).is_dir() {
            println!("SKIPPED: {name} is not here");
            continue;
        }
        let r = identify_run(&root, name, offset);
        let opts = Options {
            search_readings: r.id.readings_used / 3,
            ..Options::default()
        };
        let id = identify(&r.reference, &r.read_t, &r.read_w, &opts).unwrap();
        let (old, new) = (r.id.best(), id.fit(r.id.best().family()).unwrap());
        println!("\n== {name}: the whole search, then the search on a third of the readings");
        println!("   {}\n   {}", describe(old), describe(new));
        // The meter's samples again, on identify_run's timeline, as a lattice.
        let run = read_run(&root.join(name), 0.0).unwrap();
        let t0 = run.pmd.time_us[0];
        let period = period_from_changes(&r.read_t, &r.read_w).unwrap().0;
        let mut b =
            LatticeBuilder::new((period / 64.0).max(r.reference.median_spacing_s())).unwrap();
        for (i, &t) in run.pmd.time_us.iter().enumerate() {
            b.push((t - t0) * 1e-6, run.pmd.power_w(i)).unwrap();
        }
        let lattice = identify(&b.finish().unwrap(), &r.read_t, &r.read_w, &opts).unwrap();
        let on_lattice = lattice.fit(old.family()).unwrap();
        println!("   {} (on a lattice)", describe(on_lattice));
        assert!(
            (new.rms_w / old.rms_w - 1.0).abs() < 0.01,
            "{name}: residual"
        );
        if !name.contains("A100") {
            continue;
        }
        assert_eq!(
            id.best().family(),
            old.family(),
            "{name}: the family chosen"
        );
        let turns = ((new.phase_s.value - old.phase_s.value) / old.period_s.value).round();
        let shape = |f: &FamilyFit| f.window_s().or(f.tau_s());
        let mut pairs = vec![
            ("period", old.period_s, new.period_s.value),
            (
                "phase",
                old.phase_s,
                new.phase_s.value - turns * old.period_s.value,
            ),
            ("gain", old.gain, new.gain.value),
            ("offset", old.offset_w, new.offset_w.value),
        ];
        if let (Some(o), Some(n)) = (shape(old), shape(new)) {
            pairs.push(("shape", o, n.value));
        }
        for (what, o, n) in pairs {
            let z = (n - o.value).abs() / o.se;
            println!("   {what}: {z:.3} standard errors apart");
            assert!(
                z <= 0.1,
                "{name} {what}: {n} against {} ± {}",
                o.value,
                o.se
            );
        }
    }
}
