//! Decoding a long stream of 8-channel sample blocks, beside a plain memcpy of the same
//! bytes. Run: `cargo bench -p railtrace-protocol --bench decode`.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use railtrace_protocol::{
    encode_frame_vec, max_block_samples, Codes, Decoder, Message, SampleBlock,
};
use std::hint::black_box;

const CHANNELS: usize = 8;
const BLOCKS: usize = 2000;

fn stream() -> (Vec<u8>, u64) {
    let n = max_block_samples(CHANNELS);
    let mut x: u32 = 12345;
    let mut wire = Vec::new();
    let mut samples = 0u64;
    for b in 0..BLOCKS {
        let codes: Vec<u8> = (0..n * CHANNELS)
            .flat_map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((x >> 16) as i16).to_le_bytes()
            })
            .collect();
        let block = SampleBlock {
            first_index: samples,
            first_tick: samples * 840,
            period_ticks: 840,
            channel_mask: 0xFF,
            averaging: 1,
            sample_count: n as u16,
            codes: Codes::from_le_bytes(&codes).unwrap(),
        };
        wire.extend(encode_frame_vec(b as u32, &Message::SampleBlock(block)).unwrap());
        samples += n as u64;
    }
    (wire, samples)
}

fn bench(c: &mut Criterion) {
    let (wire, samples) = stream();
    let mut g = c.benchmark_group("decode_sample_blocks");
    g.throughput(Throughput::Bytes(wire.len() as u64));
    g.bench_function("decoder_4k_reads", |b| {
        b.iter(|| {
            let mut dec = Decoder::<{ railtrace_protocol::MAX_ENCODED_FRAME }>::new();
            let mut got = 0u64;
            for piece in wire.chunks(4096) {
                let mut input = piece;
                while let Some(r) = dec.next(&mut input) {
                    if let Ok(f) = r {
                        if let Message::SampleBlock(b) = f.message {
                            got += u64::from(b.sample_count);
                        }
                    }
                }
            }
            assert_eq!(got, samples);
            black_box(got)
        })
    });
    let mut dst = vec![0u8; wire.len()];
    g.bench_function("memcpy_baseline", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&wire));
            black_box(dst[dst.len() / 2])
        })
    });
    g.finish();
    eprintln!(
        "stream: {} bytes, {} blocks, {} samples of {} channels",
        wire.len(),
        BLOCKS,
        samples,
        CHANNELS
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
