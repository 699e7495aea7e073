"""The replicated Kafka tier: one 3-node Apache Kafka cluster (KRaft, each node broker and
controller, replication 3, ``min.insync.replicas=2``) for the session, and helpers to run a
sink task as Spark runs it while a node is killed, stopped or paused.

Every node closes connections idle for 5 s (``connections.max.idle.ms``), so each test also
meets broker-side closes of idle connections (a cached producer between tasks, a coordinator
connection between the rows and ``EndTxn``).

As root, each node runs in a network namespace of its own (tests/services/netns.py), so a
test can cut one node off the network while it runs (the ``network`` fixture).

Each node advertises a :class:`~tests.kafka_proxy.KafkaProxy` in front of its client
listener, so every client connection (bootstrap, the leaders and coordinators metadata
names) goes through a proxy that can hold a request, drop an answer or reset a connection
(``proxies``); replication and the controllers talk directly on their own listeners.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from connectors.core import failpoints
from connectors.demo.services.kafka import free_port
from connectors.demo.services.kafka_cluster import KafkaCluster
from connectors.kafka.sink import KafkaSink
from tests.helpers import announce, run_task_as_spark, unavailable
from tests.kafka_proxy import KafkaProxy
from tests.services import netns

IDLE_MS = 5000
#: The namespaces of each tier's cluster (by id), when it runs in them.
_NETWORK: dict[int, netns.Namespaces | None] = {}

#: (transactional, wireProduce) of each sink variant, named for test ids.
VARIANTS = {
    "rk-librdkafka": (False, False),
    "rk-wire": (False, True),
    "txn-librdkafka": (True, False),
    "txn-wire": (True, True),
}


@pytest.fixture(scope="package")
def kafka_proxied(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[tuple[KafkaCluster, dict[int, KafkaProxy]]]:
    """The tier's cluster and the proxy in front of each node (by node id). Package scope:
    the tier runs on one worker as one piece (tests/conftest.py ``XDIST_GROUPS``), and the
    three nodes stop with its last test instead of burning 3-5 % of a core each, idle,
    until the worker's other tests end (measured in a whole CI run, 2026-12-07: 12 % of a
    core for 44 min)."""
    workdir = str(tmp_path_factory.mktemp("kafka-cluster"))
    why = netns.unavailable()
    hosts = netns.Namespaces(3).start() if why is None else None
    cluster = KafkaCluster(workdir=workdir, advertised_ports=[free_port() for _ in range(3)],
                           extra_properties={"connections.max.idle.ms": str(IDLE_MS)},
                           hosts=hosts.hosts if hosts else None,
                           launchers=[hosts.launcher(i) for i in range(3)] if hosts else None)
    proxies = [KafkaProxy(n.port, listen_port=n.advertised_port, target_host=n.host).start()
               for n in cluster.nodes]
    began = time.monotonic()
    try:
        cluster.start()
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        cluster.close()
        for p in proxies:
            p.stop()
        if hosts is not None:
            hosts.close()
        unavailable("3-node Apache Kafka cluster", str(e))
    where = (f"each in a network namespace of its own ({', '.join(hosts.hosts)})" if hosts
             else f"on loopback (no network namespaces: {why})")
    announce(request, f"kafka-cluster: Apache Kafka {cluster.version}, 3 KRaft nodes {where} "
             f"behind proxies on {cluster.bootstrap}, up in {time.monotonic() - began:.1f}s, "
             f"logs {cluster.logs()}")
    _NETWORK[id(cluster)] = hosts
    try:
        yield cluster, {n.node_id: p for n, p in zip(cluster.nodes, proxies, strict=True)}
    finally:
        cluster.close()
        for p in proxies:
            p.stop()
        if hosts is not None:
            hosts.close()


@pytest.fixture(scope="package")
def kafka_cluster(kafka_proxied: tuple[KafkaCluster, dict[int, KafkaProxy]]) -> KafkaCluster:
    return kafka_proxied[0]


@pytest.fixture
def cluster(kafka_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The tier's cluster with every node running and in sync, before and after."""
    _heal(kafka_cluster)
    yield kafka_cluster
    _heal(kafka_cluster)


@pytest.fixture
def network(cluster: KafkaCluster) -> netns.Namespaces:
    """The namespaces the cluster's nodes run in, to cut one off (``cut(i)``, ``heal(i)``;
    node ``i + 1`` is host ``i``). Needs root: without it the test fails under CI and is
    skipped elsewhere."""
    hosts = _NETWORK.get(id(cluster))
    if hosts is None:
        unavailable("network namespaces for the cluster's nodes", netns.unavailable() or
                    "the cluster started on loopback")
    return hosts


@pytest.fixture
def proxies(cluster: KafkaCluster, kafka_proxied: tuple[KafkaCluster, dict[int, KafkaProxy]]
            ) -> Iterator[dict[int, KafkaProxy]]:
    """The proxy in front of each node (by node id), without faults before and after."""
    by_node = kafka_proxied[1]
    for p in by_node.values():
        p.clear()
    yield by_node
    for p in by_node.values():
        p.clear()


def _heal(c: KafkaCluster) -> None:
    network = _NETWORK.get(id(c))
    for i, n in enumerate(c.nodes):
        if network is not None and i in network.cut_now:
            network.heal(i)
            n.reachable = True
        if n.paused:
            c.resume(n.node_id)
        if not n.running():
            c.restart(n.node_id)
    c.wait_in_sync(timeout=120)


@pytest.fixture
def cluster_topic(cluster: KafkaCluster) -> Callable[..., str]:
    def make(partitions: int = 4, prefix: str = "c") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        cluster.create_topic(name, partitions)
        return name

    return make


def table(n: int, tag: str = "v") -> pa.Table:
    return pa.table({"key": [f"k{i % 113}".encode() for i in range(n)],
                     "value": [f"{tag}-{i:08d}".encode() for i in range(n)]})


def sink(bootstrap: str, tmp_path: Any, topic: str, variant: str, **kafka: str) -> KafkaSink:
    transactional, wire = VARIANTS[variant]
    sink_id = f"{variant}-{uuid.uuid4().hex[:8]}"
    return KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=bootstrap,
                     topic=topic, transactional=transactional, wire_produce=wire,
                     kafka_options=dict(kafka))


def run_task_with_fault(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, point: str,
                        fault: Callable[[], None], s: KafkaSink, batch_id: int,
                        rows: pa.Table) -> list[str]:
    """``run_task_as_spark`` on a thread, held at the failpoint spec ``point`` (``...!pause``, once)
    while ``fault()`` runs; the attempts' errors."""
    pause_dir = tmp_path / f"pause-{uuid.uuid4().hex[:6]}"
    pause_dir.mkdir()
    monkeypatch.setenv(failpoints.ENV, point)
    monkeypatch.setenv(failpoints.ENV_PAUSE_DIR, str(pause_dir))
    monkeypatch.setenv(failpoints.ENV_ONCE_DIR, str(pause_dir))
    failpoints.reload()
    spec = next(sp for specs in failpoints.parse(point).values() for sp in specs)
    reached, go = failpoints.pause_paths(spec.key, str(pause_dir))
    out: dict[str, Any] = {}

    def task() -> None:
        try:
            out["errors"] = run_task_as_spark(s, batch_id, rows)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            out["error"] = e

    t = threading.Thread(target=task, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(reached):
            if not t.is_alive() or time.monotonic() > deadline:
                raise AssertionError(f"{point} was never reached: {out}")
            time.sleep(0.05)
        fault()
    finally:
        open(go, "w").close()
        t.join(300)
        for name in (failpoints.ENV, failpoints.ENV_PAUSE_DIR, failpoints.ENV_ONCE_DIR):
            monkeypatch.delenv(name, raising=False)
        failpoints.reload()
    if "error" in out:
        raise out["error"]
    return list(out.get("errors", []))
