//! The core's per-sample work on the host, for counting instructions:
//!
//! ```text
//! cargo build --release -p railtrace-firmware --example hotpath
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
//!     target/release/examples/hotpath 100000
//! callgrind_annotate --inclusive=yes /tmp/cg.out | grep -E 'on_tick|poll|TOTALS'
//! ```
//!
//! Runs `N` samples (default 100 000) of 8 channels at 100 kS/s through the real sampler
//! (interrupt side) and device (main loop, polled every 8 samples) into a link that takes
//! every byte, and prints what arrived. Run it with two values of `N` and divide the
//! difference in instructions by the difference in samples (`firmware/hotpath-callgrind.sh`
//! does it all and splits the figure by function).
//!
//! A second argument `noise` samples uniformly random codes instead of the test signal:
//! the test signal's low bytes are mostly multiples of 64, so a quarter of its code bytes
//! are zero and COBS blocks are short; random codes have a zero byte in 256, as a busy
//! ADC channel does.
use std::convert::Infallible;

use heapless::spsc::Queue;
use railtrace_firmware::hw::ErrorKind;
use railtrace_firmware::test_signal::TestSignal;
use railtrace_firmware::*;
use railtrace_protocol::{Configure, Decoder, FrameEncoder, Message, Quantity, MAX_WIRE_FRAME};

const TICK_HZ: u32 = 84_000_000;

/// Uniformly random codes (a fixed-seed xorshift), for `noise`.
struct Noise(u32);
impl SampleSource for Noise {
    type Error = ErrorKind;
    fn convert(&mut self) -> Result<[i16; CHANNELS], ErrorKind> {
        Ok(core::array::from_fn(|_| {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 17;
            self.0 ^= self.0 << 5;
            self.0 as i16
        }))
    }
}

struct Clock(u64);
impl Board for Clock {
    fn now(&mut self) -> u64 {
        self.0
    }
    fn start_sampling(&mut self, rate_hz: u32) -> Result<u32, ErrorKind> {
        Ok(TICK_HZ / rate_hz)
    }
    fn stop_sampling(&mut self) {}
    fn set_trigger_output(&mut self, _: u8, _: bool) -> Result<(), ErrorKind> {
        Ok(())
    }
    fn store_calibration(&mut self, _: &[Calibration; CHANNELS]) -> Result<(), ErrorKind> {
        Ok(())
    }
}

/// Commands in, bytes out (decoded after the run, so the count covers the core alone).
struct Link {
    input: Vec<u8>,
    output: Vec<u8>,
}
impl embedded_io::ErrorType for Link {
    type Error = Infallible;
}
impl embedded_io::Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input.drain(..n);
        Ok(n)
    }
}
impl embedded_io::ReadReady for Link {
    fn read_ready(&mut self) -> Result<bool, Infallible> {
        Ok(!self.input.is_empty())
    }
}
impl embedded_io::Write for Link {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}
impl embedded_io::WriteReady for Link {
    fn write_ready(&mut self) -> Result<bool, Infallible> {
        Ok(true)
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    if std::env::args().nth(2).is_some_and(|a| a == "noise") {
        run(Noise(0x9E37_79B9), n);
    } else {
        run(TestSignal::new(), n);
    }
}

fn run<S: SampleSource>(source: S, n: u64) {
    static CHANNEL_SPECS: [ChannelSpec; 8] = {
        let spec = ChannelSpec {
            index: 0,
            quantity: Quantity::Current,
            name: "ch",
            default_calibration: Calibration {
                scale: 1.0,
                offset: 0.0,
            },
        };
        let mut a = [spec; 8];
        let mut i = 0;
        while i < 8 {
            a[i].index = i as u8;
            i += 1;
        }
        a
    };
    let desc = Description {
        board: "host",
        serial: "0",
        firmware_version: (0, 1, 0),
        tick_hz: TICK_HZ,
        adc_bits: 16,
        test_signal: true,
        sample_rates_hz: &[100_000],
        trigger_inputs: 0,
        trigger_outputs: 0,
        channels: &CHANNEL_SPECS,
    };
    let shared = Shared::new();
    let mut sq: Queue<Sample, 256> = Queue::new();
    let mut eq: Queue<Edge, 32> = Queue::new();
    let (sp, sc) = sq.split();
    let (_ep, ec) = eq.split();
    let mut sampler = Sampler::new(source, sp, &shared);
    let mut device = Device::new(
        desc,
        None,
        &shared,
        Queues {
            samples: sc,
            edges: ec,
        },
    );
    let mut board = Clock(0);
    let mut link = Link {
        input: Vec::new(),
        output: Vec::with_capacity(20 * n as usize + 4096),
    };
    let mut host = FrameEncoder::new();
    let mut frame = [0u8; MAX_WIRE_FRAME];
    for m in [
        Message::Configure(Configure {
            request_id: 1,
            sample_rate_hz: 100_000,
            channel_mask: 0xFF,
            averaging: 1,
        }),
        Message::Start { request_id: 2 },
    ] {
        let len = host.encode(&m, &mut frame).expect("command encodes");
        link.input.extend_from_slice(&frame[..len]);
    }
    device.poll(&mut board, &mut link).expect("infallible");
    let period = u64::from(TICK_HZ / 100_000);
    for i in 0..n {
        board.0 += period;
        sampler.on_tick(board.0);
        if i % 8 == 7 {
            device.poll(&mut board, &mut link).expect("infallible");
        }
    }
    let len = host
        .encode(&Message::Stop { request_id: 3 }, &mut frame)
        .expect("encodes");
    link.input.extend_from_slice(&frame[..len]);
    device.poll(&mut board, &mut link).expect("infallible");
    let mut decoder: Decoder = Decoder::new();
    let mut input = &link.output[..];
    let mut arrived = 0u64;
    while let Some(Ok(f)) = decoder.next(&mut input) {
        if let Message::SampleBlock(b) = f.message {
            arrived += u64::from(b.sample_count);
        }
    }
    println!(
        "{n} samples of 8 channels: {arrived} arrived, {} bytes on the link",
        link.output.len()
    );
    println!(
        "state: Device {} bytes, Sampler {} bytes, sample queue {} bytes (host sizes)",
        size_of::<Device<'_, 256, 32>>(),
        size_of::<Sampler<'_, S, 256>>(),
        size_of::<Queue<Sample, 256>>()
    );
}
