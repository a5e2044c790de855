//! Round trips and stream robustness, against the properties users depend on: every
//! message survives encode → decode unchanged, and a damaged stream loses only the frames
//! the damage touched, with the loss counted exactly.
use proptest::prelude::*;
use railtrace_protocol::*;

/// Strings and code buffers are leaked so generated messages can be `'static`
/// (bounded by the number of proptest cases).
fn leak_str(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn arb_str(max: usize) -> impl Strategy<Value = &'static str> {
    proptest::collection::vec(any::<char>(), 0..max)
        .prop_map(move |cs| {
            let mut s = String::new();
            for c in cs {
                if s.len() + c.len_utf8() <= max {
                    s.push(c);
                }
            }
            s
        })
        .prop_map(leak_str)
}

fn arb_info() -> impl Strategy<Value = Message<'static>> {
    let channel = (
        0u8..8,
        0u8..4,
        arb_str(MAX_CHANNEL_NAME_LEN),
        any::<f32>(),
        any::<f32>(),
    )
        .prop_filter("NaN never equals itself", |c| {
            !c.3.is_nan() && !c.4.is_nan()
        })
        .prop_map(|(index, q, name, scale, offset)| ChannelInfo {
            index,
            quantity: match q {
                0 => Quantity::Voltage,
                1 => Quantity::Current,
                x => Quantity::Other(x),
            },
            name,
            scale,
            offset,
        });
    (
        any::<(u8, u8, u8, u8, u32, u8, u8, u8, u8)>(),
        arb_str(MAX_ID_LEN),
        arb_str(MAX_ID_LEN),
        proptest::collection::vec(any::<u32>(), 0..=MAX_SAMPLE_RATES),
        proptest::collection::vec(channel, 0..=MAX_CHANNELS),
    )
        .prop_map(|(h, board, serial, rates, channels)| {
            Message::DeviceInfo(DeviceInfo {
                firmware_version: (h.0, h.1, h.2),
                protocol_version: h.3,
                tick_hz: h.4,
                adc_bits: h.5,
                flags: h.6,
                trigger_inputs: h.7,
                trigger_outputs: h.8,
                board,
                serial,
                sample_rates_hz: heapless::Vec::from_slice(&rates).unwrap(),
                channels: heapless::Vec::from_slice(&channels).unwrap(),
            })
        })
}

fn arb_block() -> impl Strategy<Value = Message<'static>> {
    (any::<u64>(), any::<u64>(), any::<u32>(), 1u8..=255, 1u16..)
        .prop_flat_map(|(i, t, p, mask, avg)| {
            let ch = mask.count_ones() as usize;
            proptest::collection::vec(any::<i16>(), 0..=max_block_samples(ch))
                .prop_map(move |s| (i, t, p, mask, avg, s))
        })
        .prop_map(
            |(first_index, first_tick, period_ticks, channel_mask, averaging, s)| {
                let ch = channel_mask.count_ones() as usize;
                let n = s.len() / ch;
                let bytes: Vec<u8> = s[..n * ch].iter().flat_map(|c| c.to_le_bytes()).collect();
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                Message::SampleBlock(SampleBlock {
                    first_index,
                    first_tick,
                    period_ticks,
                    channel_mask,
                    averaging,
                    sample_count: n as u16,
                    codes: Codes::from_le_bytes(bytes).unwrap(),
                })
            },
        )
}

fn arb_message() -> impl Strategy<Value = Message<'static>> {
    prop_oneof![
        arb_info(),
        arb_block(),
        any::<(u8, bool, u32, u64, u64)>().prop_map(
            |(line, rising, edge_count, tick, sample_index)| {
                Message::TriggerEdge(TriggerEdge {
                    line,
                    rising,
                    edge_count,
                    tick,
                    sample_index,
                })
            }
        ),
        (
            any::<[u64; 5]>(),
            any::<[u32; 3]>(),
            any::<[u16; 2]>(),
            any::<u8>()
        )
            .prop_map(|(a, b, c, s)| {
                Message::Status(Status {
                    uptime_ticks: a[0],
                    samples_acquired: a[1],
                    dropped_queue_full: a[2],
                    dropped_link: a[3],
                    dropped_adc: a[4],
                    frames_sent: b[0],
                    frames_rejected: b[1],
                    edges_dropped: b[2],
                    queue_high_water: c[0],
                    queue_capacity: c[1],
                    state: match s {
                        0 => RunState::Idle,
                        1 => RunState::Running,
                        x => RunState::Other(x),
                    },
                })
            }),
        any::<(u32, u64, u64)>().prop_map(|(nonce, rx_tick, tx_tick)| {
            Message::TimeSyncReply(TimeSyncReply {
                nonce,
                rx_tick,
                tx_tick,
            })
        }),
        any::<(u16, u8, u8)>().prop_map(|(request_id, command, code)| {
            let code = match code % 8 {
                0 => ResultCode::Ok,
                1 => ResultCode::UnknownCommand,
                2 => ResultCode::InvalidArgument,
                3 => ResultCode::Busy,
                4 => ResultCode::UnsupportedRate,
                5 => ResultCode::HardwareFault,
                6 => ResultCode::StorageFault,
                _ => ResultCode::Other(code.max(7)),
            };
            Message::CommandResult(CommandResult {
                request_id,
                command,
                code,
            })
        }),
        (0u8..4, arb_str(MAX_PAYLOAD - 1)).prop_map(|(l, text)| Message::Log(Log {
            level: [
                LogLevel::Error,
                LogLevel::Warn,
                LogLevel::Info,
                LogLevel::Debug
            ][l as usize],
            text
        })),
        any::<u16>().prop_map(|request_id| Message::GetInfo { request_id }),
        any::<(u16, u32, u8, u16)>().prop_map(
            |(request_id, sample_rate_hz, channel_mask, averaging)| {
                Message::Configure(Configure {
                    request_id,
                    sample_rate_hz,
                    channel_mask,
                    averaging,
                })
            }
        ),
        any::<u16>().prop_map(|request_id| Message::Start { request_id }),
        any::<u16>().prop_map(|request_id| Message::Stop { request_id }),
        any::<(u16, u32)>().prop_map(|(request_id, nonce)| Message::TimeSync(TimeSyncRequest {
            request_id,
            nonce
        })),
        any::<(u16, u8, bool, u32)>().prop_map(|(request_id, line, high, pulse_ticks)| {
            Message::DriveTrigger(DriveTrigger {
                request_id,
                line,
                high,
                pulse_ticks,
            })
        }),
        (any::<(u16, u8)>(), -1e6f32..1e6, -1e6f32..1e6).prop_map(
            |((request_id, channel), scale, offset)| {
                Message::WriteCalibration(WriteCalibration {
                    request_id,
                    channel,
                    scale,
                    offset,
                })
            }
        ),
        any::<u16>().prop_map(|request_id| Message::ResetCounters { request_id }),
        any::<u16>().prop_map(|request_id| Message::GetStatus { request_id }),
        (
            (0x08u8..0x80),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(msg_type, p)| {
                Message::Unknown {
                    msg_type,
                    payload: Box::leak(p.into_boxed_slice()),
                }
            }),
    ]
}

/// Decodes `wire` fed in pieces of the given sizes (cycled), collecting frames and errors.
fn decode_chunked(
    wire: &[u8],
    sizes: &[usize],
) -> (
    Vec<(u32, Message<'static>)>,
    Vec<FrameError>,
    DecodeStats,
    usize,
) {
    let mut dec = Decoder::<MAX_ENCODED_FRAME>::new();
    let (mut frames, mut errors) = (Vec::new(), Vec::new());
    let mut pos = 0;
    for &size in sizes.iter().cycle() {
        if pos >= wire.len() {
            break;
        }
        let end = (pos + size.max(1)).min(wire.len());
        let mut input = &wire[pos..end];
        pos = end;
        while let Some(r) = dec.next(&mut input) {
            match r {
                Ok(f) => frames.push((f.seq, own(f.message))),
                Err(e) => errors.push(e),
            }
        }
    }
    (frames, errors, dec.stats(), dec.pending())
}

/// A decoded message borrows the decoder's buffer; re-encode and decode it against a
/// leaked copy so the test can keep it.
fn own(m: Message<'_>) -> Message<'static> {
    let wire: &'static [u8] = Box::leak(encode_frame_vec(0, &m).unwrap().into_boxed_slice());
    let raw: &'static mut [u8] = Box::leak(wire[..wire.len() - 1].to_vec().into_boxed_slice());
    let n = cobs::decode_in_place(raw).unwrap();
    let raw: &'static [u8] = &raw[..n];
    // Re-run through a fresh decoder whose buffer we leak.
    let dec: &'static mut Decoder<MAX_ENCODED_FRAME> = Box::leak(Box::new(Decoder::new()));
    let mut input = wire;
    let msg = dec.next(&mut input).unwrap().unwrap().message;
    assert!(raw.len() >= HEADER_LEN + CRC_LEN);
    msg
}

fn stream(msgs: &[Message<'static>]) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
    let mut wire = Vec::new();
    let mut ranges = Vec::new();
    for (seq, m) in msgs.iter().enumerate() {
        let start = wire.len();
        wire.extend(encode_frame_vec(seq as u32, m).unwrap());
        ranges.push(start..wire.len());
    }
    (wire, ranges)
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Flip(u8),
    Drop,
    Insert(u8),
}

fn arb_damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (1u8..=255).prop_map(Damage::Flip),
        Just(Damage::Drop),
        any::<u8>().prop_map(Damage::Insert),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_message_round_trips(msg in arb_message(), seq in any::<u32>(), sizes in proptest::collection::vec(1usize..64, 1..8)) {
        let wire = encode_frame_vec(seq, &msg).unwrap();
        prop_assert!(wire.len() <= MAX_WIRE_FRAME);
        prop_assert_eq!(wire.iter().filter(|&&b| b == 0).count(), 1);
        let (frames, errors, stats, pending) = decode_chunked(&wire, &sizes);
        prop_assert!(errors.is_empty(), "{:?}", errors);
        prop_assert_eq!(frames, vec![(seq, msg)]);
        prop_assert_eq!((stats.frames, stats.rejected(), pending), (1, 0, 0));
    }

    #[test]
    fn one_damaged_byte_loses_only_the_frames_it_touched(
        msgs in proptest::collection::vec(arb_message(), 3..40),
        at in any::<proptest::sample::Index>(),
        damage in arb_damage(),
        sizes in proptest::collection::vec(1usize..2048, 1..6),
    ) {
        let (mut wire, ranges) = stream(&msgs);
        // Damage anywhere but the last frame and the delimiter before it, so every loss is
        // followed by a clean frame whose sequence number reveals it.
        let last = ranges.len() - 1;
        let pos = at.index(ranges[last].start - 1);
        let k = ranges.iter().position(|r| r.contains(&pos)).unwrap();
        let is_delimiter = pos == ranges[k].end - 1;
        let touched: Vec<usize> = match damage {
            Damage::Flip(x) => {
                wire[pos] ^= x;
                if is_delimiter { vec![k, k + 1] } else { vec![k] }
            }
            Damage::Drop => {
                wire.remove(pos);
                if is_delimiter { vec![k, k + 1] } else { vec![k] }
            }
            Damage::Insert(b) => {
                wire.insert(pos, b);
                vec![k]
            }
        };
        let (frames, errors, stats, pending) = decode_chunked(&wire, &sizes);

        // Every frame not touched is decoded, in order and intact.
        let expected: Vec<(u32, Message<'static>)> = msgs
            .iter()
            .enumerate()
            .filter(|(i, _)| !touched.contains(i))
            .map(|(i, m)| (i as u32, m.clone()))
            .collect();
        // A zero inserted at a frame's start or next to its delimiter only adds an empty
        // frame and touches nothing.
        let harmless_insert = matches!(damage, Damage::Insert(0))
            && (pos == ranges[k].start || pos == ranges[k].end - 1);
        if harmless_insert {
            let all: Vec<_> = msgs.iter().cloned().enumerate().map(|(i, m)| (i as u32, m)).collect();
            prop_assert_eq!(&frames, &all);
            prop_assert_eq!(stats.rejected(), 0);
            return Ok(());
        }
        prop_assert_eq!(&frames, &expected);

        // The loss is counted exactly by the sequence numbers...
        let mut seq = SeqTracker::new();
        for (s, _) in &frames {
            seq.observe(*s);
        }
        // (Nothing precedes frame 0 to reveal its loss: the first frame decoded shows it.)
        let lost_at_start = if touched.contains(&0) { touched.len() as u64 } else { 0 };
        prop_assert_eq!(seq.lost + lost_at_start, touched.len() as u64);
        if let (true, Some((first, _))) = (lost_at_start > 0, frames.first()) {
            prop_assert_eq!(u64::from(*first), lost_at_start);
        }
        prop_assert_eq!((seq.duplicates, seq.restarts), (0, 0));
        // ...and the decoder rejected one or two pieces (two when a zero split a frame),
        // each counted under exactly one reason.
        prop_assert!((1..=2).contains(&errors.len()), "{:?}", errors);
        prop_assert_eq!(stats.rejected(), errors.len() as u64);
        // Every byte fed is accounted for.
        prop_assert_eq!(
            stats.bytes_accepted + stats.bytes_rejected + stats.delimiters + pending as u64,
            wire.len() as u64
        );
    }
}

#[test]
fn gaps_and_duplicates_are_counted_exactly() {
    let msgs: Vec<Message<'static>> = (0..10).map(|i| Message::Start { request_id: i }).collect();
    let (wire, ranges) = stream(&msgs);
    // Drop frames 3 and 4 whole, repeat frame 7.
    let mut damaged = Vec::new();
    for (i, r) in ranges.iter().enumerate() {
        if i == 3 || i == 4 {
            continue;
        }
        damaged.extend_from_slice(&wire[r.clone()]);
        if i == 7 {
            damaged.extend_from_slice(&wire[r.clone()]);
        }
    }
    let (frames, errors, _, _) = decode_chunked(&damaged, &[7]);
    assert!(errors.is_empty());
    let mut t = SeqTracker::new();
    let events: Vec<SeqEvent> = frames.iter().map(|(s, _)| t.observe(*s)).collect();
    assert_eq!(events[3], SeqEvent::Gap { lost: 2 });
    assert_eq!(events[6], SeqEvent::Duplicate);
    assert_eq!((t.lost, t.duplicates, t.received, t.restarts), (2, 1, 8, 0));
}

#[test]
fn sequence_numbers_wrap_and_restarts_are_seen() {
    let mut t = SeqTracker::new();
    assert_eq!(t.observe(u32::MAX - 1), SeqEvent::First);
    assert_eq!(t.observe(u32::MAX), SeqEvent::InOrder);
    assert_eq!(t.observe(0), SeqEvent::InOrder);
    assert_eq!(t.observe(3), SeqEvent::Gap { lost: 2 });
    // The device reset: numbering starts again at 0.
    assert_eq!(t.observe(0), SeqEvent::Restart { expected: 4 });
    assert_eq!(t.observe(1), SeqEvent::InOrder);
    assert_eq!((t.lost, t.restarts), (2, 1));
}

fn raw_frame(version: u8, msg_type: u8, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut raw = vec![version, msg_type];
    raw.extend(seq.to_le_bytes());
    raw.extend(payload);
    raw.extend(crc32c(&raw).to_le_bytes());
    let mut out = vec![0; cobs::max_encoded_len(raw.len()) + 1];
    let n = cobs::encode(&raw, &mut out).unwrap();
    out.truncate(n);
    out.push(0);
    out
}

#[test]
fn newer_version_is_reported_with_both_versions() {
    let wire = raw_frame(2, 0x01, 5, &[1, 2, 3]);
    let (frames, errors, stats, _) = decode_chunked(&wire, &[100]);
    assert!(frames.is_empty());
    assert_eq!(
        errors,
        vec![FrameError::UnsupportedVersion {
            found: 2,
            supported: 1,
            seq: 5
        }]
    );
    assert_eq!(
        errors[0].to_string(),
        "peer speaks protocol version 2; this build speaks version 1"
    );
    assert_eq!(stats.bad_version, 1);
}

#[test]
fn unknown_types_are_skipped_and_malformed_payloads_rejected() {
    let mut wire = raw_frame(1, 0x55, 0, &[9, 9]);
    wire.extend(raw_frame(1, MessageType::Start as u8, 1, &[3, 0, 0])); // one byte too many
    wire.extend(raw_frame(1, MessageType::TriggerEdge as u8, 2, &[0; 22])); // valid
    let mut edge = vec![0u8; 22];
    edge[1] = 7; // polarity must be 0 or 1
    wire.extend(raw_frame(1, MessageType::TriggerEdge as u8, 3, &edge));
    let (frames, errors, stats, _) = decode_chunked(&wire, &[3]);
    assert_eq!(frames.len(), 2);
    assert!(matches!(
        frames[0].1,
        Message::Unknown {
            msg_type: 0x55,
            payload: [9, 9]
        }
    ));
    assert!(matches!(frames[1].1, Message::TriggerEdge(_)));
    assert_eq!(
        errors,
        vec![
            FrameError::Malformed {
                msg_type: 0x83,
                seq: 1,
                len: 3,
                request_id: Some(3),
            },
            FrameError::Malformed {
                msg_type: 0x03,
                seq: 3,
                len: 22,
                request_id: Some(0x0700), // the payload's first two bytes
            },
        ]
    );
    assert_eq!((stats.unknown_type, stats.malformed), (1, 2));
}

#[test]
fn garbage_and_oversized_runs_resynchronise_at_the_next_delimiter() {
    let good = encode_frame_vec(9, &Message::GetStatus { request_id: 1 }).unwrap();
    let mut wire = vec![0u8]; // a leading delimiter is idle fill
    wire.extend(std::iter::repeat_n(0xAA, 5000)); // no delimiter for 5000 bytes
    wire.push(0);
    wire.extend([1, 2, 3, 0]); // short garbage
    wire.extend(&good);
    let mut dec = Decoder::<MAX_ENCODED_FRAME>::new();
    let mut errors = Vec::new();
    let mut got = Vec::new();
    for piece in wire.chunks(333) {
        let mut input = piece;
        while let Some(r) = dec.next(&mut input) {
            match r {
                Ok(f) => got.push(f.seq),
                Err(e) => errors.push(e),
            }
        }
        assert!(dec.pending() <= 5000);
    }
    assert_eq!(got, vec![9]);
    assert_eq!(
        errors,
        vec![
            FrameError::Oversized {
                len: 5000,
                max: MAX_ENCODED_FRAME
            },
            FrameError::TooShort { len: 2 }, // COBS `01 02 03` decodes to `00 03`
        ]
    );
    let s = dec.stats();
    assert_eq!((s.oversized, s.too_short, s.frames), (1, 1, 1));
    assert_eq!(s.bytes_rejected, 5003);
}

#[test]
fn encoding_checks_every_limit() {
    let long = "x".repeat(MAX_ID_LEN + 1);
    let info = Message::DeviceInfo(DeviceInfo {
        firmware_version: (0, 0, 0),
        protocol_version: 1,
        tick_hz: 1,
        adc_bits: 16,
        flags: 0,
        trigger_inputs: 0,
        trigger_outputs: 0,
        board: &long,
        serial: "",
        sample_rates_hz: heapless::Vec::new(),
        channels: heapless::Vec::new(),
    });
    assert_eq!(encode_frame_vec(0, &info), Err(EncodeError::InvalidMessage));
    let codes = [0u8; 6];
    let mismatched = Message::SampleBlock(SampleBlock {
        first_index: 0,
        first_tick: 0,
        period_ticks: 1,
        channel_mask: 0b11,
        averaging: 1,
        sample_count: 2, // needs 4 codes, has 3
        codes: Codes::from_le_bytes(&codes).unwrap(),
    });
    assert_eq!(
        encode_frame_vec(0, &mismatched),
        Err(EncodeError::InvalidMessage)
    );
    let text = "y".repeat(MAX_PAYLOAD);
    let log = Message::Log(Log {
        level: LogLevel::Info,
        text: &text,
    });
    assert_eq!(encode_frame_vec(0, &log), Err(EncodeError::InvalidMessage));
    let mut small = [0u8; 8];
    assert_eq!(
        encode_frame(0, &Message::Start { request_id: 0 }, &mut small),
        Err(EncodeError::BufferTooShort)
    );
    // The largest block fits the largest wire frame.
    let full = vec![0u8; 2 * 8 * max_block_samples(8)];
    let block = Message::SampleBlock(SampleBlock {
        first_index: 0,
        first_tick: 0,
        period_ticks: 1,
        channel_mask: 0xFF,
        averaging: 1,
        sample_count: max_block_samples(8) as u16,
        codes: Codes::from_le_bytes(&full).unwrap(),
    });
    let mut out = [0u8; MAX_WIRE_FRAME];
    assert!(encode_frame(0, &block, &mut out).unwrap() <= MAX_WIRE_FRAME);
}

#[test]
fn frame_encoder_counts_only_frames_it_wrote() {
    let mut enc = FrameEncoder::new();
    let mut out = [0u8; MAX_WIRE_FRAME];
    enc.encode(&Message::Start { request_id: 1 }, &mut out)
        .unwrap();
    let bad = "z".repeat(MAX_PAYLOAD);
    assert!(enc
        .encode(
            &Message::Log(Log {
                level: LogLevel::Debug,
                text: &bad
            }),
            &mut out
        )
        .is_err());
    assert_eq!(enc.next_seq(), 1);
}
