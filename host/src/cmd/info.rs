//! `railtrace info --port P`: what a rig is.

use std::path::PathBuf;
use std::time::Duration;

use railtrace::link::transport::{Info, Rig};

/// Asks a rig for its DeviceInfo.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The rig's serial port (e.g. /dev/ttyACM0, or the path `railtrace twin serve`
    /// prints).
    #[arg(long)]
    port: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// How long to wait for an answer, in seconds.
    #[arg(value_parser = super::seconds, long, default_value_t = 2.0)]
    timeout: f64,
}

/// Runs `railtrace info`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let info = rt.block_on(async {
        let mut rig = Rig::open(&args.port)?;
        rig.info(Duration::from_secs_f64(args.timeout.max(0.01)))
            .await
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print!("{}", describe(&info));
    }
    Ok(())
}

/// A rig's DeviceInfo for people.
pub fn describe(i: &Info) -> String {
    let mut s = format!(
        "board     {}{}\nserial    {}\nfirmware  {} (protocol {})\nclock     {} Hz\nADC       {} bits\nrates     {} Hz\ntriggers  {} in, {} out\ncalibration {}\nchannels\n",
        i.board,
        if i.test_signal { " (test signal, no ADC)" } else { "" },
        i.serial,
        i.firmware,
        i.protocol_version,
        i.tick_hz,
        i.adc_bits,
        i.sample_rates_hz.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        i.trigger_inputs,
        i.trigger_outputs,
        if i.calibration_stored { "stored on the device" } else { "defaults" },
    );
    for c in &i.channels {
        s.push_str(&format!(
            "  {}  {:<14} {:>12.6e} {}/code  offset {} {}\n",
            c.index, c.name, c.scale, c.unit, c.offset, c.unit
        ));
    }
    s
}
