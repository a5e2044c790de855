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

/// A trigger output that drives nothing: trains nobody times by the rig (a preheat's, a
/// test's), each edge bracketed by the host clock all the same.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl TriggerOut for Quiet {
    fn describe(&self) -> String {
        "no trigger".into()
    }
    fn set(&mut self, high: bool) -> Result<Driven, TriggerError> {
        let now = crate::gpu::host_now_ns();
        Ok(Driven {
            high,
            host_before_ns: now,
            host_after_ns: now,
        })
    }
}
