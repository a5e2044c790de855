//! `railtrace import pmd DIR`: another instrument's traces as a railtrace recording.

use std::path::PathBuf;

use railtrace::store::import::pmd_run;

/// Imports traces recorded with other instruments.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// A paired-trace run folder (ElmorLabs PMD meter beside nvidia-smi), as in
    /// shared/data/gpu-power-benchmark: PMD_data.bin, PMD_start_ts.txt, gpudata.csv,
    /// timestamps.csv.
    Pmd {
        /// The run folder.
        dir: PathBuf,
        /// The recording to write; `<folder name>.arrow` when not given.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Replace the output if it exists.
        #[arg(long)]
        force: bool,
        /// Hours east of UTC of gpudata.csv's local times (+1 for the published A100
        /// runs); guessed from where nvidia-smi's readings overlap the meter's when not
        /// given.
        #[arg(value_parser = super::utc_offset_h, long, allow_hyphen_values = true)]
        utc_offset: Option<f64>,
    },
}

/// Runs `railtrace import`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let What::Pmd {
        dir,
        output,
        force,
        utc_offset,
    } = args.what;
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "import".into());
    let output = output.unwrap_or_else(|| PathBuf::from(format!("{name}.arrow")));
    railtrace::store::recording::check_output(&output, force)?;
    let said = pmd_run(&dir, &output, utc_offset)?;
    eprintln!("railtrace import: {said}");
    Ok(())
}
