"""A late Produce on every other broker version the docs claim (issue 34).

The late and lost answers themselves (a Produce held past ``request.timeout.ms``, an answer
dropped, a connection reset, each mode on each path) run on the replicated cluster behind a
proxy per node: tests/integration/cluster_kafka/test_late_answers.py. What is left here is
what the cluster tier does not do: one broker of each other Apache Kafka version (3.5.2,
3.9.1, 4.4.0), advertising a :class:`~tests.kafka_proxy.KafkaProxy` in front of it, through a
Produce held past the client's timeout. Each task runs as Spark runs it (a failed attempt is
retried, up to 4 attempts); the output must be exact, read ``read_committed`` to the end of
every partition.
"""

from __future__ import annotations

import logging
import uuid

import pyarrow as pa
import pytest

from connectors.demo.services.kafka import ApacheKafka, create_topic, free_port
from connectors.kafka.sink import KafkaSink
from tests.helpers import assert_topic_exact, run_task_as_spark
from tests.kafka_proxy import PRODUCE, Fault, KafkaProxy

#: The default path (the wire) of each mode.
WIRE_MODES = [
    pytest.param(False, True, id="recovery-keys-wire"),
    pytest.param(True, True, id="transactional-wire"),
]


def _table(n: int) -> pa.Table:
    return pa.table({"key": [f"k{i % 113}".encode() for i in range(n)],
                     "value": [f"value-{i:08d}".encode() for i in range(n)]})


def _sink(bootstrap: str, tmp_path, topic: str, transactional: bool, wire: bool,
          **kafka: str) -> KafkaSink:
    sink_id = f"late-{uuid.uuid4().hex[:8]}"
    return KafkaSink(sink_id, str(tmp_path / sink_id), bootstrap_servers=bootstrap,
                     topic=topic, transactional=transactional, wire_produce=wire,
                     kafka_options=dict(kafka))


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
    librdkafka, so that case covers librdkafka's path on the old broker. 3.9.1 has no
    transactions v2 (KIP-890 part 2), 4.4.0 has it finalized: each takes its own."""
    version, broker, proxy = versioned
    proxy.clear()
    caplog.set_level(logging.INFO, logger="connectors.kafka")
    topic = f"v{version.replace('.', '')}-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 4)
    sink = _sink(broker.bootstrap, tmp_path, topic, transactional, wire,
                 **{"request.timeout.ms": "5000"})
    fault = proxy.add(Fault("hold", PRODUCE, min_size=30_000, seconds=8))
    run_task_as_spark(sink, 0, _table(40_000))
    assert fault.fired and fault.settled(60)
    assert_topic_exact(broker.bootstrap, topic, {"value": 40_000})
    fell_back = "older than Kafka 3.6" in caplog.text
    assert fell_back == (transactional and wire and version < "3.6"), caplog.text[-2000:]
    if transactional and not fell_back:  # KIP-890 part 2 where the cluster finalized it
        spoken = "transactions v2 on the wire" if version >= "4" else "transactions v1"
        assert spoken in caplog.text, caplog.text[-2000:]
