//! The twin's faults, seen from a host: every frame the twin damages is a frame the host
//! counts lost, no more and no fewer; a disconnected link comes back behind the same path;
//! a reset device starts its sequence numbers over.

use std::time::Duration;

use railtrace_protocol::*;
use railtrace_tests::{last_status, result_of, Client, Rx};
use tokio_serial::SerialPortBuilderExt;

const T: Duration = Duration::from_secs(10);

fn scenario(faults: &str) -> railtrace_twin::Loaded {
    let text = railtrace_twin::scenario::DEFAULT_SCENARIO
        .replace("[faults]\n", &format!("[faults]\n{faults}\n"));
    railtrace_twin::scenario::parse("faults.toml", &text, |_| {
        Ok(("rig".into(), railtrace_twin::scenario::DEFAULT_RIG.into()))
    })
    .expect("a valid scenario")
}

fn open(path: &std::path::Path) -> Client<tokio_serial::SerialStream> {
    Client::new(
        tokio_serial::new(path.to_string_lossy(), 921_600)
            .open_native_async()
            .expect("the port opens"),
    )
}

#[tokio::test(flavor = "current_thread")]
async fn host_counts_exactly_the_frames_the_twin_damaged() {
    let _one_at_a_time = railtrace_tests::realtime_lock().await;
    let twin = railtrace_twin::Twin::start(&scenario(
        "corrupt_frame_probability = 0.02\ndrop_byte_probability = 0.02\ndamage_until_s = 1.5",
    ))
    .unwrap();
    let mut dev = open(twin.path());
    // Commands may be lost to the damage: retry until answered.
    let cfg = Configure {
        request_id: 1,
        sample_rate_hz: 100_000,
        channel_mask: 0xFF,
        averaging: 1,
    };
    loop {
        let got = dev
            .command(&Message::Configure(cfg), Duration::from_millis(300))
            .await;
        if got.is_ok_and(|g| result_of(&g, 1) == Some(ResultCode::Ok)) {
            break;
        }
    }
    let mut id = 2;
    loop {
        let got = dev
            .command(
                &Message::Start { request_id: id },
                Duration::from_millis(300),
            )
            .await;
        if got.is_ok_and(|g| result_of(&g, id).is_some()) {
            break;
        }
        id += 1;
    }
    // Stream past the end of the damage, then stop on a clean link.
    let start = std::time::Instant::now();
    let (mut next, mut missing) = (None::<u64>, 0u64);
    while start.elapsed() < Duration::from_millis(2500) {
        if let Ok(Rx::Block {
            first_index, codes, ..
        }) = dev.recv(T).await
        {
            let expected = *next.get_or_insert(first_index);
            missing += first_index - expected;
            next = Some(first_index + codes.len() as u64);
        }
    }
    let got = dev
        .command(&Message::Stop { request_id: 100 }, T)
        .await
        .unwrap();
    let status = last_status(&got).unwrap();
    let stats = twin.stats();
    let damaged = stats
        .frames_corrupted
        .load(std::sync::atomic::Ordering::Relaxed)
        + stats
            .frames_truncated
            .load(std::sync::atomic::Ordering::Relaxed);
    assert!(damaged > 50, "the twin damaged {damaged} frames");
    assert_eq!(dev.seq.lost, damaged, "frames lost by the host's count");
    assert!(
        dev.rejected() >= damaged,
        "each damaged frame is rejected (a split one twice)"
    );
    assert_eq!(
        status.dropped_total(),
        0,
        "the device itself dropped nothing"
    );
    assert!(missing > 0, "lost sample blocks show as index gaps: {missing}, next {next:?}, damaged {damaged}, id {id}");
    twin.stop().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_disconnected_link_returns_behind_the_same_path_and_a_reset_restarts_numbering() {
    let _one_at_a_time = railtrace_tests::realtime_lock().await;
    let twin = railtrace_twin::Twin::start(&scenario(
        "disconnect_after_s = 0.5\ndisconnected_s = 0.5\nreset_after_s = 2.0",
    ))
    .unwrap();
    let path = twin.path().to_path_buf();
    let mut dev = open(&path);
    let got = dev
        .command(&Message::GetInfo { request_id: 1 }, T)
        .await
        .unwrap();
    assert_eq!(result_of(&got, 1), Some(ResultCode::Ok));
    let before = std::fs::read_link(&path).unwrap();
    // The link goes away at 0.5 s: the port hangs up.
    let gone = dev.recv(Duration::from_millis(1500)).await;
    assert!(gone.is_err(), "{gone:?}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let after = std::fs::read_link(&path).unwrap();
    assert_ne!(before, after, "a new pseudo-terminal behind the same path");
    let mut dev = open(&path);
    let got = dev
        .command(&Message::GetInfo { request_id: 2 }, T)
        .await
        .unwrap();
    assert_eq!(result_of(&got, 2), Some(ResultCode::Ok));
    let seq_before_reset = dev.seq.last().unwrap();
    // At 2 s the device resets: it greets again and numbers its frames from 0.
    let mut greeted = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while !greeted && std::time::Instant::now() < deadline {
        if let Ok(Rx::Log(text)) = dev.recv(Duration::from_millis(500)).await {
            greeted = text.contains("ready");
        }
    }
    assert!(greeted, "the reset device says it is ready");
    assert_eq!(dev.seq.restarts, 1);
    assert!(dev.seq.last().unwrap() < seq_before_reset);
    twin.stop().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_link_too_slow_for_the_stream_makes_the_device_drop_counted_samples() {
    let _one_at_a_time = railtrace_tests::realtime_lock().await;
    // 8 channels at 100 kS/s need 1.65 MB/s; the link carries 400 kB/s.
    let twin = railtrace_twin::Twin::start(&scenario("link_bytes_per_s = 400e3")).unwrap();
    let mut dev = open(twin.path());
    let cfg = Configure {
        request_id: 1,
        sample_rate_hz: 100_000,
        channel_mask: 0xFF,
        averaging: 1,
    };
    dev.command(&Message::Configure(cfg), T).await.unwrap();
    dev.command(&Message::Start { request_id: 2 }, T)
        .await
        .unwrap();
    let (mut next, mut received) = (0u64, 0u64);
    let mut gaps = 0u64;
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if let Rx::Block {
            first_index, codes, ..
        } = dev.recv(T).await.unwrap()
        {
            gaps += first_index - next;
            next = first_index + codes.len() as u64;
            received += codes.len() as u64;
        }
    }
    let got = dev
        .command(&Message::Stop { request_id: 3 }, T)
        .await
        .unwrap();
    for r in &got {
        if let Rx::Block {
            first_index, codes, ..
        } = r
        {
            gaps += first_index - next;
            next = first_index + codes.len() as u64;
            received += codes.len() as u64;
        }
    }
    let s = last_status(&got).expect("Stop sends a Status");
    assert!(s.dropped_link > 0, "{s:?}");
    // Every sample is either received or counted as dropped; the gaps are the drops.
    assert_eq!(received + s.dropped_total(), s.samples_acquired, "{s:?}");
    assert_eq!(gaps + (s.samples_acquired - next), s.dropped_total());
    assert_eq!(
        dev.seq.lost, 0,
        "the link loses nothing: the device drops, and counts"
    );
    twin.stop().unwrap();
}
