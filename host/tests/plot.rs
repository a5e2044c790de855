//! `railtrace plot`: the decimation against a slow reference, SVG and PNG output from a
//! recording written here, lines broken at gaps, and the errors.

use std::path::Path;
use std::process::Command;

use railtrace::store::plot::{self, Bin, Options};
use railtrace::store::recording::{self, Event, Meta, Writer};

mod common;
use common::TempDir;

/// SplitMix64: a fixed-seed generator, so the tests see the same data every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The obvious way: for each column, look at every value.
fn reference(t: &[f64], v: &[f32], t0: f64, t1: f64, columns: usize) -> Vec<Option<Bin>> {
    (0..columns)
        .map(|c| {
            let mut bin: Option<Bin> = None;
            for (&t, &v) in t.iter().zip(v) {
                if plot::column(t, t0, t1, columns) != Some(c) || !v.is_finite() {
                    continue;
                }
                let b = bin.get_or_insert(Bin {
                    min: f32::INFINITY,
                    max: f32::NEG_INFINITY,
                    sum: 0.0,
                    n: 0,
                });
                b.min = b.min.min(v);
                b.max = b.max.max(v);
                b.sum += f64::from(v);
                b.n += 1;
            }
            bin
        })
        .collect()
}

#[test]
fn decimation_matches_the_slow_reference() {
    let mut rng = Rng(0x5eed);
    for (n, columns) in [(0, 10), (1, 1), (7, 300), (10_000, 137), (100_000, 1460)] {
        // Sorted times from before the window to after it, spiky values, some NaN.
        let mut t = Vec::with_capacity(n);
        let mut now = -0.1;
        for _ in 0..n {
            now += rng.unit() * 2.4 / n as f64;
            t.push(now);
        }
        let v: Vec<f32> = (0..n)
            .map(|_| match rng.next() % 100 {
                0 => f32::NAN,
                1 => 1000.0 * rng.unit() as f32,
                _ => 100.0 + 10.0 * rng.unit() as f32,
            })
            .collect();
        let (t0, t1) = (0.0, 2.0);
        let got = plot::decimate(&t, &v, t0, t1, columns);
        let want = reference(&t, &v, t0, t1, columns);
        assert_eq!(got.len(), columns);
        for (c, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "column {c} of {columns} ({n} values)");
        }
        // Order does not matter to min, max and count.
        let mut shuffled: Vec<(f64, f32)> = t.iter().copied().zip(v.iter().copied()).collect();
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.next() as usize % (i + 1));
        }
        let (ts, vs): (Vec<f64>, Vec<f32>) = shuffled.into_iter().unzip();
        let got = plot::decimate(&ts, &vs, t0, t1, columns);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                g.map(|b| (b.min, b.max, b.n)),
                w.map(|b| (b.min, b.max, b.n))
            );
        }
    }
}

#[test]
fn an_envelope_ends_a_run_and_starts_empty() {
    let mut e = plot::Envelope::new(0.0, 1.0, 10);
    e.push(0.55, 3.0);
    e.push(0.05, 1.0);
    e.push(0.56, 5.0);
    e.push(1.5, 9.0);
    let run = e.take();
    assert_eq!(run.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [0, 5]);
    assert_eq!((run[1].1.min, run[1].1.max, run[1].1.n), (3.0, 5.0, 2));
    assert_eq!(run[1].1.mean(), 4.0);
    assert!(e.take().is_empty());
    e.push(0.95, 2.0);
    assert_eq!(e.take().len(), 1);
}

/// A recording of two rails over 0..3 s at 10 kS/s, the first busy half of each `period`
/// s, with (if `gap`) no samples from 1.0 s to 1.5 s and a gap row for them, trigger
/// edges and (if `logger`) logger readings.
fn write_recording(path: &Path, period: f64, gap: bool, logger: bool) {
    let meta = Meta {
        version: recording::FORMAT_VERSION,
        source: "test".into(),
        epoch_utc_ns: 1_800_000_000_000_000_000,
        timebase: "test".into(),
        rails: vec!["gpu_12v".into(), "aux_3v3".into()],
        code_channels: vec![],
        device: None,
        rig: None,
        settings: None,
        derive: None,
    };
    let mut w = Writer::create(path, &meta).unwrap();
    for i in 0..30_000u64 {
        let t = i as f64 * 1e-4;
        if (1.0..1.5).contains(&t) {
            if gap && i == 10_000 {
                w.event(&Event::Gap {
                    time_s: t,
                    index: Some(i),
                    samples: Some(5000),
                    duration_s: 0.5,
                    cause: "test".into(),
                });
            }
            continue;
        }
        let busy = (t / period).fract() < 0.5;
        let a = if busy { 20.0 } else { 5.0 } + (i % 7) as f32 * 0.1;
        w.sample(t, Some(i), None, &[(12.0, a), (3.3, 1.0)], &[]);
        if i % 5000 == 0 {
            w.event(&Event::Edge {
                time_s: t,
                tick: None,
                index: Some(i),
                line: if i % 10_000 == 0 { 0 } else { 0x81 },
                rising: i % 10_000 == 0,
                count: None,
                label: "kernel".into(),
            });
        }
        if logger && i % 1000 == 0 {
            w.event(&Event::Logger {
                time_s: t,
                power_w: if busy { 250.0 } else { 70.0 },
                instant_w: None,
                average_w: None,
                temperature_c: None,
                energy_j: None,
                source: None,
                gpu_ticks: None,
                host_ns: None,
                own_s: None,
                polled_ns: None,
            });
        }
        w.maybe_flush().unwrap();
    }
    w.finish().unwrap();
}

/// The points of every polyline of more than two points (the data lines; axes, ticks,
/// grid lines, edge markers and legend samples have two).
fn data_polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
    svg.split("<polyline")
        .skip(1)
        .filter_map(|p| {
            let pts = p.split("points=\"").nth(1)?.split('"').next()?;
            let pts: Vec<(f64, f64)> = pts
                .split_whitespace()
                .map(|xy| {
                    let (x, y) = xy.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect();
            (pts.len() > 2).then_some(pts)
        })
        .collect()
}

/// Steps of a data line that jump across the middle of the gap (1.0 s to 1.5 s of 0..3 s).
fn steps_across_the_gap(lines: &[Vec<(f64, f64)>]) -> usize {
    let xs = lines.iter().flatten().map(|p| p.0);
    let lo = xs.clone().fold(f64::INFINITY, f64::min);
    let hi = xs.fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (lo + (hi - lo) / 3.0 + 2.0, lo + (hi - lo) / 2.0 - 2.0);
    lines
        .iter()
        .flat_map(|l| l.windows(2))
        .filter(|w| w[0].0 < a && w[1].0 > b)
        .count()
}

#[test]
fn svg_has_the_legend_and_axes_and_breaks_lines_at_gaps() {
    let dir = TempDir::new("plot-svg");
    let arrow = dir.join("run.arrow");
    write_recording(&arrow, 0.25, true, true);
    let rec = recording::read(&arrow).unwrap();
    let svg = dir.join("run.svg");
    let p = plot::render(&rec, &svg, &Options::default()).unwrap();
    assert_eq!((p.samples, p.gaps, p.edges, p.logger), (25_000, 1, 5, 25));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..100]);
    assert!(text.contains(r#"width="1600" height="900""#));
    for words in [
        "gpu_12v",
        "aux_3v3",
        "total",
        "time (s)",
        "power (W)",
        "GPU logger",
        "gap",
        "edge line 0 (input) kernel",
        "edge line 1 (output) kernel",
        "run.arrow",
    ] {
        assert!(text.contains(words), "{words:?} is not in the SVG");
    }
    // Two runs (before and after the gap) of each rail's and the total's min/max band and
    // mean line, and the logger's steps, which are readings of the GPU and go on across
    // the meter's gap.
    let lines = data_polylines(&text);
    assert_eq!(lines.len(), 2 * 3 * 2 + 1, "data lines");
    let meter: Vec<_> = lines.into_iter().filter(|l| l.len() > 60).collect();
    assert_eq!(steps_across_the_gap(&meter), 0);
    assert!(text.contains("<rect"), "the gap's band");
}

#[test]
fn without_a_gap_row_the_line_goes_on() {
    // The check above sees a line drawn across missing samples: here, the same samples
    // without the gap row give one band and one line per series, and steps across.
    let dir = TempDir::new("plot-nogap");
    let arrow = dir.join("run.arrow");
    write_recording(&arrow, 0.25, false, false);
    let rec = recording::read(&arrow).unwrap();
    let svg = dir.join("run.svg");
    plot::render(&rec, &svg, &Options::default()).unwrap();
    let lines = data_polylines(&std::fs::read_to_string(&svg).unwrap());
    assert_eq!(lines.len(), 6);
    assert_eq!(steps_across_the_gap(&lines), 6);
}

#[test]
fn a_load_faster_than_the_columns_is_drawn_as_dots() {
    // A 5 ms period against 2 ms columns: a line through the columns' means would be
    // vertical strokes filling the band; the mean is one mark per column instead. The
    // constant rail keeps its line.
    let dir = TempDir::new("plot-dots");
    let arrow = dir.join("run.arrow");
    write_recording(&arrow, 0.005, false, false);
    let rec = recording::read(&arrow).unwrap();
    let svg = dir.join("run.svg");
    plot::render(&rec, &svg, &Options::default()).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(data_polylines(&text).len(), 3 + 1, "3 bands and 1 line");
    assert!(
        text.matches("<rect").count() > 2 * 1000,
        "marks of 2 series"
    );
}

/// The big-endian u32 at `at`.
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// CRC-32 (the PNG/zlib polynomial), bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn png_is_a_whole_png_of_the_size_asked() {
    let dir = TempDir::new("plot-png");
    let arrow = dir.join("run.arrow");
    write_recording(&arrow, 0.25, true, true);
    let rec = recording::read(&arrow).unwrap();
    let png = dir.join("run.png");
    let opts = Options {
        from: Some(0.5),
        to: Some(2.0),
        width: 1000,
        height: 600,
        ..Options::default()
    };
    let p = plot::render(&rec, &png, &opts).unwrap();
    assert_eq!((p.from, p.to, p.gaps), (0.5, 2.0, 1));
    let b = std::fs::read(&png).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&b[12..16], b"IHDR");
    assert_eq!((be32(&b, 16), be32(&b, 20)), (1000, 600));
    // Every chunk whole, its CRC right, image data there, and the end chunk last.
    let (mut at, mut kinds) = (8, Vec::new());
    while at < b.len() {
        let len = be32(&b, at) as usize;
        let kind = &b[at + 4..at + 8];
        assert_eq!(crc32(&b[at + 4..at + 8 + len]), be32(&b, at + 8 + len));
        kinds.push(String::from_utf8_lossy(kind).into_owned());
        at += 12 + len;
    }
    assert_eq!(at, b.len());
    assert!(kinds.iter().any(|k| k == "IDAT"));
    assert_eq!(kinds.last().map(String::as_str), Some("IEND"));
}

#[test]
fn errors_are_one_clear_line() {
    let dir = TempDir::new("plot-errors");
    let arrow = dir.join("run.arrow");
    write_recording(&arrow, 0.25, false, false);
    let rec = recording::read(&arrow).unwrap();
    let err = |out: &str, opts: Options| {
        let e = plot::render(&rec, &dir.join(out), &opts)
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    };
    let e = err("run.jpg", Options::default());
    assert!(e.contains(".jpg") && e.contains(".svg or .png"), "{e}");
    let e = err("run", Options::default());
    assert!(e.contains("no extension"), "{e}");
    let after = Options {
        from: Some(7.0),
        ..Options::default()
    };
    let e = err("run.svg", after);
    assert!(
        e.contains("--from 7 s is after the last sample, at 2.999900 s"),
        "{e}"
    );
    let before = Options {
        to: Some(-1.0),
        ..Options::default()
    };
    let e = err("run.svg", before);
    assert!(e.contains("--to -1 s is before the first sample"), "{e}");
    let between = Options {
        from: Some(1.00001),
        to: Some(1.00002),
        ..Options::default()
    };
    let e = err("run.svg", between);
    assert!(
        e.contains("no samples between 1.00001 s and 1.00002 s"),
        "{e}"
    );
    let nan = Options {
        from: Some(f64::NAN),
        ..Options::default()
    };
    let e = err("run.svg", nan);
    assert!(e.contains("--from NaN: not a time"), "{e}");
    let backwards = Options {
        from: Some(2.0),
        to: Some(1.0),
        ..Options::default()
    };
    let e = err("run.svg", backwards);
    assert!(e.contains("not before"), "{e}");
    let tiny = Options {
        width: 100,
        ..Options::default()
    };
    let e = err("run.png", tiny);
    assert!(e.contains("100×900 px") && e.contains("640"), "{e}");

    // A recording with no samples at all.
    let empty = dir.join("empty.arrow");
    let meta = recording::read(&arrow).unwrap().meta;
    let mut w = Writer::create(&empty, &meta).unwrap();
    w.event(&Event::Text {
        kind: recording::Kind::Log,
        time_s: 0.0,
        text: "nothing".into(),
    });
    w.finish().unwrap();
    let rec = recording::read(&empty).unwrap();
    let e = plot::render(&rec, &dir.join("e.svg"), &Options::default()).unwrap_err();
    assert!(e.to_string().contains("no samples"), "{e}");
}

#[test]
fn the_command_plots_and_fails_in_one_line() {
    let dir = TempDir::new("plot-cli");
    let arrow = dir.join("run.arrow");
    write_recording(&arrow, 0.25, true, true);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_railtrace"))
            .arg("plot")
            .args(args)
            .output()
            .unwrap()
    };
    let svg = dir.join("out.svg");
    let o = run(&[
        arrow.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
        "--from",
        "0.5",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("start 2027-01-15T08:00:00.000000000Z"),
        "the title's start time"
    );
    for (args, words) in [
        (vec!["missing.arrow", "-o", "x.svg"], "missing.arrow"),
        (vec![arrow.to_str().unwrap(), "-o", "x.pdf"], ".pdf"),
        (
            vec![svg.to_str().unwrap(), "-o", "x.png"],
            "not a railtrace recording",
        ),
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(words), "{err}");
    }
}

#[test]
fn a_long_closed_recording_plots_from_its_overview_as_from_its_samples() {
    let dir = TempDir::new("plot-overview");
    let path = dir.join("long.arrow");
    let meta = Meta {
        version: recording::FORMAT_VERSION,
        source: "test".into(),
        epoch_utc_ns: 1_800_000_000_000_000_000,
        timebase: "test".into(),
        rails: vec!["gpu_12v".into(), "aux_3v3".into()],
        code_channels: vec![0, 1, 2, 3],
        device: None,
        rig: None,
        settings: None,
        derive: Some(recording::Derive {
            tick_hz: 1e6,
            channels: vec![0, 1, 2, 3],
            cal: vec![(0.01, 0.0), (0.001, 0.0), (0.001, 0.0), (0.0005, 0.0)],
            rails: vec![(Some(1), Some(0)), (Some(3), Some(2))],
        }),
    };
    // 3.2 M samples at 100 kS/s in blocks of 200, a load stepping every 10 ms, and
    // 0.5 s missing (a gap row) at 10 s.
    let mut w = Writer::create(&path, &meta).unwrap();
    let mut rng = Rng(9);
    let (mut index, mut written) = (0u64, 0u64);
    while written < 3_200_000 {
        let t = index as f64 * 1e-5;
        if index == 1_000_000 {
            w.event(&Event::Gap {
                time_s: t,
                index: Some(index),
                samples: Some(50_000),
                duration_s: 0.5,
                cause: "test".into(),
            });
            index += 50_000;
            continue;
        }
        let busy = (t / 0.01).fract() < 0.5;
        let codes: Vec<i16> = (0..200)
            .flat_map(|_| {
                let a = if busy { 2000 } else { 500 } + (rng.next() % 64) as i16;
                [a, 12_000, 1000, 6600]
            })
            .collect();
        w.block(t, index, index * 10, 10, 1e-5, &codes);
        index += 200;
        written += 200;
        w.maybe_flush().unwrap();
    }
    w.finish().unwrap();
    let opts = Options::default();
    let coarse = recording::overview(&path).unwrap().expect("an overview");
    assert!(
        plot::render_overview(&coarse, &dir.join("coarse.svg"), &opts)
            .unwrap()
            .is_none(),
        "49 coarse summaries are too few for the columns"
    );
    let fine = coarse.finer().unwrap().expect("a fine level");
    let len = std::fs::metadata(&path).unwrap().len();
    assert!((coarse.bytes_read + fine.bytes_read) * 20 < len);
    let from_overview = plot::render_overview(&fine, &dir.join("fine.svg"), &opts)
        .unwrap()
        .expect("3 125 fine summaries are enough");
    let rec = recording::open(&path).unwrap();
    let from_samples = plot::render(&rec, &dir.join("samples.svg"), &opts).unwrap();
    assert_eq!(from_overview.samples, 3_200_000);
    assert_eq!(from_overview.samples, from_samples.samples);
    assert_eq!((from_overview.gaps, from_samples.gaps), (1, 1));
    assert!((from_overview.from - from_samples.from).abs() < 1e-9);
    assert!((from_overview.to - from_samples.to).abs() < 1e-9);
    // The same mean lines, to a pixel or two: a column (22 ms) is whole summaries
    // (10.24 ms) placed by their middles, where the samples fall by their own times, and
    // the load's 10 ms cycle averages out over either.
    let extremes = |svg: &Path| {
        let lines = data_polylines(&std::fs::read_to_string(svg).unwrap());
        let ys: Vec<f64> = lines.iter().flatten().map(|p| p.1).collect();
        (
            ys.iter().copied().fold(f64::INFINITY, f64::min),
            ys.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let (a, b) = (
        extremes(&dir.join("fine.svg")),
        extremes(&dir.join("samples.svg")),
    );
    assert!(
        (a.0 - b.0).abs() <= 2.0 && (a.1 - b.1).abs() <= 2.0,
        "{a:?} {b:?}"
    );
}

/// A series drawn over the run (a logger's readings deconvolved): in the legend, dashed
/// in its own colour, from the step in effect at the window's start.
#[test]
fn an_overlay_is_drawn_over_the_window_with_its_label() {
    let dir = TempDir::new("plot-overlay");
    let arrow = dir.join("run.arrow");
    write_recording(&arrow, 0.25, false, true);
    let rec = recording::read(&arrow).unwrap();
    let (with, without) = (dir.join("with.svg"), dir.join("without.svg"));
    let overlay = plot::Overlay {
        label: "GPU logger deconvolved (model.toml)".into(),
        steps: vec![(0.0, 150.0), (1.2, 420.0), (1.4, 160.0), (9.0, 150.0)],
    };
    let window = Options {
        from: Some(1.0),
        to: Some(1.6),
        ..Options::default()
    };
    plot::render(
        &rec,
        &with,
        &Options {
            overlay: Some(overlay),
            ..window.clone()
        },
    )
    .unwrap();
    plot::render(&rec, &without, &window).unwrap();
    let (a, b) = (
        std::fs::read_to_string(&with).unwrap(),
        std::fs::read_to_string(&without).unwrap(),
    );
    assert!(a.contains("GPU logger deconvolved (model.toml)"));
    let teal = "#006D77";
    assert!(a.matches(teal).count() > 10, "dashed: many short strokes");
    assert!(!b.contains(teal) && !b.contains("deconvolved"));
}
