"""Clients we did not write check our output (tests/README.md, "Clients we did not write"),
on the real broker:

- Spark's own JVM Kafka source (``format("kafka")``, read_committed) reads what the
  ``eo_kafka`` sink wrote, in both delivery modes, after Spark replayed a committed batch;
- the ``eo_kafka`` source reads what Spark's own JVM Kafka sink wrote;
- Kafka's own ``kafka-consumer-groups --describe`` shows the ``eo_kafka`` source's group at
  the offsets its window WAL says are committed.

Spark's JVM connector runs where ``tests/services/spark_jvm.py`` puts it: beside our
pyspark when Maven Central serves the connector for it, otherwise in a virtualenv with the
connector's own pyspark. Every test prints the three versions.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest

from connectors.core.wal import WriteAheadLog
from connectors.demo.services.kafka import produce_records
from connectors.kafka.sink import KafkaSink, commit_facts, partitioner, recovery
from tests.helpers import assert_exact, read_topic, scan_topic
from tests.integration.pipelines.common import kafka_stream
from tests.services.kafka_cli import describe_all_groups, describe_group
from tests.services.spark_jvm import JvmSpark, jvm_read_topic, run_job


def _versions(spark: Any, jvm: JvmSpark, broker: Any, jvm_reported: str | None = None) -> None:
    print(f"versions: our pyspark {spark.version}; {jvm.describe()}"
          + (f" (the job reported Spark {jvm_reported})" if jvm_reported else "")
          + f"; broker Apache Kafka {broker.version}", flush=True)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _available_now(df: Any, checkpoint: Path, fmt: str = "eo_kafka", **options: Any) -> Any:
    writer = df.writeStream.format(fmt).option("checkpointLocation", str(checkpoint))
    for k, v in options.items():
        writer = writer.option(k, str(v))
    q = writer.trigger(availableNow=True).start()
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return q


# -- eo_kafka sink -> Spark's JVM Kafka source -------------------------------------------------
@pytest.mark.parametrize("transactional", [False, True], ids=["recovery-keys", "transactional"])
def test_spark_jvm_source_reads_each_sink_row_once_after_a_replay(
    spark, kafka_broker, jvm_spark, new_topic, tmp_path, transactional
):
    """Copy a topic through ``eo_kafka`` -> ``eo_kafka`` in three batches, make Spark run
    the committed batch 2 again (its commit-log entry removed: a crash after the sink
    committed, before Spark did), then read the output with Spark's JVM source."""
    _versions(spark, jvm_spark, kafka_broker)
    bootstrap = kafka_broker.bootstrap
    src, dst = new_topic(partitions=3), new_topic(partitions=4)
    records = [(None if i % 11 == 0 else f"k{i % 37}".encode(), f"v{i}".encode(), i % 3)
               for i in range(3000)]
    produce_records(bootstrap, src, records)
    expected = [(k, b"B:" + v) for k, v, _ in records]
    sink_id = f"xc-{uuid.uuid4().hex[:8]}"
    wal, chk = tmp_path / "sink-wal", tmp_path / "chk"

    def run() -> Any:
        out = kafka_stream(spark, bootstrap, src, 1000).selectExpr(
            "key", "concat(cast('B:' as binary), value) as value")
        return _available_now(
            out, chk, **{"kafka.bootstrap.servers": bootstrap, "topic": dst,
                         "sink_id": sink_id, "walPath": wal,
                         "transactional": str(transactional).lower(),
                         # transactional: ask for the eo-rk header (off by default there)
                         "recoveryKeyHeaders": str(transactional).lower()})

    first = run()
    assert [(p["batchId"], p["numInputRows"]) for p in first.recentProgress] == [
        (0, 1000), (1, 1000), (2, 1000)]
    _, ends = scan_topic(bootstrap, dst, isolation="read_uncommitted")
    # Spark forgets it committed batch 2; the sink's WAL still says it did.
    (chk / "commits" / "2").unlink()
    (chk / "commits" / ".2.crc").unlink(missing_ok=True)
    replay = run()
    assert [(p["batchId"], p["numInputRows"]) for p in replay.recentProgress] == [(2, 1000)], \
        "Spark did not replay batch 2"
    sink = KafkaSink(sink_id, str(wal), bootstrap_servers=bootstrap, topic=dst,
                     transactional=transactional)
    assert sink.last_committed() == 2

    rows, reported = jvm_read_topic(jvm_spark, bootstrap, dst)
    _versions(spark, jvm_spark, kafka_broker, reported)
    assert_exact([(k, v) for k, v, _, _, _ in rows], expected, "Spark JVM source")
    # Not even an empty transaction: the replay's tasks wrote nothing at all.
    _, ends_after = scan_topic(bootstrap, dst, isolation="read_uncommitted")
    assert ends_after == ends, "the replay of committed batch 2 wrote to the topic"
    # The same records at the same positions as librdkafka's read_committed consumer sees.
    ours = read_topic(bootstrap, dst)
    assert_exact([(p, o, k, v) for k, v, p, o, _ in rows],
                 [(m.partition(), m.offset(), m.key(), m.value()) for m in ours],
                 "Spark JVM source vs confluent-kafka")
    # Java's client reads the recovery keys: every record is traced to its batch (the
    # recovery-key mode always writes them, the transactional one on recoveryKeyHeaders).
    batches = set()
    for _k, _v, _p, _o, headers in rows:
        assert headers is not None and [h for h, _ in headers] == [recovery.HEADER]
        key = recovery.decode(headers[0][1])
        assert key.of_sink(sink_id)
        batches.add(key.batch_id)
    assert batches == {0, 1, 2}
    if transactional:
        _assert_facts_show_no_lag(bootstrap, sink_id, sink.options.facts_topic)


def _assert_facts_show_no_lag(bootstrap: str, sink_id: str, facts_topic: str) -> None:
    """Kafka's own ``kafka-consumer-groups --describe --all-groups`` sees each writer's fact
    group at offset 0 of the empty facts topic: caught up, nothing a lag monitor would alarm
    on (issue 23, item 8)."""
    text, rows = describe_all_groups(bootstrap)
    prefix = commit_facts.group_id(sink_id, 0)[:-1]  # eo-sink-<sink_id>-w
    ours = [r for r in rows if r["GROUP"].startswith(prefix)]
    print("\n".join(line for line in text.splitlines() if prefix in line), flush=True)
    assert ours, f"no commit-fact group of sink {sink_id} in:\n{text}"
    for r in ours:
        assert (r["TOPIC"], r["PARTITION"], r["CURRENT-OFFSET"], r["LOG-END-OFFSET"],
                r["LAG"]) == (facts_topic, "0", "0", "0", "0"), text


# -- Spark's JVM Kafka sink -> eo_kafka source --------------------------------------------------
def _jvm_rows(n: int, partitions: int) -> list[tuple[bytes | None, bytes, Any, int | None]]:
    """``(key, value, headers, partition)``: null keys, headers (one with a null value) on
    two rows in three, an explicit partition on one row in five."""
    rows = []
    for i in range(n):
        key = None if i % 8 == 0 else f"key-{i % 53}".encode()
        if i % 3 == 0:
            headers: Any = (("trace", f"t{i}".encode()), ("empty", None))
        elif i % 3 == 1:
            headers = (("n", str(i).encode()),)
        else:
            headers = None
        rows.append((key, f"jvm-{i}".encode(), headers, i % partitions if i % 5 == 0 else None))
    return rows


def test_eo_kafka_source_reads_what_the_spark_jvm_sink_wrote(
    spark, kafka_broker, jvm_spark, new_topic, tmp_path
):
    bootstrap = kafka_broker.bootstrap
    topic = new_topic(partitions=4)
    rows = _jvm_rows(2400, 4)
    result = run_job(jvm_spark, {
        "action": "write", "bootstrap": bootstrap, "topic": topic,
        "rows": [[_b64(k), _b64(v), None if h is None else [[hk, _b64(hv)] for hk, hv in h], p]
                 for k, v, h, p in rows]})
    _versions(spark, jvm_spark, kafka_broker, result["spark_version"])
    assert result["written"] == len(rows)

    def read(df: Any) -> list[tuple[Any, ...]]:
        return [(r.key, r.value, tuple((h.key, h.value) for h in r.headers) if r.headers
                 else None, r.partition, r.offset)
                for r in df.select("key", "value", "headers", "partition", "offset").collect()]

    batch = read(spark.read.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", topic).option("includeHeaders", "true").load())
    assert_exact([(k, v, h) for k, v, h, _, _ in batch], [(k, v, h) for k, v, h, _ in rows],
                 "eo_kafka batch read")
    given = {v: p for _, v, _, p in rows}
    for key, value, _, part, _ in batch:
        if given[value] is not None:
            assert part == given[value], value
        elif key is not None:  # the Java producer's default partitioner: murmur2
            assert part == partitioner.key_partition(key, 4), value
    # Position by position, what librdkafka's own consumer sees.
    plain = read_topic(bootstrap, topic)
    assert_exact([(p, o, k, v, h) for k, v, h, p, o in batch],
                 [(m.partition(), m.offset(), m.key(), m.value(),
                   tuple(m.headers()) if m.headers() else None) for m in plain],
                 "eo_kafka vs confluent-kafka")
    assert len({p for *_, p, _ in batch}) == 4

    name = f"m_{uuid.uuid4().hex[:8]}"
    stream = kafka_stream(spark, bootstrap, topic, 500, includeHeaders="true")
    q = _available_now(stream, tmp_path / "chk", "memory", queryName=name)
    assert sum(p["numInputRows"] for p in q.recentProgress) == len(rows)
    assert_exact(read(spark.table(name)), batch, "eo_kafka streaming read")


# -- eo_kafka source's group -> Kafka's consumer-group command ---------------------------------
def _window_ends(wal: WriteAheadLog, window: int, topic: str) -> dict[int, int]:
    record = wal.get(window)
    assert record is not None, f"window {window} not in {wal!r}"
    return {int(p): off for p, off in record["end"][topic].items()}


def _described(bootstrap: str, group: str, topic: str) -> tuple[str, dict[int, dict[str, str]]]:
    text, rows = describe_group(bootstrap, group)
    print(text, flush=True)
    return text, {int(r["PARTITION"]): r for r in rows if r["TOPIC"] == topic}


def test_consumer_group_command_shows_the_wal_committed_offsets(
    spark, kafka_broker, jvm_spark, new_topic, tmp_path
):
    """Group commits trail the stream by one batch: Spark calls ``commit(end)`` of batch N
    when it plans batch N+1, and a restarted query commits its last batch at start-up. The
    group must be exactly where the WAL's last committed window ends."""
    _versions(spark, jvm_spark, kafka_broker)
    bootstrap = kafka_broker.bootstrap
    topic = new_topic(partitions=3)
    group = f"xc-group-{uuid.uuid4().hex[:8]}"
    wal_path, chk = str(tmp_path / "source-wal"), tmp_path / "chk"
    produce_records(bootstrap, topic, [(f"k{i}".encode(), f"v{i}".encode(), i % 3)
                                       for i in range(3000)])
    wal = WriteAheadLog.open(wal_path, "source")
    out = str(tmp_path / "out")

    def run() -> Any:
        # A file sink: the memory sink cannot restart from a checkpoint.
        stream = kafka_stream(spark, bootstrap, topic, 1000, walPath=wal_path,
                              **{"kafka.group.id": group})
        return _available_now(stream.select("partition", "offset"), chk, "parquet", path=out)

    # Run 1: windows 0, 1, 2; Spark committed 0 and 1 while planning 1 and 2.
    run()
    assert wal.seqs() == [0, 1, 2]
    assert wal.last_committed() == 1
    committed, latest = _window_ends(wal, 1, topic), _window_ends(wal, 2, topic)
    assert wal.commit_info(1) == {"end": {topic: {str(p): o for p, o in committed.items()}}}
    text, described = _described(bootstrap, group, topic)
    assert {p: int(r["CURRENT-OFFSET"]) for p, r in described.items()} == committed, text
    assert {p: int(r["LOG-END-OFFSET"]) for p, r in described.items()} == latest, text
    assert {p: int(r["LAG"]) for p, r in described.items()} == {
        p: latest[p] - committed[p] for p in latest}, text

    # Run 2 from the same checkpoint, with 1500 more records: Spark commits window 2 at
    # start-up, then plans 3 and 4 (committing 3).
    produce_records(bootstrap, topic, [(f"k{i}".encode(), f"v{i}".encode(), i % 3)
                                       for i in range(3000, 4500)])
    run()
    assert wal.seqs() == [0, 1, 2, 3, 4]
    assert wal.committed_seqs() == [0, 1, 2, 3]
    committed, latest = _window_ends(wal, 3, topic), _window_ends(wal, 4, topic)
    text, described = _described(bootstrap, group, topic)
    assert {p: int(r["CURRENT-OFFSET"]) for p, r in described.items()} == committed, text
    assert {p: int(r["LOG-END-OFFSET"]) for p, r in described.items()} == latest, text
    assert latest == {0: 1500, 1: 1500, 2: 1500}
    assert_exact([tuple(r) for r in spark.read.parquet(out).collect()],
                 [(p, o) for p in range(3) for o in range(1500)], "source rows")
