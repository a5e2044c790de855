#!/usr/bin/env python3
"""Opens a railtrace recording the way a pandas/polars user would, and checks it.

    python3 host/tests/check_recording.py RUN.arrow [--no-gaps]

With pyarrow and polars: the stream opens as it is; the `railtrace` metadata parses and
names the rails; every rail has its V, A and W columns with their units; `kind` holds
only documented kinds; samples are there, with time increasing and total_w the sum of
the rails' watts; polars reads the same rows, and DuckDB queries them (over pyarrow) to
the same count and mean power. `--no-gaps` also asserts no gap rows.
Exits non-zero with a message on the first failure.
"""

import json
import sys

import duckdb
import polars as pl
import pyarrow.compute as pc
import pyarrow.ipc as ipc

KINDS = {"sample", "gap", "edge", "time_sync", "logger", "status", "info", "log",
         "execution", "clock_read", "driven", "dvfs_request"}


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    path = argv[1]
    table = ipc.open_stream(path).read_all()
    meta = json.loads(table.schema.metadata[b"railtrace"])
    assert table.schema.metadata[b"railtrace.format"] == b"railtrace-recording"
    assert meta["version"] == 4, meta
    temp = table.schema.field("logger_temp_c")
    assert temp.metadata[b"unit"] == b"degC", temp.metadata
    for rail in meta["rails"]:
        for suffix, unit in (("_v", b"V"), ("_a", b"A"), ("_w", b"W")):
            f = table.schema.field(rail + suffix)
            assert f.metadata[b"unit"] == unit, (f.name, f.metadata)
    kinds = set(table.column("kind").to_pylist())
    assert kinds <= KINDS, kinds
    samples = table.filter(pc.equal(table["kind"], "sample"))
    n = samples.num_rows
    assert n > 0, "no samples"
    t = samples["time_s"]
    assert pc.all(pc.greater(t[1:], t[:-1])).as_py(), "time_s increases"
    rails = samples[meta["rails"][0] + "_w"]
    for r in meta["rails"][1:]:
        rails = pc.add(rails, samples[r + "_w"])
    worst = pc.max(pc.abs(pc.subtract(samples["total_w"], rails))).as_py()
    top = pc.max(pc.abs(samples["total_w"])).as_py()
    assert worst < 1e-3 * max(1.0, top), f"total_w is the rails' sum (off by {worst} W)"
    span = t[-1].as_py() - t[0].as_py()
    gaps = table.filter(pc.equal(table["kind"], "gap")).num_rows
    if "--no-gaps" in argv:
        assert gaps == 0, f"{gaps} gap rows"
    df = pl.read_ipc_stream(path)
    assert df.height == table.num_rows, (df.height, table.num_rows)
    assert df.filter(pl.col("kind") == "sample").height == n
    con = duckdb.connect()
    con.register("recording", table)
    count, mean = con.sql(
        "select count(*), avg(total_w) from recording where kind = 'sample'").fetchall()[0]
    assert count == n, (count, n)
    assert abs(mean - pc.mean(samples["total_w"]).as_py()) < 1e-6 * max(1.0, abs(mean))
    print(
        f"{path}: {table.num_rows} rows, {n} samples over {span:.3f} s, "
        f"{gaps} gaps, rails {', '.join(meta['rails'])}; pyarrow, polars and DuckDB agree"
    )


if __name__ == "__main__":
    main(sys.argv)
