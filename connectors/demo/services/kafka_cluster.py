"""A replicated Apache Kafka cluster on loopback: three KRaft nodes, each broker and
controller, for the fault tier of the tests and the ``--cluster`` benchmarks.

The nodes run the jars :mod:`connectors.demo.services.maven` resolves from Maven Central
(any Kafka version Maven Central serves: ``version="3.9.1"``), with one formatted cluster
id, a static ``controller.quorum.voters``, replication 3 and ``min.insync.replicas=2`` for
every topic, the internal ones included. Each JVM is kept lean (two network and I/O
threads, one replica fetcher, a small heap, serial GC) so three fit on two cores beside
Spark.

Faults, each on one node: :meth:`KafkaCluster.kill` (SIGKILL), :meth:`KafkaCluster.stop`
(SIGTERM: a controlled shutdown, as a rolling upgrade does), :meth:`KafkaCluster.restart`,
:meth:`KafkaCluster.pause` / :meth:`KafkaCluster.resume` (SIGSTOP / SIGCONT: a node stuck
in a GC pause or on a dead disk), and :meth:`KafkaCluster.wait_in_sync` (every replica of
every partition back in its ISR). :meth:`KafkaCluster.rolling_restart` does what an upgrade
does: each node in turn stopped, started, waited for.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.demo.services import maven
from connectors.demo.services.kafka import _LOG4J2, _stop, _with_open_files, free_port
from connectors.demo.services.progress import Say, heartbeat, say_or_log

log = logging.getLogger(__name__)

_NODE_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
# Clients use PLAINTEXT (advertised at ``advertised_port``, a proxy's when one sits in
# front); replication has its own listener, always direct, so a proxy's faults never touch it.
listeners=PLAINTEXT://{host}:{port},REPLICATION://{host}:{replication_port},\
CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{advertised_host}:{advertised_port},\
REPLICATION://{host}:{replication_port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=REPLICATION
log.dirs={data_dir}
num.partitions=1
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
# Lean JVMs: three nodes and Spark share two cores.
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
num.recovery.threads.per.data.dir=1
background.threads=2
log.cleaner.threads=1
# A node back from a kill rejoins the ISR within seconds; a stopped follower leaves it in 10.
replica.lag.time.max.ms=10000
# A killed node is fenced (its leaders moved, its replicas out of every ISR) within 6 s.
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
controlled.shutdown.enable=true
unclean.leader.election.enable=false
"""

#: JVM flags that keep a node's thread count and memory small.
_LEAN_JVM = ("-XX:+UseSerialGC", "-XX:CICompilerCount=2", "-XX:TieredStopAtLevel=1",
             "-XX:+ExitOnOutOfMemoryError")


class Node:
    """One KRaft node (broker + controller) of a :class:`KafkaCluster`."""

    def __init__(self, cluster: KafkaCluster, node_id: int,
                 advertised_port: int | None = None, host: str = "127.0.0.1",
                 launcher: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.node_id = node_id
        #: The address every listener binds (a namespace's own host, or loopback), and the
        #: command prefix that starts the JVM there (``ip netns exec NAME``).
        self.host = host
        self.launcher = launcher
        #: False while a test has cut the node off the network (it runs, nothing reaches it).
        self.reachable = True
        self.port = free_port()
        #: The port clients are told (a proxy's in front of ``port``, or ``port``).
        self.advertised_port = advertised_port or self.port
        self.replication_port = free_port()
        self.controller_port = free_port()
        self.workdir = cluster.workdir / f"node{node_id}"
        self.log_path = str(self.workdir / "broker.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def address(self) -> str:
        """The client listener itself (no proxy)."""
        return f"{self.host}:{self.port}"

    @property
    def advertised_address(self) -> str:
        """Where clients connect: the advertised port (a proxy's on loopback, if one was
        given; else the listener itself)."""
        if self.advertised_port != self.port:
            return f"127.0.0.1:{self.advertised_port}"
        return self.address

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def config(self) -> Path:
        return self.workdir / "server.properties"

    def write_config(self, voters: str, extra: dict[str, str]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        c = self.cluster
        props = _NODE_PROPERTIES.format(
            node_id=self.node_id, voters=voters, port=self.port, host=self.host,
            advertised_host=self.advertised_address.rsplit(":", 1)[0],
            advertised_port=self.advertised_port, replication_port=self.replication_port,
            controller_port=self.controller_port, data_dir=self.workdir / "data",
            replicas=min(3, len(c.nodes)), min_isr=c.min_isr)
        props += "".join(f"{k}={v}\n" for k, v in extra.items())
        self.config().write_text(props)
        (self.workdir / "log4j2.yaml").write_text(_LOG4J2.format(log_path=self.log_path))
        (self.workdir / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, f\nlog4j.appender.f=org.apache.log4j.FileAppender\n"
            f"log4j.appender.f.File={self.log_path}\n"
            "log4j.appender.f.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.f.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            "log4j.logger.kafka.request.logger=WARN\nlog4j.logger.state.change.logger=WARN\n")

    def java(self, *args: str) -> list[str]:
        return ["java", f"-Xmx{self.cluster.heap}", "-Xss1m", *_LEAN_JVM,
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.yaml'}",
                f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
                "-cp", self.cluster.classpath, *args]

    def format(self, cluster_id: str) -> None:
        done = subprocess.run(  # noqa: S603 - fixed argv
            self.java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                      "-c", str(self.config()), "--ignore-formatted"),
            capture_output=True, text=True, timeout=180, check=False)
        if done.returncode != 0:
            raise ConnectorError(f"formatting Kafka node {self.node_id} failed: "
                                 f"{(done.stdout + done.stderr)[-2000:]}")

    def launch(self) -> None:
        if self.running():
            return
        nice = ["nice", "-n", str(self.cluster.nice)] if self.cluster.nice else []
        with open(self.workdir / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                [*nice, *self.launcher,
                 *_with_open_files(self.java("kafka.Kafka", str(self.config())))],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.paused = False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)  # the shell's exec'd java leads its own group


class KafkaCluster:
    """Three (``size``) KRaft nodes of Apache Kafka ``version`` on loopback.

    ``bootstrap`` lists every node. ``extra_properties`` go into every node's
    ``server.properties`` (``connections.max.idle.ms`` and so on). The files live in
    ``workdir`` (a temp directory by default, removed by :meth:`close` unless ``keep``).

    ``advertised_ports`` (one per node): the port each node's client listener advertises,
    so a proxy listening there and forwarding to ``node.port`` carries every client
    connection (bootstrap, leaders, coordinators); ``bootstrap`` then lists those ports.
    Replication and the controllers use their own listeners, never proxied.

    ``hosts`` and ``launchers`` (one per node): the address each node binds and the command
    prefix that starts it, to run each node on a host of its own (a network namespace,
    tests/services/netns.py) whose link a test can cut.
    """

    def __init__(self, *, size: int = 3, version: str | None = None,
                 workdir: str | None = None, heap: str = "320m", min_isr: int = 2,
                 extra_properties: dict[str, str] | None = None, keep: bool = False,
                 advertised_ports: list[int] | None = None,
                 hosts: list[str] | None = None,
                 launchers: list[list[str]] | None = None) -> None:
        if size < 1:
            raise ConnectorError(f"a Kafka cluster needs at least one node, not {size}")
        if advertised_ports is not None and len(advertised_ports) != size:
            raise ConnectorError(f"advertised_ports needs one port per node ({size}), "
                                 f"not {len(advertised_ports)}")
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="eo-kafka-cluster-"))
        self.heap = heap
        self.min_isr = min(min_isr, size)
        self.extra = dict(extra_properties or {})
        self.keep = keep
        self.requested_version = version
        self.version = version or maven.pom_property("kafka.version")
        self.classpath = ""
        self.nodes = [Node(self, i + 1, advertised_ports[i] if advertised_ports else None,
                           hosts[i] if hosts else "127.0.0.1",
                           tuple(launchers[i]) if launchers else ())
                      for i in range(size)]
        self.bootstrap = ",".join(n.advertised_address for n in self.nodes)
        self.nice = 0  #: the nodes' niceness (:meth:`yield_cpu`)
        self._say = say_or_log(None, log)
        self._phase = "not started"  # what a start is doing, for its progress lines

    # -- life cycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 180.0, progress: Say | None = None) -> KafkaCluster:
        """Resolve the jars (their own bound), format and launch every node, then wait up to
        ``timeout`` seconds until each is registered; ``progress`` gets a line at least
        every 10 s of each step, of this start and of any :meth:`restart` (default: logged
        at INFO)."""
        self._say = say_or_log(progress, log)
        props = {"kafka.version": self.requested_version} if self.requested_version else {}
        jars = maven.resolve("kafka", props, progress=progress)
        self.classpath = maven.classpath(jars)
        self.version = maven.jar_version(jars, "kafka_2.13") or self.version
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        with self._progress(f"starting the Apache Kafka {self.version} cluster of "
                            f"{len(self.nodes)} nodes"):
            for n in self.nodes:
                self._phase = f"formatting node {n.node_id}'s storage"
                n.write_config(voters, self.extra)
                n.format(cluster_id)
            try:
                for n in self.nodes:
                    n.launch()
                self._phase = f"waiting up to {timeout:.0f} s for every node to register"
                self.wait_ready(timeout)
            except BaseException:
                self.close()
                raise
        log.info("Apache Kafka %s cluster of %d nodes on %s (files %s)", self.version,
                 len(self.nodes), self.bootstrap, self.workdir)
        return self

    def _progress(self, doing: str) -> contextlib.AbstractContextManager[object]:
        return heartbeat(self._say, lambda elapsed: (
            f"still {doing} ({elapsed:.0f} s; {self._phase}; logs under {self.workdir})"))

    def close(self) -> None:
        for n in self.nodes:
            if n.paused:
                n.signal(signal.SIGCONT)
            _stop(n.proc, grace=10.0)
            n.proc = None
        if self._own_dir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def node(self, node_id: int) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise ConnectorError(f"no node {node_id} in this cluster "
                             f"(nodes {[n.node_id for n in self.nodes]})")

    def logs(self) -> list[str]:
        return [n.log_path for n in self.nodes]

    def yield_cpu(self, nice: int) -> None:
        """Every node at niceness ``nice`` (0 restores; that needs root): the running ones,
        every thread of their process groups, and any node started later. A test that runs
        Spark beside the nodes lowers them, as brokers on machines of their own."""
        for n in self.nodes:
            if n.running() and n.pid is not None:
                os.setpriority(os.PRIO_PGRP, n.pid, nice)  # its own group: start_new_session
        self.nice = nice

    # -- faults ---------------------------------------------------------------------------------
    def kill(self, node_id: int, wait: bool = True) -> None:
        """SIGKILL: the node dies with whatever it had not written or answered. ``wait``:
        until the controller has fenced it (its leaderships moved, out of every ISR)."""
        n = self.node(node_id)
        if n.paused:
            n.signal(signal.SIGCONT)
            n.paused = False
        n.signal(signal.SIGKILL)
        if n.proc is not None:
            n.proc.wait(30)
        log.info("killed Kafka node %d", node_id)
        if wait:
            self.wait_fenced(node_id)

    def stop(self, node_id: int, grace: float = 60.0, wait: bool = True) -> None:
        """SIGTERM: a controlled shutdown (leaders move away first), as an upgrade does."""
        n = self.node(node_id)
        if n.paused:
            self.resume(node_id)
        _stop(n.proc, grace=grace)
        log.info("stopped Kafka node %d", node_id)
        if wait:
            self.wait_fenced(node_id)

    def wait_fenced(self, node_id: int, timeout: float = 60.0) -> None:
        """Until the other nodes no longer list ``node_id`` among the live brokers."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if node_id not in self.metadata(timeout=5).brokers:
                    return
            except Exception as e:  # noqa: BLE001 - asked again until the deadline
                log.debug("metadata: %s", e)
            if time.monotonic() > deadline:
                raise ConnectorError(f"Kafka node {node_id} still listed as live "
                                     f"{timeout:.0f}s after it stopped")
            time.sleep(0.3)

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped or killed node again (its data directory kept) and wait until it
        answers metadata itself and lists itself as a live broker."""
        n = self.node(node_id)
        if n.running():
            return
        n.launch()
        self._phase = f"waiting up to {timeout:.0f} s for it to register"
        with self._progress(f"restarting Kafka node {node_id}"):
            self._wait_registered([node_id], timeout, ask=n.address)
        log.info("restarted Kafka node %d", node_id)

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the node stops answering but keeps its connections open."""
        n = self.node(node_id)
        n.signal(signal.SIGSTOP)
        n.paused = True

    def resume(self, node_id: int) -> None:
        n = self.node(node_id)
        n.signal(signal.SIGCONT)
        n.paused = False

    def rolling_restart(self, *, settle: float = 0.0, between: Callable[[int], None] | None
                        = None, timeout: float = 180.0) -> None:
        """Each node in turn: controlled shutdown, start, wait until every replica is in
        sync again (``between(node_id)`` runs while the node is down)."""
        for n in self.nodes:
            self.stop(n.node_id)
            if between is not None:
                between(n.node_id)
            if settle:
                time.sleep(settle)
            self.restart(n.node_id, timeout)
            self.wait_in_sync(timeout=timeout)

    # -- what the cluster says --------------------------------------------------------------------
    def admin(self, bootstrap: str | None = None) -> Any:
        """An admin client of the cluster (librdkafka's logs kept out of the console)."""
        from confluent_kafka.admin import AdminClient

        from connectors.kafka.common import LIBRDKAFKA_LOG

        return AdminClient({"bootstrap.servers": bootstrap or self.bootstrap,
                            "socket.connection.setup.timeout.ms": 3000},
                           logger=LIBRDKAFKA_LOG)

    def _live_bootstrap(self) -> str:
        live = [n.address for n in self.nodes if n.running() and not n.paused and n.reachable]
        return ",".join(live) or self.bootstrap

    def metadata(self, timeout: float = 10.0) -> Any:
        """Metadata from a node that runs (a new client each time: no stale view)."""
        return self.admin(self._live_bootstrap()).list_topics(timeout=timeout)

    def leader(self, topic: str, partition: int = 0, timeout: float = 30.0) -> int:
        """The node id leading ``topic[partition]`` (waits while it has none)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                meta = self.metadata().topics.get(topic)
                if meta is not None and partition in meta.partitions:
                    leader = int(meta.partitions[partition].leader)
                    if leader >= 0:
                        return leader
            except Exception as e:  # noqa: BLE001 - asked again until the deadline
                log.debug("metadata: %s", e)
            if time.monotonic() > deadline:
                raise ConnectorError(f"{topic}[{partition}] has no leader after {timeout:.0f}s")
            time.sleep(0.2)

    def coordinator(self, transactional_id: str, timeout: float = 30.0) -> int:
        """The node id coordinating ``transactional_id`` (its __transaction_state leader)."""
        partitions = self._internal_partitions("__transaction_state")
        return self.leader("__transaction_state", _java_hash_partition(transactional_id,
                                                                       partitions), timeout)

    def group_coordinator(self, group: str, timeout: float = 30.0) -> int:
        partitions = self._internal_partitions("__consumer_offsets")
        return self.leader("__consumer_offsets", _java_hash_partition(group, partitions),
                           timeout)

    def _internal_partitions(self, topic: str) -> int:
        meta = self.metadata().topics.get(topic)
        if meta is None or meta.error is not None:
            raise ConnectorError(f"{topic} does not exist yet")
        return len(meta.partitions)

    def wait_ready(self, timeout: float = 180.0) -> None:
        self._wait_registered([n.node_id for n in self.nodes], timeout)

    def _wait_registered(self, node_ids: Iterable[int], timeout: float,
                         ask: str | None = None) -> None:
        want = set(node_ids)
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            for n in self.nodes:
                if n.node_id in want and n.proc is not None and n.proc.poll() is not None:
                    raise ConnectorError(f"Kafka node {n.node_id} exited with code "
                                         f"{n.proc.returncode} (log {n.log_path})")
            try:
                meta = (self.admin(ask).list_topics(timeout=5) if ask is not None
                        else self.metadata(timeout=5))
                brokers = set(meta.brokers)
                if want <= brokers:
                    return
                last = f"registered brokers {sorted(brokers)}"
            except Exception as e:  # noqa: BLE001 - asked again until the deadline
                last = e
            if time.monotonic() > deadline:
                raise ConnectorError(f"Kafka nodes {sorted(want)} not ready in {timeout:.0f}s: "
                                     f"{last} (logs {self.logs()})")
            time.sleep(0.3)

    def wait_in_sync(self, topics: Iterable[str] | None = None, timeout: float = 120.0) -> None:
        """Until every partition (of ``topics``, default all) has all replicas in its ISR
        and a leader."""
        deadline = time.monotonic() + timeout
        wanted = set(topics) if topics is not None else None
        lagging: list[str] = []
        while True:
            try:
                meta = self.metadata(timeout=5)
                lagging = [f"{t}[{p}]" for t, tm in meta.topics.items()
                           if wanted is None or t in wanted
                           for p, pm in tm.partitions.items()
                           if pm.leader < 0 or set(pm.isrs) != set(pm.replicas)]
                if wanted is not None and not wanted <= set(meta.topics):
                    lagging.append(f"missing {sorted(wanted - set(meta.topics))}")
                if not lagging:
                    return
            except Exception as e:  # noqa: BLE001 - asked again until the deadline
                lagging = [str(e)]
            if time.monotonic() > deadline:
                raise ConnectorError(f"replicas not in sync after {timeout:.0f}s: "
                                     f"{lagging[:10]}")
            time.sleep(0.5)

    def create_topic(self, topic: str, partitions: int = 1, replicas: int | None = None,
                     config: dict[str, str] | None = None, timeout: float = 60.0) -> None:
        """``topic`` with ``replicas`` (default: every node, at most 3), in sync."""
        from confluent_kafka.admin import NewTopic

        rf = replicas or min(3, len(self.nodes))
        admin = self.admin()  # held until the futures are done
        futures = admin.create_topics(
            [NewTopic(topic, partitions, rf, config=dict(config or {}))],
            operation_timeout=timeout)
        for f in futures.values():
            f.result(timeout)
        self.wait_in_sync([topic], timeout)


def _java_hash_partition(key: str, partitions: int) -> int:
    """Kafka's coordinator partition of a group or transactional id:
    ``Utils.abs(key.hashCode()) % partitions`` (Java hashes the UTF-16 code units)."""
    data, h = key.encode("utf-16-be"), 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % partitions
