//! The host link over the STM32F405's own USB: OTG_FS on PA11 (DM) and PA12 (DP), full
//! speed, as a CDC-ACM serial port through `railtrace-usb` (silicon builds without the
//! `usart` feature).
//!
//! The driver is synopsys-usb-otg (its `fs` mode), given the peripheral by the
//! [`UsbPeripheral`] description below (what stm32f4xx-hal's does for this chip: 320 words
//! of FIFO, 4 bidirectional endpoints). The core clocks OTG_FS from the PLL's Q output:
//! HSE 8 MHz / M 4 × N 168 / Q 7 = 48 MHz exactly ([`crate::board`]). VBUS sensing is off
//! (the driver sets NOVBUSSENS), so PA9 stays free and the rig is taken as attached while
//! powered; a self-powered rig enumerates when its cable is plugged in.
//!
//! USB is serviced from the main loop (no interrupt): usb-device needs a poll at least
//! every 10 ms, and the loop passes far more often than that.

use railtrace_usb::{Identity, Speed, UsbSerial};
use stm32f4::stm32f405 as pac;
use synopsys_usb_otg::{UsbBus, UsbPeripheral};
use usb_device::bus::UsbBusAllocator;

/// The transmit buffer: 16 full-speed packets.
pub const TX_BYTES: usize = 1024;

/// The host link's type.
pub type Link = UsbSerial<'static, UsbBus<OtgFs>, TX_BYTES>;

/// The OTG_FS peripheral, owned (its three register blocks), so nothing else touches it;
/// the driver reaches the registers through [`UsbPeripheral::REGISTERS`].
#[derive(Debug)]
#[allow(dead_code)] // held, never read
pub struct OtgFs {
    /// Global registers.
    pub global: pac::OTG_FS_GLOBAL,
    /// Device-mode registers.
    pub device: pac::OTG_FS_DEVICE,
    /// Power and clock gating.
    pub pwrclk: pac::OTG_FS_PWRCLK,
}

// SAFETY: the register blocks are used only by the driver, which serialises its accesses
// with a critical section.
unsafe impl Sync for OtgFs {}

// SAFETY: REGISTERS is the OTG_FS block of the STM32F405; the constants are its
// (RM0090 §34.2: 1.25 KiB of FIFO, 4 bidirectional endpoints with EP0).
unsafe impl UsbPeripheral for OtgFs {
    const REGISTERS: *const () = pac::OTG_FS_GLOBAL::PTR as *const ();
    const HIGH_SPEED: bool = false;
    const FIFO_DEPTH_WORDS: usize = 320;
    const ENDPOINT_COUNT: usize = 4;

    fn enable() {
        // SAFETY: read-modify-writes of the clock-enable and reset bits of OTG_FS only,
        // inside a critical section.
        let rcc = unsafe { &*pac::RCC::ptr() };
        cortex_m::interrupt::free(|_| {
            rcc.ahb2enr().modify(|_, w| w.otgfsen().set_bit());
            rcc.ahb2rstr().modify(|_, w| w.otgfsrst().set_bit());
            rcc.ahb2rstr().modify(|_, w| w.otgfsrst().clear_bit());
        });
    }

    fn ahb_frequency_hz(&self) -> u32 {
        crate::board::HCLK_HZ
    }
}

/// What the host is told: pid.codes' test vendor and product id (replace with an
/// allocated pair before building rigs for others), and the chip's unique id as serial.
fn identity(serial: &'static str) -> Identity {
    Identity {
        vendor_id: 0x1209,
        product_id: 0x0001,
        manufacturer: "railtrace",
        product: "railtrace rig (STM32F405)",
        serial,
    }
}

/// PA11/PA12 to OTG_FS (AF10). GPIOA's clock must be on.
pub fn pins(gpioa: &pac::GPIOA) {
    gpioa
        .afrh()
        .modify(|_, w| w.afrh11().af10().afrh12().af10());
    gpioa.ospeedr().modify(|_, w| {
        w.ospeedr11()
            .very_high_speed()
            .ospeedr12()
            .very_high_speed()
    });
    gpioa
        .moder()
        .modify(|_, w| w.moder11().alternate().moder12().alternate());
}

/// The USB device on OTG_FS. Call once, after the clocks (the PLL's 48 MHz output must
/// run) and [`pins`].
pub fn init(otg: OtgFs, serial: &'static str) -> Result<Link, railtrace_usb::SetupError> {
    #[allow(clippy::unwrap_used)] // first and only calls: cannot fail
    let (memory, alloc) = (
        cortex_m::singleton!(: [u32; 320] = [0; 320]).unwrap(),
        cortex_m::singleton!(: Option<UsbBusAllocator<UsbBus<OtgFs>>> = None).unwrap(),
    );
    let alloc: &'static UsbBusAllocator<UsbBus<OtgFs>> = alloc.insert(UsbBus::new(otg, memory));
    UsbSerial::new(alloc, Speed::Full, &identity(serial))
}
