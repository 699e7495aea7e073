"""eo_files with real Spark: DataSource stream/batch writers, foreachBatch, readers."""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from connectors.core.sink import TaskInfo
from connectors.files.sink import FileSink
from tests.helpers import assert_exact, wait_for


def data_files(out: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(out):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        found += [os.path.join(root, f) for f in files if not f.startswith((".", "_"))]
    return sorted(found)


def test_foreach_batch_replay_gives_the_same_files(spark, tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out, max_records_per_file=100)
    df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "cast(id % 7 as int) as k")
    sink(df, 0)
    first = {f: os.path.getsize(f) for f in data_files(out)}
    assert len(first) == 12  # 4 tasks x 250 rows, rolled every 100 rows: 100+100+50 each
    sink(df, 0)  # replayed batch: no new files
    sink.write(df, 0)
    assert {f: os.path.getsize(f) for f in data_files(out)} == first
    assert_exact([r.id for r in spark.read.parquet(out).collect()], range(1000))
    assert_exact(ds.dataset(out, format="parquet").to_table().column("id").to_pylist(),
                 range(1000))
    assert len(pd.read_parquet(out)) == 1000


def test_batch_writer_with_partition_by_option(spark, tmp_path):
    out = str(tmp_path / "out")
    df = spark.range(0, 300, numPartitions=3).selectExpr("id", "concat('g:', id % 3) as grp")
    (df.write.format("eo_files").option("path", out).option("batchId", 5)
     .option("partitionBy", "grp").mode("append").save())
    assert sorted(d for d in os.listdir(out) if not d.startswith("_")) == \
        ["grp=g%3A0", "grp=g%3A1", "grp=g%3A2"]
    for f in data_files(out):
        assert os.path.basename(f).startswith("part-000000000005-")
        assert pq.read_schema(f).names == ["id"]
    got = spark.read.parquet(out).collect()
    assert_exact([(r.id, r.grp) for r in got], [(i, f"g:{i % 3}") for i in range(300)])
    t = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    assert_exact(zip(t.column("id").to_pylist(), t.column("grp").to_pylist(), strict=True),
                 [(i, f"g:{i % 3}") for i in range(300)])


def test_stream_writer_commits_each_batch_once(spark, tmp_path):
    out = str(tmp_path / "out")
    stream = spark.readStream.format("rate").option("rowsPerSecond", 500).load()
    q = (
        stream.selectExpr("value", "cast(value % 2 as int) as parity")
        .writeStream.format("eo_files").option("path", out).option("partitionBy", "parity")
        .option("maxRecordsPerFile", 50)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="500 milliseconds").start()
    )
    try:
        wait_for(lambda: (q.lastProgress or {}).get("batchId", -1) >= 3, 120, what="4 batches")
    finally:
        q.stop()
    values = [r.value for r in spark.read.parquet(out).collect()]
    assert values and len(values) == len(set(values))
    assert sorted(values) == list(range(len(values)))  # rate values are contiguous from 0
    assert FileSink(out).last_committed() >= 3
    assert {d for d in os.listdir(out) if not d.startswith("_")} == {"parity=0", "parity=1"}


def test_readers_ignore_staging_logs_and_uncommitted_files(spark, tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    sink.write(spark.range(0, 100, numPartitions=2), 0)
    # An uncommitted batch: staged files exist, nothing is committed.
    df = spark.range(100, 200, numPartitions=1)
    batches = df.toArrow().to_batches()
    sink.stage(TaskInfo(1, 0), iter(batches))
    assert os.listdir(os.path.join(out, "_eo_staging", "1"))
    assert spark.read.parquet(out).count() == 100
    assert ds.dataset(out, format="parquet").count_rows() == 100
    assert len(pd.read_parquet(out)) == 100
    # Stretch: with _spark_metadata Spark lists only logged files, like its own file sink;
    # a complete but uncommitted file dropped in the directory stays invisible to Spark.
    shutil.copy(data_files(out)[0], os.path.join(out, "part-stray.parquet"))
    assert spark.read.parquet(out).count() == 100
    assert ds.dataset(out, format="parquet").count_rows() > 100  # listing readers see it


def test_spark_reads_the_metadata_log_across_compactions(spark, tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    for b in range(12):  # compaction at batch 9
        sink.write(spark.range(b * 10, b * 10 + 10, numPartitions=1), b)
    assert os.path.exists(os.path.join(out, "_spark_metadata", "9.compact"))
    assert_exact([r.id for r in spark.read.parquet(out).collect()], range(120))


def test_without_spark_metadata_spark_lists_directories_and_skips_underscores(spark, tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out, spark_metadata=False, format="parquet")
    sink.write(spark.range(0, 50, numPartitions=2), 0)
    sink.stage(TaskInfo(1, 0), iter(spark.range(50, 60).toArrow().to_batches()))
    assert not os.path.exists(os.path.join(out, "_spark_metadata"))
    assert_exact([r.id for r in spark.read.parquet(out).collect()], range(50))


def test_jsonl_and_csv_through_the_datasource(spark, tmp_path):
    df = spark.range(0, 40, numPartitions=2).selectExpr("id", "concat('v', id) as v")
    for fmt, comp in (("jsonl", "gzip"), ("csv", "none")):
        out = str(tmp_path / fmt)
        (df.write.format("eo_files").option("path", out).option("format", fmt)
         .option("compression", comp).option("batchId", 0).mode("append").save())
        reader = spark.read.json(out) if fmt == "jsonl" else \
            spark.read.option("header", True).option("inferSchema", True).csv(out)
        assert_exact([int(r.id) for r in reader.collect()], range(40))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"format": "avro"}, "option 'format' has unsupported value 'avro'"),
        ({"path": "oss://bucket/out"}, "Alibaba OSS"),
        ({"path": "file://somehost/x"}, "must not name a host"),
        ({"partitionBy": "missing"}, "'partitionBy' names column 'missing'"),
    ],
)
def test_bad_options_fail_before_any_write(spark, tmp_path, options, match):
    out = str(tmp_path / "out")
    opts = {"path": out, "batchId": "0", **options}
    with pytest.raises(Exception, match=match):
        spark.range(10).write.format("eo_files").options(**opts).mode("append").save()
    assert not os.path.exists(out)


def test_path_that_is_a_file_fails_before_any_write(spark, tmp_path):
    f = tmp_path / "file"
    f.write_text("not a directory")
    with pytest.raises(Exception, match="is an existing file"):
        (spark.range(10).write.format("eo_files").option("path", str(f)).option("batchId", 0)
         .mode("append").save())
    assert f.read_text() == "not a directory"
