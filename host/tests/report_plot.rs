//! `railtrace report --plot`: the four panels drawn from an analysis built by hand, as
//! SVG and PNG; the all-SSE and empty cases; the errors; and the command end to end on
//! the twin.

use railtrace::analysis::report_plot::{self, Options};
use railtrace::analysis::stitch::{
    Aligned, Analysis, Link, Options as AnalysisOptions, Point, Support,
};

mod common;
use common::TempDir;

fn link(residuals_s: Vec<f64>, rms_s: f64, used: usize) -> Link {
    Link {
        x0_s: 0.0,
        offset_s: 0.5,
        slope: 1.0 - 20e-6,
        rate_error_ppm: 20.0,
        rms_s,
        used,
        outliers: 0,
        residuals_s,
    }
}

/// A profile of 40 µs bins over 1 ms: a plateau while the kernel runs, then idle; the
/// logger's a lagging copy of it, with an empty bin.
fn profile(peak_w: f64, lag_bins: usize, empty: Option<usize>) -> Vec<Point> {
    (0..25)
        .map(|i| {
            let (lo, hi) = (i as f64 * 40e-6, (i + 1) as f64 * 40e-6);
            let on = i >= lag_bins && i < lag_bins + 6;
            let (n, mean_w) = if Some(i) == empty {
                (0, f64::NAN)
            } else {
                (40, if on { peak_w } else { 100.0 })
            };
            Point {
                lo_s: lo,
                hi_s: hi,
                n,
                mean_w,
                std_w: 3.0,
                ci_half_w: if n > 1 { 1.5 } else { f64::NAN },
            }
        })
        .collect()
}

/// `trains` trains of `per_train` executions 250 µs apart, about 200 µs each (a few
/// slow ones), power settling over the train; SSP 10 ms into a train.
fn analysis(trains: u64, per_train: u32) -> Analysis {
    let mut executions = Vec::new();
    for train in 0..trains {
        let t0 = train as f64 * 0.1;
        for i in 0..per_train {
            let since = f64::from(i) * 250e-6;
            let slow = (train + u64::from(i)) % 17 == 0;
            let duration_s = if slow {
                230e-6
            } else {
                200e-6 + f64::from(i % 5) * 1e-6
            };
            let power_w = 500.0 - 40.0 * (-since / 3e-3).exp();
            executions.push(Aligned {
                start_s: t0 + since,
                end_s: t0 + since + duration_s,
                duration_s,
                train,
                index_in_train: i,
                kept: !slow,
                ssp: i > 0 && since >= 10e-3,
                rig_energy_j: power_w * duration_s,
            });
        }
    }
    let n = executions.len();
    let slow = executions.iter().filter(|e| !e.kept).count();
    let device: Vec<f64> = (0..2 * trains as usize)
        .map(|i| ((i * 7919) % 13) as f64 * 0.3e-6 - 1.8e-6)
        .collect();
    let gpu: Vec<f64> = (0..5 * trains as usize)
        .map(|i| ((i * 104_729) % 11) as f64 * 1e-9 - 5e-9)
        .collect();
    let (logger, rig) = (profile(300.0, 3, Some(12)), profile(480.0, 0, None));
    Analysis {
        support: Support::of(Some((Some(5e-6), &rig)), 20e-6, &logger),
        device: link(device, 1.1e-6, 2 * trains as usize),
        gpu: link(gpu, 3e-9, trains as usize),
        executions,
        clusters: vec![(200e-6, 204e-6, n - slow), (230e-6, 230e-6, slow)],
        fixed_margin: (194e-6, 206e-6, n - slow),
        logger,
        rig,
        rig_energy_j: 0.1,
        sse_energy_j: None,
        ssp_energy_j: None,
        settling_tau_s: None,
        settle_s: 10e-3,
        options: AnalysisOptions::default(),
    }
}

/// The text of an SVG's `<text>` elements, entities decoded.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..t.find("</text>")?];
            Some(
                body.trim()
                    .replace("&apos;", "'")
                    .replace("&quot;", "\"")
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&amp;", "&"),
            )
        })
        .collect()
}

fn has(texts: &[String], words: &str) -> bool {
    texts.iter().any(|t| t.contains(words))
}

#[test]
fn svg_shows_the_four_panels_with_their_axes_and_legends() {
    let dir = TempDir::new("report-plot-svg");
    let svg = dir.join("report.svg");
    let a = analysis(6, 60);
    let opts = Options {
        title: "railtrace report — synthetic".into(),
        ..Options::default()
    };
    report_plot::render(&a, &svg, &opts).unwrap();
    let t = texts(&std::fs::read_to_string(&svg).unwrap());
    for words in [
        "railtrace report — synthetic",
        "360 executions in 6 trains",
        // 1: the stitched profiles.
        "Stitched power profiles",
        "time of interest from the execution's start (µs)",
        "power (W)",
        "rig: total power, mean per 20 µs bin (W); band: 95 % CI",
        "GPU logger: mean per 20 µs bin (W)",
        "kernel: mean duration 202.0 µs",
        // 2: SSE against SSP.
        "SSE vs SSP",
        "start, time since the train's first start (ms)",
        "mean rig power over the execution (W)",
        "SSP from 10.0 ms (fixed; no settling fitted)",
        "SSE: ",
        "SSP: ",
        "hollow: dropped by the duration clustering",
        // 3: the histogram.
        "Execution time: 360 executions, 2 duration clusters",
        "execution time on the GPU's clock (µs)",
        "executions per bin",
        "kept cluster 200.0–204.0 µs",
        "cluster 230.0–230.0 µs",
        "fixed margin ±3 % of the median: 194.0–206.0 µs",
        // 4: the residuals, each in its unit, the RMS in the legend.
        "Alignment residuals: device (rig) clock → host",
        "trigger edge number",
        "residual (µs)",
        "RMS 1.10 µs",
        "Alignment residuals: GPU clock → host",
        "clock read number",
        "residual (ns)",
        "RMS 3.00 ns",
    ] {
        assert!(has(&t, words), "no {words:?} in {t:#?}");
    }
    // SSE and SSP counted as the executions are: 40 of each train's 60 start 10 ms in.
    let sse = a.executions.iter().filter(|e| !e.ssp).count();
    assert!(has(&t, &format!("SSE: {sse} executions")), "{t:#?}");
    assert!(has(&t, &format!("SSP: {} executions", 360 - sse)), "{t:#?}");
}

/// The big-endian u32 at `at`.
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn png_is_a_png_of_the_size_asked() {
    let dir = TempDir::new("report-plot-png");
    let a = analysis(6, 60);
    for (w, h) in [(2000, 1400), (1200, 800)] {
        let png = dir.join(&format!("report-{w}.png"));
        let opts = Options {
            width: w,
            height: h,
            ..Options::default()
        };
        report_plot::render(&a, &png, &opts).unwrap();
        let b = std::fs::read(&png).unwrap();
        assert!(b.len() > 20_000, "{} bytes", b.len());
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&b[12..16], b"IHDR");
        assert_eq!((be32(&b, 16), be32(&b, 20)), (w, h));
        assert_eq!(&b[b.len() - 8..b.len() - 4], b"IEND");
    }
}

#[test]
fn single_executions_are_all_sse_and_the_panel_says_so() {
    let dir = TempDir::new("report-plot-sse");
    let svg = dir.join("report.svg");
    let a = analysis(50, 1);
    assert!(a.executions.iter().all(|e| !e.ssp));
    report_plot::render(&a, &svg, &Options::default()).unwrap();
    let t = texts(&std::fs::read_to_string(&svg).unwrap());
    assert!(has(&t, "All 50 executions are SSE"), "{t:#?}");
    assert!(has(&t, "Every train is a single execution"), "{t:#?}");
    assert!(!has(&t, "SSP from"), "no chart: {t:#?}");
    // The other panels are still drawn.
    assert!(has(&t, "Stitched power profiles"), "{t:#?}");
    assert!(has(&t, "executions per bin"), "{t:#?}");
}

#[test]
fn a_nearly_empty_analysis_still_draws() {
    // One execution, no clusters, no stitched bins, no residuals, NaN margins.
    let dir = TempDir::new("report-plot-empty");
    let mut a = analysis(1, 1);
    a.clusters.clear();
    a.fixed_margin = (f64::NAN, f64::NAN, 0);
    a.logger.clear();
    a.rig.clear();
    a.device.residuals_s.clear();
    a.gpu.residuals_s = vec![f64::NAN];
    for ext in ["svg", "png"] {
        let out = dir.join(&format!("report.{ext}"));
        report_plot::render(&a, &out, &Options::default()).unwrap();
        assert!(std::fs::metadata(&out).unwrap().len() > 1000);
    }
    let t = texts(&std::fs::read_to_string(dir.join("report.svg")).unwrap());
    assert!(has(&t, "No stitched bins"), "{t:#?}");
    assert!(has(&t, "No residuals."), "{t:#?}");
}

#[test]
fn far_outliers_are_counted_off_the_axes() {
    let dir = TempDir::new("report-plot-tail");
    let svg = dir.join("report.svg");
    let mut a = analysis(6, 60);
    // One execution 10 times as long, one device residual 1000 times the RMS.
    a.executions[7].duration_s = 2e-3;
    a.clusters[1].1 = 2e-3;
    a.device.residuals_s[3] = 1.1e-3;
    report_plot::render(&a, &svg, &Options::default()).unwrap();
    let t = texts(&std::fs::read_to_string(&svg).unwrap());
    assert!(has(&t, "off the axis: 1 above, up to 2000.0 µs"), "{t:#?}");
    assert!(has(&t, "1 residual beyond ±"), "{t:#?}");
}

#[test]
fn errors_are_one_clear_line() {
    let dir = TempDir::new("report-plot-errors");
    let a = analysis(2, 3);
    let err = |name: &str, opts: &Options| {
        report_plot::render(&a, &dir.join(name), opts)
            .unwrap_err()
            .to_string()
    };
    let e = err("report.jpg", &Options::default());
    assert!(e.contains(".jpg") && e.contains(".svg or .png"), "{e}");
    let tiny = Options {
        width: 300,
        height: 200,
        ..Options::default()
    };
    let e = err("report.svg", &tiny);
    assert!(e.contains("300×200 px"), "{e}");
    let e = err("no/such/dir/report.png", &Options::default());
    assert!(e.contains("no/such/dir/report.png"), "{e}");
    for e in [
        err("report.jpg", &Options::default()),
        err("report.svg", &tiny),
    ] {
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn the_command_writes_the_picture_beside_its_summary() {
    let dir = TempDir::new("report-plot-cli");
    let run = |args: &[&str]| common::railtrace(&dir.0, args);
    let o = run(&["profile", "--runs", "40", "-o", "p.arrow"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["report", "p.arrow", "--plot", "r.svg"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(out.contains("clocks") && out.contains("energy"), "{out}");
    assert!(err.contains("wrote r.svg (2000×1400 px)"), "{err}");
    let t = texts(&std::fs::read_to_string(dir.join("r.svg")).unwrap());
    assert!(has(&t, "railtrace report — p.arrow"), "{t:#?}");
    assert!(has(&t, "All 40 executions are SSE"), "{t:#?}");
    // JSON on stdout stays JSON with a picture asked for.
    let o = run(&[
        "report", "p.arrow", "--json", "-o", "r.png", "--width", "1200",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap();
    assert!(dir.join("r.png").exists());
    // A wrong extension fails before the analysis, in one line; a size needs a picture.
    for (args, words) in [
        (vec!["report", "p.arrow", "-o", "r.pdf"], ".pdf"),
        (vec!["report", "missing.arrow", "-o", "r.gif"], ".gif"),
        (vec!["report", "p.arrow", "--width", "1200"], "--plot"),
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(words), "{args:?}: {err}");
    }
    let o = run(&["report", "p.arrow", "-o", "r.pdf"]);
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
}

/// Bins finer than the rig's rise, and logger bins of one reading, are left out of the
/// picture, and the legend says why.
#[test]
fn bins_the_rig_or_the_logger_cannot_support_are_said_not_drawn() {
    let dir = TempDir::new("report-plot-support");
    let svg = dir.join("report.svg");
    let mut a = analysis(2, 10);
    a.logger[5].n = 1;
    a.support = Support::of(Some((Some(31.4e-6), &a.rig)), 20e-6, &a.logger);
    assert!(
        !a.support.rig_resolves && a.support.logger_thin == 1,
        "{:?}",
        a.support
    );
    report_plot::render(&a, &svg, &Options::default()).unwrap();
    let t = texts(&std::fs::read_to_string(&svg).unwrap());
    assert!(
        has(
            &t,
            "rig: not drawn: bins of 20.0 µs are finer than it resolves (its 10-90 % rise 31.4 µs); take bins of 32 µs or wider"
        ),
        "{t:#?}"
    );
    assert!(
        has(&t, "logger: 1 bins with fewer than 2 readings not drawn"),
        "{t:#?}"
    );
    assert!(
        !has(&t, "rig: total power"),
        "the rig's profile is not drawn: {t:#?}"
    );
    // Drawn, they are emptied; the analysis itself keeps every bin.
    let d = a.drawable();
    assert!(d.rig.iter().all(|p| p.mean_w.is_nan()) && d.logger[5].mean_w.is_nan());
    assert!(a.rig.iter().all(|p| p.mean_w.is_finite()) && a.logger[5].mean_w.is_finite());
    // A rig that resolves the bins is drawn, and says nothing.
    let s = Support::of(Some((Some(5e-6), &a.rig)), 20e-6, &a.rig);
    assert!(s.rig_resolves && s.notes.is_empty(), "{s:?}");
}
