//! The live view over an hour-long recording: 8 channels (4 rails) at 100 kS/s, 360 M
//! samples, written as a capture writes them (block rows, summaries, seals) with a load
//! that steps every 5 ms and drifts over minutes, and a trigger edge at each step. The
//! view's server is started on it as `railtrace view FILE` starts it, and pans and zooms
//! are asked of it over HTTP as the page asks them (`/range?t0&t1&columns=1000`), at
//! spans from the whole hour to 10 ms, at the start, the middle and the end; each is timed
//! from the request to the last byte of the answer. First paint: the server's start
//! (which reads what the page's first message says) and the first whole-hour request.
//!
//! Run: `cargo run --release -p railtrace --example view_bench [MINUTES]` (default 60).
//! The file (about 5.8 GB for an hour) is kept in the system's temp folder and reused by
//! the next run of the same length (`RAILTRACE_VIEW_BENCH_FILE` names another place).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use railtrace::link::view::{Server, Source};
use railtrace::store::recording::{self, Derive, Event, Meta, Writer};

const RATE: f64 = 100_000.0;
const TICK_HZ: f64 = 84e6;
const PERIOD_TICKS: u32 = 840;
const BLOCK: usize = 62; // samples a frame carries at 8 channels

fn meta() -> Meta {
    let rails = ["slot_12v", "slot_3v3", "cable1_12v", "cable2_12v"];
    Meta {
        code_channels: (0..8).collect(),
        derive: Some(Derive {
            tick_hz: TICK_HZ,
            channels: (0..8).collect(),
            // Even channels amperes (6.1 mA a code), odd ones volts (0.61 mV a code).
            cal: (0..8)
                .map(|c| {
                    if c % 2 == 0 {
                        (0.0061, 0.0)
                    } else {
                        (0.00061, 0.0)
                    }
                })
                .collect(),
            rails: (0..4).map(|r| (Some(2 * r + 1), Some(2 * r))).collect(),
        }),
        ..Meta::new("view_bench", &rails)
    }
}

/// Writes `minutes` of the recording at `path`.
fn make(path: &Path, minutes: u64) {
    let mut w = Writer::create(path, &meta()).expect("the benchmark's file");
    let samples = minutes * 60 * RATE as u64;
    let mut x: u32 = 1;
    let mut codes = vec![0i16; BLOCK * 8];
    let (mut index, started) = (0u64, Instant::now());
    while index < samples {
        let n = (BLOCK as u64).min(samples - index) as usize;
        for (k, s) in codes.chunks_exact_mut(8).take(n).enumerate() {
            let i = index + k as u64;
            let t = i as f64 / RATE;
            // A kernel every 10 ms: 5 ms high, then idle; the high level drifts over 7 min.
            let high = (i / 500) % 2 == 0;
            let level = if high {
                1.0 + 0.3 * (t / 420.0 * std::f64::consts::TAU).sin()
            } else {
                0.25
            };
            for (c, v) in s.iter_mut().enumerate() {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let noise = f64::from((x >> 24) as u8) - 127.5;
                *v = if c % 2 == 0 {
                    (level * 3000.0 / (1.0 + (c / 2) as f64) + noise) as i16
                } else {
                    (19_670.0 + noise / 8.0) as i16
                };
            }
            if i % 500 == 0 {
                w.event(&Event::Edge {
                    time_s: t,
                    tick: Some(i * u64::from(PERIOD_TICKS)),
                    index: Some(i),
                    line: 0,
                    rising: high,
                    count: None,
                    label: "kernel".into(),
                });
            }
        }
        w.block(
            index as f64 / RATE,
            index,
            index * u64::from(PERIOD_TICKS),
            PERIOD_TICKS,
            1.0 / RATE,
            &codes[..n * 8],
        );
        index += n as u64;
        w.maybe_flush().expect("writing the benchmark's file");
        if index % (600 * RATE as u64) < BLOCK as u64 {
            eprint!(
                "\rwriting {path:?}: {} of {minutes} min",
                index / (60 * RATE as u64)
            );
        }
    }
    w.finish().expect("closing the benchmark's file");
    eprintln!(
        "\rwrote {} min in {:.1} s: {:.2} GB",
        minutes,
        started.elapsed().as_secs_f64(),
        std::fs::metadata(path).map_or(0, |m| m.len()) as f64 / 1e9
    );
}

/// One GET of `/range`, as the page asks it: (seconds to the answer's last byte, bytes,
/// whether it was drawn from summaries).
fn range(addr: SocketAddr, t0: f64, t1: f64) -> (f64, usize, bool) {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).expect("the view's server");
    write!(
        s,
        "GET /range?t0={t0}&t1={t1}&columns=1000 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let secs = started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{t0}..{t1}: {}",
        text.lines().next().unwrap_or("")
    );
    (secs, answer.len(), text.contains("\"summaries\":true"))
}

fn main() {
    let minutes: u64 = std::env::args()
        .nth(1)
        .map_or(60, |m| m.parse().expect("MINUTES"));
    let path = std::env::var_os("RAILTRACE_VIEW_BENCH_FILE").map_or_else(
        || std::env::temp_dir().join(format!("railtrace-view-bench-{minutes}min.arrow")),
        PathBuf::from,
    );
    let closed = recording::overview(&path).ok().flatten().is_some();
    if !closed {
        make(&path, minutes);
    } else {
        eprintln!("reusing {path:?}");
    }
    let bytes = std::fs::metadata(&path).unwrap().len();
    // What the server does in the background as it starts: the fine summaries read.
    let t = Instant::now();
    let b = recording::Browse::open(&path)
        .unwrap()
        .expect("a closed recording");
    let open_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let fine = b.fine().map_or(0, |f| {
        f.recording.batches.iter().map(|b| b.num_rows()).sum()
    });
    println!(
        "opened for browsing in {:.3} s; its fine level ({fine} summaries) and the walk over its record batches in {:.3} s",
        open_s,
        t.elapsed().as_secs_f64()
    );
    drop(b);
    let started = Instant::now();
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), Source::File(path.clone())).unwrap();
    let bind_s = started.elapsed().as_secs_f64();
    let addr = server.local_addr().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let serving = {
        let done = done.clone();
        std::thread::spawn(move || server.run(done, None))
    };
    let end = minutes as f64 * 60.0;
    let (first_s, _, _) = range(addr, 0.0, end);
    println!(
        "{minutes} min of 8 channels at 100 kS/s ({:.2} GB): server ready in {:.3} s, first paint (the whole span) {:.3} s later: {:.3} s",
        bytes as f64 / 1e9,
        bind_s,
        first_s,
        bind_s + first_s
    );
    println!(
        "\n| span | where | answered in (ms) | from | bytes |\n| --- | --- | --- | --- | --- |"
    );
    let mut worst: f64 = 0.0;
    for span in [end, 600.0, 60.0, 20.0, 10.0, 1.0, 0.1, 0.01] {
        if span > end {
            continue;
        }
        let places = [
            ("start", 0.0),
            ("middle", (end - span) / 2.0),
            ("end", end - span),
        ];
        for &(name, at) in &places[..if span < end { 3 } else { 1 }] {
            // A zoom to the span, then a pan by half of it.
            for (what, t0) in [("", at), (" + pan", (at + span / 2.0).min(end - span))] {
                let (secs, len, summaries) = range(addr, t0, t0 + span);
                worst = worst.max(secs);
                println!(
                    "| {span} s | {name}{what} | {:.1} | {} | {len} |",
                    secs * 1e3,
                    if summaries { "summaries" } else { "samples" }
                );
            }
        }
    }
    println!("\nslowest answer: {:.1} ms", worst * 1e3);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    serving.join().unwrap().unwrap();
}
