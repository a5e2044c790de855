//! Driver for the AD7606 family read through its 16-bit parallel interface (PAR/SER SEL
//! low): the same sample source as [`crate::ad7606`], at a fraction of the serial read's
//! cost, plus the AD7606C's software-mode register writes (its per-channel analog
//! bandwidth).
//!
//! Reading a conversion: CONVST low then high starts it, BUSY rises and falls as in serial
//! mode; then, with CS low, each falling edge of RD puts the next result on DB15..DB0, V1
//! first and V8 last, 16-bit two's complement. The data-access and pulse-width times
//! after each RD edge are the board's to respect (its [`ParallelBus::read`] waits the
//! access time, its RD pin the pulse widths); this driver only orders the edges.
//!
//! Registers (AD7606B/AD7606C software mode, entered when OS[2:0] are all high at reset):
//! a write is one word on DB15..DB0 latched by a WR strobe with CS low, bit 15 clear
//! (write), bits 14..8 the register address, bits 7..0 the value. A read is the same word
//! with bit 15 set, then an RD strobe that returns the value on DB7..DB0. Writing register
//! 0 returns the part to reading conversions.
//!
//! Every wait is bounded: BUSY is polled a fixed number of times, as in the serial driver.

use embedded_hal::digital::{self, InputPin, OutputPin};

use crate::ad7606::{wait_busy, BusyWait, DEFAULT_BUSY_POLLS};
use crate::hw::{self, ErrorKind, SampleSource, CHANNELS};

/// The 16 data lines DB15..DB0 (DB0 is bit 0).
pub trait ParallelBus {
    /// Why the bus could not be read or driven.
    type Error: core::fmt::Debug;
    /// Samples DB15..DB0. Called with CS and RD low; waits the part's data-access time
    /// after RD fell before it samples.
    fn read(&mut self) -> Result<u16, Self::Error>;
    /// Makes DB15..DB0 outputs driving `word` (for a register write).
    fn drive(&mut self, word: u16) -> Result<(), Self::Error>;
    /// Makes DB15..DB0 inputs again.
    fn release(&mut self) -> Result<(), Self::Error>;
}

/// Why a conversion or register access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error<B> {
    /// The data bus could not be read or driven.
    Bus(B),
    /// Driving CONVST, CS, RD or WR, or reading BUSY, failed.
    Pin(digital::ErrorKind),
    /// BUSY was never seen high after CONVST: the ADC is absent, unpowered or in reset.
    BusyNeverRose,
    /// BUSY rose but did not fall within the poll budget.
    BusyNeverFell,
    /// A register read back differently from what was written: the part is in hardware
    /// mode (OS[2:0] not all high at reset), or is not an AD7606B/C.
    Readback {
        /// Register address.
        register: u8,
        /// Value written.
        wrote: u8,
        /// Value read back.
        read: u8,
    },
}

impl<B: core::fmt::Debug> hw::Error for Error<B> {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Bus(_) | Error::Pin(_) => ErrorKind::Bus,
            Error::BusyNeverRose | Error::Readback { .. } => ErrorKind::NotResponding,
            Error::BusyNeverFell => ErrorKind::Timeout,
        }
    }
}

/// The AD7606C's BANDWIDTH register: bit n set gives channel V(n+1) the 220 kHz analog
/// bandwidth, clear the 25 kHz one.
pub const REG_BANDWIDTH: u8 = 0x07;
/// BANDWIDTH value with every channel at 220 kHz.
pub const ALL_HIGH_BANDWIDTH: u8 = 0xFF;

/// The control pins: CONVST A/B (tied), BUSY, CS, RD and WR.
#[derive(Debug)]
pub struct Pins<CONVST, BUSY, CS, RD, WR> {
    /// CONVST A and B, output; idle high, the rising edge samples.
    pub convst: CONVST,
    /// BUSY, input.
    pub busy: BUSY,
    /// Chip select, output, idle high.
    pub cs: CS,
    /// Read strobe, output, idle high.
    pub rd: RD,
    /// Write strobe, output, idle high (register writes only).
    pub wr: WR,
}

/// An AD7606 on its parallel interface.
#[derive(Debug)]
pub struct Ad7606Parallel<BUS, CONVST, BUSY, CS, RD, WR> {
    bus: BUS,
    pins: Pins<CONVST, BUSY, CS, RD, WR>,
    busy_polls: u32,
}

impl<BUS, CONVST, BUSY, CS, RD, WR> Ad7606Parallel<BUS, CONVST, BUSY, CS, RD, WR>
where
    BUS: ParallelBus,
    CONVST: OutputPin,
    BUSY: InputPin,
    CS: OutputPin,
    RD: OutputPin,
    WR: OutputPin,
{
    /// Takes the bus and pins; CONVST, CS, RD and WR are driven high (idle) at once.
    pub fn new(
        bus: BUS,
        mut pins: Pins<CONVST, BUSY, CS, RD, WR>,
    ) -> Result<Self, Error<BUS::Error>> {
        pins.convst.set_high().map_err(pin)?;
        pins.cs.set_high().map_err(pin)?;
        pins.rd.set_high().map_err(pin)?;
        pins.wr.set_high().map_err(pin)?;
        Ok(Ad7606Parallel {
            bus,
            pins,
            busy_polls: DEFAULT_BUSY_POLLS,
        })
    }

    /// Sets how many times BUSY is polled before a conversion is declared failed.
    pub fn with_busy_polls(mut self, polls: u32) -> Self {
        self.busy_polls = polls.max(1);
        self
    }

    /// Gives back the bus and pins.
    pub fn release(self) -> (BUS, Pins<CONVST, BUSY, CS, RD, WR>) {
        (self.bus, self.pins)
    }

    /// Starts a conversion: CONVST low, then high (the rising edge samples all channels).
    pub fn start(&mut self) -> Result<(), Error<BUS::Error>> {
        self.pins.convst.set_low().map_err(pin)?;
        self.pins.convst.set_high().map_err(pin)
    }

    /// Waits, in bounded time, until BUSY has risen and fallen again.
    pub fn wait_ready(&mut self) -> Result<(), Error<BUS::Error>> {
        wait_busy(&mut self.pins.busy, self.busy_polls).map_err(|e| match e {
            BusyWait::Pin(kind) => Error::Pin(kind),
            BusyWait::NeverRose => Error::BusyNeverRose,
            BusyWait::NeverFell => Error::BusyNeverFell,
        })
    }

    /// Reads the eight results of the last conversion (V1..V8): CS low, eight RD strobes,
    /// CS high. After a failure CS and RD are returned high as far as they can be.
    pub fn read(&mut self) -> Result<[i16; CHANNELS], Error<BUS::Error>> {
        let result = self.read_frame();
        if result.is_err() {
            let _ = self.pins.rd.set_high();
            let _ = self.pins.cs.set_high();
        }
        result
    }

    fn read_frame(&mut self) -> Result<[i16; CHANNELS], Error<BUS::Error>> {
        let mut codes = [0i16; CHANNELS];
        self.pins.cs.set_low().map_err(pin)?;
        for code in codes.iter_mut() {
            *code = self.strobe_read()? as i16;
        }
        self.pins.cs.set_high().map_err(pin)?;
        Ok(codes)
    }

    /// One RD strobe (CS already low): the word on the bus while RD is low.
    fn strobe_read(&mut self) -> Result<u16, Error<BUS::Error>> {
        self.pins.rd.set_low().map_err(pin)?;
        let word = self.bus.read().map_err(Error::Bus)?;
        self.pins.rd.set_high().map_err(pin)?;
        Ok(word)
    }

    /// Starts a conversion, waits for it and reads it.
    pub fn convert(&mut self) -> Result<[i16; CHANNELS], Error<BUS::Error>> {
        self.start()?;
        self.wait_ready()?;
        self.read()
    }

    /// One WR strobe of `word` (CS already low), the bus released after it.
    fn strobe_write(&mut self, word: u16) -> Result<(), Error<BUS::Error>> {
        self.bus.drive(word).map_err(Error::Bus)?;
        let strobe = self
            .pins
            .wr
            .set_low()
            .and_then(|()| self.pins.wr.set_high())
            .map_err(pin);
        let released = self.bus.release().map_err(Error::Bus);
        strobe.and(released)
    }

    /// Writes `value` to register `register` (software mode).
    pub fn write_register(&mut self, register: u8, value: u8) -> Result<(), Error<BUS::Error>> {
        let word = (u16::from(register & 0x7F) << 8) | u16::from(value);
        self.pins.cs.set_low().map_err(pin)?;
        let written = self.strobe_write(word);
        let deselected = self.pins.cs.set_high().map_err(pin);
        written.and(deselected)
    }

    /// Reads register `register` (software mode): the read command on WR, then the value
    /// on DB7..DB0 at the next RD strobe, within one CS frame.
    pub fn read_register(&mut self, register: u8) -> Result<u8, Error<BUS::Error>> {
        let word = 0x8000 | (u16::from(register & 0x7F) << 8);
        self.pins.cs.set_low().map_err(pin)?;
        let value = self.strobe_write(word).and_then(|()| self.strobe_read());
        if value.is_err() {
            let _ = self.pins.rd.set_high();
        }
        let deselected = self.pins.cs.set_high().map_err(pin);
        let value = value?;
        deselected?;
        Ok((value & 0xFF) as u8)
    }

    /// Sets the analog bandwidth of every channel (bit n of `mask` for V(n+1): 1 is
    /// 220 kHz, 0 is 25 kHz), checks it by reading it back, and returns the part to
    /// reading conversions (a write to register 0) whatever the check found. Needs
    /// software mode: in hardware mode the read-back does not match and nothing changed.
    pub fn set_bandwidth(&mut self, mask: u8) -> Result<(), Error<BUS::Error>> {
        let checked = self
            .write_register(REG_BANDWIDTH, mask)
            .and_then(|()| self.read_register(REG_BANDWIDTH))
            .and_then(|read| {
                if read == mask {
                    Ok(())
                } else {
                    Err(Error::Readback {
                        register: REG_BANDWIDTH,
                        wrote: mask,
                        read,
                    })
                }
            });
        let back = self.write_register(0, 0);
        checked.and(back)
    }
}

fn pin<B, E: digital::Error>(e: E) -> Error<B> {
    Error::Pin(e.kind())
}

impl<BUS, CONVST, BUSY, CS, RD, WR> SampleSource for Ad7606Parallel<BUS, CONVST, BUSY, CS, RD, WR>
where
    BUS: ParallelBus,
    CONVST: OutputPin,
    BUSY: InputPin,
    CS: OutputPin,
    RD: OutputPin,
    WR: OutputPin,
{
    type Error = Error<BUS::Error>;
    fn convert(&mut self) -> Result<[i16; CHANNELS], Self::Error> {
        Ad7606Parallel::convert(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedded_hal_mock::eh1::digital::{Mock as Pin, State, Transaction as PinTx};
    use embedded_hal_mock::eh1::MockError;
    use std::collections::VecDeque;

    /// What the scripted bus saw.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Op {
        Read(u16),
        Drive(u16),
        Release,
    }

    /// A data bus that answers reads from a script (`Err` entries fail) and logs every
    /// operation.
    #[derive(Debug, Default)]
    struct ScriptedBus {
        words: VecDeque<Result<u16, &'static str>>,
        log: Vec<Op>,
    }

    impl ScriptedBus {
        fn new(words: &[u16]) -> Self {
            ScriptedBus {
                words: words.iter().map(|&w| Ok(w)).collect(),
                log: Vec::new(),
            }
        }
    }

    impl ParallelBus for ScriptedBus {
        type Error = &'static str;
        fn read(&mut self) -> Result<u16, &'static str> {
            let word = self
                .words
                .pop_front()
                .unwrap_or(Err("read past the script"))?;
            self.log.push(Op::Read(word));
            Ok(word)
        }
        fn drive(&mut self, word: u16) -> Result<(), &'static str> {
            self.log.push(Op::Drive(word));
            Ok(())
        }
        fn release(&mut self) -> Result<(), &'static str> {
            self.log.push(Op::Release);
            Ok(())
        }
    }

    struct Mocks {
        convst: Pin,
        busy: Pin,
        cs: Pin,
        rd: Pin,
        wr: Pin,
    }

    impl Mocks {
        fn new(convst: &[PinTx], busy: &[PinTx], cs: &[PinTx], rd: &[PinTx], wr: &[PinTx]) -> Self {
            Mocks {
                convst: Pin::new(convst),
                busy: Pin::new(busy),
                cs: Pin::new(cs),
                rd: Pin::new(rd),
                wr: Pin::new(wr),
            }
        }
        fn pins(&self) -> Pins<Pin, Pin, Pin, Pin, Pin> {
            Pins {
                convst: self.convst.clone(),
                busy: self.busy.clone(),
                cs: self.cs.clone(),
                rd: self.rd.clone(),
                wr: self.wr.clone(),
            }
        }
        fn done(&mut self) {
            self.convst.done();
            self.busy.done();
            self.cs.done();
            self.rd.done();
            self.wr.done();
        }
    }

    fn high() -> PinTx {
        PinTx::set(State::High)
    }
    fn low() -> PinTx {
        PinTx::set(State::Low)
    }
    /// Idle high at construction, then `pulses` low-high pulses.
    fn pulses(n: usize) -> Vec<PinTx> {
        let mut t = vec![high()];
        for _ in 0..n {
            t.extend([low(), high()]);
        }
        t
    }
    /// BUSY as a conversion shows it: low, high while converting, low.
    fn busy_ok() -> Vec<PinTx> {
        vec![
            PinTx::get(State::Low),
            PinTx::get(State::High),
            PinTx::get(State::High),
            PinTx::get(State::Low),
        ]
    }
    fn io_error() -> MockError {
        MockError::Io(std::io::ErrorKind::NotConnected)
    }

    #[test]
    fn converts_and_reads_eight_words_in_channel_order() {
        let words = [
            0x0001, 0x7FFF, 0x8000, 0xFFFF, 0x1234, 0xEDCC, 0x0000, 0x4000,
        ];
        let mut m = Mocks::new(&pulses(1), &busy_ok(), &pulses(1), &pulses(8), &pulses(0));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&words), m.pins()).unwrap();
        let codes = adc.convert().unwrap();
        assert_eq!(codes, [1, 32767, -32768, -1, 0x1234, -0x1234, 0, 16384]);
        let (bus, _) = adc.release();
        assert_eq!(bus.log, words.map(Op::Read).to_vec());
        assert!(bus.words.is_empty());
        m.done();
    }

    #[test]
    fn consecutive_conversions_read_their_own_words() {
        let words: Vec<u16> = (0..16).collect();
        let busy: Vec<PinTx> = [busy_ok(), busy_ok()].concat();
        let mut m = Mocks::new(&pulses(2), &busy, &pulses(2), &pulses(16), &pulses(0));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&words), m.pins()).unwrap();
        assert_eq!(
            SampleSource::convert(&mut adc).unwrap(),
            [0, 1, 2, 3, 4, 5, 6, 7]
        );
        assert_eq!(
            SampleSource::convert(&mut adc).unwrap(),
            [8, 9, 10, 11, 12, 13, 14, 15]
        );
        m.done();
    }

    #[test]
    fn busy_that_never_rises_is_not_responding_and_reads_nothing() {
        let busy = vec![PinTx::get(State::Low); 5];
        let mut m = Mocks::new(&pulses(1), &busy, &pulses(0), &pulses(0), &pulses(0));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&[]), m.pins())
            .unwrap()
            .with_busy_polls(5);
        let err = adc.convert().unwrap_err();
        assert_eq!(err, Error::BusyNeverRose);
        assert_eq!(hw::Error::kind(&err), ErrorKind::NotResponding);
        let (bus, _) = adc.release();
        assert!(bus.log.is_empty());
        m.done();
    }

    #[test]
    fn busy_that_never_falls_times_out_without_reading() {
        let busy = vec![PinTx::get(State::High); 7];
        let mut m = Mocks::new(&pulses(1), &busy, &pulses(0), &pulses(0), &pulses(0));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&[]), m.pins())
            .unwrap()
            .with_busy_polls(7);
        let err = adc.convert().unwrap_err();
        assert_eq!(err, Error::BusyNeverFell);
        assert_eq!(hw::Error::kind(&err), ErrorKind::Timeout);
        let (bus, _) = adc.release();
        assert!(bus.log.is_empty());
        m.done();
    }

    #[test]
    fn convst_errors_are_bus_errors() {
        let convst = [high(), low().with_error(io_error())];
        let mut m = Mocks::new(&convst, &[], &pulses(0), &pulses(0), &pulses(0));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&[]), m.pins()).unwrap();
        let err = adc.convert().unwrap_err();
        assert!(matches!(err, Error::Pin(_)));
        assert_eq!(hw::Error::kind(&err), ErrorKind::Bus);
        m.done();
    }

    #[test]
    fn an_rd_error_mid_frame_stops_the_read_and_deselects() {
        // RD fails on the third strobe's falling edge; the driver then drives RD and CS
        // high again.
        let rd = [
            high(),
            low(),
            high(),
            low(),
            high(),
            low().with_error(io_error()),
            high(),
        ];
        let cs = [high(), low(), high()];
        let mut m = Mocks::new(&pulses(1), &busy_ok(), &cs, &rd, &pulses(0));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&[10, 20, 30]), m.pins()).unwrap();
        let err = adc.convert().unwrap_err();
        assert!(matches!(err, Error::Pin(_)));
        let (bus, _) = adc.release();
        assert_eq!(bus.log, vec![Op::Read(10), Op::Read(20)]);
        m.done();
    }

    #[test]
    fn a_bus_error_is_reported_and_the_part_deselected() {
        let mut bus = ScriptedBus::new(&[1, 2]);
        bus.words.push_back(Err("bus fault"));
        // Third strobe: RD low, the bus fails, then RD and CS go high (cleanup).
        let rd = [high(), low(), high(), low(), high(), low(), high()];
        let cs = [high(), low(), high()];
        let mut m = Mocks::new(&pulses(1), &busy_ok(), &cs, &rd, &pulses(0));
        let mut adc = Ad7606Parallel::new(bus, m.pins()).unwrap();
        let err = adc.convert().unwrap_err();
        assert_eq!(err, Error::Bus("bus fault"));
        assert_eq!(hw::Error::kind(&err), ErrorKind::Bus);
        m.done();
    }

    #[test]
    fn construction_reports_a_pin_that_cannot_be_driven() {
        let cs = [high().with_error(io_error())];
        let mut m = Mocks::new(&[high()], &[], &cs, &[], &[]);
        let err = Ad7606Parallel::new(ScriptedBus::new(&[]), m.pins()).unwrap_err();
        assert!(matches!(err, Error::Pin(_)));
        m.done();
    }

    #[test]
    fn sets_all_channels_to_high_bandwidth_checks_it_and_returns_to_adc_mode() {
        // Three CS frames: write BANDWIDTH, read it back, write register 0.
        // WR strobes once per frame; RD once, in the read-back frame.
        let mut m = Mocks::new(&pulses(0), &[], &pulses(3), &pulses(1), &pulses(3));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&[0x07FF]), m.pins()).unwrap();
        adc.set_bandwidth(ALL_HIGH_BANDWIDTH).unwrap();
        let (bus, _) = adc.release();
        assert_eq!(
            bus.log,
            vec![
                Op::Drive(0x07FF), // write, register 7, value 0xFF
                Op::Release,
                Op::Drive(0x8700), // read command, register 7
                Op::Release,
                Op::Read(0x07FF),  // the value on DB7..DB0
                Op::Drive(0x0000), // register 0: back to conversions
                Op::Release,
            ]
        );
        m.done();
    }

    #[test]
    fn a_bandwidth_that_does_not_read_back_is_reported_after_returning_to_adc_mode() {
        // In hardware mode the write is ignored; the read-back shows the bus, not 0xFF.
        let mut m = Mocks::new(&pulses(0), &[], &pulses(3), &pulses(1), &pulses(3));
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&[0x1200]), m.pins()).unwrap();
        let err = adc.set_bandwidth(ALL_HIGH_BANDWIDTH).unwrap_err();
        assert_eq!(
            err,
            Error::Readback {
                register: REG_BANDWIDTH,
                wrote: 0xFF,
                read: 0x00
            }
        );
        assert_eq!(hw::Error::kind(&err), ErrorKind::NotResponding);
        let (bus, _) = adc.release();
        assert_eq!(bus.log.last(), Some(&Op::Release));
        assert!(bus.log.contains(&Op::Drive(0x0000)));
        m.done();
    }

    #[test]
    fn a_wr_error_still_releases_the_bus_and_deselects() {
        let wr = [high(), low().with_error(io_error())];
        let cs = [high(), low(), high()];
        let mut m = Mocks::new(&pulses(0), &[], &cs, &pulses(0), &wr);
        let mut adc = Ad7606Parallel::new(ScriptedBus::new(&[]), m.pins()).unwrap();
        let err = adc.write_register(REG_BANDWIDTH, 0xFF).unwrap_err();
        assert!(matches!(err, Error::Pin(_)));
        let (bus, _) = adc.release();
        assert_eq!(bus.log, vec![Op::Drive(0x07FF), Op::Release]);
        m.done();
    }
}
