"""railtrace from Python: an external power meter for GPU power rails.

- :func:`open` reads a recording (a capture, a profile, an import) as Arrow tables;
- :class:`Rig` captures a rig (or the digital twin's) in the background, reads its
  samples as NumPy arrays, measures the energy over windows of code, as Zeus does for a
  GPU (and the GPU's own logger's energy over the same windows), drives the rig's
  trigger outputs and marks events into the recording;
- :func:`twin` starts the digital twin of a bench and gives its rig's port;
- the analysis: :func:`profile_twin` (a profiling run on the twin), :func:`calibrate`
  (a GPU logger identified against the rig: a :class:`LoggerModel`),
  :meth:`LoggerModel.through` (what that logger would read of a power series) and
  :func:`correct` (a stitched logger profile with the logger's response undone).

Everything is done by the railtrace library itself (Rust), not by its command line;
errors are :class:`Error` with the command line's one-line message, and where Python has
a class for them, of that class too: a missing file is a ``FileNotFoundError``
(:class:`MissingFile`), a value that cannot be meant a ``ValueError``
(:class:`InvalidArgument`), a rig that stopped, went away or does not answer an
``OSError`` (:class:`DeviceError`).
"""

from __future__ import annotations

import builtins
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc

from . import _railtrace
from ._railtrace import Error


class MissingFile(Error, FileNotFoundError):
    """A file that is not there (a recording, a rig description, a logger model)."""


class InvalidArgument(Error, ValueError):
    """A value given that cannot be meant (a logger's name, a trigger line, a time)."""


class DeviceError(Error, OSError):
    """The rig (or the twin) stopped, went away, or does not answer on its port."""

__all__ = ["Error", "MissingFile", "InvalidArgument", "DeviceError", "IncompleteWindow", "Recording", "open", "Rig", "Window", "Twin", "twin", "profile_twin",
           "LoggerModel", "calibrate", "Correction", "correct"]


class Recording:
    """A recording on disk, read on demand (the file is never held open)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        #: What the file holds, as ``railtrace inspect --json`` prints it.
        self.info: dict = json.loads(_railtrace.inspect_json(self.path))

    @property
    def rails(self) -> list[str]:
        """The rails' names: each has ``<rail>_w`` (and ``_v``, ``_a``) columns."""
        return list(self.info["rails"])

    @property
    def gaps(self) -> list[dict]:
        """Every gap: its time, duration, missing samples and cause."""
        return self.info["gaps"]

    @property
    def damage(self) -> list[str]:
        """Where the file is cut or damaged, one line each (empty for a sound file)."""
        return self.info["damage"]

    @property
    def energy_j(self) -> float:
        """Energy of the total power over the samples, gaps excluded, J."""
        return self.info["energy_j"]

    def table(self, kinds: Optional[Sequence[str]] = None,
              columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The rows (one per sample, and one per event) as a pyarrow Table: only those of
        ``kinds`` (e.g. ``["sample"]``, ``["edge", "gap"]``) and ``columns`` when given."""
        data = _railtrace.recording_ipc(self.path, list(kinds) if kinds else None,
                                        list(columns) if columns else None)
        return pa.ipc.open_stream(data).read_all()

    def samples(self, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The samples: ``time_s``, each rail's watts and ``total_w`` unless ``columns``
        names others (``<rail>_v``, ``<rail>_a``, ``index``, ``tick``, ...)."""
        if columns is None:
            columns = ["time_s"] + [f"{r}_w" for r in self.rails] + ["total_w"]
        t = self.table(["sample"], columns)
        return t.select([c for c in t.column_names if c in columns])

    def events(self) -> pa.Table:
        """Every row that is not a sample or a summary: gaps, trigger edges, time syncs,
        the GPU logger's readings, kernel executions, the device's status and logs."""
        kinds = [k for k, n in self.info["rows"].items() if n and k not in ("sample", "summary", "block")]
        return self.table(kinds)

    def __repr__(self) -> str:
        return f"<railtrace.Recording {self.path!r}: {self.info['source']}>"


def open(path: str | os.PathLike) -> Recording:  # noqa: A001 (as the library names it)
    """Opens a recording; ``railtrace.open(p).samples()`` is its samples as a table."""
    return Recording(path)


class IncompleteWindow(Error):
    """A window whose samples cover less of it than asked (``Rig.window(...,
    on_gap="raise")``); its figures are in ``window``."""

    def __init__(self, message: str, window: "Window"):
        super().__init__(message)
        self.window = window


@dataclass
class Window:
    """An energy window on a :class:`Rig`: its figures are filled in when it closes.

    ``energy_j`` is the rig's: every sample's total power in the window times the sample
    period. Where samples are missing (lost on the link, dropped on the device, a
    disconnection: the recording's gap rows), ``samples`` is what arrived,
    ``samples_expected`` what the window spans, ``missing_s`` its time without samples,
    ``coverage`` the part covered and ``gaps`` the gap rows it overlaps; ``mean_w`` is the
    mean of the samples there are (missing time is never divided into it), and
    ``energy_j`` is their energy with the missing time at that mean, or NaN where
    ``coverage`` is below ``min_coverage`` (``on_gap="raise"``: :class:`IncompleteWindow`
    is raised instead). Where the rig reads a GPU logger (``Rig(..., logger=...)``),
    ``logger_energy_j`` is that logger's over the same span, each reading's power held
    from its time until the next reading (what a user of the logger alone computes),
    ``logger_mean_w`` its mean and ``logger_readings`` its readings in the window; all
    three are None without a logger. The recording marks the window's opening and
    closing (log rows ``mark: window <name> opened`` and ``mark: window <name> closed:
    ...``)."""

    name: str
    rig: "Rig"
    start_s: float = float("nan")
    end_s: float = float("nan")
    duration_s: float = float("nan")
    energy_j: float = float("nan")
    mean_w: float = float("nan")
    samples: int = 0
    samples_expected: int = 0
    missing_s: float = float("nan")
    coverage: float = float("nan")
    gaps: int = 0
    logger_energy_j: Optional[float] = None
    logger_mean_w: Optional[float] = None
    logger_readings: Optional[int] = None
    min_coverage: float = 0.999
    on_gap: str = "nan"
    _id: Optional[int] = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_coverage <= 1.0:
            raise InvalidArgument(f"min_coverage {self.min_coverage!r}: a part of the window, 0 to 1")
        if self.on_gap not in ("nan", "raise"):
            raise InvalidArgument(f"on_gap {self.on_gap!r}: 'nan' or 'raise'")

    def __enter__(self) -> "Window":
        self._id = self.rig._meter().open(self.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        figures = json.loads(self.rig._meter().close(self._id, min_coverage=self.min_coverage))
        for k in ("start_s", "end_s", "duration_s", "energy_j", "mean_w", "samples",
                  "samples_expected", "missing_s", "coverage", "gaps",
                  "logger_energy_j", "logger_mean_w", "logger_readings"):
            setattr(self, k, figures[k])
        # JSON has no NaN: a figure that is NaN (no energy below the coverage asked) is null.
        for k in ("energy_j", "mean_w", "coverage", "missing_s"):
            if getattr(self, k) is None:
                setattr(self, k, float("nan"))
        if self.on_gap == "raise" and self.coverage < self.min_coverage and exc[0] is None:
            raise IncompleteWindow(
                f"window {self.name!r}: its samples cover {100 * self.coverage:.3f} % of it "
                f"({self.samples} of {self.samples_expected}, {self.gaps} gaps), less than "
                f"the {100 * self.min_coverage:.3f} % asked", self)


class Rig:
    """A rig captured in the background while the block runs::

        with railtrace.Rig(port, output="run.arrow") as rig:
            with rig.window("gemm") as w:
                run_gemm()
            print(w.energy_j, w.duration_s, w.mean_w)
            t, watts = rig.read()

    The capture records exactly as ``railtrace capture`` does (to ``output``, or to a
    temporary file removed on close); reading it, or not, costs it no sample.

    ``rate`` is the sample rate (Hz; the rig's highest when not given), ``rig`` the rig's
    description (``hardware/rigs/*.toml``: rail and trigger names), ``force`` replaces
    an existing ``output``. With ``rig``, a ``rate`` more than the rig's link carries for
    its channels is refused (naming the highest it carries) unless ``allow_drops``: the
    device then drops whole blocks, each a gap row. ``logger`` reads the GPU's own power logger beside the rig,
    every 10 ms: a :class:`Twin` (the twin GPU's logger) or a name, ``"nvml"`` (NVIDIA;
    the package built with its ``nvml`` feature: ``MATURIN_PEP517_ARGS="--features
    nvml" pip install ./python``), ``"hwmon"`` or ``"gpu-metrics"`` (AMD,
    the first card). Its readings go into the recording as logger rows, and every
    :class:`Window` has its energy beside the rig's.
    """

    def __init__(self, port: str | os.PathLike, output: str | os.PathLike | None = None,
                 rate: Optional[int] = None, rig: str | os.PathLike | None = None,
                 force: bool = False, logger: "str | Twin | None" = None,
                 allow_drops: bool = False):
        self.port = os.fspath(port)
        self._temporary = output is None
        if output is None:
            fd, output = tempfile.mkstemp(prefix="railtrace-", suffix=".arrow")
            os.close(fd)
            force = True
        self.output = os.fspath(output)
        if isinstance(logger, Twin):
            logger = logger._t
        self._args = dict(rate=rate, rig=os.fspath(rig) if rig else None, force=force,
                          logger=logger, allow_drops=allow_drops)
        self._m = None
        #: The capture's summary once closed.
        self.summary: Optional[dict] = None

    def _meter(self):
        if self._m is None:
            raise Error("the rig is not started: use it in a `with` block, or call start()")
        return self._m

    def start(self) -> "Rig":
        """Starts capturing (``with`` does it), and reading the GPU's logger where one
        is given (waiting for its first reading)."""
        try:
            self._m = _railtrace.Meter(self.port, self.output, **self._args)
        except Error:
            if self._temporary:
                try:
                    os.remove(self.output)
                except OSError:
                    pass
            raise
        return self

    def close(self) -> dict:
        """Stops capturing and closes the recording (``with`` does it); its summary."""
        if self._m is not None:
            m, self._m = self._m, None
            try:
                self.summary = json.loads(m.finish())
            finally:
                if self._temporary:
                    try:
                        os.remove(self.output)
                    except OSError:
                        pass
        return self.summary

    def __enter__(self) -> "Rig":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def rails(self) -> list[str]:
        """The rails' names, in the order of :meth:`read`'s columns."""
        return self._meter().rails()

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples since the last read: their times (s, shape ``(n,)``) and each
        rail's watts (shape ``(n, rails)``)."""
        t, w, _dropped = self._meter().read()
        t = np.frombuffer(t, dtype="<f8")
        w = np.frombuffer(w, dtype="<f4").reshape(len(t), -1) if len(t) else np.zeros((0, len(self.rails)), "<f4")
        return t, w

    def window(self, name: str, min_coverage: float = 0.999, on_gap: str = "nan") -> Window:
        """An energy window over the ``with`` block it opens. Where its samples cover less
        than ``min_coverage`` of it (0 to 1), its energy is NaN, or with ``on_gap="raise"``
        closing it raises :class:`IncompleteWindow`."""
        return Window(name, self, min_coverage=min_coverage, on_gap=on_gap)

    def now_s(self) -> float:
        """Now, on the recording's timeline (s)."""
        return self._meter().now_s()

    def drive(self, line: int, high: bool = True, pulse_s: Optional[float] = None) -> None:
        """Drives the rig's trigger output ``line`` high (``high=False``: low) and waits
        for the rig to answer: held at that level, or with ``pulse_s`` back to the other
        level after that long, timed by the rig's clock (to its tick). The recording has
        each change as an edge row of line ``line | 0x80`` (128 for output 0), at the
        rig's time of it. A line the rig does not have raises :class:`Error`."""
        self._meter().drive(line, high, pulse_s)

    def pulse(self, line: int, width_s: float, high: bool = True) -> None:
        """A pulse of ``width_s`` on trigger output ``line``: high, then low (or low,
        then high with ``high=False``), as :meth:`drive` with ``pulse_s``."""
        self._meter().drive(line, high, width_s)

    def mark(self, text: str) -> None:
        """Marks the recording now: a log row ``mark: <text>`` at the host's time of the
        call on the recording's timeline."""
        self._meter().mark(text)

    @property
    def progress(self) -> dict:
        """The capture's counters: samples, frames lost, drops, gaps, ..."""
        return json.loads(self._meter().progress())


class Twin:
    """The digital twin of a bench, its rig served on a pseudo-terminal (``port``)."""

    def __init__(self, scenario: str | os.PathLike | None = None, rig: str | os.PathLike | None = None):
        self._t = _railtrace.Twin(os.fspath(scenario) if scenario else None, os.fspath(rig) if rig else None)
        #: The rig's serial port: give it to :class:`Rig`.
        self.port: str = self._t.port

    def stop(self) -> None:
        """Stops the twin."""
        self._t.stop()

    def __enter__(self) -> "Twin":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def twin(scenario: str | os.PathLike | None = None, rig: str | os.PathLike | None = None) -> Twin:
    """Starts the digital twin (the built-in MI300X-like bench unless ``scenario``)."""
    return Twin(scenario, rig)


def profile_twin(output: str | os.PathLike, runs: int = 300, kernel: str = "gemm",
                 delay_ms: tuple[float, float] = (1.0, 3.0), count: int = 1, seed: int = 1,
                 scenario: str | os.PathLike | None = None, rig: str | os.PathLike | None = None,
                 bin_us: float = 10.0, rate: Optional[int] = None, with_rig: bool = True,
                 force: bool = False) -> dict:
    """A profiling run on the digital twin (``railtrace profile``): ``runs`` trains of
    ``count`` executions of ``kernel`` after random delays, the GPU's side into
    ``output`` and the rig's capture beside it (``<name>.rig.arrow``). What it recorded."""
    return json.loads(_railtrace.profile_twin(
        os.fspath(output), runs, kernel, tuple(delay_ms), count, seed,
        os.fspath(scenario) if scenario else None, os.fspath(rig) if rig else None,
        bin_us, rate, with_rig, force))


class LoggerModel:
    """A GPU power logger's identified model (the file ``railtrace calibrate logger``
    writes): its family (``box``, ``partial``, ``exponential``, ``response``), update
    period, window or time constant, delay, gain and offset, each with its standard
    error, every family's fit, and the doubts that keep it from calibrating the logger."""

    def __init__(self, text: str, name: str = "the model"):
        self.text = text
        #: Every field of the model file.
        self.fields: dict = json.loads(_railtrace.model_json(name, text))

    @classmethod
    def read(cls, path: str | os.PathLike) -> "LoggerModel":
        """Reads a model file."""
        with builtins.open(path) as f:
            return cls(f.read(), os.fspath(path))

    def write(self, path: str | os.PathLike) -> None:
        """Writes the model file (TOML)."""
        with builtins.open(path, "w") as f:
            f.write(self.text)

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        if name == "doubts":
            return []
        raise AttributeError(name)

    @property
    def identified(self) -> bool:
        """True when nothing casts doubt on it (``doubts`` is empty)."""
        return not self.fields.get("doubts")

    def through(self, power_w: np.ndarray, dt_s: float, idle_w: Optional[float] = None) -> np.ndarray:
        """What this logger would read of ``power_w`` (W, constant over each step of
        ``dt_s``, at ``idle_w`` before it, the first value when not given), averaged over
        each step: ``gain·(h ∗ P)(t − delay) + offset``."""
        p = np.ascontiguousarray(power_w, dtype="<f8")
        idle = float(p[0]) if idle_w is None and len(p) else float(idle_w or 0.0)
        return np.frombuffer(_railtrace.model_through(self.text, p.tobytes(), float(dt_s), idle), dtype="<f8")

    def __repr__(self) -> str:
        f = self.fields
        return (f"<railtrace.LoggerModel {f['family']}: period {f['period_s'] * 1e3:.3f} ms, delay "
                f"{f['delay_s'] * 1e3:.3f} ms, gain {f['gain']:.4f}, offset {f['offset_w']:.2f} W"
                f"{'' if self.identified else ', NOT IDENTIFIED'}>")


def calibrate(input: str | os.PathLike, rig: str | os.PathLike | None = None,
              period_ms: Optional[float] = None, column: str = "power.draw",
              family: Optional[str] = None) -> LoggerModel:
    """Identifies a GPU's power logger (``railtrace calibrate logger``) from a profiling
    run with its rig's capture (``rig``: ``<input>.rig.arrow`` when not given), or from a
    recording holding reference samples and logger readings (``railtrace import pmd``).
    The family BIC chooses, unless ``family`` names one."""
    text, _json, seconds, samples = _railtrace.calibrate(
        os.fspath(input), os.fspath(rig) if rig else None, period_ms, column, family)
    m = LoggerModel(text, os.fspath(input))
    m.seconds = seconds
    m.reference_samples = samples
    return m


@dataclass
class Correction:
    """A stitched logger profile corrected: per cell ``t_s`` (its centre, s on the
    kernel's time axis), the raw stitched ``logger_w``, the ``corrected_w`` power with its
    95 % band ``lo_w``-``hi_w``, and the rig's own profile ``rig_w``; and the figures (energy
    per execution with its interval, the idle level, the regulariser, and
    ``band_carries``: the scale's, level's and delay's uncertainties the band holds and the
    rig's stated accuracy among them). ``within_range`` says
    whether the correction lies where it can be trusted; ``outside_range`` lists each
    condition that puts it outside (bins too wide for the phases the rig resolves, bins
    no reading reached, too few executions for the phases' levels, a logger model that is
    not a calibration); ``figures["run_plan"]`` holds the bins and executions the planner
    asks for."""

    table: pa.Table
    figures: dict

    @property
    def within_range(self) -> bool:
        return bool(self.figures["validity"]["within_range"])

    @property
    def outside_range(self) -> list:
        return list(self.figures["validity"]["outside"])

    def __getattr__(self, name: str) -> Any:
        if name in ("t_s", "logger_w", "corrected_w", "lo_w", "hi_w", "rig_w"):
            return self.table.column(name).to_numpy()
        if name in self.__dict__.get("figures", {}):
            return self.figures[name]
        raise AttributeError(name)


def correct(profile: str | os.PathLike, logger: "str | os.PathLike | LoggerModel",
            rig: str | os.PathLike | None = None, bin_us: float = 10.0) -> Correction:
    """Undoes the logger's response in a profiling run's stitched logger profile
    (``railtrace correct``), with the model ``logger`` (a file or a :class:`LoggerModel`)."""
    if isinstance(logger, LoggerModel):
        fd, path = tempfile.mkstemp(prefix="railtrace-logger-", suffix=".toml")
        os.close(fd)
        try:
            logger.write(path)
            return correct(profile, path, rig, bin_us)
        finally:
            os.remove(path)
    data, figures = _railtrace.correct(os.fspath(profile), os.fspath(logger),
                                       os.fspath(rig) if rig else None, float(bin_us))
    return Correction(pa.ipc.open_stream(data).read_all(), json.loads(figures))
