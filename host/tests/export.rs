//! `railtrace export`: a small recording written here (samples with known values, a gap
//! inside a 100 µs bin, trigger edges, a logger reading, text rows) exported to Parquet,
//! CSV and Perfetto JSON and read back; the Perfetto counters against a slow reference;
//! the errors and the command line.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use arrow_array::{Array, BooleanArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use railtrace::store::export::{self, ExportError, Format, Options};
use railtrace::store::recording::{self, Event, Kind, Meta, Recording, Rows, Writer};
use serde_json::Value;

mod common;
use common::TempDir;

const EPOCH_NS: i64 = 1_764_409_453_535_000_000;

/// Sample `k`'s time: 100 kS/s, 3 µs off the bin grid.
fn t(k: u32) -> f64 {
    3e-6 + f64::from(k) * 1e-5
}

/// Samples 0..60 but 25 and 26, missing behind a gap row; bin 2 (200..300 µs) holds
/// samples on both sides of the gap. Rail `b` is not measured in some samples.
fn write_recording(path: &Path) -> Recording {
    let meta = Meta {
        version: recording::FORMAT_VERSION,
        source: "test".into(),
        epoch_utc_ns: EPOCH_NS,
        timebase: "test".into(),
        rails: vec!["a".into(), "b".into()],
        code_channels: vec![0],
        device: None,
        rig: None,
        settings: None,
        derive: None,
    };
    enum Item {
        Sample(u32),
        Event(Event),
    }
    let edge = |time_s, line, rising, label: &str| {
        Item::Event(Event::Edge {
            time_s,
            tick: None,
            index: None,
            line,
            rising,
            count: Some(1),
            label: label.into(),
        })
    };
    let text = |kind, time_s, text: &str| {
        Item::Event(Event::Text {
            kind,
            time_s,
            text: text.into(),
        })
    };
    let mut items: Vec<(f64, Item)> = (0..60)
        .filter(|k| !(25..27).contains(k))
        .map(|k| (t(k), Item::Sample(k)))
        .collect();
    items.extend([
        (0.0, text(Kind::Info, 0.0, r#"{"board":"test"}"#)),
        (1.234e-4, edge(1.234e-4, 0, true, "kernel A")),
        (2e-4, edge(2e-4, 1, true, "")),
        (
            t(25),
            Item::Event(Event::Gap {
                time_s: t(25),
                index: Some(25),
                samples: Some(2),
                duration_s: 2e-5,
                cause: "test: host too slow".into(),
            }),
        ),
        (3e-4, edge(3e-4, 1, false, "")),
        (
            3e-4,
            Item::Event(Event::Logger {
                time_s: 3e-4,
                power_w: 42.5,
                instant_w: Some(40.25),
                average_w: None,
                temperature_c: Some(63.5),
                energy_j: Some(5_000.25),
                source: Some("nvml-fields".into()),
                gpu_ticks: Some(123_456),
                host_ns: None,
                own_s: None,
                polled_ns: None,
            }),
        ),
        (3.5e-4, text(Kind::Status, 3.5e-4, r#"{"a":1,"b":2}"#)),
        (4e-4, edge(4e-4, 0, false, "kernel A")),
        (5e-4, edge(5e-4, 0x81, true, "")),
        (
            5.5e-4,
            text(Kind::Log, 5.5e-4, "hello, \"world\"\nsecond line"),
        ),
    ]);
    items.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut w = Writer::create(path, &meta).unwrap();
    for (_, item) in &items {
        match item {
            Item::Sample(k) => {
                let kf = *k as f32;
                let b = if k % 7 == 3 {
                    f32::NAN
                } else {
                    0.5 + 0.01 * kf
                };
                w.sample(
                    t(*k),
                    Some(u64::from(*k)),
                    Some(u64::from(*k) * 10),
                    &[(12.0, 1.0 + 0.1 * kf), (3.3, b)],
                    &[*k as i16],
                );
                if *k == 30 {
                    w.flush().unwrap(); // a second record batch
                }
            }
            Item::Event(e) => w.event(e),
        }
    }
    w.finish().unwrap();
    let rec = recording::read(path).unwrap();
    assert!(rec.batches.len() >= 2);
    rec
}

fn export_to(rec: &Recording, out: &Path, opts: &Options) -> export::Exported {
    let done = export::export(rec, out, opts).unwrap();
    assert_eq!(done.path, out);
    assert_eq!(done.bytes, std::fs::metadata(out).unwrap().len());
    assert!(!export::partial_path(out).exists());
    done
}

fn total_rows(rec: &Recording) -> usize {
    rec.batches.iter().map(RecordBatch::num_rows).sum()
}

/// (kind, time_s) of every row.
fn kinds_and_times(rec: &Recording) -> Vec<(Kind, f64)> {
    rec.rows()
        .flat_map(|r| {
            let time = r.f64("time_s");
            (0..r.len())
                .map(|i| (r.kind(i), time.value(i)))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn read_parquet(path: &Path) -> (Arc<Schema>, RecordBatch) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let schema = builder.schema().clone();
    let batches: Vec<RecordBatch> = builder
        .with_batch_size(1 << 20)
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(batches.len(), 1);
    (schema, batches.into_iter().next().unwrap())
}

#[test]
fn parquet_has_the_recordings_columns_values_and_units() {
    let dir = TempDir::new("export-parquet");
    let rec = write_recording(&dir.join("run.arrow"));
    let out = dir.join("run.parquet");
    let done = export_to(&rec, &out, &Options::new(Format::Parquet));
    assert_eq!(done.rows as usize, total_rows(&rec));

    let (schema, batch) = read_parquet(&out);
    assert_eq!(schema.fields().len(), rec.schema.fields().len());
    for (got, want) in schema.fields().iter().zip(rec.schema.fields()) {
        assert_eq!(got.name(), want.name());
        assert_eq!(got.data_type(), want.data_type(), "{}", got.name());
        assert_eq!(got.metadata(), want.metadata(), "{}", got.name());
    }
    let unit = |name: &str| {
        schema
            .field_with_name(name)
            .unwrap()
            .metadata()
            .get("unit")
            .cloned()
    };
    assert_eq!(unit("time_s").as_deref(), Some("s"));
    assert_eq!(unit("a_w").as_deref(), Some("W"));
    assert_eq!(unit("b_v").as_deref(), Some("V"));
    assert_eq!(unit("logger_w").as_deref(), Some("W"));
    assert_eq!(unit("logger_temp_c").as_deref(), Some("degC"));
    assert_eq!(unit("logger_energy_j").as_deref(), Some("J"));
    let md = schema.metadata();
    let meta: Meta = serde_json::from_str(&md["railtrace"]).unwrap();
    assert_eq!(meta, rec.meta);
    assert_eq!(md["railtrace.format"], recording::FORMAT);
    let note: Value = serde_json::from_str(&md["railtrace.export"]).unwrap();
    assert_eq!(note["kinds"].as_array().unwrap().len(), Kind::TABLE.len());

    // Every column equal, batch by batch of the recording (the kind column compares by
    // value: its dictionary comes back in the order of first use).
    assert_eq!(batch.num_rows(), total_rows(&rec));
    let mut offset = 0;
    for b in &rec.batches {
        for (c, want) in b.columns().iter().enumerate() {
            let got = batch.column(c).slice(offset, b.num_rows());
            assert_eq!(
                got.to_data(),
                want.to_data(),
                "column {}",
                b.schema().field(c).name()
            );
        }
        offset += b.num_rows();
    }

    // The key-value metadata pyarrow and polars show.
    let file = parquet::file::reader::SerializedFileReader::new(File::open(&out).unwrap()).unwrap();
    use parquet::file::reader::FileReader;
    let kv = file
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .clone();
    let keys: Vec<&str> = kv.iter().map(|kv| kv.key.as_str()).collect();
    for key in [
        "ARROW:schema",
        "railtrace",
        "railtrace.format",
        "railtrace.export",
    ] {
        assert!(keys.contains(&key), "{key} in {keys:?}");
    }
    let compression = file.metadata().row_group(0).column(1).compression();
    assert!(matches!(compression, parquet::basic::Compression::SNAPPY));
}

#[test]
fn parquet_and_csv_keep_only_the_kinds_asked_for() {
    let dir = TempDir::new("export-kinds");
    let rec = write_recording(&dir.join("run.arrow"));
    let rows = kinds_and_times(&rec);
    let mut opts = Options::new(Format::Parquet);
    opts.kinds = vec![Kind::Sample, Kind::Gap];
    let out = dir.join("run.parquet");
    let done = export_to(&rec, &out, &opts);
    let want: Vec<f64> = rows
        .iter()
        .filter(|(k, _)| matches!(k, Kind::Sample | Kind::Gap))
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(done.rows as usize, want.len());
    let (_, batch) = read_parquet(&out);
    let time = batch.column_by_name("time_s").unwrap();
    let time = time
        .as_any()
        .downcast_ref::<arrow_array::Float64Array>()
        .unwrap();
    assert_eq!(time.values().to_vec(), want);
    let kinds = arrow_cast_kinds(batch.column(0).as_ref());
    assert!(kinds.iter().all(|k| k == "sample" || k == "gap"));
    assert_eq!(kinds.iter().filter(|k| *k == "gap").count(), 1);

    opts.format = Format::Csv;
    opts.kinds = vec![Kind::Edge];
    let out = dir.join("edges.csv");
    let done = export_to(&rec, &out, &opts);
    assert_eq!(done.rows, 5);
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 6);
    assert!(text.lines().skip(1).all(|l| l.starts_with("edge,")));

    // No row of that kind: the header alone.
    opts.kinds = vec![Kind::TimeSync];
    let out = dir.join("none.csv");
    assert_eq!(export_to(&rec, &out, &opts).rows, 0);
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 1);
    assert!(text.starts_with("kind,time_s,index,tick,a_v,"));
}

/// The values of a dictionary-of-strings column.
fn arrow_cast_kinds(a: &dyn Array) -> Vec<String> {
    let d = a
        .as_any()
        .downcast_ref::<arrow_array::DictionaryArray<arrow_array::types::Int8Type>>()
        .unwrap();
    let values = d.values().as_any().downcast_ref::<StringArray>().unwrap();
    d.keys()
        .values()
        .iter()
        .map(|k| values.value(*k as usize).to_string())
        .collect()
}

#[test]
fn csv_has_a_header_of_the_column_names_and_every_row() {
    let dir = TempDir::new("export-csv");
    let rec = write_recording(&dir.join("run.arrow"));
    let out = dir.join("run.csv");
    let done = export_to(&rec, &out, &Options::new(Format::Csv));
    assert_eq!(done.rows as usize, total_rows(&rec));

    let text = std::fs::read_to_string(&out).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let names: Vec<&str> = rec
        .schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(header, names);

    // Read back with the recording's types, `kind` as text.
    let fields: Vec<Field> = rec
        .schema
        .fields()
        .iter()
        .map(|f| match f.name().as_str() {
            "kind" => Field::new("kind", DataType::Utf8, false),
            _ => f.as_ref().clone(),
        })
        .collect();
    let batches: Vec<RecordBatch> = arrow_csv::ReaderBuilder::new(Arc::new(Schema::new(fields)))
        .with_header(true)
        .build(File::open(&out).unwrap())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let got: usize = batches.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(got, total_rows(&rec));
    let mut kinds = Vec::new();
    let (mut times, mut a_w, mut b_w, mut texts, mut rising, mut temps) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for b in &batches {
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let k = col("kind");
        let k = k.as_any().downcast_ref::<StringArray>().unwrap();
        kinds.extend(k.iter().map(|s| s.unwrap().to_string()));
        let c = col("time_s");
        times.extend(
            c.as_any()
                .downcast_ref::<arrow_array::Float64Array>()
                .unwrap()
                .iter(),
        );
        let c = col("a_w");
        a_w.extend(
            c.as_any()
                .downcast_ref::<arrow_array::Float32Array>()
                .unwrap()
                .iter(),
        );
        let c = col("b_w");
        b_w.extend(
            c.as_any()
                .downcast_ref::<arrow_array::Float32Array>()
                .unwrap()
                .iter(),
        );
        let c = col("text");
        texts.extend(
            c.as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .iter()
                .map(|s| s.map(str::to_string)),
        );
        let c = col("rising");
        rising.extend(c.as_any().downcast_ref::<BooleanArray>().unwrap().iter());
        let c = col("logger_temp_c");
        temps.extend(
            c.as_any()
                .downcast_ref::<arrow_array::Float64Array>()
                .unwrap()
                .iter()
                .flatten(),
        );
    }
    let (mut want_k, mut want_t, mut want_a, mut want_b, mut want_text, mut want_rising) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for r in rec.rows() {
        for i in 0..r.len() {
            want_k.push(r.kind(i).name().to_string());
            want_t.push(Rows::get(r.f64("time_s"), i));
            want_a.push(Rows::get(r.f32("a_w"), i));
            want_b.push(Rows::get(r.f32("b_w"), i));
            let text = r.text();
            want_text.push(text.is_valid(i).then(|| text.value(i).to_string()));
            let up = r.column::<BooleanArray>("rising");
            want_rising.push(up.is_valid(i).then(|| up.value(i)));
        }
    }
    assert_eq!(kinds, want_k);
    assert_eq!(times, want_t); // exact: the shortest round-trip form
    assert_eq!(a_w, want_a);
    assert_eq!(b_w, want_b);
    assert_eq!(rising, want_rising);
    // An empty text reads back as null; the rest as written (commas, quotes, newlines).
    let want_text: Vec<Option<String>> = want_text
        .into_iter()
        .map(|t| t.filter(|t| !t.is_empty()))
        .collect();
    assert_eq!(texts, want_text);
    assert!(texts.contains(&Some("hello, \"world\"\nsecond line".to_string())));
    // A value: sample 0's rail a is 12 V × 1 A.
    let first = kinds.iter().position(|k| k == "sample").unwrap();
    assert_eq!(a_w[first], Some(12.0));
    // The logger's temperature, its one value.
    assert_eq!(temps, [63.5]);
}

/// One bin of the reference: first sample's time and the mean per series.
#[derive(Debug)]
struct RefBin {
    t0: f64,
    means: Vec<Option<f64>>,
}

/// The obvious way: list the samples with the number of gaps before them, group by
/// (gaps before, ns / bin), average.
fn reference_bins(rec: &Recording, bin_us: u64, columns: &[&str]) -> Vec<RefBin> {
    let mut samples: Vec<(usize, f64, Vec<Option<f32>>)> = Vec::new();
    let mut gaps = 0;
    for r in rec.rows() {
        for i in 0..r.len() {
            match r.kind(i) {
                Kind::Gap => gaps += 1,
                Kind::Sample => {
                    let t = r.f64("time_s").value(i);
                    let v = columns.iter().map(|c| Rows::get(r.f32(c), i)).collect();
                    samples.push((gaps, t, v));
                }
                _ => {}
            }
        }
    }
    let key = |(g, t, _): &(usize, f64, Vec<Option<f32>>)| {
        let ns = (t * 1e9).round() as i64;
        (
            *g,
            if bin_us == 0 {
                ns
            } else {
                ns.div_euclid(bin_us as i64 * 1000)
            },
        )
    };
    let mut bins: Vec<RefBin> = Vec::new();
    let mut i = 0;
    while i < samples.len() {
        let group: Vec<_> = samples[i..]
            .iter()
            .take_while(|s| key(s) == key(&samples[i]))
            .collect();
        let means = (0..columns.len())
            .map(|c| {
                let vals: Vec<f64> = group
                    .iter()
                    .filter_map(|s| s.2[c])
                    .filter(|v| v.is_finite())
                    .map(f64::from)
                    .collect();
                (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
            })
            .collect();
        bins.push(RefBin {
            t0: samples[i].1,
            means,
        });
        i += group.len();
    }
    bins
}

fn read_trace(path: &Path) -> (String, Value) {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    (text, v)
}

fn events<'a>(trace: &'a Value, ph: &str) -> Vec<&'a Value> {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == ph)
        .collect()
}

/// Counter events per track name: (ts, W).
fn counters(trace: &Value) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for e in events(trace, "C") {
        out.entry(e["name"].as_str().unwrap().to_string())
            .or_default()
            .push((e["ts"].as_f64().unwrap(), counter_value(e)));
    }
    out
}

/// The one value of a counter event (its series: `W`, or `degC` for a temperature).
fn counter_value(e: &Value) -> f64 {
    let args = e["args"].as_object().unwrap();
    assert_eq!(args.len(), 1, "{e}");
    let key = if e["name"] == "GPU logger temperature" {
        "degC"
    } else {
        "W"
    };
    args[key].as_f64().unwrap()
}

fn check_counters(rec: &Recording, trace: &Value, bin_us: u64) {
    let columns = ["a_w", "b_w", "total_w"];
    let bins = reference_bins(rec, bin_us, &columns);
    let got = counters(trace);
    for (c, name) in ["a", "b", "total"].iter().enumerate() {
        let want: Vec<(f64, f64)> = bins
            .iter()
            .filter_map(|b| b.means[c].map(|m| (b.t0 * 1e6, m)))
            .collect();
        let got = &got[*name];
        assert_eq!(got.len(), want.len(), "{name}: counter events");
        for (g, w) in got.iter().zip(&want) {
            assert!((g.0 - w.0).abs() < 1e-3, "{name}: ts {} vs {}", g.0, w.0);
            assert!(
                (g.1 - w.1).abs() <= 1e-6 * w.1.abs(),
                "{name} at {}: {} vs {}",
                w.0,
                g.1,
                w.1
            );
        }
    }
}

#[test]
fn perfetto_counters_are_the_bin_means_and_bins_end_at_gaps() {
    let dir = TempDir::new("export-perfetto");
    let rec = write_recording(&dir.join("run.arrow"));
    let out = dir.join("run.json");
    let done = export_to(&rec, &out, &Options::new(Format::Perfetto));
    assert_eq!(done.rows as usize, total_rows(&rec));
    let (text, trace) = read_trace(&out);
    assert_eq!(
        done.trace_events as usize,
        trace["traceEvents"].as_array().unwrap().len()
    );
    // Perfetto reads displayTimeUnit only near the start, and no keys but its own.
    assert!(text.starts_with(r#"{"displayTimeUnit":"ns","otherData":{"#));
    let keys: Vec<&String> = trace.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert_eq!(trace["otherData"]["epoch_utc_ns"], EPOCH_NS.to_string());
    assert_eq!(
        trace["otherData"]["epoch_utc"],
        "2025-11-29T09:44:13.535000000Z"
    );
    check_counters(&rec, &trace, 100);

    // Bin 2 (200..300 µs) is cut by the gap at 253 µs: one value for samples 20..24 at
    // 203 µs, another for 27..29 at 273 µs.
    let a = &counters(&trace)["a"];
    let mean = |ks: std::ops::Range<u32>| {
        let n = ks.len() as f64;
        ks.map(|k| f64::from(12.0 * (1.0 + 0.1 * k as f32)))
            .sum::<f64>()
            / n
    };
    let at = |ts: f64| a.iter().find(|(t, _)| (t - ts).abs() < 1e-3).map(|x| x.1);
    assert!((at(203.0).unwrap() - mean(20..25)).abs() < 1e-4);
    assert!((at(273.0).unwrap() - mean(27..30)).abs() < 1e-4);
    // The gap: a slice of its own.
    let slices = events(&trace, "X");
    let gap = slices.iter().find(|e| e["name"] == "gap").unwrap();
    assert_eq!(gap["args"]["cause"], "test: host too slow");
    assert_eq!(gap["args"]["samples"], 2);
    assert!((gap["ts"].as_f64().unwrap() - 253.0).abs() < 1e-3);
    assert!((gap["dur"].as_f64().unwrap() - 20.0).abs() < 1e-3);
    // No counter value between the gap's start and its end.
    for (t, _) in a {
        assert!(
            *t < 253.0 || *t >= 273.0,
            "a counter at {t} µs, inside the gap"
        );
    }

    // Rising to falling edge: slices named after the line's label, or the line.
    let slice = |name: &str| *slices.iter().find(|e| e["name"] == name).unwrap();
    let kernel = slice("kernel A");
    assert!((kernel["ts"].as_f64().unwrap() - 123.4).abs() < 1e-3);
    assert!((kernel["dur"].as_f64().unwrap() - 276.6).abs() < 1e-3);
    assert_eq!(kernel["tid"], 100);
    let line1 = slice("line 1");
    assert!((line1["ts"].as_f64().unwrap() - 200.0).abs() < 1e-3);
    assert!((line1["dur"].as_f64().unwrap() - 100.0).abs() < 1e-3);
    assert_eq!(line1["tid"], 101);
    // A rising edge never followed by its falling edge lasts to the recording's end.
    let out1 = slice("line 1 (output)");
    assert_eq!(out1["args"]["unfinished"], true);
    assert!((out1["ts"].as_f64().unwrap() - 500.0).abs() < 1e-3);
    assert!((out1["dur"].as_f64().unwrap() - (t(59) * 1e6 - 500.0)).abs() < 1e-3);
    // Each edge an instant event on the edges track.
    let instants = events(&trace, "i");
    assert_eq!(instants.len(), 5);
    assert!(instants.iter().all(|e| e["tid"] == 3 && e["s"] == "t"));
    assert!(instants.iter().any(|e| e["name"] == "kernel A rising"));
    // The GPU logger's own tracks.
    let c = counters(&trace);
    assert_eq!(c["GPU logger"], vec![(300.0, 42.5)]);
    assert_eq!(c["GPU logger instant"], vec![(300.0, 40.25)]);
    assert_eq!(c["GPU logger temperature"], vec![(300.0, 63.5)]);
    // The process and the tracks named.
    let meta = events(&trace, "M");
    let named = |what: &str, name: &str| {
        meta.iter()
            .any(|e| e["name"] == what && e["args"]["name"] == name)
    };
    assert!(named("process_name", "railtrace rig"));
    for name in [
        "gaps",
        "trigger edges",
        "line 0",
        "line 1",
        "line 1 (output)",
    ] {
        assert!(named("thread_name", name), "{name}");
    }
}

#[test]
fn perfetto_without_bins_writes_every_sample_and_absolute_time_adds_the_epoch() {
    let dir = TempDir::new("export-perfetto0");
    let rec = write_recording(&dir.join("run.arrow"));
    let mut opts = Options::new(Format::Perfetto);
    opts.bin_us = 0;
    let out = dir.join("all.json");
    export_to(&rec, &out, &opts);
    let (_, trace) = read_trace(&out);
    check_counters(&rec, &trace, 0);
    assert_eq!(counters(&trace)["total"].len(), 58);

    opts.bin_us = 100;
    opts.absolute_time = true;
    let out = dir.join("abs.json");
    export_to(&rec, &out, &opts);
    let (text, trace) = read_trace(&out);
    // Sample 0 at 3 µs after the epoch, exactly.
    assert!(text.contains(r#""name":"a","ts":1764409453535003.000,"#));
    let first = counters(&trace)["a"][0].0;
    assert!((first - (EPOCH_NS as f64 / 1e3 + 3.0)).abs() < 1.0);
}

#[test]
fn export_refuses_the_input_and_names_an_unwritable_output() {
    let dir = TempDir::new("export-errors");
    let input = dir.join("run.arrow");
    let rec = write_recording(&input);
    let before = std::fs::read(&input).unwrap();
    for format in [Format::Parquet, Format::Csv, Format::Perfetto] {
        let e = export::export(&rec, &input, &Options::new(format)).unwrap_err();
        assert!(matches!(e, ExportError::SameAsInput { .. }), "{e}");
    }
    assert_eq!(std::fs::read(&input).unwrap(), before);

    let out = dir.join("no such dir").join("run.parquet");
    let e = export::export(&rec, &out, &Options::new(Format::Parquet)).unwrap_err();
    assert!(e.to_string().contains(&out.display().to_string()), "{e}");
    assert!(!out.exists());

    // An existing output is replaced; nothing is left under the partial name.
    let out = dir.join("run.csv");
    std::fs::write(&out, "old").unwrap();
    export_to(&rec, &out, &Options::new(Format::Csv));
    assert!(std::fs::read_to_string(&out).unwrap().starts_with("kind,"));
    assert_eq!(
        export::default_output(&input, Format::Perfetto),
        dir.join("run.json")
    );
}

fn railtrace(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_command_writes_next_to_the_recording_and_says_why_it_cannot() {
    let dir = TempDir::new("export-cli");
    let input = dir.join("run.arrow");
    let rec = write_recording(&input);
    let path = input.to_str().unwrap();

    let (ok, err) = railtrace(&["export", path, "--format", "csv"]);
    assert!(ok, "{err}");
    assert!(err.starts_with("railtrace: exported "), "{err}");
    assert!(err.contains(&format!("{} rows", total_rows(&rec))), "{err}");
    assert!(err.contains(dir.join("run.csv").to_str().unwrap()), "{err}");
    assert!(dir.join("run.csv").exists());

    let (ok, err) = railtrace(&["export", path, "--format", "parquet", "--samples-only"]);
    assert!(ok, "{err}");
    assert!(err.contains("exported 58 rows"), "{err}");
    let (ok, err) = railtrace(&["export", path, "--format", "perfetto", "--bin-us", "0"]);
    assert!(ok, "{err}");
    assert!(err.contains("trace events"), "{err}");
    assert!(dir.join("run.json").exists());

    // Refusals.
    let (ok, err) = railtrace(&["export", path, "--format", "csv", "-o", path]);
    assert!(!ok);
    assert!(err.contains("is the recording being exported"), "{err}");
    let (ok, err) = railtrace(&["export", path, "--format", "perfetto", "--kind", "sample"]);
    assert!(!ok);
    assert!(err.contains("--kind"), "{err}");
    let (ok, err) = railtrace(&["export", path, "--format", "csv", "--bin-us", "10"]);
    assert!(!ok);
    assert!(err.contains("--bin-us"), "{err}");
    let (ok, err) = railtrace(&["export", path, "--format", "csv", "--kind", "samples"]);
    assert!(!ok);
    assert!(err.contains("time_sync"), "{err}");

    // The recording module's one-line errors.
    let missing = dir.join("missing.arrow");
    let (ok, err) = railtrace(&["export", missing.to_str().unwrap(), "--format", "csv"]);
    assert!(!ok);
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
    let foreign = dir.join("foreign.arrow");
    std::fs::write(&foreign, "hello").unwrap();
    let (ok, err) = railtrace(&["export", foreign.to_str().unwrap(), "--format", "csv"]);
    assert!(!ok);
    assert!(err.contains("not a railtrace recording"), "{err}");
    assert!(!dir.join("foreign.csv").exists());
    let bytes = std::fs::read(&input).unwrap();
    let cut = dir.join("cut.arrow");
    std::fs::write(&cut, &bytes[..bytes.len() - 300]).unwrap();
    // A cut file exports what it holds up to the cut, saying where it ends in one line.
    let (ok, err) = railtrace(&["export", cut.to_str().unwrap(), "--format", "parquet"]);
    assert!(ok, "{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("the file ends inside record batch"),
        "{err}"
    );
    let out = dir.join("nowhere").join("x.json");
    let (ok, err) = railtrace(&[
        "export",
        path,
        "--format",
        "perfetto",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains(out.to_str().unwrap()), "{err}");
}

/// Rewrites the recording at `from` into `to` as format 3 wrote it: without
/// `logger_temp_c` (nor `logger_average_w` or `logger_energy_j`), its metadata saying
/// version 3.
fn rewrite_as_version_3(from: &Path, to: &Path) {
    use arrow_ipc::reader::StreamReader;
    use arrow_ipc::writer::StreamWriter;
    let r =
        StreamReader::try_new(std::io::BufReader::new(File::open(from).unwrap()), None).unwrap();
    let schema = r.schema();
    // Version 3 had neither the temperature, the block columns of version 5, the
    // average of version 6 nor the energy of version 7.
    let keep: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| {
            let name = schema.field(i).name().as_str();
            ![
                "logger_temp_c",
                "period_ticks",
                "codes",
                "logger_average_w",
                "logger_energy_j",
            ]
            .contains(&name)
                && !name.ends_with("_w_min")
                && !name.ends_with("_w_max")
        })
        .collect();
    let mut md = schema.metadata().clone();
    let mut meta: Meta = serde_json::from_str(md.get("railtrace").unwrap()).unwrap();
    meta.version = 3;
    md.insert("railtrace", serde_json::to_string(&meta).unwrap());
    let old = Arc::new(schema.project(&keep).unwrap().with_metadata(md));
    let mut w = StreamWriter::try_new(File::create(to).unwrap(), &old).unwrap();
    for b in r {
        // Version 3 had no summary rows (nor an overview: its last batch is left out).
        let b = b.unwrap();
        let rows = Rows::new(&b);
        let keep_row: BooleanArray = (0..rows.len())
            .map(|i| Some(rows.kind(i) != Kind::Summary))
            .collect();
        let b = arrow_select::filter::filter_record_batch(&b, &keep_row).unwrap();
        let b = b.project(&keep).unwrap();
        if b.num_rows() > 0 {
            w.write(&RecordBatch::try_new(old.clone(), b.columns().to_vec()).unwrap())
                .unwrap();
        }
    }
    w.finish().unwrap();
}

#[test]
fn a_version_3_recording_exports_with_the_temperature_null() {
    let dir = TempDir::new("export-v3");
    let v4 = write_recording(&dir.join("v4.arrow"));
    let v3 = dir.join("v3.arrow");
    rewrite_as_version_3(&dir.join("v4.arrow"), &v3);
    let rec = recording::read(&v3).unwrap();
    assert_eq!(rec.meta.version, 3);
    assert_eq!(total_rows(&rec), total_rows(&v4));

    // Parquet and CSV: this version's columns, the temperature all null.
    let out = dir.join("v3.parquet");
    export_to(&rec, &out, &Options::new(Format::Parquet));
    let (schema, batch) = read_parquet(&out);
    let names =
        |s: &Schema| -> Vec<String> { s.fields().iter().map(|f| f.name().clone()).collect() };
    assert_eq!(names(&schema), names(&v4.schema));
    let temp = batch.column_by_name("logger_temp_c").unwrap();
    assert_eq!(temp.null_count(), batch.num_rows());
    let out = dir.join("v3.csv");
    export_to(&rec, &out, &Options::new(Format::Csv));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text
        .lines()
        .next()
        .unwrap()
        .contains(",logger_instant_w,logger_temp_c,"));

    // Perfetto, read a batch at a time from the file: the logger's power, no temperature.
    let file = recording::open(&v3).unwrap();
    let out = dir.join("v3.json");
    export::export(&file, &out, &Options::new(Format::Perfetto)).unwrap();
    let (_, trace) = read_trace(&out);
    let c = counters(&trace);
    assert_eq!(c["GPU logger"], vec![(300.0, 42.5)]);
    assert!(!c.contains_key("GPU logger temperature"));
}
