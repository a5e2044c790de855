//! amdgpu's core clock (sclk) DVFS levels through sysfs, in a card's device directory
//! (`/sys/class/drm/cardN/device/`), as the kernel documents them
//! (Documentation/gpu/amdgpu/thermal.rst, `power_dpm_force_performance_level` and
//! `pp_dpm_*`):
//!
//! - `pp_dpm_sclk` lists the levels, one a line, `N: FREQMhz`, the current one marked
//!   `*` (`0: 500Mhz`, `1: 1700Mhz *`). Writing level numbers (`"1"`, or `"1 2"` for a
//!   range) makes only those levels allowed, which the driver accepts only while
//! - `power_dpm_force_performance_level` is `manual`; `auto` gives the choice back to
//!   the driver.
//!
//! **Level names** are the numbers `pp_dpm_sclk` shows (`"0"`, `"1"`, …), each with its
//! frequency ([`Level::describe`]: `1 (1700 MHz)`). [`AmdDvfs::set`] writes `manual`,
//! then the one number; dropping the [`AmdDvfs`] after a `set` writes `auto` (not the
//! mode that was there before).
//!
//! Some drivers add lines that are not levels, and they are not named: `S: 19Mhz *`
//! (the clock in deep sleep, below level 0) and `F: 1376Mhz *` (the current clock of a
//! fine-grained table). Older fine-grained tables (e.g. the MI300's) show the current
//! clock as a middle numbered line between the minimum and the maximum (`0: 500Mhz`,
//! `1: 1376Mhz *`, `2: 2100Mhz`), which reads as a level like any other: the levels are
//! those listed when [`AmdDvfs::open`] read the file, and where the driver does not take
//! a number it refuses the write (the error says so). `pp_od_clk_voltage` (the
//! overdrive voltage curve, on many GPUs) is not used.
//!
//! **Permissions.** The files are world-readable and writable by root only: setting
//! levels needs root, or a udev rule that lets the user's group write the two files
//! (e.g. a rule on `SUBSYSTEM=="drm", KERNEL=="card[0-9]*", DRIVERS=="amdgpu"` whose
//! `RUN` does `chgrp video` and `chmod g+w` on `/sys%p/device/pp_dpm_sclk` and
//! `/sys%p/device/power_dpm_force_performance_level`).

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::hwmon::{card_dirs, io_error};
use super::GpuError;

/// The file that lists and selects the core clock levels.
pub const SCLK: &str = "pp_dpm_sclk";
/// The file that selects who chooses the levels (`manual`: the user; `auto`: the driver).
pub const PERFORMANCE_LEVEL: &str = "power_dpm_force_performance_level";

/// One core clock level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// Its name: the number `pp_dpm_sclk` shows (`"0"`, `"1"`, …).
    pub name: String,
    /// Its core clock, Hz.
    pub frequency_hz: u64,
}

impl Level {
    /// `1 (1700 MHz)`.
    pub fn describe(&self) -> String {
        format!("{} ({} MHz)", self.name, self.frequency_hz / 1_000_000)
    }
}

/// `pp_dpm_sclk` as read: the numbered levels and which line is marked current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sclk {
    /// The numbered levels, in file order.
    pub levels: Vec<Level>,
    /// The level marked `*`; None when no numbered line is (deep sleep's `S:` line, a
    /// fine-grained table's `F:` line, or no mark at all).
    pub current: Option<Level>,
}

/// Parses `pp_dpm_sclk`'s text (`what` names the file in errors).
pub fn parse_sclk(text: &str, what: &str) -> Result<Sclk, GpuError> {
    let mut levels: Vec<Level> = Vec::new();
    let mut current = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| GpuError::Format {
            what: what.to_string(),
            why: format!("line {}: {line:?}: {why}", n + 1),
        };
        let (label, rest) = line
            .split_once(':')
            .ok_or_else(|| bad("not `N: FREQMhz` with an optional `*`"))?;
        let rest = rest.trim();
        let (rest, marked) = match rest.strip_suffix('*') {
            Some(r) => (r.trim_end(), true),
            None => (rest, false),
        };
        let mhz = parse_mhz(rest).ok_or_else(|| bad("the frequency is not `NMhz`"))?;
        let label = label.trim();
        if label == "S" || label == "F" {
            // The deep-sleep or fine-grained current clock: not a level.
            continue;
        }
        if label.is_empty() || !label.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the level is not a number (nor `S` or `F`)"));
        }
        let name = label
            .parse::<u32>()
            .map_err(|_| bad("level out of range"))?;
        let name = name.to_string();
        if levels.iter().any(|l| l.name == name) {
            return Err(bad("level listed twice"));
        }
        let level = Level {
            name,
            frequency_hz: mhz * 1_000_000,
        };
        if marked {
            current = Some(level.clone());
        }
        levels.push(level);
    }
    if levels.is_empty() {
        return Err(GpuError::Format {
            what: what.to_string(),
            why: "no levels listed (the driver offers no core clock levels on this GPU)".into(),
        });
    }
    Ok(Sclk { levels, current })
}

/// `1700Mhz` (any case, a space allowed before the unit) in MHz.
fn parse_mhz(text: &str) -> Option<u64> {
    let digits = text.len() - text.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() || !unit.trim_start().eq_ignore_ascii_case("mhz") {
        return None;
    }
    number.parse().ok()
}

/// A card's core clock DVFS levels: lists them, sets one, and gives the choice back to
/// the driver (`auto`) when dropped after a [`AmdDvfs::set`].
#[derive(Debug)]
pub struct AmdDvfs {
    dir: PathBuf,
    levels: Vec<Level>,
    /// `manual` was written: drop writes `auto`.
    manual: bool,
}

impl AmdDvfs {
    /// Opens the device directory `dir` (`/sys/class/drm/cardN/device`): reads the levels
    /// from `pp_dpm_sclk` and checks that `power_dpm_force_performance_level` is there.
    /// Writes nothing.
    pub fn open(dir: &Path) -> Result<AmdDvfs, GpuError> {
        if !dir.is_dir() {
            return Err(GpuError::NotFound(format!(
                "{} (no such GPU device directory)",
                dir.display()
            )));
        }
        let sclk = dir.join(SCLK);
        let text = std::fs::read_to_string(&sclk).map_err(|e| missing(&sclk, e))?;
        let levels = parse_sclk(&text, &sclk.display().to_string())?.levels;
        let mode = dir.join(PERFORMANCE_LEVEL);
        std::fs::metadata(&mode).map_err(|e| missing(&mode, e))?;
        Ok(AmdDvfs {
            dir: dir.to_path_buf(),
            levels,
            manual: false,
        })
    }

    /// The device directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The levels, as listed when the directory was opened.
    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// The level the driver marks current now (None in deep sleep, on a fine-grained
    /// table's `F:` line, or when none is marked).
    pub fn current(&self) -> Result<Option<Level>, GpuError> {
        let sclk = self.dir.join(SCLK);
        let text = std::fs::read_to_string(&sclk).map_err(|e| io_error(&sclk, e))?;
        Ok(parse_sclk(&text, &sclk.display().to_string())?.current)
    }

    /// `power_dpm_force_performance_level` now (`auto`, `manual`, `high`, …).
    pub fn performance_level(&self) -> Result<String, GpuError> {
        let mode = self.dir.join(PERFORMANCE_LEVEL);
        let text = std::fs::read_to_string(&mode).map_err(|e| io_error(&mode, e))?;
        Ok(text.trim().to_string())
    }

    /// Allows only level `level` (a name from [`AmdDvfs::levels`]): writes `manual` to
    /// `power_dpm_force_performance_level`, then the level's number to `pp_dpm_sclk`.
    pub fn set(&mut self, level: &str) -> Result<(), GpuError> {
        if !self.levels.iter().any(|l| l.name == level) {
            let have: Vec<String> = self.levels.iter().map(Level::describe).collect();
            return Err(GpuError::Unsupported(format!(
                "{}: no DVFS level {level:?} (it has: {})",
                self.dir.join(SCLK).display(),
                have.join(", ")
            )));
        }
        write(&self.dir.join(PERFORMANCE_LEVEL), "manual")?;
        self.manual = true;
        write(&self.dir.join(SCLK), level)
    }

    /// Gives the choice of level back to the driver (writes `auto`) if
    /// [`AmdDvfs::set`] took it; dropping does the same.
    pub fn restore(&mut self) -> Result<(), GpuError> {
        if self.manual {
            write(&self.dir.join(PERFORMANCE_LEVEL), "auto")?;
            self.manual = false;
        }
        Ok(())
    }
}

impl Drop for AmdDvfs {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("railtrace: could not give DVFS back to the driver: {e}");
        }
    }
}

/// The device directory of the `n`-th card (0-based, in card number order) under `root`
/// (`/`, or a fixture tree) whose driver lists core clock levels (`pp_dpm_sclk`), the
/// only link railtrace makes between a HIP device number and a card: it holds where the
/// two are numbered in the same (PCI) order, with no `HIP_VISIBLE_DEVICES` or
/// `ROCR_VISIBLE_DEVICES` renumbering HIP's.
pub fn nth_device_dir(root: &Path, n: usize) -> Result<PathBuf, GpuError> {
    let drm = root.join("sys/class/drm");
    let dirs: Vec<PathBuf> = card_dirs(&drm)?
        .into_iter()
        .map(|card| card.join("device"))
        .filter(|dir| dir.join(SCLK).exists())
        .collect();
    let found = dirs.len();
    dirs.into_iter().nth(n).ok_or_else(|| {
        GpuError::NotFound(format!(
            "{}/card*/device/{SCLK} of GPU {n} (found {found}: the driver exposes no DVFS \
             levels for it)",
            drm.display()
        ))
    })
}

/// The device directory of the card at PCI address `slot` (`0000:03:00.0`, as
/// `hipDeviceGetPCIBusId` gives it) under `root`: the card whose `device/uevent` has
/// `PCI_SLOT_NAME=` that address (any case).
pub fn pci_device_dir(root: &Path, slot: &str) -> Result<PathBuf, GpuError> {
    let drm = root.join("sys/class/drm");
    for card in card_dirs(&drm)? {
        let uevent = card.join("device/uevent");
        let Ok(text) = std::fs::read_to_string(&uevent) else {
            continue;
        };
        let matches = text.lines().any(|l| {
            l.strip_prefix("PCI_SLOT_NAME=")
                .is_some_and(|s| s.trim().eq_ignore_ascii_case(slot.trim()))
        });
        if matches {
            return Ok(card.join("device"));
        }
    }
    Err(GpuError::NotFound(format!(
        "{}/card*/device/uevent with PCI_SLOT_NAME={slot}",
        drm.display()
    )))
}

/// A read error on a file that must exist for DVFS.
fn missing(path: &Path, e: std::io::Error) -> GpuError {
    match e.kind() {
        ErrorKind::NotFound => GpuError::NotFound(format!(
            "{} (the amdgpu driver exposes no DVFS levels for this GPU)",
            path.display()
        )),
        _ => io_error(path, e),
    }
}

/// Writes `value` and a newline to the sysfs file `path` in one write, as `echo` does
/// (the file must exist: nothing is created).
fn write(path: &Path, value: &str) -> Result<(), GpuError> {
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{value}\n").as_bytes()))
        .map_err(|e| write_error(path, value, e))
}

/// A write error on `path` as a [`GpuError`] naming the file and the cause.
fn write_error(path: &Path, value: &str, e: std::io::Error) -> GpuError {
    let what = path.display().to_string();
    match e.kind() {
        ErrorKind::NotFound => GpuError::NotFound(format!(
            "{what} (the amdgpu driver exposes no DVFS levels for this GPU)"
        )),
        ErrorKind::PermissionDenied => GpuError::Permission(format!(
            "{what} (setting DVFS levels needs root, or a udev rule that lets this user \
             write it and {PERFORMANCE_LEVEL})"
        )),
        ErrorKind::InvalidInput => {
            GpuError::Other(format!("{what}: the driver refused {value:?} ({e})"))
        }
        _ => GpuError::Other(format!("{what}: writing {value:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::hwmon::tests::Tree;

    const DIR: &str = "sys/class/drm/card1/device";

    /// card0 is another driver's (no `pp_dpm_sclk`), card1 an amdgpu with three levels,
    /// level 1 current.
    fn sysfs() -> Tree {
        let t = Tree::new("amd-dvfs");
        t.write("sys/class/drm/card0/device/uevent", "DRIVER=i915\n");
        t.write("sys/class/drm/card1-DP-1/status", "connected\n");
        t.write(
            &format!("{DIR}/uevent"),
            "DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_SLOT_NAME=0000:c1:00.0\n",
        );
        t.write(
            &format!("{DIR}/{SCLK}"),
            "0: 500Mhz \n1: 1700Mhz *\n2: 2100Mhz \n",
        );
        t.write(&format!("{DIR}/{PERFORMANCE_LEVEL}"), "auto\n");
        t
    }

    fn read(t: &Tree, file: &str) -> String {
        std::fs::read_to_string(t.0.join(DIR).join(file)).unwrap()
    }

    fn level(name: &str, mhz: u64) -> Level {
        Level {
            name: name.into(),
            frequency_hz: mhz * 1_000_000,
        }
    }

    #[test]
    fn lists_levels_and_the_current_one() {
        let t = sysfs();
        let dvfs = AmdDvfs::open(&t.0.join(DIR)).unwrap();
        assert_eq!(
            dvfs.levels(),
            [level("0", 500), level("1", 1700), level("2", 2100)]
        );
        assert_eq!(dvfs.levels()[2].describe(), "2 (2100 MHz)");
        assert_eq!(dvfs.current().unwrap(), Some(level("1", 1700)));
        assert_eq!(dvfs.performance_level().unwrap(), "auto");
        t.write(&format!("{DIR}/{SCLK}"), "0: 500Mhz *\n1: 1700Mhz\n");
        assert_eq!(dvfs.current().unwrap(), Some(level("0", 500)));
        drop(dvfs);
        // Nothing was set, so nothing was written.
        assert_eq!(read(&t, PERFORMANCE_LEVEL), "auto\n");
    }

    #[test]
    fn deep_sleep_and_fine_grained_lines_are_not_levels() {
        let s = parse_sclk("S: 19Mhz *\n0: 500Mhz\n1: 2100Mhz\n", "f").unwrap();
        assert_eq!(s.levels, [level("0", 500), level("1", 2100)]);
        assert_eq!(s.current, None);
        let s = parse_sclk("F: 1376Mhz *\n0: 500Mhz\n1: 2100Mhz\n", "f").unwrap();
        assert_eq!((s.levels.len(), s.current), (2, None));
        let s = parse_sclk("0: 300MHz\n1: 1000 mhz *\n", "f").unwrap();
        assert_eq!(s.current, Some(level("1", 1000)));
    }

    #[test]
    fn set_writes_manual_then_the_level_and_drop_writes_auto() {
        let t = sysfs();
        let mut dvfs = AmdDvfs::open(&t.0.join(DIR)).unwrap();
        dvfs.set("2").unwrap();
        assert_eq!(read(&t, PERFORMANCE_LEVEL), "manual\n");
        assert_eq!(read(&t, SCLK), "2\n");
        dvfs.set("0").unwrap();
        assert_eq!(read(&t, SCLK), "0\n");
        drop(dvfs);
        assert_eq!(read(&t, PERFORMANCE_LEVEL), "auto\n");
        assert_eq!(read(&t, SCLK), "0\n");
    }

    #[test]
    fn restore_gives_the_choice_back_once() {
        let t = sysfs();
        let mut dvfs = AmdDvfs::open(&t.0.join(DIR)).unwrap();
        dvfs.set("1").unwrap();
        dvfs.restore().unwrap();
        assert_eq!(read(&t, PERFORMANCE_LEVEL), "auto\n");
        // Someone else takes manual control: dropping leaves it alone.
        t.write(&format!("{DIR}/{PERFORMANCE_LEVEL}"), "manual\n");
        drop(dvfs);
        assert_eq!(read(&t, PERFORMANCE_LEVEL), "manual\n");
    }

    #[test]
    fn an_unknown_level_names_those_there_are_and_writes_nothing() {
        let t = sysfs();
        let mut dvfs = AmdDvfs::open(&t.0.join(DIR)).unwrap();
        let e = dvfs.set("sclk3").unwrap_err();
        assert!(matches!(e, GpuError::Unsupported(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.ends_with(
                "card1/device/pp_dpm_sclk: no DVFS level \"sclk3\" (it has: 0 (500 MHz), \
                 1 (1700 MHz), 2 (2100 MHz))"
            ),
            "{e}"
        );
        assert_eq!(read(&t, PERFORMANCE_LEVEL), "auto\n");
    }

    #[test]
    fn a_malformed_line_is_named() {
        let t = sysfs();
        t.write(
            &format!("{DIR}/{SCLK}"),
            "0: 500Mhz\n1: fast *\n2: 2100Mhz\n",
        );
        let e = AmdDvfs::open(&t.0.join(DIR)).unwrap_err();
        assert!(matches!(e, GpuError::Format { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.ends_with(
                "card1/device/pp_dpm_sclk: line 2: \"1: fast *\": the frequency is not `NMhz`"
            ),
            "{e}"
        );
        for (text, why) in [
            ("0 500Mhz\n", "line 1: \"0 500Mhz\": not `N: FREQMhz`"),
            (
                "0: 500Mhz\nX: 9Mhz\n",
                "line 2: \"X: 9Mhz\": the level is not a number",
            ),
            (
                "0: 5Mhz\n0: 6Mhz\n",
                "line 2: \"0: 6Mhz\": level listed twice",
            ),
            ("\n", "no levels listed"),
        ] {
            let e = parse_sclk(text, "pp_dpm_sclk").unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("pp_dpm_sclk: {why}")),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn missing_files_say_the_driver_exposes_no_dvfs() {
        let t = sysfs();
        let e = AmdDvfs::open(&t.0.join("sys/class/drm/card0/device"))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(
                "card0/device/pp_dpm_sclk (the amdgpu driver exposes no DVFS levels for this \
                 GPU): not found"
            ),
            "{e}"
        );
        let e = AmdDvfs::open(&t.0.join("sys/class/drm/card9/device"))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("card9/device (no such GPU device directory): not found"),
            "{e}"
        );
        std::fs::remove_file(t.0.join(DIR).join(PERFORMANCE_LEVEL)).unwrap();
        let e = AmdDvfs::open(&t.0.join(DIR)).unwrap_err().to_string();
        assert!(
            e.contains("card1/device/power_dpm_force_performance_level (the amdgpu driver"),
            "{e}"
        );
    }

    #[test]
    fn a_read_only_file_says_who_may_write_it() {
        use std::os::unix::fs::PermissionsExt;
        let t = sysfs();
        let mut dvfs = AmdDvfs::open(&t.0.join(DIR)).unwrap();
        let mode = t.0.join(DIR).join(PERFORMANCE_LEVEL);
        std::fs::set_permissions(&mode, std::fs::Permissions::from_mode(0o444)).unwrap();
        match dvfs.set("1") {
            Err(GpuError::Permission(what)) => {
                let e = GpuError::Permission(what).to_string();
                assert!(
                    e.ends_with(
                        "card1/device/power_dpm_force_performance_level (setting DVFS levels \
                         needs root, or a udev rule that lets this user write it and \
                         power_dpm_force_performance_level): permission denied"
                    ),
                    "{e}"
                );
                assert_eq!(read(&t, SCLK), "0: 500Mhz \n1: 1700Mhz *\n2: 2100Mhz \n");
            }
            // Root writes read-only files: the mapping is checked below all the same.
            Ok(()) => println!("SKIPPED (running as root): the chmod 444 file was written"),
            Err(e) => panic!("not a permission error: {e:?}"),
        }
        let denied = std::io::Error::from(ErrorKind::PermissionDenied);
        let e = write_error(Path::new("/sys/x/pp_dpm_sclk"), "1", denied).to_string();
        assert!(e.starts_with("/sys/x/pp_dpm_sclk (setting DVFS levels needs root"));
        assert!(e.ends_with("): permission denied"), "{e}");
        let refused = std::io::Error::from(ErrorKind::InvalidInput);
        let e = write_error(Path::new("/sys/x/pp_dpm_sclk"), "2", refused).to_string();
        assert!(
            e.starts_with("/sys/x/pp_dpm_sclk: the driver refused \"2\""),
            "{e}"
        );
        drop(dvfs);
    }

    #[test]
    fn finds_a_card_by_order_or_pci_address() {
        let t = sysfs();
        t.write(
            "sys/class/drm/card3/device/uevent",
            "PCI_SLOT_NAME=0000:03:00.0\n",
        );
        t.write(
            &format!("sys/class/drm/card3/device/{SCLK}"),
            "0: 100Mhz *\n",
        );
        let dir = nth_device_dir(&t.0, 0).unwrap();
        assert!(dir.ends_with("card1/device"), "{}", dir.display());
        assert!(nth_device_dir(&t.0, 1).unwrap().ends_with("card3/device"));
        let e = nth_device_dir(&t.0, 2).unwrap_err().to_string();
        assert!(
            e.ends_with("card*/device/pp_dpm_sclk of GPU 2 (found 2: the driver exposes no DVFS levels for it): not found"),
            "{e}"
        );
        let dir = pci_device_dir(&t.0, "0000:C1:00.0").unwrap();
        assert!(dir.ends_with("card1/device"));
        let e = pci_device_dir(&t.0, "0000:04:00.0")
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("card*/device/uevent with PCI_SLOT_NAME=0000:04:00.0: not found"),
            "{e}"
        );
    }

    /// On a real amdgpu: `cargo test -p railtrace --features hardware-tests --lib amd_dvfs
    /// -- --nocapture`, with `RAILTRACE_AMD_SYSFS=/sys/class/drm/cardN/device` (else the
    /// first card that lists levels); with `RAILTRACE_AMD_DVFS_WRITE=1` (as root) it also
    /// sets each level in turn and gives the choice back to the driver. Skipped where no
    /// card lists levels.
    #[cfg(feature = "hardware-tests")]
    #[test]
    fn lists_a_real_cards_levels() {
        let dir = match std::env::var_os("RAILTRACE_AMD_SYSFS") {
            Some(d) => PathBuf::from(d),
            None => match nth_device_dir(Path::new("/"), 0) {
                Ok(d) => d,
                Err(e) => {
                    println!("SKIPPED (no amdgpu card with DVFS levels): {e}");
                    return;
                }
            },
        };
        let mut dvfs = AmdDvfs::open(&dir).unwrap();
        let names: Vec<String> = dvfs.levels().iter().map(Level::describe).collect();
        println!(
            "{}: levels {}; current {:?}; {} {}",
            dir.display(),
            names.join(", "),
            dvfs.current().unwrap(),
            PERFORMANCE_LEVEL,
            dvfs.performance_level().unwrap()
        );
        if std::env::var_os("RAILTRACE_AMD_DVFS_WRITE").is_some() {
            let levels = dvfs.levels().to_vec();
            for l in &levels {
                dvfs.set(&l.name).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(100));
                println!(
                    "set {}: current {:?}",
                    l.describe(),
                    dvfs.current().unwrap()
                );
            }
            assert_eq!(dvfs.performance_level().unwrap(), "manual");
            dvfs.restore().unwrap();
            assert_eq!(dvfs.performance_level().unwrap(), "auto");
        }
    }
}
