//! `railtrace demo [--out DIR]`: the whole job on the twin, no hardware. A profiling run of
//! a two-phase kernel beside the rig (captured over the twin's pseudo-terminal), the GPU
//! logger calibrated from the rig, the stitched logger profile deconvolved, and every
//! profile scored against the twin's truth: a table on the terminal, an HTML report with
//! the pictures, and the exports.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use railtrace::demo::{cells, picture, Cell, Curve, Score, Stitched, Truth};
use railtrace::export::{export, Format, Options as ExportOptions};
use railtrace::gpu::twin::{TwinGpu, TwinTrigger};
use railtrace::gpu::Launch;
use railtrace::profile::{rig_path, Plan};
use railtrace::recording;

use super::{calibrate, correct, profile};

/// Runs the twin's scenario through profiling, logger calibration and correction, and
/// scores each profile against the twin's truth.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where everything goes (made if missing; files of an earlier demo are replaced).
    #[arg(long, default_value = "railtrace-demo")]
    out: PathBuf,
    /// The twin's scenario; the built-in default (an MI300X-like 1 ms box logger and a
    /// 200 µs two-phase kernel) when not given.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// The rig description (hardware/rigs/*.toml) the twin is built on, instead of the
    /// one the scenario names: its ADC's filter, its board's rates and its link.
    #[arg(long)]
    rig: Option<PathBuf>,
    /// The kernel to profile.
    #[arg(long, default_value = "gemm")]
    kernel: String,
    /// Executions to profile, each after a random delay.
    #[arg(long, default_value_t = 1000)]
    runs: usize,
    /// Shortest and longest random delay before each launch, ms (longer than the kernel
    /// plus the logger's window, so that no reading sees two executions).
    #[arg(value_parser = super::millis, long, allow_hyphen_values = true, num_args = 2, value_names = ["MIN", "MAX"], default_values_t = [1.5, 3.0])]
    delay_ms: Vec<f64>,
    /// Width of the profiles' bins, µs; 10 µs, or the finest the rig resolves when that
    /// is coarser (its analog chain's 10-90 % rise, or the width that gathers 30 samples a
    /// bin over the runs).
    #[arg(value_parser = super::bin_us, long)]
    bin_us: Option<f64>,
    /// The rig's sample rate, Hz; when not given, the lowest that puts a sample in every
    /// bin, within what the rig's link carries with every channel.
    #[arg(long)]
    rate: Option<u32>,
    /// The logger's update period if known, ms (identified from its readings otherwise).
    #[arg(value_parser = super::period_ms, long)]
    period_ms: Option<f64>,
    /// The check on each corrected phase's power, relative (0.05: within 5 %).
    #[arg(long, default_value_t = 0.05)]
    phase_tolerance: f64,
    /// The check on each corrected step's time, µs.
    #[arg(long, default_value_t = 20.0)]
    step_tolerance_us: f64,
    /// The check on the corrected profile's RMS error, as a fraction of the raw stitched
    /// profile's (a third, for a logger of about the kernel's length; a logger whose window is
    /// much longer than the kernel leaves the corrected tail after the kernel
    /// noise-limited, and 1 asks only that correction not be worse than none).
    #[arg(long, default_value_t = 1.0 / 3.0)]
    rms_ratio: f64,
    /// Seed of the runner's random delays.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the figures as JSON too.
    #[arg(long)]
    json: bool,
}

/// The finest bin a stitched profile from a rig resolves: its slowest channel's 10-90 %
/// rise (sensor and ADC input filter), or the width that gathers [`Resolution::SAMPLES`]
/// samples a bin over the runs if wider (the runs' random delays spread the conversions
/// over the kernel, so the sample period itself is no limit), rounded up to whole µs.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Resolution {
    rise_s: f64,
    samples_per_us: f64,
    finest_s: f64,
}

impl Resolution {
    /// Samples a bin needs for its mean (the noise falls as 1/√n).
    const SAMPLES: f64 = 30.0;

    fn of(rig: &railtrace_rig::RigDescription, rate_hz: u32, runs: usize) -> Resolution {
        let rise_s = rig.rise_s();
        let per_s = f64::from(rate_hz) * runs as f64;
        let finest_s = (rise_s.max(Self::SAMPLES / per_s) * 1e6 - 1e-9).ceil() * 1e-6;
        Resolution {
            rise_s,
            samples_per_us: per_s * 1e-6,
            finest_s,
        }
    }

    fn describe(&self) -> String {
        format!(
            "finest bin it resolves {:.0} µs (10-90 % rise {:.2} µs; {:.1} samples a µs over the runs)",
            self.finest_s * 1e6,
            self.rise_s * 1e6,
            self.samples_per_us
        )
    }
}

/// One of the demo's checks, with what was measured.
#[derive(Debug, serde::Serialize)]
struct Check {
    what: String,
    measured: String,
    pass: bool,
}

/// Runs `railtrace demo`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let (lo, hi) = (args.delay_ms[0], args.delay_ms[1]);
    anyhow::ensure!(
        lo >= 0.0 && hi >= lo,
        "--delay-ms {lo} {hi}: need 0 <= MIN <= MAX"
    );
    anyhow::ensure!(
        args.bin_us.is_none_or(|b| b > 0.0) && args.runs > 0,
        "--bin-us and --runs must be > 0"
    );
    let out = &args.out;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let loaded =
        railtrace_twin::scenario::load_with(args.scenario.as_deref(), args.rig.as_deref())?;
    let rig = &loaded.rig;
    let channels = rig.channels.len();
    let carried = rig.carried_rate_hz(channels).with_context(|| {
        format!(
            "the rig {}'s link carries none of its rates with {channels} channels",
            rig.name
        )
    })?;
    // Bins of 10 µs, or the finest the rig resolves at the top rate its link carries;
    // then the lowest rate that puts a sample in every bin.
    let bin_s = args.bin_us.map_or(
        Resolution::of(rig, carried, args.runs).finest_s.max(10e-6),
        |b| b * 1e-6,
    );
    let rate = args.rate.unwrap_or_else(|| {
        rig.board
            .sample_rates_hz
            .iter()
            .copied()
            .filter(|&r| r <= carried && f64::from(r) * bin_s >= 1.0 - 1e-9)
            .min()
            .unwrap_or(carried)
    });
    let resolution = Resolution::of(rig, rate, args.runs);
    eprintln!(
        "railtrace demo: {} -> {}\n  rig {}: {}\n  {rate} samples/s; {}; bins of {:.1} µs",
        loaded.scenario.description,
        out.display(),
        rig.name,
        railtrace_rig::summary(rig),
        resolution.describe(),
        bin_s * 1e6
    );
    if bin_s < resolution.finest_s * (1.0 - 1e-9) {
        eprintln!(
            "railtrace demo: warning: {:.1} µs bins are finer than this rig resolves ({:.1} µs)",
            bin_s * 1e6,
            resolution.finest_s * 1e6
        );
    }

    // 1. The profiling run, the twin writing its truth beside it.
    let truth_dir = out.join("truth");
    let profile_path = out.join("profile.arrow");
    let twin = railtrace_twin::Twin::start_with(&loaded, Some(&truth_dir))
        .context("the twin did not start")?;
    let gpu = TwinGpu::new(&twin);
    let plan = Plan {
        launch: Launch {
            kernel: args.kernel.clone(),
            delay_s: (lo * 1e-3, hi * 1e-3),
            warmup: 0,
            count: 1,
            dvfs: None,
        },
        runs: args.runs,
        clock_reads: 5,
        trigger_line: 0,
        target: None,
        preheat_s: 0.0,
    };
    let t = Instant::now();
    let result = profile::profile(
        &profile::Run {
            output: profile_path.clone(),
            rate_hz: Some(rate),
            bin_s,
            scenario: args.scenario.clone(),
            rig: args.rig.clone(),
            rig_rise_s: Some(rig.rise_s()),
            target_error: None,
        },
        &plan,
        Some(twin.path()),
        &mut gpu.runner(args.seed),
        &mut gpu.logger(),
        &mut TwinTrigger::new(&twin, 0),
    );
    twin.stop().context("the twin failed")?; // closes the truth files
    result?;
    let profile_s = t.elapsed().as_secs_f64();

    // 2. The logger calibrated from the rig.
    let logger_path = out.join("logger.toml");
    let cal = calibrate::with_spinner(|progress| {
        calibrate::calibrate(
            &profile_path,
            None,
            calibrate::Request {
                period_ms: args.period_ms,
                ..calibrate::Request::default()
            },
            progress,
        )
    })?;
    cal.model.write(&logger_path)?;
    calibrate::print(&cal, &logger_path);

    // 3. The stitched logger profile corrected.
    let t = Instant::now();
    let rig_recording = rig_path(&profile_path);
    let c = correct::correct(
        &profile_path,
        &rig_recording,
        &cal.model,
        &logger_path,
        bin_s,
    )?;
    let correct_s = t.elapsed().as_secs_f64();
    let (a, d) = (&c.analysis, &c.d);

    // 4. The truth: the host's executions are the twin's last ones (its scenario's own
    //    workload ran before).
    let truth = Truth::read(&truth_dir)?;
    let mine = truth.executions_of(&a.executions)?;
    let st = Stitched::of_kept(&truth, &a.executions, mine)?;
    let duration = *st.bounds_s.last().unwrap_or(&0.0);

    // 5. The profiles, on their cells.
    let dt = d.dt_s;
    let corrected: Vec<Cell> =
        d.t.iter()
            .zip(&d.power_w)
            .map(|(&t, &w)| Cell {
                lo: t - 0.5 * dt,
                hi: t + 0.5 * dt,
                w,
            })
            .collect();
    let band: Vec<(Cell, Cell)> = corrected
        .iter()
        .zip(d.lo_w.iter().zip(&d.hi_w))
        .map(|(c, (&l, &h))| (Cell { w: l, ..*c }, Cell { w: h, ..*c }))
        .collect();
    let raw = cells(&a.logger);
    let rig_cells = cells(&a.rig);
    let through: Vec<Cell> = correct::through_logger(
        &rig_cells.iter().map(|c| (c.lo, c.w)).collect::<Vec<_>>(),
        a.options.bin_s,
        &c.logger,
        c.idle_w,
    )
    .into_iter()
    .zip(&rig_cells)
    .map(|((_, w), r)| Cell { w, ..*r })
    .collect();
    let reach = c.logger.kernel.len() as f64 * dt;
    // Up to the next execution's start at the earliest (the truth beyond holds it).
    let spacing = mine
        .windows(2)
        .map(|w| w[1].start_s - w[0].start_s)
        .fold(f64::INFINITY, f64::min);
    let span = (
        corrected.first().map_or(0.0, |c| c.lo).min(0.0),
        raw.last().map_or(duration + reach, |c| c.hi).min(spacing),
    );
    let true_cells = st.cells(span.0, span.1, dt);
    let rms_span = (0.0, duration + reach);
    let score_truth = Score {
        phase_w: st.phase_w.clone(),
        step_s: st.bounds_s[1..st.bounds_s.len() - 1]
            .iter()
            .map(|&b| Some(b))
            .collect(),
        energy_j: st.energy_j,
        rms_w: 0.0,
    };
    let rows = [
        ("truth", score_truth),
        ("rig", st.score(&rig_cells, a.rig_energy_j, rms_span)),
        (
            "raw stitched",
            st.score(
                &raw,
                railtrace::demo::mean_over(&raw, 0.0, duration) * duration,
                rms_span,
            ),
        ),
        ("corrected", st.score(&corrected, d.energy_j, rms_span)),
    ];

    // 6. The checks the demo exists for.
    let (truth_row, raw_row, cor) = (&rows[0].1, &rows[2].1, &rows[3].1);
    let rel = |a: f64, b: f64| (a - b) / b;
    let mut checks = Vec::new();
    for (j, (got, want)) in cor.step_s.iter().zip(&truth_row.step_s).enumerate() {
        let err = got.zip(*want).map(|(g, w)| g - w);
        checks.push(Check {
            what: format!(
                "step {} within {} µs of the truth",
                j + 1,
                args.step_tolerance_us
            ),
            measured: err.map_or("no step".into(), |e| format!("{:+.1} µs", e * 1e6)),
            pass: err.is_some_and(|e| e.abs() <= args.step_tolerance_us * 1e-6),
        });
    }
    for (j, (&got, &want)) in cor.phase_w.iter().zip(&truth_row.phase_w).enumerate() {
        let e = rel(got, want);
        checks.push(Check {
            what: format!(
                "phase {} power within {} % of the truth",
                j + 1,
                args.phase_tolerance * 100.0
            ),
            measured: format!("{:+.2} %", e * 100.0),
            pass: e.abs() <= args.phase_tolerance,
        });
    }
    let e = rel(cor.energy_j, truth_row.energy_j);
    checks.push(Check {
        what: "energy per execution within 2 % of the truth".into(),
        measured: format!("{:+.2} %", e * 100.0),
        pass: e.abs() <= 0.02,
    });
    checks.push(Check {
        what: format!(
            "RMS error at most {:.3} of the raw stitched profile's",
            args.rms_ratio
        ),
        measured: format!(
            "{:.2} W against {:.2} W ({:.3})",
            cor.rms_w,
            raw_row.rms_w,
            cor.rms_w / raw_row.rms_w
        ),
        pass: cor.rms_w <= raw_row.rms_w * args.rms_ratio,
    });

    // 7. The table.
    let phases = truth_row.phase_w.len();
    let mut table = String::new();
    let _ = write!(table, "{:<14}", "");
    for j in 0..phases {
        let _ = write!(table, "{:>18}", format!("phase {} W", j + 1));
    }
    for j in 0..phases - 1 {
        let _ = write!(table, "{:>16}", format!("step {} µs", j + 1));
    }
    let _ = writeln!(table, "{:>22}{:>10}", "energy/exec mJ", "RMS W");
    for (name, s) in &rows {
        let _ = write!(table, "{name:<14}");
        for (&w, &t) in s.phase_w.iter().zip(&truth_row.phase_w) {
            let _ = write!(
                table,
                "{:>18}",
                format!("{w:.1} ({:+.1} %)", rel(w, t) * 100.0)
            );
        }
        for st in &s.step_s {
            let _ = write!(
                table,
                "{:>16}",
                st.map_or("none".into(), |t| format!("{:.1}", t * 1e6))
            );
        }
        let _ = writeln!(
            table,
            "{:>22}{:>10.2}",
            format!(
                "{:.3} ({:+.2} %)",
                s.energy_j * 1e3,
                rel(s.energy_j, truth_row.energy_j) * 100.0
            ),
            s.rms_w
        );
    }

    // 8. The report and the exports.
    let t = Instant::now();
    let corrected_path = out.join("corrected.arrow");
    let figures = serde_json::json!({
        "scenario": loaded.scenario.description,
        "rig": {"name": rig.name, "summary": railtrace_rig::summary(rig)},
        "rate_hz": rate,
        "resolution": resolution,
        "runs": args.runs,
        "executions_kept": a.executions.iter().filter(|e| e.kept).count(),
        "bin_s": dt,
        "logger": cal.model,
        "idle_w": c.idle_w,
        "reference_lag_s": c.reference_lag_s,
        "duration_s": duration,
        "lambda": d.lambda,
        "rule": d.rule,
        "noise_scale": d.noise_scale,
        "segments": d.segments,
        "energy_band_j": [d.energy_lo_j, d.energy_hi_j],
        "rows": rows.iter().map(|(n, s)| serde_json::json!({"profile": n, "score": s})).collect::<Vec<_>>(),
        "raw_peak_w": raw.iter().map(|c| c.w).filter(|w| w.is_finite()).fold(f64::NAN, f64::max),
        "checks": checks,
        "seconds": {"profile": profile_s, "calibrate": cal.seconds, "correct": correct_s},
    });
    correct::write(&c, &figures, &corrected_path)?;
    let curves = [
        Curve {
            name: "truth (the twin's GPU power)",
            colour: plotters::style::BLACK,
            dashed: false,
            cells: &true_cells,
        },
        Curve {
            name: "rig",
            colour: plotters::style::RGBColor(0x1f, 0x77, 0xb4),
            dashed: false,
            cells: &rig_cells,
        },
        Curve {
            name: "raw stitched logger",
            colour: plotters::style::RGBColor(0x8e, 0x3b, 0xa0),
            dashed: false,
            cells: &raw,
        },
        Curve {
            name: "rig through the identified logger",
            colour: plotters::style::RGBColor(0xff, 0x7f, 0x0e),
            dashed: true,
            cells: &through,
        },
        Curve {
            name: "corrected (band shaded)",
            colour: plotters::style::RGBColor(0xd6, 0x27, 0x28),
            dashed: false,
            cells: &corrected,
        },
    ];
    let title = format!("railtrace demo: {}", loaded.scenario.description);
    let zoom = (-0.15 * duration, 1.6 * duration);
    picture(
        &out.join("profiles.png"),
        &title,
        &curves,
        &band,
        span,
        zoom,
    )?;
    let svg = picture(
        &out.join("profiles.svg"),
        &title,
        &curves,
        &band,
        span,
        zoom,
    )?
    .unwrap_or_default();
    write_csv(
        &out.join("profiles.csv"),
        &[
            ("truth_w", &true_cells),
            ("rig_w", &rig_cells),
            ("raw_w", &raw),
            ("rig_through_logger_w", &through),
            ("corrected_w", &corrected),
        ],
        dt,
        span,
    )?;
    let mut exported = Vec::new();
    for (path, format, name) in [
        (&rig_recording, Format::Parquet, "profile.rig.parquet"),
        (&rig_recording, Format::Perfetto, "profile.rig.json"),
        (&profile_path, Format::Parquet, "profile.parquet"),
    ] {
        let target = out.join(name);
        export(
            &recording::open(path)?,
            &target,
            &ExportOptions::new(format),
        )?;
        exported.push(target);
    }
    std::fs::write(
        out.join("figures.json"),
        serde_json::to_string_pretty(&figures)?,
    )
    .with_context(|| format!("cannot write into {}", out.display()))?;
    let html = out.join("report.html");
    std::fs::write(
        &html,
        report_html(&figures, &table, &checks, &svg, &exported, out),
    )
    .with_context(|| format!("cannot write {}", html.display()))?;
    let report_s = t.elapsed().as_secs_f64();

    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    }
    eprintln!("\n{table}");
    for ch in &checks {
        eprintln!(
            "  [{}] {}: {}",
            if ch.pass { "pass" } else { "FAIL" },
            ch.what,
            ch.measured
        );
    }
    eprintln!(
        "\nrailtrace demo: profile {profile_s:.1} s, calibration {:.1} s, correction {correct_s:.1} s, report and exports {report_s:.1} s; {:.1} s in all. Open {}",
        cal.seconds,
        started.elapsed().as_secs_f64(),
        html.display()
    );
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.pass)
        .map(|c| c.what.as_str())
        .collect();
    anyhow::ensure!(
        failed.is_empty(),
        "the demo's checks failed: {}",
        failed.join("; ")
    );
    Ok(())
}

/// The profiles on one grid of cells `dt` wide over `span`, as CSV (empty where a
/// profile has no cell there).
fn write_csv(
    path: &Path,
    columns: &[(&str, &[Cell])],
    dt: f64,
    span: (f64, f64),
) -> anyhow::Result<()> {
    let mut s = String::from("t_us");
    for (name, _) in columns {
        s.push(',');
        s.push_str(name);
    }
    s.push('\n');
    let n = ((span.1 - span.0) / dt).round() as usize;
    for i in 0..n {
        let mid = span.0 + (i as f64 + 0.5) * dt;
        let _ = write!(s, "{:.3}", mid * 1e6);
        for (_, cells) in columns {
            s.push(',');
            if let Some(c) = cells
                .iter()
                .find(|c| c.lo <= mid && mid < c.hi && c.w.is_finite())
            {
                let _ = write!(s, "{:.4}", c.w);
            }
        }
        s.push('\n');
    }
    std::fs::write(path, s).with_context(|| format!("cannot write {}", path.display()))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The report: the table, the checks, the picture inline, the files.
fn report_html(
    figures: &serde_json::Value,
    table: &str,
    checks: &[Check],
    picture: &str,
    exported: &[PathBuf],
    out: &Path,
) -> String {
    let mut h = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>railtrace demo</title>\n\
         <style>body{font-family:sans-serif;max-width:1450px;margin:2em auto;color:#222}\
         pre{background:#f6f6f6;padding:1em;overflow-x:auto}td,th{padding:.2em .8em;text-align:left}\
         .pass{color:#1a7f37}.fail{color:#c01c2b;font-weight:bold}</style></head><body>\n",
    );
    let _ = writeln!(
        h,
        "<h1>railtrace demo</h1><p>{}</p>",
        escape(figures["scenario"].as_str().unwrap_or(""))
    );
    let m = &figures["logger"];
    let _ = writeln!(
        h,
        "<p>{} runs, {} executions kept by the duration clustering; the logger identified \
         from the rig as <b>{}</b> (period {:.4} ms, delay {:.2} µs, gain {:.4}, offset {:.2} W, \
         residual {:.3} W); corrected on {:.0} µs cells, λ {:.3e} ({}), idle {:.1} W.</p>",
        figures["runs"],
        figures["executions_kept"],
        escape(m["family"].as_str().unwrap_or("")),
        m["period_s"].as_f64().unwrap_or(f64::NAN) * 1e3,
        m["delay_s"].as_f64().unwrap_or(f64::NAN) * 1e6,
        m["gain"].as_f64().unwrap_or(f64::NAN),
        m["offset_w"].as_f64().unwrap_or(f64::NAN),
        m["residual_rms_w"].as_f64().unwrap_or(f64::NAN),
        figures["bin_s"].as_f64().unwrap_or(f64::NAN) * 1e6,
        figures["lambda"].as_f64().unwrap_or(f64::NAN),
        escape(figures["rule"].as_str().unwrap_or("")),
        figures["idle_w"].as_f64().unwrap_or(f64::NAN),
    );
    let _ = writeln!(
        h,
        "<h2>Against the twin's truth</h2><pre>{}</pre>",
        escape(table)
    );
    h.push_str("<h2>Checks</h2><table>\n");
    for c in checks {
        let _ = writeln!(
            h,
            "<tr><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            if c.pass { "pass" } else { "fail" },
            if c.pass { "pass" } else { "FAIL" },
            escape(&c.what),
            escape(&c.measured)
        );
    }
    h.push_str("</table>\n<h2>The profiles</h2>\n");
    h.push_str(picture.trim_start_matches(|c| c != '<'));
    h.push_str("\n<h2>Files</h2><ul>\n");
    let mut files = vec![
        "profile.arrow".to_string(),
        "profile.rig.arrow".into(),
        "logger.toml".into(),
        "corrected.arrow".into(),
        "profiles.csv".into(),
        "profiles.svg".into(),
        "profiles.png".into(),
        "figures.json".into(),
        "truth/".into(),
    ];
    files.extend(
        exported
            .iter()
            .map(|p| p.strip_prefix(out).unwrap_or(p).display().to_string()),
    );
    for f in files {
        let _ = writeln!(h, "<li><a href=\"{0}\">{0}</a></li>", escape(&f));
    }
    h.push_str("</ul></body></html>\n");
    h
}
