//! `railtrace export FILE --format parquet|csv|perfetto [-o OUT]`: a recording as
//! Parquet, CSV or a Perfetto trace (host/EXPORT.md).

use std::path::PathBuf;

use railtrace::store::export::{self, Format, Options};
use railtrace::store::recording::{self, Kind};

/// Writes a recording as Parquet or CSV (for pandas and polars), or as a Perfetto /
/// Chrome trace-event JSON trace: power as counter tracks, trigger edges and the
/// intervals between them as slices, gaps as slices.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The recording (.arrow).
    file: PathBuf,
    /// What to write.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// The file to write (replaced if it exists; never the recording). Default: FILE
    /// with the extension .parquet, .csv or .json.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Parquet and CSV: only rows of this kind (sample, gap, edge, time_sync, logger,
    /// status, info, log); repeat for several. Default: every row.
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind)]
    kinds: Vec<Kind>,
    /// Parquet and CSV: only the sample rows (--kind sample).
    #[arg(long)]
    samples_only: bool,
    /// Perfetto: average the samples into bins this many µs wide (a bin ends at a gap);
    /// 0 writes every sample. [default: 100]
    #[arg(long, value_name = "US")]
    bin_us: Option<u64>,
    /// Perfetto: `ts` in µs since the Unix epoch (UTC), rather than since the
    /// recording's start (time_s = 0).
    #[arg(long)]
    absolute_time: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FormatArg {
    /// Parquet (snappy), the recording's columns, units in the field metadata.
    Parquet,
    /// CSV with a header row of the recording's column names.
    Csv,
    /// Chrome trace-event JSON for ui.perfetto.dev or chrome://tracing.
    Perfetto,
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    Kind::TABLE
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = Kind::TABLE.iter().map(|k| k.name()).collect();
            format!("not a kind of row; one of {}", names.join(", "))
        })
}

fn size(bytes: u64) -> String {
    match bytes {
        0..1_000 => format!("{bytes} bytes"),
        1_000..1_000_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        _ => format!("{:.1} MB", bytes as f64 / 1e6),
    }
}

/// Runs `railtrace export`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let format = match args.format {
        FormatArg::Parquet => Format::Parquet,
        FormatArg::Csv => Format::Csv,
        FormatArg::Perfetto => Format::Perfetto,
    };
    let mut opts = Options::new(format);
    opts.kinds = args.kinds;
    if args.samples_only && !opts.kinds.contains(&Kind::Sample) {
        opts.kinds.push(Kind::Sample);
    }
    if format == Format::Perfetto {
        if !opts.kinds.is_empty() {
            anyhow::bail!("--kind and --samples-only apply to parquet and csv, not perfetto");
        }
        opts.bin_us = args.bin_us.unwrap_or(opts.bin_us);
        opts.absolute_time = args.absolute_time;
    } else if args.bin_us.is_some() || args.absolute_time {
        anyhow::bail!("--bin-us and --absolute-time apply to perfetto only");
    }
    // Only the schema is read here; the export reads the rows a batch at a time.
    let rec = recording::open(&args.file)?;
    let out = args
        .output
        .unwrap_or_else(|| export::default_output(&args.file, format));
    let done = export::export(&rec, &out, &opts)?;
    let events = if format == Format::Perfetto {
        format!(" as {} trace events", done.trace_events)
    } else {
        String::new()
    };
    eprintln!(
        "railtrace: exported {} rows{events} to {} ({})",
        done.rows,
        done.path.display(),
        size(done.bytes)
    );
    Ok(())
}
