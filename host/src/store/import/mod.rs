//! Importers of recordings made with other instruments, written as railtrace
//! recordings.
pub mod pmd;

use std::path::Path;

/// Imports the paired-trace run folder `dir` into the recording `output` (replaced if
/// there), the UTC offset of its nvidia-smi log given or guessed; what it holds, in words.
pub fn pmd_run(dir: &Path, output: &Path, utc_offset: Option<f64>) -> anyhow::Result<String> {
    anyhow::ensure!(dir.is_dir(), "{}: no such folder", dir.display());
    let mut run = pmd::read_run(dir, 0.0)?;
    anyhow::ensure!(
        !run.pmd.time_us.is_empty(),
        "{}: PMD_data.bin holds no records",
        dir.display()
    );
    let (offset, how) = match utc_offset {
        Some(h) => (h, "given"),
        None => (
            pmd::guess_utc_offset_h(&run.pmd, &run.smi).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: gpudata.csv's readings overlap the meter's span at no UTC offset; is it from this run?",
                    dir.display()
                )
            })?,
            "guessed from the overlap of nvidia-smi's readings with the meter's",
        ),
    };
    for r in &mut run.smi {
        r.time_us -= offset * 3600e6;
    }
    let settings = serde_json::json!({
        "meter": "ElmorLabs PMD, 4 (voltage, current) pairs",
        "gpu_logger": "nvidia-smi power.draw (logger_w), power.draw.instant (logger_instant_w) and power.draw.average (logger_average_w) where logged, temperature.gpu (logger_temp_c)",
        "load_edges_listed": run.edges_listed,
        "utc_offset_h": offset,
        "utc_offset": how,
    });
    let rows = pmd::write_recording(
        &run,
        &format!("import pmd {}", dir.display()),
        settings,
        output,
    )?;
    Ok(format!(
        "{} meter records, {} nvidia-smi readings (UTC{:+} h, {how}), {} load edges{}: {rows} rows in {}",
        run.pmd.time_us.len(),
        run.smi.len(),
        offset,
        run.edges_us.len(),
        if run.edges_listed == run.edges_us.len() {
            String::new()
        } else {
            format!(" ({} listed, repeats counted once)", run.edges_listed)
        },
        output.display()
    ))
}
