//! The AD7606C-16 on its 16-bit parallel interface, through the core's driver
//! (`railtrace_firmware::ad7606_parallel`), on the i.MX RT1062's fast GPIO ports GPIO6 and
//! GPIO7; the choice between the ADC and the test signal.
//!
//! Wiring (Teensy 4.1 pins → AD7606C-16):
//!
//! | ADC | pins | pads | port bits |
//! | --- | --- | --- | --- |
//! | DB0-DB2 | 19, 18, 14 | GPIO_AD_B1_00-02 | GPIO6 16-18 |
//! | DB3, DB4 | 36, 37 | GPIO_B1_02, _03 | GPIO7 18, 19 |
//! | DB5-DB15 | 41, 17, 16, 22, 23, 20, 21, 38, 39, 26, 27 | GPIO_AD_B1_05-15 | GPIO6 21-31 |
//! | CS, RD, WR | 10, 12, 11 | GPIO_B0_00, _01, _02 | GPIO7 0, 1, 2 |
//! | CONVST A/B | 9 | GPIO_B0_11 | GPIO7 11 |
//! | BUSY | 8 | GPIO_B1_00 | GPIO7 16 |
//! | RESET | 7 | GPIO_B1_01 | GPIO7 17 |
//!
//! GPIO_AD_B1_03 and _04 (pins 15 and 40, GPIO1/6 bits 19 and 20) stay the trigger inputs
//! on GPT2's hardware captures, the only capture inputs of the tick clock on the board's
//! pins; DB3 and DB4 come from GPIO7 instead, so a word is two port reads (both on the fast
//! GPIO, a few core cycles each) and a shift-and-mask.
//!
//! IOMUXC_GPR GPR26 and GPR27 route those pads to GPIO6 and GPIO7, the ports on the
//! core's tightly coupled bus, instead of GPIO1 and GPIO2 on the 150 MHz peripheral bus
//! (GPR26 bits 19 and 20 stay on GPIO1, whose pad status the capture interrupt reads).
//!
//! Timing on the wires, in core cycles at 600 MHz (1.67 ns): after RD falls, the bus is
//! sampled [`RD_ACCESS_CYCLES`] later; RD and WR stay high [`STROBE_CYCLES`] after each
//! strobe, WR and CONVST stay low as long. Each store to a line is completed (DSB) before
//! its wait starts.

use core::convert::Infallible;

use embedded_hal::digital::{ErrorType, InputPin, OutputPin};
use railtrace_firmware::ad7606_parallel::{
    self, Ad7606Parallel, ParallelBus, Pins, ALL_HIGH_BANDWIDTH,
};
use railtrace_firmware::hw::{Error as _, ErrorKind, SampleSource, CHANNELS};
use railtrace_firmware::test_signal::TestSignal;
use teensy4_bsp as bsp;

use bsp::hal::iomuxc;
use bsp::pins::{common, t41};
use bsp::ral;

/// Core cycles from RD falling to sampling DB15..DB0: 50 ns. The AD7606C-16's parallel
/// timing (data-access time, RD and WR pulse widths) has not been checked against its
/// data sheet yet; these waits are chosen long for an ADC of this family and are the
/// first thing to tighten once it is (README, "Rates").
pub const RD_ACCESS_CYCLES: u32 = 30;
/// Core cycles RD and WR are held high after a strobe (and WR, CONVST low): 25 ns.
pub const STROBE_CYCLES: u32 = 15;

/// GPIO6 bits carrying DB0-DB2 and DB5-DB15.
const DB_GPIO6: u32 = 0xFFE7_0000;
/// GPIO7 bits carrying DB3 and DB4.
const DB_GPIO7: u32 = 0x000C_0000;
const CS: u32 = 1 << 0;
const RD: u32 = 1 << 1;
const WR: u32 = 1 << 2;
const CONVST: u32 = 1 << 11;
const BUSY: u32 = 1 << 16;
const RESET: u32 = 1 << 17;
/// GPIO7 outputs.
const OUTPUTS: u32 = CS | RD | WR | CONVST | RESET;

fn gpio6() -> ral::gpio::GPIO6 {
    // SAFETY: GPIO6 is used by this module only, on the DB_GPIO6 bits, from one context
    // at a time (boot, then the sample interrupt).
    unsafe { ral::gpio::GPIO6::instance() }
}

fn gpio7() -> ral::gpio::GPIO7 {
    // SAFETY: as for GPIO6; nothing else uses GPIO7 (its bits here are routed to it by
    // `Pads::claim`, the others stay on GPIO2).
    unsafe { ral::gpio::GPIO7::instance() }
}

/// The word on DB15..DB0 from the two ports' pad status.
fn word_from(psr6: u32, psr7: u32) -> u16 {
    (((psr6 >> 16) & !0x18) | ((psr7 >> 15) & 0x18)) as u16
}

/// DB15..DB0, as the driver's data bus.
pub struct Bus(());

impl ParallelBus for Bus {
    type Error = Infallible;
    fn read(&mut self) -> Result<u16, Infallible> {
        cortex_m::asm::delay(RD_ACCESS_CYCLES);
        let psr6 = ral::read_reg!(ral::gpio, gpio6(), PSR);
        let psr7 = ral::read_reg!(ral::gpio, gpio7(), PSR);
        Ok(word_from(psr6, psr7))
    }
    fn drive(&mut self, word: u16) -> Result<(), Infallible> {
        let w = u32::from(word);
        let (set6, set7) = ((w << 16) & DB_GPIO6, (w << 15) & DB_GPIO7);
        let (g6, g7) = (gpio6(), gpio7());
        ral::write_reg!(ral::gpio, g6, DR_SET, set6);
        ral::write_reg!(ral::gpio, g6, DR_CLEAR, DB_GPIO6 & !set6);
        ral::write_reg!(ral::gpio, g7, DR_SET, set7);
        ral::write_reg!(ral::gpio, g7, DR_CLEAR, DB_GPIO7 & !set7);
        ral::modify_reg!(ral::gpio, g6, GDIR, |d| d | DB_GPIO6);
        ral::modify_reg!(ral::gpio, g7, GDIR, |d| d | DB_GPIO7);
        cortex_m::asm::dsb();
        Ok(())
    }
    fn release(&mut self) -> Result<(), Infallible> {
        ral::modify_reg!(ral::gpio, gpio6(), GDIR, |d| d & !DB_GPIO6);
        ral::modify_reg!(ral::gpio, gpio7(), GDIR, |d| d & !DB_GPIO7);
        cortex_m::asm::dsb();
        Ok(())
    }
}

/// A GPIO7 output, held for a number of core cycles after each edge.
pub struct Line {
    mask: u32,
    after_low: u32,
    after_high: u32,
}

impl Line {
    fn edge(&self, high: bool) {
        let g7 = gpio7();
        if high {
            ral::write_reg!(ral::gpio, g7, DR_SET, self.mask);
        } else {
            ral::write_reg!(ral::gpio, g7, DR_CLEAR, self.mask);
        }
        let hold = if high {
            self.after_high
        } else {
            self.after_low
        };
        if hold > 0 {
            cortex_m::asm::dsb();
            cortex_m::asm::delay(hold);
        }
    }
}

impl ErrorType for Line {
    type Error = Infallible;
}
impl OutputPin for Line {
    fn set_low(&mut self) -> Result<(), Infallible> {
        self.edge(false);
        Ok(())
    }
    fn set_high(&mut self) -> Result<(), Infallible> {
        self.edge(true);
        Ok(())
    }
}

/// BUSY, a GPIO7 input.
pub struct Busy(());
impl ErrorType for Busy {
    type Error = Infallible;
}
impl InputPin for Busy {
    fn is_high(&mut self) -> Result<bool, Infallible> {
        Ok(ral::read_reg!(ral::gpio, gpio7(), PSR) & BUSY != 0)
    }
    fn is_low(&mut self) -> Result<bool, Infallible> {
        Ok(ral::read_reg!(ral::gpio, gpio7(), PSR) & BUSY == 0)
    }
}

/// The ADC as this board drives it.
pub type Adc = Ad7606Parallel<Bus, Line, Busy, Line, Line, Line>;

/// The sample source: the ADC, or the test signal where there is none.
pub enum Source {
    /// The AD7606C-16.
    Adc(Adc),
    /// The built-in test signal.
    Test(TestSignal),
}

impl SampleSource for Source {
    type Error = ErrorKind;
    fn convert(&mut self) -> Result<[i16; CHANNELS], ErrorKind> {
        match self {
            Source::Adc(adc) => adc.convert().map_err(|e| e.kind()),
            Source::Test(t) => t.convert(),
        }
    }
    fn restart(&mut self) {
        if let Source::Test(t) = self {
            t.restart();
        }
    }
}

/// DB0-DB3: pins 19, 18, 14, 36.
pub type Db0To3 = (common::P19, common::P18, common::P14, t41::P36);
/// DB4-DB7: pins 37, 41, 17, 16.
pub type Db4To7 = (t41::P37, t41::P41, common::P17, common::P16);
/// DB8-DB11: pins 22, 23, 20, 21.
pub type Db8To11 = (common::P22, common::P23, common::P20, common::P21);
/// DB12-DB15: pins 38, 39, 26, 27.
pub type Db12To15 = (t41::P38, t41::P39, common::P26, common::P27);

/// The pads the ADC takes, each one owned here.
pub struct Pads {
    /// DB0..DB15.
    pub db: (Db0To3, Db4To7, Db8To11, Db12To15),
    /// CS, RD, WR: pins 10, 12, 11.
    pub cs_rd_wr: (common::P10, common::P12, common::P11),
    /// CONVST, BUSY, RESET: pins 9, 8, 7.
    pub convst_busy_reset: (common::P9, common::P8, common::P7),
}

/// Muxes a pad to its GPIO function (ALT5); which port serves it is GPR26/GPR27's choice.
fn to_gpio<P: iomuxc::gpio::Pin<N>, const N: u8>(mut pad: P) {
    iomuxc::gpio::prepare(&mut pad);
}

impl Pads {
    /// Sets the idle levels (CS, RD, WR, CONVST high, RESET low, the bus an input),
    /// routes the pads to GPIO6/GPIO7 and muxes them to GPIO.
    fn claim(self) {
        let ((d0, d1, d2, d3), (d4, d5, d6, d7), (d8, d9, d10, d11), (d12, d13, d14, d15)) =
            self.db;
        let (cs, rd, wr) = self.cs_rd_wr;
        let (convst, busy, reset) = self.convst_busy_reset;
        let (g6, g7) = (gpio6(), gpio7());
        ral::write_reg!(ral::gpio, g7, DR_SET, CS | RD | WR | CONVST);
        ral::write_reg!(ral::gpio, g7, DR_CLEAR, RESET);
        ral::modify_reg!(ral::gpio, g6, GDIR, |d| d & !DB_GPIO6);
        ral::modify_reg!(ral::gpio, g7, GDIR, |d| (d & !(DB_GPIO7 | BUSY)) | OUTPUTS);
        // SAFETY: GPR26/27 bits of the pads owned here only (read-modify-write, at boot).
        let gpr = unsafe { ral::iomuxc_gpr::IOMUXC_GPR::instance() };
        ral::modify_reg!(ral::iomuxc_gpr, gpr, GPR26, |v| v | DB_GPIO6);
        ral::modify_reg!(ral::iomuxc_gpr, gpr, GPR27, |v| v
            | DB_GPIO7
            | BUSY
            | OUTPUTS);
        to_gpio(d0);
        to_gpio(d1);
        to_gpio(d2);
        to_gpio(d3);
        to_gpio(d4);
        to_gpio(d5);
        to_gpio(d6);
        to_gpio(d7);
        to_gpio(d8);
        to_gpio(d9);
        to_gpio(d10);
        to_gpio(d11);
        to_gpio(d12);
        to_gpio(d13);
        to_gpio(d14);
        to_gpio(d15);
        to_gpio(cs);
        to_gpio(rd);
        to_gpio(wr);
        to_gpio(convst);
        to_gpio(busy);
        to_gpio(reset);
    }
}

/// What [`probe`] found.
pub struct Probe {
    /// The sample source.
    pub source: Source,
    /// Why the ADC is not the source, if it is not.
    pub adc_error: Option<ErrorKind>,
    /// Whether every channel reads back the 220 kHz bandwidth (software mode).
    pub high_bandwidth: bool,
}

/// Claims the pads, resets the ADC, sets every channel's 220 kHz bandwidth (software
/// mode) and tries one conversion: the ADC if it answers, the test signal otherwise.
pub fn probe(pads: Pads) -> Probe {
    pads.claim();
    // RESET: a high pulse; the AD7606C-16 asks at least 3 µs for a full reset and then
    // 253 µs before the first conversion (data sheet, t_RESET and t_DEVICE_SETUP). OS[2:0]
    // strapped high make the reset enter software mode.
    ral::write_reg!(ral::gpio, gpio7(), DR_SET, RESET);
    cortex_m::asm::delay(600 * 4);
    ral::write_reg!(ral::gpio, gpio7(), DR_CLEAR, RESET);
    cortex_m::asm::delay(600 * 300);

    let line = |mask, after_low, after_high| Line {
        mask,
        after_low,
        after_high,
    };
    let pins = Pins {
        convst: line(CONVST, STROBE_CYCLES, 0),
        busy: Busy(()),
        cs: line(CS, 0, 0),
        rd: line(RD, 0, STROBE_CYCLES),
        wr: line(WR, STROBE_CYCLES, STROBE_CYCLES),
    };
    let test = |e: ErrorKind| Probe {
        source: Source::Test(TestSignal::new()),
        adc_error: Some(e),
        high_bandwidth: false,
    };
    let mut adc = match Ad7606Parallel::new(Bus(()), pins) {
        Ok(adc) => adc,
        Err(e) => return test(e.kind()),
    };
    let high_bandwidth = match adc.set_bandwidth(ALL_HIGH_BANDWIDTH) {
        Ok(()) => true,
        Err(ad7606_parallel::Error::Readback { .. }) => false,
        Err(e) => return test(e.kind()),
    };
    match adc.convert() {
        Ok(_) => Probe {
            source: Source::Adc(adc),
            adc_error: None,
            high_bandwidth,
        },
        Err(e) => test(e.kind()),
    }
}
