//! amdgpu's hwmon power logger: `power1_average` and/or `power1_input` (µW, integer text)
//! in `/sys/class/drm/cardN/device/hwmon/hwmonM/`, the hwmon directory whose `name` is
//! `amdgpu`. Some kernels and GPUs have only one of the two files. The GPU's temperature
//! comes from `temp1_input` (millidegrees C, integer text, as every hwmon `temp*_input`;
//! amdgpu's temp1 is the edge sensor) where the directory has one.
//!
//! Each [`PowerLogger::poll`] reads the files once and returns that one reading, stamped
//! with the host time at the middle of the read ([`Stamp::HostNs`]); it does not skip
//! repeated values, since the logger's own update period is what calibration identifies.
//! [`poll_every`] polls any logger on a fixed period (at most 1 kHz).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{host_now_ns, GpuError, LoggerReading, PowerLogger, Stamp};

/// The fastest [`poll_every`] polls: 1 kHz.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);

/// amdgpu's hwmon power files for one card.
#[derive(Debug)]
pub struct HwmonLogger {
    dir: PathBuf,
    average: Option<PathBuf>,
    input: Option<PathBuf>,
    temperature: Option<PathBuf>,
}

impl HwmonLogger {
    /// Opens the amdgpu hwmon directory under `root` (normally `/`; a fixture tree in
    /// tests) of card `card`, or of the lowest-numbered card that has one.
    pub fn open(root: &Path, card: Option<usize>) -> Result<HwmonLogger, GpuError> {
        let drm = root.join("sys/class/drm");
        let cards = match card {
            Some(n) => {
                let dir = drm.join(format!("card{n}"));
                if !dir.is_dir() {
                    return Err(GpuError::NotFound(dir.display().to_string()));
                }
                vec![dir]
            }
            None => card_dirs(&drm)?,
        };
        for card_dir in &cards {
            if let Some(dir) = amdgpu_hwmon(card_dir)? {
                return HwmonLogger::at(dir);
            }
        }
        let place = match card {
            Some(n) => format!("{}/card{n}/device/hwmon/hwmon*", drm.display()),
            None => format!("{}/card*/device/hwmon/hwmon*", drm.display()),
        };
        Err(GpuError::NotFound(format!("{place} named amdgpu")))
    }

    /// Uses the hwmon directory `dir` as it is (its `name` is not checked).
    pub fn at(dir: PathBuf) -> Result<HwmonLogger, GpuError> {
        let file = |name: &str| Some(dir.join(name)).filter(|p| p.exists());
        let (average, input) = (file("power1_average"), file("power1_input"));
        if average.is_none() && input.is_none() {
            return Err(GpuError::NotFound(format!(
                "{}/power1_average or power1_input",
                dir.display()
            )));
        }
        let temperature = file("temp1_input");
        Ok(HwmonLogger {
            dir,
            average,
            input,
            temperature,
        })
    }

    /// The hwmon directory in use.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the power files once. `power_w` is `power1_average` where there is one,
    /// else `power1_input`; `instant_w` is `power1_input` where there is one;
    /// `temperature_c` is `temp1_input` where there is one, read after the power files
    /// (outside the stamp's bracket). A temperature the driver does not give (the read
    /// fails, or the text is not an integer) is None: the power reading is kept.
    pub fn read(&self) -> Result<LoggerReading, GpuError> {
        let before = host_now_ns();
        let average = self.average.as_deref().map(read_uw).transpose()?;
        let input = self.input.as_deref().map(read_uw).transpose()?;
        let after = host_now_ns();
        let watts = |uw: u64| uw as f64 * 1e-6;
        let instant_w = input.map(watts);
        let power_w = average.map(watts).or(instant_w).unwrap_or_default();
        let temperature_c = self
            .temperature
            .as_deref()
            .and_then(|p| read_millidegrees(p).ok())
            .map(|m| m as f64 * 1e-3);
        Ok(LoggerReading {
            stamp: Stamp::HostNs(before + (after - before) / 2),
            host_ns: after,
            power_w,
            instant_w,
            temperature_c,
            energy_j: None,
            source: "hwmon",
        })
    }
}

impl PowerLogger for HwmonLogger {
    fn describe(&self) -> String {
        let files: Vec<&str> = [
            ("power1_average", &self.average),
            ("power1_input", &self.input),
            ("temp1_input", &self.temperature),
        ]
        .into_iter()
        .filter_map(|(name, path)| path.as_ref().map(|_| name))
        .collect();
        format!("amdgpu hwmon {} ({})", self.dir.display(), files.join(", "))
    }

    fn poll(&mut self) -> Result<Vec<LoggerReading>, GpuError> {
        Ok(vec![self.read()?])
    }
}

/// Polls `logger` every `period` (at least [`MIN_PERIOD`]) for `total`, on a fixed
/// schedule (a late poll does not shift the ones after it), and returns all readings.
pub fn poll_every(
    logger: &mut dyn PowerLogger,
    period: Duration,
    total: Duration,
) -> Result<Vec<LoggerReading>, GpuError> {
    let period = period.max(MIN_PERIOD);
    let start = Instant::now();
    let mut next = start;
    let mut readings = Vec::new();
    while next.duration_since(start) < total {
        readings.extend(logger.poll()?);
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    Ok(readings)
}

/// `cardN` directories (not connectors like `card0-DP-1`) under `drm`, by number.
pub(crate) fn card_dirs(drm: &Path) -> Result<Vec<PathBuf>, GpuError> {
    let mut cards: Vec<(usize, PathBuf)> = std::fs::read_dir(drm)
        .map_err(|e| io_error(drm, e))?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let n = name.strip_prefix("card")?.parse().ok()?;
            Some((n, entry.path()))
        })
        .collect();
    cards.sort();
    Ok(cards.into_iter().map(|(_, p)| p).collect())
}

/// The `device/hwmon/hwmon*` directory of `card` whose `name` is `amdgpu`, if any.
fn amdgpu_hwmon(card: &Path) -> Result<Option<PathBuf>, GpuError> {
    let hwmon = card.join("device/hwmon");
    let entries = match std::fs::read_dir(&hwmon) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(&hwmon, e)),
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("hwmon"))
        })
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.join("name");
        match std::fs::read_to_string(&name) {
            Ok(text) if text.trim() == "amdgpu" => return Ok(Some(dir)),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&name, e)),
        }
    }
    Ok(None)
}

/// Reads a file holding one non-negative integer (µW).
fn read_uw(path: &Path) -> Result<u64, GpuError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_error(path, e))?;
    text.trim().parse().map_err(|_| GpuError::Format {
        what: path.display().to_string(),
        why: format!("not an integer: {:?}", text.trim()),
    })
}

/// Reads a file holding one integer, millidegrees C (hwmon's `temp*_input`: signed).
fn read_millidegrees(path: &Path) -> Result<i64, GpuError> {
    let text = std::fs::read_to_string(path).map_err(|e| io_error(path, e))?;
    text.trim().parse().map_err(|_| GpuError::Format {
        what: path.display().to_string(),
        why: format!("not an integer: {:?}", text.trim()),
    })
}

/// An I/O error on `path` as a [`GpuError`] naming the path.
pub(crate) fn io_error(path: &Path, e: std::io::Error) -> GpuError {
    let what = path.display().to_string();
    match e.kind() {
        ErrorKind::NotFound => GpuError::NotFound(what),
        ErrorKind::PermissionDenied => GpuError::Permission(what),
        _ => GpuError::Other(format!("{what}: {e}")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A directory tree in the temporary directory, removed when dropped.
    pub(crate) struct Tree(pub(crate) PathBuf);

    impl Tree {
        pub(crate) fn new(name: &str) -> Tree {
            let dir = std::env::temp_dir().join(format!(
                "railtrace-{name}-{}-{}",
                std::process::id(),
                host_now_ns()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Tree(dir)
        }

        /// Writes `contents` at `rel`, making the directories on the way.
        pub(crate) fn write(&self, rel: &str, contents: impl AsRef<[u8]>) -> PathBuf {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, contents).unwrap();
            path
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// card0 is another driver's, card1 has a connector and amdgpu at hwmon3 (with both
    /// power files and `temp1_input`), card2 amdgpu with only `power1_input`.
    fn sysfs() -> Tree {
        let t = Tree::new("hwmon");
        t.write("sys/class/drm/card0/device/hwmon/hwmon0/name", "nouveau\n");
        t.write(
            "sys/class/drm/card0/device/hwmon/hwmon0/power1_average",
            "1\n",
        );
        t.write("sys/class/drm/card1-DP-1/status", "connected\n");
        t.write("sys/class/drm/card1/device/hwmon/hwmon2/name", "k10temp\n");
        t.write("sys/class/drm/card1/device/hwmon/hwmon3/name", "amdgpu\n");
        t.write(
            "sys/class/drm/card1/device/hwmon/hwmon3/power1_average",
            "123456789\n",
        );
        t.write(
            "sys/class/drm/card1/device/hwmon/hwmon3/power1_input",
            "250000000\n",
        );
        t.write(
            "sys/class/drm/card1/device/hwmon/hwmon3/temp1_input",
            "48500\n",
        );
        t.write("sys/class/drm/card2/device/hwmon/hwmon4/name", "amdgpu\n");
        t.write(
            "sys/class/drm/card2/device/hwmon/hwmon4/power1_input",
            "42000000\n",
        );
        t
    }

    #[test]
    fn finds_the_first_amdgpu_card_and_reads_both_files() {
        let t = sysfs();
        let mut logger = HwmonLogger::open(&t.0, None).unwrap();
        assert!(logger.dir().ends_with("card1/device/hwmon/hwmon3"));
        let before = host_now_ns();
        let readings = logger.poll().unwrap();
        let after = host_now_ns();
        assert_eq!(readings.len(), 1);
        let r = readings[0];
        assert!((r.power_w - 123.456789).abs() < 1e-9);
        assert_eq!(r.instant_w, Some(250.0));
        assert_eq!(r.temperature_c, Some(48.5));
        let Stamp::HostNs(mid) = r.stamp else {
            panic!("not a host stamp: {:?}", r.stamp)
        };
        assert!(before <= mid && mid <= r.host_ns && r.host_ns <= after);
        assert!(logger
            .describe()
            .contains("power1_average, power1_input, temp1_input"));
    }

    #[test]
    fn a_card_with_only_power1_input() {
        let t = sysfs();
        let r = HwmonLogger::open(&t.0, Some(2)).unwrap().read().unwrap();
        assert_eq!((r.power_w, r.instant_w), (42.0, Some(42.0)));
        assert_eq!(r.temperature_c, None, "no temp1_input");
    }

    #[test]
    fn the_temperature_is_in_millidegrees_and_optional() {
        let t = sysfs();
        let temp = "sys/class/drm/card1/device/hwmon/hwmon3/temp1_input";
        let logger = HwmonLogger::open(&t.0, Some(1)).unwrap();
        t.write(temp, "-1250\n");
        assert_eq!(logger.read().unwrap().temperature_c, Some(-1.25));
        // A sensor the driver does not give (amdgpu answers some reads with an error)
        // leaves the power reading as it is.
        t.write(temp, "n/a\n");
        let r = logger.read().unwrap();
        assert_eq!((r.power_w, r.temperature_c), (123.456789, None));
        std::fs::remove_file(t.0.join(temp)).unwrap();
        let r = logger.read().unwrap();
        assert_eq!((r.instant_w, r.temperature_c), (Some(250.0), None));
    }

    #[test]
    fn every_poll_gives_a_reading_even_when_unchanged() {
        let t = sysfs();
        let mut logger = HwmonLogger::open(&t.0, Some(1)).unwrap();
        let readings = poll_every(&mut logger, MIN_PERIOD, Duration::from_millis(20)).unwrap();
        assert!(readings.len() >= 5, "{} readings", readings.len());
        assert!(readings.iter().all(|r| r.power_w == readings[0].power_w));
        assert!(readings.windows(2).all(|w| w[0].host_ns <= w[1].host_ns));
    }

    #[test]
    fn errors_name_the_path() {
        let t = sysfs();
        let e = HwmonLogger::open(&t.0, Some(0)).unwrap_err().to_string();
        assert!(
            e.contains("card0/device/hwmon/hwmon* named amdgpu: not found"),
            "{e}"
        );
        let e = HwmonLogger::open(&t.0, Some(7)).unwrap_err().to_string();
        assert!(e.ends_with("sys/class/drm/card7: not found"), "{e}");
        let empty = Tree::new("hwmon-empty");
        let e = HwmonLogger::open(&empty.0, None).unwrap_err().to_string();
        assert!(e.ends_with("sys/class/drm: not found"), "{e}");

        t.write(
            "sys/class/drm/card2/device/hwmon/hwmon4/power1_input",
            "n/a\n",
        );
        let e = HwmonLogger::open(&t.0, Some(2))
            .unwrap()
            .read()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("hwmon4/power1_input: not an integer: \"n/a\""),
            "{e}"
        );

        std::fs::remove_file(t.0.join("sys/class/drm/card2/device/hwmon/hwmon4/power1_input"))
            .unwrap();
        let e = HwmonLogger::open(&t.0, Some(2)).unwrap_err().to_string();
        assert!(
            e.contains("hwmon4/power1_average or power1_input: not found"),
            "{e}"
        );
    }

    #[test]
    fn permission_errors_name_the_path() {
        let denied = std::io::Error::from(ErrorKind::PermissionDenied);
        let e = io_error(Path::new("/sys/x/power1_input"), denied);
        assert_eq!(e.to_string(), "/sys/x/power1_input: permission denied");
    }

    #[test]
    fn a_file_that_vanishes_after_open() {
        let t = sysfs();
        let logger = HwmonLogger::open(&t.0, Some(1)).unwrap();
        std::fs::remove_file(t.0.join("sys/class/drm/card1/device/hwmon/hwmon3/power1_input"))
            .unwrap();
        let e = logger.read().unwrap_err();
        assert!(
            matches!(&e, GpuError::NotFound(p) if p.ends_with("hwmon3/power1_input")),
            "{e}"
        );
    }
}
