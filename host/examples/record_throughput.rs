//! Decode + record throughput on a stored stream: a minute of 8 channels at 100 kS/s, as
//! the twin's firmware sends it (a DeviceInfo, then full sample blocks and a status every
//! second), replayed through the capture's decoder, conversion and writer into a
//! recording, beside decoding alone.
//!
//! Run: `cargo run --release -p railtrace --example record_throughput [SECONDS]`.

use std::time::Instant;

use railtrace::link::capture::{replay, Config};
use railtrace_protocol::{
    encode_frame_vec, max_block_samples, ChannelInfo, Codes, Decoder, DeviceInfo, Message,
    Quantity, SampleBlock, PROTOCOL_VERSION,
};

const RATE: u64 = 100_000;
const TICKS_PER_SAMPLE: u64 = 840; // 84 MHz

fn stream(seconds: u64) -> (Vec<u8>, u64) {
    let names = [
        "slot_12v_I",
        "slot_12v_V",
        "slot_3v3_I",
        "slot_3v3_V",
        "cable1_12v_I",
        "cable1_12v_V",
        "cable2_12v_I",
        "cable2_12v_V",
    ];
    let mut channels = heapless::Vec::new();
    for (i, name) in names.iter().enumerate() {
        let current = i % 2 == 0;
        let _ = channels.push(ChannelInfo {
            index: i as u8,
            quantity: if current {
                Quantity::Current
            } else {
                Quantity::Voltage
            },
            name,
            scale: if current { 0.0061 } else { 0.00061 },
            offset: 0.0,
        });
    }
    let info = DeviceInfo {
        firmware_version: (0, 1, 0),
        protocol_version: PROTOCOL_VERSION,
        tick_hz: (RATE * TICKS_PER_SAMPLE) as u32,
        adc_bits: 16,
        flags: 0,
        trigger_inputs: 4,
        trigger_outputs: 4,
        board: "bench",
        serial: "BENCH",
        sample_rates_hz: heapless::Vec::from_slice(&[RATE as u32]).unwrap(),
        channels,
    };
    let mut seq = 0u32;
    let mut wire = encode_frame_vec(seq, &Message::DeviceInfo(info)).unwrap();
    let n = max_block_samples(8);
    let mut x: u32 = 12345;
    let mut samples = 0u64;
    while samples < seconds * RATE {
        let codes: Vec<u8> = (0..n * 8)
            .flat_map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((x >> 20) as i16 + 1000).to_le_bytes()
            })
            .collect();
        let block = SampleBlock {
            first_index: samples,
            first_tick: samples * TICKS_PER_SAMPLE,
            period_ticks: TICKS_PER_SAMPLE as u32,
            channel_mask: 0xFF,
            averaging: 1,
            sample_count: n as u16,
            codes: Codes::from_le_bytes(&codes).unwrap(),
        };
        seq += 1;
        wire.extend(encode_frame_vec(seq, &Message::SampleBlock(block)).unwrap());
        samples += n as u64;
    }
    (wire, samples)
}

fn main() {
    let seconds: u64 = std::env::args().nth(1).map_or(60, |s| s.parse().unwrap());
    let (wire, samples) = stream(seconds);
    println!(
        "stream: {seconds} s of 8 channels at 100 kS/s: {samples} samples, {:.1} MB of frames",
        wire.len() as f64 / 1e6
    );
    let t = Instant::now();
    let mut decoder: Decoder = Decoder::new();
    let mut input = &wire[..];
    let mut frames = 0;
    while let Some(f) = decoder.next(&mut input) {
        frames += u64::from(f.is_ok());
    }
    let decode_s = t.elapsed().as_secs_f64();
    println!(
        "decode only:     {frames} frames in {decode_s:.3} s = {:.1} M samples/s",
        samples as f64 / decode_s / 1e6
    );
    let out =
        std::env::temp_dir().join(format!("railtrace-throughput-{}.arrow", std::process::id()));
    let config = Config {
        port: "stored stream".into(),
        output: out.clone(),
        rig: None,
        rate_hz: Some(RATE as u32),
        rate_at_least_hz: None,
        channels: None,
        averaging: 1,
        duration: None,
        reconnect_wait: std::time::Duration::ZERO,
        replace: true,
        allow_drops: false,
        tap: None,
    };
    let t = Instant::now();
    let (progress, rows) = replay(&wire, &config).unwrap();
    let record_s = t.elapsed().as_secs_f64();
    let size = std::fs::metadata(&out).unwrap().len();
    assert_eq!(progress.samples, samples);
    println!(
        "decode + record: {rows} rows in {record_s:.3} s = {:.2} M samples/s ({:.1}x real time at 100 kS/s), file {:.1} MB ({:.1} B/sample)",
        samples as f64 / record_s / 1e6,
        samples as f64 / record_s / RATE as f64,
        size as f64 / 1e6,
        size as f64 / samples as f64
    );
    std::fs::remove_file(&out).unwrap();
}
