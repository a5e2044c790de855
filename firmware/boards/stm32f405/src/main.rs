//! railtrace firmware for the STM32F405: the portable core (`railtrace-firmware`) on this
//! board's hardware ([`board`], [`serial`], [`adc`]).
//!
//! - TIM2's interrupt runs the core's sampler: one conversion per tick (the AD7606, or the
//!   test signal where no ADC answers, e.g. under QEMU), stamped with the TIM5 tick clock.
//! - TIM5's capture interrupts stamp the trigger inputs (silicon). QEMU models no input
//!   capture, so under the `qemu` feature a self-test raises an edge on input 0 every
//!   millisecond while sampling, from the sample interrupt, stamped like a capture.
//! - The main loop polls the core's device: commands and frames over the host link, the
//!   chip's own USB (OTG_FS, CDC-ACM at full speed, [`usb`]) on silicon, or USART1
//!   ([`serial`]) with the `usart` feature and under QEMU (which models no USB).
#![no_std]
#![no_main]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]

mod adc;
mod board;
#[cfg(feature = "usart")]
mod serial;
mod storage;
#[cfg(not(feature = "usart"))]
mod usb;

use core::cell::RefCell;

use cortex_m_rt::entry;
use critical_section::Mutex;
use heapless::spsc::Queue;
use panic_halt as _;
use railtrace_firmware::{
    Calibration, ChannelSpec, Description, Device, Edge, EdgeCapture, ErrorKind, Queues, Sample,
    Sampler, Shared, CHANNELS,
};
use railtrace_protocol::{LogLevel, Quantity};

use adc::Source;
use board::{SampleTimer, TickClock, TriggerOutputs, TICK_HZ};

const SAMPLE_QUEUE: usize = 256;
const EDGE_QUEUE: usize = 32;

static SHARED: Shared = Shared::new();

/// The sample interrupt's state.
struct Isr {
    sampler: Sampler<'static, Source, SAMPLE_QUEUE>,
    clock: TickClock,
    #[cfg(feature = "qemu")]
    self_test: SelfTest,
}

static ISR: Mutex<RefCell<Option<Isr>>> = Mutex::new(RefCell::new(None));
static CAPTURE: Mutex<RefCell<Option<EdgeCapture<'static, EDGE_QUEUE>>>> =
    Mutex::new(RefCell::new(None));

/// The sample timer's handler (TIM2 interrupt).
fn on_sample_tick() {
    critical_section::with(|cs| {
        if let Some(isr) = ISR.borrow_ref_mut(cs).as_mut() {
            let tick = isr.clock.now();
            isr.sampler.on_tick(tick);
            #[cfg(feature = "qemu")]
            isr.self_test.on_tick(cs, tick);
        }
    });
}

/// A trigger input edge captured by TIM5 (silicon).
#[cfg_attr(feature = "qemu", allow(dead_code))]
fn on_capture(c: board::Capture) {
    critical_section::with(|cs| {
        if let Some(capture) = CAPTURE.borrow_ref_mut(cs).as_mut() {
            if c.overcaptured {
                capture.lost(c.line);
            }
            capture.on_edge(c.line, c.rising, c.tick);
        }
    });
}

/// Under QEMU: an edge on trigger input 0 every millisecond of device time, alternating
/// rising and falling, stamped with the tick of the sample interrupt that raises it.
#[cfg(feature = "qemu")]
struct SelfTest {
    next: u64,
    level: bool,
}

#[cfg(feature = "qemu")]
impl SelfTest {
    const PERIOD_TICKS: u64 = TICK_HZ as u64 / 1000;

    fn on_tick(&mut self, cs: critical_section::CriticalSection<'_>, tick: u64) {
        if tick < self.next {
            return;
        }
        self.next = tick + Self::PERIOD_TICKS;
        self.level = !self.level;
        if let Some(capture) = CAPTURE.borrow_ref_mut(cs).as_mut() {
            capture.on_edge(0, self.level, tick);
        }
    }
}

/// The core's view of the rest of the board.
struct Hw {
    clock: TickClock,
    timer: SampleTimer,
    outputs: TriggerOutputs,
    flash: stm32f4::stm32f405::FLASH,
}

impl railtrace_firmware::Board for Hw {
    fn now(&mut self) -> u64 {
        self.clock.now()
    }
    fn start_sampling(&mut self, rate_hz: u32) -> Result<u32, ErrorKind> {
        self.timer
            .start(rate_hz, on_sample_tick)
            .map_err(|_| ErrorKind::Unsupported)
    }
    fn stop_sampling(&mut self) {
        self.timer.stop();
    }
    fn set_trigger_output(&mut self, line: u8, high: bool) -> Result<(), ErrorKind> {
        if self.outputs.set(line, high) {
            Ok(())
        } else {
            Err(ErrorKind::Unsupported)
        }
    }
    fn store_calibration(&mut self, c: &[Calibration; CHANNELS]) -> Result<(), ErrorKind> {
        storage::store(&self.flash, c)
    }
}

/// The eight AD7606 inputs as this board wires them: current-sense amplifier outputs and
/// divided rail voltages, one pair per rail. Defaults for the ±10 V range (305.2 µV a
/// code): current sensors of 50 mV/A, voltage dividers of 1/2.
const LSB_V: f32 = 20.0 / 65536.0;
static CHANNEL_SPECS: [ChannelSpec; CHANNELS] = {
    let current = Calibration {
        scale: LSB_V / 0.05,
        offset: 0.0,
    };
    let voltage = Calibration {
        scale: LSB_V * 2.0,
        offset: 0.0,
    };
    [
        ChannelSpec {
            index: 0,
            quantity: Quantity::Current,
            name: "PCIE12_I",
            default_calibration: current,
        },
        ChannelSpec {
            index: 1,
            quantity: Quantity::Voltage,
            name: "PCIE12_V",
            default_calibration: voltage,
        },
        ChannelSpec {
            index: 2,
            quantity: Quantity::Current,
            name: "PCIE3V3_I",
            default_calibration: current,
        },
        ChannelSpec {
            index: 3,
            quantity: Quantity::Voltage,
            name: "PCIE3V3_V",
            default_calibration: voltage,
        },
        ChannelSpec {
            index: 4,
            quantity: Quantity::Current,
            name: "AUX1_I",
            default_calibration: current,
        },
        ChannelSpec {
            index: 5,
            quantity: Quantity::Voltage,
            name: "AUX1_V",
            default_calibration: voltage,
        },
        ChannelSpec {
            index: 6,
            quantity: Quantity::Current,
            name: "AUX2_I",
            default_calibration: current,
        },
        ChannelSpec {
            index: 7,
            quantity: Quantity::Voltage,
            name: "AUX2_V",
            default_calibration: voltage,
        },
    ]
};

/// Rates with the ADC: a blocking conversion and 16-byte read take about 10 µs at 21 MHz
/// SCLK, so 50 kS/s is the most this image sustains until the read moves to DMA.
static ADC_RATES: [u32; 6] = [1_000, 2_000, 5_000, 10_000, 20_000, 50_000];
/// Rates with the test signal. At 200 kHz under QEMU the sample interrupt alone takes
/// the whole period and the main loop (so the host link) stops: not offered.
static TEST_RATES: [u32; 7] = [1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000];

#[cfg(feature = "qemu")]
const BOARD_NAME: &str = "stm32f405 (qemu netduinoplus2)";
#[cfg(not(feature = "qemu"))]
const BOARD_NAME: &str = "stm32f405";

#[entry]
fn main() -> ! {
    let board::Board {
        clock,
        sampler: timer,
        #[cfg(feature = "usart")]
        mut serial,
        #[cfg(not(feature = "usart"))]
        otg,
        outputs,
        source,
        adc_error,
        unique_id,
        clock_check_ticks,
        flash,
    } = board::Board::init();

    let test_signal = matches!(source, Source::Test(_));
    #[allow(clippy::unwrap_used)] // first and only calls: cannot fail
    let (samples, edges, serial_no) = (
        cortex_m::singleton!(: Queue<Sample, SAMPLE_QUEUE> = Queue::new()).unwrap(),
        cortex_m::singleton!(: Queue<Edge, EDGE_QUEUE> = Queue::new()).unwrap(),
        cortex_m::singleton!(: [u8; 24] = unique_id.unwrap_or([b'0'; 24])).unwrap(),
    );
    let serial_str: &'static str = core::str::from_utf8(serial_no)
        .ok()
        .map(|s| if unique_id.is_some() { s } else { "qemu" })
        .unwrap_or("unknown");
    let (sample_in, sample_out) = samples.split();
    let (edge_in, edge_out) = edges.split();
    critical_section::with(|cs| {
        ISR.borrow(cs).replace(Some(Isr {
            sampler: Sampler::new(source, sample_in, &SHARED),
            clock,
            #[cfg(feature = "qemu")]
            self_test: SelfTest {
                next: 0,
                level: false,
            },
        }));
        CAPTURE
            .borrow(cs)
            .replace(Some(EdgeCapture::new(edge_in, &SHARED)));
    });
    #[cfg(not(feature = "qemu"))]
    board::on_trigger_edge(on_capture);

    let description = Description {
        board: BOARD_NAME,
        serial: serial_str,
        firmware_version: (
            version_part(env!("CARGO_PKG_VERSION_MAJOR")),
            version_part(env!("CARGO_PKG_VERSION_MINOR")),
            version_part(env!("CARGO_PKG_VERSION_PATCH")),
        ),
        tick_hz: TICK_HZ,
        adc_bits: 16,
        test_signal,
        sample_rates_hz: if test_signal { &TEST_RATES } else { &ADC_RATES },
        trigger_inputs: if cfg!(feature = "qemu") {
            1
        } else {
            board::TRIGGER_INPUTS
        },
        trigger_outputs: board::TRIGGER_OUTPUTS,
        channels: &CHANNEL_SPECS,
    };
    let mut device = Device::new(
        description,
        storage::load(),
        &SHARED,
        Queues {
            samples: sample_out,
            edges: edge_out,
        },
    );
    if let Some(e) = adc_error {
        device.log(
            LogLevel::Warn,
            match e {
                ErrorKind::NotResponding => "no ADC (BUSY never rose): sampling the test signal",
                _ => "the ADC failed its first conversion: sampling the test signal",
            },
        );
    }
    // The boot-time check of the clock tree, for whoever reads the log.
    #[allow(clippy::unwrap_used)] // first and only call: cannot fail
    let text = cortex_m::singleton!(: heapless::String<160> = heapless::String::new()).unwrap();
    let expected = ((1u64 << 20) * u64::from(TICK_HZ) / u64::from(board::HCLK_HZ)) as u32;
    let _ = core::fmt::Write::write_fmt(
        text,
        format_args!(
            "clock check: TIM5 counted {clock_check_ticks} ticks in 2^20 core cycles \
             (expected {expected} for a {TICK_HZ} Hz tick and {} Hz core)",
            board::HCLK_HZ
        ),
    );
    device.log(LogLevel::Info, text.as_str());
    let mut hw = Hw {
        clock,
        timer,
        outputs,
        flash,
    };
    #[cfg(feature = "usart")]
    {
        // A leading delimiter: a host attached mid-stream resynchronises at once.
        let _ = embedded_io::Write::write(&mut serial, &[0]);
        loop {
            // The link never fails (its error type is Infallible).
            let Ok(()) = device.poll(&mut hw, &mut serial);
        }
    }
    #[cfg(not(feature = "usart"))]
    {
        let mut link = match usb::init(otg, serial_str) {
            Ok(link) => link,
            // The descriptors are fixed at build time; a refusal is a firmware bug. Without
            // a link there is nothing to do but wait for the watchdog-free reset.
            Err(_) => loop {
                cortex_m::asm::wfi();
            },
        };
        loop {
            // A USB driver error leaves the frame where it was; the next pass retries it.
            let _ = device.poll(&mut hw, &mut link);
            let _ = link.poll();
        }
    }
}

#[allow(clippy::indexing_slicing)] // const fn, evaluated at build time: i < len
const fn version_part(s: &str) -> u8 {
    let bytes = s.as_bytes();
    let mut value: u32 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let d = bytes[i];
        assert!(d.is_ascii_digit(), "version numbers are decimal"); // at build time
        value = value * 10 + (d - b'0') as u32;
        i += 1;
    }
    assert!(value <= 255, "version numbers must fit a u8"); // at build time
    value as u8
}
