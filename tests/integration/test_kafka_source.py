"""The eo_kafka source against a real broker and real Spark (docs/design.md, "Kafka source").

Test data is produced with an idempotent producer (``produce_records``), on Apache Kafka.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pytest

from connectors.core.errors import KafkaSourceError
from connectors.demo.services.kafka import create_topic, produce_records
from connectors.kafka.source.offsets import OffsetRange
from connectors.kafka.source.range_reader import read_range
from tests.helpers import assert_exact, group_offsets, wait_for


def _records(n: int, partitions: int, prefix: str = "") -> list[tuple[bytes, bytes, int]]:
    return [(f"{prefix}k{i}".encode(), f"{prefix}v{i}".encode(), i % partitions)
            for i in range(n)]


def _stream(spark: Any, bootstrap: str, **options: Any) -> Any:
    reader = spark.readStream.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def _run_available_now(df: Any, tmp_path: Any) -> tuple[str, Any]:
    name = f"m_{uuid.uuid4().hex[:8]}"
    q = (
        df.writeStream.format("memory").queryName(name)
        .option("checkpointLocation", str(tmp_path / f"chk-{name}"))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination(180)
    if q.exception() is not None:
        raise AssertionError(f"query failed: {q.exception()}")
    return name, q


# -- batch reads --------------------------------------------------------------------------------
def test_batch_read_schema_rows_and_ending_offsets(spark: Any, kafka_bootstrap: str,
                                                    new_topic: Any) -> None:
    topic = new_topic(partitions=3)
    produce_records(kafka_bootstrap, topic, _records(300, 3))
    df = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", topic).load())
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>")
    rows = df.collect()
    assert_exact([(r.key, r.value, r.partition) for r in rows],
                 [(k, v, p) for k, v, p in _records(300, 3)])
    assert {r.timestampType for r in rows} == {0}  # CreateTime, as Spark reports it
    assert {r.topic for r in rows} == {topic}

    bounded = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
               .option("subscribe", topic)
               .option("startingOffsets", json.dumps({topic: {"0": 10, "1": -2, "2": -1}}))
               .option("endingOffsets", json.dumps({topic: {"0": 20, "1": 5, "2": -1}}))
               .load().collect())
    assert sorted((r.partition, r.offset) for r in bounded) == (
        [(0, o) for o in range(10, 20)] + [(1, o) for o in range(5)])


def test_min_partitions_splits_kafka_partitions(spark: Any, kafka_bootstrap: str,
                                                new_topic: Any) -> None:
    topic = new_topic(partitions=2)
    produce_records(kafka_bootstrap, topic, _records(2000, 2))
    base = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic))
    plain = base.load()
    split = base.option("minPartitions", "8").load()
    # Two small Kafka partitions are one Spark partition (one consumer reads both), unless
    # grouping is off: then one per Kafka partition, as Spark's own source plans.
    off = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
           .option("subscribe", topic).option("targetRecordsPerPartition", "0").load())
    assert plain.rdd.getNumPartitions() == 1
    assert off.rdd.getNumPartitions() == 2
    assert split.rdd.getNumPartitions() == 8
    rows = [(r.partition, r.offset) for r in split.select("partition", "offset").collect()]
    assert_exact(rows, [(p, o) for p in range(2) for o in range(1000)])
    capped = base.option("maxRecordsPerPartition", "300").load()
    assert capped.rdd.getNumPartitions() == 8  # ceil(1000 / 300) = 4 per Kafka partition
    assert capped.count() == 2000


def test_headers_are_read_when_asked(spark: Any, kafka_bootstrap: str, new_topic: Any) -> None:
    from confluent_kafka import Producer

    topic = new_topic(partitions=1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(topic, value=b"a", key=b"k", headers=[("h1", b"x"), ("h2", None)], partition=0)
    p.flush(30)
    p.produce(topic, value=b"b", partition=0)
    p.flush(30)
    df = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", topic).option("includeHeaders", "true").load())
    headers_type = df.schema["headers"].dataType.simpleString()
    assert headers_type == "array<struct<key:string,value:binary>>"
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [(h.key, h.value) for h in rows[0].headers] == [("h1", b"x"), ("h2", None)]
    assert rows[1].headers is None
    assert rows[1].key is None and rows[1].value == b"b"


def test_multi_cluster_source_has_cluster_column(spark: Any, kafka_bootstrap: str,
                                                 broker_factory: Any, tmp_path: Any) -> None:
    other = broker_factory().bootstrap
    t1, t2 = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, t1, 2)
    create_topic(other, t2, 1)
    produce_records(kafka_bootstrap, t1, _records(100, 2, "a"))
    produce_records(other, t2, _records(50, 1, "b"))
    clusters = [
        {"name": "main", "bootstrap": kafka_bootstrap, "subscribe": t1},
        {"name": "other", "bootstrap": other, "assign": {t2: [0]}},
    ]
    df = (spark.readStream.format("eo_kafka").option("clusters", json.dumps(clusters))
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "60").load())
    assert df.schema.fieldNames()[-1] == "cluster"
    name, q = _run_available_now(df, tmp_path)
    rows = spark.table(name).select("cluster", "topic", "partition", "offset").collect()
    expected = [("main", t1, p, o) for p in range(2) for o in range(50)]
    expected += [("other", t2, 0, o) for o in range(50)]
    assert_exact([tuple(r) for r in rows], expected)
    assert all(p["numInputRows"] <= 60 for p in q.recentProgress)
    end = q.lastProgress["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    assert end == {"main": {t1: {"0": 50, "1": 50}}, "other": {t2: {"0": 50}}}


# -- streaming ---------------------------------------------------------------------
def test_max_offsets_per_trigger_wal_and_group_commit(spark: Any, kafka_bootstrap: str,
                                                      new_topic: Any, tmp_path: Any) -> None:
    topic = new_topic(partitions=3)
    produce_records(kafka_bootstrap, topic, _records(10_000, 3))
    wal = str(tmp_path / "wal")
    group = f"g-{uuid.uuid4().hex[:8]}"
    df = _stream(spark, kafka_bootstrap, subscribe=topic, startingOffsets="earliest",
                 maxOffsetsPerTrigger=1000, walPath=wal, **{"kafka.group.id": group})
    name, q = _run_available_now(df, tmp_path)
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 10_000 and max(sizes) <= 1000 and len(sizes) >= 10
    rows = spark.table(name).select("partition", "offset").collect()
    expected = [(p, o) for p in range(3) for o in range(3334 - (p > 0))]
    assert_exact([tuple(r) for r in rows], expected)
    # reportLatestOffset: query progress shows the latest offsets.
    latest = q.lastProgress["sources"][0]["latestOffset"]
    latest = json.loads(latest) if isinstance(latest, str) else latest
    assert latest == {topic: {"0": 3334, "1": 3333, "2": 3333}}

    from connectors.core.wal import WriteAheadLog

    log = WriteAheadLog.open(wal, "source")
    seqs = log.seqs()
    assert seqs == list(range(len(sizes)))  # one WAL window per micro-batch, ids 0..n-1
    last_committed = log.last_committed()
    assert last_committed is not None and last_committed >= len(sizes) - 2
    end = log.get(last_committed)["end"]
    assert group_offsets(kafka_bootstrap, group) == {
        (topic, int(p)): off for p, off in end[topic].items()}


def test_new_topics_matching_pattern_join_at_earliest(spark: Any, kafka_bootstrap: str,
                                                      tmp_path: Any) -> None:
    prefix = f"pat{uuid.uuid4().hex[:8]}"
    first = f"{prefix}-a"
    create_topic(kafka_bootstrap, first, 1)
    produce_records(kafka_bootstrap, first, _records(10, 1))
    name = f"m_{uuid.uuid4().hex[:8]}"
    df = _stream(spark, kafka_bootstrap, subscribePattern=f"{prefix}-.*",
                 startingOffsets="latest")
    q = (df.writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "chk")).start())
    try:
        q.processAllAvailable()
        produce_records(kafka_bootstrap, first, _records(5, 1, "late"))
        second = f"{prefix}-b"
        create_topic(kafka_bootstrap, second, 2)
        produce_records(kafka_bootstrap, second, _records(20, 2))
        wait_for(lambda: spark.table(name).count() == 25, 120,
                 what="new topic's records")
    finally:
        q.stop()
    rows = spark.table(name).select("topic", "partition", "offset").collect()
    expected = [(first, 0, o) for o in range(10, 15)]
    expected += [(second, p, o) for p in range(2) for o in range(10)]
    assert_exact([tuple(r) for r in rows], expected)


def test_partitions_added_to_a_subscribed_topic_start_at_earliest(
    spark: Any, kafka_bootstrap: str, new_topic: Any, tmp_path: Any
) -> None:
    """CreatePartitions on a running query: the new partitions are read from offset 0
    (nothing written to them before discovery is lost), the old ones continue."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = new_topic(partitions=1)
    produce_records(kafka_bootstrap, topic, _records(10, 1))
    name = f"m_{uuid.uuid4().hex[:8]}"
    df = _stream(spark, kafka_bootstrap, subscribe=topic, startingOffsets="earliest")
    q = (df.writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "chk")).start())
    try:
        q.processAllAvailable()
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for f in admin.create_partitions([NewPartitions(topic, 3)]).values():
            f.result(30)
        wait_for(lambda: len(admin.list_topics(topic=topic, timeout=10)
                             .topics[topic].partitions) == 3, 60, what="3 partitions")
        # Records land in the new partitions before the query has seen them.
        produce_records(kafka_bootstrap, topic, [(b"n", f"p{p}-{i}".encode(), p)
                                                 for p in (1, 2) for i in range(7)])
        produce_records(kafka_bootstrap, topic, _records(3, 1, "late"))
        wait_for(lambda: spark.table(name).count() == 10 + 14 + 3, 120,
                 what="records of the new partitions")
    finally:
        q.stop()
    rows = spark.table(name).select("partition", "offset").collect()
    expected = [(0, o) for o in range(13)] + [(p, o) for p in (1, 2) for o in range(7)]
    assert_exact([tuple(r) for r in rows], expected)


def _produce_timed(bootstrap: str, topic: str, n: int, partitions: int, t0: int) -> None:
    """Record i of each partition gets CreateTime ``t0 + 1000 * i`` (one per second)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for part in range(partitions):
        for i in range(n):
            p.produce(topic, f"p{part}-{i}".encode(), partition=part, timestamp=t0 + 1000 * i)
    assert p.flush(60) == 0


def test_starting_offsets_by_timestamp_on_the_broker_time_index(
    spark: Any, kafka_bootstrap: str, new_topic: Any
) -> None:
    """ListOffsets by time on Apache Kafka's time index: the first offset whose timestamp
    is >= the given one, per partition; the strategy decides past-the-end partitions."""
    topic = new_topic(partitions=2)
    t0 = 1_700_000_000_000
    _produce_timed(kafka_bootstrap, topic, 20, 2, t0)

    def offsets(**options: Any) -> list[tuple[int, int]]:
        reader = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers",
                                                       kafka_bootstrap)
                  .option("subscribe", topic))
        for k, v in options.items():
            reader = reader.option(k, v)
        return [tuple(r) for r in reader.load().select("partition", "offset").collect()]

    # One timestamp for every partition; 5.5 s after t0 is offset 6 (t0 + 6 s) in both.
    got = offsets(startingTimestamp=str(t0 + 5500))
    assert_exact(got, [(p, o) for p in range(2) for o in range(6, 20)])
    # Per partition; an exact hit is inclusive.
    by_ts = json.dumps({topic: {"0": t0 + 3000, "1": t0 + 17000}})
    got = offsets(startingOffsetsByTimestamp=by_ts)
    assert_exact(got, [(0, o) for o in range(3, 20)] + [(1, o) for o in range(17, 20)])
    # Past the last record: an error naming the partition, or the end with 'latest'.
    late = json.dumps({topic: {"0": t0 + 2000, "1": t0 + 99_000}})
    with pytest.raises(Exception, match="startingOffsetsByTimestamp"):
        offsets(startingOffsetsByTimestamp=late)
    got = offsets(startingOffsetsByTimestamp=late,
                  startingOffsetsByTimestampStrategy="latest")
    assert_exact(got, [(0, o) for o in range(2, 20)])


def test_starting_offsets_group_resumes_from_committed(spark: Any, kafka_bootstrap: str,
                                                       new_topic: Any, tmp_path: Any) -> None:
    topic = new_topic(partitions=2)
    produce_records(kafka_bootstrap, topic, _records(100, 2))
    group = f"g-{uuid.uuid4().hex[:8]}"
    # No commit in the group yet: 'group' starts at earliest.
    df = _stream(spark, kafka_bootstrap, subscribe=topic, startingOffsets="group",
                 maxOffsetsPerTrigger=40, **{"kafka.group.id": group})
    name, _ = _run_available_now(df, tmp_path)
    assert spark.table(name).count() == 100
    # The last batch is committed to the source only when the next one is planned, so
    # the group holds some batch's end; a fresh query resumes exactly there.
    committed = group_offsets(kafka_bootstrap, group)
    assert committed and all(0 < off <= 50 for off in committed.values())
    df2 = _stream(spark, kafka_bootstrap, subscribe=topic, startingOffsets="group",
                  **{"kafka.group.id": group})
    name2, _ = _run_available_now(df2, tmp_path)
    rows = spark.table(name2).select("partition", "offset").collect()
    assert_exact([tuple(r) for r in rows],
                 [(p, o) for p in range(2) for o in range(committed[(topic, p)], 50)])


# -- data loss ---------------------------------------------------------------------
def test_offsets_beyond_the_log_fail_or_are_skipped(spark: Any, kafka_bootstrap: str,
                                                   new_topic: Any) -> None:
    topic = new_topic(partitions=2)
    produce_records(kafka_bootstrap, topic, _records(20, 2))
    start = json.dumps({topic: {"0": 500, "1": 0}})  # partition 0 has only 10 offsets

    def read(fail: str) -> Any:
        return (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
                .option("subscribe", topic).option("startingOffsets", start)
                .option("failOnDataLoss", fail).load())

    with pytest.raises(Exception, match="data loss") as e:
        read("true").collect()
    assert f"{topic}-0" in str(e.value)
    rows = read("false").collect()
    assert_exact([(r.partition, r.offset) for r in rows], [(1, o) for o in range(10)])


def test_list_offsets_names_the_leader_epoch_and_a_mismatch_asks_fresh_leaders(
        kafka_bootstrap: str, new_topic: Any) -> None:
    """ListOffsets carries the leader epoch of the asker's metadata (KIP-320): the real
    broker refuses an epoch it does not lead (a node back from a partition refuses the
    newer one the same way), and ``list_offsets`` then asks with fresh metadata."""
    from connectors.kafka.clients import KafkaCluster
    from connectors.kafka.wire import admin, requests
    from connectors.kafka.wire.protocol import LIST_OFFSETS

    topic = new_topic(partitions=1)
    produce_records(kafka_bootstrap, topic, _records(7, 1))
    kafka = KafkaCluster({"bootstrap.servers": kafka_bootstrap})
    wire = kafka.lookups()
    assert wire is not None
    try:
        meta = wire.leaders([topic])[topic]
        leader, epoch = meta.leaders[0], meta.epochs[0]
        assert epoch >= 0

        def ask(with_epoch: int) -> tuple[int, int]:
            answer = wire.parallel({leader: (LIST_OFFSETS, requests.list_offsets(
                [(topic, 0, -1, with_epoch)], admin.READ_UNCOMMITTED), 4)})[leader]
            return requests.read_list_offsets(answer)[(topic, 0)]  # type: ignore[arg-type]

        assert ask(epoch) == (0, 7)
        assert ask(-1) == (0, 7)  # no epoch known: no check
        assert ask(epoch + 3)[0] == 75  # UNKNOWN_LEADER_EPOCH
        # Kept metadata naming an epoch the leader does not have: refused, looked up again.
        wire.topics[topic].meta.epochs[0] = epoch + 3
        assert admin.list_offsets(wire, {(topic, 0): -1}, admin.READ_UNCOMMITTED,
                                  timeout=20) == {(topic, 0): 7}
        assert wire.topics[topic].meta.epochs[0] == epoch
    finally:
        kafka.close()


def test_range_reader_detects_deleted_offsets(kafka_bootstrap: str, new_topic: Any,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """The executor-side check: a range outside the log (as after retention or a topic
    recreated under the source) raises, or is skipped with a warning."""
    topic = new_topic(partitions=1)
    produce_records(kafka_bootstrap, topic, _records(10, 1))
    conf = {"bootstrap.servers": kafka_bootstrap, "group.id": "t", "enable.partition.eof": "true",
            "auto.offset.reset": "error", "enable.auto.commit": "false"}
    gone = OffsetRange("", topic, 0, 50, 60)
    with pytest.raises(KafkaSourceError, match=rf"{topic}-0.*beyond the end of the log"):
        list(read_range(gone, conf, fail_on_data_loss=True, poll_timeout_s=20))
    assert list(read_range(gone, conf, fail_on_data_loss=False, poll_timeout_s=20)) == []
    assert "data loss" in caplog.text
    ok = list(read_range(OffsetRange("", topic, 0, 3, 10), conf, poll_timeout_s=20))
    assert sum(b.num_rows for b in ok) == 7


# -- batch windows ---------------------------------------------------------------------
def test_kafka_windows_replay_uncommitted_window(spark: Any, kafka_bootstrap: str,
                                                 new_topic: Any, tmp_path: Any) -> None:
    from connectors import KafkaWindows

    topic = new_topic(partitions=2)
    produce_records(kafka_bootstrap, topic, _records(100, 2))
    group = f"g-{uuid.uuid4().hex[:8]}"
    opts = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
            "kafka.group.id": group, "minPartitions": 3}
    wal = str(tmp_path / "wal")

    def rows(df: Any) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in df.select("partition", "offset", "value").collect())

    w0 = KafkaWindows(spark, walPath=wal, **opts).next()
    assert w0 is not None and w0.window_id == 0
    first = rows(w0.df)
    assert len(first) == 100
    # More data arrives; the window was not committed (the job "crashed").
    produce_records(kafka_bootstrap, topic, _records(40, 2, "more"))
    again = KafkaWindows(spark, walPath=wal, **opts).next()
    assert again is not None and again.window_id == 0 and again.end == w0.end
    assert rows(again.df) == first  # identical ranges, identical rows
    assert again.df.rdd.getNumPartitions() == 3

    windows = KafkaWindows(spark, walPath=wal, **opts)
    with windows.next() as (window_id, df):  # type: ignore[union-attr]
        assert window_id == 0 and rows(df) == first
    assert windows.last_committed() == 0
    assert group_offsets(kafka_bootstrap, group) == {(topic, 0): 50, (topic, 1): 50}
    # After the commit the old DataFrame still reads its own window, not the next one.
    assert rows(df) == first

    with pytest.raises(RuntimeError):
        with windows.next() as w1:  # type: ignore[union-attr]
            assert w1.window_id == 1
            assert sorted(r[1] for r in rows(w1.df)) == sorted(list(range(50, 70)) * 2)
            raise RuntimeError("sink failed")
    w1b = windows.next()
    assert w1b is not None and w1b.window_id == 1  # replayed, not skipped
    w1b.commit()
    assert windows.next() is None  # nothing new
    assert group_offsets(kafka_bootstrap, group) == {(topic, 0): 70, (topic, 1): 70}


def test_plain_batch_read_with_wal_path_gives_next_window(spark: Any, kafka_bootstrap: str,
                                                          new_topic: Any, tmp_path: Any) -> None:
    topic = new_topic(partitions=1)
    produce_records(kafka_bootstrap, topic, _records(10, 1))
    wal = str(tmp_path / "wal")
    read = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic).option("walPath", wal))
    assert read.load().count() == 10
    assert read.load().count() == 10  # uncommitted: the same window again
    assert os.path.exists(os.path.join(wal, "source", f"{0:020d}.json"))


# -- admission control at the reader (no SparkSession needed) -----------------------------------
def test_reader_admission_control(kafka_bootstrap: str, new_topic: Any) -> None:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,
    )

    from connectors.spark.kafka_source import stream_reader

    topic = new_topic(partitions=2)
    produce_records(kafka_bootstrap, topic, [(None, b"x" * 100, i % 2) for i in range(1000)])
    base = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic,
            "startingOffsets": "earliest"}

    def total(start: dict[str, Any], end: dict[str, Any]) -> int:
        return sum(end[topic][p] - start[topic][p] for p in end[topic])

    r = stream_reader({**base, "maxOffsetsPerTrigger": "100", "maxBytesPerTrigger": "5000",
                       "minOffsetsPerTrigger": "10", "maxTriggerDelay": "1h"}, None)  # type: ignore[arg-type]
    assert r.getDefaultReadLimit() == ReadMaxRows(100)
    start = r.initialOffset()
    assert start == {topic: {"0": 0, "1": 0}}
    assert total(start, r.latestOffset(start, ReadAllAvailable())) == 1000
    assert total(start, r.latestOffset(start, ReadMaxRows(100))) <= 50  # bytes cap: ~5000/101
    r2 = stream_reader({**base, "maxOffsetsPerTrigger": "100"}, None)  # type: ignore[arg-type]
    end = r2.latestOffset(start, ReadMaxRows(100))
    assert end == {topic: {"0": 50, "1": 50}}
    assert total(start, r2.latestOffset(start, ReadMaxBytes(10**9))) == 100
    # minOffsetsPerTrigger: too little new data and maxTriggerDelay not reached -> no batch.
    near_end = {topic: {"0": 498, "1": 498}}
    assert r.latestOffset(near_end, ReadMinRows(10)) == near_end
    r3 = stream_reader({**base, "minOffsetsPerTrigger": "10", "maxTriggerDelay": "0s"}, None)  # type: ignore[arg-type]
    assert r3.getDefaultReadLimit() == ReadMinRows(10)
    assert r3.latestOffset(near_end, ReadMinRows(10)) == {topic: {"0": 500, "1": 500}}
    # Trigger.AvailableNow: nothing produced after prepareForTriggerAvailableNow is read.
    r2.prepareForTriggerAvailableNow()
    produce_records(kafka_bootstrap, topic, [(None, b"late", 0)])
    pos = start
    while (nxt := r2.latestOffset(pos, ReadMaxRows(100))) != pos:
        pos = nxt
    assert pos == {topic: {"0": 500, "1": 500}}
    assert r2.reportLatestOffset() == {topic: {"0": 501, "1": 500}}
    # partitions() is pure: the same (start, end) gives the same splits.
    r4 = stream_reader({**base, "minPartitions": "5"}, None)  # type: ignore[arg-type]
    a = [p.ranges for p in r4.partitions(start, pos)]
    assert a == [p.ranges for p in r4.partitions(start, pos)] and len(a) == 5


def test_deleted_topic_follows_fail_on_data_loss(kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connectors.spark.kafka_source import stream_reader

    prefix = f"del{uuid.uuid4().hex[:8]}"
    keep, doomed = f"{prefix}-keep", f"{prefix}-doomed"
    for t in (keep, doomed):
        create_topic(kafka_bootstrap, t, 1)
        produce_records(kafka_bootstrap, t, _records(5, 1))
    opts = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribePattern": f"{prefix}-.*",
            "startingOffsets": "earliest"}
    strict = stream_reader(opts, None)  # type: ignore[arg-type]
    lenient = stream_reader({**opts, "failOnDataLoss": "false"}, None)  # type: ignore[arg-type]
    start = strict.initialOffset()
    assert start == {keep: {"0": 0}, doomed: {"0": 0}}
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.delete_topics([doomed], operation_timeout=10).values():
        f.result(10)
    wait_for(lambda: doomed not in admin.list_topics(timeout=5).topics, 30, what="deletion")
    with pytest.raises(KafkaSourceError, match=rf"data loss.*{doomed}-0"):
        strict.latestOffset(start, ReadAllAvailable())
    assert lenient.latestOffset(start, ReadAllAvailable()) == {keep: {"0": 5}}


def test_batch_read_of_an_empty_topic(spark: Any, kafka_bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(partitions=2)
    df = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", topic).load())
    assert df.count() == 0
