//! An AMD GPU runner through HIP (the `rocm` feature; the FFI is in the `railtrace-rocm`
//! crate).
//!
//! **Clock.** HIP's host API has no call that returns a GPU timestamp: the device's
//! wall clock (`hipDeviceAttributeWallClockRate`, not even in HIP 5.2's header) is read
//! only by device code (`wall_clock64()`), which needs a device compiler; events give
//! durations (`hipEventElapsedTime`), not timestamps. So the runner's "GPU clock" is the
//! events' clock, in ns, counted from a reference event: every event's ticks are those of
//! the previous one plus the elapsed time between them (a chain of short intervals, so
//! `hipEventElapsedTime`'s f32 ms keeps its resolution). [`GpuRunner::read_clock`]
//! records an event on the idle stream between two host reads and waits for it: the
//! event's time lies between them. [`GpuRunner::clock_hz`] is 1e9.
//!
//! **Kernels.** hipBLAS is not in Debian 12, and a compute kernel needs a device
//! compiler, so the runner offers what the runtime runs by itself: `memset`
//! (`hipMemsetAsync` over [`MEMSET_BYTES`]) and `memcpy` (`hipMemcpyDtoDAsync` of
//! [`MEMCPY_BYTES`]). The sizes aim at about 200 µs per execution on an MI300X (HBM3,
//! 5.3 TB/s peak), assuming about 4 TB/s achieved: 768 MiB written, or 384 MiB read plus
//! 384 MiB written, is about 805 MB of traffic. That rate is an estimate; the recorded
//! executions give the real durations.
//!
//! Each execution is bracketed by events (event i before execution i, one more after the
//! last), so an execution's end is the next one's start.
//!
//! **DVFS.** The runner sets core clock levels through amdgpu's sysfs files
//! ([`super::amd_dvfs`]: levels named `"0"`, `"1"`, … as `pp_dpm_sclk` numbers them).
//! The card's device directory is [`DVFS_DIR_ENV`] where that is set, else that of the
//! N-th card listing levels for HIP device N ([`super::amd_dvfs::nth_device_dir`]: HIP
//! and the DRM cards are both in PCI order, unless `HIP_VISIBLE_DEVICES` or the like
//! renumbers HIP's, in which case the runner does not guess; `railtrace-rocm` has no
//! `hipDeviceGetPCIBusId` to match the PCI address exactly). Without the directory or
//! its files the runner has no levels and [`GpuRunner::request_dvfs`] says why. A
//! launch's level is requested before its random delay; the driver gets the choice back
//! (`auto`) when the runner is dropped.

use std::path::Path;

use railtrace_rocm::{DeviceBuffer, Event, HipError, Stream};

use super::amd_dvfs::{nth_device_dir, AmdDvfs};
use super::{
    host_now_ns, idle_before_launch, triggered, ClockRead, DvfsRequest, ExecutionRecord, GpuError,
    GpuRunner, Launch,
};
use crate::link::trigger::TriggerOut;

/// Bytes one `memset` execution writes.
pub const MEMSET_BYTES: usize = 768 << 20;
/// Bytes one `memcpy` execution copies.
pub const MEMCPY_BYTES: usize = 384 << 20;
/// The runner's kernels.
pub const KERNELS: [&str; 2] = ["memset", "memcpy"];
/// The environment variable naming the card's sysfs device directory
/// (`/sys/class/drm/cardN/device`) whose DVFS levels the runner sets.
pub const DVFS_DIR_ENV: &str = "RAILTRACE_AMD_SYSFS";
/// Environment variables that renumber HIP's devices: with any of them set, the runner
/// does not guess which card is its device.
const RENUMBERING: [&str; 4] = [
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
];

/// Runs `memset` and `memcpy` trains on one HIP device.
#[derive(Debug)]
pub struct RocmRunner {
    device: usize,
    name: String,
    stream: Stream,
    /// The last event whose ticks are known, and those ticks.
    anchor: (Event, u64),
    fill: DeviceBuffer,
    src: DeviceBuffer,
    dst: DeviceBuffer,
    train: u64,
    rng: u64,
    /// The card's DVFS levels, or why there are none.
    dvfs: Result<AmdDvfs, String>,
}

impl RocmRunner {
    /// Opens HIP device `device` (0 if `None`) with the default sizes.
    pub fn open(device: Option<usize>) -> Result<RocmRunner, GpuError> {
        RocmRunner::open_sized(device.unwrap_or(0), MEMSET_BYTES, MEMCPY_BYTES)
    }

    /// Opens HIP device `device`, `memset` writing `memset_bytes` and `memcpy` copying
    /// `memcpy_bytes` per execution.
    pub fn open_sized(
        device: usize,
        memset_bytes: usize,
        memcpy_bytes: usize,
    ) -> Result<RocmRunner, GpuError> {
        let count = railtrace_rocm::device_count().map_err(|e| error("HIP", e))?;
        if count == 0 {
            return Err(GpuError::NotFound(
                "HIP device (hipGetDeviceCount reports none)".into(),
            ));
        }
        if device >= count {
            return Err(GpuError::NotFound(format!(
                "HIP device {device} (of {count})"
            )));
        }
        let what = format!("HIP device {device}");
        let e = |e| error(&what, e);
        railtrace_rocm::set_device(device).map_err(e)?;
        let name = railtrace_rocm::device_name(device).map_err(e)?;
        let stream = Stream::new().map_err(e)?;
        let reference = Event::new().map_err(e)?;
        reference.record(&stream).map_err(e)?;
        reference.synchronize().map_err(e)?;
        Ok(RocmRunner {
            device,
            name,
            stream,
            anchor: (reference, 0),
            fill: DeviceBuffer::new(memset_bytes).map_err(e)?,
            src: DeviceBuffer::new(memcpy_bytes).map_err(e)?,
            dst: DeviceBuffer::new(memcpy_bytes).map_err(e)?,
            train: 0,
            rng: (host_now_ns() as u64) | 1,
            dvfs: open_dvfs(device),
        })
    }

    /// Sets DVFS levels through the card device directory `dir`
    /// (`/sys/class/drm/cardN/device`) instead of the one found at open.
    pub fn set_dvfs_dir(&mut self, dir: &Path) -> Result<(), GpuError> {
        self.dvfs = Ok(AmdDvfs::open(dir)?);
        Ok(())
    }

    /// The card's DVFS levels, or why the runner has none.
    pub fn dvfs(&self) -> Result<&AmdDvfs, &str> {
        self.dvfs.as_ref().map_err(String::as_str)
    }

    /// Ticks of `events` (recorded, in stream order, after the anchor and complete); the
    /// last becomes the anchor.
    fn ticks(&mut self, events: Vec<Event>) -> Result<Vec<u64>, GpuError> {
        let mut ticks = Vec::with_capacity(events.len());
        let mut anchor = None;
        for event in events {
            let (prev, prev_ticks) = anchor.as_ref().unwrap_or(&self.anchor);
            let ms = prev.elapsed_ms(&event).map_err(|e| self.error(e))?;
            let t = prev_ticks + (f64::from(ms) * 1e6).round().max(0.0) as u64;
            ticks.push(t);
            anchor = Some((event, t));
        }
        if let Some(a) = anchor {
            self.anchor = a;
        }
        Ok(ticks)
    }

    /// Queues the train (event i before execution i, one more after the last) and waits
    /// for it.
    fn queue(&mut self, events: &[Event], memset: bool) -> Result<(), HipError> {
        for (i, event) in events.iter().enumerate() {
            event.record(&self.stream)?;
            if i + 1 == events.len() {
                return event.synchronize();
            }
            if memset {
                self.stream.memset(&mut self.fill, i as u8)?;
            } else {
                self.stream.memcpy(&mut self.dst, &self.src)?;
            }
        }
        Ok(())
    }

    fn error(&self, e: HipError) -> GpuError {
        error(&format!("HIP device {}", self.device), e)
    }
}

impl GpuRunner for RocmRunner {
    fn describe(&self) -> String {
        format!(
            "HIP device {} {} (memset {} MiB, memcpy {} MiB; event clock)",
            self.device,
            self.name,
            self.fill.len() >> 20,
            self.src.len() >> 20
        )
    }

    fn kernels(&self) -> Vec<String> {
        KERNELS.iter().map(|k| k.to_string()).collect()
    }

    fn clock_hz(&self) -> f64 {
        1e9
    }

    fn dvfs_levels(&self) -> Vec<String> {
        match &self.dvfs {
            Ok(dvfs) => dvfs.levels().iter().map(|l| l.name.clone()).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn request_dvfs(&mut self, level: &str) -> Result<DvfsRequest, GpuError> {
        let dvfs = match &mut self.dvfs {
            Ok(dvfs) => dvfs,
            Err(why) => {
                return Err(GpuError::Unsupported(format!(
                    "HIP device {}: cannot set DVFS level {level:?}: {why}",
                    self.device
                )))
            }
        };
        let host_before_ns = host_now_ns();
        dvfs.set(level)?;
        Ok(DvfsRequest {
            level: level.into(),
            host_before_ns,
            host_after_ns: host_now_ns(),
        })
    }

    fn read_clock(&mut self) -> Result<ClockRead, GpuError> {
        let event = Event::new().map_err(|e| self.error(e))?;
        let host_before_ns = host_now_ns();
        event.record(&self.stream).map_err(|e| self.error(e))?;
        event.synchronize().map_err(|e| self.error(e))?;
        let host_after_ns = host_now_ns();
        let gpu_ticks = self.ticks(vec![event])?[0];
        Ok(ClockRead {
            host_before_ns,
            gpu_ticks,
            host_after_ns,
        })
    }

    fn run(
        &mut self,
        launch: &Launch,
        trigger: &mut dyn TriggerOut,
    ) -> Result<Vec<ExecutionRecord>, GpuError> {
        let memset = match launch.kernel.as_str() {
            "memset" => true,
            "memcpy" => false,
            other => return Err(GpuError::UnknownKernel(other.into(), KERNELS.join(", "))),
        };
        // The level before the random delay, so that the switch is over by the launch.
        if let Some(level) = &launch.dvfs {
            self.request_dvfs(level)?;
        }
        let n = launch.warmup + launch.count;
        let events = (0..=n)
            .map(|_| Event::new())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error(e))?;
        self.stream.synchronize().map_err(|e| self.error(e))?;
        idle_before_launch(launch.delay_s, &mut self.rng);
        triggered(trigger, || {
            self.queue(&events, memset).map_err(|e| self.error(e))
        })?;

        let ticks = self.ticks(events)?;
        let train = self.train;
        self.train += 1;
        Ok((0..n)
            .map(|i| ExecutionRecord {
                kernel: launch.kernel.clone(),
                train,
                index_in_train: i,
                start_ticks: ticks[i as usize],
                end_ticks: ticks[i as usize + 1],
            })
            .collect())
    }
}

/// The DVFS levels of HIP device `device`'s card, or why there are none.
fn open_dvfs(device: usize) -> Result<AmdDvfs, String> {
    let dir = match std::env::var_os(DVFS_DIR_ENV) {
        Some(dir) => dir.into(),
        None => {
            if let Some(var) = RENUMBERING.iter().find(|v| std::env::var_os(v).is_some()) {
                return Err(format!(
                    "{var} is set, so HIP device {device} need not be card {device} (from 0) of \
                     those with DVFS levels; set {DVFS_DIR_ENV} to its \
                     /sys/class/drm/cardN/device"
                ));
            }
            nth_device_dir(Path::new("/"), device).map_err(|e| e.to_string())?
        }
    };
    AmdDvfs::open(&dir).map_err(|e| e.to_string())
}

/// A HIP error about `what` as a [`GpuError`].
fn error(what: &str, e: HipError) -> GpuError {
    if e.is_no_device() {
        GpuError::NotFound(format!("{what} ({e})"))
    } else {
        GpuError::Other(format!("{what}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::trigger::{Driven, TriggerError};

    /// A trigger that only counts edges.
    #[derive(Debug, Default)]
    struct Edges(Vec<bool>);

    impl TriggerOut for Edges {
        fn describe(&self) -> String {
            "test edges".into()
        }
        fn set(&mut self, high: bool) -> Result<Driven, TriggerError> {
            self.0.push(high);
            let t = host_now_ns();
            Ok(Driven {
                high,
                host_before_ns: t,
                host_after_ns: t,
            })
        }
    }

    fn runner() -> Option<RocmRunner> {
        match RocmRunner::open_sized(0, 64 << 20, 32 << 20) {
            Ok(r) => Some(r),
            Err(GpuError::NotFound(what)) => {
                println!("SKIPPED (no HIP device): {what}: not found");
                None
            }
            Err(e) => panic!("not a clean NotFound: {e}"),
        }
    }

    #[test]
    fn no_device_is_a_clean_not_found_or_the_runner_works() {
        let Some(mut r) = runner() else { return };
        println!("{}", r.describe());
        let a = r.read_clock().unwrap();
        let b = r.read_clock().unwrap();
        assert!(a.host_before_ns <= a.host_after_ns && a.host_after_ns <= b.host_before_ns);
        assert!(a.gpu_ticks <= b.gpu_ticks);

        let mut edges = Edges::default();
        for kernel in KERNELS {
            let launch = Launch {
                kernel: kernel.into(),
                delay_s: (0.0, 0.001),
                warmup: 2,
                count: 5,
                dvfs: None,
            };
            let recs = r.run(&launch, &mut edges).unwrap();
            assert_eq!(recs.len(), 7);
            assert!(recs
                .iter()
                .all(|x| x.start_ticks <= x.end_ticks && x.kernel == kernel));
            assert!(recs.windows(2).all(|w| w[0].end_ticks == w[1].start_ticks));
            let last = recs.last().unwrap();
            println!(
                "{kernel}: last execution {} ns",
                last.end_ticks - last.start_ticks
            );
        }
        assert_eq!(edges.0, [true, false, true, false]);
        let c = r.read_clock().unwrap();
        assert!(c.gpu_ticks >= b.gpu_ticks);
        let e = r.run(
            &Launch {
                kernel: "gemm".into(),
                delay_s: (0.0, 0.0),
                warmup: 0,
                count: 1,
                dvfs: None,
            },
            &mut edges,
        );
        assert!(matches!(e, Err(GpuError::UnknownKernel(..))));

        // DVFS: the card's levels, or a clean Unsupported saying why there are none.
        match r.dvfs() {
            Ok(dvfs) => println!(
                "DVFS through {}: levels {:?}",
                dvfs.dir().display(),
                r.dvfs_levels()
            ),
            Err(why) => {
                println!("no DVFS: {why}");
                assert!(r.dvfs_levels().is_empty());
                let e = r.request_dvfs("0").unwrap_err();
                assert!(matches!(e, GpuError::Unsupported(_)), "{e:?}");
                let e = r.run(
                    &Launch {
                        kernel: "memset".into(),
                        delay_s: (0.0, 0.0),
                        warmup: 0,
                        count: 1,
                        dvfs: Some("0".into()),
                    },
                    &mut edges,
                );
                assert!(matches!(e, Err(GpuError::Unsupported(_))), "{e:?}");
            }
        }
    }
}
