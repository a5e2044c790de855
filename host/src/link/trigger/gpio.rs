//! A Linux GPIO character-device line (`/dev/gpiochipN` and a line offset) as the trigger
//! output, through the kernel's GPIO uAPI v2 (the pure-Rust `gpiocdev` crate: no libgpiod).
//!
//! `set(true)` makes the trigger active; with `active_high` false the line is requested
//! active-low, so the kernel drives the pin low for active.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};

use gpiocdev::line::Value;
use gpiocdev::{Chip, Request};

use super::{Driven, TriggerError, TriggerOut};
use crate::store::recording::host_now_ns;

/// The consumer label the line is requested under (shown by `gpioinfo`).
pub const CONSUMER: &str = "railtrace";

/// A GPIO line held as an output, driven as a trigger.
#[derive(Debug)]
pub struct GpioTrigger {
    chip: PathBuf,
    line: u32,
    active_high: bool,
    request: Request,
}

/// Maps a failure on `chip` to a clear one-line error naming it.
fn chip_error(chip: &Path, e: gpiocdev::Error) -> TriggerError {
    let p = chip.display();
    match e {
        gpiocdev::Error::GpioChip(..) => TriggerError::Unsupported(format!("{p}: not a GPIO chip")),
        gpiocdev::Error::Os(ref errno) => match std::io::Error::from_raw_os_error(errno.0).kind() {
            std::io::ErrorKind::NotFound => TriggerError::NotFound(p.to_string()),
            std::io::ErrorKind::PermissionDenied => {
                TriggerError::Permission(format!("{p} (is the user in the gpio group?)"))
            }
            _ => TriggerError::Other(format!("{p}: {e}")),
        },
        e => TriggerError::Other(format!("{p}: {e}")),
    }
}

impl GpioTrigger {
    /// Requests `line` of `chip` as an output, inactive, under the consumer label
    /// [`CONSUMER`].
    ///
    /// `active_high`: the trigger is active when the pin is high.
    pub fn open(chip: &Path, line: u32, active_high: bool) -> Result<GpioTrigger, TriggerError> {
        let p = chip.display();
        let c = Chip::from_path(chip).map_err(|e| chip_error(chip, e))?;
        let lines = c.info().map_err(|e| chip_error(chip, e))?.num_lines;
        if line >= lines {
            return Err(TriggerError::NotFound(format!(
                "{p} line {line} (the chip has lines 0 to {})",
                lines.saturating_sub(1)
            )));
        }
        let info = c.line_info(line).map_err(|e| chip_error(chip, e))?;
        if info.used {
            let by = match info.consumer.as_str() {
                "" => "the kernel".to_string(),
                c => format!("{c:?}"),
            };
            return Err(TriggerError::Other(format!(
                "{p} line {line}: in use by {by}"
            )));
        }
        let mut b = Request::builder();
        b.on_chip(chip)
            .with_consumer(CONSUMER)
            .with_line(line)
            .as_output(Value::Inactive);
        if !active_high {
            b.as_active_low();
        }
        let request = b.request().map_err(|e| match chip_error(chip, e) {
            TriggerError::Other(m) => TriggerError::Other(format!("{m} (line {line})")),
            e => e,
        })?;
        Ok(GpioTrigger {
            chip: chip.to_path_buf(),
            line,
            active_high,
            request,
        })
    }
}

impl TriggerOut for GpioTrigger {
    fn describe(&self) -> String {
        let polarity = if self.active_high {
            "active-high"
        } else {
            "active-low"
        };
        format!("{} line {} ({polarity})", self.chip.display(), self.line)
    }

    fn set(&mut self, high: bool) -> Result<Driven, TriggerError> {
        Driven::bracket(high, host_now_ns, || {
            self.request.set_lone_value(Value::from(high)).map(|_| ())
        })
        .map_err(|e| {
            TriggerError::Other(format!(
                "{} line {}: setting it failed: {e}",
                self.chip.display(),
                self.line
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_chip_is_not_found_and_named() {
        let e = GpioTrigger::open(Path::new("/dev/gpiochip-nope"), 3, true).unwrap_err();
        assert!(matches!(e, TriggerError::NotFound(_)), "{e:?}");
        assert_eq!(e.to_string(), "/dev/gpiochip-nope: not found");
    }

    #[test]
    fn dev_null_is_not_a_gpio_chip() {
        let e = GpioTrigger::open(Path::new("/dev/null"), 0, true).unwrap_err();
        assert!(matches!(e, TriggerError::Unsupported(_)), "{e:?}");
        assert_eq!(e.to_string(), "/dev/null: not a GPIO chip");
    }

    #[test]
    fn a_plain_file_is_not_a_gpio_chip() {
        let e = GpioTrigger::open(Path::new("Cargo.toml"), 0, false).unwrap_err();
        assert_eq!(e.to_string(), "Cargo.toml: not a GPIO chip");
    }

    /// On a real chip: `RAILTRACE_GPIO_CHIP=/dev/gpiochip0 RAILTRACE_GPIO_LINE=17 cargo test
    /// -p railtrace --features hardware-tests gpio -- --nocapture` (the line must be free
    /// and safe to drive).
    #[cfg(feature = "hardware-tests")]
    #[test]
    fn drives_a_real_line() {
        let chip =
            PathBuf::from(std::env::var("RAILTRACE_GPIO_CHIP").expect("RAILTRACE_GPIO_CHIP"));
        let line: u32 = std::env::var("RAILTRACE_GPIO_LINE")
            .expect("RAILTRACE_GPIO_LINE")
            .parse()
            .expect("RAILTRACE_GPIO_LINE: a line offset");
        let mut t = GpioTrigger::open(&chip, line, true).unwrap();
        let info = Chip::from_path(&chip).unwrap().line_info(line).unwrap();
        assert!(info.used);
        assert_eq!(info.consumer, CONSUMER);
        // A second request for the line is refused, naming its holder.
        let e = GpioTrigger::open(&chip, line, true).unwrap_err();
        assert!(e.to_string().ends_with("in use by \"railtrace\""), "{e}");
        let mut w = Vec::new();
        for i in 0..1000 {
            let d = t.set(i % 2 == 0).unwrap();
            assert_eq!(d.high, i % 2 == 0);
            assert_eq!(t.request.lone_value().unwrap(), Value::from(d.high));
            w.push(d.host_after_ns - d.host_before_ns);
        }
        w.sort_unstable();
        println!(
            "{}: bracket over 1000 toggles, ns: min {} median {} p99 {} max {}",
            t.describe(),
            w[0],
            w[500],
            w[989],
            w[999]
        );
    }
}
