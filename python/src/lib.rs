//! The Python package's native module, `railtrace._railtrace`: each function calls the
//! railtrace library and hands its answer over as bytes, JSON or plain values; the
//! package's Python side (`railtrace/__init__.py`) makes classes, arrays and tables of
//! them. Errors come back as `railtrace.Error` with the command line's one-line message.

use std::path::PathBuf;
use std::time::Duration;

use arrow_array::{BooleanArray, RecordBatch};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use railtrace::capture::{Config, RigFile};
use railtrace::recording::{self, Kind, Rows, Source};

create_exception!(
    _railtrace,
    Error,
    PyException,
    "What railtrace could not do, in one line (as the command line says it)."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    Error::new_err(e.to_string())
}

fn anyhow_err(e: anyhow::Error) -> PyErr {
    Error::new_err(format!("{e:#}"))
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
        .detach(|| railtrace::inspect::summarise(&path))
        .map_err(anyhow_err)?;
    let mut v = serde_json::to_value(&s).map_err(err)?;
    v["rails"] = serde_json::json!(rails);
    Ok(v.to_string())
}

/// The digital twin of a bench, running: its rig on a pseudo-terminal at `port`.
#[pyclass(unsendable)]
struct Twin {
    twin: Option<railtrace_twin::Twin>,
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
            twin: Some(twin),
            port,
        })
    }

    #[getter]
    fn port(&self) -> String {
        self.port.clone()
    }

    /// Stops the twin (again: nothing).
    fn stop(&mut self) -> PyResult<()> {
        match self.twin.take() {
            Some(t) => t.stop().map_err(err),
            None => Ok(()),
        }
    }
}

/// A rig captured in the background (`railtrace::meter::Meter`).
#[pyclass(unsendable)]
struct Meter {
    meter: railtrace::meter::Meter,
}

#[pymethods]
impl Meter {
    #[new]
    #[pyo3(signature = (port, output, rate=None, rig=None, force=false, wait_s=10.0))]
    fn new(
        py: Python<'_>,
        port: PathBuf,
        output: PathBuf,
        rate: Option<u32>,
        rig: Option<PathBuf>,
        force: bool,
        wait_s: f64,
    ) -> PyResult<Meter> {
        let rig = rig
            .as_deref()
            .map(RigFile::read)
            .transpose()
            .map_err(anyhow_err)?;
        let config = Config {
            port,
            output,
            rig,
            rate_hz: rate,
            rate_at_least_hz: None,
            channels: None,
            averaging: 1,
            duration: None,
            reconnect_wait: Duration::from_secs(60),
            replace: force,
            tap: None,
        };
        let meter = py
            .detach(|| railtrace::meter::Meter::start(config, Duration::from_secs_f64(wait_s)))
            .map_err(err)?;
        Ok(Meter { meter })
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

    /// Closes window `id`, waiting up to `wait_s` for its samples; its figures as JSON.
    #[pyo3(signature = (id, wait_s=5.0))]
    fn close(&mut self, py: Python<'_>, id: usize, wait_s: f64) -> PyResult<String> {
        let meter = &mut self.meter;
        let w = py
            .detach(|| meter.close(id, Duration::from_secs_f64(wait_s)))
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

#[pymodule]
fn _railtrace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add_function(wrap_pyfunction!(recording_ipc, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_json, m)?)?;
    m.add_class::<Twin>()?;
    m.add_class::<Meter>()?;
    Ok(())
}
