//! `railtrace plot FILE -o out.svg|png` (being written).
/// Arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}
/// Runs `railtrace plot`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("plot is being written")
}
