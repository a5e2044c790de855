//! Talking to a rig over a serial port (a USB-serial device, or the twin's
//! pseudo-terminal): opening it with clear errors, commands matched to their results by
//! request id, and the frames that arrive in between.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use railtrace_protocol::{
    CommandResult, DecodeStats, Decoder, FrameEncoder, FrameError, Message, ResultCode, SeqEvent,
    SeqTracker, MAX_WIRE_FRAME, PROTOCOL_VERSION,
};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_serial::{SerialPortBuilderExt, SerialStream};

/// Why talking to a rig failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// No such port.
    #[error("{0}: no such serial port")]
    NotFound(PathBuf),
    /// Another program has the port open.
    #[error("{0}: the port is busy (another program has it open)")]
    Busy(PathBuf),
    /// The path is not a serial port.
    #[error("{0}: not a serial port")]
    NotSerial(PathBuf),
    /// Not allowed to open it.
    #[error("{0}: permission denied (is the user in the dialout group?)")]
    Permission(PathBuf),
    /// Another failure of the port.
    #[error("{path}: {error}")]
    Port {
        /// The port.
        path: PathBuf,
        /// What happened.
        error: String,
    },
    /// Nothing answered a command in time.
    #[error("{path}: no answer to {command} within {timeout:?} (is this a railtrace rig?)")]
    Timeout {
        /// The port.
        path: PathBuf,
        /// The command.
        command: &'static str,
        /// How long we waited.
        timeout: Duration,
    },
    /// The device speaks another protocol version.
    #[error("{path}: the device speaks protocol version {found}; this railtrace speaks version {supported}")]
    Version {
        /// The port.
        path: PathBuf,
        /// The device's version.
        found: u8,
        /// Ours.
        supported: u8,
    },
    /// The device refused a command.
    #[error("{path}: the device refused {command}: {code:?}")]
    Refused {
        /// The port.
        path: PathBuf,
        /// The command.
        command: &'static str,
        /// Its answer.
        code: ResultCode,
    },
    /// The port closed (device unplugged or reset).
    #[error("{0}: the device went away")]
    Closed(PathBuf),
}

/// One channel of a rig, as its DeviceInfo describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Channel {
    /// Channel number 0-7.
    pub index: u8,
    /// `V`, `A` or `?`.
    pub unit: &'static str,
    /// Name, e.g. `cable1_12v_I`.
    pub name: String,
    /// Units per code.
    pub scale: f32,
    /// Units at code 0.
    pub offset: f32,
}

/// A rig's DeviceInfo, owned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Info {
    /// Firmware version.
    pub firmware: String,
    /// Protocol version.
    pub protocol_version: u8,
    /// Board name.
    pub board: String,
    /// Serial number.
    pub serial: String,
    /// Device clock rate, Hz.
    pub tick_hz: u32,
    /// ADC resolution, bits.
    pub adc_bits: u8,
    /// Samples come from a built-in test signal.
    pub test_signal: bool,
    /// Calibration read from storage.
    pub calibration_stored: bool,
    /// Trigger inputs.
    pub trigger_inputs: u8,
    /// Trigger outputs.
    pub trigger_outputs: u8,
    /// Accepted sample rates, Hz.
    pub sample_rates_hz: Vec<u32>,
    /// Channels.
    pub channels: Vec<Channel>,
}

impl Info {
    /// From the message.
    pub fn from(i: &railtrace_protocol::DeviceInfo<'_>) -> Info {
        let (a, b, c) = i.firmware_version;
        Info {
            firmware: format!("{a}.{b}.{c}"),
            protocol_version: i.protocol_version,
            board: i.board.to_string(),
            serial: i.serial.to_string(),
            tick_hz: i.tick_hz,
            adc_bits: i.adc_bits,
            test_signal: i.flags & railtrace_protocol::FLAG_TEST_SIGNAL != 0,
            calibration_stored: i.flags & railtrace_protocol::FLAG_CALIBRATION_STORED != 0,
            trigger_inputs: i.trigger_inputs,
            trigger_outputs: i.trigger_outputs,
            sample_rates_hz: i.sample_rates_hz.to_vec(),
            channels: i
                .channels
                .iter()
                .map(|c| Channel {
                    index: c.index,
                    unit: c.quantity.unit(),
                    name: c.name.to_string(),
                    scale: c.scale,
                    offset: c.offset,
                })
                .collect(),
        }
    }
}

/// A rig on a serial port.
#[derive(Debug)]
pub struct Rig {
    path: PathBuf,
    port: SerialStream,
    decoder: Decoder,
    encoder: FrameEncoder,
    /// The device's sequence numbers: lost and duplicated frames.
    pub seq: SeqTracker,
    next_id: u16,
    buf: Vec<u8>,
    results: VecDeque<CommandResult>,
    info: Option<Info>,
}

fn open_error(path: &Path, e: &tokio_serial::Error) -> TransportError {
    use std::io::IsTerminal;
    use tokio_serial::ErrorKind as K;
    let p = path.to_path_buf();
    match e.kind {
        // serialport reports the EBUSY of its exclusive (TIOCEXCL) open as NoDevice.
        K::NoDevice => TransportError::Busy(p),
        K::Io(std::io::ErrorKind::NotFound) => TransportError::NotFound(p),
        K::Io(std::io::ErrorKind::PermissionDenied) => TransportError::Permission(p),
        _ if std::fs::File::open(path).is_ok_and(|f| !f.is_terminal()) => {
            TransportError::NotSerial(p)
        }
        _ => TransportError::Port {
            path: p,
            error: e.to_string(),
        },
    }
}

impl Rig {
    /// Opens `path` (exclusively) at the link's 921600 baud (ignored by USB CDC and
    /// pseudo-terminals).
    pub fn open(path: &Path) -> Result<Rig, TransportError> {
        use std::os::unix::fs::FileTypeExt;
        let Ok(meta) = std::fs::metadata(path) else {
            return Err(TransportError::NotFound(path.to_path_buf()));
        };
        // A serial port is a character device; opening anything else could wait for ever
        // (a pipe with no writer) or read a file as a device.
        if !meta.file_type().is_char_device() {
            return Err(TransportError::NotSerial(path.to_path_buf()));
        }
        let port = tokio_serial::new(path.to_string_lossy(), 921_600)
            .open_native_async()
            .map_err(|e| open_error(path, &e))?;
        Ok(Rig {
            path: path.to_path_buf(),
            port,
            decoder: Decoder::new(),
            encoder: FrameEncoder::new(),
            seq: SeqTracker::new(),
            next_id: 1,
            buf: vec![0; 16 * 1024],
            results: VecDeque::new(),
            info: None,
        })
    }

    /// The port.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the decoder accepted and rejected.
    pub fn stats(&self) -> DecodeStats {
        self.decoder.stats()
    }

    /// Sends a command; returns its request id.
    pub async fn send(
        &mut self,
        make: impl FnOnce(u16) -> Message<'static>,
    ) -> Result<u16, TransportError> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let mut out = [0u8; MAX_WIRE_FRAME];
        let n = self
            .encoder
            .encode(&make(id), &mut out)
            .map_err(|e| TransportError::Port {
                path: self.path.clone(),
                error: e.to_string(),
            })?;
        let io = |e: std::io::Error| TransportError::Port {
            path: self.path.clone(),
            error: e.to_string(),
        };
        self.port.write_all(&out[..n]).await.map_err(io)?;
        self.port.flush().await.map_err(io)?;
        Ok(id)
    }

    /// Reads once (waiting at most `timeout`) and hands every decoded message to `on`.
    /// Returns false on timeout.
    pub async fn pump(
        &mut self,
        timeout: Duration,
        mut on: impl FnMut(&Message<'_>),
    ) -> Result<bool, TransportError> {
        self.pump_counted(timeout, |m, _| on(m)).await
    }

    /// As [`Rig::pump`], handing `on` also the frames lost so far (this connection) as of
    /// each message.
    pub async fn pump_counted(
        &mut self,
        timeout: Duration,
        mut on: impl FnMut(&Message<'_>, u64),
    ) -> Result<bool, TransportError> {
        let n = match tokio::time::timeout(timeout, self.port.read(&mut self.buf)).await {
            Err(_) => return Ok(false),
            Ok(Ok(0)) => return Err(TransportError::Closed(self.path.clone())),
            Ok(Ok(n)) => n,
            Ok(Err(e)) if e.raw_os_error() == Some(5) => {
                return Err(TransportError::Closed(self.path.clone())); // EIO: hung up
            }
            Ok(Err(e)) => {
                return Err(TransportError::Port {
                    path: self.path.clone(),
                    error: e.to_string(),
                })
            }
        };
        let mut input = &self.buf[..n];
        while let Some(r) = self.decoder.next(&mut input) {
            match r {
                Ok(frame) => {
                    if self.seq.observe(frame.seq) == SeqEvent::Duplicate {
                        continue; // a repeated frame: the first copy counted
                    }
                    if let Message::CommandResult(c) = frame.message {
                        self.results.push_back(c);
                    }
                    if let Message::DeviceInfo(i) = &frame.message {
                        self.info = Some(Info::from(i));
                    }
                    on(&frame.message, self.seq.lost);
                }
                Err(FrameError::UnsupportedVersion {
                    found, supported, ..
                }) => {
                    return Err(TransportError::Version {
                        path: self.path.clone(),
                        found,
                        supported,
                    })
                }
                Err(_) => {} // counted in the decoder's stats
            }
        }
        Ok(true)
    }

    /// Sends a command and waits for its result, handing everything that arrives in
    /// between to `on`. An error result is an error.
    pub async fn command(
        &mut self,
        name: &'static str,
        make: impl FnOnce(u16) -> Message<'static>,
        timeout: Duration,
        mut on: impl FnMut(&Message<'_>),
    ) -> Result<(), TransportError> {
        let id = self.send(make).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let pos = self.results.iter().position(|r| r.request_id == id);
            if let Some(r) = pos.and_then(|pos| self.results.remove(pos)) {
                return match r.code {
                    ResultCode::Ok => Ok(()),
                    code => Err(TransportError::Refused {
                        path: self.path.clone(),
                        command: name,
                        code,
                    }),
                };
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.pump(left, &mut on).await? {
                return Err(TransportError::Timeout {
                    path: self.path.clone(),
                    command: name,
                    timeout,
                });
            }
        }
    }

    /// Takes the command results that arrived and that no [`Rig::command`] has taken: a
    /// caller that sends commands with [`Rig::send`] and goes on pumping finds their
    /// answers here (what it drops is gone, so the results do not pile up).
    pub fn take_results(&mut self) -> VecDeque<CommandResult> {
        std::mem::take(&mut self.results)
    }

    /// Asks for the device's DeviceInfo.
    pub async fn info(&mut self, timeout: Duration) -> Result<Info, TransportError> {
        self.info = None;
        self.command(
            "GetInfo",
            |id| Message::GetInfo { request_id: id },
            timeout,
            |_| {},
        )
        .await?;
        let info = self.info.clone().ok_or_else(|| TransportError::Port {
            path: self.path.clone(),
            error: "GetInfo answered without a DeviceInfo".into(),
        })?;
        if info.protocol_version != PROTOCOL_VERSION {
            return Err(TransportError::Version {
                path: self.path.clone(),
                found: info.protocol_version,
                supported: PROTOCOL_VERSION,
            });
        }
        Ok(info)
    }
}
