//! USART1 as a byte link (PA9 TX, PA10 RX, 8N1), with the `embedded-io` 0.6 traits.
//!
//! Receive is interrupt driven: the RXNE interrupt moves each byte into a lock-free queue
//! of [`RX_CAPACITY`] bytes, so nothing is lost while the main loop is busy (for up to
//! `RX_CAPACITY` byte times: 5.5 ms at 921600 baud). Transmit polls TXE.

use core::convert::Infallible;
use core::sync::atomic::{AtomicU32, Ordering};

use core::cell::RefCell;
use critical_section::Mutex;
use heapless::spsc::{Consumer, Producer, Queue};
use stm32f4::stm32f405::{self as pac, interrupt};

/// Bytes the receive queue holds.
pub const RX_CAPACITY: usize = 511;
type RxQueue = Queue<u8, { RX_CAPACITY + 1 }>;

/// The interrupt's end of the receive queue, installed by [`Serial::init`].
static RX_PRODUCER: Mutex<RefCell<Option<Producer<'static, u8, { RX_CAPACITY + 1 }>>>> =
    Mutex::new(RefCell::new(None));
/// Bytes lost on receive: the queue was full, or the USART overran (ORE).
static RX_LOST: AtomicU32 = AtomicU32::new(0);

/// USART1, owned. Reading takes bytes from the receive queue; writing blocks on TXE.
pub struct Serial {
    usart: pac::USART1,
    rx: Consumer<'static, u8, { RX_CAPACITY + 1 }>,
}

impl core::fmt::Debug for Serial {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Serial")
            .field("rx_pending", &self.rx.len())
            .finish_non_exhaustive()
    }
}

impl Serial {
    /// Sets up PA9/PA10 (AF7) and USART1 at `baud` from a `pclk_hz` peripheral clock, and
    /// enables its receive interrupt in the peripheral (the NVIC is up to the caller).
    /// The RCC clock enables for USART1 and GPIOA must already be on.
    pub(crate) fn init(usart: pac::USART1, gpioa: &pac::GPIOA, pclk_hz: u32, baud: u32) -> Serial {
        gpioa.afrh().modify(|_, w| w.afrh9().af7().afrh10().af7());
        gpioa.ospeedr().modify(|_, w| w.ospeedr9().high_speed());
        gpioa.pupdr().modify(|_, w| w.pupdr10().pull_up()); // idle-high RX if unplugged
        gpioa
            .moder()
            .modify(|_, w| w.moder9().alternate().moder10().alternate());

        #[allow(clippy::unwrap_used)] // first and only call, from `Board::init`
        let queue: &'static mut RxQueue = cortex_m::singleton!(: RxQueue = Queue::new()).unwrap();
        let (producer, rx) = queue.split();
        critical_section::with(|cs| RX_PRODUCER.borrow(cs).replace(Some(producer)));

        // Oversampling by 16: BRR = pclk / baud, rounded (mantissa and fraction together).
        let brr = ((pclk_hz + baud / 2) / baud).min(0xFFFF) as u16;
        // SAFETY: any 16-bit BRR value is a valid divider; the reset value of the rest.
        usart.brr().write(|w| unsafe { w.bits(brr) });
        usart.cr2().reset(); // 1 stop bit
        usart.cr3().reset(); // no flow control, no DMA
        usart.cr1().write(|w| {
            w.ue()
                .set_bit()
                .te()
                .set_bit()
                .re()
                .set_bit()
                .rxneie()
                .set_bit()
        });
        Serial { usart, rx }
    }

    /// Bytes lost on receive since boot (queue full or USART overrun). Not reported by
    /// the smoke loop (the protocol has no field for it); for the core.
    #[allow(dead_code)]
    pub fn rx_lost(&self) -> u32 {
        RX_LOST.load(Ordering::Relaxed)
    }
}

#[interrupt]
fn USART1() {
    // SAFETY: SR then DR reads only. They clear RXNE and ORE, which nothing else uses;
    // `Serial` touches SR only to read TXE and TC.
    let usart = unsafe { &*pac::USART1::ptr() };
    let sr = usart.sr().read();
    if sr.rxne().bit_is_set() || sr.ore().bit_is_set() {
        let byte = usart.dr().read().dr().bits() as u8;
        if sr.ore().bit_is_set() {
            RX_LOST.fetch_add(1, Ordering::Relaxed);
        }
        let queued = critical_section::with(|cs| {
            RX_PRODUCER
                .borrow_ref_mut(cs)
                .as_mut()
                .is_some_and(|p| p.enqueue(byte).is_ok())
        });
        if !queued {
            RX_LOST.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl embedded_io::ErrorType for Serial {
    type Error = Infallible;
}

impl embedded_io::Read for Serial {
    /// Waits (sleeping) until at least one byte has arrived, then returns what is queued,
    /// up to `buf.len()`.
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        if buf.is_empty() {
            return Ok(0);
        }
        // WFI with interrupts masked: an interrupt that comes after the check still wakes
        // the core, and runs once they are unmasked.
        while !self.rx.ready() {
            cortex_m::interrupt::free(|_| {
                if !self.rx.ready() {
                    cortex_m::asm::wfi();
                }
            });
        }
        let mut n = 0;
        for slot in buf.iter_mut() {
            match self.rx.dequeue() {
                Some(b) => *slot = b,
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }
}

impl embedded_io::ReadReady for Serial {
    fn read_ready(&mut self) -> Result<bool, Infallible> {
        Ok(self.rx.ready())
    }
}

impl embedded_io::Write for Serial {
    /// Writes all of `buf`, waiting for TXE before each byte.
    fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        for &b in buf {
            while self.usart.sr().read().txe().bit_is_clear() {}
            self.usart.dr().write(|w| w.dr().set(u16::from(b)));
        }
        Ok(buf.len())
    }

    /// Waits until the last byte has left the shift register (TC).
    fn flush(&mut self) -> Result<(), Infallible> {
        while self.usart.sr().read().tc().bit_is_clear() {}
        Ok(())
    }
}

impl embedded_io::WriteReady for Serial {
    fn write_ready(&mut self) -> Result<bool, Infallible> {
        Ok(self.usart.sr().read().txe().bit_is_set())
    }
}
