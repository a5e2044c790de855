//! What the end-to-end tests share: a minimal host-side client of the railtrace protocol
//! over any async byte stream (a tokio-serial port on a pseudo-terminal), and helpers to
//! start the emulated board. The full host transport comes with the capture issue.

pub mod qemu;

use std::time::Duration;

use railtrace_protocol::{
    CommandResult, Decoder, DeviceInfo, FrameEncoder, Message, SampleBlock, SeqTracker, Status,
    TimeSyncReply, TriggerEdge, MAX_WIRE_FRAME,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A received message, copied out of the decoder's buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum Rx {
    /// DeviceInfo.
    Info {
        /// `FLAG_*` bits.
        flags: u8,
        /// Device clock rate.
        tick_hz: u32,
        /// Accepted rates.
        rates: Vec<u32>,
        /// Board name.
        board: String,
        /// Each channel's index, scale and offset.
        channels: Vec<(u8, f32, f32)>,
    },
    /// A sample block, codes as `[sample][enabled channel]`.
    Block {
        /// First sample index.
        first_index: u64,
        /// First sample tick.
        first_tick: u64,
        /// Ticks between samples.
        period_ticks: u32,
        /// Enabled channels.
        mask: u8,
        /// Conversions averaged into each sample.
        averaging: u16,
        /// Codes.
        codes: Vec<Vec<i16>>,
    },
    /// TriggerEdge.
    Edge(TriggerEdge),
    /// Status.
    Status(Status),
    /// TimeSyncReply.
    Sync(TimeSyncReply),
    /// CommandResult.
    Result(CommandResult),
    /// Log text.
    Log(String),
}

impl Rx {
    /// Copies a device message; `None` for a host command.
    pub fn from_message(m: &Message<'_>) -> Option<Rx> {
        Some(match m {
            Message::DeviceInfo(i) => info(i),
            Message::SampleBlock(b) => block(b),
            Message::TriggerEdge(e) => Rx::Edge(*e),
            Message::Status(s) => Rx::Status(*s),
            Message::TimeSyncReply(t) => Rx::Sync(*t),
            Message::CommandResult(c) => Rx::Result(*c),
            Message::Log(l) => Rx::Log(l.text.to_string()),
            _ => return None,
        })
    }
}

fn info(i: &DeviceInfo<'_>) -> Rx {
    Rx::Info {
        flags: i.flags,
        tick_hz: i.tick_hz,
        rates: i.sample_rates_hz.to_vec(),
        board: i.board.to_string(),
        channels: i
            .channels
            .iter()
            .map(|c| (c.index, c.scale, c.offset))
            .collect(),
    }
}

fn block(b: &SampleBlock<'_>) -> Rx {
    Rx::Block {
        first_index: b.first_index,
        first_tick: b.first_tick,
        period_ticks: b.period_ticks,
        mask: b.channel_mask,
        averaging: b.averaging,
        codes: (0..usize::from(b.sample_count))
            .map(|s| {
                (0..b.channel_count())
                    .filter_map(|c| b.code(s, c))
                    .collect()
            })
            .collect(),
    }
}

/// A protocol client over an async byte stream.
#[derive(Debug)]
pub struct Client<S> {
    stream: S,
    decoder: Decoder,
    encoder: FrameEncoder,
    /// Sequence numbers of the device's frames.
    pub seq: SeqTracker,
    pending: std::collections::VecDeque<Rx>,
    buf: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// Wraps an open stream.
    pub fn new(stream: S) -> Self {
        Client {
            stream,
            decoder: Decoder::new(),
            encoder: FrameEncoder::new(),
            seq: SeqTracker::new(),
            pending: Default::default(),
            buf: vec![0; 4096],
        }
    }

    /// Frames rejected so far by the decoder.
    pub fn rejected(&self) -> u64 {
        self.decoder.stats().rejected()
    }

    /// Sends one command.
    pub async fn send(&mut self, m: &Message<'_>) -> std::io::Result<()> {
        let mut out = [0u8; MAX_WIRE_FRAME];
        let n = self
            .encoder
            .encode(m, &mut out)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        self.stream.write_all(&out[..n]).await?;
        self.stream.flush().await
    }

    /// Sends bytes as they are (e.g. a deliberately corrupted frame).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// The next message, or an error if none arrives within `timeout`.
    pub async fn recv(&mut self, timeout: Duration) -> std::io::Result<Rx> {
        loop {
            if let Some(rx) = self.pending.pop_front() {
                return Ok(rx);
            }
            let n = tokio::time::timeout(timeout, self.stream.read(&mut self.buf))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "no frame from the device")
                })??;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let mut input = &self.buf[..n];
            while let Some(r) = self.decoder.next(&mut input) {
                let Ok(f) = r else { continue };
                self.seq.observe(f.seq);
                let Some(rx) = Rx::from_message(&f.message) else {
                    continue;
                };
                self.pending.push_back(rx);
            }
        }
    }

    /// Sends a command and collects everything up to its result.
    pub async fn command(
        &mut self,
        m: &Message<'_>,
        timeout: Duration,
    ) -> std::io::Result<Vec<Rx>> {
        let id = m
            .request_id()
            .ok_or_else(|| std::io::Error::other("not a command"))?;
        self.send(m).await?;
        let mut got = Vec::new();
        loop {
            let rx = self.recv(timeout).await?;
            let done = matches!(&rx, Rx::Result(c) if c.request_id == id);
            got.push(rx);
            if done {
                return Ok(got);
            }
        }
    }
}

/// Held by every test that runs a real-time twin or emulator, so that they run one at a
/// time: two at once would share two cores with the test harness and miss real time.
pub async fn realtime_lock() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// The last Status in `got` (a Stop's, when `got` answers a Stop).
pub fn last_status(got: &[Rx]) -> Option<Status> {
    got.iter().rev().find_map(|r| match r {
        Rx::Status(s) => Some(*s),
        _ => None,
    })
}

/// The result code of request `id` in `got`.
pub fn result_of(got: &[Rx], id: u16) -> Option<railtrace_protocol::ResultCode> {
    got.iter().find_map(|r| match r {
        Rx::Result(c) if c.request_id == id => Some(c.code),
        _ => None,
    })
}
