//! Pins the test vectors of SPEC.md §7 byte for byte: every row of its table is encoded
//! from the message written here and must give exactly the hex in SPEC.md, and the hex
//! must decode back to the same message. A change to either side fails this test.
use railtrace_protocol::*;

fn vectors() -> Vec<(&'static str, u32, Message<'static>)> {
    let info = DeviceInfo {
        firmware_version: (0, 1, 0),
        protocol_version: 1,
        tick_hz: 84_000_000,
        adc_bits: 16,
        flags: FLAG_TEST_SIGNAL,
        trigger_inputs: 4,
        trigger_outputs: 2,
        board: "F405",
        serial: "SN1",
        sample_rates_hz: heapless::Vec::from_slice(&[10_000, 100_000]).unwrap(),
        channels: heapless::Vec::from_slice(&[
            ChannelInfo {
                index: 0,
                quantity: Quantity::Current,
                name: "I0",
                scale: 0.001,
                offset: 0.0,
            },
            ChannelInfo {
                index: 1,
                quantity: Quantity::Voltage,
                name: "V0",
                scale: 0.0005,
                offset: 0.0,
            },
        ])
        .unwrap(),
    };
    const CODES: &[u8] = &[0x00, 0x01, 0x34, 0x12, 0xFF, 0xFF, 0x00, 0x80];
    // (-5, 12000), (7, 11990)
    const AVERAGED: &[u8] = &[0xFB, 0xFF, 0xE0, 0x2E, 0x07, 0x00, 0xD6, 0x2E];
    let long_text: &'static str =
        Box::leak(format!("Δt = 5 µs{}", "x".repeat(290)).into_boxed_str());
    vec![
        ("DeviceInfo", 0, Message::DeviceInfo(info)),
        (
            "SampleBlock",
            1,
            Message::SampleBlock(SampleBlock {
                first_index: 256,
                first_tick: 1_000_000,
                period_ticks: 840,
                channel_mask: 0b0000_0011,
                averaging: 1,
                sample_count: 2,
                codes: Codes::from_le_bytes(CODES).unwrap(),
            }),
        ),
        (
            "SampleBlock (averaged)",
            9,
            Message::SampleBlock(SampleBlock {
                first_index: 7,
                first_tick: 23_520,
                period_ticks: 3360,
                channel_mask: 0x84,
                averaging: 4,
                sample_count: 2,
                codes: Codes::from_le_bytes(AVERAGED).unwrap(),
            }),
        ),
        (
            "TriggerEdge",
            2,
            Message::TriggerEdge(TriggerEdge {
                line: 1,
                rising: true,
                edge_count: 3,
                tick: 123_456_789,
                sample_index: 146_972,
            }),
        ),
        (
            "TriggerEdge (output line)",
            3,
            Message::TriggerEdge(TriggerEdge {
                line: OUTPUT_LINE,
                rising: true,
                edge_count: 1,
                tick: 42,
                sample_index: u64::MAX,
            }),
        ),
        (
            "Status",
            4,
            Message::Status(Status {
                uptime_ticks: 840_000_000,
                samples_acquired: 1_000_000,
                dropped_queue_full: 0,
                dropped_link: 62,
                dropped_adc: 0,
                frames_sent: 5,
                frames_rejected: 1,
                edges_dropped: 0,
                queue_high_water: 17,
                queue_capacity: 256,
                state: RunState::Running,
            }),
        ),
        (
            "TimeSyncReply",
            5,
            Message::TimeSyncReply(TimeSyncReply {
                nonce: 0xDEAD_BEEF,
                rx_tick: 1000,
                tx_tick: 1090,
            }),
        ),
        (
            "CommandResult (ok)",
            6,
            Message::CommandResult(CommandResult {
                request_id: 7,
                command: MessageType::Configure as u8,
                code: ResultCode::Ok,
            }),
        ),
        (
            "CommandResult (error)",
            7,
            Message::CommandResult(CommandResult {
                request_id: 8,
                command: MessageType::Configure as u8,
                code: ResultCode::UnsupportedRate,
            }),
        ),
        (
            "Log",
            8,
            Message::Log(Log {
                level: LogLevel::Info,
                text: "boot ok",
            }),
        ),
        (
            "Log (long, UTF-8)",
            10,
            Message::Log(Log {
                level: LogLevel::Warn,
                text: long_text,
            }),
        ),
        ("GetInfo", 0, Message::GetInfo { request_id: 1 }),
        (
            "Configure",
            1,
            Message::Configure(Configure {
                request_id: 2,
                sample_rate_hz: 100_000,
                channel_mask: 0xFF,
                averaging: 1,
            }),
        ),
        ("Start", 2, Message::Start { request_id: 3 }),
        ("Stop", 3, Message::Stop { request_id: 4 }),
        (
            "TimeSync",
            4,
            Message::TimeSync(TimeSyncRequest {
                request_id: 5,
                nonce: 0xDEAD_BEEF,
            }),
        ),
        (
            "DriveTrigger",
            5,
            Message::DriveTrigger(DriveTrigger {
                request_id: 6,
                line: 0,
                high: true,
                pulse_ticks: 8400,
            }),
        ),
        (
            "WriteCalibration",
            6,
            Message::WriteCalibration(WriteCalibration {
                request_id: 7,
                channel: 2,
                scale: 0.00125,
                offset: -0.5,
            }),
        ),
        ("ResetCounters", 7, Message::ResetCounters { request_id: 8 }),
        ("GetStatus", 8, Message::GetStatus { request_id: 9 }),
        (
            "Unknown type 0x40",
            9,
            Message::Unknown {
                msg_type: 0x40,
                payload: &[0x00, 0x01, 0x02],
            },
        ),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Rows of the vector table in SPEC.md: `| name | seq | raw frame | wire bytes |`.
fn spec_rows() -> Vec<(String, u32, String, String)> {
    let spec = include_str!("../SPEC.md");
    let table = spec
        .split("<!-- vectors:begin -->")
        .nth(1)
        .and_then(|s| s.split("<!-- vectors:end -->").next())
        .expect("SPEC.md has a vectors table between its markers");
    table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| name") && !l.starts_with("| ---"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect();
            assert_eq!(cells.len(), 4, "row {l:?}");
            (
                cells[0].clone(),
                cells[1].parse().unwrap(),
                cells[2].clone(),
                cells[3].clone(),
            )
        })
        .collect()
}

#[test]
fn spec_vectors_match_byte_for_byte() {
    let rows = spec_rows();
    let vectors = vectors();
    let mut printed = String::new();
    let mut mismatches = 0;
    for (name, seq, msg) in &vectors {
        let wire = encode_frame_vec(*seq, msg).unwrap();
        // The raw frame: decode the COBS bytes (delimiter removed).
        let mut raw = wire[..wire.len() - 1].to_vec();
        let n = cobs::decode_in_place(&mut raw).unwrap();
        raw.truncate(n);
        let row = format!("| {name} | {seq} | `{}` | `{}` |", hex(&raw), hex(&wire));
        printed.push_str(&row);
        printed.push('\n');
        match rows.iter().find(|r| &r.0 == name) {
            Some(r) if r.1 == *seq && r.2 == hex(&raw) && r.3 == hex(&wire) => {}
            _ => mismatches += 1,
        }
        // And the SPEC bytes decode back to the message.
        let mut dec = Decoder::<MAX_ENCODED_FRAME>::new();
        let mut input = &wire[..];
        let frame = dec.next(&mut input).unwrap().unwrap();
        assert_eq!((frame.seq, &frame.message), (*seq, msg), "{name}");
    }
    assert_eq!(
        mismatches, 0,
        "SPEC.md vectors differ from the code; the code gives:\n{printed}"
    );
    assert_eq!(
        rows.len(),
        vectors.len(),
        "SPEC.md has rows this test does not pin"
    );
}

#[test]
fn every_message_type_has_a_vector() {
    let covered: Vec<u8> = vectors().iter().map(|v| v.2.type_byte()).collect();
    for t in 0..=255u8 {
        if MessageType::from_u8(t).is_some() {
            assert!(covered.contains(&t), "no vector for type {t:#04x}");
        }
    }
}
