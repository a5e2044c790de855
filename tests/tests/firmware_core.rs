//! The firmware core (`railtrace-firmware`) end to end on the host: a fake board with a manual clock, an
//! in-memory link, the real sampler and device, and a host side that speaks the protocol.
//! Every scenario checks what a host relies on: contiguous indices, exact test-signal
//! codes, and every lost sample or frame counted.

use std::collections::VecDeque;
use std::convert::Infallible;

use heapless::spsc::Queue;
use railtrace_firmware::hw::ErrorKind;
use railtrace_firmware::test_signal::{test_code, TestSignal};
use railtrace_firmware::*;
use railtrace_protocol::*;
use railtrace_tests::Rx;

fn last_status(got: &[Rx]) -> Status {
    railtrace_tests::last_status(got).expect("a status")
}

const TICK_HZ: u32 = 84_000_000;
const RATES: &[u32] = &[1_000, 10_000, 100_000];
const CHANNEL_SPECS: &[ChannelSpec] = &[
    ChannelSpec {
        index: 0,
        quantity: Quantity::Current,
        name: "I0",
        default_calibration: Calibration {
            scale: 0.01,
            offset: 0.0,
        },
    },
    ChannelSpec {
        index: 1,
        quantity: Quantity::Voltage,
        name: "V0",
        default_calibration: Calibration {
            scale: 0.001,
            offset: 0.0,
        },
    },
    ChannelSpec {
        index: 2,
        quantity: Quantity::Current,
        name: "I1",
        default_calibration: Calibration {
            scale: 0.01,
            offset: 0.0,
        },
    },
    ChannelSpec {
        index: 3,
        quantity: Quantity::Voltage,
        name: "V1",
        default_calibration: Calibration {
            scale: 0.001,
            offset: 0.0,
        },
    },
];

fn description() -> Description {
    Description {
        board: "test",
        serial: "T-1",
        firmware_version: (0, 1, 0),
        tick_hz: TICK_HZ,
        adc_bits: 16,
        test_signal: true,
        sample_rates_hz: RATES,
        trigger_inputs: 2,
        trigger_outputs: 2,
        channels: CHANNEL_SPECS,
    }
}

#[derive(Default)]
struct FakeBoard {
    now: u64,
    rate_hz: Option<u32>,
    outputs: Vec<(u8, bool, u64)>,
    storage_fails: bool,
    stored: Option<[Calibration; CHANNELS]>,
}

impl Board for FakeBoard {
    fn now(&mut self) -> u64 {
        self.now
    }
    fn start_sampling(&mut self, rate_hz: u32) -> Result<u32, ErrorKind> {
        self.rate_hz = Some(rate_hz);
        Ok(TICK_HZ / rate_hz)
    }
    fn stop_sampling(&mut self) {
        self.rate_hz = None;
    }
    fn set_trigger_output(&mut self, line: u8, high: bool) -> Result<(), ErrorKind> {
        self.outputs.push((line, high, self.now));
        Ok(())
    }
    fn store_calibration(&mut self, c: &[Calibration; CHANNELS]) -> Result<(), ErrorKind> {
        if self.storage_fails {
            return Err(ErrorKind::Storage);
        }
        self.stored = Some(*c);
        Ok(())
    }
}

/// Both directions of a serial link in memory. `budget` bytes may be written per poll
/// (a slow link), unlimited when `None`.
#[derive(Default)]
struct MemLink {
    to_device: VecDeque<u8>,
    from_device: Vec<u8>,
    budget: Option<usize>,
}

impl embedded_io::ErrorType for MemLink {
    type Error = Infallible;
}
impl embedded_io::Read for MemLink {
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        let n = buf.len().min(self.to_device.len());
        for (d, s) in buf.iter_mut().zip(self.to_device.drain(..n)) {
            *d = s;
        }
        Ok(n)
    }
}
impl embedded_io::ReadReady for MemLink {
    fn read_ready(&mut self) -> Result<bool, Infallible> {
        Ok(!self.to_device.is_empty())
    }
}
impl embedded_io::Write for MemLink {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        let n = match &mut self.budget {
            Some(b) => {
                let n = buf.len().min(*b);
                *b -= n;
                n
            }
            None => buf.len(),
        };
        self.from_device.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
}
impl embedded_io::WriteReady for MemLink {
    fn write_ready(&mut self) -> Result<bool, Infallible> {
        Ok(self.budget != Some(0))
    }
}

struct Host {
    decoder: Decoder,
    seq: SeqTracker,
    encoder: FrameEncoder,
    got: Vec<(u32, Rx)>,
}

impl Host {
    fn new() -> Self {
        Host {
            decoder: Decoder::new(),
            seq: SeqTracker::new(),
            encoder: FrameEncoder::new(),
            got: Vec::new(),
        }
    }
    fn send(&mut self, link: &mut MemLink, m: &Message<'_>) {
        let mut out = [0u8; MAX_WIRE_FRAME];
        let n = self.encoder.encode(m, &mut out).unwrap();
        link.to_device.extend(&out[..n]);
    }
    fn receive(&mut self, link: &mut MemLink) {
        let bytes = std::mem::take(&mut link.from_device);
        let mut input = &bytes[..];
        while let Some(r) = self.decoder.next(&mut input) {
            let f = r.expect("the device sends only valid frames");
            self.seq.observe(f.seq);
            let rx = Rx::from_message(&f.message).expect("the device sends device messages");
            self.got.push((f.seq, rx));
        }
    }
    fn take(&mut self) -> Vec<Rx> {
        self.got.drain(..).map(|(_, r)| r).collect()
    }
    fn result_for(got: &[Rx], request_id: u16) -> ResultCode {
        got.iter()
            .find_map(|r| match r {
                Rx::Result(c) if c.request_id == request_id => Some(c.code),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no result for request {request_id} in {got:?}"))
    }
}

/// Runs the board for `ticks` device ticks: the sample interrupt at the sampling rate,
/// the main loop every `poll_every` samples.
macro_rules! rig {
    ($source:expr, |$rig:ident| $body:block) => {
        rig!($source, 64, |$rig| $body)
    };
    ($source:expr, $queue:literal, |$rig:ident| $body:block) => {{
        let shared = Shared::new();
        let mut sq: Queue<Sample, $queue> = Queue::new();
        let mut eq: Queue<Edge, 8> = Queue::new();
        let (sp, sc) = sq.split();
        let (ep, ec) = eq.split();
        let mut $rig = Rig {
            sampler: Sampler::new($source, sp, &shared),
            capture: EdgeCapture::new(ep, &shared),
            device: Device::new(
                description(),
                None,
                &shared,
                Queues {
                    samples: sc,
                    edges: ec,
                },
            ),
            board: FakeBoard::default(),
            link: MemLink::default(),
            host: Host::new(),
            poll_every: 1,
        };
        $body
    }};
}

struct Rig<'a, S: SampleSource, const Q: usize> {
    sampler: Sampler<'a, S, Q>,
    capture: EdgeCapture<'a, 8>,
    device: Device<'a, Q, 8>,
    board: FakeBoard,
    link: MemLink,
    host: Host,
    poll_every: u64,
}

impl<S: SampleSource, const Q: usize> Rig<'_, S, Q> {
    fn poll(&mut self) {
        self.device.poll(&mut self.board, &mut self.link).unwrap();
        self.host.receive(&mut self.link);
    }
    /// Sends a command and polls until its result arrives.
    fn command(&mut self, m: Message<'_>) -> Vec<Rx> {
        self.host.send(&mut self.link, &m);
        let id = match m {
            Message::Unknown { payload, .. } => u16::from_le_bytes([payload[0], payload[1]]),
            _ => m.request_id().unwrap(),
        };
        for _ in 0..100 {
            if let Some(b) = &mut self.link.budget {
                *b += 4096;
            }
            self.poll();
            if self
                .host
                .got
                .iter()
                .any(|(_, r)| matches!(r, Rx::Result(c) if c.request_id == id))
            {
                return self.host.take();
            }
        }
        panic!("no answer to {m:?}");
    }
    fn run_samples(&mut self, samples: u64) {
        let period = u64::from(TICK_HZ / self.board.rate_hz.expect("sampling"));
        for i in 0..samples {
            self.board.now += period;
            self.sampler.on_tick(self.board.now);
            if (i + 1) % self.poll_every == 0 {
                self.poll();
            }
        }
    }
}

fn configure(id: u16, rate: u32, mask: u8, averaging: u16) -> Message<'static> {
    Message::Configure(Configure {
        request_id: id,
        sample_rate_hz: rate,
        channel_mask: mask,
        averaging,
    })
}

fn blocks(got: &[Rx]) -> Vec<(u64, u64, u32, Vec<Vec<i16>>)> {
    got.iter()
        .filter_map(|r| match r {
            Rx::Block {
                first_index,
                first_tick,
                period_ticks,
                codes,
                ..
            } => Some((*first_index, *first_tick, *period_ticks, codes.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn info_configure_stream_and_stop() {
    rig!(TestSignal::new(), |rig| {
        rig.board.now = 1000;
        let got = rig.command(Message::GetInfo { request_id: 1 });
        assert_eq!(got[0], Rx::Log("railtrace firmware ready".into()));
        assert!(
            matches!(&got[1], Rx::Info { flags, channels, .. } if *flags == FLAG_TEST_SIGNAL && channels.len() == 4)
        );
        assert_eq!(Host::result_for(&got, 1), ResultCode::Ok);

        assert_eq!(
            Host::result_for(&rig.command(configure(2, 10_000, 0b0101, 1)), 2),
            ResultCode::Ok
        );
        assert_eq!(
            Host::result_for(&rig.command(Message::Start { request_id: 3 }), 3),
            ResultCode::Ok
        );
        rig.poll_every = 7;
        rig.run_samples(1000);
        let mut got = rig.host.take();
        got.extend(rig.command(Message::Stop { request_id: 4 }));
        // Stop: the last block, then a Status, then the result.
        let n = got.len();
        assert!(matches!(got[n - 3], Rx::Block { .. }));
        assert!(matches!(got[n - 2], Rx::Status(_)));
        assert_eq!(
            got[n - 1],
            Rx::Result(CommandResult {
                request_id: 4,
                command: 0x84,
                code: ResultCode::Ok
            })
        );

        // Every sample arrived, contiguous from 0, with the exact test-signal codes of
        // channels 0 and 2, stamped one period apart.
        let mut next = 0u64;
        let mut t0 = None;
        for (first, tick, period, codes) in blocks(&got) {
            assert_eq!(first, next, "contiguous indices");
            assert_eq!(period, TICK_HZ / 10_000);
            let t0 = *t0.get_or_insert(tick);
            assert_eq!(tick, t0 + first * u64::from(period));
            for (j, s) in codes.iter().enumerate() {
                let n = first + j as u64;
                assert_eq!(s, &vec![test_code(0, n), test_code(2, n)]);
            }
            next += codes.len() as u64;
        }
        assert_eq!(next, 1000);
        let s = last_status(&got);
        assert_eq!(
            (s.samples_acquired, s.dropped_total(), s.state),
            (1000, 0, RunState::Idle)
        );
        // frames_sent counts the Status frame itself; no frame was lost or repeated.
        let status_seq = rig.host.seq.last().unwrap() - 1;
        assert_eq!(s.frames_sent, status_seq + 1);
        assert_eq!((rig.host.seq.lost, rig.host.seq.duplicates), (0, 0));
        assert!(
            s.queue_high_water >= 6 && s.queue_high_water <= 8,
            "{}",
            s.queue_high_water
        );
    });
}

#[test]
fn on_device_averaging_is_the_rounded_mean_of_n_conversions() {
    rig!(TestSignal::new(), |rig| {
        rig.command(configure(1, 100_000, 0b1111, 4));
        rig.command(Message::Start { request_id: 2 });
        rig.run_samples(4 * 300);
        let got = rig.command(Message::Stop { request_id: 3 });
        let mut all = Vec::new();
        for (first, _, period, codes) in blocks(&[rig.host.take(), got].concat()) {
            assert_eq!(period, 4 * TICK_HZ / 100_000);
            assert_eq!(first, all.len() as u64);
            all.extend(codes);
        }
        assert_eq!(all.len(), 300);
        for (k, s) in all.iter().enumerate() {
            for (c, &code) in s.iter().enumerate() {
                let exact: f64 = (0..4)
                    .map(|i| f64::from(test_code(c, 4 * k as u64 + i)))
                    .sum::<f64>()
                    / 4.0;
                assert_eq!(code, exact.round() as i16, "sample {k} channel {c}");
            }
        }
    });
}

#[test]
fn a_slow_link_drops_whole_blocks_counted_and_visible_as_gaps() {
    rig!(TestSignal::new(), |rig| {
        rig.command(configure(1, 100_000, 0xF, 1));
        rig.command(Message::Start { request_id: 2 });
        // About 6 bytes a sample get through; a sample of 4 channels needs about 8.
        rig.link.budget = Some(0);
        rig.poll_every = 10;
        // Long enough that the backlog outgrows the transmit slots and half the queue
        // (Stop itself lets the last blocks out as the link takes them).
        for _ in 0..600 {
            rig.link.budget = Some(60);
            rig.run_samples(10);
        }
        rig.link.budget = None;
        let mut got = rig.host.take();
        got.extend(rig.command(Message::Stop { request_id: 3 }));
        let s = last_status(&got);
        assert!(s.dropped_link > 0, "the link was too slow: {s:?}");
        let mut received = 0u64;
        let mut gaps = 0u64;
        let mut next = 0u64;
        for (first, _, _, codes) in blocks(&got) {
            gaps += first - next;
            for (j, c) in codes.iter().enumerate() {
                assert_eq!(c[3], test_code(3, first + j as u64));
            }
            received += codes.len() as u64;
            next = first + codes.len() as u64;
        }
        assert_eq!(s.samples_acquired, 6000);
        assert_eq!(received + s.dropped_total(), s.samples_acquired);
        assert_eq!(gaps + (s.samples_acquired - next), s.dropped_total());
        assert_eq!(rig.host.seq.lost, 0, "control frames are never lost");
    });
}

#[test]
fn a_stalled_main_loop_overflows_the_queue_counted() {
    rig!(TestSignal::new(), |rig| {
        rig.command(configure(1, 10_000, 0x1, 1));
        rig.command(Message::Start { request_id: 2 });
        rig.poll_every = 500; // the queue holds 63
        rig.run_samples(1000);
        let mut got = rig.host.take();
        got.extend(rig.command(Message::Stop { request_id: 3 }));
        let s = last_status(&got);
        let received: u64 = blocks(&got).iter().map(|b| b.3.len() as u64).sum();
        assert_eq!(s.dropped_queue_full, 1000 - 2 * 63);
        assert_eq!(received, 2 * 63);
        assert_eq!(s.queue_high_water, 63);
        assert_eq!(s.queue_capacity, 63);
    });
}

struct FailsEvery(u64, TestSignal);
impl SampleSource for FailsEvery {
    type Error = ErrorKind;
    fn convert(&mut self) -> Result<[i16; CHANNELS], ErrorKind> {
        let codes = self.1.convert()?;
        if self.1.conversions() % self.0 == 0 {
            Err(ErrorKind::Timeout)
        } else {
            Ok(codes)
        }
    }
}

#[test]
fn failed_conversions_are_dropped_counted_as_adc_errors() {
    rig!(FailsEvery(10, TestSignal::new()), |rig| {
        rig.command(configure(1, 1_000, 0x3, 1));
        rig.command(Message::Start { request_id: 2 });
        rig.run_samples(100);
        let mut got = rig.host.take();
        got.extend(rig.command(Message::Stop { request_id: 3 }));
        let s = last_status(&got);
        assert_eq!((s.samples_acquired, s.dropped_adc), (100, 10));
        let indices: Vec<u64> = blocks(&got)
            .iter()
            .flat_map(|(f, _, _, c)| (0..c.len() as u64).map(move |j| f + j))
            .collect();
        assert_eq!(indices.len(), 90);
        assert!(
            indices.iter().all(|i| (i + 1) % 10 != 0),
            "conversions 10, 20, ... are missing"
        );
    });
}

#[test]
fn time_sync_reply_is_stamped_on_receipt_and_send_then_acknowledged() {
    rig!(TestSignal::new(), |rig| {
        rig.board.now = 5_000;
        rig.host.send(
            &mut rig.link,
            &Message::TimeSync(TimeSyncRequest {
                request_id: 9,
                nonce: 77,
            }),
        );
        rig.device.poll(&mut rig.board, &mut rig.link).unwrap();
        rig.host.receive(&mut rig.link);
        let got = rig.host.take();
        let sync = got
            .iter()
            .find_map(|r| match r {
                Rx::Sync(t) => Some(*t),
                _ => None,
            })
            .unwrap();
        assert_eq!((sync.nonce, sync.rx_tick, sync.tx_tick), (77, 5_000, 5_000));
        let pos_sync = got.iter().position(|r| matches!(r, Rx::Sync(_))).unwrap();
        let pos_res = got.iter().position(|r| matches!(r, Rx::Result(_))).unwrap();
        assert_eq!(pos_res, pos_sync + 1, "the result follows the reply");
        assert_eq!(rig.host.seq.lost + rig.host.seq.restarts, 0);
    });
}

#[test]
fn trigger_edges_carry_their_sample_index_and_outputs_pulse() {
    rig!(TestSignal::new(), |rig| {
        rig.command(configure(1, 10_000, 0x1, 1));
        rig.command(Message::Start { request_id: 2 });
        rig.run_samples(10);
        let period = u64::from(TICK_HZ / 10_000);
        let t0 = blocks(&rig.host.got.iter().map(|g| g.1.clone()).collect::<Vec<_>>())
            .first()
            .map(|b| b.1)
            .unwrap_or(rig.board.now - 9 * period);
        let edge_tick = t0 + 5 * period + period / 2;
        rig.capture.on_edge(1, true, edge_tick);
        rig.run_samples(5);
        let got = rig.host.take();
        let e = got
            .iter()
            .find_map(|r| match r {
                Rx::Edge(e) => Some(*e),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            (e.line, e.rising, e.edge_count, e.tick, e.sample_index),
            (1, true, 1, edge_tick, 5)
        );

        // A 1000-tick pulse on output 0: the first edge before the result, the second later.
        let got = rig.command(Message::DriveTrigger(DriveTrigger {
            request_id: 5,
            line: 0,
            high: true,
            pulse_ticks: 1000,
        }));
        let up = got
            .iter()
            .find_map(|r| match r {
                Rx::Edge(e) => Some(*e),
                _ => None,
            })
            .unwrap();
        assert_eq!((up.line, up.rising, up.edge_count), (OUTPUT_LINE, true, 1));
        assert_eq!(Host::result_for(&got, 5), ResultCode::Ok);
        rig.run_samples(2);
        let down = rig
            .host
            .take()
            .into_iter()
            .find_map(|r| match r {
                Rx::Edge(e) => Some(e),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            (down.line, down.rising, down.edge_count),
            (OUTPUT_LINE, false, 2)
        );
        assert!(down.tick >= up.tick + 1000);
        assert_eq!(
            rig.board
                .outputs
                .iter()
                .map(|o| (o.0, o.1))
                .collect::<Vec<_>>(),
            vec![(0, true), (0, false)]
        );
        let bad = rig.command(Message::DriveTrigger(DriveTrigger {
            request_id: 6,
            line: 2,
            high: true,
            pulse_ticks: 0,
        }));
        assert_eq!(Host::result_for(&bad, 6), ResultCode::InvalidArgument);
    });
}

#[test]
fn bad_commands_get_clear_answers_and_corrupt_frames_are_counted() {
    rig!(TestSignal::new(), |rig| {
        assert_eq!(
            Host::result_for(&rig.command(configure(1, 12_345, 1, 1)), 1),
            ResultCode::UnsupportedRate
        );
        assert_eq!(
            Host::result_for(&rig.command(configure(2, 1_000, 0, 1)), 2),
            ResultCode::InvalidArgument
        );
        assert_eq!(
            Host::result_for(&rig.command(configure(3, 1_000, 0x10, 1)), 3),
            ResultCode::InvalidArgument
        );
        assert_eq!(
            Host::result_for(&rig.command(configure(4, 1_000, 1, 0)), 4),
            ResultCode::InvalidArgument
        );
        rig.command(Message::Start { request_id: 5 });
        assert_eq!(
            Host::result_for(&rig.command(configure(6, 1_000, 1, 1)), 6),
            ResultCode::Busy
        );
        // An unknown command type and a device-only message are answered UnknownCommand.
        let got = rig.command(Message::Unknown {
            msg_type: 0x8F,
            payload: &[7, 0, 1],
        });
        assert_eq!(
            got.last(),
            Some(&Rx::Result(CommandResult {
                request_id: 7,
                command: 0x8F,
                code: ResultCode::UnknownCommand
            }))
        );
        // A Start with a byte too many is malformed: InvalidArgument, request id kept.
        let mut raw = vec![1u8, 0x83, 0, 0, 0, 0, 8, 0, 0];
        raw.extend(crc32c(&raw).to_le_bytes());
        let mut wire = vec![0; 32];
        let n = cobs::encode(&raw, &mut wire).unwrap();
        wire.truncate(n);
        wire.push(0);
        rig.link.to_device.extend(&wire);
        // A corrupted frame is not answered, only counted.
        let mut bad = encode_frame_vec(99, &Message::GetStatus { request_id: 10 }).unwrap();
        bad[3] ^= 0x40;
        rig.link.to_device.extend(&bad);
        let got = rig.command(Message::GetStatus { request_id: 11 });
        assert_eq!(Host::result_for(&got, 8), ResultCode::InvalidArgument);
        assert!(got
            .iter()
            .all(|r| !matches!(r, Rx::Result(c) if c.request_id == 10)));
        // Rejected: the malformed Start and the corrupted frame (SPEC.md §4.4).
        assert_eq!(last_status(&got).frames_rejected, 2);
        rig.command(Message::ResetCounters { request_id: 12 });
        assert_eq!(
            last_status(&rig.command(Message::GetStatus { request_id: 13 })).frames_rejected,
            0
        );
    });
}

#[test]
fn calibration_is_stored_and_reported_or_the_old_one_kept() {
    rig!(TestSignal::new(), |rig| {
        let write = |id, scale| {
            Message::WriteCalibration(WriteCalibration {
                request_id: id,
                channel: 2,
                scale,
                offset: -0.25,
            })
        };
        assert_eq!(
            Host::result_for(&rig.command(write(1, 0.02)), 1),
            ResultCode::Ok
        );
        assert_eq!(
            rig.board.stored.unwrap()[2],
            Calibration {
                scale: 0.02,
                offset: -0.25
            }
        );
        let got = rig.command(Message::GetInfo { request_id: 2 });
        let info = got.iter().find(|r| matches!(r, Rx::Info { .. })).unwrap();
        let Rx::Info {
            flags, channels, ..
        } = info
        else {
            unreachable!()
        };
        assert_eq!(flags & FLAG_CALIBRATION_STORED, FLAG_CALIBRATION_STORED);
        assert_eq!(channels[2], (2, 0.02, -0.25));
        rig.board.storage_fails = true;
        assert_eq!(
            Host::result_for(&rig.command(write(3, 5.0)), 3),
            ResultCode::StorageFault
        );
        let got = rig.command(Message::GetInfo { request_id: 4 });
        let Some(Rx::Info { channels, .. }) = got.iter().find(|r| matches!(r, Rx::Info { .. }))
        else {
            panic!()
        };
        assert_eq!(
            channels[2],
            (2, 0.02, -0.25),
            "the failed write changed nothing"
        );
        let nan = Message::WriteCalibration(WriteCalibration {
            request_id: 5,
            channel: 2,
            scale: f32::NAN,
            offset: 0.0,
        });
        assert_eq!(
            Host::result_for(&rig.command(nan), 5),
            ResultCode::InvalidArgument
        );
        let absent = Message::WriteCalibration(WriteCalibration {
            request_id: 6,
            channel: 7,
            scale: 1.0,
            offset: 0.0,
        });
        assert_eq!(
            Host::result_for(&rig.command(absent), 6),
            ResultCode::InvalidArgument
        );
    });
}

#[test]
fn an_overloaded_device_still_answers_commands_and_reports_edges() {
    // The main loop is too slow for the samples: each poll finds more than the transmit
    // slots can take (5 blocks of 62 samples) and an edge. Commands, edges and status
    // come first; the blocks that do not fit are dropped, counted.
    rig!(TestSignal::new(), 512, |rig| {
        rig.command(configure(1, 100_000, 0xFF, 1));
        rig.command(Message::Start { request_id: 2 });
        rig.poll_every = 400;
        let mut edges_raised = 0u64;
        let mut send_at = 3;
        let mut answered = 0;
        for i in 0..20u64 {
            for _ in 0..400 {
                rig.board.now += 840;
                rig.sampler.on_tick(rig.board.now);
            }
            let t = rig.board.now;
            rig.capture.on_edge(1, i % 2 == 0, t);
            edges_raised += 1;
            if i == send_at {
                rig.host
                    .send(&mut rig.link, &Message::GetStatus { request_id: 3 });
                send_at = u64::MAX;
            }
            rig.poll();
            if rig
                .host
                .got
                .iter()
                .any(|(_, r)| matches!(r, Rx::Result(c) if c.request_id == 3))
            {
                answered += 1;
            }
        }
        assert!(answered > 0, "GetStatus answered while overloaded");
        let got = rig.command(Message::Stop { request_id: 4 });
        let all: Vec<Rx> = [rig.host.take(), got].concat();
        let s = last_status(&all);
        assert!(s.dropped_total() > 0, "{s:?}");
        let edges = all.iter().filter(|r| matches!(r, Rx::Edge(_))).count() as u64;
        assert_eq!(edges + u64::from(s.edges_dropped), edges_raised);
        assert_eq!(edges, edges_raised, "edges take slots before sample blocks");
    });
}

#[test]
fn stop_sends_the_runs_last_blocks_as_the_link_takes_them() {
    rig!(TestSignal::new(), |rig| {
        rig.command(configure(1, 100_000, 0xFF, 1));
        rig.command(Message::Start { request_id: 2 });
        // A burst the stalled link has not sent when Stop arrives: four full blocks wait
        // in the transmit slots and the rest in the queue. Once the link moves again,
        // they all go out before Stop's answer (a Stop that forced the last block out at
        // once would drop what found no slot).
        rig.link.budget = Some(0);
        rig.poll_every = 10;
        rig.run_samples(250);
        let mut got = rig.host.take();
        got.extend(rig.command(Message::Stop { request_id: 3 }));
        let s = last_status(&got);
        let received: u64 = blocks(&got).iter().map(|b| b.3.len() as u64).sum();
        assert_eq!((s.samples_acquired, s.dropped_total()), (250, 0), "{s:?}");
        assert_eq!(received, 250);
        // Stop's answer comes after the run's last block and its status.
        let result = got
            .iter()
            .position(|r| matches!(r, Rx::Result(c) if c.request_id == 3))
            .unwrap();
        assert!(got[..result].iter().any(|r| matches!(r, Rx::Status(_))));
    });
}
