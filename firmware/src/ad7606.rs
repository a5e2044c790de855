//! Driver for the Analog Devices AD7606 family (AD7606, AD7606-6, AD7606-4): 8
//! simultaneously sampled 16-bit channels, read over the serial interface.
//!
//! From the datasheet (AD7606 Rev. D):
//! - A conversion of all channels starts on the rising edge of CONVST A/B (tied together
//!   here, so all channels sample at once). CONVST must be low for at least 25 ns before.
//! - BUSY goes high within 40 ns of that edge and falls when the results are in the output
//!   registers: 3.45-4.15 µs without oversampling (much longer with OS pins set).
//! - In serial mode (PAR/SER/BYTE SEL high) CS low clocks the results out MSB first on
//!   DOUTA: V1 to V8, 16 bits each, two's complement, 128 SCLK cycles in all. The first bit
//!   appears on CS falling, the next ones on SCLK falling edges, so the MCU samples on the
//!   rising edge: SPI mode 3 (CPOL 1, CPHA 1).
//! - Codes: ±10 V range, 1 LSB = 20 V / 65536 = 305.2 µV; ±5 V range, 152.6 µV.
//!
//! The driver polls BUSY a bounded number of times, so a missing or stuck ADC gives an
//! error instead of a hang: BUSY that never rises means the part is not converting
//! ([`Error::BusyNeverRose`]); BUSY that never falls, a stuck conversion
//! ([`Error::BusyNeverFell`]).

use embedded_hal::digital::{self, InputPin, OutputPin};
use embedded_hal::spi::{self, SpiDevice};

use crate::hw::{self, ErrorKind, SampleSource, CHANNELS};

/// Why a conversion failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error<S> {
    /// The SPI read failed.
    Spi(S),
    /// Driving CONVST or reading BUSY failed.
    Pin(digital::ErrorKind),
    /// BUSY was never seen high after CONVST: the ADC is absent, unpowered or in reset.
    BusyNeverRose,
    /// BUSY rose but did not fall within the poll budget.
    BusyNeverFell,
}

impl<S: spi::Error> hw::Error for Error<S> {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Spi(_) | Error::Pin(_) => ErrorKind::Bus,
            Error::BusyNeverRose => ErrorKind::NotResponding,
            Error::BusyNeverFell => ErrorKind::Timeout,
        }
    }
}

/// Polls of BUSY allowed per conversion by default. At 168 MHz one poll is a few tens of
/// ns, so 2000 polls are well over the 4.15 µs conversion and well under a 10 µs sample
/// period's budget.
pub const DEFAULT_BUSY_POLLS: u32 = 2000;

/// An AD7606 on an SPI bus, with its CONVST output and BUSY input.
#[derive(Debug)]
pub struct Ad7606<SPI, CONVST, BUSY> {
    spi: SPI,
    convst: CONVST,
    busy: BUSY,
    busy_polls: u32,
}

impl<SPI, CONVST, BUSY> Ad7606<SPI, CONVST, BUSY>
where
    SPI: SpiDevice,
    CONVST: OutputPin,
    BUSY: InputPin,
{
    /// Takes the bus device and pins; CONVST is driven high (idle) at once.
    pub fn new(spi: SPI, mut convst: CONVST, busy: BUSY) -> Result<Self, Error<SPI::Error>> {
        convst.set_high().map_err(pin)?;
        Ok(Ad7606 {
            spi,
            convst,
            busy,
            busy_polls: DEFAULT_BUSY_POLLS,
        })
    }

    /// Sets how many times BUSY is polled before a conversion is declared failed.
    pub fn with_busy_polls(mut self, polls: u32) -> Self {
        self.busy_polls = polls.max(1);
        self
    }

    /// Gives back the bus device and pins.
    pub fn release(self) -> (SPI, CONVST, BUSY) {
        (self.spi, self.convst, self.busy)
    }

    /// Starts a conversion: CONVST low, then high (the rising edge samples all channels).
    pub fn start(&mut self) -> Result<(), Error<SPI::Error>> {
        self.convst.set_low().map_err(pin)?;
        self.convst.set_high().map_err(pin)
    }

    /// Waits, in bounded time, until BUSY has risen and fallen again.
    pub fn wait_ready(&mut self) -> Result<(), Error<SPI::Error>> {
        wait_busy(&mut self.busy, self.busy_polls).map_err(|e| match e {
            BusyWait::Pin(kind) => Error::Pin(kind),
            BusyWait::NeverRose => Error::BusyNeverRose,
            BusyWait::NeverFell => Error::BusyNeverFell,
        })
    }

    /// Reads the eight results of the last conversion (V1..V8).
    pub fn read(&mut self) -> Result<[i16; CHANNELS], Error<SPI::Error>> {
        let mut raw = [0u8; 2 * CHANNELS];
        self.spi.read(&mut raw).map_err(Error::Spi)?;
        let mut codes = [0i16; CHANNELS];
        for (code, pair) in codes.iter_mut().zip(raw.chunks_exact(2)) {
            if let [hi, lo] = *pair {
                *code = i16::from_be_bytes([hi, lo]);
            }
        }
        Ok(codes)
    }

    /// Starts a conversion, waits for it and reads it.
    pub fn convert(&mut self) -> Result<[i16; CHANNELS], Error<SPI::Error>> {
        self.start()?;
        self.wait_ready()?;
        self.read()
    }
}

fn pin<S, E: digital::Error>(e: E) -> Error<S> {
    Error::Pin(e.kind())
}

/// How a bounded wait for BUSY went wrong (shared with the parallel driver).
pub(crate) enum BusyWait {
    Pin(digital::ErrorKind),
    NeverRose,
    NeverFell,
}

/// Polls BUSY at most `polls` times until it has been seen high and then low again.
pub(crate) fn wait_busy<B: InputPin>(busy: &mut B, polls: u32) -> Result<(), BusyWait> {
    let mut seen_high = false;
    for _ in 0..polls {
        if busy
            .is_high()
            .map_err(|e| BusyWait::Pin(digital::Error::kind(&e)))?
        {
            seen_high = true;
        } else if seen_high {
            return Ok(());
        }
    }
    Err(if seen_high {
        BusyWait::NeverFell
    } else {
        BusyWait::NeverRose
    })
}

impl<SPI, CONVST, BUSY> SampleSource for Ad7606<SPI, CONVST, BUSY>
where
    SPI: SpiDevice,
    CONVST: OutputPin,
    BUSY: InputPin,
{
    type Error = Error<SPI::Error>;
    fn convert(&mut self) -> Result<[i16; CHANNELS], Self::Error> {
        Ad7606::convert(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedded_hal::spi::{ErrorType, Operation};
    use embedded_hal_mock::eh1::digital::{Mock as Pin, State, Transaction as PinTx};
    use embedded_hal_mock::eh1::spi::{Mock as Spi, Transaction as SpiTx};
    use embedded_hal_mock::eh1::MockError;

    /// CONVST: high at construction, then a low-high pulse per conversion.
    fn convst(conversions: usize) -> Vec<PinTx> {
        let mut t = vec![PinTx::set(State::High)];
        for _ in 0..conversions {
            t.extend([PinTx::set(State::Low), PinTx::set(State::High)]);
        }
        t
    }

    fn read_tx(bytes: Vec<u8>) -> Vec<SpiTx<u8>> {
        vec![
            SpiTx::transaction_start(),
            SpiTx::read_vec(bytes),
            SpiTx::transaction_end(),
        ]
    }

    #[test]
    fn converts_and_reads_eight_big_endian_twos_complement_codes() {
        let bytes = vec![
            0x00, 0x01, 0x7F, 0xFF, 0x80, 0x00, 0xFF, 0xFF, 0x12, 0x34, 0xED, 0xCC, 0x00, 0x00,
            0x40, 0x00,
        ];
        let mut spi = Spi::new(&read_tx(bytes));
        let mut cv = Pin::new(&convst(1));
        // BUSY: low before it rises (within 40 ns of CONVST), high while converting, low.
        let mut busy = Pin::new(&[
            PinTx::get(State::Low),
            PinTx::get(State::High),
            PinTx::get(State::High),
            PinTx::get(State::Low),
        ]);
        let mut adc = Ad7606::new(spi.clone(), cv.clone(), busy.clone()).unwrap();
        let codes = adc.convert().unwrap();
        assert_eq!(codes, [1, 32767, -32768, -1, 0x1234, -0x1234, 0, 16384]);
        spi.done();
        cv.done();
        busy.done();
    }

    #[test]
    fn busy_that_never_rises_is_not_responding() {
        let mut spi = Spi::new(&[]);
        let mut cv = Pin::new(&convst(1));
        let mut busy = Pin::new(&vec![PinTx::get(State::Low); 5]);
        let mut adc = Ad7606::new(spi.clone(), cv.clone(), busy.clone())
            .unwrap()
            .with_busy_polls(5);
        let err = adc.convert().unwrap_err();
        assert_eq!(err, Error::BusyNeverRose);
        assert_eq!(hw::Error::kind(&err), ErrorKind::NotResponding);
        spi.done();
        cv.done();
        busy.done();
    }

    #[test]
    fn busy_that_never_falls_times_out_without_reading() {
        let mut spi = Spi::new(&[]);
        let mut cv = Pin::new(&convst(1));
        let mut busy = Pin::new(&vec![PinTx::get(State::High); 7]);
        let mut adc = Ad7606::new(spi.clone(), cv.clone(), busy.clone())
            .unwrap()
            .with_busy_polls(7);
        let err = adc.convert().unwrap_err();
        assert_eq!(err, Error::BusyNeverFell);
        assert_eq!(hw::Error::kind(&err), ErrorKind::Timeout);
        spi.done();
        cv.done();
        busy.done();
    }

    #[test]
    fn pin_errors_are_reported_as_bus_errors() {
        let mut spi = Spi::new(&[]);
        let mut cv = Pin::new(&[
            PinTx::set(State::High),
            PinTx::set(State::Low).with_error(MockError::Io(std::io::ErrorKind::NotConnected)),
        ]);
        let mut busy = Pin::new(&[]);
        let mut adc = Ad7606::new(spi.clone(), cv.clone(), busy.clone()).unwrap();
        let err = adc.convert().unwrap_err();
        assert!(matches!(err, Error::Pin(_)));
        assert_eq!(hw::Error::kind(&err), ErrorKind::Bus);
        spi.done();
        cv.done();
        busy.done();
    }

    /// embedded-hal-mock 0.11 cannot script an SPI failure: a bus that always fails.
    struct BrokenBus;
    impl ErrorType for BrokenBus {
        type Error = spi::ErrorKind;
    }
    impl SpiDevice for BrokenBus {
        fn transaction(&mut self, _: &mut [Operation<'_, u8>]) -> Result<(), Self::Error> {
            Err(spi::ErrorKind::Overrun)
        }
    }

    #[test]
    fn spi_errors_are_reported_as_bus_errors() {
        let mut cv = Pin::new(&convst(1));
        let mut busy = Pin::new(&[PinTx::get(State::High), PinTx::get(State::Low)]);
        let mut adc = Ad7606::new(BrokenBus, cv.clone(), busy.clone()).unwrap();
        let err = SampleSource::convert(&mut adc).unwrap_err();
        assert_eq!(err, Error::Spi(spi::ErrorKind::Overrun));
        assert_eq!(hw::Error::kind(&err), ErrorKind::Bus);
        cv.done();
        busy.done();
    }
}
