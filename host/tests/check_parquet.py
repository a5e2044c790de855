#!/usr/bin/env python3
"""Checks a `railtrace export --format parquet` file the way pandas/polars users meet it.

    python3 host/tests/check_parquet.py FILE.parquet [RECORDING.arrow]

Opens FILE.parquet with pyarrow and asserts the documented columns (host/EXPORT.md):
names, order, types and `unit` field metadata, the `railtrace` schema metadata, snappy
compression. Given the recording it came from, also asserts the same rows and values
(`kind` compared as text). If polars is installed, reads the file with it too.
Exits non-zero with a message on the first failure.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import blocks  # noqa: E402
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TAIL = [
    ("line", pa.uint8(), None),
    ("rising", pa.bool_(), None),
    ("count", pa.uint64(), None),
    ("duration_s", pa.float64(), "s"),
    ("host_send_ns", pa.int64(), "ns"),
    ("host_recv_ns", pa.int64(), "ns"),
    ("tx_tick", pa.uint64(), "tick"),
    ("logger_w", pa.float64(), "W"),
    ("logger_instant_w", pa.float64(), "W"),
    ("logger_temp_c", pa.float64(), "degC"),
    ("logger_average_w", pa.float64(), "W"),
    ("logger_energy_j", pa.float64(), "J"),
    ("text", pa.string(), None),
    ("gpu_ticks", pa.uint64(), "gpu tick"),
    ("gpu_end_ticks", pa.uint64(), "gpu tick"),
    ("train", pa.uint64(), None),
    ("index_in_train", pa.uint32(), None),
    ("kernel", pa.string(), None),
    ("own_s", pa.float64(), "s"),
]
KINDS = {"sample", "gap", "edge", "time_sync", "logger", "status", "info", "log",
         "execution", "clock_read", "driven", "dvfs_request"}


def expected_columns(meta):
    cols = [
        ("kind", None, None),  # dictionary of strings, checked apart
        ("time_s", pa.float64(), "s"),
        ("index", pa.uint64(), None),
        ("tick", pa.uint64(), "tick"),
    ]
    for rail in meta["rails"]:
        cols += [
            (f"{rail}_v", pa.float32(), "V"),
            (f"{rail}_a", pa.float32(), "A"),
            (f"{rail}_w", pa.float32(), "W"),
        ]
    cols.append(("total_w", pa.float32(), "W"))
    cols += [(f"code{c}", pa.int16(), "code") for c in meta["code_channels"]]
    return cols + TAIL


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit(__doc__)
    path = argv[1]
    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow
    md = schema.metadata or {}
    assert b"railtrace" in md, f"no railtrace key in the schema metadata: {list(md)}"
    meta = json.loads(md[b"railtrace"])
    assert meta["version"] == 7, meta["version"]
    for key in (b"railtrace", b"railtrace.format", b"railtrace.export"):
        assert key in pf.metadata.metadata, f"{key} not in the Parquet key-value metadata"

    want = expected_columns(meta)
    names = [f.name for f in schema]
    assert names == [c[0] for c in want], f"columns {names}"
    kind = schema.field("kind")
    assert pa.types.is_dictionary(kind.type), kind.type
    assert pa.types.is_string(kind.type.value_type), kind.type
    for name, typ, unit in want[1:]:
        f = schema.field(name)
        assert f.type == typ, f"{name}: {f.type}, want {typ}"
        got = (f.metadata or {}).get(b"unit")
        assert got == (unit.encode() if unit else None), f"{name}: unit {got}, want {unit}"
    for rg in range(pf.metadata.num_row_groups):
        for c in range(pf.metadata.num_columns):
            comp = pf.metadata.row_group(rg).column(c).compression
            assert comp == "SNAPPY", f"row group {rg} column {c}: {comp}"

    table = pf.read()
    kinds = set(table.column("kind").to_pylist())
    assert kinds <= KINDS, kinds
    samples = table.filter(pc.equal(table.column("kind"), "sample"))
    if samples.num_rows:
        assert samples.column("time_s").null_count == 0
        assert samples.column("total_w").null_count == 0

    if len(argv) == 3:
        # The recording's events as they are; its samples, from its block rows where a
        # capture keeps them, worked out in Python (blocks.py).
        rec = pa.ipc.open_stream(argv[2]).read_all()
        export = json.loads(md[b"railtrace.export"])
        kind = rec.column("kind").cast(pa.string())
        keep = pc.and_(pc.is_in(kind, pa.array(export["kinds"])),
                       pc.invert(pc.is_in(kind, pa.array(["block", "summary"]))))
        if blocks.samples(argv[2], meta) is None:
            events, exported = rec.filter(keep), table
        else:
            keep = pc.and_(keep, pc.not_equal(kind, "sample"))
            events = rec.filter(keep)
            is_sample = pc.equal(table.column("kind").cast(pa.string()), "sample")
            exported = table.filter(pc.invert(is_sample))
            got = table.filter(is_sample)
            want = blocks.samples(argv[2], meta)
            assert got.num_rows == want.height, (got.num_rows, want.height)
            for name in want.columns:
                a = got.column(name).to_pylist()
                b = want[name].to_list()
                if name == "time_s":
                    worst = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
                    assert worst < 1e-9, f"time_s differs from the blocks' by {worst} s"
                else:
                    assert a == b, f"column {name} differs from the blocks' worked out"
        assert exported.num_rows == events.num_rows, (exported.num_rows, events.num_rows)
        drop = {"period_ticks", "codes"}
        for name in names:
            if name in drop:
                continue
            a, b = exported.column(name), events.column(name)
            if name == "kind":
                a, b = a.cast(pa.string()), b.cast(pa.string())
            assert a.equals(b), f"column {name} differs from the recording"

    try:
        import polars as pl
    except ImportError:
        pl = None
    if pl is not None:
        df = pl.read_parquet(path)
        assert df.columns == names, df.columns
        assert df.height == table.num_rows

    print(
        f"{path}: ok, {table.num_rows} rows, {len(names)} columns, "
        f"rails {', '.join(meta['rails'])}"
        + (", same as the recording" if len(argv) == 3 else "")
    )


if __name__ == "__main__":
    main(sys.argv)
