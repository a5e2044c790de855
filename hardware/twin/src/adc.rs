//! An AD7606 at the level of its pins and SPI transactions, so the firmware's real driver
//! (`railtrace_firmware::ad7606`) runs against it unchanged.
//!
//! On CONVST's rising edge the chip samples its eight inputs (from an [`Analog`] front
//! end, at that instant) and raises BUSY for a few polls, as a 4 µs conversion does; the
//! next SPI read clocks out the eight codes, MSB first. Codes are those of the chosen
//! range (RANGE pin: ±10 V or ±5 V): `round(v / (2 × range) × 65536)`, clamped to the i16
//! range.

use std::cell::RefCell;
use std::convert::Infallible;
use std::rc::Rc;

use embedded_hal::digital::{ErrorType as PinErrorType, InputPin, OutputPin};
use embedded_hal::spi::{ErrorType as SpiErrorType, Operation, SpiDevice};
use railtrace_firmware::CHANNELS;

/// What the ADC's inputs see.
pub trait Analog {
    /// The eight input voltages now, in volts.
    fn sample(&mut self) -> [f64; CHANNELS];
}

/// The code the AD7606 gives for `v` volts on the ±`range_v` range.
pub fn code_for(v: f64, range_v: f64) -> i16 {
    let code = (v / (2.0 * range_v) * 65536.0).round();
    code.clamp(f64::from(i16::MIN), f64::from(i16::MAX)) as i16
}

#[derive(Debug)]
struct Chip<A> {
    analog: A,
    convst_high: bool,
    busy_polls_left: u32,
    busy_polls: u32,
    range_v: f64,
    result: [i16; CHANNELS],
    conversions: u64,
}

/// The chip, shared by its pins and bus. Create it, then hand [`SimAd7606::pins`] to the
/// driver.
#[derive(Debug)]
pub struct SimAd7606<A>(Rc<RefCell<Chip<A>>>);

/// CONVST A/B.
#[derive(Debug)]
pub struct Convst<A>(Rc<RefCell<Chip<A>>>);
/// BUSY.
#[derive(Debug)]
pub struct Busy<A>(Rc<RefCell<Chip<A>>>);
/// The serial data interface with its chip select.
#[derive(Debug)]
pub struct Spi<A>(Rc<RefCell<Chip<A>>>);

impl<A: Analog> SimAd7606<A> {
    /// A chip on the ±`range_v` range whose conversions keep BUSY high for `busy_polls`
    /// reads of the pin.
    pub fn new(analog: A, busy_polls: u32, range_v: f64) -> Self {
        SimAd7606(Rc::new(RefCell::new(Chip {
            analog,
            convst_high: true,
            busy_polls_left: 0,
            busy_polls,
            range_v,
            result: [0; CHANNELS],
            conversions: 0,
        })))
    }

    /// The bus and pins, for `Ad7606::new`.
    pub fn pins(&self) -> (Spi<A>, Convst<A>, Busy<A>) {
        (
            Spi(self.0.clone()),
            Convst(self.0.clone()),
            Busy(self.0.clone()),
        )
    }

    /// Runs `f` on the analog front end (e.g. to set the time of the next conversion).
    pub fn with_analog<R>(&self, f: impl FnOnce(&mut A) -> R) -> R {
        f(&mut self.0.borrow_mut().analog)
    }

    /// Conversions started so far.
    pub fn conversions(&self) -> u64 {
        self.0.borrow().conversions
    }
}

impl<A> PinErrorType for Convst<A> {
    type Error = Infallible;
}
impl<A: Analog> OutputPin for Convst<A> {
    fn set_low(&mut self) -> Result<(), Infallible> {
        self.0.borrow_mut().convst_high = false;
        Ok(())
    }
    fn set_high(&mut self) -> Result<(), Infallible> {
        let mut chip = self.0.borrow_mut();
        if !chip.convst_high {
            // Rising edge: track-and-hold of all eight inputs, conversion starts.
            let v = chip.analog.sample();
            let range = chip.range_v;
            chip.result = v.map(|v| code_for(v, range));
            chip.busy_polls_left = chip.busy_polls;
            chip.conversions += 1;
        }
        chip.convst_high = true;
        Ok(())
    }
}

impl<A> PinErrorType for Busy<A> {
    type Error = Infallible;
}
impl<A> InputPin for Busy<A> {
    fn is_high(&mut self) -> Result<bool, Infallible> {
        let mut chip = self.0.borrow_mut();
        let busy = chip.busy_polls_left > 0;
        chip.busy_polls_left = chip.busy_polls_left.saturating_sub(1);
        Ok(busy)
    }
    fn is_low(&mut self) -> Result<bool, Infallible> {
        self.is_high().map(|b| !b)
    }
}

impl<A> SpiErrorType for Spi<A> {
    type Error = Infallible;
}
impl<A> SpiDevice for Spi<A> {
    fn transaction(&mut self, operations: &mut [Operation<'_, u8>]) -> Result<(), Infallible> {
        let chip = self.0.borrow();
        // DOUTA shifts out V1..V8, 16 bits each, MSB first; then zeros.
        let mut bits = chip.result.iter().flat_map(|c| c.to_be_bytes());
        for op in operations.iter_mut() {
            match op {
                Operation::Read(buf) => buf.iter_mut().for_each(|b| *b = bits.next().unwrap_or(0)),
                Operation::Transfer(read, _) => {
                    read.iter_mut().for_each(|b| *b = bits.next().unwrap_or(0))
                }
                Operation::TransferInPlace(buf) => {
                    buf.iter_mut().for_each(|b| *b = bits.next().unwrap_or(0))
                }
                Operation::Write(_) | Operation::DelayNs(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railtrace_firmware::ad7606::Ad7606;

    struct Ramp(f64);
    impl Analog for Ramp {
        fn sample(&mut self) -> [f64; CHANNELS] {
            self.0 += 1.0;
            core::array::from_fn(|i| self.0 * (i as f64 - 3.5))
        }
    }

    #[test]
    fn the_firmware_driver_reads_what_the_inputs_held_at_convst() {
        let chip = SimAd7606::new(Ramp(0.0), 3, 10.0);
        let (spi, convst, busy) = chip.pins();
        let mut adc = Ad7606::new(spi, convst, busy).unwrap();
        let codes = adc.convert().unwrap();
        let expected: [i16; 8] = core::array::from_fn(|i| code_for(i as f64 - 3.5, 10.0));
        assert_eq!(codes, expected);
        assert_eq!(codes[0], -11469); // -3.5 V = -3.5 / 20 × 65536
        let codes = adc.convert().unwrap();
        assert_eq!(codes[7], code_for(7.0, 10.0));
        assert_eq!(chip.conversions(), 2);
    }

    #[test]
    fn codes_clamp_at_full_scale() {
        assert_eq!(code_for(12.0, 10.0), i16::MAX);
        assert_eq!(code_for(-12.0, 10.0), i16::MIN);
        assert_eq!(code_for(0.0, 10.0), 0);
        assert_eq!(code_for(20.0 / 65536.0, 10.0), 1);
        assert_eq!(code_for(10.0 / 65536.0, 5.0), 1);
    }
}
