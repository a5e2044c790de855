//! What a recording holds, summarised in one pass a record batch at a time: its source
//! and device, rows of each kind, time span, gaps and their causes, trigger edges, power
//! per rail, and the GPU logger's readings with its energy counter (`railtrace inspect`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow_array::Array;
use serde::Serialize;

use crate::store::recording::{self, Kind, Rows};

#[derive(Debug, Default, Serialize)]
pub struct Power {
    pub mean_w: f64,
    pub min_w: f64,
    pub max_w: f64,
}

#[derive(Debug, Serialize)]
pub struct Gap {
    pub time_s: f64,
    pub duration_s: f64,
    pub samples: Option<u64>,
    pub cause: String,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub file: PathBuf,
    pub finalised: bool,
    /// What is cut or damaged, one line each; the figures are of everything else.
    pub damage: Vec<String>,
    pub source: String,
    pub epoch_utc_ns: i64,
    pub device: Option<serde_json::Value>,
    pub settings: Option<serde_json::Value>,
    pub rig: bool,
    pub rows: BTreeMap<&'static str, u64>,
    pub first_sample_s: Option<f64>,
    pub last_sample_s: Option<f64>,
    pub mean_sample_rate_hz: Option<f64>,
    pub gaps: Vec<Gap>,
    pub gap_total_s: f64,
    pub edges_by_line: BTreeMap<u8, u64>,
    pub power: BTreeMap<String, Power>,
    pub energy_j: f64,
    pub logger: Option<LoggerSummary>,
}

/// The GPU logger's readings.
#[derive(Debug, Default, Serialize)]
pub struct LoggerSummary {
    pub readings: u64,
    /// Where they came from, as the readings say.
    pub sources: Vec<String>,
    /// The GPU's energy counter between its first and last reads.
    pub energy_counter: Option<EnergyCounter>,
}

#[derive(Debug, Serialize)]
pub struct EnergyCounter {
    pub reads: u64,
    pub first_j: f64,
    pub last_j: f64,
    /// Host time from the first read to the last, s.
    pub span_s: f64,
    /// `last_j - first_j`: negative if the counter was reset (the driver reloaded).
    pub energy_j: f64,
    pub mean_w: f64,
}

/// The energy counter's reads: (host ns when read, J), in file order.
fn energy_counter(reads: &[(i64, f64)]) -> Option<EnergyCounter> {
    let (&(t0, first_j), &(t1, last_j)) = (reads.first()?, reads.last()?);
    let span_s = (t1 - t0) as f64 * 1e-9;
    let energy_j = last_j - first_j;
    Some(EnergyCounter {
        reads: reads.len() as u64,
        first_j,
        last_j,
        span_s,
        energy_j,
        mean_w: if span_s > 0.0 {
            energy_j / span_s
        } else {
            f64::NAN
        },
    })
}

/// The summary of a recording, read a record batch at a time (only the columns it needs).
pub fn summarise(path: &Path) -> anyhow::Result<(Summary, Vec<String>)> {
    let r = recording::open(path)?;
    let mut names: Vec<String> = r.meta.rails.iter().map(|n| format!("{n}_w")).collect();
    names.push("total_w".into());
    let mut sums = vec![(0.0f64, 0u64, f64::INFINITY, f64::NEG_INFINITY); names.len()];
    let (mut first, mut last) = (None, None);
    let mut gaps = Vec::new();
    let mut edges = BTreeMap::new();
    let mut energy = 0.0;
    let mut prev: Option<(f64, f64)> = None;
    let mut counts = [0u64; recording::KINDS];
    let mut logger = LoggerSummary::default();
    let mut counter: Vec<(i64, f64)> = Vec::new();
    let mut wanted: Vec<&str> = vec![
        "time_s",
        "duration_s",
        "count",
        "text",
        "line",
        "logger_energy_j",
        "host_send_ns",
        "host_recv_ns",
    ];
    wanted.extend(names.iter().map(String::as_str));
    let mut reader = r.reopen(Some(&wanted))?;
    for batch in reader.by_ref() {
        let batch = batch?;
        let rows = Rows::new(&batch);
        rows.count_kinds(&mut counts);
        let time = rows.f64("time_s");
        let cols: Vec<_> = names.iter().map(|n| rows.f32(n)).collect();
        let text = rows.text();
        let (send, recv) = (
            rows.column::<arrow_array::Int64Array>("host_send_ns"),
            rows.column::<arrow_array::Int64Array>("host_recv_ns"),
        );
        let counter_j = rows.f64("logger_energy_j");
        for i in 0..rows.len() {
            match rows.kind(i) {
                Kind::Sample => {
                    let t = time.value(i);
                    first.get_or_insert(t);
                    last = Some(t);
                    for (s, c) in sums.iter_mut().zip(&cols) {
                        if let Some(v) = Rows::get(c, i) {
                            let v = f64::from(v);
                            s.0 += v;
                            s.1 += 1;
                            s.2 = s.2.min(v);
                            s.3 = s.3.max(v);
                        }
                    }
                    // Trapezoids between consecutive samples; a gap row breaks the chain.
                    let w = Rows::get(cols[cols.len() - 1], i).map_or(f64::NAN, f64::from);
                    if let Some((t0, w0)) = prev {
                        energy += (t - t0) * (w + w0) / 2.0;
                    }
                    prev = w.is_finite().then_some((t, w));
                }
                Kind::Gap => {
                    prev = None;
                    gaps.push(Gap {
                        time_s: time.value(i),
                        duration_s: Rows::get(rows.f64("duration_s"), i).unwrap_or(f64::NAN),
                        samples: Rows::get(rows.u64("count"), i),
                        cause: text.value(i).to_string(),
                    });
                }
                Kind::Edge => {
                    let line = rows.column::<arrow_array::UInt8Array>("line");
                    *edges.entry(line.value(i)).or_insert(0) += 1;
                }
                Kind::Logger => {
                    logger.readings += 1;
                    if text.is_valid(i) && !logger.sources.iter().any(|s| s == text.value(i)) {
                        logger.sources.push(text.value(i).to_string());
                    }
                    // Read when the host got the reading: its poll time, else its stamp.
                    let read_ns = Rows::get(send, i).or_else(|| Rows::get(recv, i));
                    if let (Some(j), Some(at)) = (Rows::get(counter_j, i), read_ns) {
                        counter.push((at, j));
                    }
                }
                _ => {}
            }
        }
    }
    let n = counts[0];
    let span = first.zip(last).map(|(a, b)| b - a);
    let gap_total_s = gaps
        .iter()
        .map(|g| g.duration_s)
        .filter(|d| d.is_finite())
        .sum();
    let rails = r.meta.rails.clone();
    let summary = Summary {
        file: r.path.clone(),
        finalised: r.finalised,
        damage: reader.damage().to_vec(),
        source: r.meta.source.clone(),
        epoch_utc_ns: r.meta.epoch_utc_ns,
        device: r.meta.device.clone(),
        settings: r.meta.settings.clone(),
        rig: r.meta.rig.is_some(),
        rows: Kind::TABLE.iter().map(|k| k.name()).zip(counts).collect(),
        first_sample_s: first,
        last_sample_s: last,
        mean_sample_rate_hz: span
            .filter(|s| *s > 0.0)
            .map(|s| (n.saturating_sub(1)) as f64 / s),
        gaps,
        gap_total_s,
        edges_by_line: edges,
        power: names
            .into_iter()
            .zip(sums)
            .filter(|(_, s)| s.1 > 0)
            .map(|(n, s)| {
                (
                    n,
                    Power {
                        mean_w: s.0 / s.1 as f64,
                        min_w: s.2,
                        max_w: s.3,
                    },
                )
            })
            .collect(),
        energy_j: energy,
        logger: (logger.readings > 0).then(|| LoggerSummary {
            energy_counter: energy_counter(&counter),
            ..logger
        }),
    };
    Ok((summary, rails))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::recording::{Event, Meta, Writer};

    /// A GPU drawing 250 W whose counter is read at every other poll: the counter's
    /// energy and mean power, from its host read times.
    #[test]
    fn the_loggers_energy_counter_is_summarised() {
        let path = std::env::temp_dir().join(format!(
            "railtrace-inspect-energy-{}.arrow",
            std::process::id()
        ));
        let meta = Meta::new("test", &["r"]);
        let mut w = Writer::create(&path, &meta).unwrap();
        for k in 0..10u32 {
            let polled_ns = 1_000_000_000 + i64::from(k) * 100_000_000;
            w.event(&Event::Logger {
                time_s: f64::NAN,
                power_w: 250.0,
                instant_w: None,
                average_w: None,
                temperature_c: None,
                // Read every other poll: 250 W for 0.2 s is 50 J.
                energy_j: (k % 2 == 1).then(|| 9_000.0 + 25.0 * f64::from(k)),
                source: Some("nvml-samples".into()),
                gpu_ticks: None,
                host_ns: None,
                own_s: Some(f64::from(k) * 0.1),
                polled_ns: Some(polled_ns),
            });
        }
        w.finish().unwrap();
        let (s, _) = summarise(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let l = s.logger.unwrap();
        assert_eq!(
            (l.readings, l.sources),
            (10, vec!["nvml-samples".to_string()])
        );
        let c = l.energy_counter.unwrap();
        assert_eq!((c.reads, c.first_j, c.last_j), (5, 9_025.0, 9_225.0));
        assert!((c.span_s - 0.8).abs() < 1e-12, "{}", c.span_s);
        assert!((c.mean_w - 250.0).abs() < 1e-9, "{}", c.mean_w);
        // No counter, no figure; a reset reads negative.
        assert!(energy_counter(&[]).is_none());
        let reset = energy_counter(&[(0, 10.0), (1_000_000_000, 2.0)]).unwrap();
        assert_eq!((reset.energy_j, reset.mean_w), (-8.0, -8.0));
    }
}
