//! The AD7606 on this board, through the core's driver (`railtrace_firmware::ad7606`):
//! embedded-hal 1.0 pins and an SPI device made from registers, and the choice between the
//! ADC and the built-in test signal.
//!
//! Wiring: SPI1 SCK PA5, MISO PA6 (DOUTA), MOSI PA7 (unused by the AD7606, left as AF5),
//! CS PA4; CONVST A/B PB0; BUSY PB1; RESET PB2. SPI mode 3 at APB2 / 4 = 21 MHz.
//!
//! At boot the ADC is reset and one conversion is tried. If BUSY never rises (no ADC, or
//! QEMU, which models no GPIO), the image samples the test signal instead and DeviceInfo
//! says so (`TEST_SIGNAL`).

use core::convert::Infallible;

use embedded_hal::digital::{ErrorType as PinErrorType, InputPin, OutputPin};
use embedded_hal::spi::{self, Operation, SpiDevice};
use railtrace_firmware::ad7606::Ad7606;
use railtrace_firmware::hw::{Error as _, ErrorKind, SampleSource, CHANNELS};
use railtrace_firmware::test_signal::TestSignal;
use stm32f4::stm32f405 as pac;

/// A pin of GPIOB (CONVST, BUSY, RESET).
#[derive(Debug)]
pub struct PortB(u8);

fn gpiob() -> &'static pac::gpiob::RegisterBlock {
    // SAFETY: GPIOB is used only through BSRR writes (atomic per bit) and IDR reads.
    unsafe { &*pac::GPIOB::ptr() }
}

impl PinErrorType for PortB {
    type Error = Infallible;
}
impl OutputPin for PortB {
    fn set_low(&mut self) -> Result<(), Infallible> {
        gpiob().bsrr().write(|w| w.br(self.0).set_bit());
        Ok(())
    }
    fn set_high(&mut self) -> Result<(), Infallible> {
        gpiob().bsrr().write(|w| w.bs(self.0).set_bit());
        Ok(())
    }
}
impl InputPin for PortB {
    fn is_high(&mut self) -> Result<bool, Infallible> {
        Ok(gpiob().idr().read().idr(self.0).bit_is_set())
    }
    fn is_low(&mut self) -> Result<bool, Infallible> {
        self.is_high().map(|h| !h)
    }
}

/// Why an SPI transfer failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpiTimeout;
impl spi::Error for SpiTimeout {
    fn kind(&self) -> spi::ErrorKind {
        spi::ErrorKind::Other
    }
}

/// SPI1 as a device with its chip select on PA4. Every wait is bounded.
#[derive(Debug)]
pub struct Spi1 {
    spi: pac::SPI1,
}

const SPI_POLLS: u32 = 10_000;

impl Spi1 {
    fn byte(&mut self, out: u8) -> Result<u8, SpiTimeout> {
        let mut polls = 0;
        while self.spi.sr().read().txe().bit_is_clear() {
            polls += 1;
            if polls > SPI_POLLS {
                return Err(SpiTimeout);
            }
        }
        self.spi.dr().write(|w| w.dr().set(u16::from(out)));
        while self.spi.sr().read().rxne().bit_is_clear() {
            polls += 1;
            if polls > SPI_POLLS {
                return Err(SpiTimeout);
            }
        }
        Ok(self.spi.dr().read().dr().bits() as u8)
    }

    fn select(&mut self, on: bool) {
        // SAFETY: PA4 is written only here, through BSRR (atomic per bit).
        let gpioa = unsafe { &*pac::GPIOA::ptr() };
        gpioa.bsrr().write(|w| {
            if on {
                w.br(4).set_bit()
            } else {
                w.bs(4).set_bit()
            }
        });
    }
}

impl spi::ErrorType for Spi1 {
    type Error = SpiTimeout;
}

impl SpiDevice for Spi1 {
    fn transaction(&mut self, operations: &mut [Operation<'_, u8>]) -> Result<(), SpiTimeout> {
        self.select(true);
        let mut result = Ok(());
        for op in operations.iter_mut() {
            result = match op {
                Operation::Read(buf) => buf.iter_mut().try_for_each(|b| {
                    *b = self.byte(0)?;
                    Ok(())
                }),
                Operation::Write(buf) => buf.iter().try_for_each(|&b| self.byte(b).map(|_| ())),
                Operation::Transfer(read, write) => {
                    let n = read.len().max(write.len());
                    (0..n).try_for_each(|i| {
                        let r = self.byte(write.get(i).copied().unwrap_or(0))?;
                        if let Some(slot) = read.get_mut(i) {
                            *slot = r;
                        }
                        Ok(())
                    })
                }
                Operation::TransferInPlace(buf) => buf.iter_mut().try_for_each(|b| {
                    *b = self.byte(*b)?;
                    Ok(())
                }),
                Operation::DelayNs(ns) => {
                    cortex_m::asm::delay(*ns / 6 + 1); // 168 MHz: ~6 ns a cycle
                    Ok(())
                }
            };
            if result.is_err() {
                break;
            }
        }
        self.select(false);
        result
    }
}

/// The sample source: the ADC, or the test signal where there is none.
#[derive(Debug)]
pub enum Source {
    /// The AD7606.
    Adc(Ad7606<Spi1, PortB, PortB>),
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

/// Sets up the pins and SPI1, resets the ADC and tries one conversion: the ADC if it
/// answers, the test signal otherwise (with why).
pub fn probe(
    rcc: &pac::RCC,
    gpioa: &pac::GPIOA,
    gpiob: &pac::GPIOB,
    spi: pac::SPI1,
) -> (Source, Option<ErrorKind>) {
    rcc.ahb1enr().modify(|_, w| w.gpioben().set_bit());
    rcc.apb2enr().modify(|_, w| w.spi1en().set_bit());
    cortex_m::asm::dsb();
    gpioa.bsrr().write(|w| w.bs(4).set_bit()); // CS idle high
    gpioa
        .afrl()
        .modify(|_, w| w.afrl5().af5().afrl6().af5().afrl7().af5());
    gpioa.moder().modify(|_, w| {
        w.moder4()
            .output()
            .moder5()
            .alternate()
            .moder6()
            .alternate()
            .moder7()
            .alternate()
    });
    gpiob.bsrr().write(|w| w.bs(0).set_bit().br(2).set_bit()); // CONVST high, RESET low
    gpiob
        .moder()
        .modify(|_, w| w.moder0().output().moder1().input().moder2().output());
    // Mode 3, master, 8-bit frames, software chip select, f_PCLK2 / 4 = 21 MHz.
    spi.cr1().write(|w| {
        w.cpol()
            .set_bit()
            .cpha()
            .set_bit()
            .mstr()
            .set_bit()
            .br()
            .div4()
            .ssm()
            .set_bit()
            .ssi()
            .set_bit()
            .spe()
            .set_bit()
    });
    // RESET: a high pulse of at least 50 ns (AD7606 datasheet, t_RESET).
    gpiob.bsrr().write(|w| w.bs(2).set_bit());
    cortex_m::asm::delay(32);
    gpiob.bsrr().write(|w| w.br(2).set_bit());

    let adc = match Ad7606::new(Spi1 { spi }, PortB(0), PortB(1)) {
        Ok(adc) => adc,
        Err(e) => return (Source::Test(TestSignal::new()), Some(e.kind())),
    };
    let mut adc = adc;
    match adc.convert() {
        Ok(_) => (Source::Adc(adc), None),
        Err(e) => (Source::Test(TestSignal::new()), Some(e.kind())),
    }
}
