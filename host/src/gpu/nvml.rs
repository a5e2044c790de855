//! NVIDIA's power readings through NVML (the `nvml` feature), with the `nvml-wrapper`
//! crate, which loads `libnvidia-ml.so.1` at run time: this builds without an NVIDIA
//! driver, and [`NvmlLogger::open`] then fails with [`GpuError::NotFound`].
//!
//! The logger reads, in this order of preference, whichever the GPU supports (the
//! choice is made at open and named by [`PowerLogger::describe`], so a profile's
//! settings say which it was):
//! 1. **the driver's own buffer of power samples** (`nvmlDeviceGetSamples` with
//!    `NVML_TOTAL_POWER_SAMPLES`): the internal logger as the driver records it, each
//!    sample with its timestamp (CPU time, µs since 1970), every sample newer than the
//!    last one read, so that nothing is aliased by railtrace's own polling;
//! 2. **the power fields** (`nvmlDeviceGetFieldValues`): `NVML_FI_DEV_POWER_AVERAGE` (185:
//!    "GPU power averaged over 1 sec interval", Ampere except GA100 and newer) and
//!    `NVML_FI_DEV_POWER_INSTANT` (186: "Current GPU power", all architectures), in mW,
//!    each value with NVML's timestamp of it;
//! 3. **`nvmlDeviceGetPowerUsage`**, which has no timestamp: those readings are stamped
//!    with the host time at the middle of the call ([`Stamp::HostNs`]).
//!
//! NVML's timestamps become [`Stamp::Own`] at 1 MHz. Each reading names its source
//! ([`Source::tag`]), and where the GPU has one (Volta and newer), the last reading of
//! each poll carries the driver's energy counter (`nvmlDeviceGetTotalEnergyConsumption`,
//! mJ since the driver was loaded), read right after the power: the energy over any
//! stretch of a run, which no polling can alias.

use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{FieldValueSample, Sample};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT};
use nvml_wrapper::Nvml;

use super::{host_now_ns, GpuError, LoggerReading, PowerLogger, Stamp};

/// NVML's field timestamps: µs.
pub const NVML_HZ: f64 = 1e6;

const FIELDS: [FieldId; 2] = [
    FieldId(NVML_FI_DEV_POWER_AVERAGE),
    FieldId(NVML_FI_DEV_POWER_INSTANT),
];

/// Where an [`NvmlLogger`] reads the power from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The driver's power sample buffer (`nvmlDeviceGetSamples`).
    Samples,
    /// The average and instant power fields (`nvmlDeviceGetFieldValues`).
    Fields,
    /// `nvmlDeviceGetPowerUsage`, host-stamped.
    PowerUsage,
}

impl Source {
    /// The NVML call, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Source::Samples => "NVML's power sample buffer",
            Source::Fields => "NVML power fields",
            Source::PowerUsage => "nvmlDeviceGetPowerUsage",
        }
    }

    /// The source in a word, as each reading keeps it.
    pub fn tag(self) -> &'static str {
        match self {
            Source::Samples => "nvml-samples",
            Source::Fields => "nvml-fields",
            Source::PowerUsage => "nvml-power-usage",
        }
    }
}

/// One NVIDIA GPU's power readings.
#[derive(Debug)]
pub struct NvmlLogger {
    nvml: Nvml,
    index: u32,
    name: String,
    source: Source,
    /// Whether the GPU has an energy counter.
    energy: bool,
    /// The newest sample read from the buffer, µs (NVML's timestamp).
    last_sample_us: u64,
}

impl NvmlLogger {
    /// Loads NVML and opens GPU `index` (NVML's numbering).
    pub fn open(index: u32) -> Result<NvmlLogger, GpuError> {
        let nvml = Nvml::init().map_err(|e| error("NVML", e))?;
        let what = format!("NVIDIA GPU {index}");
        let device = nvml.device_by_index(index).map_err(|e| match e {
            NvmlError::InvalidArg => GpuError::NotFound(format!(
                "{what} (NVML counts {})",
                nvml.device_count().unwrap_or(0)
            )),
            e => error(&what, e),
        })?;
        let name = device.name().map_err(|e| error(&what, e))?;
        // The buffer's samples so far are before the run: reading starts after them.
        let buffered = device.samples(Sampling::Power, None).ok();
        let last_sample_us = (buffered.iter().flatten())
            .map(|s| s.timestamp)
            .max()
            .unwrap_or(0);
        let source = if buffered.is_some_and(|b| !b.is_empty()) {
            Source::Samples
        } else if device
            .field_values_for(&FIELDS)
            .is_ok_and(|values| from_fields(values, 0).is_some())
        {
            Source::Fields
        } else {
            Source::PowerUsage
        };
        let energy = device.total_energy_consumption().is_ok();
        Ok(NvmlLogger {
            nvml,
            index,
            name,
            source,
            energy,
            last_sample_us,
        })
    }

    /// Where the readings come from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether the readings carry the GPU's energy counter.
    pub fn has_energy_counter(&self) -> bool {
        self.energy
    }

    /// The GPU, as errors name it.
    fn what(&self) -> String {
        format!("NVIDIA GPU {}", self.index)
    }

    fn device(&self) -> Result<nvml_wrapper::Device<'_>, GpuError> {
        (self.nvml.device_by_index(self.index)).map_err(|e| error(&self.what(), e))
    }

    /// Reads the power once (from the fields, else `nvmlDeviceGetPowerUsage`).
    pub fn read(&self) -> Result<LoggerReading, GpuError> {
        let what = self.what();
        let device = self.device()?;
        if self.source == Source::Fields {
            let values = device.field_values_for(&FIELDS);
            let after = host_now_ns();
            let values = values.map_err(|e| error(&what, e))?;
            return from_fields(values, after)
                .ok_or_else(|| GpuError::Other(format!("{what}: NVML returned no power field")));
        }
        let before = host_now_ns();
        let mw = device.power_usage().map_err(|e| error(&what, e))?;
        let after = host_now_ns();
        Ok(LoggerReading {
            stamp: Stamp::HostNs(before + (after - before) / 2),
            host_ns: after,
            power_w: f64::from(mw) * 1e-3,
            instant_w: None,
            temperature_c: None,
            energy_j: None,
            source: Source::PowerUsage.tag(),
        })
    }
}

impl PowerLogger for NvmlLogger {
    fn describe(&self) -> String {
        format!(
            "NVIDIA GPU {} {} ({})",
            self.index,
            self.name,
            self.source.describe()
        )
    }

    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError> {
        let mut readings = if self.source != Source::Samples {
            vec![self.read()?]
        } else {
            let samples =
                newer_samples(self.device()?.samples(Sampling::Power, self.last_sample_us))
                    .map_err(|e| error(&self.what(), e))?;
            let (readings, last) = from_samples(samples, self.last_sample_us, host_now_ns());
            self.last_sample_us = last;
            readings
        };
        if self.energy && !readings.is_empty() {
            // A counter that fails now and then leaves that poll without it.
            let mj = self.device()?.total_energy_consumption().ok();
            with_energy(&mut readings, mj);
        }
        Ok(readings)
    }
}

/// A reading from the average and instant power fields, in that order (either may have
/// failed; `None` if both did), stamped with the instant value's NVML timestamp (else the
/// average's); `host_ns` is `after`.
fn from_fields(
    values: Vec<Result<FieldValueSample, NvmlError>>,
    after: i64,
) -> Option<LoggerReading> {
    let mut got = values.into_iter().map(|v| {
        let v = v.ok()?;
        let mw = match v.value.ok()? {
            SampleValue::F64(x) => x,
            SampleValue::U32(x) => f64::from(x),
            SampleValue::U64(x) => x as f64,
            SampleValue::I64(x) => x as f64,
        };
        Some((mw * 1e-3, u64::try_from(v.timestamp).unwrap_or(0)))
    });
    let average = got.next().flatten();
    let instant = got.next().flatten();
    let (_, ticks) = instant.or(average)?;
    Some(LoggerReading {
        stamp: Stamp::Own { ticks, hz: NVML_HZ },
        host_ns: after,
        power_w: average.or(instant)?.0,
        instant_w: instant.map(|(w, _)| w),
        temperature_c: None,
        energy_j: None,
        source: Source::Fields.tag(),
    })
}

/// The energy counter `mj` (mJ), read once after the readings of one poll, given to the
/// newest of them (J): the others were taken before it.
fn with_energy(readings: &mut [LoggerReading], mj: Option<u64>) {
    if let Some(r) = readings.last_mut() {
        r.energy_j = mj.map(|mj| mj as f64 * 1e-3);
    }
}

/// NVML answers "not found" when its buffer holds no sample newer than the one asked
/// after (seen on an H200, whose buffer takes a sample every 20 ms): that is no news.
fn newer_samples(r: Result<Vec<Sample>, NvmlError>) -> Result<Vec<Sample>, NvmlError> {
    match r {
        Err(NvmlError::NotFound) => Ok(Vec::new()),
        r => r,
    }
}

/// The buffer's samples newer than `last_us` as readings, oldest first, and the newest
/// timestamp now read; `host_ns` is when they were fetched. A sample whose value is not a
/// number of mW is left out.
fn from_samples(samples: Vec<Sample>, last_us: u64, host_ns: i64) -> (Vec<LoggerReading>, u64) {
    let mut fresh: Vec<(u64, f64)> = (samples.into_iter())
        .filter(|s| s.timestamp > last_us)
        .filter_map(|s| {
            let mw = match s.value {
                SampleValue::U32(x) => f64::from(x),
                SampleValue::U64(x) => x as f64,
                SampleValue::I64(x) => x as f64,
                SampleValue::F64(x) => x,
            };
            mw.is_finite().then_some((s.timestamp, mw))
        })
        .collect();
    fresh.sort_by_key(|s| s.0);
    let last = fresh.last().map_or(last_us, |s| s.0);
    let readings = (fresh.into_iter())
        .map(|(ticks, mw)| LoggerReading {
            stamp: Stamp::Own { ticks, hz: NVML_HZ },
            host_ns,
            power_w: mw * 1e-3,
            instant_w: None,
            temperature_c: None,
            energy_j: None,
            source: Source::Samples.tag(),
        })
        .collect();
    (readings, last)
}

/// An NVML error about `what` as a [`GpuError`].
fn error(what: &str, e: NvmlError) -> GpuError {
    match e {
        NvmlError::LibloadingError(_)
        | NvmlError::LibraryNotFound
        | NvmlError::DriverNotLoaded
        | NvmlError::NotFound => GpuError::NotFound(format!("{what} ({e})")),
        NvmlError::NoPermission => GpuError::Permission(what.to_string()),
        NvmlError::NotSupported => GpuError::Unsupported(format!("{what}: not supported by NVML")),
        e => GpuError::Other(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(id: u32, timestamp: i64, value: Result<SampleValue, NvmlError>) -> FieldValueSample {
        FieldValueSample {
            field: FieldId(id),
            timestamp,
            latency: 0,
            value,
        }
    }

    #[test]
    fn both_fields() {
        let values = vec![
            Ok(sample(
                NVML_FI_DEV_POWER_AVERAGE,
                1_000,
                Ok(SampleValue::U32(350_000)),
            )),
            Ok(sample(
                NVML_FI_DEV_POWER_INSTANT,
                2_000,
                Ok(SampleValue::U32(412_500)),
            )),
        ];
        let r = from_fields(values, 7).unwrap();
        assert_eq!(
            r.stamp,
            Stamp::Own {
                ticks: 2_000,
                hz: 1e6
            }
        );
        assert_eq!((r.host_ns, r.power_w, r.instant_w), (7, 350.0, Some(412.5)));
    }

    #[test]
    fn only_instant_or_neither() {
        let values = vec![
            Ok(sample(
                NVML_FI_DEV_POWER_AVERAGE,
                0,
                Err(NvmlError::NotSupported),
            )),
            Ok(sample(
                NVML_FI_DEV_POWER_INSTANT,
                3_000,
                Ok(SampleValue::U64(99_000)),
            )),
        ];
        let r = from_fields(values, 0).unwrap();
        assert_eq!((r.power_w, r.instant_w), (99.0, Some(99.0)));
        assert_eq!(
            r.stamp,
            Stamp::Own {
                ticks: 3_000,
                hz: 1e6
            }
        );
        let values = vec![Err(NvmlError::NotSupported), Err(NvmlError::NotSupported)];
        assert!(from_fields(values, 0).is_none());
    }

    /// An empty buffer is no reading, not a missing GPU; other errors stay errors.
    #[test]
    fn nothing_newer_in_the_buffer_is_no_reading() {
        assert!(newer_samples(Err(NvmlError::NotFound)).unwrap().is_empty());
        assert!(matches!(
            newer_samples(Err(NvmlError::GpuLost)),
            Err(NvmlError::GpuLost)
        ));
    }

    /// The driver's buffer, as NVML hands it back: unordered, with samples already read.
    #[test]
    fn buffered_samples_newer_than_the_last_read_in_order() {
        let s = |timestamp, mw| Sample {
            timestamp,
            value: SampleValue::U32(mw),
        };
        let samples = vec![s(3_000, 300_500), s(1_000, 100_000), s(2_000, 250_250)];
        let (r, last) = from_samples(samples, 1_000, 9);
        assert_eq!(last, 3_000);
        let got: Vec<(Stamp, f64)> = r.iter().map(|r| (r.stamp, r.power_w)).collect();
        assert_eq!(
            got,
            vec![
                (
                    Stamp::Own {
                        ticks: 2_000,
                        hz: 1e6
                    },
                    250.25
                ),
                (
                    Stamp::Own {
                        ticks: 3_000,
                        hz: 1e6
                    },
                    300.5
                ),
            ]
        );
        assert!(r.iter().all(|r| r.host_ns == 9 && r.instant_w.is_none()));
        assert!(r.iter().all(|r| r.source == "nvml-samples"));
        // Nothing new: no readings, and the last stays.
        let (r, last) = from_samples(vec![s(3_000, 1)], 3_000, 0);
        assert!(r.is_empty() && last == 3_000);
    }

    /// The counter read after a poll belongs to its newest reading only, in J.
    #[test]
    fn the_energy_counter_goes_with_the_newest_reading() {
        let s = |timestamp, mw| Sample {
            timestamp,
            value: SampleValue::U32(mw),
        };
        let (mut r, _) = from_samples(vec![s(2_000, 250_000), s(1_000, 100_000)], 0, 9);
        with_energy(&mut r, Some(123_456_789));
        let energy: Vec<Option<f64>> = r.iter().map(|r| r.energy_j).collect();
        assert_eq!(energy, [None, Some(123_456.789)]);
        assert_eq!(
            r[1].stamp,
            Stamp::Own {
                ticks: 2_000,
                hz: 1e6
            }
        );
        // A poll whose counter read failed: no energy, the readings kept.
        let mut one = vec![r[0]];
        with_energy(&mut one, None);
        assert_eq!((one.len(), one[0].energy_j), (1, None));
        with_energy(&mut [], Some(1));
    }

    /// Without an NVIDIA driver, opening fails cleanly; with one, a reading comes back.
    #[test]
    fn open_without_or_with_a_driver() {
        match NvmlLogger::open(0) {
            Err(GpuError::NotFound(what)) => {
                println!("SKIPPED (no NVIDIA GPU): {what}: not found");
            }
            Err(e) => panic!("not a clean NotFound: {e}"),
            Ok(mut logger) => {
                // The buffer may hold nothing newer yet: a second is many samples.
                let mut r = Vec::new();
                for _ in 0..100 {
                    r = logger.poll().unwrap();
                    if !r.is_empty() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                println!("{}: {:?}", logger.describe(), r);
                assert!(r.first().is_some_and(|r| r.power_w > 0.0), "{r:?}");
                let newest = r.last().unwrap();
                assert_eq!(newest.source, logger.source().tag());
                if logger.has_energy_counter() {
                    assert!(newest.energy_j.is_some_and(|j| j > 0.0), "{newest:?}");
                }
            }
        }
    }
}
