//! A USB-UART's RTS or DTR modem-control line as the trigger output.
//!
//! Polarity: as for every trigger output, `set(true)` makes the trigger active and
//! `active_high` says whether active is a high level on the pin. Asserting RTS or DTR
//! drives the pin low on TTL USB-UARTs (FTDI, CP210x, CH340: pins labelled `RTS#`,
//! `DTR#`), and that is what this mapping assumes: with `active_high`, `set(true)` releases
//! the line (pin high); without, it asserts it (pin low). An RS-232 level port (asserted
//! is the positive voltage) is the other way round: pass the opposite `active_high`.
//!
//! Linux asserts both lines when a port is opened, so [`SerialTrigger::open`] makes the
//! trigger inactive straight away. A pseudo-terminal has no modem-control lines (Linux
//! answers their ioctls, TIOCMBIS/TIOCMBIC/TIOCMSET/TIOCMGET, with ENOTTY on either side),
//! so `open` refuses one.

use std::fmt;
use std::path::{Path, PathBuf};

use serialport::SerialPort;

use super::{Driven, TriggerError, TriggerOut};
use crate::store::recording::host_now_ns;

/// Which modem-control line drives the trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// Request To Send.
    Rts,
    /// Data Terminal Ready.
    Dtr,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Line::Rts => "RTS",
            Line::Dtr => "DTR",
        })
    }
}

/// A serial port's RTS or DTR line, driven as a trigger output.
pub struct SerialTrigger {
    path: PathBuf,
    port: Box<dyn SerialPort>,
    line: Line,
    active_high: bool,
}

impl fmt::Debug for SerialTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SerialTrigger")
            .field("path", &self.path)
            .field("line", &self.line)
            .field("active_high", &self.active_high)
            .finish_non_exhaustive()
    }
}

/// Maps a failure to open `path` as a serial port to a clear error naming it (the same
/// reading of serialport's errors as the rig's transport).
pub(crate) fn open_error(path: &Path, e: &serialport::Error) -> TriggerError {
    use serialport::ErrorKind as K;
    use std::io::IsTerminal;
    let p = path.display();
    match e.kind {
        // serialport reports the EBUSY of its exclusive (TIOCEXCL) open as NoDevice.
        K::NoDevice => TriggerError::Other(format!(
            "{p}: the port is busy (another program has it open)"
        )),
        K::Io(std::io::ErrorKind::NotFound) => TriggerError::NotFound(p.to_string()),
        K::Io(std::io::ErrorKind::PermissionDenied) => {
            TriggerError::Permission(format!("{p} (is the user in the dialout group?)"))
        }
        _ if std::fs::File::open(path).is_ok_and(|f| !f.is_terminal()) => {
            TriggerError::Unsupported(format!("{p}: not a serial port"))
        }
        _ => TriggerError::Other(format!("{p}: {e}")),
    }
}

impl SerialTrigger {
    /// Opens `path` (exclusively) and makes the trigger on `line` inactive.
    ///
    /// `active_high`: the trigger is active when the pin is high (see the module's note on
    /// polarity).
    pub fn open(path: &Path, line: Line, active_high: bool) -> Result<SerialTrigger, TriggerError> {
        if !path.exists() {
            return Err(TriggerError::NotFound(path.display().to_string()));
        }
        // The baud rate is irrelevant, but 0 would mean "hang up" (drop DTR).
        let port = serialport::new(path.to_string_lossy(), 115_200)
            .open()
            .map_err(|e| open_error(path, &e))?;
        let mut t = SerialTrigger {
            path: path.to_path_buf(),
            port,
            line,
            active_high,
        };
        t.drive(false).map_err(|e| {
            let p = path.display();
            let pty = std::fs::canonicalize(path).is_ok_and(|c| c.starts_with("/dev/pts"));
            TriggerError::Unsupported(if pty {
                format!("{p}: a pseudo-terminal has no {line} line to drive")
            } else {
                format!("{p}: cannot drive {line}: {e}")
            })
        })?;
        Ok(t)
    }

    /// Makes the trigger active (`high`) or inactive: on a TTL USB-UART, an asserted line
    /// is a low pin.
    fn drive(&mut self, high: bool) -> serialport::Result<()> {
        let asserted = asserted(high, self.active_high);
        match self.line {
            Line::Rts => self.port.write_request_to_send(asserted),
            Line::Dtr => self.port.write_data_terminal_ready(asserted),
        }
    }
}

/// Whether the modem-control line is asserted for the trigger level `high`, assuming a TTL
/// UART (asserted is a low pin).
fn asserted(high: bool, active_high: bool) -> bool {
    high != active_high
}

impl TriggerOut for SerialTrigger {
    fn describe(&self) -> String {
        let polarity = if self.active_high {
            "active-high"
        } else {
            "active-low"
        };
        format!("{} {} ({polarity})", self.path.display(), self.line)
    }

    fn set(&mut self, high: bool) -> Result<Driven, TriggerError> {
        Driven::bracket(high, host_now_ns, || self.drive(high)).map_err(|e| {
            TriggerError::Other(format!(
                "{}: setting {} failed: {e}",
                self.path.display(),
                self.line
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railtrace_twin::pty::Pty;

    #[test]
    fn a_missing_port_is_not_found_and_named() {
        let e = SerialTrigger::open(Path::new("/dev/ttyUSB-nope"), Line::Rts, false).unwrap_err();
        assert!(matches!(e, TriggerError::NotFound(_)), "{e:?}");
        assert_eq!(e.to_string(), "/dev/ttyUSB-nope: not found");
    }

    #[test]
    fn dev_null_is_not_a_serial_port() {
        let e = SerialTrigger::open(Path::new("/dev/null"), Line::Dtr, true).unwrap_err();
        assert!(matches!(e, TriggerError::Unsupported(_)), "{e:?}");
        assert_eq!(e.to_string(), "/dev/null: not a serial port");
    }

    #[test]
    fn a_pty_has_no_modem_lines_so_open_refuses_it() {
        let pty = Pty::open().unwrap();
        for line in [Line::Rts, Line::Dtr] {
            let e = SerialTrigger::open(pty.path(), line, false).unwrap_err();
            assert!(matches!(e, TriggerError::Unsupported(_)), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!(
                    "{}: a pseudo-terminal has no {line} line to drive",
                    pty.path().display()
                )
            );
        }
    }

    #[test]
    fn an_active_high_trigger_releases_the_line_to_raise_the_pin() {
        assert!(!asserted(true, true));
        assert!(asserted(false, true));
        assert!(asserted(true, false));
        assert!(!asserted(false, false));
    }

    #[test]
    fn set_on_a_port_without_modem_lines_names_the_port_and_line() {
        // Built without the probe, so the pty's refusal shows up in set: the error names
        // the port and line, and the (failed) edge's bracket is still timed.
        let pty = Pty::open().unwrap();
        let port = serialport::new(pty.path().to_string_lossy(), 115_200)
            .open()
            .unwrap();
        let mut t = SerialTrigger {
            path: pty.path().to_path_buf(),
            port,
            line: Line::Dtr,
            active_high: true,
        };
        assert_eq!(
            t.describe(),
            format!("{} DTR (active-high)", pty.path().display())
        );
        let e = t.set(true).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("{}: setting DTR failed", pty.path().display())),
            "{e}"
        );
    }

    /// The bracket a set costs on a pty (the ioctl fails there with ENOTTY, so this is the
    /// syscall path without a driver): `cargo test -p railtrace bracket -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn bracket_width_on_a_pty() {
        let pty = Pty::open().unwrap();
        let mut port = serialport::new(pty.path().to_string_lossy(), 115_200)
            .open()
            .unwrap();
        let mut w: Vec<i64> = (0..1000)
            .map(|i| {
                let before = host_now_ns();
                let _ = port.write_request_to_send(i % 2 == 0);
                host_now_ns() - before
            })
            .collect();
        w.sort_unstable();
        println!(
            "bracket over 1000 toggles, ns: min {} median {} p99 {} max {}",
            w[0], w[500], w[989], w[999]
        );
    }
}
