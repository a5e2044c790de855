//! `railtrace export FILE --format parquet|csv|perfetto` (being written).
/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}
/// Runs `railtrace export`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("export is being written")
}
