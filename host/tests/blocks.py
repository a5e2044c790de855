"""A railtrace recording's samples in Python, from its block rows, as host/RECORDING.md
shows it ("Reading blocks without railtrace"): one row per sample with `time_s`, `index`,
`tick`, every `<rail>_v/_a/_w` and `total_w`, worked out from the codes by the metadata's
`derive` (float32, as railtrace computes them). Used by check_recording.py and
check_parquet.py.
"""

import json

import polars as pl
import pyarrow.ipc as ipc


def meta_of(path):
    return json.loads(ipc.open_stream(path).schema.metadata[b"railtrace"])


def samples(path, meta=None):
    meta = meta or meta_of(path)
    d = meta.get("derive")
    if d is None:
        return None
    n = len(d["channels"])
    codes = (pl.read_ipc_stream(path).filter(pl.col("kind") == "block")
             .select("time_s", "index", "tick", "period_ticks", "codes")
             .with_columns(block=pl.int_range(pl.len()))
             .with_columns(pos=pl.int_ranges(0, pl.col("codes").list.len()))
             .explode("codes", "pos")
             .with_columns(k=pl.col("pos") // n, channel=pl.col("pos") % n))
    s = (codes.pivot(on="channel",
                     index=["block", "time_s", "index", "tick", "period_ticks", "k"],
                     values="codes")
         .sort("block", "k")
         .with_columns(
             time_s=pl.col("time_s") + pl.col("k") * pl.col("period_ticks") / d["tick_hz"],
             index=pl.col("index") + pl.col("k"),
             tick=pl.col("tick") + pl.col("k") * pl.col("period_ticks")))

    def value(p):
        if p is None:
            return None
        scale, offset = (pl.lit(x, dtype=pl.Float32) for x in d["cal"][p])
        return pl.col(str(p)).cast(pl.Float32) * scale + offset

    total = pl.lit(0.0, dtype=pl.Float32)
    out = [pl.col("time_s"), pl.col("index").cast(pl.UInt64), pl.col("tick").cast(pl.UInt64)]
    for rail, (v, a) in zip(meta["rails"], d["rails"]):
        volts, amps = value(v), value(a)
        nan = pl.lit(None, dtype=pl.Float32)
        watts = volts * amps if volts is not None and amps is not None else nan
        out += [(volts if volts is not None else nan).alias(f"{rail}_v"),
                (amps if amps is not None else nan).alias(f"{rail}_a"),
                watts.alias(f"{rail}_w")]
        if volts is not None and amps is not None:
            total = total + watts
    return s.select(out + [total.alias("total_w")])
