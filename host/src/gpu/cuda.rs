//! An NVIDIA GPU runner through the CUDA driver (the `cuda` feature; the FFI is in the
//! `railtrace-cuda` crate, which loads `libcuda` and NVRTC at run time, so that this
//! builds, and fails with one clear error, where they are missing).
//!
//! **Clock.** The GPU's own nanosecond clock, `%globaltimer`: each execution stamps its
//! first block's start and its last block's end on it (device code, compiled by NVRTC
//! when the runner opens), and [`GpuRunner::read_clock`] launches a one-thread kernel that
//! writes it, between two host clock reads: the bracket holds the launch and the copy
//! back, and the alignment keeps the tightest ones. [`GpuRunner::clock_hz`] is 1e9.
//!
//! **Kernels.** `two_phase`: a compute-bound phase (FMA chains in registers) then a
//! memory-bound one (a read-modify-write pass over a buffer at least four times the L2),
//! each about [`PHASE_S`] long as sized from the device's SM count, clock and memory
//! bandwidth (`railtrace_cuda::Sizing`); `compute` and `memory` are each phase alone. The
//! sizes are estimates from the device's attributes; the recorded executions give the
//! real durations.

use railtrace_cuda::{CudaError, Gpu, Sizing, KERNELS};

use super::{
    host_now_ns, idle_before_launch, triggered, ClockRead, ExecutionRecord, GpuError, GpuRunner,
    Launch,
};
use crate::link::trigger::TriggerOut;

/// Each phase's length the kernels are sized for, s.
pub const PHASE_S: f64 = 100e-6;
/// Executions a train can hold (warm-up included).
pub const MAX_TRAIN: usize = 4096;

/// Runs the two-phase kernel and its phases on one CUDA device.
#[derive(Debug)]
pub struct CudaRunner {
    device: usize,
    gpu: Gpu,
    train: u64,
    rng: u64,
}

fn error(what: &str, e: CudaError) -> GpuError {
    GpuError::Other(format!("{what}: {e}"))
}

impl CudaRunner {
    /// Opens CUDA device `device` (0 if `None`) and compiles its kernels.
    pub fn open(device: Option<usize>) -> Result<CudaRunner, GpuError> {
        let device = device.unwrap_or(0);
        railtrace_cuda::driver_present()
            .map_err(|missing| GpuError::NotFound(format!("CUDA device {device}: {missing}")))?;
        let gpu = Gpu::new(device, PHASE_S, MAX_TRAIN)
            .map_err(|e| error(&format!("CUDA device {device}"), e))?;
        Ok(CudaRunner {
            device,
            gpu,
            train: 0,
            rng: (host_now_ns() as u64) | 1,
        })
    }

    fn error(&self, e: CudaError) -> GpuError {
        error(&format!("CUDA device {}", self.device), e)
    }
}

impl GpuRunner for CudaRunner {
    fn describe(&self) -> String {
        let i = self.gpu.info();
        let two = Sizing::for_device("two_phase", i, PHASE_S);
        format!(
            "CUDA device {} {} ({} SMs; two_phase: {} FMA iterations, then {} MiB read and written; %globaltimer clock)",
            self.device,
            i.name,
            i.sms,
            two.map_or(0, |s| s.iters),
            two.map_or(0, |s| (s.floats * 4) >> 20),
        )
    }

    fn kernels(&self) -> Vec<String> {
        KERNELS.iter().map(|k| k.to_string()).collect()
    }

    fn clock_hz(&self) -> f64 {
        1e9
    }

    fn read_clock(&mut self) -> Result<ClockRead, GpuError> {
        let host_before_ns = host_now_ns();
        let gpu_ticks = self.gpu.read_timer().map_err(|e| self.error(e))?;
        Ok(ClockRead {
            host_before_ns,
            gpu_ticks,
            host_after_ns: host_now_ns(),
        })
    }

    fn run(
        &mut self,
        launch: &Launch,
        trigger: &mut dyn TriggerOut,
    ) -> Result<Vec<ExecutionRecord>, GpuError> {
        let sizing = Sizing::for_device(&launch.kernel, self.gpu.info(), PHASE_S)
            .ok_or_else(|| GpuError::UnknownKernel(launch.kernel.clone(), KERNELS.join(", ")))?;
        if launch.dvfs.is_some() {
            // The default: the trait's answer for a runner without levels.
            self.request_dvfs(launch.dvfs.as_deref().unwrap_or_default())?;
        }
        let n = (launch.warmup + launch.count) as usize;
        if n > self.gpu.max_train() {
            return Err(GpuError::Unsupported(format!(
                "CUDA device {}: a train of {n} executions; at most {}",
                self.device,
                self.gpu.max_train()
            )));
        }
        self.gpu.prepare_train().map_err(|e| self.error(e))?;
        idle_before_launch(launch.delay_s, &mut self.rng);
        let spans = triggered(trigger, || {
            self.gpu
                .run_train(&vec![sizing; n])
                .map_err(|e| self.error(e))
        })?;

        let train = self.train;
        self.train += 1;
        Ok((spans.into_iter().enumerate())
            .map(|(i, (start_ticks, end_ticks))| ExecutionRecord {
                kernel: launch.kernel.clone(),
                train,
                index_in_train: i as u32,
                start_ticks,
                end_ticks,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the NVIDIA driver, opening fails with one line naming what is missing;
    /// with a GPU, a train of the two-phase kernel comes back in order on its clock.
    #[test]
    fn open_without_or_with_a_driver() {
        match CudaRunner::open(None) {
            Err(GpuError::NotFound(what)) => {
                assert!(what.starts_with("CUDA device 0: "), "{what}");
                assert!(
                    what.contains("libcuda.so.1") || what.contains("libnvrtc"),
                    "{what}"
                );
                assert!(!what.contains('\n'), "{what}");
                println!("SKIPPED (no NVIDIA driver): {what}");
            }
            Err(e) => panic!("not a clean NotFound: {e}"),
            Ok(mut runner) => {
                let launch = Launch {
                    kernel: "two_phase".into(),
                    delay_s: (0.0, 1e-3),
                    warmup: 1,
                    count: 3,
                    dvfs: None,
                };
                let c = runner.read_clock().unwrap();
                let mut line = crate::link::trigger::Quiet;
                let e = runner.run(&launch, &mut line).unwrap();
                assert_eq!(e.len(), 4);
                assert!(e
                    .windows(2)
                    .all(|w| w[0].end_ticks <= w[1].start_ticks + 1_000));
                assert!(e[0].start_ticks > c.gpu_ticks, "{e:?} after {c:?}");
                println!("{}: {e:?}", runner.describe());
            }
        }
    }
}
