//! The hardware the core needs, behind small traits, so that the same core runs on a
//! board, in the digital twin and in host tests.

/// What went wrong with a piece of hardware, in terms the core can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The part does not answer (e.g. the ADC's BUSY never rose).
    NotResponding,
    /// The part started but did not finish in time (e.g. BUSY never fell).
    Timeout,
    /// A bus (SPI) or pin transfer failed.
    Bus,
    /// Non-volatile storage failed.
    Storage,
    /// The request is outside what the hardware can do (a rate it cannot time, a line it
    /// does not have).
    Unsupported,
}

/// An error that can say which [`ErrorKind`] it is.
pub trait Error: core::fmt::Debug {
    /// The kind of this error.
    fn kind(&self) -> ErrorKind;
}

impl Error for ErrorKind {
    fn kind(&self) -> ErrorKind {
        *self
    }
}

/// Number of ADC channels a sample carries.
pub const CHANNELS: usize = 8;

/// Something that takes one simultaneous conversion of all channels: the AD7606 driver on
/// a board, a built-in test signal under emulation, a simulated ADC in the twin.
pub trait SampleSource {
    /// Why a conversion failed.
    type Error: Error;
    /// Converts all channels once. Called from the sample-timer interrupt: must finish in
    /// bounded time.
    fn convert(&mut self) -> Result<[i16; CHANNELS], Self::Error>;
    /// Called by the sampler at the first conversion of each run (after Start). A real
    /// ADC needs nothing; the test signal starts over, so its codes follow the run's
    /// sample index.
    fn restart(&mut self) {}
}

impl<S: SampleSource + ?Sized> SampleSource for &mut S {
    type Error = S::Error;
    fn convert(&mut self) -> Result<[i16; CHANNELS], Self::Error> {
        (**self).convert()
    }
    fn restart(&mut self) {
        (**self).restart()
    }
}

/// A channel's calibration: `value = code × scale + offset` in volts or amperes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Units per code.
    pub scale: f32,
    /// Units at code 0.
    pub offset: f32,
}

/// The rest of the board, as the main loop sees it.
pub trait Board {
    /// The device clock, in ticks since power-on.
    fn now(&mut self) -> u64;
    /// Starts the sample timer at `rate_hz` conversions per second; returns the timer's
    /// period in device ticks.
    fn start_sampling(&mut self, rate_hz: u32) -> Result<u32, ErrorKind>;
    /// Stops the sample timer.
    fn stop_sampling(&mut self);
    /// Drives trigger output `line`.
    fn set_trigger_output(&mut self, line: u8, high: bool) -> Result<(), ErrorKind>;
    /// Stores the calibration of all channels in non-volatile memory.
    fn store_calibration(&mut self, calibration: &[Calibration; CHANNELS])
        -> Result<(), ErrorKind>;
}
