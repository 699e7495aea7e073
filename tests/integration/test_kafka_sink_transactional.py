"""The Kafka sink's transactional mode on Apache Kafka (issue 12; docs/design.md,
"Kafka sink: transactional path").

One Kafka transaction per task attempt holds its rows and a commit fact (a consumer-group
offset sent with ``send_offsets_to_transaction``). These tests use the protocol without
Spark (``sink.stage``/``sink.commit``) so each step is explicit; the Spark-level recovery
tests are in test_kafka_sink_recovery.py and test_cross_clients.py.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pyarrow as pa
import pytest

from connectors.core import failpoints
from connectors.core.errors import FailpointError, KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.kafka.sink import KafkaSink, commit_facts, recovery
from tests.helpers import assert_exact, read_topic

ROWS = 3000


def _sink(bootstrap: str, tmp_path, topic: str, **kw) -> KafkaSink:
    sink_id = f"txn-{uuid.uuid4().hex[:8]}"
    return KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=bootstrap,
                     topic=topic, transactional=True, **kw)


def _rows(n: int = ROWS) -> pa.Table:
    return pa.table({"key": [f"k{i % 17}".encode() for i in range(n)],
                     "value": [f"v{i}".encode() for i in range(n)]})


def _values(n: int = ROWS) -> list[bytes]:
    return [f"v{i}".encode() for i in range(n)]


def _fail_once(monkeypatch, spec: str, call):
    monkeypatch.setenv("CONNECTORS_FAILPOINTS", spec)
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            call()
    finally:
        monkeypatch.delenv("CONNECTORS_FAILPOINTS")
        failpoints.reload()


def test_records_carry_no_header_and_the_fact_is_a_stable_group_offset(
    kafka_bootstrap, new_topic, tmp_path
):
    topic = new_topic(partitions=4)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    report = sink.stage(TaskInfo(7, 2), iter(_rows().to_batches()))
    assert (report.produced, report.skipped, report.retry) == (ROWS, 0, False)
    out = read_topic(kafka_bootstrap, topic)
    assert_exact([m.value() for m in out], _values())
    assert all(not m.headers() for m in out), "transactional mode adds no header"
    # The fact: group eo-sink-<sink_id>-w2 holds offset 0 of the facts topic's partition 0,
    # with batch 7 in the offset's metadata.
    facts, scope = sink.options.facts_topic, commit_facts.scope_of(sink.wal_path)
    fact = commit_facts.read_fact(sink.producer_conf, sink.sink_id, 2, facts, 7, scope, 30)
    assert fact is not None and fact.rows == ROWS
    assert sum(fact.partitions[topic].values()) == ROWS
    assert commit_facts.read_fact(sink.producer_conf, sink.sink_id, 2, facts, 8, scope, 30) is None
    assert commit_facts.read_fact(sink.producer_conf, sink.sink_id, 1, facts, 7, scope, 30) is None
    # The same sink id with another walPath (another output) does not take it for its own.
    other = commit_facts.scope_of(sink.wal_path + "-new")
    assert commit_facts.read_fact(sink.producer_conf, sink.sink_id, 2, facts, 7, other, 30) is None


def test_retry_after_the_transaction_committed_writes_nothing(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    topic = new_topic(partitions=3)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    _fail_once(monkeypatch, "kafka_sink.after_txn_commit@4!raise",
               lambda: sink.stage(TaskInfo(4, 0), iter(_rows().to_batches())))
    retry = sink.stage(TaskInfo(4, 0, attempt=1), iter(_rows().to_batches()))
    assert retry.already_committed and retry.retry and retry.rows == ROWS
    assert (retry.produced, retry.skipped) == (0, ROWS)
    assert sum(retry.partitions[topic].values()) == ROWS
    sink.commit(4, [retry])
    assert sink.commit_info(4)["skipped"] == ROWS
    assert_exact([m.value() for m in read_topic(kafka_bootstrap, topic)], _values())
    # The retry did not even open a transaction: nothing after the first attempt's marker.
    uncommitted = read_topic(kafka_bootstrap, topic, isolation="read_uncommitted")
    assert len(uncommitted) == ROWS


def test_retry_before_the_transaction_committed_writes_everything_once(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    topic = new_topic(partitions=3)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    _fail_once(monkeypatch, "kafka_sink.after_flush@5!raise",
               lambda: sink.stage(TaskInfo(5, 1), iter(_rows().to_batches())))
    # The failed attempt's rows reached the log, in a transaction it aborted.
    assert len(read_topic(kafka_bootstrap, topic, isolation="read_uncommitted")) == ROWS
    assert read_topic(kafka_bootstrap, topic) == []
    retry = sink.stage(TaskInfo(5, 1, attempt=1), iter(_rows().to_batches()))
    assert (retry.produced, retry.skipped, retry.already_committed) == (ROWS, 0, False)
    assert_exact([m.value() for m in read_topic(kafka_bootstrap, topic)], _values())


def test_a_committed_batch_replayed_writes_nothing(kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter(_rows().to_batches()))])
    ends = len(read_topic(kafka_bootstrap, topic, isolation="read_uncommitted"))
    replay = sink.stage(TaskInfo(0, 0), iter(_rows().to_batches()))
    assert replay.already_committed and replay.produced == 0
    assert len(read_topic(kafka_bootstrap, topic, isolation="read_uncommitted")) == ends


def test_recovery_key_headers_on_request(kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, topic, recovery_key_headers=True)
    sink.stage(TaskInfo(3, 1), iter(_rows(500).to_batches()))
    keys = [recovery.find_key(m.headers()) for m in read_topic(kafka_bootstrap, topic)]
    assert all(k is not None and k.of_sink(sink.sink_id) and (k.batch_id, k.writer) == (3, 1)
               for k in keys)
    assert sorted(k.seq for k in keys if k is not None) == list(range(500))


def test_streamed_batches_fail_mid_task_and_the_retry_writes_everything_once(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    """With a topic option the task produces Arrow batch by Arrow batch; a failure after
    1,000 records (four batches in) leaves nothing visible, and the retry writes all."""
    topic = new_topic(partitions=3)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    _fail_once(monkeypatch, "kafka_sink.mid_produce@6#1000!raise",
               lambda: sink.stage(TaskInfo(6, 0), iter(_rows().to_batches(max_chunksize=250))))
    assert read_topic(kafka_bootstrap, topic) == []
    retry = sink.stage(TaskInfo(6, 0, attempt=1), iter(_rows().to_batches(max_chunksize=250)))
    assert (retry.rows, retry.produced, retry.already_committed) == (ROWS, ROWS, False)
    assert sum(retry.partitions[topic].values()) == ROWS
    assert_exact([m.value() for m in read_topic(kafka_bootstrap, topic)], _values())


def test_a_topic_column_writes_the_whole_task_in_one_transaction(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    """Without a topic option the task needs every row first (the commit fact's place is
    the first target topic); a retry after the commit writes nothing to either topic."""
    a, b = sorted([new_topic(partitions=2), new_topic(partitions=3)])
    sink_id = f"txn-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=kafka_bootstrap,
                     transactional=True)
    rows = _rows().append_column("topic", pa.array([a if i % 2 else b for i in range(ROWS)]))
    _fail_once(monkeypatch, "kafka_sink.after_txn_commit@2!raise",
               lambda: sink.stage(TaskInfo(2, 0), iter(rows.to_batches(max_chunksize=500))))
    retry = sink.stage(TaskInfo(2, 0, attempt=1), iter(rows.to_batches(max_chunksize=500)))
    assert retry.already_committed and (retry.produced, retry.skipped) == (0, ROWS)
    got = read_topic(kafka_bootstrap, a) + read_topic(kafka_bootstrap, b)
    assert_exact([m.value() for m in got], _values())


def _odd_rows(n: int = ROWS) -> pa.Table:
    """Null and empty keys and values, a large_binary value column, a sliced batch."""
    keys = [None if i % 5 == 0 else b"" if i % 7 == 0 else f"k{i % 23}".encode()
            for i in range(n + 10)]
    values = [None if i % 11 == 0 else b"" if i % 13 == 0 else f"v{i}".encode() * (1 + i % 3)
              for i in range(n + 10)]
    table = pa.table({"key": pa.array(keys, pa.binary()),
                      "value": pa.array(values, pa.large_binary())})
    return table.slice(10)  # Arrow offsets that do not start at 0


@pytest.mark.parametrize("path", ["wire", "batch", "record"])
def test_every_produce_path_writes_the_same_records(
    kafka_bootstrap, new_topic, tmp_path, path
):
    """Record batches on the wire (wireProduce=true), ``rd_kafka_produce_batch``
    (wireProduce=false, batchProduce=true) and confluent-kafka's ``produce()`` write the same
    records to the same partitions: null stays null, empty stays empty, keyed rows go where
    the Java partitioner puts them."""
    from connectors.kafka.sink.partitioner import key_partition, null_key_start

    topic = new_topic(partitions=4)
    table = _odd_rows()
    sink = _sink(kafka_bootstrap, tmp_path, topic, wire_produce=path == "wire",
                 batch_produce=path != "record", null_key_run_bytes=2_000)
    report = sink.stage(TaskInfo(1, 0), iter(table.to_batches(max_chunksize=700)))
    assert report.produced == ROWS
    got = read_topic(kafka_bootstrap, topic)
    assert_exact([(m.key(), m.value()) for m in got],
                 list(zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                          strict=True)))
    assert all(m.partition() == key_partition(m.key(), 4) for m in got if m.key() is not None)
    # Null keys: runs of about 2,000 bytes (the values'), carried across the 700-row
    # batches, to consecutive partitions from the task's start.
    start, before, want = null_key_start(1, 0), 0, Counter()
    for key, value in zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                          strict=True):
        if key is None:
            want[(start + before // 2_000) % 4, value] += 1
            before += len(value or b"")
    assert Counter((m.partition(), m.value()) for m in got if m.key() is None) == want


def test_a_record_the_broker_refuses_fails_the_task_and_nothing_is_visible(
    kafka_bootstrap, tmp_path
):
    """A delivery failure under batch produce: the broker refuses records over the topic's
    max.message.bytes; librdkafka then refuses the commit, the task fails and aborts."""
    from connectors.demo.services.kafka import create_topic

    topic = f"t-small-{uuid.uuid4().hex[:12]}"
    create_topic(kafka_bootstrap, topic, 2, config={"max.message.bytes": "2000"})
    table = pa.table({"value": [b"x" * 100] * 50 + [b"y" * 5000] + [b"x" * 100] * 50})
    sink = _sink(kafka_bootstrap, tmp_path, topic, flush_timeout=60)
    with pytest.raises(Exception, match="failed delivery|too large|TOO_LARGE"):
        sink.stage(TaskInfo(0, 0), iter(table.to_batches()))
    assert read_topic(kafka_bootstrap, topic) == []


@pytest.mark.parametrize("wire_produce", [True, False])
def test_a_record_the_client_refuses_names_its_topic_and_partition(
    kafka_bootstrap, new_topic, tmp_path, wire_produce
):
    topic = new_topic(partitions=1)
    sink = _sink(kafka_bootstrap, tmp_path, topic, wire_produce=wire_produce,
                 kafka_options={"message.max.bytes": "2000"})
    table = pa.table({"value": [b"x" * 100] * 10 + [b"y" * 5000]})
    with pytest.raises(KafkaSinkError, match=rf"{topic}\[0\].*too large"):
        sink.stage(TaskInfo(0, 0), iter(table.to_batches()))
    assert read_topic(kafka_bootstrap, topic) == []


@pytest.mark.parametrize("topic_column", [False, True])
def test_batch_produce_waits_out_a_full_queue_and_loses_nothing(
    kafka_bootstrap, new_topic, tmp_path, topic_column
):
    """A producer queue of 1,000 records and tasks of 40,000 rows (more than one message
    array of batch_produce.CHUNK): every call that finds the queue full goes on where it stopped."""
    topic = new_topic(partitions=3)
    n = 40_000
    table = pa.table({"key": [f"k{i % 101}".encode() for i in range(n)],
                      "value": [f"v{i}".encode() for i in range(n)]})
    options = {"kafka_options": {"queue.buffering.max.messages": "1000"},
               "wire_produce": False}  # librdkafka's queue
    if topic_column:
        table = table.append_column("topic", pa.array([topic] * n))
        sink_id = f"txn-{uuid.uuid4().hex[:8]}"
        sink = KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=kafka_bootstrap,
                         transactional=True, **options)
    else:
        sink = _sink(kafka_bootstrap, tmp_path, topic, **options)
    report = sink.stage(TaskInfo(0, 0), iter(table.to_batches(max_chunksize=25_000)))
    assert report.produced == n
    assert_exact([m.value() for m in read_topic(kafka_bootstrap, topic)],
                 [f"v{i}".encode() for i in range(n)])


def _failing_upstream(error: Exception):
    """Spark's hand-over of a task whose source read fails before any row."""
    raise error
    yield  # unreachable: it makes this function a generator


def _fence_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "eo-kafka-sink-fence"]


def test_an_upstream_failure_while_the_task_fences_fails_the_task_with_its_own_error(
    kafka_bootstrap, new_topic, tmp_path
):
    """2T runs on a thread while the task waits for its rows: when the wait ends in the
    source's error, the task fails with that error once the fence is done, leaves no thread
    behind, and its retry writes every row once."""
    topic = new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    upstream = RuntimeError("the source's read failed")
    with pytest.raises(RuntimeError, match="the source's read failed"):
        sink.stage(TaskInfo(3, 1), _failing_upstream(upstream))
    assert _fence_threads() == []
    assert sink._state().get_marker(3, 1) is None  # no row came: no started marker
    retry = sink.stage(TaskInfo(3, 1, attempt=1), iter(_rows().to_batches(max_chunksize=500)))
    assert (retry.rows, retry.produced, retry.already_committed) == (ROWS, ROWS, False)
    assert_exact([m.value() for m in read_topic(kafka_bootstrap, topic)], _values())


def test_an_empty_task_writes_nothing_and_leaves_no_marker(kafka_bootstrap, new_topic,
                                                           tmp_path):
    """A task that gets no rows has fenced its writer id (harmless: its earlier attempts
    had no rows either) but opens no transaction and creates no started marker."""
    topic = new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    report = sink.stage(TaskInfo(8, 0), iter(_rows(0).to_batches()))
    assert (report.rows, report.produced, report.already_committed) == (0, 0, False)
    assert sink._state().get_marker(8, 0) is None
    assert _fence_threads() == []
    sink.commit(8, [report])
    assert read_topic(kafka_bootstrap, topic) == []
