"""The one Spark adapter of the sink protocol, exercised with a recording sink."""

from __future__ import annotations

from connectors.spark.datasources import _SinkDataSource
from tests.helpers import RecordingSink, assert_exact


class RecordingDataSource(_SinkDataSource):
    family = "eo_recording"
    factory = staticmethod(lambda options, schema: RecordingSink(options["path"]))

    @classmethod
    def name(cls):
        return "eo_recording"


def test_foreach_batch_stages_per_partition_and_commits_once(spark, tmp_path):
    sink = RecordingSink(str(tmp_path / "out"))
    df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "id * 2 as twice")
    sink(df, 0)
    sink(df, 0)  # replay of a committed batch: a no-op
    sink.write(df.limit(10), 1)
    assert sink.last_committed() == 1
    rows = sink.committed_rows()
    assert_exact([r["id"] for r in rows], list(range(1000)) + list(range(10)))


def test_datasource_stream_writer_uses_spark_batch_ids(spark, tmp_path):
    spark.dataSource.register(RecordingDataSource)
    out = str(tmp_path / "out")
    stream = spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
    q = (
        stream.selectExpr("value as id")
        .writeStream.format("eo_recording").option("path", out)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="200 milliseconds").start()
    )
    try:
        from tests.helpers import wait_for

        wait_for(lambda: (q.lastProgress or {}).get("batchId", -1) >= 2, 120, what="3 batches")
    finally:
        q.stop()
    sink = RecordingSink(out)
    ids = [r["id"] for r in sink.committed_rows()]
    assert len(ids) == len(set(ids)) and len(ids) > 0
    assert sink.last_committed() >= 2


def test_batch_writer_requires_batch_id(spark, tmp_path):
    import pytest

    spark.dataSource.register(RecordingDataSource)
    df = spark.range(5)
    with pytest.raises(Exception, match="batchId"):
        df.write.format("eo_recording").option("path", str(tmp_path)).mode("append").save()
    df.write.format("eo_recording").option("path", str(tmp_path)).option("batchId", 7) \
        .mode("append").save()
    assert RecordingSink(str(tmp_path)).last_committed() == 7
