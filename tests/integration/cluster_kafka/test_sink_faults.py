"""The Kafka sink on a replicated cluster whose nodes fail under it (issue 34), in both
delivery modes and on both produce paths (librdkafka, the default; record batches on the
wire, ``wireProduce=true``).

Each task runs as Spark runs it (a failed attempt is retried, up to 4 attempts) and is held
at a protocol step (a ``pause`` failpoint) while a node is SIGKILLed, its coordinator role
taken away, or stopped with SIGSTOP; then it goes on. The topic must hold every value once,
read ``read_committed`` to the end of every partition.
"""

from __future__ import annotations

import time

import pytest

from connectors.kafka.sink import producers
from tests.helpers import assert_topic_exact, run_task_as_spark
from tests.integration.cluster_kafka.conftest import (
    VARIANTS,
    run_task_with_fault,
    sink,
    table,
)

ROWS = 60_000
ALL = list(VARIANTS)
TRANSACTIONAL = [v for v, (txn, _) in VARIANTS.items() if txn]


@pytest.mark.parametrize("variant", ALL)
def test_the_leader_killed_mid_produce(cluster, cluster_topic, tmp_path, monkeypatch, variant):
    """Half the task's records are acknowledged, then the node leading partition 0 is
    SIGKILLed (leaders move once the controller fences it); the rest of the task goes to the
    new leaders."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant)
    victim = cluster.leader(topic, 0)
    errors = run_task_with_fault(
        monkeypatch, tmp_path, f"kafka_sink.mid_produce@0#{ROWS // 2}!pause",
        lambda: cluster.kill(victim, wait=False), s, 0, table(ROWS))
    cluster.restart(victim)
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})
    print(f"{variant}: node {victim} killed mid-produce; failed attempts: {errors}")


@pytest.mark.parametrize("variant", TRANSACTIONAL)
def test_the_transaction_coordinator_killed_before_end_txn(cluster, cluster_topic, tmp_path,
                                                           monkeypatch, variant):
    """Every row is produced and flushed; the node coordinating the task's transactional.id
    is SIGKILLed before the commit fact and ``EndTxn``: the commit must find the new
    coordinator (or a retry fences and writes again), never leave a hanging transaction."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant)
    coordinator = cluster.coordinator(producers.transactional_id(s.sink_id, 0))
    errors = run_task_with_fault(
        monkeypatch, tmp_path, "kafka_sink.after_flush@0!pause",
        lambda: cluster.kill(coordinator), s, 0, table(ROWS))
    cluster.restart(coordinator)
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})
    print(f"{variant}: coordinator node {coordinator} killed before EndTxn; failed attempts: "
          f"{errors}")


@pytest.mark.parametrize("variant", ALL)
def test_a_follower_stopped_mid_produce(cluster, cluster_topic, tmp_path, monkeypatch,
                                        variant):
    """A node that follows partition 0 is SIGSTOPped mid-task (a GC pause, a dead disk):
    ``acks=all`` appends wait until the leader drops it from the ISR (10 s here), or time out;
    partitions it leads move once it is fenced. Resumed after the task."""
    topic = cluster_topic(4)
    # A stopped node still accepts connections: a client finds out only when its wait ends.
    # Shorter waits than the defaults (30 s / 60 s), honoured by both paths, keep this test
    # at about half a minute.
    s = sink(cluster.bootstrap, tmp_path, topic, variant,
             **{"request.timeout.ms": "8000", "socket.timeout.ms": "13000"})
    leader = cluster.leader(topic, 0)
    follower = next(n.node_id for n in cluster.nodes if n.node_id != leader)
    errors = run_task_with_fault(
        monkeypatch, tmp_path, f"kafka_sink.mid_produce@0#{ROWS // 3}!pause",
        lambda: cluster.pause(follower), s, 0, table(ROWS))
    cluster.resume(follower)
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})
    print(f"{variant}: node {follower} stopped mid-produce; failed attempts: {errors}")


@pytest.mark.parametrize("variant", ALL)
def test_connections_the_broker_closed_while_idle(cluster, cluster_topic, tmp_path, variant):
    """The cluster closes connections idle for 5 s: a worker's cached producer (and the
    transactional mode's fact client) meet closed connections at the next task."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant)
    errors = run_task_as_spark(s, 0, table(5_000, "a"))
    time.sleep(7)
    errors += run_task_as_spark(s, 1, table(5_000, "b"))
    assert_topic_exact(cluster.bootstrap, topic, {"a": 5_000, "b": 5_000})
    assert not errors, errors  # a closed idle connection is no reason to fail a task
