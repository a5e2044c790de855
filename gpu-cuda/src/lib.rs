//! A small safe wrapper over the CUDA driver calls railtrace's NVIDIA GPU runner needs
//! (`railtrace::gpu::cuda`): a context and its stream, the runner's kernels compiled at
//! run time by NVRTC, device buffers, and the GPU's own nanosecond clock
//! (`%globaltimer`), read by a kernel.
//!
//! The driver and NVRTC are loaded at run time (the `cuda` feature, through `cudarc`'s
//! dynamic loading), so that the crate builds and its tests run on machines without
//! CUDA, and a machine without the driver gets one clear error, not a crash. Without the
//! feature only the kernels' source and their sizing are here: they are plain data and
//! arithmetic, tested everywhere.
//!
//! The workspace forbids unsafe code; this crate only denies it, and its one driver
//! module allows it (a kernel launch is unsafe in `cudarc`), with a SAFETY comment on
//! each block.

#[cfg(feature = "cuda")]
mod driver;

#[cfg(feature = "cuda")]
pub use driver::{driver_present, CudaError, Gpu};

/// The runner's kernels, compiled by NVRTC when the runner starts.
///
/// Each block's first thread stamps its start and end on `%globaltimer` (the GPU's
/// nanosecond clock) and keeps the earliest start and the latest end of execution
/// `index` (`atomicMin`, `atomicMax`): the execution's span on the GPU, from its first
/// block's start to its last block's end. `two_phase` runs a compute-bound phase (four
/// independent FMA chains per thread, in registers) then a memory-bound one
/// (read-modify-write passes over a buffer several times the L2), each sized by
/// [`Sizing::for_device`]; `compute` and `memory` are each phase alone (the other's size
/// 0). `read_timer` writes the clock once, for the runner's bracketed reads.
pub const KERNELS_CU: &str = r#"
__device__ __forceinline__ unsigned long long railtrace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void read_timer(unsigned long long *out) {
    out[0] = railtrace_now();
}

extern "C" __global__ void two_phase(float *buf, unsigned long long n, unsigned int iters,
                                     unsigned int passes, unsigned long long *starts,
                                     unsigned long long *ends, unsigned int index) {
    if (threadIdx.x == 0) {
        atomicMin(&starts[index], railtrace_now());
    }
    float a = threadIdx.x * 1e-3f, b = a + 1.0f, c = a + 2.0f, d = a + 3.0f;
    for (unsigned int i = 0; i < iters; ++i) {
        a = fmaf(a, 0.9999f, 1e-4f);
        b = fmaf(b, 0.9999f, 1e-4f);
        c = fmaf(c, 0.9999f, 1e-4f);
        d = fmaf(d, 0.9999f, 1e-4f);
    }
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned int p = 0; p < passes; ++p) {
        for (unsigned long long j = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
             j < n; j += stride) {
            buf[j] = buf[j] * 0.999f + 1e-3f;
        }
    }
    if (a + b + c + d == -1.0f) {
        buf[0] = 0.0f; /* never: keeps the chains from being optimised away */
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicMax(&ends[index], railtrace_now());
    }
}
"#;

/// The runner's kernels by name.
pub const KERNELS: [&str; 3] = ["two_phase", "compute", "memory"];

/// Threads per block: 4 blocks of 256 fill an SM's 1 024 resident threads on every CUDA
/// GPU since Maxwell, so that the whole grid runs at once and its phases line up.
pub const THREADS: u32 = 256;
/// Blocks per SM.
pub const BLOCKS_PER_SM: u32 = 4;

/// What the runner sizes its kernels from: the device's attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// The device's name.
    pub name: String,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Peak SM clock, Hz.
    pub clock_hz: f64,
    /// Peak memory bandwidth, bytes/s (memory clock × bus width, double data rate).
    pub bandwidth_b_per_s: f64,
    /// L2 cache, bytes.
    pub l2_bytes: u64,
}

/// One kernel's launch sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Blocks in the grid.
    pub blocks: u32,
    /// FMA iterations of the compute phase, per thread.
    pub iters: u32,
    /// Floats in the buffer the memory phase passes over.
    pub floats: u64,
    /// Passes of the memory phase.
    pub passes: u32,
}

/// The share of the peak bandwidth a streaming read-modify-write reaches, for sizing
/// only: the recorded executions give the real durations.
pub const ACHIEVED_BANDWIDTH: f64 = 0.7;

impl Sizing {
    /// `kernel`'s sizes on `info`, each phase about `phase_s` long: the compute phase's
    /// iterations from the FP32 rate (an SM issues 128 FMAs a cycle, so each iteration of
    /// four FMAs over 1 024 resident threads takes 32 cycles), the memory phase's buffer
    /// from the bandwidth (8 bytes of traffic a float a pass, at
    /// [`ACHIEVED_BANDWIDTH`] of the peak) but at least four times the L2, so that it
    /// streams from memory. None for a kernel this crate does not have.
    pub fn for_device(kernel: &str, info: &DeviceInfo, phase_s: f64) -> Option<Sizing> {
        let (compute, memory) = match kernel {
            "two_phase" => (true, true),
            "compute" => (true, false),
            "memory" => (false, true),
            _ => return None,
        };
        let iters = (phase_s * info.clock_hz / 32.0).round().clamp(1.0, 1e9) as u32;
        let traffic = phase_s * info.bandwidth_b_per_s * ACHIEVED_BANDWIDTH;
        let floats = ((traffic / 8.0).max(info.l2_bytes as f64)).ceil() as u64;
        Some(Sizing {
            blocks: info.sms.max(1) * BLOCKS_PER_SM,
            iters: if compute { iters } else { 0 },
            floats: floats.max(1),
            passes: u32::from(memory),
        })
    }
}

/// The executions' spans from the stamps a train left, `(start, end)` ns on the GPU's
/// clock: `starts` set to `u64::MAX` and `ends` to 0 before the train.
///
/// # Errors
///
/// An execution that did not stamp its start or end, or ended before it started: the
/// train did not run as launched.
pub fn spans(starts: &[u64], ends: &[u64]) -> Result<Vec<(u64, u64)>, String> {
    if starts.len() != ends.len() {
        return Err(format!("{} starts for {} ends", starts.len(), ends.len()));
    }
    (starts.iter().zip(ends).enumerate())
        .map(|(i, (&s, &e))| match (s, e) {
            (u64::MAX, _) | (_, 0) => Err(format!("execution {i} left no stamp")),
            (s, e) if e < s => Err(format!(
                "execution {i} ended {} ns before it started",
                s - e
            )),
            (s, e) => Ok((s, e)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200 SXM: 132 SMs at 1.98 GHz, 4.8 TB/s, 50 MB of L2.
    fn h200() -> DeviceInfo {
        DeviceInfo {
            name: "NVIDIA H200".into(),
            sms: 132,
            clock_hz: 1.98e9,
            bandwidth_b_per_s: 4.8e12,
            l2_bytes: 50 << 20,
        }
    }

    #[test]
    fn phases_are_sized_from_the_device() {
        let s = Sizing::for_device("two_phase", &h200(), 100e-6).unwrap();
        // 100 µs at 1.98 GHz is 198 000 cycles, 32 an iteration.
        assert_eq!(s.iters, 6188);
        assert_eq!(s.blocks, 528);
        // 100 µs × 4.8 TB/s × 0.7 is 336 MB of traffic, 42 M floats: under four times
        // the L2 (a 200 MiB buffer), which the buffer is held to; at 1 ms, 420 M floats.
        assert_eq!(s.floats, 50 << 20);
        assert_eq!(s.passes, 1);
        let long = Sizing::for_device("two_phase", &h200(), 1e-3).unwrap();
        assert_eq!(long.floats, 420_000_000);
        let c = Sizing::for_device("compute", &h200(), 100e-6).unwrap();
        assert_eq!((c.iters, c.passes), (6188, 0));
        let m = Sizing::for_device("memory", &h200(), 100e-6).unwrap();
        assert_eq!((m.iters, m.passes), (0, 1));
        assert!(Sizing::for_device("gemm", &h200(), 100e-6).is_none());
        // A small GPU's buffer is held to four times its L2, whatever the phase asks.
        let small = DeviceInfo {
            bandwidth_b_per_s: 1e11,
            l2_bytes: 4 << 20,
            ..h200()
        };
        let s = Sizing::for_device("memory", &small, 10e-6).unwrap();
        assert_eq!(s.floats, 4 << 20);
    }

    #[test]
    fn spans_need_both_stamps_in_order() {
        assert_eq!(
            spans(&[10, 30], &[20, 45]).unwrap(),
            vec![(10, 20), (30, 45)]
        );
        let e = spans(&[10, u64::MAX], &[20, 45]).unwrap_err();
        assert_eq!(e, "execution 1 left no stamp");
        let e = spans(&[10, 30], &[20, 0]).unwrap_err();
        assert_eq!(e, "execution 1 left no stamp");
        let e = spans(&[50], &[20]).unwrap_err();
        assert_eq!(e, "execution 0 ended 30 ns before it started");
        assert!(spans(&[1], &[]).is_err());
    }

    #[test]
    fn every_kernel_named_is_in_the_source() {
        assert!(KERNELS_CU.contains("void two_phase(") && KERNELS_CU.contains("void read_timer("));
        for k in KERNELS {
            assert!(Sizing::for_device(k, &h200(), 1e-4).is_some(), "{k}");
        }
    }
}
