//! A logger's readings from a recording (e.g. nvidia-smi's in a `railtrace import pmd`),
//! replayed as a [`PowerLogger`]: every `logger` row, with its host timestamp, the
//! temperature it reported (`logger_temp_c`, null in recordings older than format 4) and
//! its energy counter (`logger_energy_j`, null before format 7).

use std::path::Path;

use super::{GpuError, LoggerReading, PowerLogger, Stamp};
use crate::store::recording::{self, Kind, Rows};

/// The `logger` rows of a recording.
#[derive(Debug)]
pub struct RecordedLogger {
    what: String,
    readings: Vec<LoggerReading>,
}

impl RecordedLogger {
    /// Reads the `logger` rows of the recording at `path`.
    pub fn open(path: &Path) -> Result<RecordedLogger, GpuError> {
        let r = recording::read(path).map_err(|e| GpuError::Other(e.to_string()))?;
        let epoch = r.meta.epoch_utc_ns;
        let mut readings = Vec::new();
        for rows in r.rows() {
            let (time, w, inst, temp, energy) = (
                rows.f64("time_s"),
                rows.f64("logger_w"),
                rows.f64("logger_instant_w"),
                rows.f64("logger_temp_c"),
                rows.f64("logger_energy_j"),
            );
            let host = rows.column::<arrow_array::Int64Array>("host_recv_ns");
            for i in 0..rows.len() {
                if rows.kind(i) != Kind::Logger {
                    continue;
                }
                // Its own host stamp, or the recording's timeline made UTC.
                let ns = Rows::get(host, i)
                    .unwrap_or_else(|| epoch + (time.value(i) * 1e9).round() as i64);
                readings.push(LoggerReading {
                    stamp: Stamp::HostNs(ns),
                    host_ns: ns,
                    power_w: w.value(i),
                    instant_w: Rows::get(inst, i),
                    temperature_c: Rows::get(temp, i),
                    energy_j: Rows::get(energy, i),
                    source: "recorded",
                });
            }
        }
        Ok(RecordedLogger {
            what: format!(
                "the logger readings of {} ({})",
                path.display(),
                r.meta.source
            ),
            readings,
        })
    }
}

impl PowerLogger for RecordedLogger {
    fn describe(&self) -> String {
        self.what.clone()
    }

    /// Every reading at the first call, none after.
    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError> {
        Ok(std::mem::take(&mut self.readings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::recording::{Event, Meta, Writer, FORMAT_VERSION};

    #[test]
    fn an_imported_loggers_readings_come_back_with_their_host_times() {
        let path =
            std::env::temp_dir().join(format!("railtrace-recorded-{}.arrow", std::process::id()));
        let meta = Meta {
            version: FORMAT_VERSION,
            source: "test".into(),
            epoch_utc_ns: 1_000_000_000,
            timebase: String::new(),
            rails: vec![],
            code_channels: vec![],
            device: None,
            rig: None,
            settings: None,
            derive: None,
        };
        let mut w = Writer::create(&path, &meta).unwrap();
        for (k, host_ns, temperature_c) in [(0, Some(2_000_000_000), Some(55.5)), (1, None, None)] {
            w.event(&Event::Logger {
                time_s: f64::from(k) * 0.5,
                power_w: 100.0 + f64::from(k),
                instant_w: None,
                average_w: None,
                temperature_c,
                energy_j: host_ns.map(|_| 7.5),
                source: None,
                gpu_ticks: None,
                host_ns,
                own_s: None,
                polled_ns: None,
            });
        }
        w.finish().unwrap();
        let mut l = RecordedLogger::open(&path).unwrap();
        let r = l.poll().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].stamp, Stamp::HostNs(2_000_000_000));
        assert_eq!(r[1].stamp, Stamp::HostNs(1_500_000_000), "epoch + time_s");
        assert_eq!(r[1].power_w, 101.0);
        assert_eq!((r[0].temperature_c, r[1].temperature_c), (Some(55.5), None));
        assert_eq!((r[0].energy_j, r[1].energy_j), (Some(7.5), None));
        assert!(l.poll().unwrap().is_empty());
        std::fs::remove_file(&path).unwrap();
        let e = RecordedLogger::open(Path::new("/nonexistent.arrow")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent.arrow"), "{e}");
    }
}
