"""Exactly-once reading by eo_kafka across stops, restarts and crashes.

Output goes to Spark's built-in parquet file sink, which is itself exactly-once (its
``_spark_metadata`` log lists committed files only), so a missing or repeated
``(topic, partition, offset)`` can only come from the source.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from connectors.demo.services.kafka import produce_records
from tests.helpers import assert_exact, group_offsets, run_pipeline, wait_for

N = 50_000
PARTS = 3


def _value(i: int) -> bytes:
    return f"v{i}".encode()


def _expected(n: int, parts: int) -> list[tuple[int, int, str]]:
    # produce_records keeps each partition's order, so record i is offset i // parts of
    # partition i % parts.
    return [(i % parts, i // parts, f"v{i}") for i in range(n)]


def _producer(bootstrap: str, topic: str, chunks: int) -> threading.Thread:
    def run() -> None:
        per = N // chunks
        for c in range(chunks):
            produce_records(bootstrap, topic, [(None, _value(i), i % PARTS)
                                             for i in range(c * per, (c + 1) * per)])

    t = threading.Thread(target=run, name="producer", daemon=True)
    t.start()
    return t


def _output(spark: Any, path: str) -> list[tuple[int, int, str]]:
    df = spark.read.parquet(path).select("partition", "offset", "value")
    return [tuple(r) for r in df.collect()]


def test_stop_and_restart_while_records_arrive(spark: Any, kafka_bootstrap: str,
                                               new_topic: Any, tmp_path: Any) -> None:
    topic = new_topic(partitions=PARTS)
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")
    producer = _producer(kafka_bootstrap, topic, chunks=10)

    def start() -> Any:
        return (
            spark.readStream.format("eo_kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "6000").option("walPath", str(tmp_path / "wal"))
            .load().selectExpr("partition", "offset", "cast(value as string) as value")
            .writeStream.format("parquet").option("path", out)
            .option("checkpointLocation", chk).trigger(processingTime="300 milliseconds")
            .start()
        )

    def written() -> int:
        try:
            return int(spark.read.parquet(out).count())
        except Exception:  # noqa: BLE001 - no committed file yet
            return 0

    q = start()
    try:
        wait_for(lambda: written() >= 8_000, 180, interval=1.0, what="first rows")
    finally:
        q.stop()
    first_run = written()
    assert producer.is_alive() or first_run < N, "the restart must happen while data arrives"
    q = start()
    try:
        wait_for(lambda: not producer.is_alive() and written() >= N, 300, interval=1.0,
                 what="all 50,000 rows")
        q.processAllAvailable()
    finally:
        q.stop()
    assert_exact(_output(spark, out), _expected(N, PARTS), "(partition, offset, value)")


@pytest.mark.parametrize("store", ["local", "s3"])
def test_crash_at_every_source_step(spark: Any, kafka_bootstrap: str, new_topic: Any,
                                    tmp_path: Any, store: str, request: Any) -> None:
    """One pipeline, killed (SIGKILL of the whole app) at each source failpoint in turn,
    then run to completion from the same checkpoint and WAL; the WAL on a local disk, then
    on the real S3 server (credentials from the standard AWS environment)."""

    from connectors.core.storage import storage_options_from
    from connectors.core.wal import WriteAheadLog

    wal_url, env, options = str(tmp_path / "wal"), None, None
    if store == "s3":
        s3 = request.getfixturevalue("s3_service")
        wal_url = f"s3://{request.getfixturevalue('s3_bucket')}/wal"
        env, options = s3.env(), storage_options_from(s3.python_options(), "eo_kafka")
    topic = new_topic(partitions=PARTS)
    n = 3_000
    produce_records(kafka_bootstrap, topic, [(None, _value(i), i % PARTS) for i in range(n)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    argv = [
        "tests/integration/pipelines/kafka_source_pipeline.py",
        "--bootstrap", kafka_bootstrap, "--topic", topic, "--out", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "chk"), "--wal", wal_url,
        "--group", group, "--per-batch", "1000",
    ]
    # after_wal_commit@0 fires when batch 1 is planned (Spark commits a batch's source
    # offsets then); after_group_commit is the same instant one step later.
    for point in ("kafka_source.after_wal_commit@0", "kafka_source.mid_read@1#100"):
        result = run_pipeline(argv, failpoint=point, timeout=240, env=env)
        assert result.killed, f"{point} never fired:\n{result.output[-3000:]}"
    result = run_pipeline(argv, timeout=240, env=env)
    assert result.returncode == 0, result.output[-3000:]
    assert_exact(_output(spark, str(tmp_path / "out")), _expected(n, PARTS))

    wal = WriteAheadLog.open(wal_url, "source", options=options)
    assert wal.seqs()[-1] >= 2  # at least 3 windows of <= 1000 offsets
    last = wal.last_committed()
    assert last is not None
    committed = {str(p): o for (t, p), o in group_offsets(kafka_bootstrap, group).items()
                 if t == topic}
    assert committed == wal.get(last)["end"][topic]
