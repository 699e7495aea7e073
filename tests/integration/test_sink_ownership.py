"""Ownership and the new-checkpoint rule with real Spark, per sink (issue 14).

- Two sinks sharing one walPath or output path: the second is refused at a low batch id
  (which it used to skip silently, taking the first sink's commit for its own) and at a
  high one, through the DataSource writer and through ``foreachBatch``.
- A query restarted with a fresh checkpoint against the same sink starts again at batch 0:
  it is refused, and nothing is written; ``eo-connectors sink reset`` records the restart,
  after which the new query writes everything. (A restart from the query's *own* checkpoint
  after a kill between the sink's commit and Spark's commit log is covered by the recovery
  tests' ``*.after_commit`` / ``files.after_log`` failpoints: the replay writes nothing.)
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pandas as pd
import pyarrow.dataset as ds
import pytest

from connectors import cli
from connectors.core.errors import BatchOrderError, SinkOwnershipError
from connectors.files.sink import FileSink
from connectors.kafka.sink import KafkaSink
from tests.helpers import assert_exact, read_topic

ROWS_PER_FILE = 10
FILES = 4


def file_ids(out: str) -> list[int]:
    if not os.path.isdir(out):
        return []
    return sorted(ds.dataset(out, format="parquet", exclude_invalid_files=True)
                  .to_table().column("id").to_pylist())


# -- two sinks, one state ------------------------------------------------------------------------
@pytest.mark.parametrize("writer", ["datasource", "foreachBatch"])
@pytest.mark.parametrize("batch_id", [0, 9])
def test_files_second_sink_on_an_output_path_is_refused(spark, tmp_path, writer, batch_id):
    out = str(tmp_path / "out")
    FileSink(out, sink_id="a").write(spark.range(0, 10), 0)
    df = spark.range(100, 110)
    if writer == "foreachBatch":
        with pytest.raises(SinkOwnershipError, match="belongs to sink_id 'a', not 'b'"):
            FileSink(out, sink_id="b")(df, batch_id)
    else:
        with pytest.raises(Exception, match="belongs to sink_id 'a', not 'b'"):
            df.write.format("eo_files").option("path", out).option("sink_id", "b") \
                .option("batchId", batch_id).mode("append").save()
    assert_exact(file_ids(out), range(10))
    assert not os.path.exists(os.path.join(out, "_eo_staging", str(batch_id)))


@pytest.mark.parametrize("writer", ["datasource", "foreachBatch"])
@pytest.mark.parametrize("batch_id", [0, 9])
def test_kafka_second_sink_on_a_wal_is_refused(spark, kafka_bootstrap, new_topic, tmp_path,
                                                writer, batch_id):
    topic, wal = new_topic(), str(tmp_path / "wal")
    df = spark.range(0, 10).selectExpr("cast(id as string) as value")
    KafkaSink("a", wal, bootstrap_servers=kafka_bootstrap, topic=topic).write(df, 0)
    if writer == "foreachBatch":
        sink = KafkaSink("b", wal, bootstrap_servers=kafka_bootstrap, topic=topic)
        with pytest.raises(SinkOwnershipError, match="belongs to sink_id 'a', not 'b'"):
            sink(df, batch_id)
    else:
        with pytest.raises(Exception, match="belongs to sink_id 'a', not 'b'"):
            df.write.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap) \
                .option("topic", topic).option("sink_id", "b").option("walPath", wal) \
                .option("batchId", batch_id).mode("append").save()
    assert len(read_topic(kafka_bootstrap, topic)) == 10


# -- a new checkpoint against the same sink ------------------------------------------------------
def input_dir(tmp_path: Any) -> str:
    src = str(tmp_path / "in")
    os.makedirs(src)
    for f in range(FILES):
        ids = range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        pd.DataFrame({"id": list(ids)}).to_parquet(os.path.join(src, f"f{f}.parquet"))
    return src


def run(spark, src: str, checkpoint: str, fmt: str, options: dict[str, str],
        value: bool = False) -> Any:
    df = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).parquet(src)
    if value:
        df = df.selectExpr("cast(id as string) as value")
    q = (df.writeStream.format(fmt).options(**options)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        q.awaitTermination(240)
    except Exception as e:  # noqa: BLE001 - a failed query raises here; the test reads it
        return e
    return q.exception()


def restart_cycle(spark, tmp_path, fmt: str, options: dict[str, str], read: Any,
                  reset: list[str], value: bool = False) -> None:
    src = input_dir(tmp_path)
    expected = list(range(FILES * ROWS_PER_FILE))
    assert run(spark, src, str(tmp_path / "chk1"), fmt, options, value) is None
    assert_exact(read(), expected)
    # The user deletes the checkpoint and starts over: batch ids restart at 0.
    error = run(spark, src, str(tmp_path / "chk2"), fmt, options, value)
    assert error is not None and "is below the sink's last committed batch" in str(error)
    assert "new checkpoint" in str(error) and "sink reset" in str(error)
    assert_exact(read(), expected)  # nothing written
    assert cli.main(["sink", "reset", *reset]) == 0
    assert run(spark, src, str(tmp_path / "chk3"), fmt, options, value) is None
    assert_exact(read(), expected * 2)  # the new query wrote its rows (the input again)


def test_files_new_checkpoint_is_refused_until_reset(spark, tmp_path):
    out, sink_id = str(tmp_path / "out"), f"f-{uuid.uuid4().hex[:6]}"
    restart_cycle(spark, tmp_path, "eo_files", {"path": out, "sink_id": sink_id},
                  lambda: file_ids(out), ["--path", out, "--sink-id", sink_id])


def test_jdbc_new_checkpoint_is_refused_until_reset(spark, tmp_path, postgres_url, pg_table):
    import sqlalchemy as sa

    table = pg_table("nc")
    sink_id = f"s_{table}"
    with sa.create_engine(postgres_url).begin() as conn:
        conn.execute(sa.text(f"create table {table} (id bigint)"))

    def read() -> list[int]:
        with sa.create_engine(postgres_url).connect() as conn:
            return [r[0] for r in conn.execute(sa.text(f"select id from {table}"))]  # noqa: S608

    restart_cycle(spark, tmp_path, "eo_jdbc",
                  {"url": postgres_url, "table": table, "sink_id": sink_id}, read,
                  ["--url", postgres_url, "--sink-id", sink_id])


def test_kafka_new_checkpoint_is_refused_until_reset(spark, kafka_bootstrap, new_topic,
                                                     tmp_path):
    topic, wal = new_topic(), str(tmp_path / "wal")
    sink_id = f"k-{uuid.uuid4().hex[:6]}"
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic, "sink_id": sink_id,
               "walPath": wal}

    def read() -> list[int]:
        return [int(m.value()) for m in read_topic(kafka_bootstrap, topic)]

    restart_cycle(spark, tmp_path, "eo_kafka", options, read,
                  ["--wal-path", wal, "--sink-id", sink_id], value=True)


def test_foreach_batch_new_checkpoint_is_refused(spark, tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out, sink_id="fb")
    for b in range(3):
        sink(spark.range(b * 10, b * 10 + 10), b)
    sink(spark.range(900, 910), 2)  # a true replay of the last batch: nothing
    with pytest.raises(BatchOrderError, match="batch 0 is below"):
        sink(spark.range(500, 510), 0)
    assert_exact(file_ids(out), range(30))
