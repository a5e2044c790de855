//! Ctrl-C (SIGINT), SIGTERM and SIGHUP ask a long run to end: a capture stops its device
//! and closes its recording, a profile or a DVFS run stops after the train or switch in
//! hand and closes both of its recordings. Nothing is killed half-written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();

/// Catches SIGINT, SIGTERM and SIGHUP for this process (once; later calls return the same
/// flag), returning the flag they set.
pub fn install() -> Result<&'static AtomicBool, String> {
    INSTALLED
        .get_or_init(|| {
            ctrlc::set_handler(|| REQUESTED.store(true, Ordering::Relaxed))
                .map_err(|e| format!("cannot catch Ctrl-C, SIGTERM and SIGHUP: {e}"))
        })
        .clone()?;
    Ok(&REQUESTED)
}

/// Whether an end was asked for (never, unless [`install`] was called).
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}
