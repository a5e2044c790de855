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
