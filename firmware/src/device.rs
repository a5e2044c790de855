//! The main-loop side: commands from the host, sample blocks, trigger edges, status, and
//! the link. Frames are numbered when they are handed to the link, so sequence numbers
//! follow the wire order and a time-sync reply is stamped just before it goes out.

use heapless::Deque;
use railtrace_protocol::{
    self as proto, max_block_samples, ChannelInfo, Codes, CommandResult, Decoder, DeviceInfo,
    FrameEncoder, FrameError, LogLevel, Message, MessageType, Quantity, ResultCode, RunState,
    SampleBlock, Status, TimeSyncReply, TriggerEdge, MAX_PAYLOAD, MAX_WIRE_FRAME, OUTPUT_LINE,
};

use crate::hw::{Board, Calibration, ErrorKind, CHANNELS};
use crate::sampler::{Queues, Shared, MAX_AVERAGING, TRIGGER_INPUTS};
use core::sync::atomic::{AtomicU32, Ordering};

/// Trigger output lines the core handles.
pub const TRIGGER_OUTPUTS: usize = 4;
/// Frames waiting for the link. Sample blocks may use all but [`CONTROL_RESERVE`] of them.
pub const TX_SLOTS: usize = 8;
/// Slots kept free of sample blocks, so command results, edges and status always fit.
pub const CONTROL_RESERVE: usize = 3;
/// A Stop waits at most a second divided by this for the link to take the run's last
/// blocks: a tenth of a second.
const STOP_GRACE_DIV: u64 = 10;
/// Most code bytes a block can hold.
const MAX_CODE_BYTES: usize = MAX_PAYLOAD - 25;

/// One channel as the board is built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelSpec {
    /// Channel number 0..8 (ADC input V1..V8 is 0..7).
    pub index: u8,
    /// What it measures.
    pub quantity: Quantity,
    /// Short name.
    pub name: &'static str,
    /// Calibration used until one is written.
    pub default_calibration: Calibration,
}

/// What the device is: the facts DeviceInfo reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Description {
    /// Board name.
    pub board: &'static str,
    /// Serial number.
    pub serial: &'static str,
    /// Firmware version.
    pub firmware_version: (u8, u8, u8),
    /// Device clock rate.
    pub tick_hz: u32,
    /// ADC resolution.
    pub adc_bits: u8,
    /// Samples come from a test signal, not the ADC.
    pub test_signal: bool,
    /// Accepted sample rates.
    pub sample_rates_hz: &'static [u32],
    /// Trigger inputs wired (at most 4).
    pub trigger_inputs: u8,
    /// Trigger outputs wired (at most 4).
    pub trigger_outputs: u8,
    /// The channels.
    pub channels: &'static [ChannelSpec],
}

/// A 32-bit wrapping counter written by an interrupt, extended to 64 bits here.
#[derive(Debug, Default, Clone, Copy)]
struct Counter {
    raw_last: u32,
    total: u64,
}

impl Counter {
    fn update(&mut self, raw: &AtomicU32) -> u64 {
        let raw = raw.load(Ordering::Relaxed);
        self.total += u64::from(raw.wrapping_sub(self.raw_last));
        self.raw_last = raw;
        self.total
    }
    fn reset(&mut self, raw: &AtomicU32) {
        self.update(raw);
        self.total = 0;
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    produced: Counter,
    dropped_queue_full: Counter,
    dropped_adc: Counter,
    edges_dropped: Counter,
    dropped_link: u64,
    rejected_base: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    first_index: u64,
    first_tick: u64,
    count: u16,
    codes: [u8; MAX_CODE_BYTES],
    len: usize,
}

/// A frame waiting for the link, built into bytes only when its turn comes.
#[derive(Debug, Clone)]
enum Slot {
    Block(Block),
    Info,
    Status,
    Result(CommandResult),
    Edge(TriggerEdge),
    Log(LogLevel, &'static str),
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Config {
    rate_hz: u32,
    mask: u8,
    averaging: u16,
}

/// A command as the device acts on it (copied out of the decoder's buffer).
#[derive(Debug, Clone)]
enum Command {
    Known(Message<'static>),
    Unknown { msg_type: u8, request_id: u16 },
    Malformed { msg_type: u8, request_id: u16 },
}

/// The firmware's main loop state. Call [`Device::poll`] as often as possible.
#[derive(Debug)]
pub struct Device<'a, const Q: usize, const E: usize> {
    desc: Description,
    calibration: [Calibration; CHANNELS],
    calibration_stored: bool,
    shared: &'a Shared,
    queues: Queues<'a, Q, E>,
    decoder: Decoder,
    rx: [u8; 64],
    rx_start: usize,
    rx_end: usize,
    rx_tick: u64,
    encoder: FrameEncoder,
    slots: Deque<Slot, TX_SLOTS>,
    tx: [u8; MAX_WIRE_FRAME],
    tx_len: usize,
    tx_pos: usize,
    pending_sync: Option<(u16, u32, u64)>,
    config: Config,
    running: bool,
    /// A Stop being carried out: its request id, its type byte and when it came. The run's
    /// last samples still go out, each block as a slot frees, before its answer.
    stopping: Option<(u16, u8, u64)>,
    sample_period_ticks: u64,
    run_start_tick: u64,
    t0: Option<u64>,
    block: Block,
    counters: Counters,
    out_levels: [bool; TRIGGER_OUTPUTS],
    out_counts: [u32; TRIGGER_OUTPUTS],
    pulses: [Option<u64>; TRIGGER_OUTPUTS],
    next_status_tick: u64,
    now: u64,
}

impl<'a, const Q: usize, const E: usize> Device<'a, Q, E> {
    /// A device described by `desc`, with calibration loaded from storage if `stored` is
    /// given. It greets the host with a Log line.
    pub fn new(
        desc: Description,
        stored: Option<[Calibration; CHANNELS]>,
        shared: &'a Shared,
        queues: Queues<'a, Q, E>,
    ) -> Self {
        let mut calibration = [Calibration {
            scale: 1.0,
            offset: 0.0,
        }; CHANNELS];
        for ch in desc.channels {
            if let Some(c) = calibration.get_mut(usize::from(ch.index)) {
                *c = ch.default_calibration;
            }
        }
        let mask = channel_mask(&desc);
        let mut slots = Deque::new();
        let _ = slots.push_back(Slot::Log(LogLevel::Info, "railtrace firmware ready"));
        // A device starts idle, whatever ran before a reset.
        shared.stop();
        let mut device = Device {
            desc,
            calibration: stored.unwrap_or(calibration),
            calibration_stored: stored.is_some(),
            shared,
            queues,
            decoder: Decoder::new(),
            rx: [0; 64],
            rx_start: 0,
            rx_end: 0,
            rx_tick: 0,
            encoder: FrameEncoder::new(),
            slots,
            tx: [0; MAX_WIRE_FRAME],
            tx_len: 0,
            tx_pos: 0,
            pending_sync: None,
            config: Config {
                rate_hz: desc.sample_rates_hz.first().copied().unwrap_or(0),
                mask,
                averaging: 1,
            },
            running: false,
            stopping: None,
            sample_period_ticks: 1,
            run_start_tick: 0,
            t0: None,
            block: Block {
                first_index: 0,
                first_tick: 0,
                count: 0,
                codes: [0; MAX_CODE_BYTES],
                len: 0,
            },
            counters: Counters::default(),
            out_levels: [false; TRIGGER_OUTPUTS],
            out_counts: [0; TRIGGER_OUTPUTS],
            pulses: [None; TRIGGER_OUTPUTS],
            next_status_tick: 0,
            now: 0,
        };
        // Counters start from what the interrupts counted before this (re)start.
        device.reset_counters(true);
        device
    }

    /// Gives back the queues (for a restart of the device, as after a reset).
    pub fn into_queues(self) -> Queues<'a, Q, E> {
        self.queues
    }

    /// Queues a line of text for the host (dropped if the queue is full).
    pub fn log(&mut self, level: LogLevel, text: &'static str) {
        if self.free() > CONTROL_RESERVE {
            self.push(Slot::Log(level, text));
        }
    }

    /// True while sampling.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// One pass of the main loop: commands from the link, edges, trigger pulses, periodic
    /// status, queued samples into blocks, and frames out to the link. Never blocks
    /// unless the link does.
    pub fn poll<B, L>(&mut self, board: &mut B, link: &mut L) -> Result<(), L::Error>
    where
        B: Board,
        L: embedded_io::Read
            + embedded_io::ReadReady
            + embedded_io::Write
            + embedded_io::WriteReady,
    {
        let now = board.now();
        self.now = now;
        // In order of priority, so that a device that cannot keep up still answers
        // commands and reports edges and status: sample blocks take the slots left.
        self.receive(board, link)?;
        self.collect_edges(now);
        self.end_pulses(board);
        if self.running && now >= self.next_status_tick && self.free() > CONTROL_RESERVE {
            self.push(Slot::Status);
            self.next_status_tick = now + u64::from(self.desc.tick_hz);
        }
        self.collect_samples(now);
        self.finish_stop(now);
        self.transmit(board, link)
    }

    /// Ends a Stop once the run's last samples are in blocks queued for the link (or,
    /// after a tenth of a second of a link that does not take them, counted as dropped):
    /// then its status, then its answer.
    fn finish_stop(&mut self, now: u64) {
        let Some((request_id, command, since)) = self.stopping else {
            return;
        };
        let late = now.saturating_sub(since) > u64::from(self.desc.tick_hz) / STOP_GRACE_DIV;
        if late {
            loop {
                self.collect_samples(now);
                let drained = !self.queues.samples.ready();
                self.close_block(true);
                if drained {
                    break;
                }
            }
        } else if self.queues.samples.ready() || !self.close_block(false) {
            return; // blocks still wait for slots
        }
        self.running = false;
        self.stopping = None;
        self.push(Slot::Status);
        self.push(Slot::Result(CommandResult {
            request_id,
            command,
            code: ResultCode::Ok,
        }));
    }

    fn free(&self) -> usize {
        TX_SLOTS - self.slots.len()
    }

    /// Queues a control frame. Callers check [`Self::free`] first; a full queue here would
    /// be a bug in that accounting, and the frame is dropped rather than blocking.
    fn push(&mut self, slot: Slot) {
        let _ = self.slots.push_back(slot);
    }

    fn sample_index_at(&self, tick: u64) -> u64 {
        match self.t0 {
            Some(t0) if self.running && tick >= t0 => (tick - t0) / self.sample_period_ticks,
            _ => u64::MAX,
        }
    }

    /// Moves queued samples into blocks. A block that is complete waits in place for a
    /// transmit slot, and the samples behind it wait in the queue, so a link that is
    /// briefly slow costs nothing. Only when the queue is more than half full behind a
    /// block that finds no slot is that block dropped, counted as `dropped_link`: the
    /// link, not the main loop, is what cannot keep up.
    fn collect_samples(&mut self, now: u64) {
        let channels = self.config.mask.count_ones() as usize;
        let max = max_block_samples(channels) as u16;
        for _ in 0..Q {
            let Some(&next) = self.queues.samples.peek() else {
                break;
            };
            if !self.running {
                // Converted as the run ended, after its last block: counted, not sent.
                self.queues.samples.dequeue();
                self.counters.dropped_link += 1;
                continue;
            }
            let b = &self.block;
            let gap = b.count > 0 && next.index != b.first_index + u64::from(b.count);
            if (gap || b.count >= max) && !self.close_block(false) {
                break;
            }
            let Some(s) = self.queues.samples.dequeue() else {
                break;
            };
            if self.t0.is_none() {
                self.t0 = Some(s.tick.saturating_sub(s.index * self.sample_period_ticks));
            }
            let b = &mut self.block;
            if b.count == 0 {
                b.first_index = s.index;
                b.first_tick = s.tick;
                b.len = 0;
            }
            for (i, code) in s.codes.iter().enumerate() {
                if self.config.mask & (1 << i) != 0 {
                    if let Some(dst) = b.codes.get_mut(b.len..b.len + 2) {
                        dst.copy_from_slice(&code.to_le_bytes());
                        b.len += 2;
                    }
                }
            }
            b.count += 1;
        }
        let b = &self.block;
        // A full block goes as soon as it can; and no sample waits more than 10 ms for
        // its block at low rates.
        if b.count >= max
            || (b.count > 0
                && now.saturating_sub(b.first_tick) > u64::from(self.desc.tick_hz / 100))
        {
            self.close_block(false);
        }
    }

    /// Queues the current block for the link if a slot is free. Otherwise, when `force`
    /// (at Stop) or when the sample queue is more than half full, drops it, counted;
    /// else leaves it in place and returns false.
    fn close_block(&mut self, force: bool) -> bool {
        if self.block.count == 0 {
            return true;
        }
        if self.free() > CONTROL_RESERVE {
            self.push(Slot::Block(self.block));
        } else if force || self.queues.samples.len() > Q / 2 {
            self.counters.dropped_link += u64::from(self.block.count);
        } else {
            return false;
        }
        self.block.count = 0;
        self.block.len = 0;
        true
    }

    fn collect_edges(&mut self, now: u64) {
        // While running, wait for the first sample to fix the run's time origin, but not
        // forever: past 10 ms the edge goes out without a sample index.
        let waiting = self.running
            && self.t0.is_none()
            && now.saturating_sub(self.run_start_tick) < u64::from(self.desc.tick_hz / 100);
        while !waiting && self.free() > CONTROL_RESERVE {
            let Some(e) = self.queues.edges.dequeue() else {
                break;
            };
            let edge = TriggerEdge {
                line: e.line,
                rising: e.rising,
                edge_count: e.count,
                tick: e.tick,
                sample_index: self.sample_index_at(e.tick),
            };
            self.push(Slot::Edge(edge));
        }
    }

    fn drive_output<B: Board>(
        &mut self,
        board: &mut B,
        line: u8,
        high: bool,
    ) -> Result<(), ErrorKind> {
        let i = usize::from(line);
        let level = self.out_levels.get_mut(i).ok_or(ErrorKind::Unsupported)?;
        board.set_trigger_output(line, high)?;
        let tick = board.now();
        if *level != high {
            *level = high;
            let count = self.out_counts.get_mut(i).ok_or(ErrorKind::Unsupported)?;
            *count = count.wrapping_add(1);
            let edge = TriggerEdge {
                line: line | OUTPUT_LINE,
                rising: high,
                edge_count: *count,
                tick,
                sample_index: self.sample_index_at(tick),
            };
            self.push(Slot::Edge(edge));
        }
        Ok(())
    }

    fn end_pulses<B: Board>(&mut self, board: &mut B) {
        for line in 0..TRIGGER_OUTPUTS {
            let Some(Some(due)) = self.pulses.get(line).copied() else {
                continue;
            };
            if board.now() >= due && self.free() > CONTROL_RESERVE {
                let high = !self.out_levels.get(line).copied().unwrap_or(false);
                // A failure here cannot be answered (the command was acknowledged): the
                // line keeps its level and the missing edge shows it.
                let _ = self.drive_output(board, line as u8, high);
                if let Some(p) = self.pulses.get_mut(line) {
                    *p = None;
                }
            }
        }
    }

    fn receive<B: Board, L>(&mut self, board: &mut B, link: &mut L) -> Result<(), L::Error>
    where
        L: embedded_io::Read + embedded_io::ReadReady,
    {
        // A command may queue up to three frames (e.g. Stop: block, status, result).
        while self.free() >= CONTROL_RESERVE {
            if self.rx_start >= self.rx_end {
                if !link.read_ready()? {
                    break;
                }
                let n = link.read(&mut self.rx)?;
                if n == 0 {
                    break;
                }
                self.rx_tick = board.now();
                self.rx_start = 0;
                self.rx_end = n;
            }
            let mut input = self.rx.get(self.rx_start..self.rx_end).unwrap_or(&[]);
            let available = input.len();
            let command = match self.decoder.next(&mut input) {
                None => None,
                Some(Ok(frame)) => Some(to_command(&frame.message)),
                Some(Err(FrameError::Malformed {
                    msg_type,
                    request_id,
                    ..
                })) if MessageType::from_u8(msg_type).is_some_and(MessageType::is_command) => {
                    Some(Command::Malformed {
                        msg_type,
                        request_id: request_id.unwrap_or(0),
                    })
                }
                // Not a command, whether or not its payload parses (SPEC §4.6).
                Some(Err(FrameError::Malformed {
                    msg_type,
                    request_id,
                    ..
                })) => Some(Command::Unknown {
                    msg_type,
                    request_id: request_id.unwrap_or(0),
                }),
                Some(Err(_)) => None, // counted by the decoder, not answered (SPEC §4.6)
            };
            self.rx_start += available - input.len();
            if let Some(command) = command {
                self.execute(board, command);
            }
        }
        Ok(())
    }

    fn execute<B: Board>(&mut self, board: &mut B, command: Command) {
        let (request_id, command_type, code) = match command {
            Command::Unknown {
                msg_type,
                request_id,
            } => (request_id, msg_type, ResultCode::UnknownCommand),
            Command::Malformed {
                msg_type,
                request_id,
            } => (request_id, msg_type, ResultCode::InvalidArgument),
            Command::Known(m) => {
                let Some(request_id) = m.request_id() else {
                    return;
                };
                let code = self.run_command(board, &m);
                if matches!(m, Message::TimeSync(_)) && code == ResultCode::Ok {
                    return; // its result follows the reply, sent from transmit()
                }
                if matches!(m, Message::Stop { .. }) && self.stopping.is_some() {
                    return; // its result follows the run's last block, from finish_stop()
                }
                (request_id, m.type_byte(), code)
            }
        };
        self.push(Slot::Result(CommandResult {
            request_id,
            command: command_type,
            code,
        }));
    }

    fn run_command<B: Board>(&mut self, board: &mut B, m: &Message<'_>) -> ResultCode {
        match *m {
            Message::GetInfo { .. } => {
                self.push(Slot::Info);
                ResultCode::Ok
            }
            Message::GetStatus { .. } => {
                self.push(Slot::Status);
                ResultCode::Ok
            }
            Message::Configure(c) => {
                let present = self.channel_mask();
                if self.running {
                    ResultCode::Busy
                } else if !self.desc.sample_rates_hz.contains(&c.sample_rate_hz) {
                    ResultCode::UnsupportedRate
                } else if c.channel_mask == 0
                    || c.channel_mask & !present != 0
                    || c.averaging == 0
                    || c.averaging > MAX_AVERAGING
                    || u64::from(self.desc.tick_hz / c.sample_rate_hz.max(1))
                        * u64::from(c.averaging)
                        > u64::from(u32::MAX)
                {
                    ResultCode::InvalidArgument
                } else {
                    self.config = Config {
                        rate_hz: c.sample_rate_hz,
                        mask: c.channel_mask,
                        averaging: c.averaging,
                    };
                    ResultCode::Ok
                }
            }
            Message::Start { .. } => self.start(board),
            Message::Stop { request_id } => {
                if self.running && self.stopping.is_none() {
                    // Every sample of the run goes out, or is counted as dropped; the
                    // answer follows from finish_stop.
                    board.stop_sampling();
                    self.shared.stop();
                    self.stopping = Some((request_id, m.type_byte(), board.now()));
                }
                ResultCode::Ok
            }
            Message::TimeSync(t) => {
                self.pending_sync = Some((t.request_id, t.nonce, self.rx_tick));
                ResultCode::Ok
            }
            Message::DriveTrigger(d) => {
                if d.line >= self.desc.trigger_outputs || usize::from(d.line) >= TRIGGER_OUTPUTS {
                    return ResultCode::InvalidArgument;
                }
                match self.drive_output(board, d.line, d.high) {
                    Ok(()) => {
                        let due =
                            (d.pulse_ticks > 0).then(|| board.now() + u64::from(d.pulse_ticks));
                        if let Some(p) = self.pulses.get_mut(usize::from(d.line)) {
                            *p = due;
                        }
                        ResultCode::Ok
                    }
                    Err(_) => ResultCode::HardwareFault,
                }
            }
            Message::WriteCalibration(w) => {
                let present =
                    self.channel_mask() & 1u8.checked_shl(u32::from(w.channel)).unwrap_or(0) != 0;
                if self.running {
                    ResultCode::Busy
                } else if !present || !w.scale.is_finite() || !w.offset.is_finite() {
                    ResultCode::InvalidArgument
                } else {
                    let previous = self.calibration;
                    if let Some(c) = self.calibration.get_mut(usize::from(w.channel)) {
                        *c = Calibration {
                            scale: w.scale,
                            offset: w.offset,
                        };
                    }
                    match board.store_calibration(&self.calibration) {
                        Ok(()) => {
                            self.calibration_stored = true;
                            ResultCode::Ok
                        }
                        Err(_) => {
                            self.calibration = previous;
                            ResultCode::StorageFault
                        }
                    }
                }
            }
            Message::ResetCounters { .. } => {
                self.reset_counters(true);
                ResultCode::Ok
            }
            _ => ResultCode::UnknownCommand,
        }
    }

    fn channel_mask(&self) -> u8 {
        channel_mask(&self.desc)
    }

    fn start<B: Board>(&mut self, board: &mut B) -> ResultCode {
        if self.stopping.is_some() {
            return ResultCode::Busy; // the last run's samples are still going out
        }
        if self.running {
            return ResultCode::Ok;
        }
        if self.config.rate_hz == 0 {
            return ResultCode::UnsupportedRate;
        }
        if self.config.mask == 0 {
            return ResultCode::InvalidArgument;
        }
        while self.queues.samples.dequeue().is_some() {}
        let period = match board.start_sampling(self.config.rate_hz) {
            Ok(p) => p,
            Err(ErrorKind::Unsupported) => return ResultCode::UnsupportedRate,
            Err(_) => return ResultCode::HardwareFault,
        };
        self.sample_period_ticks = u64::from(period.max(1)) * u64::from(self.config.averaging);
        self.reset_counters(false);
        self.block.count = 0;
        self.t0 = None;
        self.running = true;
        self.run_start_tick = board.now();
        self.next_status_tick = self.run_start_tick + u64::from(self.desc.tick_hz);
        self.shared.start(self.config.averaging);
        ResultCode::Ok
    }

    /// Start zeroes the sample and edge counters; ResetCounters also the rejected-frame
    /// count and the queue high-water mark (SPEC.md §4.4).
    fn reset_counters(&mut self, all: bool) {
        let s = self.shared;
        let c = &mut self.counters;
        c.produced.reset(&s.produced);
        c.dropped_queue_full.reset(&s.dropped_queue_full);
        c.dropped_adc.reset(&s.dropped_adc);
        c.edges_dropped.reset(&s.edges_dropped);
        c.dropped_link = 0;
        if all {
            c.rejected_base = self.decoder.stats().rejected();
            s.high_water.store(0, Ordering::Relaxed);
        }
    }

    fn transmit<B: Board, L>(&mut self, board: &mut B, link: &mut L) -> Result<(), L::Error>
    where
        L: embedded_io::Write + embedded_io::WriteReady,
    {
        loop {
            if !link.write_ready()? {
                return Ok(());
            }
            if self.tx_pos >= self.tx_len {
                self.now = board.now();
                self.tx_pos = 0;
                self.tx_len = 0;
                let message_built =
                    if let Some((request_id, nonce, rx_tick)) = self.pending_sync.take() {
                        let reply = Message::TimeSyncReply(TimeSyncReply {
                            nonce,
                            rx_tick,
                            tx_tick: board.now(),
                        });
                        let _ = self.slots.push_front(Slot::Result(CommandResult {
                            request_id,
                            command: MessageType::TimeSync as u8,
                            code: ResultCode::Ok,
                        }));
                        self.encode(&reply)
                    } else if let Some(slot) = self.slots.pop_front() {
                        self.encode_slot(&slot)
                    } else {
                        return Ok(());
                    };
                if !message_built {
                    continue;
                }
            }
            let pending = self.tx.get(self.tx_pos..self.tx_len).unwrap_or(&[]);
            let n = link.write(pending)?;
            if n == 0 {
                return Ok(());
            }
            self.tx_pos += n;
        }
    }

    fn encode(&mut self, message: &Message<'_>) -> bool {
        match self.encoder.encode(message, &mut self.tx) {
            Ok(n) => {
                self.tx_len = n;
                true
            }
            Err(_) => false, // a message over its limits is a firmware bug; skip it
        }
    }

    fn encode_slot(&mut self, slot: &Slot) -> bool {
        match slot {
            Slot::Block(b) => {
                let codes = b.codes.get(..b.len).and_then(Codes::from_le_bytes);
                let Some(codes) = codes else { return false };
                let msg = Message::SampleBlock(SampleBlock {
                    first_index: b.first_index,
                    first_tick: b.first_tick,
                    period_ticks: u32::try_from(self.sample_period_ticks).unwrap_or(u32::MAX),
                    channel_mask: self.config.mask,
                    averaging: self.config.averaging,
                    sample_count: b.count,
                    codes,
                });
                self.encode(&msg)
            }
            Slot::Info => {
                let info = self.info();
                self.encode(&Message::DeviceInfo(info))
            }
            Slot::Status => {
                let status = self.status();
                self.encode(&Message::Status(status))
            }
            Slot::Result(r) => self.encode(&Message::CommandResult(*r)),
            Slot::Edge(e) => self.encode(&Message::TriggerEdge(*e)),
            Slot::Log(level, text) => self.encode(&Message::Log(proto::Log {
                level: *level,
                text,
            })),
        }
    }

    fn info(&self) -> DeviceInfo<'static> {
        let d = &self.desc;
        let mut channels = heapless::Vec::new();
        for ch in d.channels {
            let cal = self
                .calibration
                .get(usize::from(ch.index))
                .copied()
                .unwrap_or(ch.default_calibration);
            let _ = channels.push(ChannelInfo {
                index: ch.index,
                quantity: ch.quantity,
                name: ch.name,
                scale: cal.scale,
                offset: cal.offset,
            });
        }
        let mut flags = 0;
        if d.test_signal {
            flags |= proto::FLAG_TEST_SIGNAL;
        }
        if self.calibration_stored {
            flags |= proto::FLAG_CALIBRATION_STORED;
        }
        DeviceInfo {
            firmware_version: d.firmware_version,
            protocol_version: proto::PROTOCOL_VERSION,
            tick_hz: d.tick_hz,
            adc_bits: d.adc_bits,
            flags,
            trigger_inputs: d.trigger_inputs.min(TRIGGER_INPUTS as u8),
            trigger_outputs: d.trigger_outputs.min(TRIGGER_OUTPUTS as u8),
            board: d.board,
            serial: d.serial,
            sample_rates_hz: d.sample_rates_hz.iter().copied().take(8).collect(),
            channels,
        }
    }

    fn status(&mut self) -> Status {
        let s = self.shared;
        let c = &mut self.counters;
        Status {
            uptime_ticks: self.now,
            samples_acquired: c.produced.update(&s.produced),
            dropped_queue_full: c.dropped_queue_full.update(&s.dropped_queue_full),
            dropped_link: c.dropped_link,
            dropped_adc: c.dropped_adc.update(&s.dropped_adc),
            // This frame is numbered next_seq(): frames sent including it.
            frames_sent: self.encoder.next_seq().wrapping_add(1),
            frames_rejected: (self.decoder.stats().rejected() - c.rejected_base) as u32,
            edges_dropped: c.edges_dropped.update(&s.edges_dropped) as u32,
            queue_high_water: s.high_water.load(Ordering::Relaxed) as u16,
            queue_capacity: Q.saturating_sub(1) as u16,
            state: if self.running {
                RunState::Running
            } else {
                RunState::Idle
            },
        }
    }
}

/// The mask of the channels `desc` lists.
fn channel_mask(desc: &Description) -> u8 {
    desc.channels.iter().fold(0u8, |m, c| {
        m | 1u8.checked_shl(u32::from(c.index)).unwrap_or(0)
    })
}

/// Copies a decoded host frame into a [`Command`].
fn to_command(m: &Message<'_>) -> Command {
    let known = match *m {
        Message::GetInfo { request_id } => Message::GetInfo { request_id },
        Message::Configure(c) => Message::Configure(c),
        Message::Start { request_id } => Message::Start { request_id },
        Message::Stop { request_id } => Message::Stop { request_id },
        Message::TimeSync(t) => Message::TimeSync(t),
        Message::DriveTrigger(d) => Message::DriveTrigger(d),
        Message::WriteCalibration(w) => Message::WriteCalibration(w),
        Message::ResetCounters { request_id } => Message::ResetCounters { request_id },
        Message::GetStatus { request_id } => Message::GetStatus { request_id },
        _ => {
            // Not a command: answer UnknownCommand with the payload's first two bytes.
            let mut payload = [0u8; MAX_PAYLOAD];
            let request_id = match m.encode_payload(&mut payload) {
                Ok(n) if n >= 2 => u16::from_le_bytes([payload[0], payload[1]]),
                _ => 0,
            };
            return Command::Unknown {
                msg_type: m.type_byte(),
                request_id,
            };
        }
    };
    Command::Known(known)
}
