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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::capture::{capture, CaptureError, Config, Counters, Progress, Summary, Tap};
use crate::recording::Event;

/// Samples kept for [`Meter::read`] when nobody reads them (older ones are dropped from
/// the read buffer and counted; the recording keeps them all).
const READ_BUFFER_SAMPLES: usize = 4_000_000;

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
    /// Energy of the total power over the window, J.
    pub energy_j: f64,
    /// `energy_j / duration_s`, W.
    pub mean_w: f64,
    /// Samples in it.
    pub samples: u64,
}

#[derive(Debug, Default)]
struct State {
    epoch_ns: Option<i64>,
    rails: Vec<String>,
    /// Time of the newest sample.
    last_s: f64,
    /// Samples not yet read: their times and per-rail watts (`rails` a sample).
    times: VecDeque<f64>,
    watts: VecDeque<f32>,
    dropped: u64,
    /// Open windows, summed as the samples arrive (`end_s` infinite until closed).
    windows: Vec<Option<WindowEnergy>>,
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
            let total = f64::from(crate::recording::total_w(row.iter().copied()));
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
        }
        self.arrived.notify_all();
    }

    fn event(&self, _: &Event) {}
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
}

/// A capture in the background (see the [module documentation](self)).
#[derive(Debug)]
pub struct Meter {
    gauge: Arc<Gauge>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    started: Instant,
    thread: Option<JoinHandle<Result<Summary, CaptureError>>>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl Meter {
    /// Starts capturing with `config` (its `tap` is the meter's) and waits up to `wait`
    /// for the recording to start; a capture that fails first returns its error.
    pub fn start(mut config: Config, wait: Duration) -> Result<Meter, MeterError> {
        let gauge = Arc::new(Gauge::default());
        config.tap = Some(gauge.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let thread = {
            let (stop, counters) = (stop.clone(), counters.clone());
            std::thread::Builder::new()
                .name("railtrace-meter".into())
                .spawn(move || capture(&config, &stop, &counters, |_| {}))
                .map_err(|e| MeterError::Stopped(format!("cannot start the capture: {e}")))?
        };
        let mut meter = Meter {
            gauge,
            stop,
            counters,
            started: Instant::now(),
            thread: Some(thread),
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
        let epoch = self.gauge.lock().epoch_ns.unwrap_or_else(now_ns);
        (now_ns() - epoch) as f64 * 1e-9
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

    /// Opens a window named `name` now; its number for [`Meter::close`].
    pub fn open(&mut self, name: &str) -> usize {
        let start_s = self.now_s();
        let mut s = self.gauge.lock();
        s.windows.push(Some(WindowEnergy {
            name: name.to_string(),
            start_s,
            end_s: f64::INFINITY,
            duration_s: f64::NAN,
            energy_j: 0.0,
            mean_w: f64::NAN,
            samples: 0,
        }));
        s.windows.len() - 1
    }

    /// Closes window `id` now and waits (up to `wait`) for the samples up to its end.
    pub fn close(&mut self, id: usize, wait: Duration) -> Result<WindowEnergy, MeterError> {
        let end_s = self.now_s();
        let mut s = self.gauge.lock();
        match s.windows.get_mut(id) {
            Some(Some(w)) if w.end_s.is_infinite() => w.end_s = end_s,
            _ => return Err(MeterError::NoWindow(id)),
        }
        let deadline = Instant::now() + wait;
        while s.last_s < end_s {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                s.windows[id] = None;
                return Err(MeterError::Stopped(format!(
                    "the samples up to the window's end ({end_s:.6} s) did not arrive within {wait:?} (the newest is at {:.6} s)",
                    s.last_s
                )));
            }
            s = (self.gauge.arrived)
                .wait_timeout(s, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let mut w = s.windows[id].take().ok_or(MeterError::NoWindow(id))?;
        w.duration_s = w.end_s - w.start_s;
        w.mean_w = w.energy_j / w.duration_s;
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

    /// Stops the capture and finalises its recording.
    pub fn finish(&mut self) -> Result<Summary, MeterError> {
        self.stop.store(true, Ordering::Relaxed);
        self.join()
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish();
        }
    }
}
