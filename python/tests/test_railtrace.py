"""railtrace from Python against the digital twin: capture a few seconds, read them as
they come and from the recording, and an energy window whose energy is the recording's
own integral over it."""

import os
import time

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
