"""Late and lost answers between the Kafka sink and the replicated cluster (issue 34).

Every node advertises a :class:`~tests.kafka_proxy.KafkaProxy` (conftest.py), so every
connection of every client goes through a proxy. The proxy in front of the node leading
partition 0 holds one large Produce request past the client's ``request.timeout.ms`` and
then delivers it (a leader in a GC pause, a slow disk, an ``acks=all`` wait on a slow
follower), or drops the answer of one, or resets a connection in the middle of one; one case
kills the node while its Produce is held, so the partition's leadership moves. Each task runs
as Spark runs it: a failed attempt is retried with the next attempt number, up to 4 attempts.

The output must be exact (every value once) in both delivery modes and on both produce
paths, read to the end of every partition by a ``read_committed`` reader.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from connectors.core import failpoints
from connectors.core.errors import FailpointError
from connectors.core.sink import TaskInfo
from tests.helpers import assert_topic_exact, run_task_as_spark
from tests.integration.cluster_kafka.conftest import VARIANTS, sink, table
from tests.kafka_proxy import PRODUCE, Fault

ROWS = 100_000
ALL = list(VARIANTS)
WIRE = [v for v, (_, wire) in VARIANTS.items() if wire]
RECOVERY_KEYS = [v for v, (txn, _) in VARIANTS.items() if not txn]


def _leader_proxy(cluster, proxies, topic: str):
    return proxies[cluster.leader(topic, 0)]


@pytest.mark.parametrize("variant", ALL)
def test_a_produce_held_past_the_request_timeout_is_not_written_twice(
        cluster, proxies, cluster_topic, tmp_path, variant):
    """The first large Produce to the leader of partition 0 reaches it 12 s late, past the
    client's ``request.timeout.ms=5000``; the task (and its retries) must leave each value
    once."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant, **{"request.timeout.ms": "5000"})
    fault = _leader_proxy(cluster, proxies, topic).add(
        Fault("hold", PRODUCE, min_size=50_000, seconds=12))
    errors = run_task_as_spark(s, 0, table(ROWS))
    assert fault.fired, "no Produce request was held"
    assert fault.settled(60), "the held request never reached the broker"
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})
    print(f"{variant}: held 12 s; failed attempts: {errors}")


@pytest.mark.parametrize("variant", RECOVERY_KEYS)
def test_default_settings_a_produce_held_45s_is_not_written_twice(
        cluster, proxies, cluster_topic, tmp_path, variant):
    """The issue's case with every setting at its default (``request.timeout.ms`` 30 s): the
    recovery-key mode, the request held 45 s."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant)
    fault = _leader_proxy(cluster, proxies, topic).add(
        Fault("hold", PRODUCE, min_size=50_000, seconds=45))
    run_task_as_spark(s, 0, table(ROWS))
    assert fault.fired, "no Produce request was held"
    assert fault.settled(90), "the held request never reached the broker"
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})


@pytest.mark.parametrize("variant", ALL)
def test_a_lost_produce_answer_is_not_written_twice(cluster, proxies, cluster_topic,
                                                    tmp_path, variant):
    """The leader appends a Produce, its answer never comes back: the client waits
    ``socket.timeout.ms`` (10 s here, 60 s by default) and sends again."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant,
             **{"request.timeout.ms": "5000", "socket.timeout.ms": "10000"})
    fault = _leader_proxy(cluster, proxies, topic).add(
        Fault("drop_answer", PRODUCE, min_size=50_000))
    run_task_as_spark(s, 0, table(ROWS))
    assert fault.fired, "no Produce answer was dropped"
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})


@pytest.mark.parametrize("variant", ALL)
def test_a_connection_reset_mid_produce_is_not_written_twice(cluster, proxies, cluster_topic,
                                                             tmp_path, variant):
    """Half a Produce request reaches the leader, then the connection is reset."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant)
    fault = _leader_proxy(cluster, proxies, topic).add(
        Fault("reset", PRODUCE, min_size=50_000))
    run_task_as_spark(s, 0, table(ROWS))
    assert fault.fired, "no Produce request was cut"
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})


@pytest.mark.parametrize("variant", RECOVERY_KEYS)
def test_an_attempt_failing_while_a_produce_is_held_settles_it_before_the_retry_scans(
        cluster, proxies, cluster_topic, tmp_path, monkeypatch, variant):
    """Recovery keys: the first attempt fails (the ``mid_produce`` failpoint) while one of its
    Produce requests is held; the retry scans for what is there. The held request must be
    settled before the attempt's failure reaches Spark, or it would land after the scan."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant, **{"request.timeout.ms": "5000"})
    rows = table(ROWS)
    fault = _leader_proxy(cluster, proxies, topic).add(
        Fault("hold", PRODUCE, min_size=50_000, seconds=10))
    monkeypatch.setenv(failpoints.ENV, "kafka_sink.mid_produce@0#60000!raise")
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            s.stage(TaskInfo(0, 0, 0), iter(rows.to_batches(max_chunksize=10_000)))
    finally:
        monkeypatch.delenv(failpoints.ENV)
        failpoints.reload()
    report = s.stage(TaskInfo(0, 0, 1), iter(rows.to_batches(max_chunksize=10_000)))
    s.commit(0, [report])
    assert fault.fired and fault.settled(60), "no held request reached the broker"
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})


@pytest.mark.parametrize("variant", ALL)
def test_the_leader_killed_while_its_produce_is_held(cluster, proxies, cluster_topic,
                                                     tmp_path, variant):
    """A Produce to the leader of partition 0 is held; while it is held the leader is
    SIGKILLed (its leaderships move once it is fenced) and later restarted. The held bytes
    die with the node's connection; the task goes on to the new leaders."""
    topic = cluster_topic(4)
    s = sink(cluster.bootstrap, tmp_path, topic, variant, **{"request.timeout.ms": "5000"})
    victim = cluster.leader(topic, 0)
    fault = proxies[victim].add(Fault("hold", PRODUCE, min_size=50_000, seconds=20))
    out: dict[str, Any] = {}

    def task() -> None:
        try:
            out["errors"] = run_task_as_spark(s, 0, table(ROWS))
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e

    t = threading.Thread(target=task, daemon=True)
    t.start()
    deadline = 120
    waited = 0.0
    while not fault.fired and t.is_alive() and waited < deadline:
        t.join(0.05)
        waited += 0.05
    assert fault.fired, f"no Produce request was held: {out}"
    cluster.kill(victim)
    t.join(300)
    cluster.restart(victim)
    if "error" in out:
        raise out["error"]
    assert_topic_exact(cluster.bootstrap, topic, {"v": ROWS})
    print(f"{variant}: node {victim} killed with a Produce held; failed attempts: "
          f"{out.get('errors')}")
