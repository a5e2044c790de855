//! The twin in real time for a minute: `cargo run --release -p railtrace-tests --example
//! twin_realtime [SECONDS]`. Streams 8 channels at 100 kS/s from the default scenario over
//! the pseudo-terminal to a tokio-serial reader in the same process, then prints what
//! arrived, what the device counted as dropped, and the CPU each twin thread used
//! (from /proc/self/task/*/stat).
use std::time::{Duration, Instant};

use railtrace_protocol::{Configure, Message};
use railtrace_tests::{last_status, Client, Rx};
use tokio_serial::SerialPortBuilderExt;

const T: Duration = Duration::from_secs(10);

/// CPU seconds (user + system) of each thread of this process, by name.
fn thread_cpu() -> Vec<(String, f64)> {
    let tick = 100.0; // USER_HZ on Linux
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        // Fields after the ")" that ends the name: state is field 3; utime 14, stime 15.
        let Some(rest) = stat.rsplit_once(')').map(|r| r.1) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (u, s) = (
            f.get(11).and_then(|v| v.parse::<f64>().ok()),
            f.get(12).and_then(|v| v.parse::<f64>().ok()),
        );
        if let (Some(u), Some(s)) = (u, s) {
            out.push((name.trim().to_string(), (u + s) / tick));
        }
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(60);
    let twin = railtrace_twin::Twin::start(&railtrace_twin::default_scenario())?;
    let port = tokio_serial::new(twin.path().to_string_lossy(), 921_600).open_native_async()?;
    let mut dev = Client::new(port);
    dev.command(&Message::GetInfo { request_id: 1 }, T).await?;
    let cfg = Configure {
        request_id: 2,
        sample_rate_hz: 100_000,
        channel_mask: 0xFF,
        averaging: 1,
    };
    dev.command(&Message::Configure(cfg), T).await?;
    let cpu0 = thread_cpu();
    let start = Instant::now();
    dev.command(&Message::Start { request_id: 3 }, T).await?;
    let (mut next, mut gaps, mut bytes_samples) = (0u64, 0u64, 0u64);
    let mut last_report = Instant::now();
    while next < 100_000 * seconds {
        if let Rx::Block {
            first_index, codes, ..
        } = dev.recv(T).await?
        {
            gaps += first_index - next;
            next = first_index + codes.len() as u64;
            bytes_samples += 16 * codes.len() as u64;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "  {:.0} s: {next} samples, {gaps} missing",
                start.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let got = dev.command(&Message::Stop { request_id: 4 }, T).await?;
    let cpu1 = thread_cpu();
    let status = last_status(&got);
    println!(
        "{next} samples of 8 channels in {wall:.2} s ({:.0} samples/s, {:.2} MB/s of codes)",
        next as f64 / wall,
        bytes_samples as f64 / wall / 1e6
    );
    println!(
        "missing samples: {gaps}; frames lost on the link: {}; device status: {status:?}",
        dev.seq.lost
    );
    for (name, c1) in &cpu1 {
        let c0 = cpu0.iter().find(|(n, _)| n == name).map_or(0.0, |c| c.1);
        println!(
            "thread {name:<14} {:>5.1} % of one core",
            100.0 * (c1 - c0) / wall
        );
    }
    twin.stop()?;
    Ok(())
}
