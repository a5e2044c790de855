//! The Python package's native module, `railtrace._railtrace`: each function calls the
//! railtrace library and hands its answer over as bytes, JSON or plain values; the
//! package's Python side (`railtrace/__init__.py`) makes classes, arrays and tables of
//! them. Errors come back as `railtrace.Error` with the command line's one-line message.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{BooleanArray, RecordBatch};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use railtrace::analysis::logger_model::LoggerModel;
use railtrace::link::capture::{Config, RigFile};
use railtrace::store::recording::{self, Kind, Rows, Source};

create_exception!(
    _railtrace,
    Error,
    PyException,
    "What railtrace could not do, in one line (as the command line says it)."
);

fn err(e: impl Into<anyhow::Error>) -> PyErr {
    anyhow_err(e.into())
}

/// A Python error for `e`, with its one-line message, of the class a Python user
/// catches it as (all of them `railtrace.Error`): a missing file `FileNotFoundError`, a
/// rig that stopped, went away or does not answer `railtrace.DeviceError` (an
/// `OSError`), anything else `railtrace.Error`.
fn anyhow_err(e: anyhow::Error) -> PyErr {
    use railtrace::link::capture::CaptureError;
    use railtrace::link::meter::MeterError;
    let message = format!("{e:#}");
    let not_found = |io: &std::io::Error| io.kind() == std::io::ErrorKind::NotFound;
    let missing = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(not_found)
            || matches!(
                c.downcast_ref::<recording::RecordingError>(),
                Some(recording::RecordingError::Io { error, .. }) if not_found(error)
            )
    });
    let device = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<MeterError>(),
            Some(
                MeterError::Stopped(_)
                    | MeterError::Capture(CaptureError::Transport(_) | CaptureError::Gone { .. })
            )
        ) || matches!(
            c.downcast_ref::<CaptureError>(),
            Some(CaptureError::Transport(_) | CaptureError::Gone { .. })
        )
    });
    let class = if missing {
        "MissingFile"
    } else if device {
        "DeviceError"
    } else {
        return Error::new_err(message);
    };
    raise(class, message)
}

/// An error of the package's class `class` (see `railtrace/__init__.py`), or
/// `railtrace.Error` where the package is not there to give it.
fn raise(class: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let made = (py.import("railtrace"))
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.call1((message.clone(),)));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(_) => Error::new_err(message),
        }
    })
}

/// A value the caller gave that cannot be meant: `railtrace.InvalidArgument`, a
/// `ValueError`.
fn invalid(message: impl Into<String>) -> PyErr {
    raise("InvalidArgument", message.into())
}

/// The rows of the recording at `path` as an Arrow IPC stream (block rows expanded to one
/// row per sample, as every railtrace command reads them): of the kinds named (all when
/// None), with the columns named (all when None; `kind` and `time_s` always).
#[pyfunction]
#[pyo3(signature = (path, kinds=None, columns=None))]
fn recording_ipc(
    py: Python<'_>,
    path: PathBuf,
    kinds: Option<Vec<String>>,
    columns: Option<Vec<String>>,
) -> PyResult<Py<PyBytes>> {
    let bytes = py
        .detach(|| ipc(&path, kinds, columns))
        .map_err(anyhow_err)?;
    Ok(PyBytes::new(py, &bytes).unbind())
}

fn ipc(
    path: &std::path::Path,
    kinds: Option<Vec<String>>,
    columns: Option<Vec<String>>,
) -> anyhow::Result<Vec<u8>> {
    let kinds: Option<Vec<Kind>> = kinds
        .map(|ks| {
            ks.iter()
                .map(|k| {
                    Kind::from_name(k).ok_or_else(|| {
                        anyhow::anyhow!("{k:?}: not a kind of row a recording holds")
                    })
                })
                .collect()
        })
        .transpose()?;
    let rec = recording::open(path)?;
    let wanted: Option<Vec<&str>> = columns
        .as_ref()
        .map(|c| c.iter().map(String::as_str).collect());
    let mut writer: Option<arrow_ipc::writer::StreamWriter<Vec<u8>>> = None;
    for b in rec.batches(wanted.as_deref())? {
        let b = b?;
        let b = match &kinds {
            None => b,
            Some(ks) => {
                let rows = Rows::new(&b);
                let keep: BooleanArray = (0..rows.len())
                    .map(|i| Some(ks.contains(&rows.kind(i))))
                    .collect();
                arrow_select::filter::filter_record_batch(&b, &keep)?
            }
        };
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(arrow_ipc::writer::StreamWriter::try_new(
                Vec::new(),
                &b.schema(),
            )?),
        };
        if b.num_rows() > 0 {
            w.write(&b)?;
        }
    }
    let mut w = match writer {
        Some(w) => w,
        None => {
            let empty = RecordBatch::new_empty(rec.schema().clone());
            arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &empty.schema())?
        }
    };
    w.finish()?;
    Ok(w.into_inner()?)
}

/// What the recording at `path` holds, as `railtrace inspect --json` prints it, with its
/// rails' names (`rails`).
#[pyfunction]
fn inspect_json(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let (s, rails) = py
        .detach(|| railtrace::store::inspect::summarise(&path))
        .map_err(anyhow_err)?;
    let mut v = serde_json::to_value(&s).map_err(err)?;
    v["rails"] = serde_json::json!(rails);
    Ok(v.to_string())
}

/// The digital twin of a bench, running: its rig on a pseudo-terminal at `port`. Shared
/// with the meters that read its GPU's logger.
#[pyclass(unsendable)]
struct Twin {
    twin: Option<Arc<railtrace_twin::Twin>>,
    port: String,
}

#[pymethods]
impl Twin {
    #[new]
    #[pyo3(signature = (scenario=None, rig=None))]
    fn new(scenario: Option<PathBuf>, rig: Option<PathBuf>) -> PyResult<Twin> {
        let loaded = railtrace_twin::scenario::load_with(scenario.as_deref(), rig.as_deref())
            .map_err(err)?;
        let twin = railtrace_twin::Twin::start(&loaded).map_err(err)?;
        let port = twin.path().display().to_string();
        Ok(Twin {
            twin: Some(Arc::new(twin)),
            port,
        })
    }

    #[getter]
    fn port(&self) -> String {
        self.port.clone()
    }

    /// Stops the twin (again: nothing); refused while a rig still reads its GPU's
    /// logger.
    fn stop(&mut self) -> PyResult<()> {
        match self.twin.take().map(Arc::try_unwrap) {
            Some(Ok(t)) => t.stop().map_err(err),
            Some(Err(shared)) => {
                self.twin = Some(shared);
                Err(Error::new_err(
                    "the twin's GPU logger is still read by a rig: close the rig first",
                ))
            }
            None => Ok(()),
        }
    }
}

/// The GPU logger `logger` names: a `Twin` (its GPU's logger) or a name (`nvml`,
/// `hwmon`, `gpu-metrics`).
fn open_logger(logger: &Bound<'_, PyAny>) -> PyResult<Box<dyn railtrace::gpu::PowerLogger + Send>> {
    if let Ok(twin) = logger.extract::<PyRef<'_, Twin>>() {
        let twin = twin
            .twin
            .clone()
            .ok_or_else(|| Error::new_err("the twin is stopped: its GPU has no logger to read"))?;
        return Ok(Box::new(railtrace::link::meter::SharedTwinLogger::new(
            twin,
        )));
    }
    let what = "a twin, or the name of a GPU logger (nvml, hwmon, gpu-metrics)";
    let name: String = logger
        .extract()
        .map_err(|_| Error::new_err(format!("logger: {what}")))?;
    match name.as_str() {
        "hwmon" | "gpu-metrics" => {}
        "nvml" if cfg!(feature = "nvml") => {}
        "nvml" => {
            return Err(Error::new_err(
                "logger \"nvml\": this railtrace package was built without NVML (build it with MATURIN_PEP517_ARGS=\"--features nvml\" pip install ./python)",
            ))
        }
        other => return Err(invalid(format!("logger {other:?}: {what}"))),
    }
    railtrace::gpu::open_logger(&name, None, 0).map_err(anyhow_err)
}

/// A rig captured in the background (`railtrace::link::meter::Meter`).
#[pyclass(unsendable)]
struct Meter {
    meter: railtrace::link::meter::Meter,
}

#[pymethods]
impl Meter {
    #[new]
    #[pyo3(signature = (port, output, rate=None, rig=None, force=false, wait_s=10.0, logger=None, allow_drops=false))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        port: PathBuf,
        output: PathBuf,
        rate: Option<u32>,
        rig: Option<PathBuf>,
        force: bool,
        wait_s: f64,
        logger: Option<&Bound<'_, PyAny>>,
        allow_drops: bool,
    ) -> PyResult<Meter> {
        let rig = rig
            .as_deref()
            .map(RigFile::read)
            .transpose()
            .map_err(anyhow_err)?;
        let logger = logger.map(open_logger).transpose()?;
        let config = Config {
            rig,
            rate_hz: rate,
            reconnect_wait: Duration::from_secs(60),
            replace: force,
            allow_drops,
            ..Config::new(port, output)
        };
        let wait = Duration::from_secs_f64(wait_s);
        let meter = py
            .detach(|| {
                let mut meter = railtrace::link::meter::Meter::start(config, wait)?;
                if let Some(logger) = logger {
                    meter.start_logger(logger, wait)?;
                }
                Ok::<_, railtrace::link::meter::MeterError>(meter)
            })
            .map_err(err)?;
        Ok(Meter { meter })
    }

    /// Drives trigger output `line`, held or as a pulse of `pulse_s`, waiting up to
    /// `wait_s` for the rig's answer.
    #[pyo3(signature = (line, high=true, pulse_s=None, wait_s=5.0))]
    fn drive(
        &self,
        py: Python<'_>,
        line: i64,
        high: bool,
        pulse_s: Option<f64>,
        wait_s: f64,
    ) -> PyResult<()> {
        let line = u8::try_from(line)
            .map_err(|_| invalid(format!("the rig has no trigger output {line}")))?;
        let meter = &self.meter;
        py.detach(|| meter.drive(line, high, pulse_s, Duration::from_secs_f64(wait_s)))
            .map_err(err)
    }

    /// Writes a mark into the recording now.
    fn mark(&self, text: &str) -> PyResult<()> {
        self.meter.mark(text).map_err(err)
    }

    /// The rails' names.
    fn rails(&self) -> Vec<String> {
        self.meter.rails()
    }

    /// The samples since the last read: (times as float64 bytes, per-rail watts as
    /// float32 bytes, how many were dropped from the read buffer unread).
    fn read<'py>(&self, py: Python<'py>) -> (Bound<'py, PyBytes>, Bound<'py, PyBytes>, u64) {
        let (t, w, dropped) = self.meter.read();
        let t: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let w: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        (PyBytes::new(py, &t), PyBytes::new(py, &w), dropped)
    }

    /// Now on the recording's timeline, s.
    fn now_s(&self) -> f64 {
        self.meter.now_s()
    }

    /// Opens an energy window; its number.
    fn open(&mut self, name: &str) -> usize {
        self.meter.open(name)
    }

    /// Closes window `id`, waiting up to `wait_s` for its samples; its figures as JSON
    /// (its energy NaN where its samples cover less than `min_coverage` of it).
    #[pyo3(signature = (id, wait_s=5.0, min_coverage=railtrace::link::meter::DEFAULT_MIN_COVERAGE))]
    fn close(
        &mut self,
        py: Python<'_>,
        id: usize,
        wait_s: f64,
        min_coverage: f64,
    ) -> PyResult<String> {
        let meter = &mut self.meter;
        let w = py
            .detach(|| meter.close(id, Duration::from_secs_f64(wait_s), min_coverage))
            .map_err(err)?;
        serde_json::to_string(&w).map_err(err)
    }

    /// The capture's counters, as JSON.
    fn progress(&self) -> PyResult<String> {
        serde_json::to_string(&self.meter.progress()).map_err(err)
    }

    /// Stops the capture and closes its recording; its summary as JSON.
    fn finish(&mut self, py: Python<'_>) -> PyResult<String> {
        let meter = &mut self.meter;
        let s = py.detach(|| meter.finish()).map_err(err)?;
        serde_json::to_string(&s).map_err(err)
    }
}

/// A profiling run on the digital twin into `output` (its rig's capture beside it as
/// `<name>.rig.arrow`): what it recorded, as JSON.
#[pyfunction]
#[pyo3(signature = (output, runs=300, kernel="gemm".to_string(), delay_ms=(1.0, 3.0), count=1, seed=1, scenario=None, rig=None, bin_us=10.0, rate=None, with_rig=true, force=false))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments
fn profile_twin(
    py: Python<'_>,
    output: PathBuf,
    runs: usize,
    kernel: String,
    delay_ms: (f64, f64),
    count: u32,
    seed: u64,
    scenario: Option<PathBuf>,
    rig: Option<PathBuf>,
    bin_us: f64,
    rate: Option<u32>,
    with_rig: bool,
    force: bool,
) -> PyResult<String> {
    use railtrace::gpu::profile::{on_twin, Plan, Run};
    use railtrace::store::recording::rig_path;
    let (lo, hi) = delay_ms;
    if !(lo >= 0.0 && hi >= lo) {
        return Err(invalid(format!(
            "delay_ms ({lo}, {hi}): need 0 <= min <= max"
        )));
    }
    for out in [output.clone(), rig_path(&output)] {
        recording::check_output(&out, force).map_err(err)?;
    }
    let plan = Plan {
        launch: railtrace::gpu::Launch {
            kernel,
            delay_s: (lo * 1e-3, hi * 1e-3),
            warmup: 0,
            count,
            dvfs: None,
        },
        runs,
        clock_reads: 5,
        trigger_line: 0,
        target: None,
        preheat_s: 0.0,
    };
    let run = Run {
        output,
        rate_hz: rate,
        bin_s: bin_us * 1e-6,
        scenario,
        rig,
        allow_drops: false,
        rig_rise_s: None,
        target_error: None,
    };
    let p = py
        .detach(|| on_twin(&run, &plan, seed, with_rig, |_| {}))
        .map_err(err)?;
    Ok(serde_json::json!({
        "acquired": p.acquired,
        "rig": p.rig.map(|r| serde_json::json!({
            "output": r.output, "rows": r.rows, "progress": r.progress,
        })),
    })
    .to_string())
}

/// Identifies the logger of `input` (a profiling run with its rig's capture, or a
/// recording holding reference samples and logger readings): the model as TOML and as
/// JSON, the seconds it took and the reference samples used.
#[pyfunction]
#[pyo3(signature = (input, rig=None, period_ms=None, column="power.draw".to_string(), family=None))]
fn calibrate(
    py: Python<'_>,
    input: PathBuf,
    rig: Option<PathBuf>,
    period_ms: Option<f64>,
    column: String,
    family: Option<String>,
) -> PyResult<(String, String, f64, usize)> {
    use railtrace::analysis::calibrate::{Family, Request};
    let column = column.parse().map_err(invalid)?;
    let family = family
        .map(|f| {
            Family::ALL
                .into_iter()
                .find(|x| x.name() == f)
                .ok_or_else(|| {
                    let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
                    invalid(format!(
                        "{f:?} is not a logger family; one of {}",
                        names.join(", ")
                    ))
                })
        })
        .transpose()?;
    let req = Request {
        period_ms,
        column,
        family,
    };
    let c = py
        .detach(|| railtrace::analysis::calibrate::calibrate(&input, rig, req, |_| {}))
        .map_err(err)?;
    let toml = c.model.to_toml().map_err(anyhow_err)?;
    let json = serde_json::to_string(&c.model).map_err(err)?;
    Ok((toml, json, c.seconds, c.reference_samples))
}

/// A model file's text (read from `path`, or given) as JSON.
#[pyfunction]
fn model_json(path: PathBuf, text: Option<String>) -> PyResult<String> {
    let m = match text {
        Some(t) => LoggerModel::parse(&path, &t),
        None => LoggerModel::read(&path),
    }
    .map_err(anyhow_err)?;
    serde_json::to_string(&m).map_err(err)
}

/// What the logger of model `text` would read of power `power_w` (float64 bytes) on a
/// grid `dt_s` wide, from `idle_w` before it: float64 bytes.
#[pyfunction]
fn model_through<'py>(
    py: Python<'py>,
    text: String,
    power_w: &[u8],
    dt_s: f64,
    idle_w: f64,
) -> PyResult<Bound<'py, PyBytes>> {
    let m = LoggerModel::parse(std::path::Path::new("the model"), &text).map_err(anyhow_err)?;
    let p: Vec<f64> = power_w
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default()))
        .collect();
    if !(dt_s > 0.0 && dt_s.is_finite()) {
        return Err(invalid(format!("dt_s {dt_s}: must be a time step > 0")));
    }
    let r = m.through(&p, dt_s, idle_w).map_err(anyhow_err)?;
    let bytes: Vec<u8> = r.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(PyBytes::new(py, &bytes))
}

/// The stitched logger profile of the profiling run `profile` corrected with the model at
/// `logger`: the corrected profile as an Arrow IPC stream, and its figures as JSON.
#[pyfunction]
#[pyo3(signature = (profile, logger, rig=None, bin_us=10.0))]
fn correct<'py>(
    py: Python<'py>,
    profile: PathBuf,
    logger: PathBuf,
    rig: Option<PathBuf>,
    bin_us: f64,
) -> PyResult<(Bound<'py, PyBytes>, String)> {
    let model = LoggerModel::read(&logger).map_err(anyhow_err)?;
    let rig = rig.unwrap_or_else(|| railtrace::store::recording::rig_path(&profile));
    let (bytes, figures) = py
        .detach(|| -> anyhow::Result<(Vec<u8>, String)> {
            let c = railtrace::analysis::correct::correct(
                &profile,
                &rig,
                &model,
                &logger,
                bin_us * 1e-6,
                railtrace::analysis::correct::recorded_accuracy(&rig),
            )?;
            let figures = railtrace::analysis::correct::figures(
                &c,
                &model,
                &logger,
                &railtrace::analysis::correct::PlanFor::default(),
            );
            let batch = railtrace::analysis::correct::table(&c, &figures)?;
            let mut w = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema())?;
            w.write(&batch)?;
            w.finish()?;
            Ok((w.into_inner()?, figures.to_string()))
        })
        .map_err(anyhow_err)?;
    Ok((PyBytes::new(py, &bytes), figures))
}

#[pymodule]
fn _railtrace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(profile_twin, m)?)?;
    m.add_function(wrap_pyfunction!(calibrate, m)?)?;
    m.add_function(wrap_pyfunction!(model_json, m)?)?;
    m.add_function(wrap_pyfunction!(model_through, m)?)?;
    m.add_function(wrap_pyfunction!(correct, m)?)?;
    m.add("Error", m.py().get_type::<Error>())?;
    m.add_function(wrap_pyfunction!(recording_ipc, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_json, m)?)?;
    m.add_class::<Twin>()?;
    m.add_class::<Meter>()?;
    Ok(())
}
