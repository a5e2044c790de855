//! `railtrace devices`: serial ports, their USB ids, and which are railtrace rigs.

use std::path::Path;
use std::time::Duration;

use railtrace::link::transport::Rig;

/// Lists serial ports and asks each whether it is a rig.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How long to wait for each port to answer, in seconds.
    #[arg(value_parser = super::seconds, long, default_value_t = 0.5)]
    timeout: f64,
}

/// Runs `railtrace devices`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let ports = tokio_serial::available_ports()?;
    if ports.is_empty() {
        println!("no serial ports found");
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for p in ports {
        let usb = match &p.port_type {
            tokio_serial::SerialPortType::UsbPort(u) => format!(
                "USB {:04x}:{:04x} {} {}",
                u.vid,
                u.pid,
                u.manufacturer.as_deref().unwrap_or(""),
                u.product.as_deref().unwrap_or("")
            ),
            tokio_serial::SerialPortType::PciPort => "PCI".into(),
            tokio_serial::SerialPortType::BluetoothPort => "Bluetooth".into(),
            tokio_serial::SerialPortType::Unknown => "unknown".into(),
        };
        let rig = rt.block_on(async {
            let mut rig = Rig::open(Path::new(&p.port_name))?;
            rig.info(Duration::from_secs_f64(args.timeout.max(0.01)))
                .await
        });
        let what = match rig {
            Ok(i) => format!(
                "railtrace rig: {} {} (firmware {})",
                i.board, i.serial, i.firmware
            ),
            Err(e) => format!("not a rig ({e})"),
        };
        println!("{:<16} {:<40} {}", p.port_name, usb.trim(), what);
    }
    Ok(())
}
