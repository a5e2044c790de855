//! The host's transport against real ports: the twin, and the ways a port can be wrong.
//! Each failure is one clear error naming the port.

use std::time::Duration;

use railtrace::link::transport::{Rig, TransportError};
use railtrace_protocol::{cobs, crc32c};

const T: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "current_thread")]
async fn info_from_the_twin_and_a_busy_port() {
    let _one_at_a_time = railtrace_tests::realtime_lock().await;
    let twin = railtrace_twin::Twin::start(&railtrace_twin::default_scenario()).unwrap();
    let mut rig = Rig::open(twin.path()).unwrap();
    let info = rig.info(T).await.unwrap();
    assert_eq!(
        (info.board.as_str(), info.channels.len(), info.tick_hz),
        ("railtrace twin", 8, 24_000_000)
    );
    assert_eq!(info.channels[4].name, "cable1_12v_I");
    assert_eq!(info.channels[4].unit, "A");
    // A second program on the same port is refused, saying why.
    let second = Rig::open(twin.path()).unwrap_err();
    assert!(matches!(second, TransportError::Busy(_)), "{second}");
    assert!(second
        .to_string()
        .ends_with("the port is busy (another program has it open)"));
    drop(rig);
    twin.stop().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn wrong_ports_get_clear_errors() {
    let e = Rig::open(std::path::Path::new("/dev/railtrace-nonexistent")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/dev/railtrace-nonexistent: no such serial port"
    );
    let e = Rig::open(std::path::Path::new("/dev/null")).unwrap_err();
    assert_eq!(e.to_string(), "/dev/null: not a serial port");
    // A serial port where nothing answers.
    let silent = railtrace_twin::pty::Pty::open().unwrap();
    let mut rig = Rig::open(silent.path()).unwrap();
    let e = rig.info(Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(e, TransportError::Timeout { .. }), "{e}");
    assert!(
        e.to_string().contains("no answer to GetInfo within 300ms"),
        "{e}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_device_speaking_another_protocol_version_is_named() {
    // A peer that answers anything with a version-2 frame.
    let pty = railtrace_twin::pty::Pty::open().unwrap();
    let path = pty.path().to_path_buf();
    let peer = std::thread::spawn(move || {
        let mut pty = pty;
        let mut raw = vec![2u8, 0x01, 0, 0, 0, 0, 1, 2, 3];
        raw.extend(crc32c(&raw).to_le_bytes());
        let mut wire = vec![0u8; 32];
        let n = cobs::encode(&raw, &mut wire).unwrap();
        wire.truncate(n);
        wire.push(0);
        let mut buf = [0u8; 64];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if embedded_io::Read::read(&mut pty, &mut buf).unwrap_or(0) > 0 {
                embedded_io::Write::write_all(&mut pty, &wire).unwrap();
                // Stay connected while the host reads it.
                std::thread::sleep(Duration::from_millis(500));
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let mut rig = Rig::open(&path).unwrap();
    let e = rig.info(T).await.unwrap_err();
    assert!(
        e.to_string()
            .ends_with("the device speaks protocol version 2; this railtrace speaks version 1"),
        "{e}"
    );
    peer.join().unwrap();
}
