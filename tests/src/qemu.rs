//! The STM32F405 image under `qemu-system-arm -M netduinoplus2`, its USART1 on a
//! pseudo-terminal.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The board's own workspace.
pub fn board_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../firmware/boards/stm32f405")
}

/// True when `qemu-system-arm` can be run.
pub fn available() -> bool {
    Command::new("qemu-system-arm")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Builds the image for QEMU (release, feature `qemu`) and returns the ELF. It builds
/// into `$RAILTRACE_BOARD_TARGET_DIR` where that is set (CI keeps it between runs), else
/// into the board workspace's own `target/`.
pub fn build_image() -> std::io::Result<PathBuf> {
    let dir = board_dir();
    let target = std::env::var_os("RAILTRACE_BOARD_TARGET_DIR")
        .map_or_else(|| dir.join("target"), PathBuf::from);
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--locked", "--features", "qemu"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "building the image failed: {status}"
        )));
    }
    Ok(target.join("thumbv7em-none-eabihf/release/railtrace-stm32f405"))
}

/// A running emulator; killed on drop.
#[derive(Debug)]
pub struct Qemu {
    child: Child,
    /// The pseudo-terminal that is the board's USART1.
    pub pty: PathBuf,
    monitor: PathBuf,
    _dir: TempDir,
}

#[derive(Debug)]
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Qemu {
    /// Starts `elf` paused (QEMU drops what the guest writes to a pty nobody has open):
    /// open [`Qemu::pty`], then call [`Qemu::resume`].
    pub fn start(elf: &Path) -> std::io::Result<Qemu> {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("railtrace-qemu-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let dir = TempDir(dir);
        let monitor = dir.0.join("monitor.sock");
        let mut child = Command::new("qemu-system-arm")
            .args([
                "-M",
                "netduinoplus2",
                "-display",
                "none",
                "-serial",
                "pty",
                "-S",
            ])
            .args(["-icount", "shift=3,sleep=off"])
            .arg("-monitor")
            .arg(format!("unix:{},server=on,wait=off", monitor.display()))
            .arg("-kernel")
            .arg(elf)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let pty = loop {
            let Some(line) = lines.next() else {
                let _ = child.kill();
                return Err(std::io::Error::other("QEMU exited before naming its pty"));
            };
            let line = line?;
            if let Some(rest) = line.strip_prefix("char device redirected to ") {
                if let Some(path) = rest.split_whitespace().next() {
                    break PathBuf::from(path);
                }
            }
        };
        // Keep draining stdout so QEMU never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Ok(Qemu {
            child,
            pty,
            monitor,
            _dir: dir,
        })
    }

    /// Lets the paused VM run, once the pty is open (QEMU notices an opener within a
    /// second).
    pub fn resume(&self) -> std::io::Result<()> {
        std::thread::sleep(Duration::from_millis(1200));
        let mut s = UnixStream::connect(&self.monitor)?;
        s.write_all(b"cont\n")?;
        std::thread::sleep(Duration::from_millis(100));
        Ok(())
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
