//! The i.MX RT1062 timers and pins the firmware uses, and nothing of the protocol: the tick
//! clock with the trigger inputs' captures (GPT2), the sample timer (PIT channel 0) and the
//! trigger outputs.
//!
//! Clocks (teensy4-bsp's clock policy, unchanged): core 600 MHz, IPG 150 MHz, PERCLK
//! 1 MHz from the 24 MHz crystal (PIT), LPSPI 132 MHz. GPT2 counts the 24 MHz crystal
//! directly, so the tick clock and the sample timer come from one crystal and a sample
//! period is an exact number of ticks (24 per PIT count).

use core::cell::Cell;

use critical_section::Mutex;
use teensy4_bsp as bsp;

use bsp::hal::{gpio, gpt, pit};
use bsp::ral;
use bsp::ral::interrupt;

/// The tick clock's rate: GPT2 on the 24 MHz crystal, no prescaler.
pub const TICK_HZ: u32 = 24_000_000;
/// The sample timer's rate: PERCLK, the crystal / 24.
const PIT_HZ: u32 = 1_000_000;
/// Ticks per PIT count.
const TICKS_PER_PIT: u32 = TICK_HZ / PIT_HZ;

// ------------------------------------------------------------------------------------
// Tick clock and trigger inputs: GPT2
// ------------------------------------------------------------------------------------

/// `(high word, last CNT seen)`: the software extension of GPT2 to 64 bits.
static CLOCK_EXTENSION: Mutex<Cell<(u32, u32)>> = Mutex::new(Cell::new((0, 0)));

/// The device clock: GPT2 free-running at [`TICK_HZ`] from boot, as a `u64`. The high
/// word is kept by wrap detection in [`TickClock::now`], which GPT2's rollover interrupt
/// calls at least once per wrap (179 s).
#[derive(Debug, Clone, Copy)]
pub struct TickClock(());

fn gpt2() -> ral::gpt::GPT2 {
    // SAFETY: after `TickClock::start`, GPT2 is only read (CNT, ICR1/2, SR) and its SR
    // flags cleared by the interrupt handler; nothing else writes it.
    unsafe { ral::gpt::GPT2::instance() }
}

impl TickClock {
    /// Starts GPT2 on the crystal, free-running, with rollover and capture interrupts, and
    /// the trigger inputs on pins 15 and 40 captured on both edges.
    pub fn start(
        mut timer: gpt::Gpt,
        _in0: bsp::pins::common::P15,
        _in1: bsp::pins::t41::P40,
    ) -> TickClock {
        timer.disable();
        timer.set_clock_source(gpt::ClockSource::CrystalOscillator);
        timer.set_divider_24mhz(1);
        timer.set_divider(1);
        timer.set_mode(gpt::Mode::FreeRunning);
        timer.set_reset_on_enable(true);
        timer.set_rollover_interrupt_enable(true);
        // SAFETY: the pads of pins 15 (GPIO_AD_B1_03) and 40 (GPIO_AD_B1_04), owned here,
        // to ALT8 (GPT2_CAPTURE1/2) with their input daisy chains (i.MX RT1060 RM,
        // IOMUXC), SION set so that GPIO1's PSR still sees the pad (for the edge's
        // polarity), hysteresis and a 100 kΩ pull-down (PAD_CTL 0x13000).
        let iomuxc = unsafe { ral::iomuxc::IOMUXC::instance() };
        ral::write_reg!(ral::iomuxc, iomuxc, SW_MUX_CTL_PAD_GPIO_AD_B1_03, 0x18);
        ral::write_reg!(ral::iomuxc, iomuxc, SW_MUX_CTL_PAD_GPIO_AD_B1_04, 0x18);
        ral::write_reg!(ral::iomuxc, iomuxc, SW_PAD_CTL_PAD_GPIO_AD_B1_03, 0x13000);
        ral::write_reg!(ral::iomuxc, iomuxc, SW_PAD_CTL_PAD_GPIO_AD_B1_04, 0x13000);
        ral::write_reg!(ral::iomuxc, iomuxc, GPT2_IPP_IND_CAPIN1_SELECT_INPUT, 1);
        ral::write_reg!(ral::iomuxc, iomuxc, GPT2_IPP_IND_CAPIN2_SELECT_INPUT, 1);
        let regs = gpt2();
        // Both edges on both captures (IMn = 3), their interrupts on.
        ral::modify_reg!(ral::gpt, regs, CR, IM1: 3, IM2: 3);
        ral::modify_reg!(ral::gpt, regs, IR, IF1IE: 1, IF2IE: 1);
        timer.enable();
        // `timer` ends here (it has no Drop): GPT2 runs for ever, read through `gpt2()`.
        TickClock(())
    }

    fn raw() -> u32 {
        ral::read_reg!(ral::gpt, gpt2(), CNT)
    }

    /// Ticks since boot. Callable from any context (a short critical section).
    pub fn now(&self) -> u64 {
        critical_section::with(|cs| {
            let state = CLOCK_EXTENSION.borrow(cs);
            let (mut high, last) = state.get();
            let cnt = Self::raw();
            if cnt < last {
                high = high.wrapping_add(1);
            }
            state.set((high, cnt));
            (u64::from(high) << 32) | u64::from(cnt)
        })
    }
}

/// Trigger inputs: pins 15 and 40 (GPT2 capture 1 and 2), both edges.
pub const TRIGGER_INPUTS: u8 = 2;

/// One captured edge of a trigger input.
#[derive(Debug, Clone, Copy)]
pub struct Capture {
    /// Input line, 0 (pin 15) or 1 (pin 40).
    pub line: u8,
    /// Rising edge (the pad read high just after it).
    pub rising: bool,
    /// Tick of the edge, latched by GPT2 in hardware.
    pub tick: u64,
}

type Slot<F> = Mutex<Cell<Option<F>>>;

static EDGE_HANDLER: Slot<fn(Capture)> = Mutex::new(Cell::new(None));

/// Calls `handler` from GPT2's interrupt for every trigger-input edge.
pub fn on_trigger_edge(handler: fn(Capture)) {
    critical_section::with(|cs| EDGE_HANDLER.borrow(cs).set(Some(handler)));
}

/// The pad level of GPIO_AD_B1_03 / _04 (GPIO1 bits 19 and 20), read through PSR, which
/// follows the pad whatever its mux.
fn pad_high(line: u8) -> bool {
    // SAFETY: a read of GPIO1's pad status register, no side effect.
    let gpio1 = unsafe { ral::gpio::GPIO1::instance() };
    ral::read_reg!(ral::gpio, gpio1, PSR) & (1 << (19 + u32::from(line))) != 0
}

#[bsp::rt::interrupt]
fn GPT2() {
    let regs = gpt2();
    let sr = ral::read_reg!(ral::gpt, regs, SR);
    // Write-1-to-clear, only the flags seen.
    ral::write_reg!(ral::gpt, regs, SR, sr & 0x3F);
    let now = TickClock(()).now(); // also keeps the 64-bit extension across a rollover
    let handler = critical_section::with(|cs| EDGE_HANDLER.borrow(cs).get());
    for line in 0..TRIGGER_INPUTS {
        if sr & (1 << (3 + line)) == 0 {
            continue; // IF1 is bit 3, IF2 bit 4
        }
        let captured = ral::read_reg!(ral::gpt, regs, ICR[usize::from(line)]);
        // The capture happened at most one wrap ago: count back from now.
        let tick = now - u64::from((now as u32).wrapping_sub(captured));
        if let Some(handler) = handler {
            handler(Capture {
                line,
                rising: pad_high(line),
                tick,
            });
        }
    }
}

// ------------------------------------------------------------------------------------
// Sample timer: PIT channel 0
// ------------------------------------------------------------------------------------

static SAMPLE_HANDLER: Slot<fn()> = Mutex::new(Cell::new(None));

/// Shortest sample period accepted: 4 µs (250 kS/s).
const MIN_PERIOD_PIT: u32 = 4;

/// Why [`SampleTimer::start`] refused a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateOutOfRange;

/// PIT channel 0 on PERCLK (1 MHz): an interrupt every `1 MHz / rate` µs that calls a
/// handler.
pub struct SampleTimer {
    pit: pit::Pit,
}

impl SampleTimer {
    /// Takes the PIT (all channels; only channel 0 is used).
    pub fn new(pit: pit::Pit) -> SampleTimer {
        SampleTimer { pit }
    }

    /// Calls `handler` at `rate_hz` from now on (restarts if running). Returns the period
    /// in device ticks: `24 × (1 MHz / rate_hz)`, rounded down to whole microseconds.
    pub fn start(&mut self, rate_hz: u32, handler: fn()) -> Result<u32, RateOutOfRange> {
        let period = PIT_HZ.checked_div(rate_hz).ok_or(RateOutOfRange)?;
        if period < MIN_PERIOD_PIT {
            return Err(RateOutOfRange);
        }
        self.stop();
        critical_section::with(|cs| SAMPLE_HANDLER.borrow(cs).set(Some(handler)));
        self.pit.set_load_timer_value(pit::Channel::Chan0, period);
        self.pit.set_interrupt_enable(pit::Channel::Chan0, true);
        self.pit.enable(pit::Channel::Chan0);
        Ok(period * TICKS_PER_PIT)
    }

    /// Stops the interrupt. The handler is not called after this returns.
    pub fn stop(&mut self) {
        self.pit.disable(pit::Channel::Chan0);
        self.pit.set_interrupt_enable(pit::Channel::Chan0, false);
        self.pit.clear_elapsed(pit::Channel::Chan0);
        cortex_m::peripheral::NVIC::unpend(ral::Interrupt::PIT);
        critical_section::with(|cs| SAMPLE_HANDLER.borrow(cs).set(None));
    }
}

#[bsp::rt::interrupt]
fn PIT() {
    // SAFETY: TFLG0's write-1-to-clear only; `SampleTimer` clears the same flag in `stop`.
    let pit = unsafe { ral::pit::PIT::instance() };
    ral::write_reg!(ral::pit::timer, &pit.TIMER[0], TFLG, TIF: 1);
    if let Some(handler) = critical_section::with(|cs| SAMPLE_HANDLER.borrow(cs).get()) {
        handler();
    }
}

// ------------------------------------------------------------------------------------
// Trigger outputs: pins 2 and 3 (GPIO4)
// ------------------------------------------------------------------------------------

/// Trigger outputs: pins 2 and 3, push-pull, low at boot.
pub const TRIGGER_OUTPUTS: u8 = 2;

/// The trigger outputs.
pub struct TriggerOutputs {
    pins: [gpio::Output; 2],
}

impl TriggerOutputs {
    /// Pins 2 and 3 as outputs, low.
    pub fn new(out0: gpio::Output, out1: gpio::Output) -> TriggerOutputs {
        out0.clear();
        out1.clear();
        TriggerOutputs { pins: [out0, out1] }
    }

    /// Drives output `line`; `false` for a line that does not exist.
    pub fn set(&mut self, line: u8, high: bool) -> bool {
        match self.pins.get(usize::from(line)) {
            Some(pin) if high => pin.set(),
            Some(pin) => pin.clear(),
            None => return false,
        }
        true
    }
}
