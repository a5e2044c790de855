//! The twin behind its pseudo-terminal, driven with tokio-serial as a host drives a rig:
//! eight channels at 100 kS/s in real time, nothing dropped, and the power the codes
//! describe is the GPU's.

use std::time::Duration;

use railtrace_protocol::*;
use railtrace_tests::{last_status, result_of, Client, Rx};
use tokio_serial::SerialPortBuilderExt;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "current_thread")]
async fn twin_streams_eight_channels_at_100_ksps_in_real_time() {
    let _one_at_a_time = railtrace_tests::realtime_lock().await;
    let loaded = railtrace_twin::default_scenario();
    let twin = railtrace_twin::Twin::start(&loaded).expect("the twin starts");
    let port = tokio_serial::new(twin.path().to_string_lossy(), 921_600)
        .open_native_async()
        .expect("the pty opens");
    let mut dev = Client::new(port);
    let got = dev
        .command(&Message::GetInfo { request_id: 1 }, T)
        .await
        .unwrap();
    let Some(Rx::Info {
        tick_hz,
        channels,
        board,
        ..
    }) = got.iter().find(|r| matches!(r, Rx::Info { .. })).cloned()
    else {
        panic!("no DeviceInfo: {got:?}");
    };
    assert_eq!(
        (tick_hz, channels.len(), board.as_str()),
        (24_000_000, 8, "railtrace twin")
    );

    let cfg = Configure {
        request_id: 2,
        sample_rate_hz: 100_000,
        channel_mask: 0xFF,
        averaging: 1,
    };
    assert_eq!(
        result_of(&dev.command(&Message::Configure(cfg), T).await.unwrap(), 2),
        Some(ResultCode::Ok)
    );
    let start = std::time::Instant::now();
    dev.command(&Message::Start { request_id: 3 }, T)
        .await
        .unwrap();
    let (mut next, mut energy_j, mut min_w, mut max_w) = (0u64, 0.0, f64::MAX, 0.0f64);
    while next < 300_000 {
        if let Rx::Block {
            first_index, codes, ..
        } = dev.recv(T).await.unwrap()
        {
            assert_eq!(
                first_index,
                next,
                "no sample dropped (host lost {} frames; {:?} after start)",
                dev.seq.lost,
                start.elapsed()
            );
            for s in &codes {
                // Power from the codes and the calibration the device reports.
                let p: f64 = (0..4)
                    .map(|r| {
                        let i = f64::from(s[2 * r]) * f64::from(channels[2 * r].1);
                        let v = f64::from(s[2 * r + 1]) * f64::from(channels[2 * r + 1].1);
                        i * v
                    })
                    .sum();
                energy_j += p * 1e-5;
                min_w = min_w.min(p);
                max_w = max_w.max(p);
            }
            next += codes.len() as u64;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let got = dev
        .command(&Message::Stop { request_id: 4 }, T)
        .await
        .unwrap();
    let s = last_status(&got).unwrap();
    assert_eq!(s.dropped_total(), 0, "{s:?}");
    assert_eq!(dev.seq.lost, 0);
    // Three seconds of samples took three seconds: real time.
    assert!(
        (2.9..4.0).contains(&elapsed),
        "{elapsed} s for 3 s of samples"
    );
    // The GPU idles at 140 W and peaks at 620 W: so does the measured power, within the
    // sensors' gain errors (0.5 %) and noise.
    assert!(
        min_w > 120.0 && max_w < 680.0 && max_w > 500.0,
        "{min_w} .. {max_w} W"
    );
    let mean_w = energy_j / 3.0;
    assert!(mean_w > 140.0 && mean_w < 620.0, "{mean_w}");
    twin.stop().expect("the twin stops cleanly");
}
