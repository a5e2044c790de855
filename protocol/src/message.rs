//! Every message between rig and host, and its payload layout (see SPEC.md §4-§5).

use heapless::Vec;

use crate::wire::{Reader, Short, Writer};

/// Most channels a rig has (one ADC of 8 simultaneous channels); bit `i` of a channel
/// mask is channel `i`.
pub const MAX_CHANNELS: usize = 8;
/// Most entries in [`DeviceInfo::sample_rates_hz`].
pub const MAX_SAMPLE_RATES: usize = 8;
/// Longest board name and serial number, in bytes of UTF-8.
pub const MAX_ID_LEN: usize = 32;
/// Longest channel name, in bytes of UTF-8.
pub const MAX_CHANNEL_NAME_LEN: usize = 16;
/// Bit 7 of a trigger line number: the edge was driven by the device on an output line.
pub const OUTPUT_LINE: u8 = 0x80;

/// The message type byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// Device → host: [`DeviceInfo`].
    DeviceInfo = 0x01,
    /// Device → host: [`SampleBlock`].
    SampleBlock = 0x02,
    /// Device → host: [`TriggerEdge`].
    TriggerEdge = 0x03,
    /// Device → host: [`Status`].
    Status = 0x04,
    /// Device → host: [`TimeSyncReply`].
    TimeSyncReply = 0x05,
    /// Device → host: [`CommandResult`].
    CommandResult = 0x06,
    /// Device → host: [`Log`].
    Log = 0x07,
    /// Host → device: ask for [`DeviceInfo`].
    GetInfo = 0x81,
    /// Host → device: [`Configure`].
    Configure = 0x82,
    /// Host → device: start sampling.
    Start = 0x83,
    /// Host → device: stop sampling.
    Stop = 0x84,
    /// Host → device: [`TimeSyncRequest`].
    TimeSync = 0x85,
    /// Host → device: [`DriveTrigger`].
    DriveTrigger = 0x86,
    /// Host → device: [`WriteCalibration`].
    WriteCalibration = 0x87,
    /// Host → device: zero the drop and frame counters of [`Status`].
    ResetCounters = 0x88,
    /// Host → device: ask for a [`Status`] now.
    GetStatus = 0x89,
}

impl MessageType {
    /// The type for a type byte, or `None` for a byte this version does not define.
    pub fn from_u8(b: u8) -> Option<Self> {
        use MessageType::*;
        Some(match b {
            0x01 => DeviceInfo,
            0x02 => SampleBlock,
            0x03 => TriggerEdge,
            0x04 => Status,
            0x05 => TimeSyncReply,
            0x06 => CommandResult,
            0x07 => Log,
            0x81 => GetInfo,
            0x82 => Configure,
            0x83 => Start,
            0x84 => Stop,
            0x85 => TimeSync,
            0x86 => DriveTrigger,
            0x87 => WriteCalibration,
            0x88 => ResetCounters,
            0x89 => GetStatus,
            _ => return None,
        })
    }

    /// True for the messages a host sends (type bytes 0x80 and up).
    pub fn is_command(self) -> bool {
        self as u8 & 0x80 != 0
    }
}

/// The physical quantity a channel measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// Volts.
    Voltage,
    /// Amperes.
    Current,
    /// A quantity this version does not know; its calibration gives its own unit.
    Other(u8),
}

impl Quantity {
    fn from_u8(b: u8) -> Self {
        match b {
            0 => Quantity::Voltage,
            1 => Quantity::Current,
            x => Quantity::Other(x),
        }
    }
    fn to_u8(self) -> u8 {
        match self {
            Quantity::Voltage => 0,
            Quantity::Current => 1,
            Quantity::Other(x) => x,
        }
    }
    /// The SI unit symbol, `?` where unknown.
    pub fn unit(self) -> &'static str {
        match self {
            Quantity::Voltage => "V",
            Quantity::Current => "A",
            Quantity::Other(_) => "?",
        }
    }
}

/// One channel of the device, with its stored calibration: `value = code × scale + offset`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelInfo<'a> {
    /// Channel number, 0..8: its bit in a channel mask.
    pub index: u8,
    /// What it measures.
    pub quantity: Quantity,
    /// Short name, e.g. `12V_PCIE_I`.
    pub name: &'a str,
    /// Units (V or A) per ADC code.
    pub scale: f32,
    /// Units (V or A) at code 0.
    pub offset: f32,
}

/// [`DeviceInfo::flags`] bit: samples come from the built-in test-signal source, not the ADC.
pub const FLAG_TEST_SIGNAL: u8 = 0x01;
/// [`DeviceInfo::flags`] bit: the calibration was read from non-volatile storage (not defaults).
pub const FLAG_CALIBRATION_STORED: u8 = 0x02;

/// What the device is, answered to [`Message::GetInfo`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo<'a> {
    /// Firmware version as (major, minor, patch).
    pub firmware_version: (u8, u8, u8),
    /// The protocol version the firmware speaks.
    pub protocol_version: u8,
    /// Rate of the device clock that stamps samples and edges, in Hz.
    pub tick_hz: u32,
    /// ADC resolution in bits (codes are signed, two's complement).
    pub adc_bits: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Number of trigger input lines.
    pub trigger_inputs: u8,
    /// Number of trigger output lines.
    pub trigger_outputs: u8,
    /// Board name.
    pub board: &'a str,
    /// Serial number.
    pub serial: &'a str,
    /// Sample rates the device accepts in [`Configure`], in Hz.
    pub sample_rates_hz: Vec<u32, MAX_SAMPLE_RATES>,
    /// The channels, with their stored calibration.
    pub channels: Vec<ChannelInfo<'a>, MAX_CHANNELS>,
}

/// Raw ADC codes: signed 16-bit little-endian, sample-major, enabled channels in
/// ascending order within each sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codes<'a>(&'a [u8]);

impl<'a> Codes<'a> {
    /// Wraps little-endian i16 bytes; `None` if the length is odd.
    pub fn from_le_bytes(bytes: &'a [u8]) -> Option<Self> {
        (bytes.len() % 2 == 0).then_some(Codes(bytes))
    }
    /// The underlying bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }
    /// Number of codes.
    pub fn len(&self) -> usize {
        self.0.len() / 2
    }
    /// True when there are no codes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The `i`-th code.
    pub fn get(&self, i: usize) -> Option<i16> {
        let b = self.0.get(2 * i..2 * i + 2)?;
        Some(i16::from_le_bytes([*b.first()?, *b.get(1)?]))
    }
    /// All codes in order.
    pub fn iter(&self) -> impl Iterator<Item = i16> + 'a {
        self.0.chunks_exact(2).map(|c| {
            i16::from_le_bytes([
                c.first().copied().unwrap_or(0),
                c.get(1).copied().unwrap_or(0),
            ])
        })
    }
}

/// Consecutive samples of the enabled channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleBlock<'a> {
    /// Index of the first sample since [`Message::Start`] (after averaging). A jump from
    /// the previous block's end is a gap of samples the device dropped and counted.
    pub first_index: u64,
    /// Device tick at which the first sample was taken (for an average of N, its first
    /// conversion).
    pub first_tick: u64,
    /// Nominal ticks between consecutive samples of the block.
    pub period_ticks: u32,
    /// Enabled channels: bit `i` is channel `i`.
    pub channel_mask: u8,
    /// Each code is the mean of this many conversions, rounded to nearest (1 = none).
    pub averaging: u16,
    /// Number of samples.
    pub sample_count: u16,
    /// `sample_count × popcount(channel_mask)` codes.
    pub codes: Codes<'a>,
}

impl SampleBlock<'_> {
    /// Number of enabled channels.
    pub fn channel_count(&self) -> usize {
        self.channel_mask.count_ones() as usize
    }
    /// The code of sample `sample` for the `slot`-th enabled channel.
    pub fn code(&self, sample: usize, slot: usize) -> Option<i16> {
        if slot >= self.channel_count() {
            return None;
        }
        self.codes.get(sample * self.channel_count() + slot)
    }
}

/// A trigger-line edge, timestamped by the device's input capture (or, for an output
/// line, when the device drove it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TriggerEdge {
    /// Line number; bit 7 ([`OUTPUT_LINE`]) set for an output line driven by the device.
    pub line: u8,
    /// True for a rising edge, false for falling.
    pub rising: bool,
    /// Edges seen on this line since start, this one included; a jump shows edges the
    /// capture lost (also counted in [`Status::edges_dropped`]).
    pub edge_count: u32,
    /// Device tick of the edge.
    pub tick: u64,
    /// Index of the sample whose period contains the edge.
    pub sample_index: u64,
}

/// Sampler state in [`Status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Not sampling.
    Idle,
    /// Sampling.
    Running,
    /// A state this version does not know.
    Other(u8),
}

/// Device health and counters, sent about once a second while running and on request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Device ticks since power-on.
    pub uptime_ticks: u64,
    /// Samples (after averaging) produced since start.
    pub samples_acquired: u64,
    /// Samples dropped because the queue from the sampling interrupt to the main loop was full.
    pub dropped_queue_full: u64,
    /// Samples dropped because the link could not take their block in time.
    pub dropped_link: u64,
    /// Samples dropped because a conversion failed (ADC busy timeout or bus error).
    pub dropped_adc: u64,
    /// Frames sent by the device since power-on (this one included).
    pub frames_sent: u32,
    /// Host frames the device rejected (COBS, CRC, length or version errors).
    pub frames_rejected: u32,
    /// Trigger edges lost because the edge queue was full.
    pub edges_dropped: u32,
    /// Highest occupancy of the sample queue since the counters were reset.
    pub queue_high_water: u16,
    /// Capacity of the sample queue.
    pub queue_capacity: u16,
    /// Sampler state.
    pub state: RunState,
}

impl Status {
    /// All samples dropped on the device, for whatever reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_queue_full
            .saturating_add(self.dropped_link)
            .saturating_add(self.dropped_adc)
    }
}

/// The device's answer to a [`TimeSyncRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSyncReply {
    /// The host's nonce, echoed.
    pub nonce: u32,
    /// Device tick when the request's last byte arrived.
    pub rx_tick: u64,
    /// Device tick just before this reply's first byte was handed to the link.
    pub tx_tick: u64,
}

/// Outcome of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultCode {
    /// Done.
    Ok,
    /// The device does not implement this command type.
    UnknownCommand,
    /// A field is out of range (channel, line, mask, averaging).
    InvalidArgument,
    /// Not allowed while sampling (e.g. configure while running).
    Busy,
    /// The requested sample rate is not one of [`DeviceInfo::sample_rates_hz`].
    UnsupportedRate,
    /// The hardware failed (ADC not responding).
    HardwareFault,
    /// Non-volatile storage failed.
    StorageFault,
    /// A code this version does not know.
    Other(u8),
}

impl ResultCode {
    fn from_u8(b: u8) -> Self {
        match b {
            0 => ResultCode::Ok,
            1 => ResultCode::UnknownCommand,
            2 => ResultCode::InvalidArgument,
            3 => ResultCode::Busy,
            4 => ResultCode::UnsupportedRate,
            5 => ResultCode::HardwareFault,
            6 => ResultCode::StorageFault,
            x => ResultCode::Other(x),
        }
    }
    fn to_u8(self) -> u8 {
        match self {
            ResultCode::Ok => 0,
            ResultCode::UnknownCommand => 1,
            ResultCode::InvalidArgument => 2,
            ResultCode::Busy => 3,
            ResultCode::UnsupportedRate => 4,
            ResultCode::HardwareFault => 5,
            ResultCode::StorageFault => 6,
            ResultCode::Other(x) => x,
        }
    }
}

/// The device's answer to every command: exactly one per command received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandResult {
    /// The command's request id, echoed.
    pub request_id: u16,
    /// The command's message type byte, echoed.
    pub command: u8,
    /// Outcome.
    pub code: ResultCode,
}

/// Severity of a [`Log`] line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Something failed.
    Error,
    /// Something is wrong but sampling goes on.
    Warn,
    /// Normal operation.
    Info,
    /// Detail.
    Debug,
}

/// A line of text from the firmware.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Log<'a> {
    /// Severity.
    pub level: LogLevel,
    /// UTF-8 text, no terminator.
    pub text: &'a str,
}

/// Host → device: set up sampling. Only while idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Configure {
    /// Request id, echoed in the result.
    pub request_id: u16,
    /// Conversion rate in Hz; one of [`DeviceInfo::sample_rates_hz`].
    pub sample_rate_hz: u32,
    /// Channels to send, bit `i` is channel `i`; not zero.
    pub channel_mask: u8,
    /// Average this many conversions into each sample sent (1 = none).
    pub averaging: u16,
}

/// Host → device: ask for a [`TimeSyncReply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSyncRequest {
    /// Request id, echoed in the result.
    pub request_id: u16,
    /// Any value, echoed in the reply so the host can pair it with its own send time.
    pub nonce: u32,
}

/// Host → device: set a trigger output line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriveTrigger {
    /// Request id, echoed in the result.
    pub request_id: u16,
    /// Output line number (without [`OUTPUT_LINE`]).
    pub line: u8,
    /// Level to drive: true high, false low.
    pub high: bool,
    /// 0: hold the level. Otherwise return to the other level after this many device ticks.
    pub pulse_ticks: u32,
}

/// Host → device: store a channel's calibration (`value = code × scale + offset`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteCalibration {
    /// Request id, echoed in the result.
    pub request_id: u16,
    /// Channel number, 0..8.
    pub channel: u8,
    /// Units per code.
    pub scale: f32,
    /// Units at code 0.
    pub offset: f32,
}

/// Any message of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    /// Device → host.
    DeviceInfo(DeviceInfo<'a>),
    /// Device → host.
    SampleBlock(SampleBlock<'a>),
    /// Device → host.
    TriggerEdge(TriggerEdge),
    /// Device → host.
    Status(Status),
    /// Device → host.
    TimeSyncReply(TimeSyncReply),
    /// Device → host.
    CommandResult(CommandResult),
    /// Device → host.
    Log(Log<'a>),
    /// Host → device.
    GetInfo {
        /// Echoed in the result.
        request_id: u16,
    },
    /// Host → device.
    Configure(Configure),
    /// Host → device: start sampling; sample indices restart at 0.
    Start {
        /// Echoed in the result.
        request_id: u16,
    },
    /// Host → device: stop sampling; the last partial block is sent first.
    Stop {
        /// Echoed in the result.
        request_id: u16,
    },
    /// Host → device.
    TimeSync(TimeSyncRequest),
    /// Host → device.
    DriveTrigger(DriveTrigger),
    /// Host → device.
    WriteCalibration(WriteCalibration),
    /// Host → device.
    ResetCounters {
        /// Echoed in the result.
        request_id: u16,
    },
    /// Host → device.
    GetStatus {
        /// Echoed in the result.
        request_id: u16,
    },
    /// A valid frame whose type byte this version does not define: skip it.
    Unknown {
        /// The type byte.
        msg_type: u8,
        /// The payload, uninterpreted.
        payload: &'a [u8],
    },
}

impl<'a> Message<'a> {
    /// The type byte of this message.
    pub fn type_byte(&self) -> u8 {
        use MessageType as T;
        (match self {
            Message::DeviceInfo(_) => T::DeviceInfo,
            Message::SampleBlock(_) => T::SampleBlock,
            Message::TriggerEdge(_) => T::TriggerEdge,
            Message::Status(_) => T::Status,
            Message::TimeSyncReply(_) => T::TimeSyncReply,
            Message::CommandResult(_) => T::CommandResult,
            Message::Log(_) => T::Log,
            Message::GetInfo { .. } => T::GetInfo,
            Message::Configure(_) => T::Configure,
            Message::Start { .. } => T::Start,
            Message::Stop { .. } => T::Stop,
            Message::TimeSync(_) => T::TimeSync,
            Message::DriveTrigger(_) => T::DriveTrigger,
            Message::WriteCalibration(_) => T::WriteCalibration,
            Message::ResetCounters { .. } => T::ResetCounters,
            Message::GetStatus { .. } => T::GetStatus,
            Message::Unknown { msg_type, .. } => return *msg_type,
        }) as u8
    }

    /// The request id of a host command, `None` for device messages.
    pub fn request_id(&self) -> Option<u16> {
        match self {
            Message::GetInfo { request_id }
            | Message::Start { request_id }
            | Message::Stop { request_id }
            | Message::ResetCounters { request_id }
            | Message::GetStatus { request_id } => Some(*request_id),
            Message::Configure(c) => Some(c.request_id),
            Message::TimeSync(t) => Some(t.request_id),
            Message::DriveTrigger(d) => Some(d.request_id),
            Message::WriteCalibration(w) => Some(w.request_id),
            _ => None,
        }
    }

    /// Parses a payload of type `msg_type`. An undefined type gives [`Message::Unknown`];
    /// a defined type whose payload does not match its layout gives `Err`.
    pub(crate) fn decode(msg_type: u8, payload: &'a [u8]) -> Result<Self, Short> {
        let Some(t) = MessageType::from_u8(msg_type) else {
            return Ok(Message::Unknown { msg_type, payload });
        };
        let mut r = Reader::new(payload);
        let m = match t {
            MessageType::DeviceInfo => Message::DeviceInfo(decode_info(&mut r)?),
            MessageType::SampleBlock => {
                let first_index = r.u64()?;
                let first_tick = r.u64()?;
                let period_ticks = r.u32()?;
                let channel_mask = r.u8()?;
                let averaging = r.u16()?;
                let sample_count = r.u16()?;
                let codes = Codes(r.rest());
                let block = SampleBlock {
                    first_index,
                    first_tick,
                    period_ticks,
                    channel_mask,
                    averaging,
                    sample_count,
                    codes,
                };
                check_block(&block)?;
                Message::SampleBlock(block)
            }
            MessageType::TriggerEdge => Message::TriggerEdge(TriggerEdge {
                line: r.u8()?,
                rising: bool_u8(r.u8()?)?,
                edge_count: r.u32()?,
                tick: r.u64()?,
                sample_index: r.u64()?,
            }),
            MessageType::Status => Message::Status(Status {
                uptime_ticks: r.u64()?,
                samples_acquired: r.u64()?,
                dropped_queue_full: r.u64()?,
                dropped_link: r.u64()?,
                dropped_adc: r.u64()?,
                frames_sent: r.u32()?,
                frames_rejected: r.u32()?,
                edges_dropped: r.u32()?,
                queue_high_water: r.u16()?,
                queue_capacity: r.u16()?,
                state: match r.u8()? {
                    0 => RunState::Idle,
                    1 => RunState::Running,
                    x => RunState::Other(x),
                },
            }),
            MessageType::TimeSyncReply => Message::TimeSyncReply(TimeSyncReply {
                nonce: r.u32()?,
                rx_tick: r.u64()?,
                tx_tick: r.u64()?,
            }),
            MessageType::CommandResult => Message::CommandResult(CommandResult {
                request_id: r.u16()?,
                command: r.u8()?,
                code: ResultCode::from_u8(r.u8()?),
            }),
            MessageType::Log => Message::Log(Log {
                level: match r.u8()? {
                    0 => LogLevel::Error,
                    1 => LogLevel::Warn,
                    2 => LogLevel::Info,
                    3 => LogLevel::Debug,
                    _ => return Err(Short),
                },
                text: core::str::from_utf8(r.rest()).map_err(|_| Short)?,
            }),
            MessageType::GetInfo => Message::GetInfo {
                request_id: r.u16()?,
            },
            MessageType::Configure => Message::Configure(Configure {
                request_id: r.u16()?,
                sample_rate_hz: r.u32()?,
                channel_mask: r.u8()?,
                averaging: r.u16()?,
            }),
            MessageType::Start => Message::Start {
                request_id: r.u16()?,
            },
            MessageType::Stop => Message::Stop {
                request_id: r.u16()?,
            },
            MessageType::TimeSync => Message::TimeSync(TimeSyncRequest {
                request_id: r.u16()?,
                nonce: r.u32()?,
            }),
            MessageType::DriveTrigger => Message::DriveTrigger(DriveTrigger {
                request_id: r.u16()?,
                line: r.u8()?,
                high: bool_u8(r.u8()?)?,
                pulse_ticks: r.u32()?,
            }),
            MessageType::WriteCalibration => Message::WriteCalibration(WriteCalibration {
                request_id: r.u16()?,
                channel: r.u8()?,
                scale: r.f32()?,
                offset: r.f32()?,
            }),
            MessageType::ResetCounters => Message::ResetCounters {
                request_id: r.u16()?,
            },
            MessageType::GetStatus => Message::GetStatus {
                request_id: r.u16()?,
            },
        };
        r.finish()?;
        Ok(m)
    }

    /// Writes the payload alone (no header, CRC or COBS) into `buf`; returns its length.
    pub fn encode_payload(&self, buf: &mut [u8]) -> Result<usize, crate::EncodeError> {
        self.encode(buf)
            .map_err(|_| crate::EncodeError::InvalidMessage)
    }

    fn encode(&self, buf: &mut [u8]) -> Result<usize, Short> {
        let mut w = Writer::new(buf);
        match self {
            Message::DeviceInfo(i) => encode_info(i, &mut w)?,
            Message::SampleBlock(b) => {
                check_block(b)?;
                w.u64(b.first_index)?;
                w.u64(b.first_tick)?;
                w.u32(b.period_ticks)?;
                w.u8(b.channel_mask)?;
                w.u16(b.averaging)?;
                w.u16(b.sample_count)?;
                w.bytes(b.codes.as_bytes())?;
            }
            Message::TriggerEdge(e) => {
                w.u8(e.line)?;
                w.u8(u8::from(e.rising))?;
                w.u32(e.edge_count)?;
                w.u64(e.tick)?;
                w.u64(e.sample_index)?;
            }
            Message::Status(s) => {
                w.u64(s.uptime_ticks)?;
                w.u64(s.samples_acquired)?;
                w.u64(s.dropped_queue_full)?;
                w.u64(s.dropped_link)?;
                w.u64(s.dropped_adc)?;
                w.u32(s.frames_sent)?;
                w.u32(s.frames_rejected)?;
                w.u32(s.edges_dropped)?;
                w.u16(s.queue_high_water)?;
                w.u16(s.queue_capacity)?;
                w.u8(match s.state {
                    RunState::Idle => 0,
                    RunState::Running => 1,
                    RunState::Other(x) => x,
                })?;
            }
            Message::TimeSyncReply(t) => {
                w.u32(t.nonce)?;
                w.u64(t.rx_tick)?;
                w.u64(t.tx_tick)?;
            }
            Message::CommandResult(c) => {
                w.u16(c.request_id)?;
                w.u8(c.command)?;
                w.u8(c.code.to_u8())?;
            }
            Message::Log(l) => {
                w.u8(l.level as u8)?;
                w.bytes(l.text.as_bytes())?;
            }
            Message::GetInfo { request_id }
            | Message::Start { request_id }
            | Message::Stop { request_id }
            | Message::ResetCounters { request_id }
            | Message::GetStatus { request_id } => w.u16(*request_id)?,
            Message::Configure(c) => {
                w.u16(c.request_id)?;
                w.u32(c.sample_rate_hz)?;
                w.u8(c.channel_mask)?;
                w.u16(c.averaging)?;
            }
            Message::TimeSync(t) => {
                w.u16(t.request_id)?;
                w.u32(t.nonce)?;
            }
            Message::DriveTrigger(d) => {
                w.u16(d.request_id)?;
                w.u8(d.line)?;
                w.u8(u8::from(d.high))?;
                w.u32(d.pulse_ticks)?;
            }
            Message::WriteCalibration(c) => {
                w.u16(c.request_id)?;
                w.u8(c.channel)?;
                w.f32(c.scale)?;
                w.f32(c.offset)?;
            }
            Message::Unknown { payload, .. } => w.bytes(payload)?,
        }
        Ok(w.position())
    }
}

fn bool_u8(b: u8) -> Result<bool, Short> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Short),
    }
}

fn check_block(b: &SampleBlock<'_>) -> Result<(), Short> {
    let expected = usize::from(b.sample_count) * b.channel_count();
    if b.codes.len() != expected
        || b.codes.as_bytes().len() % 2 != 0
        || b.averaging == 0
        || b.channel_mask == 0
    {
        return Err(Short);
    }
    Ok(())
}

fn decode_info<'a>(r: &mut Reader<'a>) -> Result<DeviceInfo<'a>, Short> {
    let firmware_version = (r.u8()?, r.u8()?, r.u8()?);
    let protocol_version = r.u8()?;
    let tick_hz = r.u32()?;
    let adc_bits = r.u8()?;
    let flags = r.u8()?;
    let trigger_inputs = r.u8()?;
    let trigger_outputs = r.u8()?;
    let board = r.str(MAX_ID_LEN)?;
    let serial = r.str(MAX_ID_LEN)?;
    let mut sample_rates_hz = Vec::new();
    for _ in 0..r.u8()? {
        sample_rates_hz.push(r.u32()?).map_err(|_| Short)?;
    }
    let mut channels = Vec::new();
    for _ in 0..r.u8()? {
        let ch = ChannelInfo {
            index: r.u8()?,
            quantity: Quantity::from_u8(r.u8()?),
            name: r.str(MAX_CHANNEL_NAME_LEN)?,
            scale: r.f32()?,
            offset: r.f32()?,
        };
        if usize::from(ch.index) >= MAX_CHANNELS {
            return Err(Short);
        }
        channels.push(ch).map_err(|_| Short)?;
    }
    Ok(DeviceInfo {
        firmware_version,
        protocol_version,
        tick_hz,
        adc_bits,
        flags,
        trigger_inputs,
        trigger_outputs,
        board,
        serial,
        sample_rates_hz,
        channels,
    })
}

fn encode_info(i: &DeviceInfo<'_>, w: &mut Writer<'_>) -> Result<(), Short> {
    let (major, minor, patch) = i.firmware_version;
    for b in [major, minor, patch, i.protocol_version] {
        w.u8(b)?;
    }
    w.u32(i.tick_hz)?;
    for b in [i.adc_bits, i.flags, i.trigger_inputs, i.trigger_outputs] {
        w.u8(b)?;
    }
    w.str(i.board, MAX_ID_LEN)?;
    w.str(i.serial, MAX_ID_LEN)?;
    w.u8(i.sample_rates_hz.len() as u8)?;
    for &rate in &i.sample_rates_hz {
        w.u32(rate)?;
    }
    w.u8(i.channels.len() as u8)?;
    for c in &i.channels {
        if usize::from(c.index) >= MAX_CHANNELS {
            return Err(Short);
        }
        w.u8(c.index)?;
        w.u8(c.quantity.to_u8())?;
        w.str(c.name, MAX_CHANNEL_NAME_LEN)?;
        w.f32(c.scale)?;
        w.f32(c.offset)?;
    }
    Ok(())
}
