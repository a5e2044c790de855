//! The GPU side of a profiling run, behind small traits so that the twin and real GPUs
//! are interchangeable:
//! - [`GpuRunner`]: launches kernels (after a random delay, warm-up, single or back-to-back
//!   trains), records each execution's start and end on the GPU's clock, and reads that
//!   clock bracketed by host clock reads;
//! - [`PowerLogger`]: the GPU's own power logger, each reading with its own timestamp and
//!   the clock that timestamp is on.
//!
//! Trigger outputs (the runner's marker to the rig) are in [`crate::link::trigger`].
//!
//! On them, the stages that drive a GPU beside the rig: [`profile`] (FinGraV's profiling
//! run) and [`dvfs`] (DVFS switching latency).

pub mod amd_dvfs;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dvfs;
pub mod gpu_metrics;
pub mod hwmon;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod profile;
pub mod recorded;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod twin;

pub use crate::store::recording::host_now_ns;

/// What went wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No such GPU, driver file or library.
    #[error("{0}: not found")]
    NotFound(String),
    /// Not allowed.
    #[error("{0}: permission denied")]
    Permission(String),
    /// A file or blob is not in the documented layout.
    #[error("{what}: {why}")]
    Format {
        /// The file or blob.
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// No such kernel.
    #[error("no kernel {0:?} (this runner has: {1})")]
    UnknownKernel(String, String),
    /// Support for this GPU was not built in.
    #[error("{0}")]
    Unsupported(String),
    /// Any other failure, in the driver's words.
    #[error("{0}")]
    Other(String),
}

/// One read of the GPU's clock, bracketed by the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockRead {
    /// Host time just before the read was issued, ns since the Unix epoch.
    pub host_before_ns: i64,
    /// The GPU clock's value, ticks.
    pub gpu_ticks: u64,
    /// Host time just after the read returned, ns since the Unix epoch.
    pub host_after_ns: i64,
}

/// What to run: FinGraV's recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The kernel's name.
    pub kernel: String,
    /// The idle delay before the launch is drawn uniformly in this range, s (so that the
    /// logger's readings land at every offset into the kernel).
    pub delay_s: (f64, f64),
    /// Executions run and discarded first (warm-up).
    pub warmup: u32,
    /// Executions back to back in the train (1: a single execution).
    pub count: u32,
    /// The DVFS level to run the train at ([`GpuRunner::dvfs_levels`]; None: the GPU's
    /// current one).
    pub dvfs: Option<String>,
}

/// One kernel execution as the GPU recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionRecord {
    /// The kernel.
    pub kernel: String,
    /// Train number within the run.
    pub train: u64,
    /// Position in the back-to-back train, 0-based (warm-up executions included).
    pub index_in_train: u32,
    /// Start, GPU clock ticks.
    pub start_ticks: u64,
    /// End, GPU clock ticks.
    pub end_ticks: u64,
}

/// The clock a logger reading's timestamp is on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stamp {
    /// The GPU's clock (the runner's [`GpuRunner::clock_hz`]), ticks.
    GpuTicks(u64),
    /// The host's clock when the reading was taken, ns since the Unix epoch.
    HostNs(i64),
    /// The logger's own clock (e.g. the firmware timestamp of amdgpu's `gpu_metrics`),
    /// in its own units at `hz` per second.
    Own {
        /// The value.
        ticks: u64,
        /// Its rate.
        hz: f64,
    },
}

/// One reading of the GPU's own power logger.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoggerReading {
    /// When, on which clock.
    pub stamp: Stamp,
    /// Host time at which railtrace got the reading, ns since the Unix epoch.
    pub host_ns: i64,
    /// The reported (averaged) power, W.
    pub power_w: f64,
    /// The instantaneous power, W, where the logger reports one.
    pub instant_w: Option<f64>,
    /// The GPU's temperature the logger reported with the reading, °C, where it reports
    /// one.
    pub temperature_c: Option<f64>,
    /// The GPU's cumulative energy counter, J, read when railtrace got the reading
    /// (`host_ns`), where the logger has one.
    pub energy_j: Option<f64>,
    /// Where the reading came from, in a word (`nvml-samples`, `hwmon`, `twin`...): kept
    /// with each reading in the recording.
    pub source: &'static str,
}

impl LoggerReading {
    /// The reading as a recording's logger row at `time_s` on its timeline, its stamp kept
    /// in the column of its clock (`gpu_ticks`, `host_ns` or `own_s`).
    pub fn event(&self, time_s: f64) -> crate::store::recording::Event {
        let (gpu_ticks, host_ns, own_s) = match self.stamp {
            Stamp::GpuTicks(t) => (Some(t), None, None),
            Stamp::HostNs(ns) => (None, Some(ns), None),
            Stamp::Own { ticks, hz } => (None, None, Some(ticks as f64 / hz)),
        };
        crate::store::recording::Event::Logger {
            time_s,
            power_w: self.power_w,
            instant_w: self.instant_w,
            average_w: None,
            temperature_c: self.temperature_c,
            energy_j: self.energy_j,
            source: Some(self.source.to_string()),
            gpu_ticks,
            host_ns,
            own_s,
            polled_ns: Some(self.host_ns),
        }
    }
}

/// Runs kernels on a GPU.
pub trait GpuRunner {
    /// The GPU, for people.
    fn describe(&self) -> String;
    /// The kernels it can run.
    fn kernels(&self) -> Vec<String>;
    /// The GPU clock's rate, Hz.
    fn clock_hz(&self) -> f64;
    /// Reads the GPU clock between two host clock reads.
    fn read_clock(&mut self) -> Result<ClockRead, GpuError>;
    /// Runs one train of `launch`, driving `trigger` high just before the launch and low
    /// after the train; returns the executions, warm-up included.
    fn run(
        &mut self,
        launch: &Launch,
        trigger: &mut dyn crate::link::trigger::TriggerOut,
    ) -> Result<Vec<ExecutionRecord>, GpuError>;
    /// The DVFS levels the runner can ask for, by name (none by default).
    fn dvfs_levels(&self) -> Vec<String> {
        Vec::new()
    }
    /// Asks the GPU for DVFS level `level` between two host clock reads (unsupported by
    /// default).
    fn request_dvfs(&mut self, level: &str) -> Result<DvfsRequest, GpuError> {
        Err(GpuError::Unsupported(format!(
            "{}: this runner cannot set DVFS levels (asked for {level:?})",
            self.describe()
        )))
    }
}

/// That `runner` has DVFS level `level`, or an error naming the levels it has.
pub fn check_dvfs_level(runner: &dyn GpuRunner, level: &str) -> Result<(), GpuError> {
    let levels = runner.dvfs_levels();
    if levels.iter().any(|l| l == level) {
        return Ok(());
    }
    Err(GpuError::Unsupported(format!(
        "{}: no DVFS level {level:?} (it has: {})",
        runner.describe(),
        if levels.is_empty() {
            "none".to_string()
        } else {
            levels.join(", ")
        }
    )))
}

/// Uniform in [0, 1) from the xorshift64* generator whose state is `state` (non-zero);
/// random delays need no more.
pub(crate) fn uniform(state: &mut u64) -> f64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
}

/// Sleeps the idle delay before a launch: uniform in `delay_s` (s), drawn from `rng`.
#[cfg(any(feature = "rocm", feature = "cuda"))]
pub(crate) fn idle_before_launch((lo, hi): (f64, f64), rng: &mut u64) {
    let delay = lo + (hi - lo).max(0.0) * uniform(rng);
    std::thread::sleep(std::time::Duration::from_secs_f64(delay.max(0.0)));
}

/// Runs `train` with `trigger` high: set just before it, and low again after it even when
/// it failed (its error then comes first).
#[cfg(any(feature = "rocm", feature = "cuda"))]
pub(crate) fn triggered<T>(
    trigger: &mut dyn crate::link::trigger::TriggerOut,
    train: impl FnOnce() -> Result<T, GpuError>,
) -> Result<T, GpuError> {
    let name = trigger.describe();
    let line = |e| GpuError::Other(format!("trigger {name}: {e}"));
    trigger.set(true).map_err(line)?;
    let done = train();
    let low = trigger.set(false).map_err(line);
    let out = done?;
    low?;
    Ok(out)
}

/// A DVFS level asked for, bracketed by the host's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DvfsRequest {
    /// The level.
    pub level: String,
    /// Host time just before the request, ns since the Unix epoch.
    pub host_before_ns: i64,
    /// Host time just after it returned, ns since the Unix epoch.
    pub host_after_ns: i64,
}

/// The GPU's own power logger.
pub trait PowerLogger {
    /// The logger, for people.
    fn describe(&self) -> String;
    /// The readings since the last call, oldest first.
    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError>;
}

/// A real GPU's power logger by name: `hwmon` or `gpu-metrics` (AMD: the DRM `card`, the
/// first amdgpu when `None`), `nvml` (NVIDIA GPU `device`; built with the `nvml`
/// feature).
///
/// # Errors
///
/// A name this build does not know, or the logger's own error opening it.
pub fn open_logger(
    name: &str,
    card: Option<usize>,
    device: u32,
) -> anyhow::Result<Box<dyn PowerLogger + Send>> {
    let root = std::path::Path::new("/");
    let _ = device; // used by NVML only
    Ok(match name {
        #[cfg(feature = "nvml")]
        "nvml" => Box::new(nvml::NvmlLogger::open(device)?),
        "hwmon" => Box::new(hwmon::HwmonLogger::open(root, card)?),
        "gpu-metrics" => Box::new(gpu_metrics::GpuMetricsLogger::open(root, card)?),
        other => anyhow::bail!(
            "--logger {other}: `hwmon` or `gpu-metrics` (AMD), `nvml` (NVIDIA; built with --features nvml)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_spread_over_the_unit_interval() {
        let mut rng = 1;
        let draws: Vec<f64> = (0..1000).map(|_| uniform(&mut rng)).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let mean = draws.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
    }
}
