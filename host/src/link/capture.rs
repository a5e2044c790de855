//! Capture: a rig's stream, from its serial port into a [`recording`](crate::store::recording).
//!
//! Two sides joined by a lock-free ring buffer (ringbuf):
//! - the reader, on a tokio runtime: the serial port, the protocol decoder, commands,
//!   time sync every second, and reconnection when the device goes away;
//! - the writer, on its own thread: codes to volts, amperes and watts through the device's
//!   calibration and the rig's rails, gaps found from sample indices, rows into the file.
//!
//! Nothing is dropped silently. A sample missing for any reason becomes a gap row with
//! its cause: samples the device dropped (and counted), frames lost on the link, blocks
//! the writer could not keep up with, or the device going away and coming back.
//!
//! While it runs, other threads can drive the rig's trigger outputs and write marks and
//! events into the recording through a [`Control`], without the stream waiting.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use railtrace_protocol::{Message, ResultCode, SampleBlock, Status, TriggerEdge};
use railtrace_rig::{Measures, RigDescription};
use ringbuf::traits::{Consumer, Producer, Split};
use ringbuf::HeapRb;

use crate::link::transport::{Info, Rig, TransportError};
use crate::store::recording::{
    host_now_ns, Claim, Derive, Event, Kind, Meta, RecordingError, Writer, FORMAT_VERSION,
};

/// Records in flight between reader and writer: at 8 channels and 100 kS/s the device
/// sends about 1 600 blocks a second, so this is several seconds of stream.
const RING_RECORDS: usize = 16_384;
/// Time sync this often.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// A running device sends a status every second: this long without a frame means it is
/// gone.
const SILENCE: Duration = Duration::from_secs(3);
/// Answer to a command within this.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A rig description read from a file, with its text (kept in the recording).
#[derive(Debug, Clone)]
pub struct RigFile {
    /// The TOML text.
    pub text: String,
    /// Parsed and checked.
    pub rig: RigDescription,
}

impl RigFile {
    /// Reads and checks `hardware/rigs/*.toml`.
    pub fn read(path: &Path) -> anyhow::Result<RigFile> {
        use anyhow::Context;
        let bytes = railtrace_twin::scenario::read_file(
            path,
            railtrace_twin::scenario::MAX_FILE_BYTES,
            "a rig description",
        )
        .with_context(|| format!("cannot read the rig description {}", path.display()))?;
        let text = String::from_utf8(bytes).map_err(|_| {
            anyhow::anyhow!("{}: not a rig description: not UTF-8 text", path.display())
        })?;
        let rig: RigDescription = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a rig description: {}",
                path.display(),
                e.to_string().lines().next().unwrap_or_default()
            )
        })?;
        rig.validate()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(RigFile { text, rig })
    }
}

/// What to capture.
#[derive(Debug, Clone)]
pub struct Config {
    /// The rig's serial port.
    pub port: PathBuf,
    /// The recording to write.
    pub output: PathBuf,
    /// The rig description; without one, rails come from the device's channel names
    /// (`<rail>_I`, `<rail>_V`).
    pub rig: Option<RigFile>,
    /// Sample rate, Hz; when not given, the lowest the device offers at or above
    /// `rate_at_least_hz`, or its highest.
    pub rate_hz: Option<u32>,
    /// With no `rate_hz`: the least rate wanted (e.g. a sample in every bin of a profile).
    pub rate_at_least_hz: Option<u32>,
    /// Channels to capture; all the device has when not given.
    pub channels: Option<Vec<u8>>,
    /// Conversions averaged into each sample.
    pub averaging: u16,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// When the device goes away, wait this long for it to come back before giving up.
    pub reconnect_wait: Duration,
    /// Replace `output` if it exists (else an existing output is refused).
    pub replace: bool,
    /// Capture at a rate the rig's link cannot carry for the channels asked (the device
    /// then drops whole blocks, each a gap row), with a warning; else such a rate is
    /// refused. Only a rig description ([`Config::rig`]) says what its link carries.
    pub allow_drops: bool,
    /// Shown everything as it is written (a live view); the recording is the same.
    pub tap: Option<Arc<dyn Tap>>,
}

impl Config {
    /// Capture from `port` into `output` (refused if it exists), every channel at the
    /// device's highest rate, no averaging, until stopped, waiting 10 s for a device that
    /// goes away; change what differs with struct update syntax.
    pub fn new(port: impl Into<PathBuf>, output: impl Into<PathBuf>) -> Config {
        Config {
            port: port.into(),
            output: output.into(),
            rig: None,
            rate_hz: None,
            rate_at_least_hz: None,
            channels: None,
            averaging: 1,
            duration: None,
            reconnect_wait: Duration::from_secs(10),
            replace: false,
            allow_drops: false,
            tap: None,
        }
    }
}

/// What a capture shows, as it writes it: for a live view, which sees exactly what the
/// recording gets. Called on the writer's thread, so it must be quick.
pub trait Tap: Send + std::marker::Sync + std::fmt::Debug {
    /// The recording started: its time 0 in host UTC ns, and its rails' names.
    fn start(&self, epoch_utc_ns: i64, rails: &[String]);
    /// `n` samples, the first at `t_s` and `period_s` apart: `watts[i * rails + r]` is
    /// rail `r`'s power in sample `i` (NaN where not measured).
    fn samples(&self, t_s: f64, period_s: f64, watts: &[f32]);
    /// An event row as written (trigger edges, gaps, the device's status, logs).
    fn event(&self, e: &Event);
}

/// Requests to a running capture from other threads ([`capture_controlled`]): drive the
/// rig's trigger outputs, write marks and events into the recording. The reader serves
/// them between reads of the stream, so the stream never waits for them; a request made
/// while no capture runs is refused at once, and every request still pending when the
/// capture ends is answered then.
#[derive(Debug, Default)]
pub struct Control {
    state: Mutex<Requests>,
    answered: Condvar,
}

#[derive(Debug, Default)]
struct Requests {
    /// A capture serves the requests.
    running: bool,
    next_id: u64,
    queue: VecDeque<Request>,
    /// Drives waited for, by id: their answer once it came.
    answers: HashMap<u64, Option<Result<(), ControlError>>>,
}

/// What the reader is asked to do.
#[derive(Debug)]
enum Request {
    Drive {
        id: u64,
        line: u8,
        high: bool,
        pulse_s: Option<f64>,
    },
    Mark {
        host_ns: i64,
        text: String,
    },
    Event(Box<Event>),
}

/// Why a request to a capture failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ControlError {
    /// No capture is running (not started yet, or ended).
    #[error("the rig is not being captured (the capture has not started or has ended)")]
    NotRunning,
    /// The rig has no such output line.
    #[error("the rig has no trigger output {line} (it has {outputs})")]
    NoOutput {
        /// The line asked for.
        line: u8,
        /// How many the rig has.
        outputs: u8,
    },
    /// A pulse the rig cannot time.
    #[error("trigger output {line}: {why}")]
    Pulse {
        /// The line.
        line: u8,
        /// What is wrong with the pulse.
        why: String,
    },
    /// The rig refused to drive the line.
    #[error("the rig refused to drive trigger output {line}: {code:?}")]
    Refused {
        /// The line.
        line: u8,
        /// Its answer.
        code: ResultCode,
    },
    /// No answer in time.
    #[error("the rig did not answer the drive of trigger output {line} within {waited:?}")]
    Timeout {
        /// The line.
        line: u8,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The drive did not reach the rig, or its answer did not come back.
    #[error("trigger output {line}: {why}")]
    Failed {
        /// The line.
        line: u8,
        /// What happened.
        why: String,
    },
}

impl Control {
    fn lock(&self) -> std::sync::MutexGuard<'_, Requests> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drives the rig's trigger output `line` `high` (else low) and waits up to `wait` for
    /// the rig to answer: held at that level, or with `pulse_s`, back to the other level
    /// after that long, timed by the rig's clock (to its tick). The rig records the
    /// change as an edge of line `line | 0x80`.
    pub fn drive(
        &self,
        line: u8,
        high: bool,
        pulse_s: Option<f64>,
        wait: Duration,
    ) -> Result<(), ControlError> {
        if let Some(p) = pulse_s.filter(|p| !(p.is_finite() && *p > 0.0)) {
            return Err(ControlError::Pulse {
                line,
                why: format!("a pulse of {p} s: it must last more than 0 s"),
            });
        }
        let mut s = self.lock();
        if !s.running {
            return Err(ControlError::NotRunning);
        }
        let id = s.next_id;
        s.next_id += 1;
        s.answers.insert(id, None);
        s.queue.push_back(Request::Drive {
            id,
            line,
            high,
            pulse_s,
        });
        let deadline = Instant::now() + wait;
        loop {
            if let Some(Some(answer)) = s.answers.get(&id) {
                let answer = answer.clone();
                s.answers.remove(&id);
                return answer;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.answers.remove(&id);
                s.queue
                    .retain(|r| !matches!(r, Request::Drive { id: x, .. } if *x == id));
                return Err(ControlError::Timeout { line, waited: wait });
            }
            s = self
                .answered
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Writes `text` into the recording as a log row `mark: <text>` at the host's time
    /// now.
    pub fn mark(&self, text: &str) -> Result<(), ControlError> {
        self.mark_at(host_now_ns(), text)
    }

    /// Writes `text` into the recording as a log row `mark: <text>` at host time
    /// `host_ns` (ns since the Unix epoch).
    pub fn mark_at(&self, host_ns: i64, text: &str) -> Result<(), ControlError> {
        self.request(Request::Mark {
            host_ns,
            text: text.to_string(),
        })
    }

    /// Writes an event row into the recording as it is (its time on the recording's
    /// timeline), and shows it to the capture's tap.
    pub fn event(&self, e: Event) -> Result<(), ControlError> {
        self.request(Request::Event(Box::new(e)))
    }

    fn request(&self, r: Request) -> Result<(), ControlError> {
        let mut s = self.lock();
        if !s.running {
            return Err(ControlError::NotRunning);
        }
        s.queue.push_back(r);
        Ok(())
    }

    /// A capture serves the requests from now on.
    fn open(&self) {
        self.lock().running = true;
    }

    /// The requests made since the last take.
    fn take(&self) -> VecDeque<Request> {
        std::mem::take(&mut self.lock().queue)
    }

    /// Answers drive `id`, if it is still waited for.
    fn answer(&self, id: u64, r: Result<(), ControlError>) {
        if let Some(slot) = self.lock().answers.get_mut(&id) {
            *slot = Some(r);
        }
        self.answered.notify_all();
    }

    /// The capture ends (its reader has answered the drives it sent): requests are
    /// refused from now on, drives not yet sent are answered. Returns the marks and
    /// events not yet written.
    fn close(&self) -> Vec<Request> {
        let mut s = self.lock();
        s.running = false;
        let mut rest = Vec::new();
        for r in std::mem::take(&mut s.queue) {
            match r {
                Request::Drive { id, line, .. } => {
                    if let Some(slot) = s.answers.get_mut(&id) {
                        *slot = Some(Err(ControlError::Failed {
                            line,
                            why: "the capture ended before the drive reached the rig".into(),
                        }));
                    }
                }
                r => rest.push(r),
            }
        }
        for slot in s.answers.values_mut().filter(|a| a.is_none()) {
            *slot = Some(Err(ControlError::NotRunning));
        }
        self.answered.notify_all();
        rest
    }
}

/// A pulse of `pulse_s` in ticks of a `tick_hz` clock, to the nearest tick (at least one).
fn pulse_ticks(line: u8, pulse_s: f64, tick_hz: u32) -> Result<u32, ControlError> {
    let ticks = (pulse_s * f64::from(tick_hz)).round().max(1.0);
    if ticks > f64::from(u32::MAX) {
        return Err(ControlError::Pulse {
            line,
            why: format!(
                "a pulse of {pulse_s} s is longer than the rig times ({:.3} s at most)",
                f64::from(u32::MAX) / f64::from(tick_hz.max(1))
            ),
        });
    }
    Ok(ticks as u32)
}

/// Counters shared by reader, writer and whoever shows progress.
#[derive(Debug, Default)]
pub struct Counters {
    /// Samples written.
    pub samples: AtomicU64,
    /// Frames lost on the link (sequence gaps), all connections.
    pub frames_lost: AtomicU64,
    /// Bytes the decoder rejected, all connections.
    pub bytes_rejected: AtomicU64,
    /// Samples the device dropped and counted, all connections.
    pub device_drops: AtomicU64,
    /// Samples in blocks the writer could not keep up with.
    pub host_drops: AtomicU64,
    /// Gap rows written.
    pub gaps: AtomicU64,
    /// Reconnections.
    pub reconnects: AtomicU64,
    /// Bytes written to the file.
    pub bytes_written: AtomicU64,
    /// False while waiting for the device to come back.
    pub connected: AtomicBool,
    /// The writer stopped (an error writing the file).
    pub writer_stopped: AtomicBool,
    /// The capture ended while the device was away or silent: the recording ends in a gap.
    pub ended_away: AtomicBool,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Progress {
    /// Since the capture started.
    pub elapsed_s: f64,
    /// Samples written.
    pub samples: u64,
    /// Frames lost on the link.
    pub frames_lost: u64,
    /// Bytes the decoder rejected.
    pub bytes_rejected: u64,
    /// Samples the device dropped.
    pub device_drops: u64,
    /// Samples the host dropped.
    pub host_drops: u64,
    /// Gap rows.
    pub gaps: u64,
    /// Reconnections.
    pub reconnects: u64,
    /// Bytes in the file.
    pub bytes_written: u64,
    /// Connected now.
    pub connected: bool,
    /// The capture ended while the device was away or silent: the recording ends in a
    /// gap row of unknown count.
    pub ended_away: bool,
}

impl Counters {
    /// A snapshot.
    pub fn progress(&self, elapsed: Duration) -> Progress {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Progress {
            elapsed_s: elapsed.as_secs_f64(),
            samples: g(&self.samples),
            frames_lost: g(&self.frames_lost),
            bytes_rejected: g(&self.bytes_rejected),
            device_drops: g(&self.device_drops),
            host_drops: g(&self.host_drops),
            gaps: g(&self.gaps),
            reconnects: g(&self.reconnects),
            bytes_written: g(&self.bytes_written),
            connected: self.connected.load(Ordering::Relaxed),
            ended_away: self.ended_away.load(Ordering::Relaxed),
        }
    }
}

/// Why a capture ended early.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Talking to the rig failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The recording could not be written; what was flushed before is in the file.
    #[error(transparent)]
    Recording(#[from] RecordingError),
    /// The request does not fit the device.
    #[error("{0}")]
    Settings(String),
    /// The device did not come back.
    #[error("{path}: the device went away and did not come back within {waited:?}; the recording holds everything before")]
    Gone {
        /// The port.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
}

/// How a capture ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// The counters at the end.
    pub progress: Progress,
    /// Rows in the file.
    pub rows: u64,
    /// The file.
    pub output: PathBuf,
    /// Why the device dropped samples, where it did: what its link carries.
    pub drops_cause: Option<String>,
}

/// What the link of `rig` carries of `channels` channels, samples/s (the protocol's
/// bytes per sample in full blocks, `protocol/SPEC.md`), and the highest of its board's
/// rates it carries with 5 % to spare (status, edges and time-sync replies share it).
pub fn link_carries(rig: &RigFile, channels: usize) -> (f64, Option<u32>) {
    let r = &rig.rig;
    let most = r.link.payload_bytes_per_s / RigDescription::wire_bytes_per_sample(channels.max(1));
    (most, r.carried_rate_hz(channels.max(1)))
}

/// Whether `rate_hz` of `channels` channels fits the rig's link: None where it does
/// (or no rig description says), else why not, naming the highest rate it carries.
pub fn link_refusal(config: &Config, rate_hz: u32, channels: usize) -> Option<String> {
    let rig = config.rig.as_ref()?;
    let (most, carried) = link_carries(rig, channels);
    if carried.is_some_and(|c| rate_hz <= c) || f64::from(rate_hz) <= 0.95 * most {
        return None;
    }
    let link = &rig.rig.link;
    Some(format!(
        "{rate_hz} Hz of {channels} channels is more than the rig's {} link carries ({:.0} bytes/s: about {most:.0} samples/s of {channels} channels); {}",
        link.kind.name(),
        link.payload_bytes_per_s,
        match carried {
            Some(c) => format!("the highest rate it carries without loss is {c} Hz"),
            None => "none of the board's rates fits: capture fewer channels".into(),
        }
    ))
}

/// A time-sync exchange as the host saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sync {
    host_send_ns: i64,
    host_recv_ns: i64,
    rx_tick: u64,
    tx_tick: u64,
}

/// What the reader hands the writer.
#[derive(Debug)]
enum Record {
    /// A (re)connection: the device, the settings, and the time-sync exchange that anchors
    /// its ticks to host time.
    Segment {
        info: Info,
        mask: u8,
        rate_hz: u32,
        averaging: u16,
        anchor: Sync,
    },
    Block {
        first_index: u64,
        first_tick: u64,
        period_ticks: u32,
        mask: u8,
        codes: Vec<i16>,
        /// Frames lost on the link before this block, this connection.
        frames_lost: u64,
        /// Samples the host dropped before this block, all connections.
        host_drops: u64,
    },
    Edge(TriggerEdge),
    Sync(Sync),
    Status(Status),
    Log(String),
    /// A mark from the host: a log row at its own host time.
    Mark {
        host_ns: i64,
        text: String,
    },
    /// An event row from the host, as it is.
    Event(Box<Event>),
    /// The device went away.
    Lost {
        cause: String,
    },
    /// It is back (a Segment follows if it had to be restarted).
    Resumed,
    End,
}

/// Captures until `stop` is set, the duration is over, or an error; calls `progress`
/// about four times a second. The recording is finalised in every case; on error, what
/// was captured before it is in the file.
pub fn capture(
    config: &Config,
    stop: &AtomicBool,
    counters: &Arc<Counters>,
    progress: impl FnMut(&Progress),
) -> Result<Summary, CaptureError> {
    run_capture(config, None, stop, counters, progress)
}

/// As [`capture`], serving the requests made through `control` while it runs (from
/// when the device has started until the capture ends).
pub fn capture_controlled(
    config: &Config,
    control: &Control,
    stop: &AtomicBool,
    counters: &Arc<Counters>,
    progress: impl FnMut(&Progress),
) -> Result<Summary, CaptureError> {
    run_capture(config, Some(control), stop, counters, progress)
}

fn run_capture(
    config: &Config,
    control: Option<&Control>,
    stop: &AtomicBool,
    counters: &Arc<Counters>,
    mut progress: impl FnMut(&Progress),
) -> Result<Summary, CaptureError> {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            CaptureError::Transport(TransportError::Port {
                path: config.port.clone(),
                error: e.to_string(),
            })
        })?;
    // The output is taken before the device starts, so that an existing, locked or
    // unwritable output is refused first; a wrong port then leaves no file behind.
    let claim = Claim::new(&config.output, config.replace)?;
    let (rig, segment) = match rt.block_on(connect(config, false, None)) {
        Ok(c) => c,
        Err(e) => {
            claim.abandon();
            return Err(e);
        }
    };
    let (mut tx, rx) = HeapRb::<Record>::new(RING_RECORDS).split();
    let device = match &segment {
        Some(Record::Segment { info, .. }) => (info.tick_hz, info.trigger_outputs),
        _ => (0, 0),
    };
    let settings = match &segment {
        Some(Record::Segment { mask, rate_hz, .. }) => (*rate_hz, mask.count_ones() as usize),
        _ => (0, 0),
    };
    if let Some(segment) = segment {
        let _ = tx.try_push(segment);
    }
    // Requests are taken from now on: they follow the segment in the ring, so the
    // recording has started when they are written.
    if let Some(c) = control {
        c.open();
    }
    let writer = {
        let output = config.output.clone();
        let config = config.clone();
        let counters = counters.clone();
        std::thread::Builder::new()
            .name("railtrace-writer".into())
            .spawn(move || {
                let r = write_loop(&config, claim, rx, &counters);
                counters.writer_stopped.store(true, Ordering::Relaxed);
                r
            })
            .map_err(|e| {
                if let Some(c) = control {
                    c.close();
                }
                CaptureError::Recording(RecordingError::Io {
                    path: output,
                    error: e,
                })
            })?
    };
    let mut reader = Reader {
        config,
        counters,
        tx,
        control,
        device,
        drives: Vec::new(),
        writer: writer.thread().clone(),
        pending_syncs: HashMap::new(),
        frames_lost_closed: 0,
        rejected_closed: 0,
        drops_closed: 0,
        drops_now: 0,
        host_drops: 0,
    };
    counters.connected.store(true, Ordering::Relaxed);
    let result = rt.block_on(reader.run(rig, stop, started, &mut progress));
    reader.close_control();
    reader.push(Record::End);
    let written = writer.join().unwrap_or_else(|_| {
        Err(RecordingError::Io {
            path: config.output.clone(),
            error: std::io::Error::other("the writer thread panicked"),
        })
    });
    let rows = written?;
    result?;
    let p = counters.progress(started.elapsed());
    progress(&p);
    let drops_cause = (p.device_drops > 0).then(|| {
        let (rate_hz, channels) = settings;
        let why = (link_refusal(config, rate_hz, channels)).unwrap_or_else(|| match &config.rig {
            Some(_) => format!("{rate_hz} Hz of {channels} channels fits the rig's link: the device fell behind, or the link carried less than its rig description says"),
            None => format!("{rate_hz} Hz of {channels} channels was more than the link carried (with the rig's description, --rig, a rate its link cannot carry is refused before capturing)"),
        });
        format!("the device dropped {} samples: {why}", p.device_drops)
    });
    Ok(Summary {
        progress: p,
        rows,
        output: config.output.clone(),
        drops_cause,
    })
}

/// Opens the port, checks the device, configures it, anchors its clock and starts it.
/// Frames of an earlier run that arrive meanwhile go to `on`.
///
/// With `resume`, a device found still running (the link went away, the device did not)
/// is left running: its stream goes on with the same sample numbering and clock, and
/// None is returned instead of a new segment.
async fn connect(
    config: &Config,
    resume: bool,
    mut on: Option<&mut dyn FnMut(&Message<'_>)>,
) -> Result<(Rig, Option<Record>), CaptureError> {
    let mut sink = |m: &Message<'_>| {
        if let Some(on) = on.as_mut() {
            on(m)
        }
    };
    let mut rig = Rig::open(&config.port)?;
    let mut tries = 0;
    let info = loop {
        // A damaged answer is lost like any frame: ask again.
        match rig.info(COMMAND_TIMEOUT).await {
            Err(TransportError::Timeout { .. }) if tries < RETRIES => tries += 1,
            r => break r?,
        }
    };
    if resume {
        let mut running = false;
        let get_status = |id| Message::GetStatus { request_id: id };
        command(&mut rig, "GetStatus", get_status, &mut |m| {
            if let Message::Status(s) = m {
                running = s.state == railtrace_protocol::RunState::Running;
            }
            sink(m)
        })
        .await?;
        if running {
            return Ok((rig, None));
        }
    }
    // A device left running (by another program, or by us before it reset) is stopped
    // first; an idle one answers Ok as well.
    command(
        &mut rig,
        "Stop",
        |id| Message::Stop { request_id: id },
        &mut sink,
    )
    .await?;
    let mut mask = 0u8;
    match &config.channels {
        Some(list) => {
            for &c in list {
                if !info.channels.iter().any(|ch| ch.index == c) {
                    return Err(CaptureError::Settings(format!(
                        "{}: the device has no channel {c} (it has {})",
                        config.port.display(),
                        info.channels
                            .iter()
                            .map(|c| c.index.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                mask |= 1 << c;
            }
        }
        None => {
            for c in &info.channels {
                mask |= 1 << c.index;
            }
        }
    }
    let rate_hz = match config.rate_hz {
        Some(r) if info.sample_rates_hz.contains(&r) => r,
        Some(r) => {
            return Err(CaptureError::Settings(format!(
                "{}: the device offers {} Hz, not {r} Hz",
                config.port.display(),
                info.sample_rates_hz
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
        None => {
            // The highest rate the rig's link carries for these channels, where its
            // description says; else the device's highest.
            let carried =
                (config.rig.as_ref()).and_then(|r| link_carries(r, mask.count_ones() as usize).1);
            let rates = info.sample_rates_hz.iter().copied();
            let highest = (rates
                .clone()
                .filter(|&r| carried.is_none_or(|c| r <= c))
                .max())
            .or_else(|| rates.clone().min())
            .unwrap_or(0);
            config.rate_at_least_hz.map_or(highest, |least| {
                let enough = info.sample_rates_hz.iter().copied().filter(|&r| r >= least);
                enough.min().unwrap_or(highest)
            })
        }
    };
    if let Some(why) = link_refusal(config, rate_hz, mask.count_ones() as usize) {
        if !config.allow_drops {
            return Err(CaptureError::Settings(format!(
                "{}: {why}. Ask for that rate (--rate), fewer channels, or allow the device to drop whole blocks (--allow-drops)",
                config.port.display()
            )));
        }
        if !resume {
            eprintln!(
                "railtrace: warning: {why}: the device will drop whole blocks, each a gap row"
            );
        }
    }
    let averaging = config.averaging.max(1);
    let configure = |id| {
        Message::Configure(railtrace_protocol::Configure {
            request_id: id,
            sample_rate_hz: rate_hz,
            channel_mask: mask,
            averaging,
        })
    };
    command(&mut rig, "Configure", configure, &mut sink).await?;
    let mut tries = 0;
    let anchor = loop {
        match time_sync(&mut rig, &mut sink).await {
            Err(CaptureError::Transport(TransportError::Timeout { .. })) if tries < RETRIES => {
                tries += 1
            }
            r => break r?,
        }
    };
    // A Start whose answer was lost leaves the device running: a second Start is then
    // refused as Busy, which is success.
    match command(
        &mut rig,
        "Start",
        |id| Message::Start { request_id: id },
        &mut sink,
    )
    .await
    {
        Err(TransportError::Refused {
            code: ResultCode::Busy,
            ..
        }) => {}
        r => r?,
    }
    Ok((
        rig,
        Some(Record::Segment {
            info,
            mask,
            rate_hz,
            averaging,
            anchor,
        }),
    ))
}

/// Tries for a lost answer.
const RETRIES: u32 = 3;

/// A command, sent again when its answer is lost.
async fn command(
    rig: &mut Rig,
    name: &'static str,
    make: impl Fn(u16) -> Message<'static>,
    on: &mut dyn FnMut(&Message<'_>),
) -> Result<(), TransportError> {
    let mut tries = 0;
    loop {
        match rig.command(name, &make, COMMAND_TIMEOUT, &mut *on).await {
            Err(TransportError::Timeout { .. }) if tries < RETRIES => tries += 1,
            r => return r,
        }
    }
}

/// One time-sync exchange, waited for.
async fn time_sync(rig: &mut Rig, on: &mut dyn FnMut(&Message<'_>)) -> Result<Sync, CaptureError> {
    let nonce = host_now_ns() as u32;
    let host_send_ns = host_now_ns();
    let mut reply = None;
    rig.command(
        "TimeSync",
        |id| {
            Message::TimeSync(railtrace_protocol::TimeSyncRequest {
                request_id: id,
                nonce,
            })
        },
        COMMAND_TIMEOUT,
        |m| match m {
            Message::TimeSyncReply(r) if r.nonce == nonce => {
                reply = Some(Sync {
                    host_send_ns,
                    host_recv_ns: host_now_ns(),
                    rx_tick: r.rx_tick,
                    tx_tick: r.tx_tick,
                })
            }
            m => on(m),
        },
    )
    .await?;
    reply.ok_or_else(|| {
        CaptureError::Transport(TransportError::Port {
            path: rig.path().to_path_buf(),
            error: "TimeSync answered without a TimeSyncReply".into(),
        })
    })
}

struct Reader<'a> {
    config: &'a Config,
    counters: &'a Arc<Counters>,
    tx: ringbuf::HeapProd<Record>,
    control: Option<&'a Control>,
    /// The device's tick rate and trigger outputs (this connection).
    device: (u32, u8),
    /// Drives sent and not yet answered.
    drives: Vec<Sent>,
    writer: std::thread::Thread,
    pending_syncs: HashMap<u32, i64>,
    /// Totals of connections that ended.
    frames_lost_closed: u64,
    rejected_closed: u64,
    drops_closed: u64,
    /// Device drops of this connection, from its latest status.
    drops_now: u64,
    host_drops: u64,
}

/// A drive sent to the rig, waiting for its answer.
#[derive(Debug, Clone, Copy)]
struct Sent {
    /// The control's id.
    id: u64,
    /// The command's request id.
    request_id: u16,
    line: u8,
    at: Instant,
}

impl std::fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader<'_> {
    fn push(&mut self, r: Record) {
        let samples = match &r {
            Record::Block { codes, mask, .. } => {
                (codes.len() / (mask.count_ones().max(1) as usize)) as u64
            }
            _ => 0,
        };
        match self.tx.try_push(r) {
            Ok(()) => {}
            Err(Record::End) => {
                // Wait for room: the end must arrive, unless the writer stopped.
                while self.tx.try_push(Record::End).is_err()
                    && !self.counters.writer_stopped.load(Ordering::Relaxed)
                {
                    self.writer.unpark();
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Err(_) => {
                // The writer is behind: count the loss, the writer marks the gap.
                self.host_drops += samples;
                self.counters
                    .host_drops
                    .store(self.host_drops, Ordering::Relaxed);
            }
        }
    }

    /// Turns one message into records.
    fn on_message(&mut self, m: &Message<'_>, frames_lost: u64) {
        let r = match m {
            Message::TimeSyncReply(r) => match self.pending_syncs.remove(&r.nonce) {
                Some(host_send_ns) => Record::Sync(Sync {
                    host_send_ns,
                    host_recv_ns: host_now_ns(),
                    rx_tick: r.rx_tick,
                    tx_tick: r.tx_tick,
                }),
                None => return,
            },
            m => match owned(m, self.frames_lost_closed + frames_lost, self.host_drops) {
                Some(r) => r,
                None => return,
            },
        };
        self.push_noted(r);
    }

    /// Pushes a record, keeping the device-drop counter up to date from a status.
    fn push_noted(&mut self, r: Record) {
        if let Record::Status(s) = &r {
            self.drops_now = s.dropped_total();
            self.counters
                .device_drops
                .store(self.drops_closed + self.drops_now, Ordering::Relaxed);
        }
        self.push(r);
    }

    fn update_link(&self, rig: &Rig) {
        self.counters
            .frames_lost
            .store(self.frames_lost_closed + rig.seq.lost, Ordering::Relaxed);
        self.counters.bytes_rejected.store(
            self.rejected_closed + rig.stats().bytes_rejected,
            Ordering::Relaxed,
        );
    }

    /// Serves the control's requests: drives are sent without waiting for their answer,
    /// marks and events go to the writer. A failed send fails the drives of this round
    /// and is returned (the link is lost).
    async fn serve(&mut self, rig: &mut Rig) -> Result<(), TransportError> {
        let Some(control) = self.control else {
            return Ok(());
        };
        let mut failed: Option<TransportError> = None;
        for r in control.take() {
            let (id, line, high, pulse_s) = match r {
                Request::Drive {
                    id,
                    line,
                    high,
                    pulse_s,
                } => (id, line, high, pulse_s),
                r => {
                    self.push_request(r);
                    continue;
                }
            };
            if let Some(e) = &failed {
                let why = format!("not sent: {e}");
                control.answer(id, Err(ControlError::Failed { line, why }));
                continue;
            }
            let pulse_ticks = match pulse_s.map(|p| pulse_ticks(line, p, self.device.0)) {
                None => 0,
                Some(Ok(t)) => t,
                Some(Err(e)) => {
                    control.answer(id, Err(e));
                    continue;
                }
            };
            let drive = |request_id| {
                Message::DriveTrigger(railtrace_protocol::DriveTrigger {
                    request_id,
                    line,
                    high,
                    pulse_ticks,
                })
            };
            match rig.send(drive).await {
                Ok(request_id) => self.drives.push(Sent {
                    id,
                    request_id,
                    line,
                    at: Instant::now(),
                }),
                Err(e) => {
                    let why = format!("not sent: {e}");
                    control.answer(id, Err(ControlError::Failed { line, why }));
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// A mark or an event for the writer.
    fn push_request(&mut self, r: Request) {
        match r {
            Request::Mark { host_ns, text } => self.push(Record::Mark { host_ns, text }),
            Request::Event(e) => self.push(Record::Event(e)),
            Request::Drive { .. } => {}
        }
    }

    /// Answers the drives whose results came (other results are dropped), and those
    /// unanswered for longer than a command's timeout.
    fn answer_drives(&mut self, rig: &mut Rig) {
        let results = rig.take_results();
        let Some(control) = self.control else {
            return;
        };
        let outputs = self.device.1;
        for r in results {
            let Some(i) = self
                .drives
                .iter()
                .position(|d| d.request_id == r.request_id)
            else {
                continue;
            };
            let d = self.drives.swap_remove(i);
            let line = d.line;
            control.answer(
                d.id,
                match r.code {
                    ResultCode::Ok => Ok(()),
                    ResultCode::InvalidArgument => Err(ControlError::NoOutput { line, outputs }),
                    code => Err(ControlError::Refused { line, code }),
                },
            );
        }
        self.drives.retain(|d| {
            let late = d.at.elapsed() > COMMAND_TIMEOUT;
            if late {
                let (line, waited) = (d.line, COMMAND_TIMEOUT);
                control.answer(d.id, Err(ControlError::Timeout { line, waited }));
            }
            !late
        });
    }

    /// Fails the drives sent and not answered (the link was lost, or the capture ends).
    fn fail_drives(&mut self, why: &str) {
        let Some(control) = self.control else {
            return;
        };
        for d in self.drives.drain(..) {
            let why = why.to_string();
            control.answer(d.id, Err(ControlError::Failed { line: d.line, why }));
        }
    }

    /// The capture ends: drives still waiting fail, marks and events still queued are
    /// written.
    fn close_control(&mut self) {
        self.fail_drives("the capture ended before the rig answered");
        if let Some(control) = self.control {
            for r in control.close() {
                self.push_request(r);
            }
        }
    }

    async fn run(
        &mut self,
        mut rig: Rig,
        stop: &AtomicBool,
        started: Instant,
        progress: &mut impl FnMut(&Progress),
    ) -> Result<(), CaptureError> {
        let mut next_sync = Instant::now() + SYNC_INTERVAL;
        let mut next_progress = Instant::now();
        let mut last_rx = Instant::now();
        let mut restarts = rig.seq.restarts;
        loop {
            if self.counters.writer_stopped.load(Ordering::Relaxed) {
                return Ok(()); // the writer's error is the capture's
            }
            let done = stop.load(Ordering::Relaxed)
                || self.config.duration.is_some_and(|d| started.elapsed() >= d);
            if done {
                let r = self.finish(&mut rig).await;
                self.answer_drives(&mut rig);
                return r;
            }
            if Instant::now() >= next_progress {
                next_progress += Duration::from_millis(250);
                progress(&self.counters.progress(started.elapsed()));
            }
            let mut result = self.serve(&mut rig).await.map(|()| true);
            if result.is_ok() && Instant::now() >= next_sync {
                next_sync += SYNC_INTERVAL;
                let nonce = host_now_ns() as u32;
                self.pending_syncs.insert(nonce, host_now_ns());
                self.pending_syncs
                    .retain(|_, t| host_now_ns() - *t < 10_000_000_000);
                result = rig
                    .send(|id| {
                        Message::TimeSync(railtrace_protocol::TimeSyncRequest {
                            request_id: id,
                            nonce,
                        })
                    })
                    .await
                    .map(|_| true);
            }
            if result.is_ok() {
                result = rig
                    .pump_counted(Duration::from_millis(50), |m, lost| {
                        self.on_message(m, lost)
                    })
                    .await;
            }
            self.answer_drives(&mut rig);
            self.update_link(&rig);
            self.writer.unpark();
            let cause = match result {
                Ok(true) if rig.seq.restarts > restarts => {
                    Some("the device reset (its frame numbers started over)".to_string())
                }
                Ok(true) => {
                    last_rx = Instant::now();
                    None
                }
                Ok(false) if last_rx.elapsed() > SILENCE => Some(format!(
                    "{}: nothing received for {SILENCE:?}",
                    self.config.port.display()
                )),
                Ok(false) => None,
                Err(e @ TransportError::Version { .. }) => return Err(e.into()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(cause) = cause {
                self.fail_drives(&format!(
                    "no answer: the link to the rig was lost ({cause})"
                ));
                self.push(Record::Lost { cause });
                match self.reconnect(rig, stop, started, progress).await? {
                    Some(r) => rig = r,
                    None => return Ok(()), // stopped while waiting
                }
                last_rx = Instant::now();
                restarts = rig.seq.restarts;
            }
        }
    }

    /// Waits for the device to come back; None when stopped meanwhile.
    async fn reconnect(
        &mut self,
        old: Rig,
        stop: &AtomicBool,
        started: Instant,
        progress: &mut impl FnMut(&Progress),
    ) -> Result<Option<Rig>, CaptureError> {
        self.frames_lost_closed += old.seq.lost;
        let lost = self.frames_lost_closed;
        self.rejected_closed += old.stats().bytes_rejected;
        self.drops_closed += self.drops_now;
        self.drops_now = 0;
        drop(old);
        self.counters.connected.store(false, Ordering::Relaxed);
        let gone = Instant::now();
        let host_drops = self.host_drops;
        loop {
            if stop.load(Ordering::Relaxed)
                || self.config.duration.is_some_and(|d| started.elapsed() >= d)
            {
                return Ok(None);
            }
            if gone.elapsed() > self.config.reconnect_wait {
                return Err(CaptureError::Gone {
                    path: self.config.port.clone(),
                    waited: self.config.reconnect_wait,
                });
            }
            progress(&self.counters.progress(started.elapsed()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut early = Vec::new();
            let mut keep = |m: &Message<'_>| early.extend(owned(m, lost, host_drops));
            match connect(self.config, true, Some(&mut keep)).await {
                Ok((rig, segment)) => {
                    // What arrived while reconnecting: a resumed stream's next blocks,
                    // or the old run's last ones before a restart.
                    for r in early {
                        self.push(r);
                    }
                    self.push(Record::Resumed);
                    if let Some(segment) = segment {
                        if let Record::Segment { info, .. } = &segment {
                            self.device = (info.tick_hz, info.trigger_outputs);
                        }
                        self.push(segment);
                    }
                    self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                    self.counters.connected.store(true, Ordering::Relaxed);
                    return Ok(Some(rig));
                }
                Err(CaptureError::Settings(s)) => return Err(CaptureError::Settings(s)),
                Err(_) => continue, // not back yet
            }
        }
    }

    /// Stops the device and takes what it still sends.
    async fn finish(&mut self, rig: &mut Rig) -> Result<(), CaptureError> {
        let lost = self.frames_lost_closed + rig.seq.lost;
        let mut msgs = Vec::new();
        let r = rig
            .command(
                "Stop",
                |id| Message::Stop { request_id: id },
                COMMAND_TIMEOUT,
                |m| msgs.push(owned(m, lost, self.host_drops)),
            )
            .await;
        for m in msgs.into_iter().flatten() {
            self.push_noted(m);
        }
        self.update_link(rig);
        match r {
            Ok(()) | Err(TransportError::Closed(_)) => Ok(()),
            Err(TransportError::Refused {
                code: ResultCode::Busy,
                ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn block(b: &SampleBlock<'_>, frames_lost: u64, host_drops: u64) -> Record {
    Record::Block {
        first_index: b.first_index,
        first_tick: b.first_tick,
        period_ticks: b.period_ticks,
        mask: b.channel_mask,
        codes: {
            let bytes = b.codes.as_bytes();
            let mut codes = vec![0i16; bytes.len() / 2];
            for (c, x) in codes.iter_mut().zip(bytes.chunks_exact(2)) {
                *c = i16::from_le_bytes([x[0], x[1]]);
            }
            codes
        },
        frames_lost,
        host_drops,
    }
}

/// The records of a message that the writer keeps (all but time-sync replies, which need
/// the host's send time).
fn owned(m: &Message<'_>, frames_lost: u64, host_drops: u64) -> Option<Record> {
    Some(match m {
        Message::SampleBlock(b) => block(b, frames_lost, host_drops),
        Message::TriggerEdge(e) => Record::Edge(*e),
        Message::Status(s) => Record::Status(*s),
        Message::Log(l) => Record::Log(format!("{:?}: {}", l.level, l.text)),
        _ => return None,
    })
}

/// A rail and the channels that measure it.
#[derive(Debug, Clone, PartialEq)]
struct Rail {
    name: String,
    voltage: Option<u8>,
    current: Option<u8>,
}

/// How the codes of blocks of the channels in `mask` become the rails' volts and
/// amperes, as the capture turns each sample: the channels in slot (index) order, their
/// calibration, and each rail's voltage and current among them.
fn derive(info: &Info, mask: u8, rails: &[Rail]) -> Option<Derive> {
    let channels: Vec<u8> = (0..8).filter(|c| mask & (1 << c) != 0).collect();
    let cal = channels
        .iter()
        .map(|&c| {
            info.channels
                .iter()
                .find(|x| x.index == c)
                .map_or((1.0, 0.0), |x| (x.scale, x.offset))
        })
        .collect();
    let at = |c: Option<u8>| c.and_then(|c| channels.iter().position(|&x| x == c));
    let rails = rails
        .iter()
        .map(|r| (at(r.voltage), at(r.current)))
        .collect();
    (!channels.is_empty()).then(|| Derive {
        tick_hz: f64::from(info.tick_hz.max(1)),
        channels,
        cal,
        rails,
    })
}

/// The rails: from the rig description, or from the device's channel names.
fn rails(info: &Info, rig: Option<&RigDescription>) -> Vec<Rail> {
    let mut out: Vec<Rail> = Vec::new();
    let mut add = |name: &str, channel: u8, voltage: bool| {
        let i = match out.iter().position(|r| r.name == name) {
            Some(i) => i,
            None => {
                out.push(Rail {
                    name: name.to_string(),
                    voltage: None,
                    current: None,
                });
                out.len() - 1
            }
        };
        if voltage {
            out[i].voltage = Some(channel);
        } else {
            out[i].current = Some(channel);
        }
    };
    match rig {
        Some(rig) => {
            for c in &rig.channels {
                add(&c.rail, c.index, c.measures == Measures::Voltage);
            }
        }
        None => {
            for c in &info.channels {
                let (rail, voltage) = match (c.name.rsplit_once('_'), c.unit) {
                    (Some((r, "V")), "V") => (r.to_string(), true),
                    (Some((r, "I")), "A") => (r.to_string(), false),
                    _ => (c.name.clone(), c.unit == "V"),
                };
                add(&rail, c.index, voltage);
            }
        }
    }
    out
}

/// The writer's view of one connection.
#[derive(Debug)]
struct Segment {
    tick_hz: f64,
    anchor_tick: f64,
    anchor_s: f64,
    /// Calibration by channel index: (scale, offset).
    cal: [(f32, f32); 8],
    next_index: Option<u64>,
    /// Blocks of this channel mask are written as they came, as block rows: the
    /// recording's derive is this segment's calibration and clock.
    block_mask: Option<u8>,
}

impl Segment {
    fn time_s(&self, tick: u64) -> f64 {
        self.anchor_s + (tick as f64 - self.anchor_tick) / self.tick_hz
    }
}

fn mid(a: i64, b: i64) -> i64 {
    a + (b - a) / 2
}

fn status_json(s: &Status) -> String {
    serde_json::json!({
        "uptime_ticks": s.uptime_ticks,
        "samples_acquired": s.samples_acquired,
        "dropped_queue_full": s.dropped_queue_full,
        "dropped_link": s.dropped_link,
        "dropped_adc": s.dropped_adc,
        "frames_sent": s.frames_sent,
        "frames_rejected": s.frames_rejected,
        "edges_dropped": s.edges_dropped,
        "queue_high_water": s.queue_high_water,
        "queue_capacity": s.queue_capacity,
        "state": format!("{:?}", s.state),
    })
    .to_string()
}

/// Decodes a stored wire stream (the bytes a rig sent: its DeviceInfo, then sample
/// blocks, edges, status) into `config.output`, through the same conversion, gap
/// accounting and writer as a live capture, with the device's tick 0 anchored at the
/// host's present time. Returns the counters at the end and the rows written.
pub fn replay(stream: &[u8], config: &Config) -> Result<(Progress, u64), CaptureError> {
    let started = Instant::now();
    let counters = Counters::default();
    let mut w = Writing::new(
        config,
        &counters,
        Claim::new(&config.output, config.replace)?,
    );
    let mut decoder: railtrace_protocol::Decoder = railtrace_protocol::Decoder::new();
    let mut seq = railtrace_protocol::SeqTracker::new();
    let mut input = stream;
    while let Some(frame) = decoder.next(&mut input) {
        let Ok(frame) = frame else { continue }; // counted in the decoder's stats
        seq.observe(frame.seq);
        let record = match &frame.message {
            Message::DeviceInfo(i) => {
                let info = Info::from(i);
                let now = host_now_ns();
                Record::Segment {
                    mask: info.channels.iter().fold(0, |m, c| m | 1 << c.index),
                    rate_hz: config.rate_hz.unwrap_or(0),
                    averaging: config.averaging,
                    info,
                    anchor: Sync {
                        host_send_ns: now,
                        host_recv_ns: now,
                        rx_tick: 0,
                        tx_tick: 0,
                    },
                }
            }
            m => match owned(m, seq.lost, 0) {
                Some(r) => r,
                None => continue,
            },
        };
        w.record(record)?;
    }
    w.close_tail(false);
    counters.frames_lost.store(seq.lost, Ordering::Relaxed);
    counters
        .bytes_rejected
        .store(decoder.stats().bytes_rejected, Ordering::Relaxed);
    let rows = match w.file {
        Some(f) => f.finish()?,
        None => 0,
    };
    Ok((counters.progress(started.elapsed()), rows))
}

/// Writes an event row, and shows it to the tap.
fn write_event(file: &mut Writer, tap: Option<&dyn Tap>, e: &Event) {
    file.event(e);
    if let Some(t) = tap {
        t.event(e);
    }
}

/// Writes a gap row and counts it.
fn mark_gap(file: &mut Writer, counters: &Counters, tap: Option<&dyn Tap>, gap: Event) {
    write_event(file, tap, &gap);
    counters.gaps.fetch_add(1, Ordering::Relaxed);
}

/// The writer thread: records to rows until [`Record::End`].
fn write_loop(
    config: &Config,
    claim: Claim,
    mut rx: ringbuf::HeapCons<Record>,
    counters: &Counters,
) -> Result<u64, RecordingError> {
    let mut w = Writing::new(config, counters, claim);
    loop {
        let Some(r) = rx.try_pop() else {
            if let Some(f) = &mut w.file {
                f.maybe_flush()?;
                counters
                    .bytes_written
                    .store(f.bytes_written(), Ordering::Relaxed);
            }
            std::thread::park_timeout(Duration::from_millis(20));
            continue;
        };
        let end = matches!(r, Record::End);
        w.record(r)?;
        if end {
            break;
        }
    }
    if let Some(claim) = w.claim {
        claim.abandon();
    }
    match w.file {
        Some(f) => {
            let rows = f.finish()?;
            Ok(rows)
        }
        None => Ok(0),
    }
}

struct Writing<'a> {
    config: &'a Config,
    counters: &'a Counters,
    /// The output, until the first segment starts writing it.
    claim: Option<Claim>,
    file: Option<Writer>,
    rails: Vec<Rail>,
    code_channels: Vec<u8>,
    /// How the recording's block rows become volts and amperes, with its channel mask.
    derive: Option<(Derive, u8)>,
    epoch_ns: i64,
    seg: Option<Segment>,
    /// The device went away: why.
    lost: Option<String>,
    /// ... and came back restarted: the gap to mark before the next sample.
    reconnect_gap: Option<String>,
    /// ... and came back still running: blocks go on in the same segment.
    resumed: bool,
    /// Frames lost on the link, as of the last block.
    frames_lost: u64,
    last_sample_s: Option<f64>,
    host_drops: u64,
    period_s: f64,
    samples: u64,
    /// The device's count in its latest report of being idle, in this segment.
    stopped_at: Option<u64>,
}

impl<'a> Writing<'a> {
    fn new(config: &'a Config, counters: &'a Counters, claim: Claim) -> Writing<'a> {
        Writing {
            config,
            counters,
            claim: Some(claim),
            file: None,
            rails: Vec::new(),
            code_channels: Vec::new(),
            derive: None,
            epoch_ns: 0,
            seg: None,
            lost: None,
            reconnect_gap: None,
            resumed: false,
            frames_lost: 0,
            last_sample_s: None,
            host_drops: 0,
            period_s: 0.0,
            samples: 0,
            stopped_at: None,
        }
    }

    fn record(&mut self, r: Record) -> Result<(), RecordingError> {
        match r {
            Record::Segment {
                info,
                mask,
                rate_hz,
                averaging,
                anchor,
            } => self.segment(info, mask, rate_hz, averaging, anchor)?,
            Record::Block {
                first_index,
                first_tick,
                period_ticks,
                mask,
                codes,
                frames_lost,
                host_drops,
            } => {
                let (Some(seg), Some(file)) = (&mut self.seg, &mut self.file) else {
                    return Ok(());
                };
                let n_ch = mask.count_ones() as usize;
                if n_ch == 0 {
                    return Ok(());
                }
                let n = codes.len() / n_ch;
                let period_s = f64::from(period_ticks) / seg.tick_hz;
                self.period_s = period_s;
                // A gap: from the reconnect, or within a connection.
                if let Some(cause) = self.reconnect_gap.take() {
                    let start = self.last_sample_s.map_or(seg.anchor_s, |t| t + period_s);
                    mark_gap(
                        file,
                        self.counters,
                        self.config.tap.as_deref(),
                        Event::Gap {
                            time_s: start,
                            index: None,
                            samples: None,
                            duration_s: seg.time_s(first_tick) - start,
                            cause,
                        },
                    );
                } else if let Some(next) = seg.next_index.filter(|&x| first_index > x) {
                    let missing = first_index - next;
                    let link = frames_lost.saturating_sub(self.frames_lost);
                    let host = host_drops.saturating_sub(self.host_drops);
                    let cause = if let Some(cause) = self.lost.take() {
                        cause // the link went away and came back, the device ran on
                    } else if host > 0 {
                        format!("host: the writer fell behind and dropped {host} samples")
                    } else if link > 0 {
                        format!("link: {link} frame(s) lost (damaged or dropped bytes)")
                    } else {
                        "device: samples dropped on the device (queue full, link or ADC; see its status)"
                            .to_string()
                    };
                    let start_tick = first_tick.saturating_sub(missing * u64::from(period_ticks));
                    mark_gap(
                        file,
                        self.counters,
                        self.config.tap.as_deref(),
                        Event::Gap {
                            time_s: seg.time_s(start_tick),
                            index: Some(next),
                            samples: Some(missing),
                            duration_s: missing as f64 * period_s,
                            cause,
                        },
                    );
                } else if seg.next_index.is_some_and(|x| first_index < x) {
                    return Ok(()); // a block already written (a repeat): keep the first
                }
                self.frames_lost = frames_lost;
                self.host_drops = host_drops;
                if self.resumed {
                    // The stream went on where it was: nothing missing, nothing to mark.
                    self.lost = None;
                    self.resumed = false;
                }
                if seg.block_mask == Some(mask) {
                    // As they came: the reader makes volts, amperes and watts of them.
                    let t = seg.time_s(first_tick);
                    file.block(t, first_index, first_tick, period_ticks, period_s, &codes);
                    if let (Some(tap), Some((d, _))) = (&self.config.tap, &self.derive) {
                        tap.samples(t, period_s, &d.watts(&codes));
                    }
                    let last = first_tick + (n as u64).saturating_sub(1) * u64::from(period_ticks);
                    self.last_sample_s = Some(seg.time_s(last));
                } else {
                    // Slots of the enabled channels, in index order.
                    let slot = |ch: Option<u8>| {
                        ch.filter(|&c| mask & (1 << c) != 0)
                            .map(|c| ((mask & ((1u16 << c) - 1) as u8).count_ones() as usize, c))
                    };
                    let rail_slots: Vec<_> = self
                        .rails
                        .iter()
                        .map(|r| (slot(r.voltage), slot(r.current)))
                        .collect();
                    let code_slots: Vec<_> =
                        self.code_channels.iter().map(|&c| slot(Some(c))).collect();
                    let mut values = vec![(f32::NAN, f32::NAN); rail_slots.len()];
                    let mut raw = vec![0i16; code_slots.len()];
                    let phys = |s: usize, c: u8, row: &[i16]| {
                        let (scale, offset) = seg.cal[usize::from(c)];
                        f32::from(row[s]) * scale + offset
                    };
                    let mut watts = Vec::new();
                    for i in 0..n {
                        let row = &codes[i * n_ch..(i + 1) * n_ch];
                        for (v, (vs, cs)) in values.iter_mut().zip(&rail_slots) {
                            v.0 = vs.map_or(f32::NAN, |(s, c)| phys(s, c, row));
                            v.1 = cs.map_or(f32::NAN, |(s, c)| phys(s, c, row));
                        }
                        for (r, s) in raw.iter_mut().zip(&code_slots) {
                            *r = s.map_or(0, |(s, _)| row[s]);
                        }
                        let tick = first_tick + i as u64 * u64::from(period_ticks);
                        let t = seg.time_s(tick);
                        file.sample(t, Some(first_index + i as u64), Some(tick), &values, &raw);
                        self.last_sample_s = Some(t);
                        if self.config.tap.is_some() {
                            watts.extend(values.iter().map(|(v, a)| v * a));
                        }
                    }
                    if let Some(tap) = &self.config.tap {
                        tap.samples(seg.time_s(first_tick), period_s, &watts);
                    }
                }
                seg.next_index = Some(first_index + n as u64);
                self.samples += n as u64;
                self.counters.samples.store(self.samples, Ordering::Relaxed);
            }
            Record::Edge(e) => {
                let (Some(seg), Some(file)) = (&self.seg, &mut self.file) else {
                    return Ok(());
                };
                let output = e.line & railtrace_protocol::OUTPUT_LINE != 0;
                let line = e.line & !railtrace_protocol::OUTPUT_LINE;
                let label = self
                    .config
                    .rig
                    .as_ref()
                    .and_then(|r| {
                        r.rig
                            .triggers
                            .iter()
                            .find(|t| t.line == line && (t.direction == "output") == output)
                    })
                    .map_or(String::new(), |t| t.name.clone());
                let edge = Event::Edge {
                    time_s: seg.time_s(e.tick),
                    tick: Some(e.tick),
                    index: Some(e.sample_index),
                    line: e.line,
                    rising: e.rising,
                    count: Some(u64::from(e.edge_count)),
                    label,
                };
                write_event(file, self.config.tap.as_deref(), &edge);
            }
            Record::Sync(s) => self.sync(&s),
            Record::Status(s) => {
                let (Some(seg), Some(file)) = (&self.seg, &mut self.file) else {
                    return Ok(());
                };
                // Stopped: what the device took after its last block is a gap at the end,
                // marked once the run's last frame is in (a status queued before the
                // last blocks may already report the device idle).
                if s.state == railtrace_protocol::RunState::Idle {
                    self.stopped_at = Some(s.samples_acquired);
                }
                let status = Event::Text {
                    kind: Kind::Status,
                    time_s: seg.time_s(s.uptime_ticks),
                    text: status_json(&s),
                };
                write_event(file, self.config.tap.as_deref(), &status);
            }
            Record::Log(text) => {
                let t = self.host_s(host_now_ns());
                if let Some(file) = &mut self.file {
                    file.event(&Event::Text {
                        kind: Kind::Log,
                        time_s: t,
                        text,
                    });
                }
            }
            Record::Mark { host_ns, text } => {
                let t = self.host_s(host_ns);
                if let Some(file) = &mut self.file {
                    let mark = Event::Text {
                        kind: Kind::Log,
                        time_s: t,
                        text: format!("mark: {text}"),
                    };
                    write_event(file, self.config.tap.as_deref(), &mark);
                }
            }
            Record::Event(e) => {
                if let Some(file) = &mut self.file {
                    write_event(file, self.config.tap.as_deref(), &e);
                }
            }
            Record::Lost { cause } => {
                let t = self.host_s(host_now_ns());
                if let Some(file) = &mut self.file {
                    file.event(&Event::Text {
                        kind: Kind::Log,
                        time_s: t,
                        text: format!("host: {cause}; waiting for it to come back"),
                    });
                    file.flush()?;
                }
                self.lost = Some(format!("disconnected: {cause}"));
                self.resumed = false;
            }
            Record::Resumed => self.resumed = true,
            Record::End => self.close_tail(true),
        }
        if let Some(f) = &mut self.file {
            f.maybe_flush()?;
            self.counters
                .bytes_written
                .store(f.bytes_written(), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Marks the samples the device took after its last block received, dropped on the
    /// device or lost on the link, as a gap at the end of the segment. At the capture's
    /// `end` with no report of the device stopping (it went away and did not come back, or
    /// fell silent, or did not answer Stop), everything from the last sample to now is a
    /// gap of unknown count.
    fn close_tail(&mut self, end: bool) {
        let (Some(seg), Some(file)) = (&mut self.seg, &mut self.file) else {
            return;
        };
        let Some(acquired) = self.stopped_at.take() else {
            let (Some(next), Some(last)) = (seg.next_index, self.last_sample_s) else {
                return;
            };
            let start = last + self.period_s;
            let now = (host_now_ns() - self.epoch_ns) as f64 * 1e-9;
            if !end || now <= start {
                return;
            }
            let cause = match self.lost.take() {
                Some(c) => format!("{c}; the capture ended before the device came back"),
                None => "device: nothing after this, and no report of it stopping (it did not answer Stop)".into(),
            };
            mark_gap(
                file,
                self.counters,
                self.config.tap.as_deref(),
                Event::Gap {
                    time_s: start,
                    index: Some(next),
                    samples: None,
                    duration_s: now - start,
                    cause,
                },
            );
            self.counters.ended_away.store(true, Ordering::Relaxed);
            return;
        };
        let next = seg.next_index.unwrap_or(0);
        if acquired <= next {
            return;
        }
        let missing = acquired - next;
        seg.next_index = Some(acquired);
        mark_gap(
            file,
            self.counters,
            self.config.tap.as_deref(),
            Event::Gap {
                time_s: self.last_sample_s.map_or(seg.anchor_s, |t| t + self.period_s),
                index: Some(next),
                samples: Some(missing),
                duration_s: missing as f64 * self.period_s,
                cause: "device: samples taken after the last block received, dropped on the device or lost on the link (see its status)".into(),
            },
        );
    }

    fn host_s(&self, ns: i64) -> f64 {
        (ns - self.epoch_ns) as f64 * 1e-9
    }

    fn sync(&mut self, s: &Sync) {
        let (Some(seg), Some(file)) = (&self.seg, &mut self.file) else {
            return;
        };
        file.event(&Event::TimeSync {
            time_s: seg.time_s(s.tx_tick),
            host_send_ns: s.host_send_ns,
            host_recv_ns: s.host_recv_ns,
            rx_tick: s.rx_tick,
            tx_tick: s.tx_tick,
        });
    }

    fn segment(
        &mut self,
        info: Info,
        mask: u8,
        rate_hz: u32,
        averaging: u16,
        anchor: Sync,
    ) -> Result<(), RecordingError> {
        self.close_tail(false);
        let host_mid = mid(anchor.host_send_ns, anchor.host_recv_ns);
        self.reconnect_gap = self.lost.take();
        self.resumed = false;
        if self.file.is_none() {
            self.epoch_ns = host_mid;
            self.rails = rails(&info, self.config.rig.as_ref().map(|r| &r.rig));
            self.code_channels = info.channels.iter().map(|c| c.index).collect();
            self.derive = derive(&info, mask, &self.rails).map(|d| (d, mask));
            let meta = Meta {
                version: FORMAT_VERSION,
                source: format!("capture {}", self.config.port.display()),
                epoch_utc_ns: self.epoch_ns,
                timebase: "device clock, anchored to host UTC by a time-sync exchange at each (re)connection; time_sync rows hold every exchange".into(),
                rails: self.rails.iter().map(|r| r.name.clone()).collect(),
                code_channels: self.code_channels.clone(),
                device: serde_json::to_value(&info).ok(),
                rig: self.config.rig.as_ref().map(|r| r.text.clone()),
                settings: Some(serde_json::json!({
                    "sample_rate_hz": rate_hz,
                    "channel_mask": mask,
                    "averaging": averaging,
                })),
                derive: self.derive.as_ref().map(|d| d.0.clone()),
            };
            let claim = match self.claim.take() {
                Some(c) => c,
                None => Claim::new(&self.config.output, true)?,
            };
            self.file = Some(Writer::start(claim, &meta)?);
            if let Some(tap) = &self.config.tap {
                tap.start(self.epoch_ns, &meta.rails);
            }
        }
        let mut cal = [(1.0, 0.0); 8];
        for c in &info.channels {
            if let Some(x) = cal.get_mut(usize::from(c.index)) {
                *x = (c.scale, c.offset);
            }
        }
        let mid_tick =
            anchor.rx_tick as f64 + (anchor.tx_tick as f64 - anchor.rx_tick as f64) / 2.0;
        let block_mask = self
            .derive
            .as_ref()
            .filter(|(d, m)| derive(&info, *m, &self.rails).as_ref() == Some(d))
            .map(|(_, m)| *m);
        self.seg = Some(Segment {
            tick_hz: f64::from(info.tick_hz.max(1)),
            anchor_tick: mid_tick,
            anchor_s: self.host_s(host_mid),
            cal,
            next_index: None,
            block_mask,
        });
        let t = self.host_s(host_mid);
        if let Some(file) = &mut self.file {
            file.event(&Event::Text {
                kind: Kind::Info,
                time_s: t,
                text: serde_json::json!({
                    "device": info,
                    "sample_rate_hz": rate_hz,
                    "channel_mask": mask,
                    "averaging": averaging,
                })
                .to_string(),
            });
        }
        self.sync(&anchor);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pulse is timed to the nearest tick of the rig's clock, at least one, and at most
    /// what the command's 32 bits count.
    #[test]
    fn a_pulse_is_counted_in_the_rigs_ticks() {
        assert_eq!(pulse_ticks(0, 0.02, 24_000_000), Ok(480_000));
        assert_eq!(pulse_ticks(0, 1.4e-8, 24_000_000), Ok(1)); // less than half a tick: one
        assert_eq!(pulse_ticks(0, 2.1e-8, 24_000_000), Ok(1));
        assert_eq!(pulse_ticks(0, 6.3e-8, 24_000_000), Ok(2));
        let e = pulse_ticks(2, 600.0, 24_000_000).unwrap_err();
        assert!(
            e.to_string().contains("trigger output 2") && e.to_string().contains("178.957 s"),
            "{e}"
        );
    }

    /// Requests to a capture that is not running are refused at once; a drive nobody
    /// answers times out and leaves nothing queued; when the capture ends, a drive still
    /// waiting is answered and the marks not yet written are handed back.
    #[test]
    fn control_requests_never_hang() {
        let c = Arc::new(Control::default());
        assert_eq!(c.mark("x"), Err(ControlError::NotRunning));
        let wait = Duration::from_secs(5);
        assert_eq!(c.drive(0, true, None, wait), Err(ControlError::NotRunning));
        let e = c.drive(0, true, Some(0.0), wait).unwrap_err();
        assert!(e.to_string().contains("more than 0 s"), "{e}");

        c.open();
        let short = Duration::from_millis(30);
        assert_eq!(
            c.drive(1, true, None, short),
            Err(ControlError::Timeout {
                line: 1,
                waited: short
            })
        );
        assert!(c.take().is_empty());

        c.mark_at(5, "hello").unwrap();
        let waiting = {
            let c = c.clone();
            std::thread::spawn(move || c.drive(0, false, Some(0.01), wait))
        };
        while c.lock().queue.len() < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let rest = c.close();
        assert!(matches!(&rest[..], [Request::Mark { host_ns: 5, text }] if text == "hello"));
        let e = waiting.join().unwrap().unwrap_err();
        assert!(matches!(e, ControlError::Failed { line: 0, .. }), "{e}");
        assert_eq!(c.mark("late"), Err(ControlError::NotRunning));
    }
}
