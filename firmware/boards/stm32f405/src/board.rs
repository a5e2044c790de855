//! The STM32F405 hardware the firmware uses, at register level (PAC `stm32f4`), and
//! nothing of the protocol: clocks, the tick clock (TIM5), the sample timer (TIM2) and the
//! host link (OTG_FS USB in [`crate::usb`], or USART1 in [`crate::serial`] with the `usart`
//! feature, which `qemu` implies).
//!
//! Everything here runs both on silicon and under `qemu-system-arm -M netduinoplus2`
//! (QEMU 7.2). The differences, all behind the `qemu` cargo feature, are:
//!
//! - QEMU does not model RCC, so the HSE/PLL bring-up (which waits for ready bits) is
//!   skipped; the RCC/GPIO/FLASH writes that need no answer are made anyway and ignored.
//! - QEMU's timers (hw/timer/stm32f2xx_timer.c) count at [`TICK_HZ`] = 1 GHz of virtual
//!   time whatever the clock tree says, regardless of ARR (CNT never resets at the update
//!   event), and interrupt every `ARR` ticks instead of `ARR + 1`; see [`SampleTimer`].
//! - QEMU does not map the unique-id area (reading it faults): it is not read.
//!
//! The timers are set up so that the same register sequence is correct on both: PSC is
//! left at its reset value 0 and CNT and EGR are never written (on QEMU each of those
//! writes moves the model's time base and the period of its update interrupt), and ARR
//! is written last (on QEMU that write arms the update alarm, which only re-arms itself
//! while CEN and UIE are set).

use core::cell::Cell;

use cortex_m::peripheral::{syst::SystClkSource, NVIC, SYST};
use critical_section::Mutex;
use stm32f4::stm32f405::{self as pac, interrupt, Interrupt};

#[cfg(feature = "usart")]
use crate::serial::Serial;

/// Core clock (HCLK): 168 MHz from the PLL on silicon; QEMU's netduinoplus2 also runs its
/// SysTick at 168 MHz of virtual time.
pub const HCLK_HZ: u32 = 168_000_000;

/// Rate of the tick clock (TIM5) and of the sample timer's counter (TIM2), in Hz: the
/// APB1 timer clock, 2 × 42 MHz, with PSC = 0.
#[cfg(not(feature = "qemu"))]
pub const TICK_HZ: u32 = 84_000_000;
/// Rate of the tick clock (TIM5) under QEMU 7.2: its timer model counts at a fixed
/// 1 GHz of virtual time / (PSC + 1) (measured by the boot clock check: 6241624 ticks in
/// 2^20 SysTick cycles at 168 MHz). With `-icount shift=3` one instruction is 8 ns of
/// virtual time: 8 ticks per instruction.
#[cfg(feature = "qemu")]
pub const TICK_HZ: u32 = 1_000_000_000;

/// USART1 rate on silicon (APB2 84 MHz: BRR 91, 923077 baud, 0.16 % fast).
/// QEMU ignores it: its USART moves bytes as fast as the host's pseudo-terminal takes them.
#[cfg(feature = "usart")]
pub const USART1_BAUD: u32 = 921_600;
#[cfg(feature = "usart")]
const APB2_HZ: u32 = 84_000_000;

/// Interrupt priorities (STM32F4 implements the top 4 bits; lower value = more urgent).
/// The link's receiver must never lose a byte, the sample timer must not jitter, and the
/// tick clock's wrap interrupt only has to come once per 2^32 ticks.
#[cfg(feature = "usart")]
const PRIO_USART1: u8 = 0x40;
const PRIO_SAMPLE: u8 = 0x60;
const PRIO_CLOCK: u8 = 0xC0;

/// What [`Board::init`] gives the application.
#[derive(Debug)]
pub struct Board {
    /// The free-running 64-bit tick clock.
    pub clock: TickClock,
    /// The periodic sample interrupt.
    pub sampler: SampleTimer,
    /// The host link: USART1 (`usart` feature, and under QEMU).
    #[cfg(feature = "usart")]
    pub serial: Serial,
    /// The host link: OTG_FS, for [`crate::usb::init`] (silicon without `usart`).
    #[cfg(not(feature = "usart"))]
    pub otg: crate::usb::OtgFs,
    /// The trigger outputs.
    pub outputs: TriggerOutputs,
    /// What samples: the AD7606, or the test signal where it did not answer.
    pub source: crate::adc::Source,
    /// Why the ADC is not used, if it is not.
    pub adc_error: Option<railtrace_firmware::ErrorKind>,
    /// The flash controller, for the calibration record.
    pub flash: pac::FLASH,
    /// The STM32 unique device id as 24 hex digits; `None` under QEMU (it does not map
    /// the system memory that holds it, and reading it there faults).
    pub unique_id: Option<[u8; 24]>,
    /// TIM5 ticks counted during 2^20 core clocks of SysTick, measured at boot: checks
    /// the clock tree. Expected `2^20 × TICK_HZ / HCLK_HZ` (524288 on silicon, 6241523
    /// under QEMU).
    pub clock_check_ticks: u32,
}

impl Board {
    /// Brings the chip up: clocks, tick clock, USART1, sample timer (stopped). Call once.
    ///
    /// # Panics
    /// If called twice (the peripherals are taken).
    pub fn init() -> Board {
        #[allow(clippy::unwrap_used)] // first and only take, at boot: cannot fail
        let (cp, dp) = (
            cortex_m::Peripherals::take().unwrap(),
            pac::Peripherals::take().unwrap(),
        );
        let mut nvic = cp.NVIC;

        #[cfg(not(feature = "qemu"))]
        clocks_168mhz(&dp.RCC, &dp.FLASH);

        dp.RCC
            .apb1enr()
            .modify(|_, w| w.tim2en().set_bit().tim5en().set_bit());
        #[cfg(feature = "usart")]
        dp.RCC.apb2enr().modify(|_, w| w.usart1en().set_bit());
        dp.RCC
            .ahb1enr()
            .modify(|_, w| w.gpioaen().set_bit().gpiocen().set_bit());
        cortex_m::asm::dsb(); // the enables take effect before the first peripheral access

        #[cfg(not(feature = "qemu"))]
        capture_inputs(&dp.TIM5, &dp.GPIOA);
        let clock = TickClock::start(dp.TIM5);
        let outputs = TriggerOutputs::new(dp.GPIOC);
        let clock_check_ticks = clock_check(cp.SYST);
        #[cfg(feature = "usart")]
        let serial = Serial::init(dp.USART1, &dp.GPIOA, APB2_HZ, USART1_BAUD);
        #[cfg(not(feature = "usart"))]
        crate::usb::pins(&dp.GPIOA);
        let (source, adc_error) = crate::adc::probe(&dp.RCC, &dp.GPIOA, &dp.GPIOB, dp.SPI1);
        let sampler = SampleTimer::new(dp.TIM2);

        // SAFETY: the handlers' shared state lives in critical-section mutexes and atomics,
        // so unmasking cannot break a critical section.
        unsafe {
            #[cfg(feature = "usart")]
            nvic.set_priority(Interrupt::USART1, PRIO_USART1);
            nvic.set_priority(Interrupt::TIM2, PRIO_SAMPLE);
            nvic.set_priority(Interrupt::TIM5, PRIO_CLOCK);
            #[cfg(feature = "usart")]
            NVIC::unmask(Interrupt::USART1);
            NVIC::unmask(Interrupt::TIM2);
            NVIC::unmask(Interrupt::TIM5);
        }

        Board {
            clock,
            sampler,
            #[cfg(feature = "usart")]
            serial,
            #[cfg(not(feature = "usart"))]
            otg: crate::usb::OtgFs {
                global: dp.OTG_FS_GLOBAL,
                device: dp.OTG_FS_DEVICE,
                pwrclk: dp.OTG_FS_PWRCLK,
            },
            outputs,
            source,
            adc_error,
            flash: dp.FLASH,
            unique_id: unique_id(),
            clock_check_ticks,
        }
    }
}

// ------------------------------------------------------------------------------------
// Clock tree (silicon only; untestable under QEMU, which has no RCC model)
// ------------------------------------------------------------------------------------

/// HSE 8 MHz crystal → PLL (M 4, N 168, P 2, Q 7): VCO 336 MHz, SYSCLK = HCLK 168 MHz,
/// 48 MHz for USB; APB1 = HCLK / 4 = 42 MHz (its timers ×2: 84 MHz), APB2 = HCLK / 2 =
/// 84 MHz. Flash: 5 wait states (2.7-3.6 V), prefetch and caches on. The regulator stays
/// at its reset scale 1, which 168 MHz needs. Hangs if the crystal does not start.
#[cfg(not(feature = "qemu"))]
fn clocks_168mhz(rcc: &pac::RCC, flash: &pac::FLASH) {
    use pac::{flash::acr::LATENCY, rcc::cfgr};

    rcc.cr().modify(|_, w| w.hseon().set_bit());
    while rcc.cr().read().hserdy().bit_is_clear() {}

    // SAFETY: M = 4, N = 168, Q = 7 are within the fields' ranges (RM0090 §6.3.2).
    rcc.pllcfgr().write(|w| unsafe {
        w.pllsrc()
            .hse()
            .pllm()
            .bits(4)
            .plln()
            .bits(168)
            .pllp()
            .div2()
            .pllq()
            .bits(7)
    });
    rcc.cr().modify(|_, w| w.pllon().set_bit());

    flash.acr().write(|w| {
        w.latency()
            .variant(LATENCY::Ws5)
            .prften()
            .set_bit()
            .icen()
            .set_bit()
            .dcen()
            .set_bit()
    });
    while flash.acr().read().latency() != LATENCY::Ws5 {}

    rcc.cfgr().modify(|_, w| {
        w.hpre()
            .variant(cfgr::HPRE::Div1)
            .ppre1()
            .variant(cfgr::PPRE1::Div4)
            .ppre2()
            .variant(cfgr::PPRE1::Div2)
    });
    while rcc.cr().read().pllrdy().bit_is_clear() {}
    rcc.cfgr().modify(|_, w| w.sw().pll());
    while !rcc.cfgr().read().sws().is_pll() {}
}

/// Counts TIM5 ticks over 2^20 core clocks of SysTick (about 6 ms): a boot-time check that
/// the clock tree is what [`TICK_HZ`] and [`HCLK_HZ`] say. SysTick is left stopped.
fn clock_check(mut syst: SYST) -> u32 {
    const CYCLES: u32 = 1 << 20;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(CYCLES - 1);
    syst.clear_current();
    let start = TickClock::raw();
    syst.enable_counter();
    while !syst.has_wrapped() {}
    let ticks = TickClock::raw().wrapping_sub(start);
    syst.disable_counter();
    ticks
}

#[cfg(not(feature = "qemu"))]
fn unique_id() -> Option<[u8; 24]> {
    const UID_BASE: usize = 0x1FFF_7A10;
    let mut hex = [0u8; 24];
    for word in 0..3 {
        // SAFETY: the 96-bit unique id is three readable words at UID_BASE (RM0090 §39.1).
        let id = unsafe { core::ptr::read_volatile((UID_BASE + 4 * word) as *const u32) };
        for (i, digit) in hex.iter_mut().skip(8 * word).take(8).enumerate() {
            let nibble = ((id >> (28 - 4 * i)) & 0xF) as u8;
            *digit = if nibble < 10 {
                b'0' + nibble
            } else {
                b'a' + nibble - 10
            };
        }
    }
    Some(hex)
}

#[cfg(feature = "qemu")]
fn unique_id() -> Option<[u8; 24]> {
    None
}

// ------------------------------------------------------------------------------------
// Tick clock: TIM5, 32 bits, extended to 64 in software
// ------------------------------------------------------------------------------------

/// `(high word, last CNT seen)`: the software extension of TIM5 to 64 bits.
static CLOCK_EXTENSION: Mutex<Cell<(u32, u32)>> = Mutex::new(Cell::new((0, 0)));

/// The device clock: TIM5 free-running at [`TICK_HZ`], from power-on, as a `u64`.
///
/// The high word is kept by wrap detection: every [`TickClock::now`] compares CNT with
/// the last value seen, and a smaller one means one wrap. That needs a call at least once
/// per 2^32 ticks (51 s on silicon, 4.3 s under QEMU): TIM5's update interrupt, which
/// comes once per wrap, makes one. (An overflow counter alone would not do under QEMU,
/// whose TIM5 update interrupt is not aligned with CNT's wrap.)
#[derive(Debug, Clone, Copy)]
pub struct TickClock(());

impl TickClock {
    fn start(tim: pac::TIM5) -> TickClock {
        // The update interrupt keeps the 64-bit extension; on silicon the capture
        // interrupts of CH1-CH4 timestamp the trigger inputs (see `capture_inputs`).
        tim.dier().write(|w| {
            let w = w.uie().set_bit();
            if cfg!(feature = "qemu") {
                w
            } else {
                w.ccie(0)
                    .set_bit()
                    .ccie(1)
                    .set_bit()
                    .ccie(2)
                    .set_bit()
                    .ccie(3)
                    .set_bit()
            }
        });
        tim.cr1().write(|w| w.cen().set_bit());
        tim.arr().write(|w| w.arr().set(u32::MAX)); // last: arms QEMU's update alarm
                                                    // `tim` ends here: TIM5 is never written again, and `raw` only reads CNT.
        TickClock(())
    }

    /// TIM5's counter.
    fn raw() -> u32 {
        // SAFETY: a read of CNT, which has no side effect; TIM5 is configured once in
        // `start` and never written again.
        unsafe { (*pac::TIM5::ptr()).cnt().read().bits() }
    }

    /// Ticks since power-on. Callable from any context (takes a short critical section).
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

#[interrupt]
fn TIM5() {
    // SAFETY: TIM5 is written after `start` only here: SR's flags are write-0-to-clear,
    // and a write of all ones but one flag clears that flag alone. CCRx are read-only in
    // input mode; reading one clears its CCxIF.
    let tim = unsafe { &*pac::TIM5::ptr() };
    let sr = tim.sr().read();
    if sr.uif().bit_is_set() {
        tim.sr().write(|w| unsafe { w.bits(!1) });
    }
    let now = TickClock(()).now();
    #[cfg(not(feature = "qemu"))]
    for n in 0..4u8 {
        if sr.ccif(n).bit_is_clear() {
            continue;
        }
        let captured = tim.ccr(usize::from(n)).read().bits();
        let overcaptured = sr.ccof(n).bit_is_set();
        if overcaptured {
            tim.sr().write(|w| unsafe { w.bits(!(1 << (9 + n))) });
        }
        // The capture happened at most one wrap ago: count back from now.
        let tick = now - u64::from((now as u32).wrapping_sub(captured));
        // SAFETY: a read of IDR, no side effect. The level just after the edge gives its
        // polarity (both edges are captured); a pulse shorter than this interrupt's
        // latency reads wrong, which the README states.
        let rising = unsafe { (*pac::GPIOA::ptr()).idr().read().idr(n).bit_is_set() };
        if let Some(handler) = critical_section::with(|cs| EDGE_HANDLER.borrow(cs).get()) {
            handler(Capture {
                line: n,
                rising,
                tick,
                overcaptured,
            });
        }
    }
    let _ = now;
}

// ------------------------------------------------------------------------------------
// Trigger lines: inputs captured by TIM5 CH1-CH4, outputs on GPIOC
// ------------------------------------------------------------------------------------

/// Trigger inputs: PA0-PA3, TIM5 CH1-CH4 (AF2), both edges.
pub const TRIGGER_INPUTS: u8 = 4;
/// Trigger outputs: PC0 and PC1, push-pull, low at reset.
pub const TRIGGER_OUTPUTS: u8 = 2;

/// One captured edge of a trigger input.
#[derive(Debug, Clone, Copy)]
pub struct Capture {
    /// Input line, 0-3 (PA0-PA3).
    pub line: u8,
    /// Rising edge (the pin read high just after it).
    pub rising: bool,
    /// Tick of the edge, captured by the timer in hardware.
    pub tick: u64,
    /// An earlier edge on this line was overwritten before it was read: it is lost.
    pub overcaptured: bool,
}

#[cfg_attr(feature = "qemu", allow(dead_code))] // QEMU: no capture, no edges
static EDGE_HANDLER: EdgeSlot = Mutex::new(Cell::new(None));
type EdgeSlot = Mutex<Cell<Option<fn(Capture)>>>;

#[cfg_attr(feature = "qemu", allow(dead_code))]
/// Calls `handler` from the capture interrupt for every trigger-input edge.
pub fn on_trigger_edge(handler: fn(Capture)) {
    critical_section::with(|cs| EDGE_HANDLER.borrow(cs).set(Some(handler)));
}

/// TIM5 CH1-CH4 as input captures of TI1-TI4 on both edges, PA0-PA3 in AF2. Silicon
/// only: QEMU models no input capture (nor GPIO), so the image's self-test raises edges
/// there instead.
#[cfg(not(feature = "qemu"))]
fn capture_inputs(tim: &pac::TIM5, gpioa: &pac::GPIOA) {
    gpioa
        .afrl()
        .modify(|_, w| w.afrl0().af2().afrl1().af2().afrl2().af2().afrl3().af2());
    gpioa.moder().modify(|_, w| {
        w.moder0()
            .alternate()
            .moder1()
            .alternate()
            .moder2()
            .alternate()
            .moder3()
            .alternate()
    });
    tim.ccmr1_input().write(|w| w.cc1s().ti1().cc2s().ti2());
    tim.ccmr2_input().write(|w| w.cc3s().ti3().cc4s().ti4());
    tim.ccer().write(|w| {
        w.cc1e().set_bit().cc1p().set_bit().cc1np().set_bit();
        w.cc2e().set_bit().cc2p().set_bit().cc2np().set_bit();
        w.cc3e().set_bit().cc3p().set_bit().cc3np().set_bit();
        w.cc4e().set_bit().cc4p().set_bit().cc4np().set_bit()
    });
}

/// The trigger outputs, PC0 and PC1.
#[derive(Debug)]
pub struct TriggerOutputs {
    gpio: pac::GPIOC,
}

impl TriggerOutputs {
    fn new(gpio: pac::GPIOC) -> TriggerOutputs {
        gpio.bsrr().write(|w| w.br(0).set_bit().br(1).set_bit());
        gpio.moder()
            .modify(|_, w| w.moder0().output().moder1().output());
        TriggerOutputs { gpio }
    }

    /// Drives output `line` (0 or 1); `false` for a line that does not exist.
    pub fn set(&mut self, line: u8, high: bool) -> bool {
        if line >= TRIGGER_OUTPUTS {
            return false;
        }
        self.gpio.bsrr().write(|w| {
            if high {
                w.bs(line).set_bit()
            } else {
                w.br(line).set_bit()
            }
        });
        true
    }
}

// ------------------------------------------------------------------------------------
// Sample timer: TIM2 update interrupt, calls a handler at a fixed rate
// ------------------------------------------------------------------------------------

/// The function the sample interrupt calls.
static SAMPLE_HANDLER: HandlerSlot = Mutex::new(Cell::new(None));
type HandlerSlot = Mutex<Cell<Option<fn()>>>;

/// QEMU's timer interrupts every ARR ticks, silicon every ARR + 1.
const ARR_EXTRA: u32 = if cfg!(feature = "qemu") { 0 } else { 1 };
/// Shortest sample period accepted, in ticks (1.2 µs on silicon).
const MIN_PERIOD_TICKS: u32 = 100;

/// Why [`SampleTimer::start`] refused a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateError {
    /// Zero, or so fast that the period would be under 100 ticks.
    OutOfRange,
}

/// TIM2 (32 bits, counting at [`TICK_HZ`]): an interrupt every `TICK_HZ / rate` ticks
/// that calls a handler. The handler runs in interrupt context at priority
/// `PRIO_SAMPLE`; it must be short and share state only through critical sections or
/// lock-free queues.
#[derive(Debug)]
pub struct SampleTimer {
    tim: pac::TIM2,
}

impl SampleTimer {
    fn new(tim: pac::TIM2) -> SampleTimer {
        SampleTimer { tim }
    }

    /// Calls `handler` at `rate_hz` from now on (restarts if running). Returns the period
    /// in ticks, `TICK_HZ / rate_hz` rounded down: the exact rate is `TICK_HZ / period`.
    pub fn start(&mut self, rate_hz: u32, handler: fn()) -> Result<u32, RateError> {
        let period = TICK_HZ.checked_div(rate_hz).ok_or(RateError::OutOfRange)?;
        if period < MIN_PERIOD_TICKS {
            return Err(RateError::OutOfRange);
        }
        self.stop();
        critical_section::with(|cs| SAMPLE_HANDLER.borrow(cs).set(Some(handler)));
        self.tim.dier().write(|w| w.uie().set_bit());
        self.tim.cr1().write(|w| w.cen().set_bit());
        self.tim.arr().write(|w| w.arr().set(period - ARR_EXTRA)); // last: arms QEMU's alarm
        Ok(period)
    }

    /// Stops the interrupt. The handler is not called after this returns.
    pub fn stop(&mut self) {
        self.tim.cr1().write(|w| w.cen().clear_bit());
        self.tim.dier().write(|w| w.uie().clear_bit());
        self.tim.sr().write(|w| w.uif().clear());
        NVIC::unpend(Interrupt::TIM2);
        critical_section::with(|cs| SAMPLE_HANDLER.borrow(cs).set(None));
    }
}

#[interrupt]
fn TIM2() {
    // SAFETY: UIF clear only; `SampleTimer` owns TIM2 but never touches SR concurrently in
    // a way this could break (its `stop` clears the same flag).
    unsafe { (*pac::TIM2::ptr()).sr().write(|w| w.uif().clear()) };
    if let Some(handler) = critical_section::with(|cs| SAMPLE_HANDLER.borrow(cs).get()) {
        handler();
    }
}
