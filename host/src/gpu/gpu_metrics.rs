//! amdgpu's `gpu_metrics` table (`/sys/class/drm/cardN/device/gpu_metrics`), a binary
//! blob laid out as one of the `struct gpu_metrics_vX_Y` of the Linux kernel's
//! `drivers/gpu/drm/amd/include/kgd_pp_interface.h`.
//!
//! What the header says (read in torvalds/linux and in the amd-gfx patches adding v1.7
//! and v1.8):
//! - every version starts with `struct metrics_table_header { u16 structure_size;
//!   u8 format_revision; u8 content_revision; }`; format 1 is dGPUs, 2 APUs, 3 newer
//!   APUs;
//! - the structs are plain C structs, not `__attribute__((packed))`: fields sit at their
//!   natural alignment (u64 on 8 bytes), which is why the header calls v1.0 and v2.0
//!   "not naturally aligned" (padding after the 4-byte header) and later versions add
//!   explicit `padding` fields. The offsets below were computed that way (and checked
//!   with a C compiler's `offsetof` on the transcribed structs); the tests rebuild them
//!   from the field lists;
//! - `system_clock_counter` (u64) is "Driver attached timestamp (in ns)": the drivers set
//!   it to `ktime_get_boottime_ns()` when they fill the table (aldebaran, smu_v13_0_6,
//!   renoir, vangogh...), so it is the host's CLOCK_BOOTTIME, in ns, at the table's
//!   refresh, not a GPU clock;
//! - `firmware_timestamp` (u64, v1.2 and later) is "PMFW attached timestamp (10ns
//!   resolution)": the power-management firmware's own clock, 100 MHz;
//! - power: v1.0–v1.3 `average_socket_power` (u16, W); v1.4–v1.8 have
//!   `curr_socket_power` (u16, "Power (Watts)") instead; v2.x `average_socket_power`
//!   (u16, mW: the v2.4 header says "unit: mW"; older APU firmware also used mW, though
//!   renoir's driver notes newer firmware that reports W); v3.0 `average_socket_power`
//!   (u32, mW).
//! - temperature: v1.x `temperature_hotspot` (u16, °C: the v1.4 header says
//!   "Temperature (Celsius)"), and `temperature_edge` before it in v1.0–v1.3 (v1.4–v1.8,
//!   MI300's, have no edge sensor); v2.x and v3.0 (APUs) `temperature_gfx` (u16,
//!   centi-°C: "unit: centi-Celsius" in v2.4, and the drivers divide by 100 for hwmon).
//!   railtrace reports the hotspot, else the edge, else the APU's gfx temperature. The
//!   drivers fill the table with 0xff before writing the fields the firmware has, so a
//!   field of 0xffff is a sensor not reported.
//!
//! Only the fields railtrace reads must lie inside the blob: AMD has appended fields to
//! released versions (v1.6 grew at its end), so the blob may be longer than the struct
//! as first released.

use std::path::{Path, PathBuf};

use super::hwmon::{card_dirs, io_error};
use super::{host_now_ns, GpuError, LoggerReading, PowerLogger, Stamp};

/// `system_clock_counter`'s rate: ns.
pub const DRIVER_HZ: f64 = 1e9;
/// `firmware_timestamp`'s rate: 10 ns ticks.
pub const FIRMWARE_HZ: f64 = 1e8;

/// What railtrace reads from one `gpu_metrics` table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuMetrics {
    /// The header's format revision (1: dGPU, 2 and 3: APU).
    pub format_revision: u8,
    /// The header's content revision.
    pub content_revision: u8,
    /// The header's structure size, bytes.
    pub structure_size: u16,
    /// The driver's timestamp: host CLOCK_BOOTTIME when the table was filled, ns.
    pub system_clock_counter: u64,
    /// The power-management firmware's timestamp, 10 ns ticks (v1.2 and later).
    pub firmware_timestamp: Option<u64>,
    /// The socket power, W (`average_socket_power`, or `curr_socket_power` in v1.4+).
    pub socket_power_w: f64,
    /// The GPU's temperature, °C: `temperature_hotspot`, else `temperature_edge` (v1.x),
    /// else `temperature_gfx` (v2.x, v3.0); None when the table reports none (0xffff).
    pub temperature_c: Option<f64>,
}

/// The width and unit of a version's socket power field.
#[derive(Debug, Clone, Copy)]
enum Power {
    U16Watts,
    U16Milliwatts,
    U32Milliwatts,
}

/// Where the fields railtrace reads lie in one version.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Offset of `system_clock_counter` (u64).
    clock: usize,
    /// Offset of the socket power field.
    power: usize,
    /// Its width and unit.
    unit: Power,
    /// Offset of `firmware_timestamp` (u64), where the version has one.
    firmware: Option<usize>,
    /// Offsets of the temperatures (u16), in order of preference: `temperature_hotspot`
    /// then `temperature_edge` (v1.x, °C), or `temperature_gfx` (v2.x, v3.0, centi-°C).
    temperatures: &'static [usize],
    /// Degrees C per unit of those fields.
    temperature_scale: f64,
}

impl Layout {
    /// The bytes the fields read need.
    fn needs(&self) -> usize {
        let power_end = self.power
            + match self.unit {
                Power::U32Milliwatts => 4,
                _ => 2,
            };
        [
            self.clock + 8,
            power_end,
            self.firmware.map_or(0, |f| f + 8),
        ]
        .into_iter()
        .chain(self.temperatures.iter().map(|t| t + 2))
        .max()
        .unwrap_or_default()
    }
}

/// The layout of `gpu_metrics_v{frev}_{crev}`, if railtrace knows it.
fn layout(frev: u8, crev: u8) -> Option<Layout> {
    use Power::*;
    let l = |clock, power, unit, firmware, temperatures| Layout {
        clock,
        power,
        unit,
        firmware,
        temperatures,
        temperature_scale: if frev == 1 { 1.0 } else { 0.01 },
    };
    // v1.0: edge, hotspot after the clock; v1.1-v1.3: edge, hotspot right after the
    // header; v1.4-v1.8: hotspot right after the header; APUs: gfx first.
    Some(match (frev, crev) {
        (1, 0) => l(8, 34, U16Watts, None, &[18, 16]),
        (1, 1) => l(32, 22, U16Watts, None, &[6, 4]),
        (1, 2) | (1, 3) => l(32, 22, U16Watts, Some(96), &[6, 4]),
        (1, 4) => l(32, 10, U16Watts, Some(232), &[4]),
        (1, 5) => l(96, 10, U16Watts, Some(304), &[4]),
        (1, 6) => l(96, 10, U16Watts, Some(328), &[4]),
        (1, 7) | (1, 8) => l(32, 10, U16Watts, Some(288), &[4]),
        (2, 0) => l(8, 44, U16Milliwatts, None, &[16]),
        (2, 1..=4) => l(32, 40, U16Milliwatts, None, &[4]),
        (3, 0) => l(104, 112, U32Milliwatts, None, &[4]),
        _ => return None,
    })
}

/// Parses a `gpu_metrics` blob (little-endian, as amdgpu's hosts are); `what` names it
/// in errors.
pub fn parse(blob: &[u8], what: &str) -> Result<GpuMetrics, GpuError> {
    let bad = |why: String| GpuError::Format {
        what: what.to_string(),
        why,
    };
    if blob.len() < 4 {
        return Err(bad(format!(
            "truncated: {} bytes, the header alone is 4",
            blob.len()
        )));
    }
    let u16_at = |o: usize| u16::from_le_bytes([blob[o], blob[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(blob[o..o + 4].try_into().unwrap_or_default());
    let u64_at = |o: usize| u64::from_le_bytes(blob[o..o + 8].try_into().unwrap_or_default());
    let (size, frev, crev) = (u16_at(0), blob[2], blob[3]);
    let layout = layout(frev, crev).ok_or_else(|| {
        bad(format!(
            "unknown gpu_metrics revision {frev}.{crev} (known: 1.0-1.8, 2.0-2.4, 3.0)"
        ))
    })?;
    let needs = layout.needs();
    if blob.len() < needs {
        return Err(bad(format!(
            "truncated: {} bytes, gpu_metrics v{frev}.{crev} needs at least {needs}",
            blob.len()
        )));
    }
    if usize::from(size) < needs {
        return Err(bad(format!(
            "header says {size} bytes, gpu_metrics v{frev}.{crev} needs at least {needs}"
        )));
    }
    let socket_power_w = match layout.unit {
        Power::U16Watts => f64::from(u16_at(layout.power)),
        Power::U16Milliwatts => f64::from(u16_at(layout.power)) * 1e-3,
        Power::U32Milliwatts => f64::from(u32_at(layout.power)) * 1e-3,
    };
    let temperature_c = layout
        .temperatures
        .iter()
        .map(|&o| u16_at(o))
        .find(|&t| t != u16::MAX)
        .map(|t| f64::from(t) * layout.temperature_scale);
    Ok(GpuMetrics {
        format_revision: frev,
        content_revision: crev,
        structure_size: size,
        system_clock_counter: u64_at(layout.clock),
        firmware_timestamp: layout.firmware.map(u64_at),
        socket_power_w,
        temperature_c,
    })
}

/// Which timestamp in the table stamps a reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsClock {
    /// `system_clock_counter`: ns, host CLOCK_BOOTTIME at the table's refresh (default).
    Driver,
    /// `firmware_timestamp`: 10 ns ticks of the power-management firmware (v1.2+).
    Firmware,
}

/// amdgpu's `gpu_metrics` as a [`PowerLogger`].
#[derive(Debug)]
pub struct GpuMetricsLogger {
    path: PathBuf,
    clock: MetricsClock,
    first: GpuMetrics,
}

impl GpuMetricsLogger {
    /// Opens `gpu_metrics` of card `card` under `root` (normally `/`), or of the
    /// lowest-numbered card that has one; reads it once to check its layout.
    pub fn open(root: &Path, card: Option<usize>) -> Result<GpuMetricsLogger, GpuError> {
        let drm = root.join("sys/class/drm");
        let path = match card {
            Some(n) => drm.join(format!("card{n}/device/gpu_metrics")),
            None => card_dirs(&drm)?
                .into_iter()
                .map(|c| c.join("device/gpu_metrics"))
                .find(|p| p.exists())
                .ok_or_else(|| {
                    GpuError::NotFound(format!("{}/card*/device/gpu_metrics", drm.display()))
                })?,
        };
        GpuMetricsLogger::at(path)
    }

    /// Uses the `gpu_metrics` file at `path`.
    pub fn at(path: PathBuf) -> Result<GpuMetricsLogger, GpuError> {
        let blob = std::fs::read(&path).map_err(|e| io_error(&path, e))?;
        let first = parse(&blob, &path.display().to_string())?;
        Ok(GpuMetricsLogger {
            path,
            clock: MetricsClock::Driver,
            first,
        })
    }

    /// Stamps readings with `clock`; [`MetricsClock::Firmware`] needs v1.2 or later.
    pub fn with_clock(mut self, clock: MetricsClock) -> Result<GpuMetricsLogger, GpuError> {
        if clock == MetricsClock::Firmware && self.first.firmware_timestamp.is_none() {
            return Err(GpuError::Unsupported(format!(
                "{}: gpu_metrics v{}.{} has no firmware_timestamp",
                self.path.display(),
                self.first.format_revision,
                self.first.content_revision
            )));
        }
        self.clock = clock;
        Ok(self)
    }

    /// The table as first read by [`GpuMetricsLogger::at`].
    pub fn first(&self) -> &GpuMetrics {
        &self.first
    }

    /// Reads the table once.
    pub fn read(&self) -> Result<LoggerReading, GpuError> {
        let blob = std::fs::read(&self.path).map_err(|e| io_error(&self.path, e))?;
        let host_ns = host_now_ns();
        let m = parse(&blob, &self.path.display().to_string())?;
        let stamp = match (self.clock, m.firmware_timestamp) {
            (MetricsClock::Firmware, Some(ticks)) => Stamp::Own {
                ticks,
                hz: FIRMWARE_HZ,
            },
            (MetricsClock::Firmware, None) => {
                return Err(GpuError::Format {
                    what: self.path.display().to_string(),
                    why: "firmware_timestamp is gone (the revision changed)".into(),
                })
            }
            (MetricsClock::Driver, _) => Stamp::Own {
                ticks: m.system_clock_counter,
                hz: DRIVER_HZ,
            },
        };
        Ok(LoggerReading {
            stamp,
            host_ns,
            power_w: m.socket_power_w,
            instant_w: None,
            temperature_c: m.temperature_c,
            energy_j: None,
            source: "gpu_metrics",
        })
    }
}

impl PowerLogger for GpuMetricsLogger {
    fn describe(&self) -> String {
        format!(
            "amdgpu gpu_metrics v{}.{} {} ({} clock)",
            self.first.format_revision,
            self.first.content_revision,
            self.path.display(),
            match self.clock {
                MetricsClock::Driver => "driver",
                MetricsClock::Firmware => "firmware",
            }
        )
    }

    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError> {
        Ok(vec![self.read()?])
    }
}

#[cfg(test)]
mod tests {
    use super::super::hwmon::tests::Tree;
    use super::*;

    /// A C field: name, element size (= its alignment), element count.
    type Field = (&'static str, usize, usize);

    /// The header, as every version starts.
    const HEADER: [Field; 3] = [
        ("structure_size", 2, 1),
        ("format_revision", 1, 1),
        ("content_revision", 1, 1),
    ];

    /// The fields of each tested version from its start to the last field railtrace
    /// reads, transcribed from kgd_pp_interface.h (runs of same-typed fields merged).
    fn fields(frev: u8, crev: u8) -> Vec<Field> {
        let mut f = HEADER.to_vec();
        f.extend(match (frev, crev) {
            (1, 0) => vec![
                ("system_clock_counter", 8, 1),
                ("temperature_edge", 2, 1),
                ("temperature_hotspot", 2, 1),
                ("temperature_mem, temperature_vr*", 2, 4),
                ("average_*_activity", 2, 3),
                ("average_socket_power", 2, 1),
                ("energy_accumulator", 4, 1),
            ],
            (1, 3) => vec![
                ("temperature_edge", 2, 1),
                ("temperature_hotspot", 2, 1),
                ("temperature_mem, temperature_vr*", 2, 4),
                ("average_*_activity", 2, 3),
                ("average_socket_power", 2, 1),
                ("energy_accumulator", 8, 1),
                ("system_clock_counter", 8, 1),
                ("average_*clk*, current_*clk*", 2, 14),
                ("throttle_status", 4, 1),
                (
                    "current_fan_speed, pcie_link_width, pcie_link_speed, padding",
                    2,
                    4,
                ),
                ("gfx_activity_acc, mem_activity_acc", 4, 2),
                ("temperature_hbm", 2, 4),
                ("firmware_timestamp", 8, 1),
                ("voltage_*, padding1", 2, 4),
                ("indep_throttle_status", 8, 1),
            ],
            (1, 4) | (1, 5) | (1, 6) => vec![
                ("temperature_hotspot", 2, 1),
                ("temperature_mem, temperature_vrsoc", 2, 2),
                ("curr_socket_power", 2, 1),
                ("average_gfx_activity, average_umc_activity", 2, 2),
                ("vcn_activity", 2, 4),
                ("jpeg_activity (v1.5+)", 2, if crev >= 5 { 32 } else { 0 }),
                ("energy_accumulator", 8, 1),
                ("system_clock_counter", 8, 1),
                (
                    "accumulation_counter, *_residency_acc (v1.6)",
                    4,
                    if crev == 6 { 6 } else { 0 },
                ),
                ("throttle_status, gfxclk_lock_status", 4, 2),
                ("pcie_link_*, xgmi_link_*", 2, 4),
                ("gfx_activity_acc, mem_activity_acc", 4, 2),
                ("pcie_bandwidth_*, pcie_*_acc", 8, 5),
                (
                    "pcie_nak_*_count_acc (v1.5+)",
                    4,
                    if crev >= 5 { 2 } else { 0 },
                ),
                ("xgmi_read_data_acc, xgmi_write_data_acc", 8, 16),
                ("firmware_timestamp", 8, 1),
            ],
            (1, 7) | (1, 8) => vec![
                ("temperature_hotspot", 2, 1),
                ("temperature_mem, temperature_vrsoc", 2, 2),
                ("curr_socket_power", 2, 1),
                ("average_gfx_activity, average_umc_activity", 2, 2),
                ("mem_max_bandwidth", 8, 1),
                ("energy_accumulator", 8, 1),
                ("system_clock_counter", 8, 1),
                (
                    "accumulation_counter, *_residency_acc, gfxclk_lock_status",
                    4,
                    7,
                ),
                ("pcie_link_*, xgmi_link_*", 2, 4),
                ("gfx_activity_acc, mem_activity_acc", 4, 2),
                ("pcie_bandwidth_*, pcie_*_acc", 8, 5),
                ("pcie_nak_*_count_acc", 4, 2),
                ("xgmi_read_data_acc, xgmi_write_data_acc", 8, 16),
                ("xgmi_link_status, padding", 2, 9),
                ("firmware_timestamp", 8, 1),
            ],
            (2, 0) => vec![
                ("system_clock_counter", 8, 1),
                ("temperature_gfx", 2, 1),
                ("temperature_soc, temperature_core, temperature_l3", 2, 11),
                ("average_gfx_activity, average_mm_activity", 2, 2),
                ("average_socket_power", 2, 1),
            ],
            (2, 1) | (2, 4) => vec![
                ("temperature_gfx", 2, 1),
                ("temperature_soc, temperature_core, temperature_l3", 2, 11),
                ("average_gfx_activity, average_mm_activity", 2, 2),
                ("system_clock_counter", 8, 1),
                ("average_socket_power", 2, 1),
            ],
            (3, 0) => vec![
                ("temperature_gfx", 2, 1),
                ("temperature_soc, temperature_core, temperature_skin", 2, 18),
                ("average_*_activity, average_dram_*, average_ipu_*", 2, 30),
                ("system_clock_counter", 8, 1),
                ("average_socket_power", 4, 1),
            ],
            _ => panic!("no field list for v{frev}.{crev}"),
        });
        f
    }

    /// Lays `fields` out with natural alignment: each field's offset, and the end.
    fn c_offsets(fields: &[Field]) -> (Vec<(&'static str, usize)>, usize) {
        let mut at = 0usize;
        let mut offsets = Vec::new();
        for &(name, size, count) in fields {
            at = at.next_multiple_of(size);
            offsets.push((name, at));
            at += size * count;
        }
        (offsets, at)
    }

    /// Writes `bytes` at field `name` of version `frev.crev` in `b`, if it has one.
    fn put(b: &mut [u8], frev: u8, crev: u8, name: &str, bytes: &[u8]) {
        let (offsets, _) = c_offsets(&fields(frev, crev));
        if let Some(&(_, o)) = offsets.iter().find(|(n, _)| *n == name) {
            b[o..o + bytes.len()].copy_from_slice(bytes);
        }
    }

    /// A blob of version `frev.crev` holding the given values (and the temperatures
    /// [`EDGE`], [`HOTSPOT`] and [`GFX_CENTI`] where it has those fields), its fields
    /// placed by [`c_offsets`]; other bytes are 0xee, so a misplaced read shows.
    fn blob(frev: u8, crev: u8, clock: u64, power: u32, firmware: u64) -> Vec<u8> {
        let (_, end) = c_offsets(&fields(frev, crev));
        let size = end.next_multiple_of(8);
        let mut b = vec![0xee; size];
        let put = |b: &mut Vec<u8>, name: &str, bytes: &[u8]| put(b, frev, crev, name, bytes);
        put(&mut b, "structure_size", &(size as u16).to_le_bytes());
        put(&mut b, "format_revision", &[frev]);
        put(&mut b, "content_revision", &[crev]);
        put(&mut b, "system_clock_counter", &clock.to_le_bytes());
        put(&mut b, "firmware_timestamp", &firmware.to_le_bytes());
        if frev == 3 {
            put(&mut b, "average_socket_power", &power.to_le_bytes());
        } else {
            let p = (power as u16).to_le_bytes();
            put(&mut b, "average_socket_power", &p);
            put(&mut b, "curr_socket_power", &p);
        }
        put(&mut b, "temperature_edge", &EDGE.to_le_bytes());
        put(&mut b, "temperature_hotspot", &HOTSPOT.to_le_bytes());
        put(&mut b, "temperature_gfx", &GFX_CENTI.to_le_bytes());
        b
    }

    const CLOCK: u64 = 0x0123_4567_89ab_cdef;
    const FIRMWARE: u64 = 0x0000_0011_2233_4455;
    /// `temperature_edge`, °C.
    const EDGE: u16 = 47;
    /// `temperature_hotspot`, °C.
    const HOTSPOT: u16 = 71;
    /// `temperature_gfx` of the APUs, centi-°C.
    const GFX_CENTI: u16 = 5_325;

    #[test]
    fn the_table_matches_the_c_layouts() {
        for (frev, crev) in [(1, 0), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (1, 8)] {
            let m = parse(&blob(frev, crev, CLOCK, 345, FIRMWARE), "test").unwrap();
            assert_eq!((m.format_revision, m.content_revision), (frev, crev));
            assert_eq!(m.system_clock_counter, CLOCK, "v{frev}.{crev}");
            assert_eq!(m.socket_power_w, 345.0, "v{frev}.{crev}");
            let firmware = (crev >= 2).then_some(FIRMWARE);
            assert_eq!(m.firmware_timestamp, firmware, "v{frev}.{crev}");
            assert_eq!(m.temperature_c, Some(71.0), "hotspot, v{frev}.{crev}");
        }
        for (frev, crev, mw) in [(2, 0, 45678), (2, 1, 45678), (2, 4, 45678), (3, 0, 123456)] {
            let m = parse(&blob(frev, crev, CLOCK, mw, FIRMWARE), "test").unwrap();
            assert_eq!(m.system_clock_counter, CLOCK, "v{frev}.{crev}");
            assert!(
                (m.socket_power_w - f64::from(mw) * 1e-3).abs() < 1e-9,
                "v{frev}.{crev}"
            );
            assert_eq!(m.firmware_timestamp, None);
            let t = m.temperature_c.unwrap();
            assert!((t - 53.25).abs() < 1e-9, "gfx, v{frev}.{crev}: {t}");
        }
    }

    #[test]
    fn a_temperature_not_reported_falls_back_or_is_none() {
        // The drivers fill what the firmware does not report with 0xff.
        let unset = u16::MAX.to_le_bytes();
        for (frev, crev) in [(1, 0), (1, 3)] {
            let mut b = blob(frev, crev, CLOCK, 345, FIRMWARE);
            put(&mut b, frev, crev, "temperature_hotspot", &unset);
            let m = parse(&b, "test").unwrap();
            assert_eq!(m.temperature_c, Some(47.0), "edge, v{frev}.{crev}");
            put(&mut b, frev, crev, "temperature_edge", &unset);
            assert_eq!(parse(&b, "test").unwrap().temperature_c, None);
        }
        // MI300's tables have no edge sensor.
        let mut b = blob(1, 5, CLOCK, 345, FIRMWARE);
        put(&mut b, 1, 5, "temperature_hotspot", &unset);
        let m = parse(&b, "test").unwrap();
        assert_eq!((m.socket_power_w, m.temperature_c), (345.0, None));
        let mut b = blob(2, 4, CLOCK, 45678, FIRMWARE);
        put(&mut b, 2, 4, "temperature_gfx", &unset);
        assert_eq!(parse(&b, "test").unwrap().temperature_c, None);
    }

    #[test]
    fn the_c_struct_sizes_are_as_the_kernel_has_them() {
        // sizeof(struct gpu_metrics_v1_3) and v2_1 on x86-64: the whole structs are
        // listed for these two, so this checks the alignment rules end to end.
        let (_, end) = c_offsets(&fields(1, 3));
        assert_eq!(end.next_multiple_of(8), 120);
        let mut v2_1 = fields(2, 1);
        v2_1.extend_from_slice(&[("power, clocks", 2, 33), ("throttle_status", 4, 1)]);
        v2_1.extend_from_slice(&[("fan_pwm, padding", 2, 4)]);
        assert_eq!(c_offsets(&v2_1).1.next_multiple_of(8), 120);
    }

    #[test]
    fn a_truncated_blob() {
        let b = blob(1, 3, CLOCK, 345, FIRMWARE);
        let e = parse(&b[..100], "card0/device/gpu_metrics")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "card0/device/gpu_metrics: truncated: 100 bytes, gpu_metrics v1.3 needs at least 104"
        );
        let e = parse(&b[..3], "x").unwrap_err().to_string();
        assert_eq!(e, "x: truncated: 3 bytes, the header alone is 4");
        let mut short = b.clone();
        short[0..2].copy_from_slice(&64u16.to_le_bytes());
        let e = parse(&short, "x").unwrap_err().to_string();
        assert_eq!(
            e,
            "x: header says 64 bytes, gpu_metrics v1.3 needs at least 104"
        );
    }

    #[test]
    fn an_unknown_revision() {
        let mut b = blob(1, 3, CLOCK, 345, FIRMWARE);
        b[3] = 99;
        let e = parse(&b, "x").unwrap_err();
        assert!(matches!(e, GpuError::Format { .. }));
        assert!(
            e.to_string()
                .starts_with("x: unknown gpu_metrics revision 1.99"),
            "{e}"
        );
        b[2] = 7;
        b[3] = 0;
        assert!(parse(&b, "x")
            .unwrap_err()
            .to_string()
            .contains("revision 7.0"));
    }

    #[test]
    fn the_logger_reads_the_card_file() {
        let t = Tree::new("gpu-metrics");
        t.write("sys/class/drm/card0-DP-1/status", "connected\n");
        t.write("sys/class/drm/card0/device/vendor", "0x1002\n");
        t.write(
            "sys/class/drm/card1/device/gpu_metrics",
            blob(1, 5, CLOCK, 612, FIRMWARE),
        );
        let mut logger = GpuMetricsLogger::open(&t.0, None).unwrap();
        assert!(logger.describe().starts_with("amdgpu gpu_metrics v1.5"));
        let r = logger.poll().unwrap()[0];
        assert_eq!(
            r.stamp,
            Stamp::Own {
                ticks: CLOCK,
                hz: 1e9
            }
        );
        assert_eq!((r.power_w, r.instant_w), (612.0, None));
        assert_eq!(r.temperature_c, Some(71.0));

        let logger = logger.with_clock(MetricsClock::Firmware).unwrap();
        let r = logger.read().unwrap();
        assert_eq!(
            r.stamp,
            Stamp::Own {
                ticks: FIRMWARE,
                hz: 1e8
            }
        );
    }

    #[test]
    fn logger_errors_name_the_path() {
        let t = Tree::new("gpu-metrics-errors");
        t.write(
            "sys/class/drm/card0/device/gpu_metrics",
            blob(2, 1, CLOCK, 9000, 0),
        );
        t.write("sys/class/drm/card1/device/gpu_metrics", [1u8, 0, 1, 42]);
        let e = GpuMetricsLogger::open(&t.0, Some(3))
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("card3/device/gpu_metrics: not found"), "{e}");
        let e = GpuMetricsLogger::open(&t.0, Some(1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("card1/device/gpu_metrics: unknown gpu_metrics revision 1.42"),
            "{e}"
        );
        let logger = GpuMetricsLogger::open(&t.0, Some(0)).unwrap();
        let e = logger
            .with_clock(MetricsClock::Firmware)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("card0/device/gpu_metrics: gpu_metrics v2.1 has no firmware_timestamp"));
        let empty = Tree::new("gpu-metrics-none");
        std::fs::create_dir_all(empty.0.join("sys/class/drm/card0/device")).unwrap();
        let e = GpuMetricsLogger::open(&empty.0, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("sys/class/drm/card*/device/gpu_metrics: not found"),
            "{e}"
        );
    }
}
