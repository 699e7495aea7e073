"""The transactional sink's wire path on Apache Kafka: record batches built from Arrow
buffers, sent with Kafka's own requests (connectors/kafka/wire/producer.py; docs/design.md,
"Record batches on the wire").

test_kafka_sink_transactional.py runs every transactional step on this path too (it is the
default); these tests cover what only this path does: chunks, batches split at
``message.max.bytes``, fencing of an attempt that is still sending, the abort of a failed
attempt, and the fall-back to librdkafka.
"""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pyarrow as pa
import pytest

from connectors.core.sink import TaskInfo
from connectors.kafka.sink import KafkaSink, producers
from connectors.kafka.sink.wire_transport import Held
from connectors.kafka.wire import record_batch
from connectors.kafka.wire.protocol import WireError
from tests.helpers import assert_topic_exact, read_topic, scan_topic


def _sink(bootstrap: str, tmp_path, topic: str, **kw) -> KafkaSink:
    sink_id = f"wire-{uuid.uuid4().hex[:8]}"
    kw.setdefault("wire_produce", True)
    return KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=bootstrap,
                     topic=topic, transactional=True, **kw)


def _table(n: int) -> pa.Table:
    keys = [None if i % 3 == 0 else f"k{i % 101}".encode() for i in range(n)]
    values = [None if i % 97 == 0 else f"v{i}-".encode() * (1 + i % 20) for i in range(n)]
    return pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values)})


def _by_partition(messages) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    out: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        out.setdefault(m.partition(), []).append((m.key(), m.value()))
    return out


def test_chunks_and_split_batches_write_what_librdkafka_writes(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    """Small chunks (many Produce rounds per task) and a small ``message.max.bytes`` (many
    batches per partition and round): each partition holds the same records in the same
    order as librdkafka writes them."""
    monkeypatch.setattr(record_batch, "CHUNK_BYTES", 20_000)
    n = 6000
    table = _table(n)
    ours, theirs = new_topic(partitions=40), new_topic(partitions=40)
    sink = _sink(kafka_bootstrap, tmp_path, ours, kafka_options={"message.max.bytes": "3000"})
    report = sink.stage(TaskInfo(3, 1), iter(table.to_batches(max_chunksize=500)))
    assert (report.rows, report.produced) == (n, n)
    base = _sink(kafka_bootstrap, tmp_path, theirs, wire_produce=False)
    base.stage(TaskInfo(3, 1), iter(table.to_batches(max_chunksize=500)))
    got = read_topic(kafka_bootstrap, ours)
    assert len(got) == n
    assert _by_partition(got) == _by_partition(read_topic(kafka_bootstrap, theirs))
    assert sum(report.partitions[ours].values()) == n


def test_an_attempt_still_sending_is_fenced_by_its_retry(kafka_bootstrap, new_topic, tmp_path):
    """A zombie attempt of (B, w) with an open transaction: the retry's InitProducerId
    aborts it and fences it; its commit then fails and only the retry's rows are there."""
    import numpy as np

    topic = new_topic(partitions=3)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    held = Held(sink.producer_conf, producers.transactional_id(sink.sink_id, 0), "zombie", 30)
    zombie = held.producer
    try:
        zombie.init(30)
        values = pa.array([b"zombie"] * 10)
        parts = np.arange(10, dtype=np.int64) % 3
        zombie.produce(topic, 3, values, None, parts, np.argsort(parts, kind="stable"))
        retry = sink.stage(TaskInfo(9, 0, attempt=1), iter(_table(300).to_batches()))
        assert retry.produced == 300
        with pytest.raises(WireError, match="PRODUCER_FENCED|INVALID_PRODUCER_EPOCH"):
            zombie.end(commit=True)
        assert zombie.state.name == "FENCED"
    finally:
        held.close()
    got = read_topic(kafka_bootstrap, topic)
    assert len(got) == 300 and all(m.value() != b"zombie" for m in got)


def _fails_after(table: pa.Table, batches: int):
    for i, batch in enumerate(table.to_batches(max_chunksize=200)):
        if i == batches:
            raise RuntimeError("upstream failed mid-task")
        yield batch


def test_a_failed_attempt_aborts_and_leaves_readers_unblocked(
    kafka_bootstrap, new_topic, tmp_path, monkeypatch
):
    """A task that fails after some chunks went out aborts its transaction at once: a
    read_committed reader reaches the end of every partition (no open transaction holds
    back the last stable offset), and the retry writes every row once."""
    monkeypatch.setattr(record_batch, "CHUNK_BYTES", 5_000)
    topic = new_topic(partitions=4)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    table = _table(2000)
    with pytest.raises(RuntimeError, match="upstream failed"):
        sink.stage(TaskInfo(2, 0), _fails_after(table, 5))
    aborted, ends = scan_topic(kafka_bootstrap, topic, timeout=20)
    written = read_topic(kafka_bootstrap, topic, isolation="read_uncommitted")
    assert aborted == [] and len(written) >= 600  # sent, then aborted
    assert sum(ends.values()) == len(written) + 4  # every partition ends past its marker
    retry = sink.stage(TaskInfo(2, 0, attempt=1), iter(table.to_batches()))
    assert retry.produced == 2000
    assert len(read_topic(kafka_bootstrap, topic)) == 2000


def test_settings_the_wire_path_does_not_speak_go_through_librdkafka(
    kafka_bootstrap, new_topic, tmp_path, caplog
):
    topic = new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, topic,
                 kafka_options={"compression.type": "lz4"})
    with caplog.at_level(logging.INFO, logger="connectors.kafka"):
        report = sink.stage(TaskInfo(0, 0), iter(_table(500).to_batches()))
    assert report.produced == 500 and len(read_topic(kafka_bootstrap, topic)) == 500
    assert "compression.type=lz4" in caplog.text


def test_a_headers_column_goes_through_librdkafka(kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    sink = _sink(kafka_bootstrap, tmp_path, topic)
    table = _table(100).append_column(
        "headers", pa.array([[{"key": "h", "value": b"%d" % i}] for i in range(100)],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))
    report = sink.stage(TaskInfo(0, 0), iter(table.to_batches()))
    assert report.produced == 100
    got = read_topic(kafka_bootstrap, topic)
    assert sorted(int(m.headers()[0][1]) for m in got) == list(range(100))


def test_an_unknown_topic_fails_with_its_name(kafka_bootstrap, tmp_path):
    """The wire path's own error for a target that is not there (the sink's driver check
    normally catches it first; a task can still meet a topic deleted in between)."""
    topic = f"t-missing-{uuid.uuid4().hex[:8]}"
    held = Held({"bootstrap.servers": kafka_bootstrap}, f"wire-missing-{uuid.uuid4().hex[:6]}",
                "test", 2)
    try:
        held.producer.init(30)
        with pytest.raises(WireError, match=rf"{topic}.*UNKNOWN_TOPIC_OR_PARTITION"):
            held.producer.refresh(topic, 1)
    finally:
        held.close()


def test_recovery_keys_on_the_wire_reuse_one_producer_id_and_take_headers_via_librdkafka(
    kafka_bootstrap, new_topic, tmp_path
):
    """The recovery-key mode's idempotent wire producer serves task after task (sequences
    go on from where the last task left them); a task with a headers column goes through
    librdkafka, recovery keys and all."""
    from connectors.kafka.sink import recovery

    topic = new_topic(partitions=3)
    sink = KafkaSink(f"wrk-{uuid.uuid4().hex[:8]}", str(tmp_path / "wal"),
                     bootstrap_servers=kafka_bootstrap, topic=topic, wire_produce=True)
    for b in range(3):
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter(_table(400).to_batches()))])
    table = _table(50).append_column(
        "headers", pa.array([[{"key": "h", "value": b"x"}]] * 50,
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))
    sink.commit(3, [sink.stage(TaskInfo(3, 0), iter(table.to_batches()))])
    got = read_topic(kafka_bootstrap, topic)
    assert len(got) == 3 * 400 + 50
    keys = [recovery.find_key(m.headers()) for m in got]
    assert sorted((k.batch_id, k.seq) for k in keys if k is not None) == sorted(
        [(b, s) for b in range(3) for s in range(400)] + [(3, s) for s in range(50)])
    assert sum(1 for m in got if ("h", b"x") in (m.headers() or [])) == 50


def test_transactions_v2_join_partitions_with_the_produce_and_fence_the_ended_epoch(
    kafka_bootstrap, new_topic
):
    """Apache Kafka 4.x finalizes ``transaction.version`` 2 on a new cluster (KIP-890 part
    2): the wire path then sends no AddPartitionsToTxn or AddOffsetsToTxn, EndTxn answers
    the bumped epoch, and a late request of the ended transaction (its epoch) is refused as
    fenced, on a partition it wrote and on one it did not: it cannot join or open another."""
    from connectors.kafka.wire.protocol import FENCED, OUT_OF_ORDER_SEQUENCE

    topic = new_topic(partitions=4)
    tid, group = f"wire-tv2-{uuid.uuid4().hex[:8]}", f"wire-tv2-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": kafka_bootstrap}
    held = Held(conf, tid, "test", 30)
    producer = held.producer
    values = pa.array([b"v-%08d" % i for i in range(100)], pa.binary())
    parts = np.arange(100, dtype=np.int64) % 2
    try:
        producer.init(30)
        producer.prepare(topic, group)
        assert producer.tv2
        assert producer.produce(topic, 4, values, None, parts,
                                np.argsort(parts, kind="stable")) == 100
        # No AddPartitionsToTxn was sent: the partitions joined with their Produce.
        assert producer.cluster.counts[24] == 0
        producer.send_offset(group, topic, 0, 5, "fact")
        pid, epoch = producer.producer_id, producer.epoch
        producer.end(commit=True)
        assert (producer.producer_id, producer.epoch) == (pid, epoch + 1)
        for part in (0, 3):
            # A late request of the ended transaction: a producer with its id and epoch.
            late = Held(conf, tid, "late", 30)
            try:
                late.producer.core.tv2 = True
                late.producer.core.identified(pid, epoch, lambda *_: True)
                with pytest.raises(WireError) as e:
                    late.producer.produce(topic, 4, values.slice(0, 1), None,
                                          np.array([part], np.int64), np.array([0], np.int64))
            finally:
                late.close()
            # Partition 0 has the markers' epoch: the old one's batch is out of order there;
            # partition 3 asks the coordinator, which knows the epoch ended.
            assert e.value.code in (FENCED | {OUT_OF_ORDER_SEQUENCE}), e.value
    finally:
        held.close()
    assert_topic_exact(kafka_bootstrap, topic, {"v": 100})
