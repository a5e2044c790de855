//! The twin's GPU as a [`GpuRunner`], its power logger as a [`PowerLogger`], and the
//! twin's trigger input as a [`TriggerOut`]: the same traits a real GPU implements, so
//! that a profiling run on the twin exercises the same code as one on hardware.
//!
//! Host times come from the twin's own mapping of its true time to the host's clock
//! ([`Twin::unix_ns`]), so that every bracket is on one host timeline.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use railtrace_twin::logger::Stamp as TwinStamp;
use railtrace_twin::Twin;

use super::{
    ClockRead, DvfsRequest, ExecutionRecord, GpuError, GpuRunner, Launch, LoggerReading,
    PowerLogger, Stamp,
};
use crate::link::trigger::{Driven, TriggerError, TriggerOut};

/// The twin's GPU side, shared by its runner and logger: both draw on the twin's one
/// output queue.
#[derive(Debug)]
pub struct TwinGpu<'a> {
    twin: &'a Twin,
    pending: RefCell<railtrace_twin::twin::GpuOutputs>,
    held: Instant,
}

/// How long the runner lets the scenario's own workload finish before its first launch
/// (longer than a step of the shipped scenarios).
pub const SETTLE: Duration = Duration::from_millis(100);

impl<'a> TwinGpu<'a> {
    /// The GPU side of `twin`, which the host now drives: the scenario's workload stops
    /// at the end of its current step, and the runner's first launch waits
    /// [`SETTLE`] for the GPU to be idle, as a real runner synchronises with the device
    /// before its first random delay.
    pub fn new(twin: &'a Twin) -> TwinGpu<'a> {
        twin.hold();
        TwinGpu {
            twin,
            pending: RefCell::default(),
            held: Instant::now(),
        }
    }

    fn pump(&self) {
        let o = self.twin.take_outputs();
        let mut p = self.pending.borrow_mut();
        p.logger.extend(o.logger);
        p.executions.extend(o.executions);
        p.dropped += o.dropped;
    }

    /// The runner.
    pub fn runner(&'a self, seed: u64) -> TwinRunner<'a> {
        TwinRunner {
            gpu: self,
            rng: seed | 1,
        }
    }

    /// The logger.
    pub fn logger(&'a self) -> TwinLogger<'a> {
        TwinLogger { gpu: self }
    }
}

/// The twin's GPU, run by the host.
#[derive(Debug)]
pub struct TwinRunner<'a> {
    gpu: &'a TwinGpu<'a>,
    rng: u64,
}

impl TwinRunner<'_> {
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        super::uniform(&mut self.rng)
    }
}

impl GpuRunner for TwinRunner<'_> {
    fn describe(&self) -> String {
        "the twin's GPU".into()
    }

    fn kernels(&self) -> Vec<String> {
        self.gpu.twin.kernels().to_vec()
    }

    fn clock_hz(&self) -> f64 {
        self.gpu.twin.gpu_clock().rate_hz()
    }

    fn dvfs_levels(&self) -> Vec<String> {
        self.gpu.twin.dvfs_levels().to_vec()
    }

    fn request_dvfs(&mut self, level: &str) -> Result<DvfsRequest, GpuError> {
        let twin = self.gpu.twin;
        let host_before_ns = twin.unix_ns(twin.now_s());
        let at_s = twin
            .request_dvfs(level)
            .map_err(|e| GpuError::Unsupported(e.to_string()))?;
        Ok(DvfsRequest {
            level: level.into(),
            host_before_ns: host_before_ns.min(twin.unix_ns(at_s)),
            host_after_ns: twin.unix_ns(twin.now_s()),
        })
    }

    fn read_clock(&mut self) -> Result<ClockRead, GpuError> {
        let twin = self.gpu.twin;
        let r = twin.read_gpu_clock();
        Ok(ClockRead {
            host_before_ns: twin.unix_ns(r.issue_s),
            gpu_ticks: r.ticks,
            host_after_ns: twin.unix_ns(r.return_s),
        })
    }

    fn run(
        &mut self,
        launch: &Launch,
        trigger: &mut dyn TriggerOut,
    ) -> Result<Vec<ExecutionRecord>, GpuError> {
        let twin = self.gpu.twin;
        std::thread::sleep(SETTLE.saturating_sub(self.gpu.held.elapsed()));
        let (lo, hi) = launch.delay_s;
        std::thread::sleep(Duration::from_secs_f64(
            (lo + (hi - lo) * self.uniform()).max(0.0),
        ));
        let count = launch.warmup + launch.count.max(1);
        let other = |e: TriggerError| GpuError::Other(e.to_string());
        trigger.set(true).map_err(other)?;
        let at_s = twin
            .launch(&launch.kernel, count, launch.dvfs.as_deref())
            .map_err(|e| match e {
                railtrace_twin::twin::LaunchError::Kernel(k, known) => {
                    GpuError::UnknownKernel(k, known)
                }
                other => GpuError::Unsupported(other.to_string()),
            })?;
        // Wait for the train's last execution to have run in the twin's real time.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut train = Vec::new();
        while train.len() < count as usize {
            if Instant::now() > deadline {
                return Err(GpuError::Other(format!(
                    "the twin ran {} of {count} executions within 5 s",
                    train.len()
                )));
            }
            // A tenth of a millisecond: a 1 ms wait added most of a millisecond to every
            // train of a short kernel.
            std::thread::sleep(Duration::from_micros(100));
            self.gpu.pump();
            let mut p = self.gpu.pending.borrow_mut();
            while let Some(i) = p.executions.iter().position(|e| e.launch_s >= at_s) {
                if let Some(e) = p.executions.remove(i) {
                    train.push(e);
                }
            }
            // Executions of the scenario's own workload, before the host took over.
            p.executions.retain(|e| e.launch_s >= at_s);
        }
        trigger.set(false).map_err(other)?;
        let clock = twin.gpu_clock();
        let name = |k: usize| twin.kernels().get(k).cloned().unwrap_or_default();
        Ok(train
            .into_iter()
            .map(|e| ExecutionRecord {
                kernel: name(e.kernel),
                train: e.train,
                index_in_train: e.index_in_train,
                start_ticks: clock.ticks_at(e.start_s),
                end_ticks: clock.ticks_at(e.end_s),
            })
            .collect())
    }
}

/// The twin GPU's power logger.
#[derive(Debug)]
pub struct TwinLogger<'a> {
    gpu: &'a TwinGpu<'a>,
}

impl PowerLogger for TwinLogger<'_> {
    fn describe(&self) -> String {
        "the twin GPU's power logger".into()
    }

    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError> {
        self.gpu.pump();
        let twin = self.gpu.twin;
        let host_ns = twin.unix_ns(twin.now_s());
        let mut p = self.gpu.pending.borrow_mut();
        Ok(p.logger
            .drain(..)
            .map(|l| LoggerReading {
                stamp: match l.stamp {
                    TwinStamp::GpuTicks(t) => Stamp::GpuTicks(t),
                    TwinStamp::HostRead { read_s } => Stamp::HostNs(twin.unix_ns(read_s)),
                },
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

/// A line into the twin rig's trigger input, as a USB-UART or GPIO line would drive it.
#[derive(Debug)]
pub struct TwinTrigger<'a> {
    twin: &'a Twin,
    line: u8,
}

impl<'a> TwinTrigger<'a> {
    /// Drives input `line` of the twin's rig.
    pub fn new(twin: &'a Twin, line: u8) -> TwinTrigger<'a> {
        TwinTrigger { twin, line }
    }
}

impl TriggerOut for TwinTrigger<'_> {
    fn describe(&self) -> String {
        format!("the twin rig's trigger input {}", self.line)
    }

    fn set(&mut self, high: bool) -> Result<Driven, TriggerError> {
        let twin = self.twin;
        Driven::bracket(
            high,
            || twin.unix_ns(twin.now_s()),
            || {
                twin.trigger(self.line, high);
                Ok(())
            },
        )
    }
}
