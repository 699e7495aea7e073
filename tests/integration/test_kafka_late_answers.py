"""Late and lost answers between the Kafka sink and a real broker (issue 34).

One Apache Kafka broker advertises a :class:`~tests.kafka_proxy.KafkaProxy` in front of it,
so every connection of every client goes through the proxy. The proxy holds one large
Produce request past the client's ``request.timeout.ms`` and then delivers it (a broker in a
GC pause, a slow disk, an ``acks=all`` wait on a slow follower), or drops the answer of one,
or resets a connection in the middle of one. Each task runs as Spark runs it: a failed
attempt is retried with the next attempt number, up to 4 attempts (``spark.task.maxFailures``).

The output must be exact (every value once) in both delivery modes and on both produce paths,
read to the end of every partition by a ``read_committed`` reader.
"""

from __future__ import annotations

import logging
import uuid

import pyarrow as pa
import pytest

from connectors.core import failpoints
from connectors.core.errors import FailpointError
from connectors.core.sink import TaskInfo
from connectors.demo.services.kafka import ApacheKafka, create_topic, free_port
from connectors.kafka.sink import KafkaSink
from tests.helpers import assert_topic_exact, run_task_as_spark
from tests.kafka_proxy import PRODUCE, Fault, KafkaProxy

ROWS = 100_000

MODES = [
    pytest.param(False, False, id="recovery-keys-librdkafka"),
    pytest.param(False, True, id="recovery-keys-wire"),
    pytest.param(True, False, id="transactional-librdkafka"),
    pytest.param(True, True, id="transactional-wire"),
]
#: The default path (the wire) of each mode.
WIRE_MODES = [m for m in MODES if m.values[1]]


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory):
    """A broker whose advertised port is a Kafka-aware proxy's."""
    port = free_port()
    broker = ApacheKafka(workdir=str(tmp_path_factory.mktemp("kafka-proxied")),
                         advertised_port=port).start()
    proxy = KafkaProxy(broker.port, listen_port=port).start()
    try:
        yield broker, proxy
    finally:
        proxy.stop()
        broker.stop()


@pytest.fixture
def proxy(proxied):
    proxied[1].clear()
    yield proxied[1]
    proxied[1].clear()


def _table(n: int = ROWS) -> pa.Table:
    return pa.table({"key": [f"k{i % 113}".encode() for i in range(n)],
                     "value": [f"value-{i:08d}".encode() for i in range(n)]})


def _sink(bootstrap: str, tmp_path, topic: str, transactional: bool, wire: bool,
          **kafka: str) -> KafkaSink:
    sink_id = f"late-{uuid.uuid4().hex[:8]}"
    return KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=bootstrap,
                     topic=topic, transactional=transactional, wire_produce=wire,
                     kafka_options=dict(kafka))


def _assert_exact(bootstrap: str, topic: str, n: int = ROWS) -> None:
    assert_topic_exact(bootstrap, topic, {"value": n})


@pytest.mark.parametrize("transactional, wire", MODES)
def test_a_produce_held_past_the_request_timeout_is_not_written_twice(
        proxied, proxy, tmp_path, transactional, wire):
    """The first large Produce of the task reaches the broker 12 s late, past the client's
    ``request.timeout.ms=5000``; the task (and its retries) must still leave each value once."""
    broker, _ = proxied
    topic = f"late-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 4)
    sink = _sink(broker.bootstrap, tmp_path, topic, transactional, wire,
                 **{"request.timeout.ms": "5000"})
    fault = proxy.add(Fault("hold", PRODUCE, min_size=50_000, seconds=12))
    run_task_as_spark(sink, 0, _table())
    assert fault.fired, "no Produce request was held"
    assert fault.settled(60), "the held request never reached the broker"
    _assert_exact(broker.bootstrap, topic)


@pytest.mark.parametrize("transactional, wire", MODES)
def test_a_lost_produce_answer_is_not_written_twice(proxied, proxy, tmp_path,
                                                    transactional, wire):
    """The broker appends a Produce, its answer never comes back: the client waits
    ``socket.timeout.ms`` (10 s here, 60 s by default) and sends again."""
    broker, _ = proxied
    topic = f"lost-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 4)
    sink = _sink(broker.bootstrap, tmp_path, topic, transactional, wire,
                 **{"request.timeout.ms": "5000", "socket.timeout.ms": "10000"})
    fault = proxy.add(Fault("drop_answer", PRODUCE, min_size=50_000))
    run_task_as_spark(sink, 0, _table())
    assert fault.fired, "no Produce answer was dropped"
    _assert_exact(broker.bootstrap, topic)


@pytest.mark.parametrize("transactional, wire", WIRE_MODES)
def test_a_connection_reset_mid_produce_is_not_written_twice(proxied, proxy, tmp_path,
                                                             transactional, wire):
    """Half a Produce request reaches the broker, then the connection is reset (on the wire:
    librdkafka's own reconnect is its business, and the cluster tier's node kills reset its
    connections too)."""
    broker, _ = proxied
    topic = f"reset-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 4)
    sink = _sink(broker.bootstrap, tmp_path, topic, transactional, wire)
    fault = proxy.add(Fault("reset", PRODUCE, min_size=50_000))
    run_task_as_spark(sink, 0, _table())
    assert fault.fired, "no Produce request was cut"
    _assert_exact(broker.bootstrap, topic)


@pytest.mark.parametrize("wire", [False, True], ids=["librdkafka", "wire"])
def test_default_settings_a_produce_held_45s_is_not_written_twice(proxied, proxy, tmp_path,
                                                                  wire):
    """The issue's case with every setting at its default (request.timeout.ms 30 s): the
    recovery-key mode, the request held 45 s."""
    broker, _ = proxied
    topic = f"late45-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 4)
    sink = _sink(broker.bootstrap, tmp_path, topic, False, wire)
    fault = proxy.add(Fault("hold", PRODUCE, min_size=50_000, seconds=45))
    run_task_as_spark(sink, 0, _table())
    assert fault.fired
    assert fault.settled(90), "the held request never reached the broker"
    _assert_exact(broker.bootstrap, topic)


@pytest.mark.parametrize("wire", [False, True], ids=["librdkafka", "wire"])
def test_an_attempt_failing_while_a_produce_is_held_settles_it_before_the_retry_scans(
        proxied, proxy, tmp_path, monkeypatch, wire):
    """Recovery keys: the first attempt fails (the ``mid_produce`` failpoint) while one of its
    Produce requests is held; the retry scans for what is there. The held request must be
    settled before the attempt's failure reaches Spark, or it would land after the scan."""
    broker, _ = proxied
    topic = f"latescan-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 4)
    sink = _sink(broker.bootstrap, tmp_path, topic, False, wire,
                 **{"request.timeout.ms": "5000"})
    table = _table()
    fault = proxy.add(Fault("hold", PRODUCE, min_size=50_000, seconds=10))
    monkeypatch.setenv("CONNECTORS_FAILPOINTS", "kafka_sink.mid_produce@0#60000!raise")
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            sink.stage(TaskInfo(0, 0, 0), iter(table.to_batches(max_chunksize=10_000)))
    finally:
        monkeypatch.delenv("CONNECTORS_FAILPOINTS")
        failpoints.reload()
    report = sink.stage(TaskInfo(0, 0, 1), iter(table.to_batches(max_chunksize=10_000)))
    sink.commit(0, [report])
    assert fault.fired and fault.settled(60), "no held request reached the broker"
    _assert_exact(broker.bootstrap, topic)


#: The broker versions the docs claim besides the pom's (4.1.2): the oldest KRaft line the
#: sink supports, the last 3.x, the newest 4.x.
OTHER_VERSIONS = ["3.5.2", "3.9.1", "4.4.0"]


@pytest.fixture(scope="module", params=OTHER_VERSIONS)
def versioned(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A proxied broker of each other version, one at a time."""
    port = free_port()
    broker = ApacheKafka(workdir=str(tmp_path_factory.mktemp(f"kafka-{request.param}")),
                         advertised_port=port, version=request.param).start()
    proxy = KafkaProxy(broker.port, listen_port=port).start()
    try:
        yield request.param, broker, proxy
    finally:
        proxy.stop()
        broker.stop()


@pytest.mark.parametrize("transactional, wire", WIRE_MODES)
def test_every_broker_version_keeps_a_late_produce_once(versioned, tmp_path, caplog,
                                                        transactional, wire):
    """Each mode on its default path (the wire) against Apache Kafka 3.5.2, 3.9.1 and 4.4.0,
    through a Produce held past the client's timeout. Transactions on the wire need a broker
    that verifies a transaction's partitions (3.6+): on 3.5.2 the sink says so and uses
    librdkafka, so that case covers librdkafka's path on the old broker."""
    version, broker, proxy = versioned
    proxy.clear()
    caplog.set_level(logging.INFO, logger="connectors.kafka.sink.wire")
    topic = f"v{version.replace('.', '')}-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 4)
    sink = _sink(broker.bootstrap, tmp_path, topic, transactional, wire,
                 **{"request.timeout.ms": "5000"})
    fault = proxy.add(Fault("hold", PRODUCE, min_size=30_000, seconds=8))
    run_task_as_spark(sink, 0, _table(40_000))
    assert fault.fired and fault.settled(60)
    _assert_exact(broker.bootstrap, topic, 40_000)
    fell_back = "older than Kafka 3.6" in caplog.text
    assert fell_back == (transactional and wire and version < "3.6"), caplog.text[-2000:]
