//! The CUDA driver calls, made safe. Every `unsafe` block in the crate is here.
#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};

use crate::{spans, DeviceInfo, Sizing, KERNELS_CU, THREADS};

/// A failed CUDA call, in the driver's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// What was being done.
    pub call: &'static str,
    /// The driver's (or NVRTC's) description.
    pub message: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.call, self.message)
    }
}

impl std::error::Error for CudaError {}

fn err(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError {
        call,
        message: format!("{e:?}"),
    }
}

/// Whether the NVIDIA driver's `libcuda` and NVRTC's `libnvrtc` can be loaded, and if
/// not, the one missing, by name.
pub fn driver_present() -> Result<(), String> {
    // SAFETY: each only tries to open the library by its usual names (dlopen) and closes
    // it again; nothing of it is called.
    let (cuda, nvrtc) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
        )
    };
    match (cuda, nvrtc) {
        (true, true) => Ok(()),
        (false, _) => Err("the NVIDIA driver's libcuda.so.1".into()),
        (true, false) => Err(
            "NVRTC's libnvrtc.so (the CUDA toolkit's runtime compiler; its lib directory on LD_LIBRARY_PATH)"
                .into(),
        ),
    }
}

/// One CUDA device with the runner's kernels loaded and their buffers allocated.
#[derive(Debug)]
pub struct Gpu {
    info: DeviceInfo,
    stream: Arc<CudaStream>,
    two_phase: CudaFunction,
    read_timer: CudaFunction,
    buf: CudaSlice<f32>,
    timer: CudaSlice<u64>,
    starts: CudaSlice<u64>,
    ends: CudaSlice<u64>,
}

impl Gpu {
    /// Device `ordinal`, its kernels compiled, a buffer for `phase_s`-long memory phases
    /// and stamps for trains of up to `max_train` executions.
    ///
    /// # Errors
    ///
    /// The driver or NVRTC missing ([`driver_present`]), no such device, or a failed
    /// compile, load or allocation.
    pub fn new(ordinal: usize, phase_s: f64, max_train: usize) -> Result<Gpu, CudaError> {
        driver_present().map_err(|missing| CudaError {
            call: "loading the CUDA driver",
            message: format!("{missing}: not found"),
        })?;
        let ctx = CudaContext::new(ordinal).map_err(err("cuCtxCreate"))?;
        let attr = |a: Attr| ctx.attribute(a).map_err(err("cuDeviceGetAttribute"));
        let mem_khz = f64::from(attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?);
        let bus_bits = f64::from(attr(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?);
        let info = DeviceInfo {
            name: ctx.name().map_err(err("cuDeviceGetName"))?,
            sms: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32,
            clock_hz: f64::from(attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?) * 1e3,
            bandwidth_b_per_s: 2.0 * mem_khz * 1e3 * bus_bits / 8.0,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as u64,
        };
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS_CU).map_err(|e| CudaError {
            call: "compiling the kernels (NVRTC)",
            message: format!("{e:?}"),
        })?;
        let module = ctx.load_module(ptx).map_err(err("cuModuleLoadData"))?;
        let function = |name: &str| {
            module
                .load_function(name)
                .map_err(err("cuModuleGetFunction"))
        };
        let stream = ctx.default_stream();
        let floats =
            Sizing::for_device("two_phase", &info, phase_s).map_or(1, |s| s.floats) as usize;
        let alloc = |n: usize| stream.alloc_zeros::<u64>(n).map_err(err("cuMemAlloc"));
        Ok(Gpu {
            two_phase: function("two_phase")?,
            read_timer: function("read_timer")?,
            buf: stream
                .alloc_zeros::<f32>(floats)
                .map_err(err("cuMemAlloc"))?,
            timer: alloc(1)?,
            starts: alloc(max_train.max(1))?,
            ends: alloc(max_train.max(1))?,
            stream,
            info,
        })
    }

    /// The device's attributes.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Floats in the memory phase's buffer.
    pub fn buffer_floats(&self) -> u64 {
        self.buf.len() as u64
    }

    /// Executions a train can stamp.
    pub fn max_train(&self) -> usize {
        self.starts.len()
    }

    /// The GPU's clock (`%globaltimer`, ns), written by a one-thread kernel and read back
    /// once it is done.
    ///
    /// # Errors
    ///
    /// A failed launch or copy.
    pub fn read_timer(&mut self) -> Result<u64, CudaError> {
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.read_timer);
        b.arg(&mut self.timer);
        // SAFETY: `read_timer(unsigned long long *out)` takes one pointer to at least one
        // u64, which `timer` is; one thread writes out[0].
        unsafe { b.launch(cfg) }.map_err(err("cuLaunchKernel"))?;
        let v = self
            .stream
            .clone_dtoh(&self.timer)
            .map_err(err("cuMemcpyDtoH"))?;
        Ok(v[0])
    }

    /// Clears the stamps for the next train and waits until the GPU is idle.
    ///
    /// # Errors
    ///
    /// A failed copy.
    pub fn prepare_train(&mut self) -> Result<(), CudaError> {
        let copy = err("cuMemcpyHtoD");
        self.stream
            .memcpy_htod(&vec![u64::MAX; self.starts.len()], &mut self.starts)
            .map_err(&copy)?;
        self.stream
            .memcpy_htod(&vec![0u64; self.ends.len()], &mut self.ends)
            .map_err(&copy)?;
        self.stream
            .synchronize()
            .map_err(err("cuStreamSynchronize"))
    }

    /// Runs `sizes.len()` executions back to back (execution `i` of sizes `sizes[i]`)
    /// after [`Gpu::prepare_train`]; returns each one's span on the GPU's clock once all
    /// are done.
    ///
    /// # Errors
    ///
    /// More executions than [`Gpu::max_train`], a buffer smaller than a sizing asks, a
    /// failed launch or copy, or an execution that left no stamp.
    pub fn run_train(&mut self, sizes: &[Sizing]) -> Result<Vec<(u64, u64)>, CudaError> {
        let n = sizes.len();
        let bad = |message: String| CudaError {
            call: "a train",
            message,
        };
        if n > self.starts.len() {
            return Err(bad(format!(
                "{n} executions, more than the {} stamped",
                self.starts.len()
            )));
        }
        if let Some(s) = sizes.iter().find(|s| s.floats > self.buf.len() as u64) {
            return Err(bad(format!(
                "a memory phase over {} floats, more than the buffer's {}",
                s.floats,
                self.buf.len()
            )));
        }
        for (i, s) in sizes.iter().enumerate() {
            let cfg = LaunchConfig {
                grid_dim: (s.blocks.max(1), 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let index = i as u32;
            let mut b = self.stream.launch_builder(&self.two_phase);
            b.arg(&mut self.buf);
            b.arg(&s.floats);
            b.arg(&s.iters);
            b.arg(&s.passes);
            b.arg(&mut self.starts);
            b.arg(&mut self.ends);
            b.arg(&index);
            // SAFETY: the arguments match `two_phase(float *buf, unsigned long long n,
            // unsigned int iters, unsigned int passes, unsigned long long *starts,
            // unsigned long long *ends, unsigned int index)` in type and order; `buf`
            // holds at least `n` floats (checked above) and `starts`/`ends` more than
            // `index` entries (n ≤ their length).
            unsafe { b.launch(cfg) }.map_err(err("cuLaunchKernel"))?;
        }
        let dtoh = err("cuMemcpyDtoH");
        let starts = self.stream.clone_dtoh(&self.starts).map_err(&dtoh)?;
        let ends = self.stream.clone_dtoh(&self.ends).map_err(&dtoh)?;
        spans(&starts[..n], &ends[..n]).map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where NVRTC loads (a GPU machine, or one with NVIDIA's `nvidia-cuda-nvrtc-cu12`
    /// wheel's lib directory on `LD_LIBRARY_PATH`, as CI has), the kernels compile, no GPU
    /// needed, and their PTX reads the GPU's nanosecond clock.
    #[test]
    fn the_kernels_compile_with_nvrtc() {
        // SAFETY: as in `driver_present`: only opens and closes the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!("SKIPPED (no libnvrtc)");
            return;
        }
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS_CU).unwrap().to_src();
        for entry in [".entry two_phase(", ".entry read_timer("] {
            assert!(ptx.contains(entry), "{entry} not in the PTX");
        }
        assert!(
            ptx.contains("%globaltimer"),
            "the PTX does not read %globaltimer"
        );
        assert!(ptx.contains("atom.global.min.u64") && ptx.contains("atom.global.max.u64"));
    }

    /// Where the driver is missing (every CI machine), one error naming it; where a GPU
    /// is there, a short train of each kernel, each execution's span in order.
    #[test]
    fn a_missing_driver_is_named_and_a_present_gpu_runs_a_train() {
        match driver_present() {
            Err(why) => {
                assert!(
                    why.contains("libcuda.so.1") || why.contains("libnvrtc"),
                    "{why}"
                );
                let e = Gpu::new(0, 100e-6, 4).unwrap_err();
                assert_eq!(e.call, "loading the CUDA driver");
                assert_eq!(e.message, format!("{why}: not found"));
            }
            Ok(()) => {
                let Ok(mut gpu) = Gpu::new(0, 100e-6, 4) else {
                    return; // a driver without a usable device
                };
                let t0 = gpu.read_timer().unwrap();
                for kernel in crate::KERNELS {
                    let s = Sizing::for_device(kernel, gpu.info(), 100e-6).unwrap();
                    gpu.prepare_train().unwrap();
                    let spans = gpu.run_train(&[s; 3]).unwrap();
                    for w in spans.windows(2) {
                        assert!(w[0].0 < w[0].1 && w[0].1 <= w[1].1, "{kernel}: {spans:?}");
                    }
                    assert!(spans[0].0 > t0, "{kernel}: {spans:?} after {t0}");
                }
            }
        }
    }
}
