//! The microcontroller, live: the real firmware core (`railtrace-firmware`) in two
//! threads, its interrupt side and its main loop, against the simulated ADC and clock,
//! with its serial link on a real pseudo-terminal.
//!
//! - The *sample thread* plays the timer interrupts. Every millisecond of host time it
//!   runs every sample-timer tick that has come due (true time from the MCU clock model),
//!   setting the analog front end to that instant and calling the core's sampler, which
//!   drives the AD7606 model through the core's own driver. It also delivers trigger edges
//!   whose arrival time has come, stamped as the timer's input capture would, and keeps
//!   the GPU and its power logger moving with true time.
//! - The *main thread* polls the core's device every 250 µs: commands in, frames out.
//!
//! True time is the host's monotonic clock since the twin started, so the twin runs in
//! real time and a host talking to it sees a rig, not a simulation.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heapless::spsc::Queue;
use railtrace_firmware::ad7606::Ad7606;
use railtrace_firmware::{
    Board, Calibration, ChannelSpec, Description, Device, Edge, EdgeCapture, ErrorKind, Queues,
    Sample, Sampler, Shared, CHANNELS,
};
use railtrace_protocol::Quantity;

use crate::adc::SimAd7606;
use crate::clock::McuClockConfig;
use crate::pty::{Pty, PtyError};
use crate::random::{normal, uniform, Rng};
use crate::rig::{FrontEnd, LinkDescription, Measures, RigDescription};
use crate::trace::Segment;

/// The sample queue between the twin's interrupt thread and main loop: 16384 samples
/// (164 ms at 100 kS/s). Larger than the board's 256, because the twin's main loop is a
/// host thread that the operating system may hold off for milliseconds.
pub const SAMPLE_QUEUE: usize = 16384;
const EDGE_QUEUE: usize = 256;

/// How the trigger path behaves.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerPathConfig {
    /// Mean delay from the host driving a trigger line to the rig's capture, s (counted
    /// from the host's call; the capture's timestamp is exact whenever the edge is
    /// processed). 0 to [`MAX_TRIGGER_S`](crate::scenario::MAX_TRIGGER_S) in a scenario.
    #[serde(default)]
    pub latency_s: f64,
    /// RMS jitter of that delay, s (Gaussian; a delay that would come out negative is 0).
    /// 0 to [`MAX_TRIGGER_S`](crate::scenario::MAX_TRIGGER_S) in a scenario.
    #[serde(default)]
    pub jitter_s: f64,
}

/// Faults to inject on the link and the device.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// Probability that a frame the device sends gets one byte flipped (one bit of a byte
    /// that is not its delimiter): the host must reject it and count it lost.
    #[serde(default)]
    pub corrupt_frame_probability: f64,
    /// Probability that a frame loses one byte (not its delimiter).
    #[serde(default)]
    pub drop_byte_probability: f64,
    /// Frames are corrupted or truncated only until this long after the twin starts, s
    /// (none: for ever). This and the other times of faults: 0 to
    /// [`MAX_FAULT_S`](crate::scenario::MAX_FAULT_S) in a scenario.
    #[serde(default)]
    pub damage_until_s: Option<f64>,
    /// The link goes away this long after the twin starts, s (the pseudo-terminal
    /// closes; the device keeps running and counts the blocks it cannot send).
    #[serde(default)]
    pub disconnect_after_s: Option<f64>,
    /// How long the link stays away, s; then a new pseudo-terminal appears behind the
    /// same path.
    #[serde(default = "default_disconnected_s")]
    pub disconnected_s: f64,
    /// The device resets (firmware restarts, sequence numbers from 0) this long after the
    /// twin starts, s.
    #[serde(default)]
    pub reset_after_s: Option<f64>,
    /// Bytes per second the link carries (a slow host reader or a slow UART); none = as
    /// fast as the pseudo-terminal goes. Too slow a link makes the device drop blocks,
    /// counted. Within [`LINK_BYTES_PER_S`](crate::scenario::LINK_BYTES_PER_S) in a
    /// scenario.
    #[serde(default)]
    pub link_bytes_per_s: Option<f64>,
}

fn default_disconnected_s() -> f64 {
    1.0
}

/// The firmware's own settings in the twin.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirmwareConfig {
    /// Sample rates the device offers, Hz: some of the rig's board's (all of them when
    /// left empty, as [`crate::scenario::parse`] fills it).
    #[serde(default)]
    pub sample_rates_hz: Vec<u32>,
    /// Serial number it reports.
    #[serde(default = "default_serial")]
    pub serial: String,
    /// BUSY polls a conversion takes in the ADC model.
    #[serde(default = "default_busy_polls")]
    pub busy_polls: u32,
}

fn default_serial() -> String {
    "TWIN-0001".into()
}
fn default_busy_polls() -> u32 {
    3
}

impl Default for FirmwareConfig {
    fn default() -> Self {
        FirmwareConfig {
            sample_rates_hz: Vec::new(),
            serial: default_serial(),
            busy_polls: default_busy_polls(),
        }
    }
}

/// Why the twin could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    /// The pseudo-terminal.
    #[error(transparent)]
    Pty(#[from] PtyError),
    /// The rig.
    #[error(transparent)]
    Rig(#[from] crate::rig::RigError),
    /// A file or link error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A thread of the twin panicked.
    #[error("a twin thread failed: {0}")]
    Thread(String),
    /// The truth files.
    #[error(transparent)]
    Truth(#[from] crate::truth::TruthError),
}

/// What the twin counted while it ran: what it injected, so a host's counts can be
/// checked against it.
#[derive(Debug, Default)]
pub struct TwinStats {
    /// Frames sent with a flipped byte.
    pub frames_corrupted: AtomicU64,
    /// Frames sent with a byte missing.
    pub frames_truncated: AtomicU64,
    /// Frames the device wrote while the link was away (never seen by the host).
    pub frames_unsent: AtomicU64,
    /// Sample-timer ticks run.
    pub ticks: AtomicU64,
    /// Device resets injected.
    pub resets: AtomicU64,
    /// Disconnections injected.
    pub disconnects: AtomicU64,
}

/// Start/stop of the sample timer, from the main loop's board to the sample thread.
#[derive(Debug, Default)]
struct SampleTimer {
    /// The timer fires at ticks before this one (0: stopped; `u64::MAX`: running).
    stop_tick: AtomicU64,
    /// The device tick up to which the sample thread has run the timer.
    reached_tick: AtomicU64,
    period_ticks: AtomicU32,
    first_tick: AtomicU64,
    generation: AtomicU32,
}

/// What [`Hardware::on_sample`] calls: true time, device tick, the rails' true state.
pub type SampleHook = Box<dyn FnMut(f64, u64, Vec<crate::rig::RailState>)>;

/// Everything the sample thread needs from outside.
pub struct Hardware<F> {
    /// The rig as built.
    pub rig: RigDescription,
    /// The analog front end (GPU power to ADC inputs).
    pub front_end: FrontEnd<F>,
    /// Called every round with the true time reached: the GPU side drains its logger and
    /// executions here.
    pub on_time: Box<dyn FnMut(f64)>,
    /// Called after every conversion with its true time, its device tick and the rails'
    /// true state (for the truth files); none to skip.
    pub on_sample: Option<SampleHook>,
}

impl<F> std::fmt::Debug for Hardware<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hardware")
            .field("rig", &self.rig.name)
            .finish_non_exhaustive()
    }
}

/// The device side of the twin, running.
#[derive(Debug)]
pub struct Mcu {
    path: PathBuf,
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    t0: Instant,
    triggers: mpsc::Sender<(u8, bool, f64)>,
    stats: Arc<TwinStats>,
    threads: Vec<std::thread::JoinHandle<()>>,
    failure: Arc<Mutex<Option<String>>>,
}

/// The MCU's settings.
#[derive(Debug, Clone)]
pub struct McuConfig {
    /// Its clock.
    pub clock: McuClockConfig,
    /// Its firmware settings.
    pub firmware: FirmwareConfig,
    /// The trigger path.
    pub trigger: TriggerPathConfig,
    /// Faults to inject.
    pub faults: FaultConfig,
    /// The host link the rig has.
    pub link: LinkDescription,
    /// Seed for the trigger jitter and the faults.
    pub seed: u64,
}

impl Mcu {
    /// Starts the MCU at true time 0 = `t0`: opens the pseudo-terminal (its stable path is
    /// [`Mcu::path`]) and the two threads. `make_hardware` runs on the sample thread and builds what lives
    /// there (the front end borrows nothing across threads).
    pub fn start<F, H>(config: McuConfig, t0: Instant, make_hardware: H) -> Result<Mcu, TwinError>
    where
        F: FnMut() -> Segment + 'static,
        H: FnOnce() -> Result<Hardware<F>, TwinError> + Send + 'static,
    {
        let dir = private_temp_dir("railtrace-twin-")?;
        let path = dir.join("tty");
        let pty = Pty::open()?;
        link(pty.path(), &path)?;

        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(TwinStats::default());
        let failure = Arc::new(Mutex::new(None));
        let timer = Arc::new(SampleTimer::default());
        let (trigger_tx, trigger_rx) = mpsc::channel::<(u8, bool, f64)>();
        // The queues and shared state live as long as the process: the firmware core is
        // written for statics, and a twin runs once or a few times per process.
        let shared: &'static Shared = Box::leak(Box::new(Shared::new()));
        let samples: &'static mut Queue<Sample, SAMPLE_QUEUE> = Box::leak(Box::new(Queue::new()));
        let edges: &'static mut Queue<Edge, EDGE_QUEUE> = Box::leak(Box::new(Queue::new()));
        let (sample_in, sample_out) = samples.split();
        let (edge_in, edge_out) = edges.split();
        let (desc_tx, desc_rx) = mpsc::channel::<Result<Description, String>>();

        let mut threads = Vec::new();
        {
            let (stop, stats, timer, failure) =
                (stop.clone(), stats.clone(), timer.clone(), failure.clone());
            let config = config.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("twin-sample".into())
                    .spawn(move || {
                        let hw = match make_hardware() {
                            Ok(hw) => hw,
                            Err(e) => {
                                let _ = desc_tx.send(Err(e.to_string()));
                                return;
                            }
                        };
                        let _ = desc_tx.send(Ok(description(&hw.rig, &config)));
                        let result = sample_thread(
                            hw, &config, t0, shared, sample_in, edge_in, trigger_rx, &timer, &stop,
                            &stats,
                        );
                        if let Err(e) = result {
                            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            stop.store(true, Ordering::Relaxed);
                        }
                    })?,
            );
        }
        let description = match desc_rx.recv() {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => return Err(TwinError::Thread(e)),
            Err(_) => return Err(TwinError::Thread("the sample thread died at start".into())),
        };
        {
            let (stop, stats, timer, path) =
                (stop.clone(), stats.clone(), timer.clone(), path.clone());
            threads.push(std::thread::Builder::new().name("twin-main".into()).spawn(
                move || {
                    main_thread(
                        description,
                        config,
                        t0,
                        shared,
                        Queues {
                            samples: sample_out,
                            edges: edge_out,
                        },
                        pty,
                        &path,
                        &timer,
                        &stop,
                        &stats,
                    )
                },
            )?);
        }
        Ok(Mcu {
            path,
            dir,
            stop,
            t0,
            triggers: trigger_tx,
            stats,
            threads,
            failure,
        })
    }

    /// The device's serial port: a stable link to the current pseudo-terminal.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Drives the host-side trigger output `line` (as a GPIO or a USB-UART line would):
    /// the edge reaches the rig's capture after the trigger path's latency and jitter.
    pub fn trigger(&self, line: u8, high: bool) {
        let _ = self
            .triggers
            .send((line, high, self.t0.elapsed().as_secs_f64()));
    }

    /// What the twin injected so far.
    pub fn stats(&self) -> &TwinStats {
        &self.stats
    }

    /// True while both threads run.
    pub fn is_running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Stops the threads and closes the port. Reports a thread's failure, if any.
    pub fn stop(mut self) -> Result<(), TwinError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), TwinError> {
        self.stop.store(true, Ordering::Relaxed);
        let mut panicked = None;
        for t in self.threads.drain(..) {
            if let Err(p) = t.join() {
                panicked = Some(format!("{p:?}"));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let failure = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match failure.or(panicked) {
            Some(e) => Err(TwinError::Thread(e)),
            None => Ok(()),
        }
    }
}

impl Drop for Mcu {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// A new folder in the system's temporary folder (`$TMPDIR`) that only this user may
/// enter, named `prefix` and 16 random hex digits: where the twin's serial port, or a
/// live view's temporary recording, is made (see [`private_dir`]).
pub fn private_temp_dir(prefix: &str) -> std::io::Result<PathBuf> {
    let parent = std::env::temp_dir();
    private_dir(&parent, prefix, random_u64).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot make a folder in {}: {e}", parent.display()),
        )
    })
}

/// Makes a folder under `parent`: a new directory named `prefix` and 16 hex digits from
/// `suffix`, that only this user may enter (mode 0700). It is always made anew: a name
/// taken already (by a file, a directory, or a link someone planted to redirect what is
/// made there) is passed over for the next draw.
fn private_dir(
    parent: &Path,
    prefix: &str,
    mut suffix: impl FnMut() -> std::io::Result<u64>,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    for _ in 0..64 {
        let dir = parent.join(format!("{prefix}{:016x}", suffix()?));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            made => return made.map(|()| dir),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!(
            "no free name for the serial port's folder in {}",
            parent.display()
        ),
    ))
}

/// 64 bits from the system's random source.
fn random_u64() -> std::io::Result<u64> {
    use std::io::Read;
    let mut bytes = [0; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// Points `link` at `target`, replacing what was there.
fn link(target: &Path, link: &Path) -> std::io::Result<()> {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
}

/// The DeviceInfo of the twin's firmware, from the rig description. Names and the like
/// must be `'static` for the firmware core; they are leaked once per twin.
fn description(rig: &RigDescription, config: &McuConfig) -> Description {
    let lsb_v = 2.0 * rig.adc.range_v / 65536.0;
    let mut channels = Vec::new();
    for c in &rig.channels {
        let (quantity, suffix) = match c.measures {
            Measures::Current => (Quantity::Current, "I"),
            Measures::Voltage => (Quantity::Voltage, "V"),
        };
        let name = truncated(
            &format!("{}_{suffix}", c.rail),
            railtrace_protocol::MAX_CHANNEL_NAME_LEN,
        );
        channels.push(ChannelSpec {
            index: c.index,
            quantity,
            name: Box::leak(name.into_boxed_str()),
            default_calibration: Calibration {
                scale: (lsb_v / c.sensitivity) as f32,
                offset: 0.0,
            },
        });
    }
    let inputs = rig
        .triggers
        .iter()
        .filter(|t| t.direction == "input")
        .count();
    let outputs = rig
        .triggers
        .iter()
        .filter(|t| t.direction == "output")
        .count();
    let serial = truncated(&config.firmware.serial, railtrace_protocol::MAX_ID_LEN);
    Description {
        board: "railtrace twin",
        serial: Box::leak(serial.into_boxed_str()),
        firmware_version: (0, 1, 0),
        tick_hz: config.clock.tick_hz,
        adc_bits: rig.adc.bits,
        test_signal: false,
        sample_rates_hz: Box::leak(config.firmware.sample_rates_hz.clone().into_boxed_slice()),
        trigger_inputs: inputs.min(4) as u8,
        trigger_outputs: outputs.min(4) as u8,
        channels: Box::leak(channels.into_boxed_slice()),
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn truncated(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[allow(clippy::too_many_arguments)]
fn sample_thread<F: FnMut() -> Segment>(
    hw: Hardware<F>,
    config: &McuConfig,
    t0: Instant,
    shared: &'static Shared,
    samples: heapless::spsc::Producer<'static, Sample, SAMPLE_QUEUE>,
    edges: heapless::spsc::Producer<'static, Edge, EDGE_QUEUE>,
    triggers: mpsc::Receiver<(u8, bool, f64)>,
    timer: &SampleTimer,
    stop: &AtomicBool,
    stats: &TwinStats,
) -> Result<(), String> {
    let range_v = hw.rig.adc.range_v;
    let Hardware {
        front_end,
        mut on_time,
        mut on_sample,
        ..
    } = hw;
    let chip = SimAd7606::new(front_end, config.firmware.busy_polls, range_v);
    let (spi, convst, busy) = chip.pins();
    let adc = Ad7606::new(spi, convst, busy).map_err(|e| format!("ADC: {e:?}"))?;
    let mut sampler: Sampler<'_, _, SAMPLE_QUEUE> = Sampler::new(adc, samples, shared);
    let mut capture: EdgeCapture<'_, EDGE_QUEUE> = EdgeCapture::new(edges, shared);
    let clock = config.clock;
    let mut rng: Rng = crate::random::rng(config.seed, 0x7419);
    // Edges on their way to the capture: (arrival true time, line, rising).
    let mut in_flight: VecDeque<(f64, u8, bool)> = VecDeque::new();
    let mut generation = 0;
    let mut next_tick = 0u64;
    let mut period = 1u64;
    let round = Duration::from_millis(1);
    let mut wake = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now_s = t0.elapsed().as_secs_f64();
        while let Ok((line, high, sent_s)) = triggers.try_recv() {
            let tp = config.trigger;
            let delay = (tp.latency_s + tp.jitter_s * normal(&mut rng)).max(0.0);
            let arrival = sent_s + delay;
            let at = in_flight.partition_point(|e| e.0 <= arrival);
            in_flight.insert(at, (arrival, line, high));
        }
        let g = timer.generation.load(Ordering::Acquire);
        if g != generation {
            generation = g;
            next_tick = timer.first_tick.load(Ordering::Acquire);
            period = u64::from(timer.period_ticks.load(Ordering::Acquire)).max(1);
        }
        let mut deliver = |until_s: f64, capture: &mut EdgeCapture<'_, EDGE_QUEUE>| {
            while in_flight.front().is_some_and(|e| e.0 <= until_s) {
                if let Some((t, line, rising)) = in_flight.pop_front() {
                    capture.on_edge(line, rising, clock.ticks_at(t));
                }
            }
        };
        let stop_tick = timer.stop_tick.load(Ordering::Acquire);
        {
            while next_tick < stop_tick {
                let t = clock.time_at(next_tick);
                if t > now_s {
                    break;
                }
                deliver(t, &mut capture);
                chip.with_analog(|fe| fe.set_time(t));
                sampler.on_tick(next_tick);
                if let Some(record) = on_sample.as_mut() {
                    record(t, next_tick, chip.with_analog(|fe| fe.rails()));
                }
                stats.ticks.fetch_add(1, Ordering::Relaxed);
                next_tick += period;
            }
        }
        timer
            .reached_tick
            .store(clock.ticks_at(now_s), Ordering::Release);
        deliver(now_s, &mut capture);
        chip.with_analog(|fe| fe.catch_up(now_s));
        on_time(now_s);
        wake += round;
        let now = Instant::now();
        if wake > now {
            std::thread::sleep(wake - now);
        } else {
            wake = now; // behind: do not try to catch up in a burst of rounds
        }
    }
    Ok(())
}

/// The board as the firmware's main loop sees it.
struct TwinBoard {
    t0: Instant,
    clock: McuClockConfig,
    timer: Arc<SampleTimer>,
    stored: Option<[Calibration; CHANNELS]>,
}

impl Board for TwinBoard {
    fn now(&mut self) -> u64 {
        self.clock.ticks_at(self.t0.elapsed().as_secs_f64())
    }
    fn start_sampling(&mut self, rate_hz: u32) -> Result<u32, ErrorKind> {
        let period = self
            .clock
            .tick_hz
            .checked_div(rate_hz)
            .ok_or(ErrorKind::Unsupported)?;
        if period == 0 {
            return Err(ErrorKind::Unsupported);
        }
        let now = self.now();
        let t = &self.timer;
        t.period_ticks.store(period, Ordering::Release);
        t.first_tick
            .store(now + u64::from(period), Ordering::Release);
        t.generation.fetch_add(1, Ordering::AcqRel);
        t.stop_tick.store(u64::MAX, Ordering::Release);
        Ok(period)
    }
    /// Stops the timer now, as a board's timer stops at once: the sample thread, which
    /// runs the timer's ticks in rounds of a millisecond, runs those before now and none
    /// after. Waits (at most 50 ms) for it to have run them, so that the device's count at
    /// Stop holds every conversion it made.
    fn stop_sampling(&mut self) {
        let at = self.now();
        let t = &self.timer;
        t.stop_tick.fetch_min(at, Ordering::AcqRel);
        let waited = Instant::now();
        while t.reached_tick.load(Ordering::Acquire) < at
            && waited.elapsed() < Duration::from_millis(50)
        {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    fn set_trigger_output(&mut self, _line: u8, _high: bool) -> Result<(), ErrorKind> {
        Ok(())
    }
    fn store_calibration(&mut self, c: &[Calibration; CHANNELS]) -> Result<(), ErrorKind> {
        self.stored = Some(*c);
        Ok(())
    }
}

/// The link as the device sees it: the rig's host link (its payload rate, packet size
/// and latency) ending in the pseudo-terminal (when connected), with faults.
struct Link {
    pty: Option<Pty>,
    rng: Rng,
    faults: FaultConfig,
    /// Position in the current outgoing frame, and what happens to it.
    in_frame: usize,
    fate: Fate,
    /// Bytes on their way to the host, and when each write's bytes arrive there.
    outgoing: VecDeque<u8>,
    arrivals: VecDeque<(Instant, usize)>,
    /// Bytes that have arrived and wait for the pseudo-terminal to take them.
    arrived: usize,
    /// Bytes per second the link carries (the rig's link, or a slower injected one), the
    /// most it moves in one burst, its latency, and its byte budget.
    rate: f64,
    burst: f64,
    latency: Duration,
    budget: f64,
    last_refill: Instant,
    started: Instant,
    stats: Arc<TwinStats>,
}

/// What the link does to one frame.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Intact,
    Corrupt { at: usize, bit: u8 },
    Drop { at: usize },
}

impl Link {
    fn draw_fate(&mut self) -> Fate {
        let f = self.faults;
        let active = f
            .damage_until_s
            .is_none_or(|until| self.started.elapsed().as_secs_f64() < until);
        if !active {
            return Fate::Intact;
        }
        let at = 1 + (uniform(&mut self.rng) * 10.0) as usize;
        let u = uniform(&mut self.rng);
        if u < f.corrupt_frame_probability {
            self.stats.frames_corrupted.fetch_add(1, Ordering::Relaxed);
            Fate::Corrupt {
                at,
                bit: (uniform(&mut self.rng) * 8.0) as u8 & 7,
            }
        } else if u < f.corrupt_frame_probability + f.drop_byte_probability {
            self.stats.frames_truncated.fetch_add(1, Ordering::Relaxed);
            Fate::Drop { at }
        } else {
            Fate::Intact
        }
    }
}

impl embedded_io::ErrorType for Link {
    type Error = std::io::Error;
}

impl embedded_io::Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.pty {
            Some(p) => p.read(buf),
            None => Ok(0),
        }
    }
}

impl embedded_io::ReadReady for Link {
    fn read_ready(&mut self) -> std::io::Result<bool> {
        match &mut self.pty {
            Some(p) => p.read_ready(),
            None => Ok(false),
        }
    }
}

impl embedded_io::WriteReady for Link {
    fn write_ready(&mut self) -> std::io::Result<bool> {
        let now = Instant::now();
        self.budget =
            (self.budget + self.rate * (now - self.last_refill).as_secs_f64()).min(self.burst);
        self.last_refill = now;
        self.drain()?;
        Ok(self.budget >= 1.0 && self.outgoing.len() < HOST_BUFFER)
    }
}

/// Bytes the host's serial driver buffers between the device and the reading program
/// (a USB-serial driver's buffers; the pseudo-terminal's own are a few kB): the device
/// sees a full link only when a reader has fallen this far behind.
const HOST_BUFFER: usize = 256 * 1024;

impl Link {
    fn new(pty: Pty, config: &McuConfig, started: Instant, stats: Arc<TwinStats>) -> Link {
        let l = &config.link;
        let rate = config
            .faults
            .link_bytes_per_s
            .map_or(l.payload_bytes_per_s, |r| r.min(l.payload_bytes_per_s));
        Link {
            pty: Some(pty),
            rng: crate::random::rng(config.seed, 0xFA17),
            faults: config.faults,
            in_frame: 0,
            fate: Fate::Intact,
            outgoing: VecDeque::with_capacity(HOST_BUFFER),
            arrivals: VecDeque::new(),
            arrived: 0,
            rate,
            // 10 ms of the link's rate, at least one packet: the main loop polls every
            // 250 µs, and a host may hold it off for a few ms.
            burst: rate * 0.01 + f64::from(l.packet_bytes.max(64)),
            latency: Duration::from_secs_f64(l.latency_s),
            budget: 0.0,
            last_refill: Instant::now(),
            started,
            stats,
        }
    }

    /// Moves what has arrived and the pseudo-terminal will take now.
    fn drain(&mut self) -> std::io::Result<()> {
        let now = Instant::now();
        while let Some(&(at, n)) = self.arrivals.front() {
            if at > now {
                break;
            }
            self.arrived += n;
            self.arrivals.pop_front();
        }
        let Some(p) = &mut self.pty else {
            // Into the void, as a UART with nothing attached.
            self.outgoing.clear();
            self.arrivals.clear();
            self.arrived = 0;
            return Ok(());
        };
        while self.arrived > 0 && embedded_io::WriteReady::write_ready(p)? {
            let (front, _) = self.outgoing.as_slices();
            let n = embedded_io::Write::write(p, &front[..front.len().min(self.arrived)])?;
            if n == 0 {
                break;
            }
            self.outgoing.drain(..n);
            self.arrived -= n;
        }
        Ok(())
    }
}

impl embedded_io::Write for Link {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.budget.max(1.0) as usize);
        self.budget -= n as f64;
        let before = self.outgoing.len();
        // Pass bytes through one frame at a time, deciding each frame's fate at its
        // first byte: damage, if any, falls on one of its bytes 1 to 10 (every frame has
        // at least 11 bytes before its delimiter), never on the delimiter.
        for &b in buf.iter().take(n) {
            if b == 0 {
                if self.pty.is_none() {
                    self.stats.frames_unsent.fetch_add(1, Ordering::Relaxed);
                }
                self.in_frame = 0;
                self.outgoing.push_back(b);
                continue;
            }
            if self.in_frame == 0 {
                self.fate = self.draw_fate();
            }
            let byte = match self.fate {
                Fate::Corrupt { at, bit } if at == self.in_frame => Some(b ^ (1 << bit)),
                Fate::Drop { at } if at == self.in_frame => None,
                _ => Some(b),
            };
            self.in_frame += 1;
            self.outgoing.extend(byte);
        }
        self.arrivals
            .push_back((Instant::now() + self.latency, self.outgoing.len() - before));
        self.drain()?;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn main_thread(
    description: Description,
    config: McuConfig,
    t0: Instant,
    shared: &'static Shared,
    mut queues: Queues<'static, SAMPLE_QUEUE, EDGE_QUEUE>,
    pty: Pty,
    path: &Path,
    timer: &Arc<SampleTimer>,
    stop: &AtomicBool,
    stats: &Arc<TwinStats>,
) {
    let mut board = TwinBoard {
        t0,
        clock: config.clock,
        timer: timer.clone(),
        stored: None,
    };
    let mut link = Link::new(pty, &config, t0, stats.clone());
    let f = config.faults;
    let mut disconnected_at: Option<f64> = None;
    let mut reset_done = false;
    loop {
        // A device runs until it resets; the loop below restarts it.
        let mut device: Device<'_, SAMPLE_QUEUE, EDGE_QUEUE> =
            Device::new(description, board.stored, shared, queues);
        let mut restart = false;
        while !stop.load(Ordering::Relaxed) {
            let now_s = t0.elapsed().as_secs_f64();
            if let (Some(after), None, true) =
                (f.disconnect_after_s, disconnected_at, link.pty.is_some())
            {
                if now_s >= after {
                    link.pty = None;
                    disconnected_at = Some(now_s);
                    stats.disconnects.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let (Some(at), None) = (disconnected_at, &link.pty) {
                if now_s >= at + f.disconnected_s {
                    if let Ok(p) = Pty::open() {
                        if self::link(p.path(), path).is_ok() {
                            link.pty = Some(p);
                        }
                    }
                }
            }
            if let (Some(after), false) = (f.reset_after_s, reset_done) {
                if now_s >= after {
                    reset_done = true;
                    restart = true;
                    stats.resets.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
            if device.poll(&mut board, &mut link).is_err() {
                // The host side went away mid-write; the port stays, the host may return.
            }
            std::thread::sleep(Duration::from_micros(250));
        }
        if !restart {
            return;
        }
        // A reset: the sample timer stops, the firmware starts over with its queues.
        board.stop_sampling();
        queues = device.into_queues();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_ports_folder_is_made_anew_private_and_never_through_a_planted_name() {
        let parent =
            std::env::temp_dir().join(format!("railtrace-port-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir(&parent).unwrap();
        let elsewhere = parent.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        // Someone who guessed the first two draws planted a link and a folder there.
        let name = |n: u64| parent.join(format!("railtrace-twin-{n:016x}"));
        std::os::unix::fs::symlink(&elsewhere, name(1)).unwrap();
        std::fs::create_dir(name(2)).unwrap();
        let mut draws = [1, 2, 3].into_iter();
        let dir =
            private_dir(&parent, "railtrace-twin-", || Ok(draws.next().unwrap_or(4))).unwrap();
        assert_eq!(dir, name(3));
        let meta = std::fs::symlink_metadata(&dir).unwrap();
        assert!(meta.is_dir(), "{meta:?}");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // Names taken all the way: refused, not followed.
        let e = private_dir(&parent, "railtrace-twin-", || Ok(1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        // The draws the twin uses are its system's random numbers.
        let (a, b) = (random_u64().unwrap(), random_u64().unwrap());
        assert_ne!(a, b);
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
