//! Finds the highest sample rate the STM32F405 image sustains under QEMU without counted
//! drops: `cargo run --release -p railtrace-tests --example qemu_rates [CHANNEL_MASK]`.
//!
//! For each rate the image offers (or only `RATE`, the second argument), it streams 0.2 s
//! of device time (8 channels by default), stops, and prints what the device's Status says
//! was acquired and dropped, and how long it took on this machine. Under QEMU the wall
//! time is set by the pseudo-terminal, which carries about 100 kB/s: the emulated board
//! writes its USART a byte at a time.
use std::time::{Duration, Instant};

use railtrace_protocol::{Configure, Message, ResultCode};
use railtrace_tests::{last_status, qemu, result_of, Client, Rx};
use tokio_serial::SerialPortBuilderExt;

const T: Duration = Duration::from_secs(60);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mask = std::env::args()
        .nth(1)
        .map(|a| u8::from_str_radix(a.trim_start_matches("0x"), 16))
        .transpose()?
        .unwrap_or(0xFF);
    if !qemu::available() {
        return Err("qemu-system-arm is not installed".into());
    }
    let vm = qemu::Qemu::start(&qemu::build_image()?)?;
    let port = tokio_serial::new(vm.pty.to_string_lossy(), 921_600).open_native_async()?;
    vm.resume()?;
    let mut dev = Client::new(port);
    let got = dev.command(&Message::GetInfo { request_id: 1 }, T).await?;
    let Some(Rx::Info { rates, .. }) = got.into_iter().find(|r| matches!(r, Rx::Info { .. }))
    else {
        return Err("no DeviceInfo".into());
    };
    println!("channels mask {mask:#04x}; 0.2 s of device time per rate");
    println!(
        "{:>9} {:>10} {:>10} {:>9} {:>9}",
        "rate_hz", "acquired", "dropped", "wall_s", "frames"
    );
    let only: Option<u32> = std::env::args().nth(2).map(|a| a.parse()).transpose()?;
    let mut id = 2;
    for rate in rates.into_iter().filter(|r| only.is_none_or(|o| o == *r)) {
        let cfg = Configure {
            request_id: id,
            sample_rate_hz: rate,
            channel_mask: mask,
            averaging: 1,
        };
        let got = dev.command(&Message::Configure(cfg), T).await?;
        if result_of(&got, id) != Some(ResultCode::Ok) {
            return Err(format!("Configure {rate} Hz refused: {got:?}").into());
        }
        id += 1;
        let wall = Instant::now();
        dev.command(&Message::Start { request_id: id }, T).await?;
        id += 1;
        let mut received = 0u64;
        while received < u64::from(rate) / 5 {
            if let Rx::Block { codes, .. } = dev.recv(T).await? {
                received += codes.len() as u64;
            }
        }
        let got = dev.command(&Message::Stop { request_id: id }, T).await?;
        id += 1;
        let wall_s = wall.elapsed().as_secs_f64();
        let Some(status) = last_status(&got) else {
            return Err("Stop sent no Status".into());
        };
        println!(
            "{rate:>9} {:>10} {:>10} {wall_s:>9.2} {:>9}",
            status.samples_acquired,
            status.dropped_total(),
            status.frames_sent
        );
    }
    println!("frames lost on the link: {}", dev.seq.lost);
    Ok(())
}
