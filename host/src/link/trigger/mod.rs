//! Trigger outputs: the host's marker to the rig's trigger input, driven just before a
//! launch. The host brackets each edge with its own clock, so the rig's timestamp of the
//! edge (device ticks) pairs with a host time.

pub mod gpio;
pub mod serial;

/// An edge the host drove, bracketed by host clock reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Driven {
    /// The level set.
    pub high: bool,
    /// Host time just before the line was set, ns since the Unix epoch.
    pub host_before_ns: i64,
    /// Host time just after the call returned, ns since the Unix epoch.
    pub host_after_ns: i64,
}

impl Driven {
    /// Sets a line to `high` with `set`, between two reads of the host clock `now` (ns
    /// since the Unix epoch).
    pub fn bracket<E>(
        high: bool,
        now: impl Fn() -> i64,
        set: impl FnOnce() -> Result<(), E>,
    ) -> Result<Driven, E> {
        let host_before_ns = now();
        let r = set();
        let host_after_ns = now();
        r.map(|()| Driven {
            high,
            host_before_ns,
            host_after_ns,
        })
    }

    /// The edge as a recording's `driven` row on `line`, timed at the bracket's middle
    /// on a timeline whose zero is `epoch_ns`.
    pub fn event(&self, line: u8, epoch_ns: i64) -> crate::store::recording::Event {
        let mid = self.host_before_ns + (self.host_after_ns - self.host_before_ns) / 2;
        crate::store::recording::Event::Driven {
            time_s: (mid - epoch_ns) as f64 * 1e-9,
            line,
            rising: self.high,
            host_before_ns: self.host_before_ns,
            host_after_ns: self.host_after_ns,
        }
    }
}

/// What went wrong driving a line.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    /// No such device.
    #[error("{0}: not found")]
    NotFound(String),
    /// Not allowed.
    #[error("{0}: permission denied")]
    Permission(String),
    /// The device cannot drive this line.
    #[error("{0}")]
    Unsupported(String),
    /// Any other failure.
    #[error("{0}")]
    Other(String),
}

/// A line the host can drive.
pub trait TriggerOut {
    /// The line, for people.
    fn describe(&self) -> String;
    /// Sets the line high or low.
    fn set(&mut self, high: bool) -> Result<Driven, TriggerError>;
}

/// The trigger output `spec` names: `serial:PATH:rts|dtr` (a serial port's modem line) or
/// `gpio:CHIP:LINE` (a GPIO character device's line), with `:active-low` after either.
///
/// # Errors
///
/// A spec of another form, or the device's own error opening it.
pub fn open(spec: &str) -> Result<Box<dyn TriggerOut + Send>, TriggerError> {
    let (spec, active_high) = match spec.strip_suffix(":active-low") {
        Some(s) => (s, false),
        None => (spec, true),
    };
    let bad = || {
        TriggerError::Unsupported(format!(
            "trigger output `{spec}`: want serial:PATH:rts|dtr or gpio:CHIP:LINE"
        ))
    };
    let (kind, rest) = spec.split_once(':').ok_or_else(bad)?;
    let (path, what) = rest.rsplit_once(':').ok_or_else(bad)?;
    let serial = |line| serial::SerialTrigger::open(path.as_ref(), line, active_high);
    Ok(match (kind, what) {
        ("serial", "rts") => Box::new(serial(serial::Line::Rts)?),
        ("serial", "dtr") => Box::new(serial(serial::Line::Dtr)?),
        ("gpio", line) => Box::new(gpio::GpioTrigger::open(
            path.as_ref(),
            line.parse().map_err(|_| bad())?,
            active_high,
        )?),
        _ => return Err(bad()),
    })
}

/// A trigger output that drives nothing: trains nobody times by the rig (a preheat's, a
/// test's), each edge bracketed by the host clock all the same.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl TriggerOut for Quiet {
    fn describe(&self) -> String {
        "no trigger".into()
    }
    fn set(&mut self, high: bool) -> Result<Driven, TriggerError> {
        let now = crate::store::recording::host_now_ns();
        Ok(Driven {
            high,
            host_before_ns: now,
            host_after_ns: now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trigger_spec_names_what_is_wrong() {
        let err = |spec: &str| open(spec).err().map(|e| e.to_string()).unwrap_or_default();
        for bad in [
            "usb:/dev/x:rts",
            "serial:/dev/ttyS0",
            "serial:/dev/ttyS0:cts",
            "gpio:/dev/gpiochip0:x",
            "",
        ] {
            assert!(
                err(bad).contains("want serial:PATH:rts|dtr or gpio:CHIP:LINE"),
                "{bad}: {}",
                err(bad)
            );
        }
        assert_eq!(
            err("serial:/no/such/port:rts:active-low"),
            "/no/such/port: not found"
        );
        assert!(matches!(
            open("gpio:/no/such/chip:3"),
            Err(TriggerError::NotFound(_))
        ));
    }
}
