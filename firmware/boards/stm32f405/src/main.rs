//! railtrace STM32F405 bring-up image: a smoke test of the hardware paths the firmware
//! uses, speaking the real wire protocol (`railtrace-protocol`) over USART1.
//!
//! [`board`] and [`serial`] are the hardware layer. Everything in this file is a
//! stand-in for the portable core (`railtrace-firmware`), to be replaced by it:
//!
//! - at boot: one 0x00 (resynchronises a receiver attached mid-stream), a `Log`
//!   "railtrace stm32f405 boot", and a `Log` with the boot-time clock check;
//! - then sampling at [`SAMPLE_HZ`] (build-time `RAILTRACE_SAMPLE_HZ`, default 10000): the
//!   TIM2 interrupt stamps each sample with the tick clock, takes the [test signal]
//!   (`FLAG_TEST_SIGNAL`: no ADC is read) and queues it; the main loop packs the queue into
//!   `SampleBlock`s of [`SAMPLES_PER_BLOCK`] samples, indices counted from 0 at boot. A
//!   sample the queue had no room for is dropped and shows as a jump in `first_index`;
//! - commands: `GetInfo` → `DeviceInfo` + `CommandResult`, `GetStatus` → `Status` +
//!   `CommandResult`; any other command → `CommandResult` `UnknownCommand`; a malformed
//!   command → `InvalidArgument` with request id 0 (the decoder does not hand out the
//!   payload of a malformed frame).
//!
//! [test signal]: test_signal
#![no_std]
#![no_main]
#![deny(unsafe_op_in_unsafe_fn, clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod board;
mod serial;

use core::cell::RefCell;
use core::fmt::Write as _;

use cortex_m_rt::entry;
use critical_section::Mutex;
use embedded_io::{Read as _, ReadReady as _, Write as _};
use heapless::spsc::{Producer, Queue};
use panic_halt as _;
use railtrace_firmware as _; // linked so that the core keeps building for this target
use railtrace_protocol::{
    ChannelInfo, Codes, CommandResult, Decoder, DeviceInfo, FrameEncoder, FrameError, Log,
    LogLevel, Message, MessageType, Quantity, ResultCode, RunState, SampleBlock, Status, FLAG_TEST_SIGNAL,
    MAX_WIRE_FRAME, PROTOCOL_VERSION,
};

use board::{Board, TickClock, TICK_HZ};
use serial::Serial;

/// Sample rate, from `RAILTRACE_SAMPLE_HZ` at build time (default 10 kHz).
const SAMPLE_HZ: u32 = parse_u32(option_env!("RAILTRACE_SAMPLE_HZ"), 10_000);
/// Samples per `SampleBlock` (2 channels: 200 × 4 = 800 bytes of codes).
const SAMPLES_PER_BLOCK: usize = 200;
/// Test-signal channels 0 and 1.
const CHANNELS: usize = 2;
const CHANNEL_MASK: u8 = 0b11;
/// Sample queue between the TIM2 interrupt and the main loop.
const QUEUE_CAPACITY: usize = 511;
type SampleQueue = Queue<Sample, { QUEUE_CAPACITY + 1 }>;

const FIRMWARE_VERSION: (u8, u8, u8) = (
    parse_u32(option_env!("CARGO_PKG_VERSION_MAJOR"), 0) as u8,
    parse_u32(option_env!("CARGO_PKG_VERSION_MINOR"), 0) as u8,
    parse_u32(option_env!("CARGO_PKG_VERSION_PATCH"), 0) as u8,
);
#[cfg(feature = "qemu")]
const BOARD_NAME: &str = "stm32f405 (qemu netduinoplus2)";
#[cfg(not(feature = "qemu"))]
const BOARD_NAME: &str = "stm32f405";

/// The test signal: a pure function of the sample index, so that a host can check every
/// code it receives. Channel 0: a square wave of period 100 samples, +4096 for indices
/// 0-49, -4096 for 50-99. Channel 1: a sawtooth of period 256 samples,
/// `((index mod 256) - 128) × 256`, from -32768 to 32512.
fn test_signal(index: u64) -> [i16; CHANNELS] {
    let square = if index % 100 < 50 { 4096 } else { -4096 };
    let saw = ((index % 256) as i16 - 128) * 256;
    [square, saw]
}

/// One sample, from the interrupt to the main loop.
#[derive(Debug, Clone, Copy)]
struct Sample {
    index: u64,
    tick: u64,
    codes: [i16; CHANNELS],
}

/// The sample interrupt's state.
struct Sampler {
    clock: TickClock,
    queue: Producer<'static, Sample, { QUEUE_CAPACITY + 1 }>,
    next_index: u64,
    dropped: u64,
}

static SAMPLER: Mutex<RefCell<Option<Sampler>>> = Mutex::new(RefCell::new(None));

/// The sample timer's handler (TIM2 interrupt).
fn on_sample_tick() {
    critical_section::with(|cs| {
        if let Some(s) = SAMPLER.borrow_ref_mut(cs).as_mut() {
            let index = s.next_index;
            let sample = Sample { index, tick: s.clock.now(), codes: test_signal(index) };
            s.next_index += 1;
            if s.queue.enqueue(sample).is_err() {
                s.dropped += 1;
            }
        }
    });
}

/// Frames to the host.
struct Link {
    serial: Serial,
    frames: FrameEncoder,
    buf: [u8; MAX_WIRE_FRAME],
}

impl Link {
    fn send(&mut self, message: &Message<'_>) {
        // Encoding fails only for a message over its limits, which this file never builds.
        if let Ok(n) = self.frames.encode(message, &mut self.buf) {
            let Ok(()) = self.serial.write_all(self.buf.get(..n).unwrap_or(&[]));
        }
    }

    fn log(&mut self, level: LogLevel, text: &str) {
        self.send(&Message::Log(Log { level, text }));
    }

    fn result(&mut self, request_id: u16, command: u8, code: ResultCode) {
        self.send(&Message::CommandResult(CommandResult { request_id, command, code }));
    }
}

/// The `SampleBlock` being filled.
struct Block {
    first_index: u64,
    first_tick: u64,
    period_ticks: u32,
    count: usize,
    codes: [u8; SAMPLES_PER_BLOCK * CHANNELS * 2],
}

impl Block {
    /// Adds a sample, sending the block when it is full, or first when the sample does
    /// not follow the block's last one (samples were dropped).
    fn push(&mut self, s: Sample, link: &mut Link) {
        if self.count > 0 && s.index != self.first_index + self.count as u64 {
            self.send(link);
        }
        if self.count == 0 {
            self.first_index = s.index;
            self.first_tick = s.tick;
        }
        let at = self.count * CHANNELS * 2;
        for (i, code) in s.codes.iter().enumerate() {
            if let Some(dst) = self.codes.get_mut(at + 2 * i..at + 2 * i + 2) {
                dst.copy_from_slice(&code.to_le_bytes());
            }
        }
        self.count += 1;
        if self.count == SAMPLES_PER_BLOCK {
            self.send(link);
        }
    }

    fn send(&mut self, link: &mut Link) {
        let bytes = self.codes.get(..self.count * CHANNELS * 2).unwrap_or(&[]);
        if let Some(codes) = Codes::from_le_bytes(bytes) {
            link.send(&Message::SampleBlock(SampleBlock {
                first_index: self.first_index,
                first_tick: self.first_tick,
                period_ticks: self.period_ticks,
                channel_mask: CHANNEL_MASK,
                averaging: 1,
                sample_count: self.count as u16,
                codes,
            }));
        }
        self.count = 0;
    }
}

#[entry]
fn main() -> ! {
    let Board { clock, mut sampler, serial, unique_id, clock_check_ticks } = Board::init();
    let mut link = Link { serial, frames: FrameEncoder::new(), buf: [0; MAX_WIRE_FRAME] };

    let Ok(()) = link.serial.write_all(&[0]);
    link.log(LogLevel::Info, "railtrace stm32f405 boot");
    let expected = ((1u64 << 20) * u64::from(TICK_HZ) / u64::from(board::HCLK_HZ)) as u32;
    let mut text = heapless::String::<128>::new();
    // The text fits: the format is under 128 bytes for any u32 values.
    let _ = write!(
        text,
        "clock check: TIM5 counted {clock_check_ticks} ticks in 2^20 SysTick cycles \
         (expected {expected}: tick {TICK_HZ} Hz, core {} Hz)",
        board::HCLK_HZ
    );
    link.log(LogLevel::Info, &text);

    #[allow(clippy::unwrap_used)] // first and only call: cannot fail
    let queue: &'static mut SampleQueue = cortex_m::singleton!(: SampleQueue = Queue::new()).unwrap();
    let (producer, mut samples) = queue.split();
    critical_section::with(|cs| {
        SAMPLER.borrow(cs).replace(Some(Sampler { clock, queue: producer, next_index: 0, dropped: 0 }));
    });
    let period_ticks = match sampler.start(SAMPLE_HZ, on_sample_tick) {
        Ok(period) => period,
        Err(_) => {
            link.log(LogLevel::Error, "RAILTRACE_SAMPLE_HZ is out of range; not sampling");
            0
        }
    };

    let mut block = Block { first_index: 0, first_tick: 0, period_ticks, count: 0, codes: [0; SAMPLES_PER_BLOCK * CHANNELS * 2] };
    let mut decoder = Decoder::<MAX_WIRE_FRAME>::new();
    let mut high_water = 0usize;
    let mut rx = [0u8; 64];

    loop {
        let mut idle = true;

        // Host → device: decode whatever has arrived, answer commands.
        if let Ok(true) = link.serial.read_ready() {
            idle = false;
            let Ok(n) = link.serial.read(&mut rx);
            let mut input = rx.get(..n).unwrap_or(&[]);
            loop {
                // Only the request id and type are needed: no command handled here has
                // arguments. Copying them out ends the borrow of the decoder's buffer.
                let (request_id, command) = match decoder.next(&mut input) {
                    None => break,
                    Some(Ok(frame)) => match frame.message.request_id() {
                        Some(id) => (id, frame.message.type_byte()),
                        None => continue, // not a command (or a type we do not know)
                    },
                    Some(Err(FrameError::Malformed { msg_type, .. })) if msg_type & 0x80 != 0 => {
                        link.result(0, msg_type, ResultCode::InvalidArgument);
                        continue;
                    }
                    Some(Err(_)) => continue, // counted in the decoder's stats
                };
                match MessageType::from_u8(command) {
                    Some(MessageType::GetInfo) => {
                        link.send(&Message::DeviceInfo(device_info(unique_id.as_ref())));
                        link.result(request_id, command, ResultCode::Ok);
                    }
                    Some(MessageType::GetStatus) => {
                        let (acquired, dropped) = critical_section::with(|cs| {
                            SAMPLER.borrow_ref(cs).as_ref().map_or((0, 0), |s| (s.next_index, s.dropped))
                        });
                        let status = Status {
                            uptime_ticks: clock.now(),
                            samples_acquired: acquired,
                            dropped_queue_full: dropped,
                            dropped_link: 0,
                            dropped_adc: 0,
                            frames_sent: link.frames.next_seq().wrapping_add(1),
                            frames_rejected: decoder.stats().rejected() as u32,
                            edges_dropped: 0,
                            queue_high_water: high_water as u16,
                            queue_capacity: QUEUE_CAPACITY as u16,
                            state: RunState::Running,
                        };
                        link.send(&Message::Status(status));
                        link.result(request_id, command, ResultCode::Ok);
                    }
                    _ => link.result(request_id, command, ResultCode::UnknownCommand),
                }
            }
        }

        // Samples → blocks; at most one block's worth per pass so commands are not starved.
        high_water = high_water.max(samples.len());
        for _ in 0..SAMPLES_PER_BLOCK {
            let Some(sample) = samples.dequeue() else { break };
            idle = false;
            block.push(sample, &mut link);
        }

        if idle {
            // Sleep until an interrupt; masked so that one between the check and WFI still
            // wakes the core (it runs when the mask is lifted).
            cortex_m::interrupt::free(|_| {
                if !samples.ready() && !matches!(link.serial.read_ready(), Ok(true)) {
                    cortex_m::asm::wfi();
                }
            });
        }
    }
}

/// What `GetInfo` answers.
fn device_info(unique_id: Option<&[u8; 24]>) -> DeviceInfo<'_> {
    let serial = unique_id.and_then(|id| core::str::from_utf8(id).ok()).unwrap_or("qemu");
    let mut sample_rates_hz = heapless::Vec::new();
    let _ = sample_rates_hz.push(SAMPLE_HZ); // capacity 8: cannot fail
    let mut channels = heapless::Vec::new();
    let _ = channels.push(ChannelInfo { index: 0, quantity: Quantity::Current, name: "I0", scale: 0.001, offset: 0.0 });
    let _ = channels.push(ChannelInfo { index: 1, quantity: Quantity::Voltage, name: "V0", scale: 0.0005, offset: 0.0 });
    DeviceInfo {
        firmware_version: FIRMWARE_VERSION,
        protocol_version: PROTOCOL_VERSION,
        tick_hz: TICK_HZ,
        adc_bits: 16,
        flags: FLAG_TEST_SIGNAL,
        trigger_inputs: 0,
        trigger_outputs: 0,
        board: BOARD_NAME,
        serial,
        sample_rates_hz,
        channels,
    }
}

/// Parses a decimal `u32` at compile time; `default` when absent, empty or invalid.
#[allow(clippy::indexing_slicing)] // i < bytes.len()
const fn parse_u32(s: Option<&str>, default: u32) -> u32 {
    let Some(s) = s else { return default };
    let bytes = s.as_bytes();
    if bytes.is_empty() {
        return default;
    }
    let mut value: u32 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let d = bytes[i];
        if !d.is_ascii_digit() {
            return default;
        }
        value = match value.checked_mul(10) {
            Some(v) => match v.checked_add((d - b'0') as u32) {
                Some(v) => v,
                None => return default,
            },
            None => return default,
        };
        i += 1;
    }
    value
}
