"""Two streaming queries racing for one sink's state on S3 (the session's real S3 server),
started back to back in one Spark session and running side by side, each with its own
checkpoint and its own sink_id. Exactly one may own the state: the other must fail with
SinkOwnershipError (or the file sink's "two sinks write to this path"), and the output
must hold the winner's rows exactly once, nothing of the loser's."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pyarrow.parquet as pq

from connectors.core.storage import storage_for, storage_options_from
from connectors.demo.services.kafka import produce_records
from connectors.files.sink import committed_files
from tests.helpers import assert_exact, read_topic

N = 400


def _source(spark: Any, bootstrap: str, topic: str) -> Any:
    return (spark.readStream.format("eo_kafka")
            .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100)
            .load())


def _race(start_a: Any, start_b: Any) -> dict[str, str | None]:
    """Start both queries back to back (``start()`` returns at once: their micro-batches
    then run side by side in Spark's own threads); wait for both; what each ended with."""
    queries = {"a": start_a(), "b": start_b()}
    outcome: dict[str, str | None] = {}
    for name, query in queries.items():
        try:
            query.awaitTermination(240)
        except Exception as e:  # noqa: BLE001 - the query's failure is the outcome
            outcome[name] = str(e) + _causes(query)
            continue
        error = query.exception()
        outcome[name] = None if error is None else str(error) + _causes(query)
    return outcome


def _causes(query: Any) -> str:
    """The JVM exception's cause chain (Spark's own message says only "Writing job
    failed"; the Python error of the task or the commit is further down)."""
    found = query._jsq.exception()
    error = found.get() if found.isDefined() else None
    texts = []
    while error is not None and len(texts) < 10:
        texts.append(str(error.toString()))
        error = error.getCause()
    return "\n".join(texts)


def _one_refused(outcome: dict[str, str | None]) -> str:
    failed = {k: v for k, v in outcome.items() if v is not None}
    assert len(failed) == 1, f"expected exactly one loser: {outcome}"
    (loser, text), = failed.items()
    assert "SinkOwnershipError" in text or "two sinks write to this path" in text, text[-3000:]
    return "b" if loser == "a" else "a"


def test_two_file_sink_queries_racing_for_one_s3_path(spark, kafka_bootstrap, new_topic,
                                                      s3_service, s3_bucket, tmp_path):
    topic = new_topic(partitions=2)
    produce_records(kafka_bootstrap, topic,
                    [(str(i).encode(), f"v{i}".encode(), i % 2) for i in range(N)])
    out = f"s3://{s3_bucket}/shared"

    def start(sink_id: str) -> Any:
        def go() -> Any:
            df = _source(spark, kafka_bootstrap, topic).selectExpr(
                "cast(cast(key as string) as bigint) as id",
                f"'{sink_id}' as writer")
            writer = (df.writeStream.format("eo_files").option("path", out)
                      .option("sink_id", sink_id)
                      .option("checkpointLocation", str(tmp_path / f"chk-{sink_id}")))
            for k, v in s3_service.options().items():
                writer = writer.option(k, v)
            return writer.trigger(availableNow=True).start()
        return go

    winner = _one_refused(_race(start("a"), start("b")))
    files = committed_files(out, storage_options=s3_service.python_options())
    storage, _ = storage_for(out, options=storage_options_from(s3_service.python_options(), "t"))
    got = []
    for f in files:
        t = pq.read_table(io.BytesIO(storage.read("/" + f.split("/", 3)[3])))
        got += list(zip(t.column("id").to_pylist(), t.column("writer").to_pylist(), strict=True))
    assert_exact(got, [(i, winner) for i in range(N)], "committed rows of the shared path")


def test_two_kafka_sink_queries_racing_for_one_s3_wal(spark, kafka_bootstrap, new_topic,
                                                     s3_service, s3_bucket, tmp_path):
    src, dst = new_topic(partitions=2), new_topic(partitions=2)
    produce_records(kafka_bootstrap, src,
                    [(str(i).encode(), f"v{i}".encode(), i % 2) for i in range(N)])
    wal = f"s3://{s3_bucket}/wal-{uuid.uuid4().hex[:6]}"

    def start(sink_id: str) -> Any:
        def go() -> Any:
            df = _source(spark, kafka_bootstrap, src).selectExpr(
                "key", f"concat(cast('{sink_id}:' as binary), value) as value")
            writer = (df.writeStream.format("eo_kafka")
                      .option("kafka.bootstrap.servers", kafka_bootstrap)
                      .option("topic", dst).option("sink_id", sink_id).option("walPath", wal)
                      .option("checkpointLocation", str(tmp_path / f"chk-{sink_id}")))
            for k, v in s3_service.options().items():
                writer = writer.option(k, v)
            return writer.trigger(availableNow=True).start()
        return go

    winner = _one_refused(_race(start("a"), start("b")))
    values = [m.value() for m in read_topic(kafka_bootstrap, dst)]
    assert_exact(values, [f"{winner}:v{i}".encode() for i in range(N)], "topic values")
