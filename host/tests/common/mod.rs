//! What the host's integration tests share.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The real paired traces beside the repository (`../shared/data/gpu-power-benchmark`),
/// or None, saying SKIPPED, when they are not there.
pub fn data_root() -> Option<PathBuf> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/gpu-power-benchmark");
    if dir.is_dir() {
        Some(dir)
    } else {
        println!(
            "SKIPPED: {} is not here (the shared data folder sits beside the repository)",
            dir.display()
        );
        None
    }
}

/// The command line's binary run in `dir` with `args`, its output once it exits.
pub fn railtrace(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// A fresh directory under the system's temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `railtrace-<name>-<pid>-<ns>` under the temp dir.
    pub fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("railtrace-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// A path inside.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Float64 columns `names` of an Arrow IPC stream file, every batch's rows in order.
pub fn f64_columns(path: &Path, names: &[&str]) -> Vec<Vec<f64>> {
    let file = std::fs::File::open(path).unwrap();
    let mut out = vec![Vec::new(); names.len()];
    for b in arrow_ipc::reader::StreamReader::try_new(file, None).unwrap() {
        let b = b.unwrap();
        for (o, n) in out.iter_mut().zip(names) {
            let c = b.column_by_name(n).unwrap();
            let c = c
                .as_any()
                .downcast_ref::<arrow_array::Float64Array>()
                .unwrap();
            o.extend(c.values().iter().copied());
        }
    }
    out
}

/// The twin of the default scenario with these `[faults]` (e.g. `disconnect_after_s = 1.0`).
pub fn twin_with_faults(faults: &str) -> railtrace_twin::Twin {
    let text = railtrace_twin::scenario::DEFAULT_SCENARIO
        .replace("[faults]\n", &format!("[faults]\n{faults}\n"));
    let loaded = railtrace_twin::scenario::parse("faults.toml", &text, |_| {
        Ok(("rig".into(), railtrace_twin::scenario::DEFAULT_RIG.into()))
    })
    .expect("a valid scenario");
    railtrace_twin::Twin::start(&loaded).unwrap()
}
