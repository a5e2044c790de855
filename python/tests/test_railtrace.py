"""railtrace from Python against the digital twin: capture a few seconds, read them as
they come and from the recording, and an energy window whose energy is the recording's
own integral over it; the rig's trigger outputs driven, marks in the recording, and the
twin GPU's own logger read beside the rig."""

import os
import time
from pathlib import Path

import numpy as np
import pytest

import railtrace


@pytest.fixture(scope="module")
def twin():
    with railtrace.twin() as t:
        yield t


def test_an_energy_window_is_the_recordings_integral(twin, tmp_path):
    out = tmp_path / "run.arrow"
    with railtrace.Rig(twin.port, output=out, rate=100_000) as rig:
        rails = rig.rails
        time.sleep(0.3)
        with rig.window("busy") as w:
            time.sleep(0.6)
        t, watts = rig.read()
    assert rails == ["slot_12v", "slot_3v3", "cable1_12v", "cable2_12v"]
    assert w.name == "busy" and abs(w.duration_s - 0.6) < 0.05
    # 100 kS/s: a sample every 10 µs of the window.
    assert abs(w.samples - w.duration_s * 1e5) <= 2
    assert 140 < w.mean_w < 620  # the twin's GPU: 140 W idle, kernels up to ~620 W
    assert abs(w.energy_j - w.mean_w * w.duration_s) < 1e-9 * w.energy_j
    # No GPU logger read: no logger figures.
    assert w.logger_energy_j is None and w.logger_mean_w is None and w.logger_readings is None

    rec = railtrace.open(out)
    s = rec.samples()
    assert s.column_names == ["time_s"] + [f"{r}_w" for r in rails] + ["total_w"]
    ts = s.column("time_s").to_numpy()
    total = s.column("total_w").to_numpy().astype(np.float64)
    inside = (ts >= w.start_s) & (ts < w.end_s)
    assert inside.sum() == w.samples
    energy = total[inside].sum() * 1e-5
    assert abs(energy - w.energy_j) < 1e-6 * energy, (energy, w)

    # Read as they came: the recording's samples, in order, rail by rail.
    assert watts.shape == (len(t), 4) and np.all(np.diff(t) > 0)
    n = len(t)
    # The same ticks, the times summed in another order: to a nanosecond.
    np.testing.assert_allclose(t, ts[:n], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(watts[:, 0], s.column("slot_12v_w").to_numpy()[:n])
    assert rec.gaps == [] and rec.damage == []


def test_a_recording_reads_as_tables(twin, tmp_path):
    out = tmp_path / "run.arrow"
    with railtrace.Rig(twin.port, output=out):
        time.sleep(0.5)
    rec = railtrace.open(out)
    assert rec.info["finalised"] and rec.rails == ["slot_12v", "slot_3v3", "cable1_12v", "cable2_12v"]
    events = rec.events()
    kinds = set(events.column("kind").to_pylist())
    assert "time_sync" in kinds and "sample" not in kinds
    volts = rec.samples(["time_s", "slot_12v_v", "slot_12v_a"])
    v = volts.column("slot_12v_v").to_numpy()
    assert 11.0 < np.median(v) < 13.0  # a 12 V rail
    polars = pytest.importorskip("polars")
    assert polars.from_arrow(volts).height == volts.num_rows


def test_without_an_output_nothing_is_left_behind(twin):
    with railtrace.Rig(twin.port) as rig:
        path = rig.output
        time.sleep(0.2)
        assert rig.progress["samples"] > 0
    assert not os.path.exists(path)


def test_errors_say_what_was_wrong(tmp_path):
    with pytest.raises(railtrace.Error, match="missing.arrow"):
        railtrace.open(tmp_path / "missing.arrow")
    with pytest.raises(railtrace.Error, match="no such serial port"):
        railtrace.Rig("/dev/railtrace-no-such-port", output=tmp_path / "x.arrow").start()
    assert not (tmp_path / "x.arrow").exists()
    rig = railtrace.Rig("/dev/null")
    with pytest.raises(railtrace.Error, match="not started"):
        rig.read()


RIG = Path(__file__).resolve().parents[2] / "hardware" / "rigs" / "pcie-2x8pin-hs.toml"


def rows(rec, kind):
    """The rows of one kind as a list of dicts, in time order."""
    t = rec.table([kind])
    return sorted(t.to_pylist(), key=lambda r: r["time_s"])


def test_a_pulse_on_a_trigger_output_is_recorded_as_two_edges(twin, tmp_path):
    out = tmp_path / "pulse.arrow"
    # The twin's rig is the fast rig, whose description names output 0 "spare".
    with railtrace.Rig(twin.port, output=out, rig=RIG) as rig:
        time.sleep(0.2)
        before = rig.now_s()
        rig.pulse(0, 0.02)
        after = rig.now_s()
        time.sleep(0.1)
    rec = railtrace.open(out)
    tick_hz = rec.info["device"]["tick_hz"]
    edges = [e for e in rows(rec, "edge") if e["line"] == 0x80]
    assert [e["rising"] for e in edges] == [True, False], edges
    assert all(e["text"] == "spare" for e in edges), edges
    rise, fall = edges[0]["time_s"], edges[1]["time_s"]
    # The rig raises the line when the command arrives: between the call and its answer,
    # on the recording's timeline (the device's clock anchored to the host's by time
    # sync, within a few ms).
    assert before - 0.005 < rise < after + 0.005, (before, rise, after)
    # The rig times the pulse: 0.02 s is 480 000 ticks of its 24 MHz clock exactly (a
    # pulse is rounded to the nearest tick, half a tick at most), counted from the rising
    # edge's tick, and its firmware lowers the line at the first pass of its main loop
    # once due. The twin runs that loop every 250 µs plus the OS's sleep overshoot; 10 ms
    # leaves room for a loaded machine.
    width = fall - rise
    assert 0.02 - 1 / tick_hz <= width < 0.02 + 0.010, width


def test_driving_a_line_the_rig_lacks_says_so(twin):
    with railtrace.Rig(twin.port) as rig:
        with pytest.raises(railtrace.Error, match=r"no trigger output 3 \(it has 1\)"):
            rig.drive(3)
        with pytest.raises(railtrace.Error, match="no trigger output 300"):
            rig.drive(300)
        with pytest.raises(railtrace.Error, match="more than 0 s"):
            rig.pulse(0, 0.0)
        rig.drive(0, high=False)  # output 0 answers, held low
    with pytest.raises(railtrace.Error, match="not started"):
        rig.drive(0)


def test_marks_are_log_rows_at_the_time_they_were_made(twin, tmp_path):
    out = tmp_path / "marks.arrow"
    with railtrace.Rig(twin.port, output=out) as rig:
        time.sleep(0.2)
        before = rig.now_s()
        rig.mark("kernel launched")
        after = rig.now_s()
        with rig.window("busy") as w:
            time.sleep(0.2)
    logs = rows(railtrace.open(out), "log")
    texts = [r["text"] for r in logs]
    mark = [r for r in logs if r["text"] == "mark: kernel launched"]
    assert len(mark) == 1, texts
    # Stamped with the host's clock at the call, on the recording's timeline.
    assert before <= mark[0]["time_s"] <= after, (before, mark, after)
    # The window's opening and closing, at its start and end.
    opened = [r for r in logs if r["text"] == "mark: window busy opened"]
    closed = [r for r in logs if r["text"].startswith("mark: window busy closed: ")]
    assert len(opened) == 1 and len(closed) == 1, texts
    assert abs(opened[0]["time_s"] - w.start_s) < 1e-6 and abs(closed[0]["time_s"] - w.end_s) < 1e-6
    assert f"{w.energy_j:.6f} J over {w.duration_s:.6f} s" in closed[0]["text"], closed


def test_a_window_has_the_gpu_loggers_energy_beside_the_rigs(twin, tmp_path):
    out = tmp_path / "logger.arrow"
    with railtrace.Rig(twin.port, output=out, logger=twin) as rig:
        time.sleep(0.3)
        with rig.window("one second") as w:
            time.sleep(1.0)
    # The twin's default logger reports a 1 ms box average every 1 ms: a reading stamped
    # every millisecond of the window.
    assert abs(w.logger_readings - w.duration_s * 1e3) <= 2, w
    assert abs(w.logger_mean_w - w.logger_energy_j / w.duration_s) < 1e-9 * w.logger_mean_w
    # Both read the same GPU, which idles at 140 W and runs its kernels at up to ~620 W.
    # The logger at gain 1 and offset 0 with a 1 W quantum (±0.5 W a reading, averaging
    # out); the rig through its sensors' gain errors (0.4 % at most a channel, in the
    # default scenario's rig truth); each logger reading held for the millisecond after
    # the box it averaged, which moves at most ~0.5 J (480 W × 1 ms) across each end of
    # the window, under 1 % of its ≥ 140 J. Within 2 %:
    assert abs(w.logger_energy_j / w.energy_j - 1) < 0.02, w
    rec = railtrace.open(out)
    # The readings are in the recording, on its timeline.
    readings = rows(rec, "logger")
    assert rec.info["logger"]["readings"] == len(readings) > 1000
    inside = [r for r in readings if w.start_s <= r["time_s"] <= w.end_s]
    assert len(inside) == w.logger_readings
    assert any(r["text"].startswith("mark: window one second closed: ") and "the GPU's logger" in r["text"]
               for r in rows(rec, "log"))


def test_a_logger_must_be_a_twin_or_a_name(twin):
    with pytest.raises(railtrace.Error, match="a twin, or the name of a GPU logger"):
        railtrace.Rig(twin.port, logger=3).start()
    with pytest.raises(railtrace.Error, match='logger "smi": a twin, or the name of a GPU logger'):
        railtrace.Rig(twin.port, logger="smi").start()
    # A twin whose GPU's logger a rig reads is not stopped under it.
    with railtrace.Rig(twin.port, logger=twin):
        with pytest.raises(railtrace.Error, match="close the rig first"):
            twin.stop()


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "profile.arrow"
    done = railtrace.profile_twin(out, runs=400)
    return out, done


def test_a_profile_on_the_twin_is_calibrated_and_corrected(profiled):
    out, done = profiled
    assert done["acquired"]["runs"] == 400 and done["rig"]["progress"]["gaps"] == 0
    assert os.path.exists(str(out).replace(".arrow", ".rig.arrow"))

    # The twin's default logger: a 1 ms box updated every 1 ms, reading the board's power
    # at gain 1 and offset 0 (its sensor is the rig's rails, a few µs behind).
    m = railtrace.calibrate(out)
    assert m.family == "box" and m.identified, m
    assert abs(m.period_s - 1e-3) < 1e-5, m
    assert abs(m.gain - 1) < 0.02 and abs(m.offset_w) < 5, m

    # Its reading of a steady power is gain·P + offset; of a step, a ramp over the window.
    p = np.r_[np.full(100, 150.0), np.full(300, 450.0)]
    r = m.through(p, 10e-6)
    assert abs(r[0] - (m.gain * 150 + m.offset_w)) < 1e-6
    assert abs(r[-1] - (m.gain * 450 + m.offset_w)) < 1e-6
    assert np.all(np.diff(r) >= -1e-9) and r[150] < r[-1]

    # Corrected, the energy per execution is the rig's. 400 runs put about 1 400 readings
    # on the profile (the demo takes 1 000 runs for 2 %): within 4 %.
    c = railtrace.correct(out, m)
    assert c.table.column_names == ["t_s", "logger_w", "corrected_w", "lo_w", "hi_w", "rig_w"]
    assert np.all(c.lo_w <= c.corrected_w + 1e-9) and np.all(c.corrected_w <= c.hi_w + 1e-9)
    assert abs(c.energy_j / c.rig_energy_j - 1) < 0.04, c.figures
    assert c.energy_lo_j <= c.energy_j <= c.energy_hi_j
    # Its verdict: within range, or each condition that puts it outside, said.
    assert c.within_range == (not c.outside_range), c.figures["validity"]
    assert all(isinstance(why, str) and why for why in c.outside_range)

    # The model's file reads back the same.
    path = str(out).replace(".arrow", ".logger.toml")
    m.write(path)
    again = railtrace.LoggerModel.read(path)
    assert again.fields == m.fields


def test_stage_errors_say_what_was_wrong(profiled, tmp_path):
    out, _ = profiled
    with pytest.raises(railtrace.Error, match="already exists|exists"):
        railtrace.profile_twin(out, runs=10)
    with pytest.raises(railtrace.Error, match="not a logger family"):
        railtrace.calibrate(out, family="trapezoid")
    with pytest.raises(railtrace.Error, match="not a logger column"):
        railtrace.calibrate(out, column="watts")


def _outage_scenario(tmp_path):
    """The built-in bench whose link goes away 1.0 s into the run for 0.5 s."""
    scenarios = Path(__file__).resolve().parents[2] / "hardware" / "scenarios"
    text = (scenarios / "default.toml").read_text()
    text = text.replace("[faults]\n", "[faults]\ndisconnect_after_s = 1.0\ndisconnected_s = 0.5\n")
    text = text.replace('rig = "../rigs/', f'rig = "{scenarios.parent}/rigs/')
    path = tmp_path / "outage.toml"
    path.write_text(text)
    return path


def test_a_window_across_a_gap_counts_what_it_lacks_and_raises_when_asked(tmp_path):
    with railtrace.twin(_outage_scenario(tmp_path)) as t:
        with railtrace.Rig(t.port, rate=100_000) as rig:
            time.sleep(0.5)
            with pytest.raises(railtrace.IncompleteWindow) as raised:
                with rig.window("strict", on_gap="raise"):
                    with rig.window("lenient", min_coverage=0.0) as lenient:
                        time.sleep(1.5)
    strict = raised.value.window
    for w in (strict, lenient):
        assert w.gaps == 1
        assert 0.4 < w.missing_s < 0.7  # the outage's half second of the device's samples
        assert abs(w.samples_expected - w.duration_s * 1e5) <= 3
        assert w.samples < w.samples_expected
    assert np.isnan(strict.energy_j)
    # The mean is over the time the samples cover; the energy fills the rest at that mean.
    assert 140 < lenient.mean_w < 620
    assert abs(lenient.energy_j - lenient.mean_w * lenient.duration_s) < 1e-3 * lenient.energy_j
    with pytest.raises(ValueError):
        railtrace.Window("w", None, min_coverage=2.0)


def test_errors_are_of_the_class_python_users_catch(tmp_path):
    with pytest.raises(FileNotFoundError) as missing:
        railtrace.open(tmp_path / "no-such.arrow")
    assert isinstance(missing.value, railtrace.Error) and "no-such.arrow" in str(missing.value)
    with pytest.raises(ValueError):
        railtrace.Rig("/nonexistent", logger="no-such-logger").start()
    with pytest.raises(OSError) as device:
        railtrace.Rig(tmp_path / "no-such-port").start()
    assert isinstance(device.value, railtrace.DeviceError)
