//! NVIDIA's power readings through NVML (the `nvml` feature), with the `nvml-wrapper`
//! crate, which loads `libnvidia-ml.so.1` at run time: this builds without an NVIDIA
//! driver, and [`NvmlLogger::open`] then fails with [`GpuError::NotFound`].
//!
//! Each poll asks `nvmlDeviceGetFieldValues` for `NVML_FI_DEV_POWER_AVERAGE` (185: "GPU
//! power averaged over 1 sec interval", Ampere except GA100 and newer) and
//! `NVML_FI_DEV_POWER_INSTANT` (186: "Current GPU power", all architectures), in mW like
//! `nvmlDeviceGetPowerUsage`. Each field value carries NVML's timestamp of the value: the
//! CPU time, µs since 1970 (`nvmlFieldValue_t::timestamp`), which becomes
//! [`Stamp::Own`] at 1 MHz. Where the driver supports neither field,
//! `nvmlDeviceGetPowerUsage` is the fallback: it has no timestamp, so those readings are
//! stamped with the host time at the middle of the call ([`Stamp::HostNs`]).

use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
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

/// One NVIDIA GPU's power readings.
#[derive(Debug)]
pub struct NvmlLogger {
    nvml: Nvml,
    index: u32,
    name: String,
    /// Whether the power fields work (else `nvmlDeviceGetPowerUsage`).
    fields: bool,
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
        let fields = device
            .field_values_for(&FIELDS)
            .is_ok_and(|values| from_fields(values, 0).is_some());
        Ok(NvmlLogger {
            nvml,
            index,
            name,
            fields,
        })
    }

    /// Reads the power once.
    pub fn read(&self) -> Result<LoggerReading, GpuError> {
        let what = format!("NVIDIA GPU {}", self.index);
        let device = self
            .nvml
            .device_by_index(self.index)
            .map_err(|e| error(&what, e))?;
        if self.fields {
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
        })
    }
}

impl PowerLogger for NvmlLogger {
    fn describe(&self) -> String {
        let how = if self.fields {
            "NVML power fields"
        } else {
            "nvmlDeviceGetPowerUsage"
        };
        format!("NVIDIA GPU {} {} ({how})", self.index, self.name)
    }

    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError> {
        Ok(vec![self.read()?])
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
    })
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

    /// Without an NVIDIA driver, opening fails cleanly; with one, a reading comes back.
    #[test]
    fn open_without_or_with_a_driver() {
        match NvmlLogger::open(0) {
            Err(GpuError::NotFound(what)) => {
                println!("SKIPPED (no NVIDIA GPU): {what}: not found");
            }
            Err(e) => panic!("not a clean NotFound: {e}"),
            Ok(mut logger) => {
                let r = logger.poll().unwrap();
                println!("{}: {:?}", logger.describe(), r);
                assert!(r[0].power_w > 0.0);
            }
        }
    }
}
