"""The ``eo_kafka`` source on topics of 1,000 partitions (docs/kafka-source.md, "Many
partitions"): a streaming query and ``KafkaWindows`` exact after driver kills, two reads of
different 1,000-partition topics in one session, and every Python worker's cached Kafka
clients within their bound.

Topics of 1,000 partitions take a while to create on one broker, so the module makes two
and every test reads them; each holds a few records per partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from connectors.demo.services.kafka import create_topic, produce_records
from tests.helpers import assert_exact, run_pipeline

PARTS = 1000
PER_PARTITION = 12
N = PARTS * PER_PARTITION


def _value(topic: str, i: int) -> str:
    return f"{topic[-6:]}-{i}"


def _fill(bootstrap: str, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTS, timeout=120)
    produce_records(bootstrap, topic, [(None, _value(topic, i).encode(), i % PARTS)
                                       for i in range(N)],
                    extra_conf={"linger.ms": 20})
    return topic


def _expected(topic: str) -> list[tuple[int, int, str]]:
    # produce_records keeps each partition's order: record i is offset i // PARTS of
    # partition i % PARTS.
    return [(i % PARTS, i // PARTS, _value(topic, i)) for i in range(N)]


@pytest.fixture(scope="module")
def topics(kafka_bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    made = [_fill(kafka_bootstrap, "many-a"), _fill(kafka_bootstrap, "many-b")]
    yield made
    AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics(made, operation_timeout=30)


def _parquet(spark: Any, path: str) -> list[tuple[int, int, str]]:
    df = spark.read.parquet(path).select("partition", "offset", "value")
    return [tuple(r) for r in df.collect()]


def test_streaming_over_1000_partitions_is_exact_after_driver_kills(
        spark: Any, kafka_bootstrap: str, topics: list[str], tmp_path: Any) -> None:
    topic = topics[0]
    out = str(tmp_path / "out")
    argv = [
        "tests/integration/pipelines/kafka_source_pipeline.py",
        "--bootstrap", kafka_bootstrap, "--topic", topic, "--out", out,
        "--checkpoint", str(tmp_path / "chk"), "--wal", str(tmp_path / "wal"),
        "--group", f"g-{uuid.uuid4().hex[:8]}", "--per-batch", str(N // 4),
    ]
    # Batch 0's offsets marked committed in the WAL, then the kill (before the group
    # commit); then a kill in the middle of reading batch 1, which one consumer reads
    # across all 1,000 partitions.
    for point in ("kafka_source.after_wal_commit@0", "kafka_source.mid_read@1#500"):
        result = run_pipeline(argv, failpoint=point, timeout=300)
        assert result.killed, f"{point} never fired:\n{result.output[-3000:]}"
    result = run_pipeline(argv, timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    assert_exact(_parquet(spark, out), _expected(topic), "(partition, offset, value)")


def test_kafka_windows_over_1000_partitions_are_exact_after_driver_kills(
        spark: Any, kafka_bootstrap: str, topics: list[str], tmp_path: Any) -> None:
    from connectors.core.wal import WriteAheadLog

    topic = topics[1]
    out, wal = str(tmp_path / "out"), str(tmp_path / "wal")
    argv = [
        "tests/integration/pipelines/kafka_windows_pipeline.py",
        "--bootstrap", kafka_bootstrap, "--topic", topic, "--out", out, "--wal", wal,
        "--group", f"g-{uuid.uuid4().hex[:8]}", "--per-window", str(N // 3),
    ]
    # A window read half-way (never committed: replayed whole), then window 1 written
    # and marked committed but its group commit not made.
    for point in ("kafka_source.mid_read#500", "kafka_source.after_wal_commit@1"):
        result = run_pipeline(argv, failpoint=point, timeout=300)
        assert result.killed, f"{point} never fired:\n{result.output[-3000:]}"
    result = run_pipeline(argv, timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    assert_exact(_parquet(spark, out), _expected(topic), "(partition, offset, value)")
    log = WriteAheadLog.open(wal, "source")
    assert log.last_committed() == log.seqs()[-1] >= 2


def test_two_reads_of_different_1000_partition_topics_in_one_session(
        spark: Any, kafka_bootstrap: str, topics: list[str]) -> None:
    for topic in topics:
        df = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
              .option("subscribe", topic).load())
        # grouped: a few Spark partitions, not one per Kafka partition
        assert df.rdd.getNumPartitions() == 1
        rows = [tuple(r) for r in df.selectExpr(
            "partition", "offset", "cast(value as string)").collect()]
        assert_exact(rows, _expected(topic), f"{topic} (partition, offset, value)")
    # the same reads, one Spark partition per Kafka partition (Spark's own plan)
    df = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", topics[0]).option("targetRecordsPerPartition", "0").load())
    assert df.rdd.getNumPartitions() == PARTS
    assert df.count() == N


def _worker_clients(spark: Any, bootstrap: str,
                    topic: str) -> list[tuple[int, dict[str, int], dict[str, int], int]]:
    """``(pid, cached clients by kind, their bounds, threads)`` of every Python worker a
    small job reaches. Spark may give the probe's tasks workers that never ran a read
    (it closes workers idle for a minute), so each task first reads one range of ``topic``
    through the source's own range reader with seven client ids (seven consumer
    configurations): more than the consumer cache keeps, whichever worker it lands on."""
    def report(_: Any) -> Any:
        import os

        import connectors.kafka.sink.commit_facts  # noqa: F401 - their caches register
        import connectors.kafka.sink.producers  # noqa: F401
        from connectors.kafka.common import cached_client_counts, client_bounds
        from connectors.kafka.source.offsets import OffsetRange
        from connectors.kafka.source.options import KafkaSourceOptions
        from connectors.kafka.source.range_reader import read_range

        for i in range(7):
            spec = KafkaSourceOptions.from_options({
                "kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                "kafka.client.id": f"probe-{i}"}).clusters[0]
            got = sum(b.num_rows for b in read_range(
                OffsetRange(spec.name, topic, i, 0, PER_PARTITION), spec.reader_conf("probe")))
            assert got == PER_PARTITION, got
        threads = len(os.listdir("/proc/self/task"))
        return [(os.getpid(), cached_client_counts(), client_bounds(), threads)]

    return spark.sparkContext.parallelize(range(8), 8).mapPartitions(report).collect()


def test_a_workers_cached_clients_stay_within_their_bound(
        spark: Any, kafka_bootstrap: str, topics: list[str], new_topic: Callable[..., str],
        tmp_path: Any) -> None:
    # Seven source configurations (client ids) and six sink configurations: more than
    # any cache keeps, so each worker must have closed the least recently used ones.
    for i in range(7):
        n = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
             .option("subscribe", topics[i % 2]).option("kafka.client.id", f"bound-{i}")
             .option("targetRecordsPerPartition", "2000")  # six tasks: both workers read
             .load().count())
        assert n == N
    target = new_topic(partitions=2)
    rows = spark.range(0, 100, numPartitions=2).selectExpr("cast(id as string) as value")
    for i in range(6):
        (rows.write.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
         .option("topic", target).option("sink_id", f"bound-{i}")
         .option("walPath", str(tmp_path / f"wal-{i}")).option("kafka.client.id", f"bound-{i}")
         .option("batchId", 0).mode("append").save())
    workers = _worker_clients(spark, kafka_bootstrap, topics[0])
    assert workers
    seen = {}
    for pid, counts, bounds, threads in workers:
        seen[pid] = (counts, threads)
        over = {k: (n, bounds[k]) for k, n in counts.items() if n > bounds[k]}
        assert not over, f"worker {pid} caches more clients than its bound: {over}"
        assert counts.get("consumer", 0) >= 1, f"worker {pid} never read: {counts}"
        # Threads follow the clients (a few per librdkafka client), never the 1,000
        # partitions read.
        assert threads <= 8 + 6 * sum(counts.values()), (pid, counts, threads)
    print(f"worker clients and threads: {seen}")
