//! A capture running in the background, read as it goes: its samples in batches, and the
//! energy over windows of time the caller opens and closes (as Zeus measures a GPU's
//! energy over a window of code). The capture records exactly as `railtrace capture`
//! does; reading it, or not, never costs the recording a sample.
//!
//! A window is on the recording's timeline: it opens and closes at the host's clock,
//! which the capture ties to the device's clock at every (re)connection. Its energy is
//! the sum of every sample's total power in `[start, end)` times the sample period, taken
//! by the writer as the samples arrive, so it is exact to the sample whatever the window's
//! length and whether or not anyone reads the samples.
//!
//! The meter also drives the rig's trigger outputs and writes marks into the recording
//! (each window's opening and closing among them), and can read a GPU's own power logger
//! beside the rig ([`Meter::start_logger`]), so that a window has the logger's energy
//! over the same span, as a user of that logger alone would have it, beside the rig's.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::gpu::{GpuError, LoggerReading, PowerLogger, Stamp};
use crate::link::capture::{
    capture_controlled, CaptureError, Config, Control, ControlError, Counters, Progress, Summary,
    Tap,
};
use crate::store::recording::{host_now_ns, Event};

/// Samples kept for [`Meter::read`] when nobody reads them (older ones are dropped from
/// the read buffer and counted; the recording keeps them all).
const READ_BUFFER_SAMPLES: usize = 4_000_000;
/// The part of a window its samples must cover for its energy to be given (else NaN),
/// where the caller does not say: the missing time is then at most 0.1 % of the window,
/// and filling it at the samples' mean power errs by at most 0.1 % of the power's swing.
pub const DEFAULT_MIN_COVERAGE: f64 = 0.999;
/// A GPU logger is read this often.
const LOGGER_POLL: Duration = Duration::from_millis(10);

/// A window's energy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WindowEnergy {
    /// Its name.
    pub name: String,
    /// Start and end on the recording's timeline, s.
    pub start_s: f64,
    /// End, s.
    pub end_s: f64,
    /// `end_s − start_s`.
    pub duration_s: f64,
    /// Energy of the total power over the window, J: every sample's total power in it
    /// times the sample period, and where samples are missing ([`WindowEnergy::gaps`]),
    /// their time at the mean power of the rest; NaN where the samples cover less of the
    /// window than the `min_coverage` it was closed with.
    pub energy_j: f64,
    /// The mean power of the samples in the window, W: their energy over the time they
    /// cover (missing time is never divided into it).
    pub mean_w: f64,
    /// Samples in it.
    pub samples: u64,
    /// Samples the window spans: those in it and those the capture's gap rows say are
    /// missing from it (lost on the link, dropped on the device, a disconnection).
    pub samples_expected: u64,
    /// Time of the window with no sample, s: its overlap with the capture's gaps.
    pub missing_s: f64,
    /// `1 − missing_s / duration_s`: the part of the window the samples cover.
    pub coverage: f64,
    /// The capture's gap rows that overlap the window.
    pub gaps: u64,
    /// The GPU's own logger's energy over the window, J, where a logger is read
    /// ([`Meter::start_logger`]): each reading's power held from its time until the next
    /// reading, over `[start_s, end_s]`. That is what a user of the logger alone
    /// computes; it is not corrected for the logger's averaging or delay.
    pub logger_energy_j: Option<f64>,
    /// `logger_energy_j / duration_s`, W.
    pub logger_mean_w: Option<f64>,
    /// The logger's readings stamped within the window.
    pub logger_readings: Option<u64>,
}

impl WindowEnergy {
    /// A window named `name` opened at `start_s`, nothing in it yet (the logger's figures
    /// kept where `logger`).
    fn opened(name: &str, start_s: f64, logger: bool) -> WindowEnergy {
        WindowEnergy {
            name: name.to_string(),
            start_s,
            end_s: f64::INFINITY,
            duration_s: f64::NAN,
            energy_j: 0.0,
            mean_w: f64::NAN,
            samples: 0,
            samples_expected: 0,
            missing_s: 0.0,
            coverage: f64::NAN,
            gaps: 0,
            logger_energy_j: logger.then_some(0.0),
            logger_mean_w: None,
            logger_readings: logger.then_some(0),
        }
    }
}

/// The energy of a logger's `readings` (time s, power W, in time order) over `[start_s,
/// end_s]`, each reading's power held from its time until the next reading's, J; and the
/// readings stamped within it. Before the first reading and after the last nothing is
/// known: nothing is counted there.
fn held_energy(readings: &VecDeque<(f64, f64)>, start_s: f64, end_s: f64) -> (f64, u64) {
    let mut energy = 0.0;
    for ((t0, p0), (t1, _)) in readings.iter().zip(readings.iter().skip(1)) {
        let (a, b) = (t0.max(start_s), t1.min(end_s));
        if b > a {
            energy += p0 * (b - a);
        }
    }
    let within = readings
        .iter()
        .filter(|(t, _)| *t >= start_s && *t <= end_s)
        .count();
    (energy, within as u64)
}

#[derive(Debug, Default)]
struct State {
    epoch_ns: Option<i64>,
    rails: Vec<String>,
    /// Time of the newest sample.
    last_s: f64,
    /// The sample period of the newest samples, s.
    period_s: f64,
    /// The capture's gaps that open windows may overlap: start, end (s).
    gaps: Vec<(f64, f64)>,
    /// Samples not yet read: their times and per-rail watts (`rails` a sample).
    times: VecDeque<f64>,
    watts: VecDeque<f32>,
    dropped: u64,
    /// Open windows, summed as the samples arrive (`end_s` infinite until closed).
    windows: Vec<Option<WindowEnergy>>,
    /// A GPU logger is read: windows take its energy.
    logger: bool,
    /// Its readings on the recording's timeline, in time order: time (s) and power (W),
    /// from the last one at or before the earliest open window's start (the newest only
    /// when no window is open).
    logged: VecDeque<(f64, f64)>,
    /// Why it stopped, if it failed.
    logger_failed: Option<String>,
}

/// The capture's side of a [`Meter`].
#[derive(Debug, Default)]
struct Gauge {
    state: Mutex<State>,
    arrived: Condvar,
}

impl Gauge {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logger readings, in order, on the recording's timeline: time (s) and power (W). A
    /// reading stamped before the one before it is taken at that one's time. Those no
    /// open window needs are dropped.
    fn logged(&self, readings: &[(f64, f64)]) {
        let mut s = self.lock();
        for &(t, p) in readings {
            let t = s.logged.back().map_or(t, |&(t0, _)| t.max(t0));
            s.logged.push_back((t, p));
        }
        let from = (s.windows.iter().flatten())
            .filter(|w| w.logger_energy_j.is_some())
            .map(|w| w.start_s)
            .fold(f64::INFINITY, f64::min);
        while s.logged.get(1).is_some_and(|&(t, _)| t <= from) {
            s.logged.pop_front();
        }
        self.arrived.notify_all();
    }
}

impl Tap for Gauge {
    fn start(&self, epoch_utc_ns: i64, rails: &[String]) {
        let mut s = self.lock();
        s.epoch_ns = Some(epoch_utc_ns);
        s.rails = rails.to_vec();
        self.arrived.notify_all();
    }

    fn samples(&self, t_s: f64, period_s: f64, watts: &[f32]) {
        let mut s = self.lock();
        let rails = s.rails.len().max(1);
        let n = watts.len() / rails;
        for (i, row) in watts.chunks_exact(rails).enumerate() {
            let t = t_s + i as f64 * period_s;
            let total = f64::from(crate::store::recording::total_w(row.iter().copied()));
            for w in s.windows.iter_mut().flatten() {
                if t >= w.start_s && t < w.end_s {
                    w.energy_j += total * period_s;
                    w.samples += 1;
                }
            }
            s.times.push_back(t);
        }
        s.watts.extend(watts.iter().copied());
        let over = s.times.len().saturating_sub(READ_BUFFER_SAMPLES);
        if over > 0 {
            s.times.drain(..over);
            s.watts.drain(..over * rails);
            s.dropped += over as u64;
        }
        if n > 0 {
            s.last_s = t_s + (n - 1) as f64 * period_s;
            s.period_s = period_s;
        }
        self.arrived.notify_all();
    }

    fn event(&self, e: &Event) {
        let &Event::Gap {
            time_s,
            duration_s,
            samples,
            ..
        } = e
        else {
            return;
        };
        let mut s = self.lock();
        // A gap of a known count of samples lasts that many periods; else as it says.
        let length = match samples {
            Some(n) if s.period_s > 0.0 => n as f64 * s.period_s,
            _ => duration_s,
        };
        let end = time_s
            + if length.is_finite() {
                length.max(0.0)
            } else {
                f64::INFINITY
            };
        s.gaps.push((time_s, end));
        // Those no open window can overlap are left out.
        let from = (s.windows.iter().flatten())
            .map(|w| w.start_s)
            .fold(f64::INFINITY, f64::min);
        s.gaps.retain(|&(_, end)| end > from);
    }
}

/// The part of the window `[start_s, end_s)` that `gaps` (start, end) overlap, s, and how
/// many of them overlap it.
fn missing(gaps: &[(f64, f64)], start_s: f64, end_s: f64) -> (f64, u64) {
    let mut spans: Vec<(f64, f64)> = gaps
        .iter()
        .map(|&(a, b)| (a.max(start_s), b.min(end_s)))
        .filter(|(a, b)| b > a)
        .collect();
    let n = spans.len() as u64;
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Overlapping gaps counted once.
    let (mut total, mut reach) = (0.0, f64::NEG_INFINITY);
    for (a, b) in spans {
        let a = a.max(reach);
        if b > a {
            total += b - a;
        }
        reach = reach.max(b);
    }
    (total, n)
}

/// Why a meter could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum MeterError {
    /// The capture failed (a wrong port, an output that cannot be written, ...).
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The capture stopped or never started.
    #[error("{0}")]
    Stopped(String),
    /// No window of that number is open.
    #[error("no open window {0}")]
    NoWindow(usize),
    /// A request to the capture failed (a trigger output, a mark).
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The GPU's logger failed, or gave no reading.
    #[error("{0}")]
    Logger(String),
}

/// A capture in the background (see the [module documentation](self)).
#[derive(Debug)]
pub struct Meter {
    gauge: Arc<Gauge>,
    control: Arc<Control>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    started: Instant,
    thread: Option<JoinHandle<Result<Summary, CaptureError>>>,
    /// The thread reading a GPU logger, and its stop.
    logger: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Meter {
    /// Starts capturing with `config` (its `tap` is the meter's) and waits up to `wait`
    /// for the recording to start; a capture that fails first returns its error.
    pub fn start(mut config: Config, wait: Duration) -> Result<Meter, MeterError> {
        let gauge = Arc::new(Gauge::default());
        config.tap = Some(gauge.clone());
        let control = Arc::new(Control::default());
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let thread = {
            let (control, stop, counters) = (control.clone(), stop.clone(), counters.clone());
            std::thread::Builder::new()
                .name("railtrace-meter".into())
                .spawn(move || capture_controlled(&config, &control, &stop, &counters, |_| {}))
                .map_err(|e| MeterError::Stopped(format!("cannot start the capture: {e}")))?
        };
        let mut meter = Meter {
            gauge,
            control,
            stop,
            counters,
            started: Instant::now(),
            thread: Some(thread),
            logger: None,
        };
        let deadline = Instant::now() + wait;
        loop {
            if meter.gauge.lock().epoch_ns.is_some() {
                return Ok(meter);
            }
            if meter.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let r = meter.join()?;
                return Err(MeterError::Stopped(format!(
                    "the capture ended before it started ({} samples)",
                    r.progress.samples
                )));
            }
            if Instant::now() > deadline {
                let _ = meter.finish();
                return Err(MeterError::Stopped(format!(
                    "the device sent nothing within {wait:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Reads `logger`, a GPU's own power logger, every 10 ms from now until the meter
    /// finishes, and waits up to `wait` for its first reading: from then on every window
    /// has the logger's energy beside the rig's, and its readings go into the recording
    /// as logger rows. A reading is placed on the recording's timeline by its host
    /// timestamp; one on the logger's own clock by the least delay seen between a
    /// reading's stamp and the host getting it (a drift of that clock is not followed);
    /// one on the GPU's clock, which the meter has no link to, at the host time it was
    /// read. Readings from before the recording started are left out.
    pub fn start_logger(
        &mut self,
        logger: Box<dyn PowerLogger + Send>,
        wait: Duration,
    ) -> Result<(), MeterError> {
        if self.logger.is_some() {
            return Err(MeterError::Logger("a GPU logger is read already".into()));
        }
        let epoch_ns = self.gauge.lock().epoch_ns.unwrap_or_else(host_now_ns);
        let describe = logger.describe();
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let (gauge, control, done) = (self.gauge.clone(), self.control.clone(), done.clone());
            let mut logger = logger;
            std::thread::Builder::new()
                .name("railtrace-logger".into())
                .spawn(move || poll_logger(logger.as_mut(), epoch_ns, &gauge, &control, &done))
                .map_err(|e| MeterError::Logger(format!("cannot read {describe}: {e}")))?
        };
        let deadline = Instant::now() + wait;
        let mut s = self.gauge.lock();
        let failed = loop {
            if !s.logged.is_empty() {
                s.logger = true;
                break None;
            }
            if let Some(why) = &s.logger_failed {
                break Some(why.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Some(format!("{describe} gave no reading within {wait:?}"));
            }
            s = (self.gauge.arrived)
                .wait_timeout(s, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(s);
        if let Some(why) = failed {
            done.store(true, Ordering::Relaxed);
            let _ = thread.join();
            return Err(MeterError::Logger(why));
        }
        self.logger = Some((done, thread));
        Ok(())
    }

    /// Drives the rig's trigger output `line` `high` (else low), held, or with
    /// `pulse_s` back to the other level after that long (timed by the rig, to its
    /// tick), and waits up to `wait` for the rig to answer. The recording has the change
    /// as an edge row of line `line | 0x80`.
    pub fn drive(
        &self,
        line: u8,
        high: bool,
        pulse_s: Option<f64>,
        wait: Duration,
    ) -> Result<(), MeterError> {
        Ok(self.control.drive(line, high, pulse_s, wait)?)
    }

    /// Writes a mark into the recording now: a log row `mark: <text>`.
    pub fn mark(&self, text: &str) -> Result<(), MeterError> {
        Ok(self.control.mark(text)?)
    }

    /// The rails' names (the total is their sum).
    pub fn rails(&self) -> Vec<String> {
        self.gauge.lock().rails.clone()
    }

    /// The capture's counters now.
    pub fn progress(&self) -> Progress {
        self.counters.progress(self.started.elapsed())
    }

    /// Now on the recording's timeline, s.
    pub fn now_s(&self) -> f64 {
        let epoch = self.gauge.lock().epoch_ns.unwrap_or_else(host_now_ns);
        (host_now_ns() - epoch) as f64 * 1e-9
    }

    /// The samples that arrived since the last read: their times (s) and per-rail watts
    /// (`rails().len()` a sample), and how many were dropped from this buffer unread
    /// (the recording keeps them).
    pub fn read(&self) -> (Vec<f64>, Vec<f32>, u64) {
        let mut s = self.gauge.lock();
        let t: Vec<f64> = s.times.drain(..).collect();
        let w: Vec<f32> = s.watts.drain(..).collect();
        (t, w, std::mem::take(&mut s.dropped))
    }

    /// Now: host ns since the Unix epoch, and on the recording's timeline, s.
    fn now(&self) -> (i64, f64) {
        let epoch = self.gauge.lock().epoch_ns.unwrap_or_else(host_now_ns);
        let ns = host_now_ns();
        (ns, (ns - epoch) as f64 * 1e-9)
    }

    /// Opens a window named `name` now (marked in the recording as `window <name>
    /// opened`); its number for [`Meter::close`].
    pub fn open(&mut self, name: &str) -> usize {
        let (ns, start_s) = self.now();
        let mut s = self.gauge.lock();
        let logger = s.logger;
        s.windows
            .push(Some(WindowEnergy::opened(name, start_s, logger)));
        let id = s.windows.len() - 1;
        drop(s);
        let _ = self.control.mark_at(ns, &format!("window {name} opened"));
        id
    }

    /// Closes window `id` now and waits (up to `wait`) for the samples up to its end, and
    /// for a GPU logger's reading at or after its end where one is read; marks it in the
    /// recording with its figures (`window <name> closed: ...`). Where the samples cover
    /// less than `min_coverage` of the window (0 to 1), its `energy_j` is NaN.
    pub fn close(
        &mut self,
        id: usize,
        wait: Duration,
        min_coverage: f64,
    ) -> Result<WindowEnergy, MeterError> {
        let (ns, end_s) = self.now();
        let mut s = self.gauge.lock();
        let logger = match s.windows.get_mut(id) {
            Some(Some(w)) if w.end_s.is_infinite() => {
                w.end_s = end_s;
                w.logger_energy_j.is_some()
            }
            _ => return Err(MeterError::NoWindow(id)),
        };
        let deadline = Instant::now() + wait;
        let logged = |s: &State| s.logged.back().is_some_and(|&(t, _)| t >= end_s);
        while s.last_s < end_s || (logger && !logged(&s)) {
            if let (true, Some(why)) = (logger, &s.logger_failed) {
                let why = why.clone();
                s.windows[id] = None;
                return Err(MeterError::Logger(why));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                s.windows[id] = None;
                return Err(MeterError::Stopped(if s.last_s < end_s {
                    format!(
                        "the samples up to the window's end ({end_s:.6} s) did not arrive within {wait:?} (the newest is at {:.6} s)",
                        s.last_s
                    )
                } else {
                    format!(
                        "the GPU logger's readings up to the window's end ({end_s:.6} s) did not arrive within {wait:?} (the newest is at {:.6} s)",
                        s.logged.back().map_or(f64::NAN, |&(t, _)| t)
                    )
                }));
            }
            s = (self.gauge.arrived)
                .wait_timeout(s, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mut w = s.windows[id].take().ok_or(MeterError::NoWindow(id))?;
        if w.logger_energy_j.is_some() {
            let (energy, readings) = held_energy(&s.logged, w.start_s, w.end_s);
            w.logger_energy_j = Some(energy);
            w.logger_readings = Some(readings);
        }
        let (missing_s, gaps) = missing(&s.gaps, w.start_s, w.end_s);
        let period_s = s.period_s;
        drop(s);
        w.duration_s = w.end_s - w.start_s;
        w.missing_s = missing_s.min(w.duration_s);
        w.gaps = gaps;
        w.coverage = 1.0 - w.missing_s / w.duration_s;
        w.samples_expected = w.samples
            + if period_s > 0.0 {
                (w.missing_s / period_s).round() as u64
            } else {
                0
            };
        let measured_j = w.energy_j;
        w.mean_w = measured_j / (w.duration_s - w.missing_s);
        w.energy_j = if w.missing_s == 0.0 {
            measured_j
        } else if w.coverage >= min_coverage {
            measured_j + w.mean_w * w.missing_s
        } else {
            f64::NAN
        };
        w.logger_mean_w = w.logger_energy_j.map(|e| e / w.duration_s);
        let mut text = format!(
            "window {} closed: {:.6} J over {:.6} s, mean {:.3} W",
            w.name, w.energy_j, w.duration_s, w.mean_w
        );
        if w.gaps > 0 {
            text += &format!(
                " ({} gaps: {:.6} s without samples, {:.4} % covered)",
                w.gaps,
                w.missing_s,
                100.0 * w.coverage
            );
        }
        if let (Some(e), Some(m), Some(n)) = (w.logger_energy_j, w.logger_mean_w, w.logger_readings)
        {
            text += &format!("; the GPU's logger: {e:.6} J, mean {m:.3} W ({n} readings)");
        }
        let _ = self.control.mark_at(ns, &text);
        Ok(w)
    }

    fn join(&mut self) -> Result<Summary, MeterError> {
        let t = self
            .thread
            .take()
            .ok_or_else(|| MeterError::Stopped("already stopped".into()))?;
        t.join()
            .map_err(|_| MeterError::Stopped("the capture panicked".into()))?
            .map_err(MeterError::from)
    }

    /// Stops the capture (and the GPU logger's reading) and finalises its recording.
    pub fn finish(&mut self) -> Result<Summary, MeterError> {
        // The logger first, so that its last readings are in the recording.
        if let Some((done, thread)) = self.logger.take() {
            done.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
        self.stop.store(true, Ordering::Relaxed);
        self.join()
    }
}

/// Reads `logger` every [`LOGGER_POLL`] until `done` (or it fails): its readings on the
/// recording's timeline (see [`Meter::start_logger`]) to the windows and, as logger rows,
/// into the recording. A failure is marked in the recording and kept for the windows.
fn poll_logger(
    logger: &mut dyn PowerLogger,
    epoch_ns: i64,
    gauge: &Gauge,
    control: &Control,
    done: &AtomicBool,
) {
    let mut own = OwnClocks::default();
    while !done.load(Ordering::Relaxed) {
        let readings = match logger.poll() {
            Ok(r) => r,
            Err(e) => {
                let why = format!("the GPU's logger ({}) failed: {e}", logger.describe());
                let _ = control.mark(&why);
                gauge.lock().logger_failed = Some(why);
                gauge.arrived.notify_all();
                return;
            }
        };
        let events = own.place(&readings, epoch_ns);
        let points: Vec<(f64, f64)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Logger {
                    time_s, power_w, ..
                } => Some((*time_s, *power_w)),
                _ => None,
            })
            .collect();
        gauge.logged(&points);
        for e in events {
            let _ = control.event(e);
        }
        std::thread::sleep(LOGGER_POLL);
    }
}

/// Where a logger's own clocks (by rate) sit on the recording's timeline: the least of
/// (host time got − own stamp) over the readings so far, s.
#[derive(Debug, Default)]
struct OwnClocks {
    offsets: Vec<(f64, f64)>,
}

impl OwnClocks {
    /// The readings as logger rows on the recording's timeline (time 0 at `epoch_ns`),
    /// those from before it left out.
    fn place(&mut self, readings: &[LoggerReading], epoch_ns: i64) -> Vec<Event> {
        let host_s = |ns: i64| (ns - epoch_ns) as f64 * 1e-9;
        for r in readings {
            if let Stamp::Own { ticks, hz } = r.stamp {
                let seen = host_s(r.host_ns) - ticks as f64 / hz;
                match self.offsets.iter_mut().find(|(h, _)| *h == hz) {
                    Some((_, o)) => *o = o.min(seen),
                    None => self.offsets.push((hz, seen)),
                }
            }
        }
        readings
            .iter()
            .filter_map(|r| {
                let time_s = match r.stamp {
                    Stamp::HostNs(ns) => host_s(ns),
                    Stamp::GpuTicks(_) => host_s(r.host_ns),
                    Stamp::Own { ticks, hz } => {
                        let offset = self.offsets.iter().find(|(h, _)| *h == hz);
                        ticks as f64 / hz + offset.map_or(0.0, |o| o.1)
                    }
                };
                (time_s >= 0.0).then(|| r.event(time_s))
            })
            .collect()
    }
}

/// The twin GPU's own power logger, read beside the twin's own workload. (The logger of
/// [`crate::gpu::twin::TwinGpu`] is a profiling run's: it takes the GPU over, and stamps
/// readings on the GPU's clock for the run's clock link.) Each reading is stamped with
/// the host time of its instant, its GPU clock stamp mapped through the twin's own clock
/// (a runner's clock reads map it to within microseconds). It takes everything the
/// twin's GPU side produced (its executions are dropped): read a twin with one.
#[derive(Debug)]
pub struct SharedTwinLogger {
    twin: Arc<railtrace_twin::Twin>,
}

impl SharedTwinLogger {
    /// The logger of `twin`.
    pub fn new(twin: Arc<railtrace_twin::Twin>) -> SharedTwinLogger {
        SharedTwinLogger { twin }
    }
}

impl PowerLogger for SharedTwinLogger {
    fn describe(&self) -> String {
        "the twin GPU's power logger".into()
    }

    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError> {
        use railtrace_twin::logger::Stamp as TwinStamp;
        let twin = &self.twin;
        let clock = twin.gpu_clock();
        let out = twin.take_outputs();
        let host_ns = twin.unix_ns(twin.now_s());
        Ok(out
            .logger
            .into_iter()
            .map(|l| LoggerReading {
                stamp: Stamp::HostNs(twin.unix_ns(match l.stamp {
                    TwinStamp::GpuTicks(t) => clock.true_time_at(t),
                    TwinStamp::HostRead { read_s } => read_s,
                })),
                host_ns,
                power_w: l.power_w,
                instant_w: None,
                temperature_c: l.temperature_c,
                energy_j: None,
                source: "twin",
            })
            .collect())
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start_s: f64, logger: bool) -> WindowEnergy {
        WindowEnergy::opened("w", start_s, logger)
    }

    /// Each reading's power is held from its time until the next reading, over the
    /// window's span only.
    #[test]
    fn a_windows_logger_energy_holds_each_reading_until_the_next() {
        // Readings of 100 W at 0 s, 200 W at 1 s, 50 W at 2 s, 80 W at 3 s.
        let r: VecDeque<(f64, f64)> = [(0.0, 100.0), (1.0, 200.0), (2.0, 50.0), (3.0, 80.0)].into();
        // By hand over [0.25, 2.6]: 100 W over [0.25, 1), 200 W over [1, 2), 50 W over
        // [2, 2.6]: 75 + 200 + 30 = 305 J; the readings at 1 s and 2 s are in it.
        let (e, n) = held_energy(&r, 0.25, 2.6);
        assert!((e - 305.0).abs() < 1e-9, "{e}");
        assert_eq!(n, 2);
        // Ends on readings: [1, 3]: 200 + 50 = 250 J, three readings.
        let (e, n) = held_energy(&r, 1.0, 3.0);
        assert!((e - 250.0).abs() < 1e-9, "{e}");
        assert_eq!(n, 3);
        // Within one reading's hold: 200 W over 0.5 s.
        let (e, n) = held_energy(&r, 1.25, 1.75);
        assert!((e - 100.0).abs() < 1e-9, "{e}");
        assert_eq!(n, 0);
        // Past the last reading nothing is known: 80 W from 3 s is not held on.
        assert_eq!(held_energy(&r, 3.0, 5.0), (0.0, 1));
    }

    /// The gauge keeps the readings an open window needs: from the last one at or before
    /// its start; a reading stamped before the one before it is taken at that one's time.
    #[test]
    fn the_gauge_keeps_the_readings_open_windows_need() {
        let gauge = Gauge::default();
        gauge.logged(&[(0.0, 10.0), (1.0, 20.0)]);
        assert_eq!(gauge.lock().logged, [(1.0, 20.0)]);
        gauge.lock().windows.push(Some(window(1.5, true)));
        gauge.lock().windows.push(Some(window(0.5, false))); // no logger: not kept for it
        gauge.logged(&[(2.0, 30.0), (1.9, 40.0), (3.0, 50.0)]);
        assert_eq!(
            gauge.lock().logged,
            [(1.0, 20.0), (2.0, 30.0), (2.0, 40.0), (3.0, 50.0)]
        );
        // 20 W over [1.5, 2), 40 W over [2, 2.5]: 10 + 20 = 30 J.
        let (e, _) = held_energy(&gauge.lock().logged, 1.5, 2.5);
        assert!((e - 30.0).abs() < 1e-9, "{e}");
        gauge.lock().windows[0] = None;
        gauge.logged(&[(4.0, 60.0)]);
        assert_eq!(gauge.lock().logged, [(4.0, 60.0)]);
    }

    /// Host stamps are the recording's time as they are; a logger's own clock sits at
    /// the least delay seen between a stamp and the host getting it; readings before the
    /// recording's start are left out.
    #[test]
    fn readings_are_placed_on_the_recordings_timeline() {
        let epoch = 1_000_000_000_000;
        let reading = |stamp, host_ns| LoggerReading {
            stamp,
            host_ns,
            power_w: 1.0,
            instant_w: None,
            temperature_c: None,
            energy_j: None,
            source: "test",
        };
        let own = |us: u64| Stamp::Own { ticks: us, hz: 1e6 };
        let mut clocks = OwnClocks::default();
        // Own clock at 500 s when the recording starts; got 3 ms and 1 ms after their stamps.
        let events = clocks.place(
            &[
                reading(own(500_100_000), epoch + 103_000_000),
                reading(own(500_200_000), epoch + 201_000_000),
                reading(Stamp::HostNs(epoch + 250_000_000), epoch + 260_000_000),
                reading(Stamp::HostNs(epoch - 1), epoch + 260_000_000),
                reading(Stamp::GpuTicks(7), epoch + 300_000_000),
            ],
            epoch,
        );
        let times: Vec<f64> = events
            .iter()
            .map(|e| match e {
                Event::Logger { time_s, .. } => *time_s,
                _ => f64::NAN,
            })
            .collect();
        let expected = [0.101, 0.201, 0.25, 0.3];
        assert_eq!(times.len(), expected.len(), "{times:?}");
        for (t, x) in times.iter().zip(expected) {
            assert!((t - x).abs() < 1e-9, "{times:?}");
        }
    }
}
