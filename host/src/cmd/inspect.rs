//! `railtrace inspect FILE`: what a recording holds.

use std::path::PathBuf;

use railtrace::store::inspect::summarise;
use railtrace::store::recording;

/// Prints a recording's summary: source, device, rows of each kind, time span, gaps and
/// their causes, trigger edges, power per rail, the GPU logger's readings and its energy
/// counter.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The recording (.arrow).
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `railtrace inspect`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (s, rails) = summarise(&args.file)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!("file      {}", s.file.display());
    println!(
        "state     {}",
        if s.finalised {
            "complete (closed by its writer)"
        } else {
            "not closed (the capture was killed or lost power): rows up to its last flush"
        }
    );
    for d in &s.damage {
        println!("damage    {d}");
    }
    println!("source    {}", s.source);
    println!(
        "start     {} (time_s = 0)",
        recording::iso_utc(s.epoch_utc_ns)
    );
    if let Some(d) = &s.device {
        let g = |k: &str| {
            d.get(k)
                .map(|v| v.to_string().trim_matches('"').to_string())
        };
        println!(
            "device    {} {} firmware {}{}",
            g("board").unwrap_or_default(),
            g("serial").unwrap_or_default(),
            g("firmware").unwrap_or_default(),
            if d.get("test_signal").and_then(|v| v.as_bool()) == Some(true) {
                " (test signal)"
            } else {
                ""
            }
        );
    }
    if let Some(st) = &s.settings {
        println!("settings  {st}");
    }
    println!(
        "rails     {}{}",
        rails.join(", "),
        if s.rig {
            " (rig description in the file)"
        } else {
            ""
        }
    );
    let rows: Vec<String> = s
        .rows
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    println!("rows      {}", rows.join(", "));
    if let (Some(a), Some(b)) = (s.first_sample_s, s.last_sample_s) {
        println!(
            "samples   {a:.6} s to {b:.6} s ({:.3} s), {:.1} samples/s on average",
            b - a,
            s.mean_sample_rate_hz.unwrap_or(0.0)
        );
    }
    if s.gaps.is_empty() {
        println!("gaps      none");
    } else {
        println!(
            "gaps      {} totalling {:.6} s",
            s.gaps.len(),
            s.gap_total_s
        );
    }
    for g in s.gaps.iter().take(20) {
        println!(
            "  at {:.6} s for {:.6} s{}: {}",
            g.time_s,
            g.duration_s,
            g.samples
                .map_or(String::new(), |n| format!(" ({n} samples)")),
            g.cause
        );
    }
    if s.gaps.len() > 20 {
        println!("  ... and {} more (--json lists all)", s.gaps.len() - 20);
    }
    for (line, n) in &s.edges_by_line {
        let dir = if line & 0x80 != 0 { "output" } else { "input" };
        println!("edges     line {} ({dir}): {n}", line & 0x7f);
    }
    let order = rails.iter().map(|r| format!("{r}_w"));
    for (name, p) in order
        .chain(["total_w".to_string()])
        .filter_map(|n| s.power.get(&n).map(|p| (n, p)))
    {
        println!(
            "power     {name:<16} mean {:>9.3} W  min {:>9.3} W  max {:>9.3} W",
            p.mean_w, p.min_w, p.max_w
        );
    }
    println!(
        "energy    {:.3} J (total_w over the samples, gaps excluded)",
        s.energy_j
    );
    if let Some(l) = &s.logger {
        let from = if l.sources.is_empty() {
            String::new()
        } else {
            format!(" ({})", l.sources.join(", "))
        };
        println!("logger    {} readings{from}", l.readings);
        if let Some(c) = &l.energy_counter {
            println!(
                "          its energy counter: {:.3} J over {:.3} s between its first and last of {} reads (mean {:.3} W){}",
                c.energy_j,
                c.span_s,
                c.reads,
                c.mean_w,
                if c.energy_j < 0.0 { "; it went back: the counter was reset" } else { "" }
            );
        }
    }
    Ok(())
}
