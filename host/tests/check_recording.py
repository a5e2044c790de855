#!/usr/bin/env python3
"""Opens a railtrace recording the way a pandas/polars user would, and checks it.

    python3 host/tests/check_recording.py RUN.arrow [--no-gaps]

With pyarrow and polars: the stream opens as it is; the `railtrace` metadata parses and
names the rails; every rail has its V, A and W columns with their units; `kind` holds
only documented kinds; samples are there (a capture's in block rows, worked out as
RECORDING.md shows, see blocks.py), with time increasing and total_w the sum of the
rails' watts; polars reads the same rows, and DuckDB queries them (over pyarrow) to the
same count of samples. `--no-gaps` also asserts no gap rows.
Exits non-zero with a message on the first failure.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import blocks  # noqa: E402
import duckdb
import polars as pl
import pyarrow.compute as pc
import pyarrow.ipc as ipc

KINDS = {"sample", "block", "summary", "gap", "edge", "time_sync", "logger", "status", "info", "log",
         "execution", "clock_read", "driven", "dvfs_request"}


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    path = argv[1]
    table = ipc.open_stream(path).read_all()
    meta = json.loads(table.schema.metadata[b"railtrace"])
    assert table.schema.metadata[b"railtrace.format"] == b"railtrace-recording"
    assert meta["version"] == 7, meta
    temp = table.schema.field("logger_temp_c")
    assert temp.metadata[b"unit"] == b"degC", temp.metadata
    energy = table.schema.field("logger_energy_j")
    assert energy.metadata[b"unit"] == b"J", energy.metadata
    for rail in meta["rails"]:
        for suffix, unit in (("_v", b"V"), ("_a", b"A"), ("_w", b"W")):
            f = table.schema.field(rail + suffix)
            assert f.metadata[b"unit"] == unit, (f.name, f.metadata)
    kinds = set(table.column("kind").to_pylist())
    assert kinds <= KINDS, kinds
    rows = table.filter(pc.equal(table["kind"], "sample"))
    samples = blocks.samples(path, meta)
    if samples is None:
        samples = pl.from_arrow(rows)
    else:
        assert rows.num_rows == 0, "a capture's samples are in its block rows"
        in_blocks = pc.sum(table.filter(pc.equal(table["kind"], "block"))["count"]).as_py()
        assert samples.height == in_blocks, (samples.height, in_blocks)
    n = samples.height
    assert n > 0, "no samples"
    t = samples["time_s"]
    assert (t.diff().drop_nulls() > 0).all(), "time_s increases"
    rails = sum(samples[r + "_w"].fill_null(0.0) for r in meta["rails"])
    worst = (samples["total_w"] - rails).abs().max()
    top = samples["total_w"].abs().max()
    assert worst < 1e-3 * max(1.0, top), f"total_w is the rails' sum (off by {worst} W)"
    span = t[-1] - t[0]
    gaps = table.filter(pc.equal(table["kind"], "gap")).num_rows
    if "--no-gaps" in argv:
        assert gaps == 0, f"{gaps} gap rows"
    df = pl.read_ipc_stream(path)
    assert df.height == table.num_rows, (df.height, table.num_rows)
    con = duckdb.connect()
    con.register("recording", table)
    count = con.sql(
        "select coalesce(sum(case when kind = 'block' then count else 1 end), 0) "
        "from recording where kind in ('sample', 'block')").fetchall()[0][0]
    assert count == n, (count, n)
    print(
        f"{path}: {table.num_rows} rows, {n} samples over {span:.3f} s, "
        f"{gaps} gaps, rails {', '.join(meta['rails'])}; pyarrow, polars and DuckDB agree"
    )


if __name__ == "__main__":
    main(sys.argv)
