//! `railtrace report profile.arrow [--plot report.svg|png]`: the analysis of a profiling
//! run, as text or JSON, and as a picture.

use std::path::PathBuf;
use std::time::Instant;

use railtrace::analysis::report_plot;
use railtrace::analysis::stitch::{analyse, Options};
use railtrace::store::recording::rig_path;

/// Aligns the clocks of a profiling run, bins its executions and stitches the GPU
/// logger's readings and the rig's samples onto the kernel's time axis.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The profile recording (`railtrace profile -o`).
    profile: PathBuf,
    /// The rig's capture of the run; `<profile>.rig.arrow` when not given.
    #[arg(long)]
    rig: Option<PathBuf>,
    /// Width of the stitched profiles' bins, µs.
    #[arg(value_parser = super::bin_us, long, default_value_t = 20.0)]
    bin_us: f64,
    /// Readings up to this long after an execution's start belong to it, ms.
    #[arg(value_parser = super::millis, long, default_value_t = 2.5)]
    horizon_ms: f64,
    /// Print every figure as JSON.
    #[arg(long)]
    json: bool,
    /// Also draw the analysis into this picture (.svg or .png): the logger's and the rig's
    /// stitched profiles on one time axis, SSE vs SSP, the execution-time histogram with
    /// the clusters and the fixed-margin bin, and the clocks' alignment residuals (2 × 2).
    #[arg(short = 'o', long = "plot", value_name = "OUT")]
    plot: Option<PathBuf>,
    /// Width of the picture, px (1000 to 16384).
    #[arg(long, value_name = "W", default_value_t = 2000, requires = "plot")]
    width: u32,
    /// Height of the picture, px (700 to 16384).
    #[arg(long, value_name = "H", default_value_t = 1400, requires = "plot")]
    height: u32,
}

/// Runs `railtrace report`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rig = args.rig.unwrap_or_else(|| rig_path(&args.profile));
    let options = Options {
        bin_s: args.bin_us * 1e-6,
        horizon_s: args.horizon_ms * 1e-3,
        ..Options::default()
    };
    let name = args
        .profile
        .file_name()
        .unwrap_or_default()
        .to_string_lossy();
    let picture = report_plot::Options {
        width: args.width,
        height: args.height,
        title: format!("railtrace report — {name}"),
    };
    // A wrong extension or size fails before the analysis.
    if let Some(out) = &args.plot {
        report_plot::check(out, &picture)?;
    }
    let a = analyse(&args.profile, &rig, &options)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&a)?);
    } else {
        print!("{}", a.summary());
    }
    if let Some(out) = &args.plot {
        let started = Instant::now();
        report_plot::render(&a, out, &picture)?;
        eprintln!(
            "wrote {} ({}×{} px) in {:.2} s",
            out.display(),
            args.width,
            args.height,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
