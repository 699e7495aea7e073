"""Commit facts that Kafka expires cannot turn into duplicates (issue 23, item 6).

A broker of its own with ``offsets.retention.minutes=1``: a task's transaction commits, the
batch does not (the task dies right after its commit, before the driver's), and the query
stays down until Kafka has deleted the commit fact. The retry must not write the batch
again: it refuses, naming the batch, the retention and what to check, and writes nothing;
``expiredFactPolicy=skip`` then lets the operator finish the batch, exact.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from connectors.core import failpoints
from connectors.core.errors import FailpointError, KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.kafka.sink import KafkaSink, commit_facts
from tests.helpers import assert_exact, read_topic, wait_for

ROWS = 500
RETENTION_MINUTES = 1


@pytest.fixture(scope="module")
def short_retention_broker(tmp_path_factory) -> Iterator[str]:
    from connectors.demo.services.kafka import ApacheKafka, create_topic

    broker = ApacheKafka(workdir=str(tmp_path_factory.mktemp("kafka-retention")), extra_properties={
        "offsets.retention.minutes": str(RETENTION_MINUTES),
        "offsets.retention.check.interval.ms": "1000",
    }).start()
    try:
        create_topic(broker.bootstrap, "warm-up", 1)
        yield broker.bootstrap
    finally:
        broker.stop()


def _rows(start: int) -> pa.Table:
    return pa.table({"value": [f"v{i}".encode() for i in range(start, start + ROWS)]})


def _sink(bootstrap: str, tmp_path, topic: str, sink_id: str, **kw) -> KafkaSink:
    sink = KafkaSink(sink_id, str(tmp_path / "wal"), bootstrap_servers=bootstrap, topic=topic,
                     transactional=True, **kw)
    sink.check_service()
    return sink


def _stage_dying_after_commit(monkeypatch, sink: KafkaSink, batch: int) -> None:
    """The task attempt commits its transaction, then dies before the driver's commit."""
    monkeypatch.setenv("CONNECTORS_FAILPOINTS", f"kafka_sink.after_txn_commit@{batch}!raise")
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            sink.stage(TaskInfo(batch, 0), iter(_rows(batch * ROWS).to_batches()))
    finally:
        monkeypatch.delenv("CONNECTORS_FAILPOINTS")
        failpoints.reload()


def test_a_retry_after_the_fact_expired_refuses_then_skip_finishes_the_batch_exactly(
    short_retention_broker, tmp_path, monkeypatch
):
    from connectors.demo.services.kafka import create_topic

    bootstrap = short_retention_broker
    topic = f"expiry-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    sink_id = f"exp-{uuid.uuid4().hex[:8]}"
    sink = _sink(bootstrap, tmp_path, topic, sink_id)
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter(_rows(0).to_batches()))])
    _stage_dying_after_commit(monkeypatch, sink, 1)
    facts = sink.options.facts_topic
    assert commit_facts.read_fact(sink.producer_conf, sink_id, 0, facts, 1, 30) is not None

    # The query stays down: Kafka deletes the fact RETENTION_MINUTES after its commit.
    began = time.monotonic()
    wait_for(lambda: commit_facts.read_fact(sink.producer_conf, sink_id, 0, facts, 1, 30)
             is None, timeout=RETENTION_MINUTES * 60 + 90, interval=2.0,
             what="the broker to expire the commit fact")
    print(f"fact expired after {time.monotonic() - began:.0f} s", flush=True)
    before = read_topic(bootstrap, topic)
    assert len(before) == 2 * ROWS  # batch 0, and batch 1's committed transaction

    # The restarted query's retry cannot tell whether batch 1 committed: it refuses.
    restarted = _sink(bootstrap, tmp_path, topic, sink_id)
    took = time.monotonic()
    with pytest.raises(KafkaSinkError) as refused:
        restarted.stage(TaskInfo(1, 0, attempt=0), iter(_rows(ROWS).to_batches()))
    message = str(refused.value)
    assert time.monotonic() - took < 30
    for part in ("batch 1, writer 0", "offsets.retention.minutes (1 min)",
                 commit_facts.group_id(sink_id, 0), "Nothing was written",
                 "expiredFactPolicy=skip", "expiredFactPolicy=rewrite"):
        assert part in message, (part, message)
    assert len(read_topic(bootstrap, topic)) == 2 * ROWS, "the refused retry wrote"
    assert restarted.last_committed() == 0

    # The operator checked the topic (batch 1 is there): skip finishes it, exact.
    fixed = _sink(bootstrap, tmp_path, topic, sink_id, expired_fact_policy="skip")
    report = fixed.stage(TaskInfo(1, 0, attempt=1), iter(_rows(ROWS).to_batches()))
    assert report.already_committed and report.produced == 0
    fixed.commit(1, [report])
    assert fixed.last_committed() == 1
    assert_exact([m.value() for m in read_topic(bootstrap, topic)],
                 [f"v{i}".encode() for i in range(2 * ROWS)])


def test_a_retry_within_the_retention_skips_the_committed_task(
    short_retention_broker, tmp_path, monkeypatch
):
    """The same crash, restarted at once: the fact is there, nothing is written twice."""
    from connectors.demo.services.kafka import create_topic

    bootstrap = short_retention_broker
    topic = f"expiry-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    sink = _sink(bootstrap, tmp_path, topic, f"exp-{uuid.uuid4().hex[:8]}")
    _stage_dying_after_commit(monkeypatch, sink, 0)
    retry = sink.stage(TaskInfo(0, 0, attempt=1), iter(_rows(0).to_batches()))
    assert retry.already_committed and retry.skipped == ROWS
    sink.commit(0, [retry])
    assert_exact([m.value() for m in read_topic(bootstrap, topic)],
                 [f"v{i}".encode() for i in range(ROWS)])
