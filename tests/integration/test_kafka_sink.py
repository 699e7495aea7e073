"""The exactly-once Kafka sink against a real broker and real Spark (docs/design.md, "Kafka sink:
recovery keys").

Output is read back with ``read_topic``/``scan_topic`` (to partition EOF, ``read_committed``
unless a test says otherwise). Input data is written with an idempotent producer.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import Counter

import pyarrow as pa
import pytest

from connectors.core import failpoints
from connectors.core.errors import FailpointError, KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.demo.services.kafka import produce_records
from connectors.kafka.sink import KafkaSink, partitioner, recovery
from tests.helpers import assert_exact, read_topic, scan_topic, unavailable, wait_for
from tests.services.prometheus import Prometheus, find_binary, free_port


def _sink(bootstrap: str, tmp_path, topic: str | None, **kw) -> KafkaSink:
    sink_id = f"it-{uuid.uuid4().hex[:8]}"
    return KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=bootstrap, topic=topic,
                     **kw)


def _attempt_dies_mid_produce(monkeypatch, sink: KafkaSink, task: TaskInfo, after: int,
                              rows: pa.Table) -> None:
    """Run ``task`` until the ``mid_produce`` failpoint raises after ``after`` records (then
    undo every monkeypatch of the test so far)."""
    monkeypatch.setenv("CONNECTORS_FAILPOINTS",
                       f"kafka_sink.mid_produce@{task.batch_id}#{after}!raise")
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            sink.stage(task, iter(rows.to_batches()))
    finally:
        monkeypatch.undo()
        failpoints.reload()


def test_stream_writer_copies_a_topic_once_and_routes_like_java(
    spark, kafka_bootstrap, new_topic, tmp_path
):
    src, dst = new_topic(partitions=3), new_topic(partitions=4)
    records = [(None if i % 9 == 0 else f"k{i % 31}".encode(), f"v{i}".encode(), i % 3)
               for i in range(3000)]
    produce_records(kafka_bootstrap, src, records)
    sink_id = f"stream-{uuid.uuid4().hex[:6]}"
    q = (
        spark.readStream.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", src).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 1000).load()
        .selectExpr("key", "value")
        .writeStream.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("topic", dst).option("sink_id", sink_id)
        .option("walPath", str(tmp_path / "wal"))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    out = read_topic(kafka_bootstrap, dst)
    assert_exact([(m.key(), m.value()) for m in out], [(k, v) for k, v, _ in records])
    batches = set()
    for m in out:
        key = recovery.find_key(m.headers())
        assert key is not None and key.of_sink(sink_id)
        batches.add(key.batch_id)
        if m.key() is not None:
            assert m.partition() == partitioner.key_partition(m.key(), 4)
    assert batches == {0, 1, 2}
    sink = KafkaSink(sink_id, str(tmp_path / "wal"), bootstrap_servers=kafka_bootstrap, topic=dst)
    assert sink.last_committed() == 2
    assert sink.commit_info(2)["rows"] == 1000


def test_keyed_routing_matches_librdkafkas_java_compatible_partitioner(
    kafka_bootstrap, new_topic, tmp_path
):
    """Cross-check: librdkafka's ``murmur2`` partitioner is documented as Java-compatible."""
    from confluent_kafka import Producer

    topic = new_topic(partitions=5)
    keys = [f"key-{i}".encode() for i in range(200)] + [b"", b"\x00\xff" * 7]
    p = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2"})
    got: dict[bytes, int] = {}

    def on_delivery(err, msg):
        assert err is None
        got[msg.key()] = msg.partition()

    for k in keys:
        p.produce(topic, b"x", k, on_delivery=on_delivery)
    p.flush(30)
    assert got == {k: partitioner.key_partition(k, 5) for k in keys}


def test_replay_of_a_committed_batch_writes_nothing(spark, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    df = spark.range(0, 2000, numPartitions=3).selectExpr(
        "cast(id % 50 as string) as key", "cast(id as string) as value")
    sink.write(df, 0)
    first, ends = scan_topic(kafka_bootstrap, topic, isolation="read_uncommitted")
    assert len(first) == 2000
    # foreachBatch replay: the driver sees batch 0 committed.
    sink(df, 0)
    # DataSource batch replay: the tasks run, find batch 0 committed and write nothing.
    (df.write.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
     .option("topic", topic).option("sink_id", sink.sink_id).option("walPath", sink.wal_path)
     .option("batchId", 0).mode("append").save())
    # A task of the committed batch, called directly (a replayed streaming task).
    report = sink.stage(TaskInfo(0, 1, attempt=3), iter(pa.table(
        {"value": [b"late"]}).to_batches()))
    assert report.already_committed and report.produced == 0
    after, ends_after = scan_topic(kafka_bootstrap, topic, isolation="read_uncommitted")
    assert ends_after == ends, "a replay of a committed batch wrote records"
    assert_exact([m.value() for m in after], [str(i).encode() for i in range(2000)])
    # The next batch id writes again.
    sink.write(df.limit(10), 1)
    assert len(read_topic(kafka_bootstrap, topic)) == 2010


def test_unsafe_producer_settings_are_refused_through_spark(spark, kafka_bootstrap, new_topic,
                                                            tmp_path):
    topic = new_topic(partitions=1)
    df = spark.range(3).selectExpr("cast(id as string) as value")

    def write(**opts):
        w = (df.write.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
             .option("topic", topic).option("sink_id", "unsafe-test")
             .option("walPath", str(tmp_path / "wal")).option("batchId", 0))
        for k, v in opts.items():
            w = w.option(k, v)
        w.mode("append").save()

    with pytest.raises(Exception, match=r"kafka\.acks.*breaks the exactly-once") as e:
        write(**{"kafka.acks": "1"})
    assert "unsafe=true" in str(e.value)
    with pytest.raises(Exception, match=r"kafka\.enable\.idempotence"):
        write(**{"kafka.enable.idempotence": "false"})
    assert read_topic(kafka_bootstrap, topic) == []
    write(**{"kafka.acks": "1", "unsafe": "true"})  # accepted, with a warning
    assert len(read_topic(kafka_bootstrap, topic)) == 3


def test_topic_partition_and_headers_columns(spark, kafka_bootstrap, new_topic, tmp_path):
    t1, t2 = new_topic(partitions=3), new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, None)
    df = spark.createDataFrame(
        [(f"v{i}", t1 if i % 2 else t2, (i % 2) if i % 3 == 0 else None, f"h{i}")
         for i in range(60)],
        "value string, topic string, partition int, h string",
    ).selectExpr("value", "topic", "partition",
                 "array(named_struct('key', 'trace', 'value', cast(h as binary))) as headers")
    sink.write(df, 0)
    got = read_topic(kafka_bootstrap, t1) + read_topic(kafka_bootstrap, t2)
    assert_exact([(m.topic(), m.value()) for m in got],
                 [(t1 if i % 2 else t2, f"v{i}".encode()) for i in range(60)])
    for m in got:
        i = int(m.value()[1:])
        headers = dict(m.headers())
        assert headers["trace"] == f"h{i}".encode()
        assert recovery.decode(headers["eo-rk"]).of_sink(sink.sink_id)
        if i % 3 == 0:
            assert m.partition() == i % 2


def test_transactional_retry_fences_the_zombie_and_hides_partial_output(
    kafka_bootstrap, new_topic, tmp_path
):
    """A task attempt stalls after flushing inside its open transaction (a zombie). The
    retry's init_transactions fences it; read_committed readers never saw its records, and
    the output holds every row exactly once. Prometheus, scraping the metrics this process
    serves, reads one fenced attempt and the rows once (issue 44, item 5)."""
    from connectors import monitoring

    binary = find_binary()
    if binary is None:
        unavailable("Prometheus", "no `prometheus` binary (Debian package prometheus)")
    assert binary is not None
    server = monitoring.serve(None, port=free_port())
    prometheus = Prometheus.start(binary, tmp_path / "prometheus", [f"127.0.0.1:{server.port}"])
    try:
        _fence_the_zombie(kafka_bootstrap, new_topic, tmp_path, prometheus)
    finally:
        prometheus.stop()
        server.stop()


def _fence_the_zombie(kafka_bootstrap, new_topic, tmp_path, prometheus: Prometheus) -> None:
    topic = new_topic(partitions=3)
    sink = _sink(kafka_bootstrap, tmp_path, topic, transactional=True)
    rows = pa.table({"key": [f"k{i % 13}".encode() for i in range(3000)],
                     "value": [f"v{i}".encode() for i in range(3000)]})
    stalled, release = threading.Event(), threading.Event()
    zombie_error: list[BaseException] = []
    real_hit = failpoints.hit

    def hit(name, batch_id=None, count=None):
        # Test instrumentation only: park the first attempt right after its flush.
        if name == "kafka_sink.after_flush" and threading.current_thread().name == "zombie":
            stalled.set()
            release.wait(60)
        real_hit(name, batch_id, count)

    def zombie():
        try:
            sink.stage(TaskInfo(0, 0, attempt=0), iter(rows.to_batches()))
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            zombie_error.append(e)

    failpoints.hit = hit
    try:
        t = threading.Thread(target=zombie, name="zombie")
        t.start()
        assert stalled.wait(60), "first attempt never reached after_flush"
        # what a read_committed reader sees while the zombie's transaction is open
        assert read_topic(kafka_bootstrap, topic, now=True) == [], "partial output visible"
        retry = sink.stage(TaskInfo(0, 0, attempt=1), iter(rows.to_batches()))
        release.set()
        t.join(120)
    finally:
        failpoints.hit = real_hit
        release.set()
    assert zombie_error, "the zombie attempt committed after being fenced"
    # PRODUCER_FENCED from the transaction coordinator (transactions v1), or under v2
    # INVALID_PRODUCER_EPOCH from the group coordinator, which checks the epoch itself.
    assert "fenced" in str(zombie_error[0]).lower(), zombie_error[0]
    assert retry.retry and retry.produced == 3000 and retry.skipped == 0
    assert retry.fenced == 1
    sink.commit(0, [retry])
    out = read_topic(kafka_bootstrap, topic)  # read_committed
    assert_exact([m.value() for m in out], [f"v{i}".encode() for i in range(3000)])
    labels = f'family="eo_kafka",sink_id="{sink.sink_id}"'
    wait_for(lambda: prometheus.value(f"eo_sink_batches_committed_total{{{labels}}}") == 1,
             timeout=30, what="Prometheus to scrape the committed batch")
    assert prometheus.value(f"eo_sink_fenced_attempts_total{{{labels}}}") == 1
    assert prometheus.value(f"eo_sink_retried_tasks_total{{{labels}}}") == 1
    assert prometheus.value(f"eo_sink_rows_committed_total{{{labels}}}") == 3000
    assert prometheus.value(f"eo_sink_records_produced_total{{{labels}}}") == 3000


def test_task_failure_mid_produce_then_retry_skips_written_rows(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    """The protocol without Spark: attempt 0 dies after 1500 of 3000 records, attempt 1 scans
    from the started marker and writes only the rest."""
    topic = new_topic(partitions=4)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    rows = pa.table({"value": [f"v{i}".encode() for i in range(3000)]})
    _attempt_dies_mid_produce(monkeypatch, sink, TaskInfo(5, 2), 1500, rows)
    written = read_topic(kafka_bootstrap, topic)
    assert len(written) >= 1500
    retry = sink.stage(TaskInfo(5, 2, attempt=1), iter(rows.to_batches()))
    assert retry.retry and retry.skipped == len(written) and retry.scan_records >= len(written)
    out = read_topic(kafka_bootstrap, topic)
    assert_exact([m.value() for m in out], [f"v{i}".encode() for i in range(3000)])
    seqs = Counter(recovery.find_key(m.headers()).seq for m in out)
    assert set(seqs) == set(range(3000)) and max(seqs.values()) == 1


def test_retry_after_a_failure_routes_null_keys_in_the_byte_runs_of_its_first_attempt(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    """Runs of about ``nullKeyRunBytes`` bytes: attempt 0 dies mid-produce, and the retry,
    under another budget now, routes by the budget its marker recorded, so every row it
    skips is where the first attempt put it and nothing is lost or doubled."""
    topic = new_topic(partitions=4)
    sink = _sink(kafka_bootstrap, tmp_path, topic, null_key_run_bytes=40_000)
    n = 3000
    values = [f"v{i}-".encode().ljust(20 + i % 150, b"x") for i in range(n)]  # 20-169 bytes
    rows = pa.table({"value": values})
    _attempt_dies_mid_produce(monkeypatch, sink, TaskInfo(6, 1), 1500, rows)
    first = read_topic(kafka_bootstrap, topic)
    assert len(first) >= 1500
    changed = KafkaSink(sink.sink_id, sink.wal_path, bootstrap_servers=kafka_bootstrap,
                        topic=topic, null_key_run_bytes=1_000_000)
    retry = changed.stage(TaskInfo(6, 1, attempt=1), iter(rows.to_batches(max_chunksize=333)))
    assert retry.retry and retry.skipped == len(first)
    out = read_topic(kafka_bootstrap, topic)
    assert_exact([m.value() for m in out], values)
    # Rows in seq order (the recovery key's), each where the bytes before it say.
    by_seq = sorted(out, key=lambda m: recovery.find_key(m.headers()).seq)
    start, before = partitioner.null_key_start(6, 1), 0
    for m in by_seq:
        assert m.partition() == (start + before // 40_000) % 4
        before += len(m.value())
    assert len({m.partition() for m in out}) == 4  # about 255 KB: seven runs


@pytest.mark.parametrize("recorded", [{"null_key_run": 1000}, {}],
                         ids=["rows-recorded", "none-recorded"])
def test_retry_of_an_attempt_that_routed_in_the_old_runs_routes_as_it_did(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch, recorded
):
    """A started marker from before the runs were counted in bytes (an attempt under runs
    of 1,000 rows, then an upgrade): recorded in rows as ``null_key_run``, or, older still,
    not at all (runs of 1,000). The retry routes in those runs, so every row it skips is in
    the partition its first attempt put it, and nothing is lost or doubled."""
    import connectors.kafka.sink.recovery_key_mode as rk_mode

    topic = new_topic(partitions=4)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    n = 5000
    rows = pa.table({"value": [f"v{i}".encode() for i in range(n)]})
    start = partitioner.null_key_start(4, 1)
    # The version before the upgrade: runs of 1,000 rows (undone after the attempt).
    monkeypatch.setattr(rk_mode.RecoveryKeyWriter, "null_key_runs",
                        lambda self: partitioner.RowRuns(start, 1000))
    _attempt_dies_mid_produce(monkeypatch, sink, TaskInfo(4, 1), 2500, rows)
    # Its marker as that version wrote it: the run in rows, or no run.
    state = sink._state()
    markers = recovery.MarkerStore(state.storage, state.root, state)
    record = json.loads(markers.get(4, 1).to_json())
    record.pop("null_key_run_bytes")
    state.storage.write_atomic(markers.path(4, 1), json.dumps({**record, **recorded}).encode())
    first = read_topic(kafka_bootstrap, topic)
    assert len(first) >= 2500 and len({m.partition() for m in first}) >= 2
    retry = sink.stage(TaskInfo(4, 1, attempt=1), iter(rows.to_batches()))
    assert retry.retry and retry.skipped == len(first)
    out = read_topic(kafka_bootstrap, topic)
    assert_exact([m.value() for m in out], [f"v{i}".encode() for i in range(n)])
    for m in out:  # every row where runs of 1,000 put it
        seq = recovery.find_key(m.headers()).seq
        assert m.partition() == (start + seq // 1000) % 4


def test_retry_of_an_attempt_before_the_hashed_order_and_key_v2_finishes_as_it_began(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    """An attempt that sorted its rows and wrote version 1 keys, then an upgrade: its retry
    reads both from the marker (an old marker names neither), numbers in the sort, writes
    and scans version 1 keys, and nothing is lost or doubled."""
    from connectors.kafka.sink import ordering

    topic = new_topic(partitions=4)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    n = 4000
    rows = pa.table({"key": [f"k{i % 97}".encode() for i in range(n)],
                     "value": [f"v{(i * 7919) % n}".encode() for i in range(n)]})
    monkeypatch.setattr(recovery, "VERSION", 1)  # the version before the upgrade
    monkeypatch.setattr(ordering, "default", lambda: ordering.SORTED)
    _attempt_dies_mid_produce(monkeypatch, sink, TaskInfo(6, 0), 1800, rows)
    state = sink._state()
    markers = recovery.MarkerStore(state.storage, state.root, state)
    record = json.loads(markers.get(6, 0).to_json())
    assert (record.pop("order"), record.pop("key_version")) == (ordering.SORTED, 1)
    state.storage.write_atomic(markers.path(6, 0), json.dumps(record).encode())
    first = read_topic(kafka_bootstrap, topic)
    assert len(first) >= 1800
    assert {recovery.find_key(m.headers()).version for m in first} == {1}
    shuffled = rows.take(list(reversed(range(n))))  # a replay needs not keep the row order
    retry = sink.stage(TaskInfo(6, 0, attempt=1), iter(shuffled.to_batches()))
    assert retry.retry and retry.skipped == len(first)
    out = read_topic(kafka_bootstrap, topic)
    assert_exact([(m.key(), m.value()) for m in out],
                 list(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(),
                          strict=True)))
    keys = [recovery.find_key(m.headers()) for m in out]
    assert {k.version for k in keys} == {1} and all(k.of_sink(sink.sink_id) for k in keys)
    assert sorted(k.seq for k in keys) == list(range(n))
    sorted_rows = ordering.deterministic_order(rows, ordering.SORTED)
    by_seq = dict(zip(range(n), zip(sorted_rows.column("key").to_pylist(),
                                    sorted_rows.column("value").to_pylist(), strict=True),
                      strict=True))
    assert all(by_seq[k.seq] == (m.key(), m.value()) for k, m in zip(keys, out, strict=True))


def test_writes_right_after_the_topic_is_created(kafka_bootstrap, tmp_path):
    """CreateTopics returns before every partition has a leader; the sink's metadata and
    ListOffsets requests meet NOT_LEADER_FOR_PARTITION / LEADER_NOT_AVAILABLE then, and
    must ask again instead of failing the task. Several fresh topics make the race likely."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    rows = pa.table({"value": [f"v{i}".encode() for i in range(200)]})
    for _ in range(5):
        topic = f"fresh-{uuid.uuid4().hex[:10]}"
        for f in admin.create_topics([NewTopic(topic, 8, 1)]).values():
            f.result(30)
        sink = _sink(kafka_bootstrap, tmp_path, topic)
        report = sink.stage(TaskInfo(0, 0), iter(rows.to_batches()))
        assert report.produced == 200
        sink.commit(0, [report])
        assert_exact([m.value() for m in read_topic(kafka_bootstrap, topic)],
                     [f"v{i}".encode() for i in range(200)])
        admin.delete_topics([topic])


def test_an_unknown_target_topic_is_created_by_the_broker_with_one_warning(
        kafka_bootstrap, tmp_path, caplog):
    topic = f"auto-{uuid.uuid4().hex[:8]}"
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    schema = pa.schema([("value", pa.binary())])
    sink.check_schema(schema)
    with caplog.at_level("WARNING", logger="connectors"):
        sink.check_service()
        batch = pa.record_batch({"value": [f"v{i}".encode() for i in range(50)]})
        sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([batch]))])
    warnings = [r for r in caplog.records if topic in r.getMessage()]
    assert len(warnings) == 1 and "failOnUnknownTopic" in warnings[0].getMessage()
    assert sorted(m.value() for m in read_topic(kafka_bootstrap, topic)) == sorted(
        f"v{i}".encode() for i in range(50))


def test_fail_on_unknown_topic_refuses_a_topic_column_and_creates_nothing(
        kafka_bootstrap, new_topic, tmp_path):
    from confluent_kafka.admin import AdminClient

    from connectors.core.errors import KafkaSinkError

    known, missing = new_topic(partitions=2), f"absent-{uuid.uuid4().hex[:8]}"
    sink = _sink(kafka_bootstrap, tmp_path, None, fail_on_unknown_topic=True)
    batch = pa.record_batch({"value": [b"a", b"b"], "topic": [known, missing]})
    sink.check_schema(batch.schema)
    sink.check_service()
    with pytest.raises(KafkaSinkError, match=f"{missing}.*does not exist.*failOnUnknownTopic"):
        sink.stage(TaskInfo(0, 0), iter([batch]))
    assert missing not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(
        timeout=10).topics
    assert read_topic(kafka_bootstrap, known) == []


def _by_partition(messages: list) -> dict[int, list]:
    out: dict[int, list] = {}
    for m in messages:
        out.setdefault(m.partition(), []).append((m.key(), m.value(), m.headers()))
    return out


def test_keyed_batch_produce_writes_what_record_by_record_writes(kafka_bootstrap, new_topic,
                                                                  tmp_path):
    """The recovery-key mode's record batches on the wire (`wireProduce=true`) and its C produce
    loop against the Python loop: the same records, partitions, order and recovery-key
    headers, with null, empty and long keys and values."""
    from connectors.kafka.sink import batch_produce

    if os.environ.get("CI"):
        assert batch_produce.keyed_available(), "the _keyed_produce extension was not built"
    n = 20_000
    keys = [None if i % 7 == 0 else b"" if i % 11 == 0 else f"k{i % 97}".encode()
            for i in range(n)]
    values = [None if i % 13 == 0 else b"" if i % 17 == 0 else f"v{i}".encode() * (i % 5 + 1)
              for i in range(n)]
    table = pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())})
    sink_id = f"kb-{uuid.uuid4().hex[:8]}"
    got = {}
    for path in ("wire", "c-loop", "python"):
        topic = new_topic(partitions=5)
        sink = KafkaSink(sink_id, str(tmp_path / f"wal-{path}"),
                         bootstrap_servers=kafka_bootstrap, topic=topic,
                         wire_produce=path == "wire", batch_produce=path != "python")
        report = sink.stage(TaskInfo(3, 2), iter(table.to_batches(max_chunksize=3000)))
        assert report.produced == n
        got[path] = _by_partition(read_topic(kafka_bootstrap, topic))
    assert got["wire"] == got["c-loop"] == got["python"]
    seqs = [recovery.find_key(h).seq for part in got["wire"].values() for _, _, h in part]
    assert sorted(seqs) == list(range(n))


@pytest.mark.parametrize("wire_produce", [True, False])
def test_a_record_the_broker_refuses_fails_the_keyed_task(kafka_bootstrap, tmp_path,
                                                          wire_produce):
    """A record the broker refuses fails the task naming the partition, on the wire (the
    broker's answer to the batch) and through the C produce loop's delivery reports."""
    from connectors.demo.services.kafka import create_topic

    topic = f"t-small-{uuid.uuid4().hex[:12]}"
    create_topic(kafka_bootstrap, topic, 2, config={"max.message.bytes": "2000"})
    table = pa.table({"value": [b"x" * 100] * 50 + [b"y" * 5000] + [b"x" * 100] * 50})
    sink = _sink(kafka_bootstrap, tmp_path, topic, flush_timeout=60, wire_produce=wire_produce)
    expected = (rf"Produce to {topic}\[\d\]: MESSAGE_TOO_LARGE" if wire_produce else
                rf"1 records of batch 0 writer 0 failed delivery.*{topic}\[\d\]")
    with pytest.raises(KafkaSinkError, match=expected):
        sink.stage(TaskInfo(0, 0), iter(table.to_batches()))


def test_a_record_the_client_refuses_fails_the_keyed_task_naming_it(kafka_bootstrap, new_topic,
                                                                   tmp_path):
    topic = new_topic(partitions=1)
    sink = _sink(kafka_bootstrap, tmp_path, topic, kafka_options={"message.max.bytes": "2000"})
    table = pa.table({"value": [b"x" * 100] * 10 + [b"y" * 5000]})
    with pytest.raises(KafkaSinkError, match=rf"{topic}\[0\].*too large"):
        sink.stage(TaskInfo(0, 0), iter(table.to_batches()))
