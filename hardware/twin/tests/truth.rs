//! The truth files of a running twin, read back with arrow-rs: what they hold agrees with
//! itself and with the models (the logger's reports are exactly the window means of the
//! recorded GPU power; the rails carry that power).

use std::fs::File;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use arrow_ipc::reader::StreamReader;
use railtrace_protocol::{encode_frame_vec, Configure, Message};
use railtrace_twin::trace::{PowerTrace, Segment, Util};

fn read(path: &std::path::Path) -> Vec<RecordBatch> {
    let reader = StreamReader::try_new(File::open(path).unwrap(), None).unwrap();
    reader.map(|b| b.unwrap()).collect()
}

fn column(batches: &[RecordBatch], name: &str) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(name)
                .unwrap()
                .as_primitive::<Float64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

#[test]
fn the_twin_writes_a_consistent_truth() {
    let dir = std::env::temp_dir().join(format!("railtrace-truth-{}", std::process::id()));
    let loaded = railtrace_twin::default_scenario();
    let twin = railtrace_twin::Twin::start_with(&loaded, Some(&dir)).unwrap();
    // Drive the rig as a host would: configure 10 kS/s, start, read, stop.
    let mut port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(twin.path())
        .unwrap();
    let cfg = Configure {
        request_id: 1,
        sample_rate_hz: 10_000,
        channel_mask: 0xFF,
        averaging: 1,
    };
    port.write_all(&encode_frame_vec(0, &Message::Configure(cfg)).unwrap())
        .unwrap();
    port.write_all(&encode_frame_vec(1, &Message::Start { request_id: 2 }).unwrap())
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        let end = Instant::now() + Duration::from_millis(800);
        while Instant::now() < end {
            if port.read(&mut buf).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(700));
    twin.stop().unwrap();
    reader.join().unwrap();

    // The GPU's power: contiguous from 0.
    let g = read(&dir.join("gpu_power.arrow"));
    let (starts, ends, powers) = (
        column(&g, "start_s"),
        column(&g, "end_s"),
        column(&g, "power_w"),
    );
    assert!(starts.len() > 100);
    assert_eq!(starts[0], 0.0);
    for i in 1..starts.len() {
        assert_eq!(starts[i], ends[i - 1], "contiguous at {i}");
    }
    // The GPU's state over each segment: the default scenario stays at its first DVFS
    // level and models no temperature; it switches no level.
    for b in &g {
        let level = b
            .column_by_name("dvfs_level")
            .unwrap()
            .as_primitive::<arrow_array::types::UInt32Type>();
        assert!(level.values().iter().all(|&l| l == 0));
        let t = b.column_by_name("temperature_c").unwrap();
        assert_eq!(t.null_count(), t.len());
    }
    assert!(column(&g, "frequency_hz").iter().all(|&f| f == 2.1e9));
    assert!(column(&g, "voltage_v").iter().all(|&v| v == 0.95));
    let d = read(&dir.join("dvfs.arrow"));
    assert_eq!(d.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);

    let trace = PowerTrace::from_segments((0..starts.len()).map(|i| Segment {
        start_s: starts[i],
        end_s: ends[i],
        power_w: powers[i],
        util: Util::IDLE,
    }))
    .unwrap();

    // The logger: a report every 1 ms, each exactly the 1 ms mean of that power, rounded
    // to 1 W (the default logger: box, no delay, gain 1, offset 0).
    let l = read(&dir.join("logger.arrow"));
    let (times, reported, response) = (
        column(&l, "true_time_s"),
        column(&l, "power_w"),
        column(&l, "response_w"),
    );
    assert!(times.len() > 300, "{} reports", times.len());
    let mut checked = 0;
    for k in 0..times.len() {
        let t = times[k];
        if k > 0 {
            assert!((t - times[k - 1] - 1e-3).abs() < 1e-12);
        }
        if t <= trace.end_s().unwrap() {
            let mean = trace.energy_between(t - 1e-3, t) / 1e-3;
            assert!(
                (response[k] - mean).abs() < 1e-9 * mean,
                "report {k}: {} vs {mean}",
                response[k]
            );
            assert_eq!(reported[k], response[k].round());
            checked += 1;
        }
    }
    assert!(checked > 300);
    let stamped: usize = l
        .iter()
        .map(|b| {
            b.column_by_name("stamp_gpu_ticks")
                .unwrap()
                .as_primitive::<UInt64Type>()
                .len()
        })
        .sum();
    assert_eq!(stamped, times.len());

    // The rails at every conversion: 10 kS/s, one period (2 400 ticks of the fast rig's
    // 24 MHz clock) apart; together
    // they carry the GPU's power (the board's 5 µs input filter aside).
    let r = read(&dir.join("rails.arrow"));
    let ts = column(&r, "t_s");
    let ticks: Vec<u64> = r
        .iter()
        .flat_map(|b| {
            b.column_by_name("device_tick")
                .unwrap()
                .as_primitive::<UInt64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert!(ts.len() > 5000, "{} conversions", ts.len());
    let period = u64::from(loaded.rig.board.tick_hz / 10_000);
    assert_eq!(period, 2_400);
    assert!(ticks.windows(2).all(|w| w[1] - w[0] == period));
    let rails: Vec<Vec<f64>> = loaded
        .rig
        .rails
        .iter()
        .map(|rail| column(&r, &format!("{}_power_w", rail.name)))
        .collect();
    let total: f64 = (0..ts.len())
        .map(|i| rails.iter().map(|p| p[i]).sum::<f64>())
        .sum::<f64>()
        / ts.len() as f64;
    let truth: f64 = ts
        .iter()
        .map(|&t| trace.power_at(t).unwrap_or(0.0))
        .sum::<f64>()
        / ts.len() as f64;
    assert!(
        (total / truth - 1.0).abs() < 0.01,
        "rails {total} W, GPU {truth} W"
    );

    // Executions of the scenario's kernel, within the recorded time.
    let e = read(&dir.join("executions.arrow"));
    let (es, ee) = (column(&e, "start_s"), column(&e, "end_s"));
    assert!(es.len() > 100);
    assert!(es
        .iter()
        .zip(&ee)
        .all(|(s, e)| s < e && *e <= trace.end_s().unwrap()));
    assert_eq!(
        e[0].column_by_name("kernel")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "gemm"
    );

    let clocks: toml::Table = std::fs::read_to_string(dir.join("clocks.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(clocks["mcu"]["tick_hz"].as_integer(), Some(24_000_000));
    assert_eq!(clocks["mcu"]["error_ppm"].as_float(), Some(30.0));
    let _ = std::fs::remove_dir_all(&dir);
}
