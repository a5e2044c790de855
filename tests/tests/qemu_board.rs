//! The STM32F405 firmware image booted in QEMU, driven over its pseudo-terminal with
//! tokio-serial exactly as a USB-serial rig would be. Skipped, saying so, only where
//! `qemu-system-arm` is not installed (`.ci/run` installs it).

use std::time::Duration;

use railtrace_firmware::test_signal::test_code;
use railtrace_protocol::*;
use railtrace_tests::{last_status, qemu, result_of, Client, Rx};
use tokio_serial::SerialPortBuilderExt;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "current_thread")]
async fn firmware_image_streams_the_test_signal_and_answers_every_command() {
    if !qemu::available() {
        eprintln!("SKIPPED: qemu-system-arm is not installed; `.ci/run` installs it");
        return;
    }
    let elf = qemu::build_image().expect("the board image builds");
    let vm = qemu::Qemu::start(&elf).expect("QEMU starts");
    let port = tokio_serial::new(vm.pty.to_string_lossy(), 921_600)
        .open_native_async()
        .expect("the pty opens");
    vm.resume().expect("QEMU resumes");
    let mut dev = Client::new(port);

    // QEMU passes the guest's output to the pty only once it has noticed the pty open
    // (it looks once a second), and drops it before: the first request is asked again
    // until it is answered.
    let mut got = Err(std::io::Error::other("not asked"));
    for _ in 0..15 {
        got = dev
            .command(&Message::GetInfo { request_id: 1 }, Duration::from_secs(4))
            .await;
        if got.as_ref().is_ok_and(|g| result_of(g, 1).is_some()) {
            break;
        }
    }
    let got = got.unwrap();
    assert_eq!(result_of(&got, 1), Some(ResultCode::Ok));
    let Some(Rx::Info {
        flags,
        tick_hz,
        rates,
        board,
        channels,
    }) = got.iter().find(|r| matches!(r, Rx::Info { .. })).cloned()
    else {
        panic!("no DeviceInfo in {got:?}");
    };
    assert_eq!(
        flags & FLAG_TEST_SIGNAL,
        FLAG_TEST_SIGNAL,
        "no ADC under QEMU: test signal"
    );
    assert!(board.contains("qemu"), "{board}");
    assert_eq!((tick_hz, channels.len()), (1_000_000_000, 8));
    assert!(rates.contains(&10_000));

    let rate = 10_000u32;
    let cfg = Configure {
        request_id: 2,
        sample_rate_hz: rate,
        channel_mask: 0b1000_0011,
        averaging: 1,
    };
    assert_eq!(
        result_of(&dev.command(&Message::Configure(cfg), T).await.unwrap(), 2),
        Some(ResultCode::Ok)
    );
    assert_eq!(
        result_of(
            &dev.command(&Message::Start { request_id: 3 }, T)
                .await
                .unwrap(),
            3
        ),
        Some(ResultCode::Ok)
    );

    // Two seconds of device time.
    let period = tick_hz / rate;
    let (mut next, mut t0, mut edges) = (0u64, None, Vec::new());
    while next < 20_000 {
        match dev.recv(T).await.unwrap() {
            Rx::Block {
                first_index,
                first_tick,
                period_ticks,
                codes,
                ..
            } => {
                assert_eq!(first_index, next, "contiguous indices");
                assert_eq!(period_ticks, period);
                let t0 = *t0.get_or_insert(first_tick);
                // TIM2 under QEMU may stretch a period slightly; TIM5 stamps stay true.
                let expected = t0 + first_index * u64::from(period);
                assert!(
                    first_tick.abs_diff(expected)
                        <= expected.saturating_sub(t0) / 100 + u64::from(period),
                    "block at {first_index}: tick {first_tick}, expected about {expected}"
                );
                for (j, s) in codes.iter().enumerate() {
                    let n = first_index + j as u64;
                    assert_eq!(
                        s,
                        &vec![test_code(0, n), test_code(1, n), test_code(7, n)],
                        "sample {n}"
                    );
                }
                next += codes.len() as u64;
            }
            Rx::Edge(e) => edges.push(e),
            Rx::Status(s) => assert_eq!(s.dropped_total(), 0, "{s:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    // The self-test raises an edge on input 0 every millisecond, alternating.
    assert!(edges.len() >= 1500, "{} edges in 2 s", edges.len());
    let t0 = t0.unwrap();
    for (i, e) in edges.iter().enumerate() {
        assert_eq!(
            (e.line, e.edge_count, e.rising),
            (0, i as u32 + 1, i % 2 == 0)
        );
        assert_eq!(e.sample_index, (e.tick - t0) / u64::from(period));
    }

    // A time-sync exchange: received before sent, both within the run.
    let got = dev
        .command(
            &Message::TimeSync(TimeSyncRequest {
                request_id: 4,
                nonce: 99,
            }),
            T,
        )
        .await
        .unwrap();
    let sync = got
        .iter()
        .find_map(|r| if let Rx::Sync(s) = r { Some(*s) } else { None })
        .expect("a reply");
    assert!(sync.nonce == 99 && t0 < sync.rx_tick && sync.rx_tick <= sync.tx_tick);

    // A trigger output pulse: one edge at once, the other after it.
    let pulse = DriveTrigger {
        request_id: 5,
        line: 1,
        high: true,
        pulse_ticks: 1_000_000,
    };
    let mut between = dev.command(&Message::DriveTrigger(pulse), T).await.unwrap();
    let up = between.iter().find_map(|r| match r {
        Rx::Edge(e) if e.line == OUTPUT_LINE | 1 && e.rising => Some(*e),
        _ => None,
    });
    let up = up.expect("the rising edge comes before the result");
    let down = loop {
        match dev.recv(T).await.unwrap() {
            Rx::Edge(e) if e.line == OUTPUT_LINE | 1 => break e,
            other => between.push(other),
        }
    };
    assert!(
        !down.rising && down.tick >= up.tick + 1_000_000,
        "{up:?} then {down:?}"
    );

    // A corrupted frame is rejected and counted; the next command is answered.
    let mut bad = encode_frame_vec(0, &Message::GetStatus { request_id: 6 }).unwrap();
    bad[2] ^= 0x10;
    let bad_only = dev.rejected();
    dev.send_raw(&bad).await.unwrap();
    let got = dev
        .command(&Message::Stop { request_id: 7 }, T)
        .await
        .unwrap();
    assert_eq!(result_of(&got, 7), Some(ResultCode::Ok));
    assert!(
        result_of(&got, 6).is_none(),
        "a corrupted frame is never answered"
    );
    let mut received = next;
    for r in between.iter().chain(got.iter()) {
        if let Rx::Block {
            first_index, codes, ..
        } = r
        {
            assert_eq!(*first_index, received);
            received += codes.len() as u64;
        }
    }
    let s = last_status(&got).expect("Stop sends a Status");
    assert_eq!(s.state, RunState::Idle);
    assert_eq!(
        s.samples_acquired, received,
        "every sample acquired was received"
    );
    assert_eq!(
        (s.dropped_total(), s.edges_dropped, s.frames_rejected),
        (0, 0, 1)
    );
    assert_eq!(
        (dev.seq.lost, dev.seq.duplicates, dev.rejected() - bad_only),
        (0, 0, 0)
    );

    // Calibration goes to flash, which QEMU does not model: the write is reported as a
    // storage fault (never as stored), and the device carries on.
    let cal = WriteCalibration {
        request_id: 8,
        channel: 0,
        scale: 0.5,
        offset: 0.0,
    };
    let got = dev
        .command(&Message::WriteCalibration(cal), T)
        .await
        .unwrap();
    assert_eq!(result_of(&got, 8), Some(ResultCode::StorageFault));
    let got = dev
        .command(&Message::GetInfo { request_id: 9 }, T)
        .await
        .unwrap();
    assert!(
        matches!(got.first(), Some(Rx::Info { flags, .. }) if flags & FLAG_CALIBRATION_STORED == 0)
    );
}
