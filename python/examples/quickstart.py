"""railtrace from Python, no hardware: the digital twin's rig captured for two seconds
beside its GPU's own power logger, an energy window over one of them (the rig's energy
and the logger's), a mark and a trigger pulse, the recording read back as a table; then
a profiling run on the twin, its GPU logger calibrated against the rig and its profile
corrected.

    pip install ./python
    python3 python/examples/quickstart.py
"""
import tempfile
import time
from pathlib import Path

import numpy as np

import railtrace

out = Path(tempfile.mkdtemp()) / "run.arrow"
with railtrace.twin() as twin:  # a virtual rig on a pseudo-terminal; a real one: its port
    print(f"the twin's rig is on {twin.port}")
    with railtrace.Rig(twin.port, output=out, logger=twin) as rig:  # and the GPU's own logger
        time.sleep(0.5)
        rig.mark("one second from here")  # a log row in the recording
        rig.pulse(0, 0.01)  # 10 ms on the rig's trigger output 0: two edge rows
        with rig.window("one second") as w:
            time.sleep(1.0)
        t, watts = rig.read()
        print(f"read {len(t)} samples of {len(rig.rails)} rails ({', '.join(rig.rails)}) as they came")

print(f"window {w.name!r}: {w.energy_j:.3f} J over {w.duration_s:.3f} s, mean {w.mean_w:.1f} W "
      f"({w.samples} samples); the GPU's own logger: {w.logger_energy_j:.3f} J "
      f"({w.logger_readings} readings)")

rec = railtrace.open(out)
samples = rec.samples()
print(f"{out}: {samples.num_rows} samples, {len(rec.gaps)} gaps, {rec.energy_j:.2f} J in all, "
      f"{rec.info['logger']['readings']} logger readings, edges by line {rec.info['edges_by_line']}")
for rail in rec.rails + ["total"]:
    w = samples.column(f"{rail}_w").to_numpy()
    print(f"  {rail:<11} mean {w.mean():7.1f} W   min {w.min():7.1f} W   max {w.max():7.1f} W")

# The analysis: a profiling run on the twin (a kernel 400 times beside its GPU's own 1 ms
# logger, the rig capturing), the logger calibrated against the rig, the logger's
# stitched profile corrected.
profile = out.with_name("profile.arrow")
done = railtrace.profile_twin(profile, runs=400)
print(f"profiled: {done['acquired']['executions']} executions, {done['acquired']['logger_readings']} logger readings")
model = railtrace.calibrate(profile)
print(f"calibrated logger: {model}")
c = railtrace.correct(profile, model)
print(f"corrected: energy per execution {c.energy_j * 1e3:.3f} mJ "
      f"({c.energy_lo_j * 1e3:.3f}-{c.energy_hi_j * 1e3:.3f}), the rig's {c.rig_energy_j * 1e3:.3f} mJ; "
      f"peak {np.nanmax(c.corrected_w):.0f} W where the logger's stitched profile peaks at {np.nanmax(c.logger_w):.0f} W")
