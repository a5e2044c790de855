//! The core's per-sample work on the target (thumbv7em, this image's build settings),
//! counted in instructions under QEMU. The same loop as `firmware/examples/hotpath.rs`:
//! 8 channels of the test signal at 100 kS/s through the real sampler (called here from
//! the main loop, not from TIM2's interrupt) and device (polled every 8 samples) into an
//! in-memory link, whose frames are decoded and checked between polls.
//!
//! How it counts: under `qemu-system-arm -icount shift=0,sleep=off` every instruction
//! advances virtual time by exactly 1 ns, and QEMU's TIM5 counts virtual nanoseconds
//! (prescaler 0), so the difference of two reads of TIM5's CNT is the number of
//! instructions executed between them (the read itself included: QEMU ends a block at an
//! I/O access, so the count is exact there). The cost of a bare pair of reads is measured
//! and taken off every interval.
//!
//! Printed on USART1, for `firmware/boards/stm32f405/hotpath-qemu.sh`: the instructions per
//! sample between sample `N1` and `N2` (start-up and the first blocks drop out), split into
//! the sampler (`on_tick`), the main loop (`poll`) and, measured apart on the same
//! blocks, frame encoding (`encode_frame` of a full 62-sample block, per sample); then the
//! same encoding for uniformly random codes (a zero byte in 256, as a busy ADC channel).
//!
//! Not counted: the board's interrupt glue (exception entry and exit, the critical
//! section and 64-bit clock of `main.rs`) and the USART driver's byte loop.
//!
//! ```text
//! cargo build --release --features qemu --example hotpath
//! qemu-system-arm -M netduinoplus2 -display none -monitor none -serial stdio \
//!     -icount shift=0,sleep=off -kernel target/thumbv7em-none-eabihf/release/examples/hotpath
//! ```
#![no_std]
#![no_main]

use core::convert::Infallible;
use core::fmt::Write as _;

use cortex_m_rt::entry;
use heapless::spsc::Queue;
use panic_halt as _;
use railtrace_firmware::hw::ErrorKind;
use railtrace_firmware::test_signal::{test_code, TestSignal};
use railtrace_firmware::*;
use railtrace_protocol::{
    encode_frame, max_block_samples, Codes, Configure, Decoder, FrameEncoder, Message, Quantity,
    SampleBlock, MAX_WIRE_FRAME,
};
use stm32f4::stm32f405 as pac;

const TICK_HZ: u32 = 84_000_000;
const RATE: u32 = 100_000;
/// The interval counted: samples N1 to N2.
const N1: u64 = 2_000;
const N2: u64 = 12_000;

/// TIM5's counter: one count per instruction under `-icount shift=0`.
struct Counter(pac::TIM5);
impl Counter {
    fn read(&self) -> u32 {
        self.0.cnt().read().bits()
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

/// Commands in; frames out into a buffer that the loop decodes between polls.
struct Link {
    input: heapless::Vec<u8, 128>,
    output: heapless::Vec<u8, 4096>,
}
impl embedded_io::ErrorType for Link {
    type Error = Infallible;
}
impl embedded_io::Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        let n = buf.len().min(self.input.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), self.input.get(..n)) {
            dst.copy_from_slice(src);
        }
        let rest = heapless::Vec::from_slice(self.input.get(n..).unwrap_or(&[]));
        self.input = rest.unwrap_or_default();
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
        let n = buf.len().min(self.output.capacity() - self.output.len());
        let _ = self.output.extend_from_slice(buf.get(..n).unwrap_or(&[]));
        Ok(n)
    }
    fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}
impl embedded_io::WriteReady for Link {
    fn write_ready(&mut self) -> Result<bool, Infallible> {
        Ok(self.output.len() < self.output.capacity())
    }
}

/// USART1's data register: QEMU sends each byte written to it at once.
struct Uart(pac::USART1);
impl core::fmt::Write for Uart {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for b in s.bytes() {
            while self.0.sr().read().txe().bit_is_clear() {}
            self.0.dr().write(|w| w.dr().set(u16::from(b)));
        }
        Ok(())
    }
}

static CHANNEL_SPECS: [ChannelSpec; CHANNELS] = {
    let spec = ChannelSpec {
        index: 0,
        quantity: Quantity::Current,
        name: "ch",
        default_calibration: Calibration {
            scale: 1.0,
            offset: 0.0,
        },
    };
    let mut a = [spec; CHANNELS];
    let mut i = 0;
    while i < CHANNELS {
        a[i].index = i as u8;
        i += 1;
    }
    a
};

/// Instructions per sample over an interval, in tenths.
fn per_sample(instructions: u64, samples: u64) -> (u64, u64) {
    let tenths = (instructions * 10 + samples / 2) / samples.max(1);
    (tenths / 10, tenths % 10)
}

#[entry]
fn main() -> ! {
    #[allow(clippy::unwrap_used)] // first and only call: cannot fail
    let dp = pac::Peripherals::take().unwrap();
    dp.RCC.apb1enr().modify(|_, w| w.tim5en().set_bit());
    dp.RCC.apb2enr().modify(|_, w| w.usart1en().set_bit());
    dp.TIM5.psc().write(|w| w.psc().set(0));
    dp.TIM5.arr().write(|w| w.arr().set(u32::MAX));
    dp.TIM5.cr1().write(|w| w.cen().set_bit());
    let counter = Counter(dp.TIM5);
    let mut uart = Uart(dp.USART1);

    // A bare pair of reads: what every interval below carries besides its work.
    let overhead = {
        let a = counter.read();
        let b = counter.read();
        u64::from(b.wrapping_sub(a))
    };

    let desc = Description {
        board: "qemu bench",
        serial: "0",
        firmware_version: (0, 1, 0),
        tick_hz: TICK_HZ,
        adc_bits: 16,
        test_signal: true,
        sample_rates_hz: &[RATE],
        trigger_inputs: 0,
        trigger_outputs: 0,
        channels: &CHANNEL_SPECS,
    };
    #[allow(clippy::unwrap_used)] // first and only calls: cannot fail
    let (sq, eq, shared, decoder) = (
        cortex_m::singleton!(: Queue<Sample, 256> = Queue::new()).unwrap(),
        cortex_m::singleton!(: Queue<Edge, 32> = Queue::new()).unwrap(),
        cortex_m::singleton!(: Shared = Shared::new()).unwrap(),
        cortex_m::singleton!(: Decoder = Decoder::new()).unwrap(),
    );
    let shared: &'static Shared = shared;
    let (sp, sc) = sq.split();
    let (_ep, ec) = eq.split();
    let mut sampler = Sampler::new(TestSignal::new(), sp, shared);
    let mut device = Device::new(
        desc,
        None,
        shared,
        Queues {
            samples: sc,
            edges: ec,
        },
    );
    let mut board = Clock(0);
    let mut link = Link {
        input: heapless::Vec::new(),
        output: heapless::Vec::new(),
    };
    let mut host = FrameEncoder::new();
    let mut frame = [0u8; MAX_WIRE_FRAME];
    for m in [
        Message::Configure(Configure {
            request_id: 1,
            sample_rate_hz: RATE,
            channel_mask: 0xFF,
            averaging: 1,
        }),
        Message::Start { request_id: 2 },
    ] {
        if let Ok(len) = host.encode(&m, &mut frame) {
            let _ = link
                .input
                .extend_from_slice(frame.get(..len).unwrap_or(&[]));
        }
    }
    let _ = device.poll(&mut board, &mut link);

    let period = u64::from(TICK_HZ / RATE);
    let (mut tick_cost, mut poll_cost) = (0u64, 0u64);
    let (mut at_n1, mut arrived, mut bad) = ((0, 0), 0u64, 0u64);
    for i in 0..N2 {
        if i == N1 {
            at_n1 = (tick_cost, poll_cost);
        }
        board.0 += period;
        let t0 = counter.read();
        sampler.on_tick(board.0);
        let t1 = counter.read();
        tick_cost += u64::from(t1.wrapping_sub(t0)) - overhead;
        if i % 8 == 7 {
            let t0 = counter.read();
            let _ = device.poll(&mut board, &mut link);
            let t1 = counter.read();
            poll_cost += u64::from(t1.wrapping_sub(t0)) - overhead;
            // Not counted: check what arrived.
            let mut input = &link.output[..];
            while let Some(r) = decoder.next(&mut input) {
                match r {
                    Ok(f) => {
                        if let Message::SampleBlock(b) = f.message {
                            arrived += u64::from(b.sample_count);
                        }
                    }
                    Err(_) => bad += 1,
                }
            }
            link.output.clear();
        }
    }
    let samples = N2 - N1;
    // The test signal's own share of on_tick: conversions alone.
    let convert = {
        let mut source = TestSignal::new();
        let mut sink = 0i16;
        let t0 = counter.read();
        for _ in 0..1000 {
            if let Ok(codes) = SampleSource::convert(&mut source) {
                sink ^= codes[7];
            }
        }
        let t1 = counter.read();
        core::hint::black_box(sink);
        per_sample(u64::from(t1.wrapping_sub(t0)) - overhead, 1000)
    };
    let tick = per_sample(tick_cost - at_n1.0, samples);
    let poll = per_sample(poll_cost - at_n1.1, samples);
    let total = per_sample(tick_cost + poll_cost - at_n1.0 - at_n1.1, samples);

    // Encoding apart: full blocks of the same test-signal codes the device sent, then of
    // random codes.
    let n = max_block_samples(CHANNELS);
    let mut codes = [0u8; 2 * CHANNELS * 62];
    let mut encode_per_sample = [(0, 0); 2];
    let mut x: u32 = 0x9E37_79B9;
    for (signal, result) in encode_per_sample.iter_mut().enumerate() {
        let (mut cost, mut blocks) = (0u64, 0u64);
        for b in 0..64u64 {
            for (j, pair) in codes.chunks_exact_mut(2).enumerate() {
                let (s, c) = (b * n as u64 + (j / CHANNELS) as u64, j % CHANNELS);
                let code = if signal == 0 {
                    test_code(c, s)
                } else {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as i16
                };
                pair.copy_from_slice(&code.to_le_bytes());
            }
            let Some(codes) = Codes::from_le_bytes(&codes) else {
                continue;
            };
            let block = Message::SampleBlock(SampleBlock {
                first_index: b * n as u64,
                first_tick: b * n as u64 * period,
                period_ticks: period as u32,
                channel_mask: 0xFF,
                averaging: 1,
                sample_count: n as u16,
                codes,
            });
            let t0 = counter.read();
            let ok = encode_frame(b as u32, &block, &mut frame).is_ok();
            let t1 = counter.read();
            if ok {
                cost += u64::from(t1.wrapping_sub(t0)) - overhead;
                blocks += 1;
            }
        }
        *result = per_sample(cost, blocks * n as u64);
    }
    // Its parts, on the last random block's raw frame (1027 bytes): the CRC, and COBS.
    let mut raw = [0u8; 1034];
    let parts = {
        let end = frame.iter().position(|&b| b == 0).unwrap_or(0);
        let len =
            railtrace_protocol::cobs::decode_in_place(frame.get_mut(..end).unwrap_or(&mut []))
                .unwrap_or(0);
        if let (Some(a), Some(b)) = (raw.get_mut(..len), frame.get(..len)) {
            a.copy_from_slice(b);
        }
        let raw = raw.get(..len).unwrap_or(&[]);
        let t0 = counter.read();
        let crc = railtrace_protocol::crc32c(raw.get(..len.saturating_sub(4)).unwrap_or(&[]));
        let t1 = counter.read();
        let cobs = railtrace_protocol::cobs::encode(raw, &mut frame);
        let t2 = counter.read();
        core::hint::black_box((crc, cobs.is_ok()));
        let per = |d: u32| per_sample(u64::from(d) - overhead, n as u64);
        (per(t1.wrapping_sub(t0)), per(t2.wrapping_sub(t1)))
    };

    let _ = writeln!(
        uart,
        "thumbv7em instructions per sample (samples {N1}..{N2}, 8 channels, test signal):"
    );
    let _ = writeln!(
        uart,
        "  core total (on_tick + poll) {}.{}",
        total.0, total.1
    );
    let _ = writeln!(uart, "  sampler (on_tick)           {}.{}", tick.0, tick.1);
    let _ = writeln!(
        uart,
        "    of which the test signal  {}.{}",
        convert.0, convert.1
    );
    let _ = writeln!(uart, "  main loop (poll)            {}.{}", poll.0, poll.1);
    let (e, r) = (encode_per_sample[0], encode_per_sample[1]);
    let _ = writeln!(uart, "    of which frame encoding   {}.{}", e.0, e.1);
    let _ = writeln!(uart, "  frame encoding, random codes {}.{}", r.0, r.1);
    let ((c0, c1), (b0, b1)) = parts;
    let _ = writeln!(uart, "    of which CRC-32C           {c0}.{c1}");
    let _ = writeln!(uart, "    of which COBS              {b0}.{b1}");
    let _ = writeln!(
        uart,
        "checked: {arrived} samples arrived of {N2} (the last block still open), {bad} bad frames, read pair {overhead}"
    );
    let _ = writeln!(uart, "done");
    loop {
        cortex_m::asm::nop();
    }
}
