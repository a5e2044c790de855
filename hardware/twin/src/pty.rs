//! A real pseudo-terminal: the twin holds the master side, a host opens the slave side
//! (`/dev/pts/N`) with tokio-serial, pyserial or a terminal program, exactly as it would a
//! USB-serial device. The slave is put in raw mode (no echo, no line editing, no CR/LF
//! translation), and the twin keeps a handle on it so those settings survive a host
//! closing and reopening the port.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};

/// Why the pseudo-terminal could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    /// The system refused a pseudo-terminal or its settings.
    #[error("cannot set up a pseudo-terminal")]
    Sys(#[from] nix::Error),
}

/// The master side of a pseudo-terminal, non-blocking, as the device's serial link.
#[derive(Debug)]
pub struct Pty {
    master: File,
    _slave: OwnedFd,
    path: PathBuf,
}

impl Pty {
    /// Opens a new pseudo-terminal pair in raw mode.
    pub fn open() -> Result<Pty, PtyError> {
        let pair = nix::pty::openpty(None, None)?;
        let mut t = tcgetattr(pair.slave.as_fd())?;
        cfmakeraw(&mut t);
        tcsetattr(pair.slave.as_fd(), SetArg::TCSANOW, &t)?;
        let flags = OFlag::from_bits_truncate(fcntl(pair.master.as_fd(), FcntlArg::F_GETFL)?);
        fcntl(
            pair.master.as_fd(),
            FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK),
        )?;
        let path = nix::unistd::ttyname(pair.slave.as_fd())?;
        Ok(Pty {
            master: File::from(pair.master),
            _slave: pair.slave,
            path,
        })
    }

    /// The slave's path, for the host to open.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    fn ready(&self, events: PollFlags) -> io::Result<bool> {
        let mut fds = [PollFd::new(self.master.as_fd(), events)];
        let n = poll(&mut fds, PollTimeout::ZERO).map_err(io::Error::from)?;
        Ok(n > 0
            && fds[0]
                .revents()
                .is_some_and(|r| r.intersects(events | PollFlags::POLLERR)))
    }
}

impl embedded_io::ErrorType for Pty {
    type Error = io::Error;
}

impl embedded_io::Read for Pty {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.master.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            // EIO: no host has the slave open right now (or it just closed it).
            Err(e) if e.raw_os_error() == Some(nix::libc::EIO) => Ok(0),
            other => other,
        }
    }
}

impl embedded_io::ReadReady for Pty {
    fn read_ready(&mut self) -> io::Result<bool> {
        self.ready(PollFlags::POLLIN)
    }
}

impl embedded_io::Write for Pty {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match self.master.write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Full: wait for room (the caller asked write_ready first, so this is
                    // rare and short).
                    let mut fds = [PollFd::new(self.master.as_fd(), PollFlags::POLLOUT)];
                    poll(&mut fds, PollTimeout::from(10u8)).map_err(io::Error::from)?;
                }
                other => return other,
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl embedded_io::WriteReady for Pty {
    fn write_ready(&mut self) -> io::Result<bool> {
        self.ready(PollFlags::POLLOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedded_io::{Read as _, ReadReady as _, Write as _};

    #[test]
    fn bytes_cross_the_pty_unchanged_in_both_directions() {
        let mut pty = Pty::open().unwrap();
        let mut host = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(pty.path())
            .unwrap();
        // Every byte value, including those a cooked terminal would eat or translate.
        let all: Vec<u8> = (0..=255u8).collect();
        pty.write_all(&all).unwrap();
        let mut got = vec![0u8; 256];
        host.read_exact(&mut got).unwrap();
        assert_eq!(got, all);
        host.write_all(&all).unwrap();
        let mut back = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while back.len() < 256 && std::time::Instant::now() < deadline {
            if pty.read_ready().unwrap() {
                let mut buf = [0u8; 64];
                let n = pty.read(&mut buf).unwrap();
                back.extend_from_slice(&buf[..n]);
            }
        }
        assert_eq!(back, all);
    }
}
