"""eo_files formats: rolling, partition directories, jsonl/csv/parquet with compression."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from connectors.core.sink import TaskInfo
from connectors.files.formats import FileFormat, escape_partition_value
from connectors.files.sink import FileSink
from tests.helpers import assert_exact

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("payload", pa.string())])


def rows(start: int, end: int, chunk: int = 100) -> list[pa.RecordBatch]:
    out = []
    for s in range(start, end, chunk):
        ids = list(range(s, min(end, s + chunk)))
        out.append(pa.record_batch(
            [pa.array(ids, pa.int64()), pa.array([f"g{i % 3}" for i in ids]),
             pa.array([f"v{i}" * 20 for i in ids])], schema=SCHEMA))
    return out


def test_rolling_by_records_makes_several_files_per_task(tmp_path):
    sink = FileSink(str(tmp_path), max_records_per_file=100)
    msg = sink.stage(TaskInfo(0, 0), iter(rows(0, 1050, chunk=37)))
    assert [f.rows for f in msg.files] == [100] * 10 + [50]
    sink.commit(0, [msg])
    files = sink.committed_files()
    assert len(files) == 11
    assert [pq.read_metadata(f).num_rows for f in files] == [100] * 10 + [50]
    assert os.path.basename(files[-1]) == "part-000000000000-00000-010.snappy.parquet"


def test_rolling_by_bytes(tmp_path):
    sink = FileSink(str(tmp_path), max_bytes_per_file=40_000, compression="none")
    msg = sink.stage(TaskInfo(0, 0), iter(rows(0, 5000, chunk=100)))
    assert len(msg.files) > 3
    assert sum(f.rows for f in msg.files) == 5000
    # Sizes are checked against uncompressed buffered data, so no file overshoots much.
    assert max(f.bytes for f in msg.files) < 40_000 * 1.5


def test_partition_by_writes_hive_directories(tmp_path):
    sink = FileSink(str(tmp_path), partition_by=["grp"])
    sink.commit(0, [sink.stage(TaskInfo(0, w), iter(rows(w * 60, w * 60 + 60))) for w in (0, 1)])
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith("_")) == \
        ["grp=g0", "grp=g1", "grp=g2"]
    t = ds.dataset(str(tmp_path), format="parquet", partitioning="hive").to_table()
    assert_exact(zip(t.column("id").to_pylist(), t.column("grp").to_pylist(), strict=True),
                 [(i, f"g{i % 3}") for i in range(120)])
    # the partition column is not repeated inside the files
    one = sink.committed_files()[0]
    assert pq.read_schema(one).names == ["id", "payload"]


def test_partition_values_are_escaped_like_spark(tmp_path):
    assert escape_partition_value("a:b/c%") == "a%3Ab%2Fc%25"
    assert escape_partition_value(None) == "__HIVE_DEFAULT_PARTITION__"
    assert escape_partition_value("") == "__HIVE_DEFAULT_PARTITION__"
    assert escape_partition_value(True) == "true"
    assert escape_partition_value(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02 03%3A04%3A05"
    schema = pa.schema([("id", pa.int64()), ("k", pa.string())])
    values = ["a:b", "x/y", None, "plain", "sp ace"]
    batch = pa.record_batch([pa.array(range(5), pa.int64()), pa.array(values)], schema=schema)
    sink = FileSink(str(tmp_path), partition_by="k")
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([batch]))])
    part = ds.partitioning(pa.schema([("k", pa.string())]), flavor="hive")
    t = ds.dataset(str(tmp_path), format="parquet", partitioning=part).to_table()
    assert_exact(zip(t.column("id").to_pylist(), t.column("k").to_pylist(), strict=True),
                 list(zip(range(5), values, strict=True)))


def test_two_partition_columns(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("a", pa.int32()), ("b", pa.string())])
    ids = list(range(40))
    batch = pa.record_batch([pa.array(ids, pa.int64()), pa.array([i % 2 for i in ids], pa.int32()),
                             pa.array([f"b{i % 4}" for i in ids])], schema=schema)
    sink = FileSink(str(tmp_path), partition_by=["a", "b"])
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([batch]))])
    dirs = sorted(os.path.relpath(os.path.dirname(f), tmp_path) for f in sink.committed_files())
    assert dirs == ["a=0/b=b0", "a=0/b=b2", "a=1/b=b1", "a=1/b=b3"]


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_jsonl_roundtrip(tmp_path, compression):
    schema = pa.schema([("id", pa.int64()), ("raw", pa.binary()),
                        ("ts", pa.timestamp("us", tz="UTC")), ("x", pa.float64())])
    batch = pa.record_batch([
        pa.array([1, 2], pa.int64()), pa.array([b"\x00\xff", None]),
        pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), None],
                 pa.timestamp("us", tz="UTC")),
        pa.array([1.5, float("nan")]),
    ], schema=schema)
    sink = FileSink(str(tmp_path), format="jsonl", compression=compression)
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([batch]))])
    (f,) = sink.committed_files()
    opener = gzip.open if compression == "gzip" else open
    if compression == "zstd":
        import pyarrow as _pa

        text = _pa.CompressedInputStream(_pa.OSFile(f), "zstd").read().decode()
    else:
        with opener(f, "rt") as fh:
            text = fh.read()
    lines = [json.loads(x) for x in text.splitlines()]
    assert lines[0] == {"id": 1, "raw": "AP8=", "ts": "2024-01-01T00:00:00+00:00", "x": 1.5}
    assert lines[1]["x"] == "NaN" and lines[1]["raw"] is None
    if compression != "zstd":  # pandas needs the optional 'zstandard' package for .zst
        df = pd.read_json(f, lines=True)
        assert list(df["id"]) == [1, 2]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_csv_roundtrip_with_pyarrow_dataset_and_pandas(tmp_path, compression):
    sink = FileSink(str(tmp_path), format="csv", compression=compression, max_records_per_file=70)
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter(rows(0, 200)))])
    files = sink.committed_files()
    assert len(files) == 3 and all(f.endswith(FileFormat.parse("csv", compression).extension)
                                   for f in files)
    t = ds.dataset(str(tmp_path), format="csv").to_table()
    assert_exact(t.column("id").to_pylist(), range(200))
    assert sum(len(pd.read_csv(f)) for f in files) == 200
    assert pcsv.read_csv(files[0]).num_rows == 70


def test_parquet_codecs(tmp_path):
    for codec in ("gzip", "zstd", "none"):
        d = tmp_path / codec
        sink = FileSink(str(d), compression=codec)
        sink.commit(0, [sink.stage(TaskInfo(0, 0), iter(rows(0, 50)))])
        (f,) = sink.committed_files()
        meta = pq.read_metadata(f)
        expected = {"gzip": "GZIP", "zstd": "ZSTD", "none": "UNCOMPRESSED"}[codec]
        assert meta.row_group(0).column(0).compression == expected
        assert pd.read_parquet(str(d)).shape == (50, 3)


def test_stage_streams_batches_without_collecting(tmp_path):
    """The task writes as batches arrive: after the first batches, bytes are on disk."""
    sink = FileSink(str(tmp_path), format="jsonl")
    seen_sizes = []

    def batches():
        for start in range(0, 20000, 2000):  # ~2.5 MB per batch, above the 1 MB write buffer
            ids = list(range(start, start + 2000))
            yield pa.record_batch([pa.array(ids, pa.int64()), pa.array(["g"] * 2000),
                                   pa.array(["x" * 1200] * 2000)], schema=SCHEMA)
            staging = tmp_path / "_eo_staging" / "0"
            seen_sizes.append(sum(p.stat().st_size for p in staging.iterdir())
                              if staging.exists() else 0)

    sink.stage(TaskInfo(0, 0), batches())
    # data reached the staged file while input was still flowing
    assert 0 < seen_sizes[2] < seen_sizes[-1]
