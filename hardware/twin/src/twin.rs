//! The whole bench, running: the GPU and its logger, the rig, and the MCU behind its
//! pseudo-terminal, from a [`Scenario`](crate::scenario::Scenario).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::gpu::{
    ClockConfig, ClockRead, DvfsSwitch, Execution, Gpu, GpuClock, HostDvfsRequest, HostLaunch,
    HostLaunches, CURRENT_DVFS_LEVEL,
};
use crate::logger::{Logger, LoggerSample};
use crate::mcu::{Hardware, Mcu, McuConfig, TwinError, TwinStats};
use crate::random::rng;
use crate::rig::FrontEnd;
use crate::rig::RailState;
use crate::scenario::Loaded;
use crate::truth::{Row, Truth};
use std::time::Instant;

/// Most logger samples, executions and DVFS switches kept for readers (older ones are
/// dropped, counted).
const KEEP: usize = 1_000_000;

/// What the GPU side produced, for the host's logger reader and GPU runner.
#[derive(Debug, Default)]
pub struct GpuOutputs {
    /// The GPU's own power logger's reports, oldest first.
    pub logger: VecDeque<LoggerSample>,
    /// Kernel executions, oldest first.
    pub executions: VecDeque<Execution>,
    /// Reports and executions (and DVFS switches) dropped because nobody read them.
    pub dropped: u64,
    /// DVFS switches that have taken effect, oldest first.
    pub dvfs_switches: VecDeque<DvfsSwitch>,
}

/// A running twin.
#[derive(Debug)]
pub struct Twin {
    mcu: Mcu,
    outputs: Arc<Mutex<GpuOutputs>>,
    truth: Option<Truth>,
    t0: Instant,
    unix_ns_at_t0: i64,
    host: Arc<Mutex<HostLaunches>>,
    kernels: Vec<String>,
    dvfs: Vec<String>,
    clock: GpuClock,
    clock_config: ClockConfig,
    read_rng: Mutex<crate::random::Rng>,
}

/// Why the host's launch was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LaunchError {
    /// No kernel of that name in the scenario.
    #[error("the scenario has no kernel {0:?} (it has: {1})")]
    Kernel(String, String),
    /// No DVFS level of that name.
    #[error("the scenario has no DVFS level {0:?} (it has: {1})")]
    Dvfs(String, String),
}

impl Twin {
    /// Starts the bench of `loaded`.
    pub fn start(loaded: &Loaded) -> Result<Twin, TwinError> {
        Twin::start_with(loaded, None)
    }

    /// Starts the bench of `loaded`, writing its truth into `truth_dir` if given (see
    /// [`crate::truth`]).
    pub fn start_with(loaded: &Loaded, truth_dir: Option<&Path>) -> Result<Twin, TwinError> {
        let t0 = Instant::now();
        let unix_ns_at_t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let host = Arc::new(Mutex::new(HostLaunches::default()));
        let gpu_host = host.clone();
        let clock = GpuClock::from_config(&loaded.scenario.gpu.clock)
            .map_err(|e| TwinError::Thread(e.to_string()))?;
        let host_ns = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()))
            .unwrap_or(0);
        let s = loaded.scenario.clone();
        let truth = match truth_dir {
            Some(dir) => {
                let rails: Vec<String> = loaded.rig.rails.iter().map(|r| r.name.clone()).collect();
                Some(Truth::create(dir, &rails, &clocks_toml(loaded, host_ns))?)
            }
            None => None,
        };
        let tx = truth.as_ref().and_then(Truth::sender);
        let kernel_names: Vec<String> = s.kernels.iter().map(|k| k.name.clone()).collect();
        let level_names: Vec<String> = s.gpu.dvfs.iter().map(|d| d.name.clone()).collect();
        let rig = loaded.rig.clone();
        let outputs = Arc::new(Mutex::new(GpuOutputs::default()));
        let out = outputs.clone();
        let rails_tx = tx.clone();
        let config = McuConfig {
            clock: s.mcu,
            firmware: s.firmware.clone(),
            trigger: s.trigger,
            faults: s.faults,
            link: loaded.rig.link.clone(),
            seed: s.seed,
        };
        let mcu = Mcu::start(config, t0, move || {
            let bad = |e: crate::gpu::ConfigError| TwinError::Thread(e.to_string());
            let mut gpu = Gpu::new(s.gpu.clone(), s.kernels.clone(), s.workload.clone(), s.seed)
                .map_err(bad)?;
            gpu.set_host_launches(gpu_host);
            let logger = Logger::new(s.logger.clone(), *gpu.clock())
                .map_err(bad)?
                .with_thermal(s.gpu.thermal.clone());
            let side = Rc::new(RefCell::new((gpu, logger)));
            let feed = side.clone();
            let segment_tx = tx.clone();
            let next_segment = move || {
                let mut side = feed.borrow_mut();
                let (seg, state) = side.0.next_segment_with_state();
                // Segments come in order and contiguous: the logger cannot refuse them.
                let _ = side.1.push_with_state(&seg, &state);
                if let Some(t) = &segment_tx {
                    let _ = t.send(Row::GpuSegment(seg, state));
                }
                seg
            };
            let front_end = FrontEnd::new(&rig, &s.rig_truth, next_segment, rng(s.seed, 0x5E45))?;
            let on_time: Box<dyn FnMut(f64)> = Box::new(move |_now_s: f64| {
                let mut side = side.borrow_mut();
                let (gpu, logger) = &mut *side;
                let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                let from = (o.logger.len(), o.executions.len(), o.dvfs_switches.len());
                o.logger.extend(logger.drain_samples());
                o.executions.extend(gpu.drain_executions());
                o.dvfs_switches.extend(gpu.drain_dvfs_switches());
                if let Some(t) = &tx {
                    for l in o.logger.range(from.0..) {
                        let _ = t.send(Row::Logger(*l));
                    }
                    for e in o.executions.range(from.1..) {
                        let name = kernel_names.get(e.kernel).cloned().unwrap_or_default();
                        let _ = t.send(Row::Execution(e.clone(), name));
                    }
                    for d in o.dvfs_switches.range(from.2..) {
                        let name = |l: usize| level_names.get(l).cloned().unwrap_or_default();
                        let _ = t.send(Row::DvfsSwitch(*d, name(d.from), name(d.to)));
                    }
                }
                let (extra_logger, extra_exec, extra_switch) = (
                    o.logger.len().saturating_sub(KEEP),
                    o.executions.len().saturating_sub(KEEP),
                    o.dvfs_switches.len().saturating_sub(KEEP),
                );
                o.logger.drain(..extra_logger);
                o.executions.drain(..extra_exec);
                o.dvfs_switches.drain(..extra_switch);
                o.dropped += (extra_logger + extra_exec + extra_switch) as u64;
            });
            let on_sample = rails_tx.map(|t| {
                Box::new(move |t_s: f64, device_tick: u64, rails: Vec<RailState>| {
                    let _ = t.send(Row::Rails {
                        t_s,
                        device_tick,
                        rails,
                    });
                }) as crate::mcu::SampleHook
            });
            Ok(Hardware {
                rig,
                front_end,
                on_time,
                on_sample,
            })
        })?;
        Ok(Twin {
            mcu,
            outputs,
            truth,
            t0,
            unix_ns_at_t0,
            host,
            kernels: loaded
                .scenario
                .kernels
                .iter()
                .map(|k| k.name.clone())
                .collect(),
            dvfs: loaded
                .scenario
                .gpu
                .dvfs
                .iter()
                .map(|d| d.name.clone())
                .collect(),
            clock,
            clock_config: loaded.scenario.gpu.clock.clone(),
            read_rng: Mutex::new(rng(loaded.scenario.seed, 0xC10C)),
        })
    }

    /// The twin's true time now, s since it started.
    pub fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Host wall-clock time (ns since the Unix epoch) of true time `t_s`.
    pub fn unix_ns(&self, t_s: f64) -> i64 {
        self.unix_ns_at_t0 + (t_s * 1e9).round() as i64
    }

    /// The GPU's timestamp counter.
    pub fn gpu_clock(&self) -> GpuClock {
        self.clock
    }

    /// The kernels of the scenario.
    pub fn kernels(&self) -> &[String] {
        &self.kernels
    }

    /// The DVFS levels of the scenario, by name (empty when it configures none).
    pub fn dvfs_levels(&self) -> &[String] {
        &self.dvfs
    }

    /// A host read of the GPU's timestamp counter, issued now, with the scenario's read
    /// latency and jitter (true times in the result).
    pub fn read_gpu_clock(&self) -> ClockRead {
        let c = &self.clock_config;
        let u =
            crate::random::uniform(&mut self.read_rng.lock().unwrap_or_else(|p| p.into_inner()));
        let latency = c.read_latency_s + c.read_jitter_s * u;
        self.clock
            .read(self.now_s(), latency, c.read_latch_fraction)
    }

    /// Hands the GPU to the host: the scenario's workload stops at the end of its current
    /// step, and the GPU then idles until [`Twin::launch`].
    pub fn hold(&self) {
        self.host.lock().unwrap_or_else(|p| p.into_inner()).active = true;
    }

    /// Launches `count` executions of `kernel` back to back at DVFS level `dvfs`, now, as a
    /// GPU runner would. With a level other than the one the GPU is at or switching to,
    /// the switch is asked for at the launch and the train's first execution waits for it
    /// (`gpu.dvfs_switch_latency_s`); with None the train runs at the GPU's current level
    /// (the first level until a level is asked for), switching wherever a requested
    /// switch takes effect. From the first call on the host drives the GPU: the
    /// scenario's workload stops at the end of its current step. Returns the true time of
    /// the call, s.
    pub fn launch(&self, kernel: &str, count: u32, dvfs: Option<&str>) -> Result<f64, LaunchError> {
        let list = |v: &[String]| v.join(", ");
        let k = self
            .kernels
            .iter()
            .position(|n| n == kernel)
            .ok_or_else(|| LaunchError::Kernel(kernel.into(), list(&self.kernels)))?;
        let level = match dvfs {
            None => CURRENT_DVFS_LEVEL,
            Some(d) => self
                .dvfs
                .iter()
                .position(|n| n == d)
                .ok_or_else(|| LaunchError::Dvfs(d.into(), list(&self.dvfs)))?,
        };
        let at_s = self.now_s();
        let mut h = self.host.lock().unwrap_or_else(|p| p.into_inner());
        h.active = true;
        h.queue.push_back(HostLaunch {
            at_s,
            kernel: k,
            count: count.max(1),
            dvfs: level,
        });
        Ok(at_s)
    }

    /// Asks for DVFS level `level` now, as a host's clock-setting call (`rocm-smi
    /// --setsclk`, or a frequency-setting operation on its own stream) would: the GPU's
    /// level, and so its speed and, with `[gpu.power_model]`, its power (idle included),
    /// changes `gpu.dvfs_switch_latency_s` after the call, even in the middle of a
    /// kernel. Like [`Twin::launch`], it makes the host drive the GPU: the scenario's
    /// workload stops at the end of its current step. Every switch is recorded in
    /// [`GpuOutputs::dvfs_switches`] and in the truth's `dvfs.arrow`. Returns the true
    /// time of the call, s.
    pub fn request_dvfs(&self, level: &str) -> Result<f64, LaunchError> {
        let index = self
            .dvfs
            .iter()
            .position(|n| n == level)
            .ok_or_else(|| LaunchError::Dvfs(level.into(), self.dvfs.join(", ")))?;
        let at_s = self.now_s();
        let mut h = self.host.lock().unwrap_or_else(|p| p.into_inner());
        h.active = true;
        h.dvfs_requests
            .push_back(HostDvfsRequest { at_s, level: index });
        Ok(at_s)
    }

    /// The rig's serial port (a stable path to the current pseudo-terminal).
    pub fn path(&self) -> &Path {
        self.mcu.path()
    }

    /// Drives the host's trigger output `line` into the rig.
    pub fn trigger(&self, line: u8, high: bool) {
        self.mcu.trigger(line, high);
    }

    /// Takes the logger reports and executions produced so far.
    pub fn take_outputs(&self) -> GpuOutputs {
        std::mem::take(&mut *self.outputs.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What the twin injected so far.
    pub fn stats(&self) -> &TwinStats {
        self.mcu.stats()
    }

    /// True while the twin runs.
    pub fn is_running(&self) -> bool {
        self.mcu.is_running()
    }

    /// Stops the twin, and closes its truth files.
    pub fn stop(self) -> Result<(), TwinError> {
        let result = self.mcu.stop();
        if let Some(t) = self.truth {
            t.finish()?;
        }
        result
    }
}

/// The clocks' true parameters, for `clocks.toml`.
fn clocks_toml(loaded: &Loaded, host_monotonic_ns: i128) -> String {
    let s = &loaded.scenario;
    let m = &s.mcu;
    let g = &s.gpu.clock;
    format!(
        "# The twin's true clocks. True time t (s) is the host's CLOCK_MONOTONIC minus\n\
         # host_monotonic_ns_at_true_zero, in seconds.\n\
         seed = {}\nhost_monotonic_ns_at_true_zero = {host_monotonic_ns}\n\n\
         [mcu]\n# device ticks = offset_ticks + tick_hz * (t + 1e-6 * (error_ppm * t + drift_ppm_per_s * t^2 / 2))\n\
         tick_hz = {}\nerror_ppm = {:?}\ndrift_ppm_per_s = {:?}\noffset_ticks = {}\n\n\
         [gpu_clock]\n# gpu ticks = floor((offset_s + t * (1 + drift_ppm * 1e-6)) * rate_hz)\n\
         rate_hz = {:?}\noffset_s = {:?}\ndrift_ppm = {:?}\n",
        s.seed, m.tick_hz, m.error_ppm, m.drift_ppm_per_s, m.offset_ticks, g.rate_hz, g.offset_s, g.drift_ppm
    )
}
