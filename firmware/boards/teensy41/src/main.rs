//! railtrace firmware for the fast rig: a Teensy 4.1 (NXP i.MX RT1062, 600 MHz Cortex-M7)
//! reading an AD7606C-16 on its 16-bit parallel interface (fast GPIO), streaming to the host over USB high speed as a
//! CDC-ACM serial port. The portable core (`railtrace-firmware`) on this board's hardware
//! ([`board`], [`adc`]).
//!
//! - PIT channel 0's interrupt runs the core's sampler: one conversion per tick, stamped
//!   with the GPT2 tick clock (24 MHz, extended to 64 bits).
//! - GPT2's capture interrupt stamps the trigger inputs (pins 15 and 40, latched in
//!   hardware on both edges).
//! - The main loop polls the core's device and services USB (`railtrace-usb` over
//!   imxrt-usbd, 512-byte bulk packets).
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

use core::cell::RefCell;

use critical_section::Mutex;
use heapless::spsc::Queue;
use panic_halt as _;
use railtrace_firmware::{
    Calibration, ChannelSpec, Description, Device, Edge, EdgeCapture, ErrorKind, Queues, Sample,
    Sampler, Shared, CHANNELS,
};
use railtrace_protocol::{LogLevel, Quantity};
use railtrace_usb::{Identity, Speed, UsbSerial};
use teensy4_bsp as bsp;

use adc::Source;
use board::{SampleTimer, TickClock, TriggerOutputs, TICK_HZ};
use bsp::board as t4;
use bsp::usbd::{BusAdapter, EndpointMemory, EndpointState};
use usb_device::bus::UsbBusAllocator;

const SAMPLE_QUEUE: usize = 512;
const EDGE_QUEUE: usize = 32;
/// The USB transmit buffer: 8 high-speed packets.
const USB_TX: usize = 4096;

static SHARED: Shared = Shared::new();
/// Endpoint buffers for imxrt-usbd: EP0 both ways, the CDC notification endpoint and the
/// two 512-byte bulk endpoints.
static EP_MEMORY: EndpointMemory<2048> = EndpointMemory::new();
static EP_STATE: EndpointState = EndpointState::max_endpoints();

/// The sample interrupt's state.
struct Isr {
    sampler: Sampler<'static, Source, SAMPLE_QUEUE>,
    clock: TickClock,
}

static ISR: Mutex<RefCell<Option<Isr>>> = Mutex::new(RefCell::new(None));
static CAPTURE: Mutex<RefCell<Option<EdgeCapture<'static, EDGE_QUEUE>>>> =
    Mutex::new(RefCell::new(None));

/// The sample timer's handler (PIT interrupt).
fn on_sample_tick() {
    critical_section::with(|cs| {
        if let Some(isr) = ISR.borrow_ref_mut(cs).as_mut() {
            let tick = isr.clock.now();
            isr.sampler.on_tick(tick);
        }
    });
}

/// A trigger input edge captured by GPT2.
fn on_capture(c: board::Capture) {
    critical_section::with(|cs| {
        if let Some(capture) = CAPTURE.borrow_ref_mut(cs).as_mut() {
            capture.on_edge(c.line, c.rising, c.tick);
        }
    });
}

/// The core's view of the rest of the board.
struct Hw {
    clock: TickClock,
    timer: SampleTimer,
    outputs: TriggerOutputs,
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
    /// Not kept on this board: the calibration lives in the host's rig description.
    fn store_calibration(&mut self, _: &[Calibration; CHANNELS]) -> Result<(), ErrorKind> {
        Err(ErrorKind::Storage)
    }
}

/// The eight AD7606C-16 inputs as the fast rig wires them: one current-sense amplifier
/// output and one divided rail voltage per rail. Defaults for the ±10 V range (305.2 µV a
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
    const fn spec(
        index: u8,
        quantity: Quantity,
        name: &'static str,
        c: Calibration,
    ) -> ChannelSpec {
        ChannelSpec {
            index,
            quantity,
            name,
            default_calibration: c,
        }
    }
    [
        spec(0, Quantity::Current, "PCIE12_I", current),
        spec(1, Quantity::Voltage, "PCIE12_V", voltage),
        spec(2, Quantity::Current, "PCIE3V3_I", current),
        spec(3, Quantity::Voltage, "PCIE3V3_V", voltage),
        spec(4, Quantity::Current, "AUX1_I", current),
        spec(5, Quantity::Voltage, "AUX1_V", voltage),
        spec(6, Quantity::Current, "AUX2_I", current),
        spec(7, Quantity::Voltage, "AUX2_V", voltage),
    ]
};

/// Rates offered (all divide the PIT's 1 MHz). At 200 kS/s the blocking conversion and
/// parallel read take an estimated 1.6 µs of each 5 µs period at most (README), leaving
/// the main loop the rest.
static RATES: [u32; 8] = [
    1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000,
];

const BOARD_NAME: &str = "teensy41";

#[bsp::rt::entry]
fn main() -> ! {
    let t4::Resources {
        pit,
        gpt2,
        mut gpio4,
        usb,
        pins,
        ..
    } = t4::t41(t4::instances());

    let clock = TickClock::start(gpt2, pins.p15, pins.p40);
    // Pins 2-3 are GPIO4 pads (teensy4-pins); the port check fails only for a pin given
    // the wrong port, a mistake in these lines.
    #[allow(clippy::unwrap_used)]
    let (out0, out1) = (
        gpio4.output(pins.p2).unwrap(),
        gpio4.output(pins.p3).unwrap(),
    );
    let probe = adc::probe(adc::Pads {
        db: (
            (pins.p19, pins.p18, pins.p14, pins.p36),
            (pins.p37, pins.p41, pins.p17, pins.p16),
            (pins.p22, pins.p23, pins.p20, pins.p21),
            (pins.p38, pins.p39, pins.p26, pins.p27),
        ),
        cs_rd_wr: (pins.p10, pins.p12, pins.p11),
        convst_busy_reset: (pins.p9, pins.p8, pins.p7),
    });
    let (source, adc_error) = (probe.source, probe.adc_error);
    let outputs = TriggerOutputs::new(out0, out1);
    let timer = SampleTimer::new(pit);

    let test_signal = matches!(source, Source::Test(_));
    #[allow(clippy::unwrap_used)] // first and only calls: cannot fail
    let (samples, edges, alloc) = (
        cortex_m::singleton!(: Queue<Sample, SAMPLE_QUEUE> = Queue::new()).unwrap(),
        cortex_m::singleton!(: Queue<Edge, EDGE_QUEUE> = Queue::new()).unwrap(),
        cortex_m::singleton!(: Option<UsbBusAllocator<BusAdapter>> = None).unwrap(),
    );
    let (sample_in, sample_out) = samples.split();
    let (edge_in, edge_out) = edges.split();
    critical_section::with(|cs| {
        ISR.borrow(cs).replace(Some(Isr {
            sampler: Sampler::new(source, sample_in, &SHARED),
            clock,
        }));
        CAPTURE
            .borrow(cs)
            .replace(Some(EdgeCapture::new(edge_in, &SHARED)));
    });
    board::on_trigger_edge(on_capture);

    let bus = BusAdapter::with_speed(usb, &EP_MEMORY, &EP_STATE, bsp::usbd::Speed::High);
    let alloc: &'static UsbBusAllocator<BusAdapter> = alloc.insert(UsbBusAllocator::new(bus));
    let identity = Identity {
        vendor_id: 0x1209,
        product_id: 0x0001,
        manufacturer: "railtrace",
        product: "railtrace rig (Teensy 4.1)",
        serial: BOARD_NAME,
    };
    let mut link: UsbSerial<'static, BusAdapter, USB_TX> =
        match UsbSerial::new(alloc, Speed::High, &identity) {
            Ok(link) => link,
            // The descriptors are fixed at build time; a refusal is a firmware bug and
            // there is no link to report it on.
            Err(_) => loop {
                cortex_m::asm::wfi();
            },
        };

    // SAFETY: the handlers' shared state lives in critical-section mutexes and atomics,
    // so unmasking cannot break a critical section.
    unsafe {
        let mut cp = cortex_m::Peripherals::steal();
        cp.NVIC.set_priority(bsp::Interrupt::PIT, 0x60);
        cp.NVIC.set_priority(bsp::Interrupt::GPT2, 0xC0);
        cortex_m::peripheral::NVIC::unmask(bsp::Interrupt::PIT);
        cortex_m::peripheral::NVIC::unmask(bsp::Interrupt::GPT2);
    }

    let description = Description {
        board: BOARD_NAME,
        serial: BOARD_NAME,
        firmware_version: (
            version_part(env!("CARGO_PKG_VERSION_MAJOR")),
            version_part(env!("CARGO_PKG_VERSION_MINOR")),
            version_part(env!("CARGO_PKG_VERSION_PATCH")),
        ),
        tick_hz: TICK_HZ,
        adc_bits: 16,
        test_signal,
        sample_rates_hz: &RATES,
        trigger_inputs: board::TRIGGER_INPUTS,
        trigger_outputs: board::TRIGGER_OUTPUTS,
        channels: &CHANNEL_SPECS,
    };
    let mut device = Device::new(
        description,
        None,
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
    } else if !probe.high_bandwidth {
        device.log(
            LogLevel::Warn,
            "the ADC did not take the 220 kHz bandwidth (OS0-OS2 not strapped high?): its inputs keep their reset bandwidth",
        );
    }
    let mut hw = Hw {
        clock,
        timer,
        outputs,
    };
    loop {
        // A USB driver error leaves the frame where it was; the next pass retries it.
        let _ = device.poll(&mut hw, &mut link);
        let _ = link.poll();
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
