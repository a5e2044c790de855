//! `railtrace survey DIR...`: every paired-trace run folder under the folders given,
//! imported, every logger column calibrated and compared with the meter, a step run's
//! model cross-validated on the same GPU's other runs; one table.

use std::path::PathBuf;

use railtrace::analysis::survey::{markdown, survey};

/// Calibrates and compares every logger column of every paired run found.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Folders holding paired-trace run folders (PMD_data.bin, gpudata.csv,
    /// timestamps.csv, PMD_start_ts.txt), searched three levels deep.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// Write each model here, as `<gpu>-<run>[-instant|-average].toml`.
    #[arg(long)]
    models: Option<PathBuf>,
    /// Write the table as Markdown to this file too.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

/// Runs `railtrace survey`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} runs  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let rows = survey(&args.dirs, args.models.as_deref(), |done, of, what| {
        bar.set_length(of as u64);
        bar.set_position(done as u64);
        bar.set_message(what.to_string());
    });
    bar.finish_and_clear();
    let table = markdown(&rows?);
    print!("{table}");
    if let Some(p) = &args.markdown {
        railtrace::store::write_output(p, &table)
            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    }
    Ok(())
}
