"""The process's cluster objects (connectors/kafka/clients.py) and what the wire client's
``Cluster`` keeps between calls (connectors/kafka/wire/cluster.py): one object per cluster
and connection settings, the one place that chooses the wire client or librdkafka, kept
leaders asked again only when stale or old. Against real brokers: the source and sink
tiers, and tests/integration/cluster_kafka (leaders that move under node kills)."""

from __future__ import annotations

import pytest

from connectors.kafka import clients
from connectors.kafka.wire.cluster import Cached, Cluster
from connectors.kafka.wire.requests import Metadata, TopicMetadata
from connectors.kafka.wire.settings import Settings


def test_one_cluster_object_per_cluster_and_connection_settings() -> None:
    base = {"bootstrap.servers": "b:9092"}
    with clients.lease({**base, "acks": "all", "linger.ms": "5"}) as a, \
            clients.lease({**base, "group.id": "g", "isolation.level": "read_committed"}) as b:
        assert a is b  # a producer's and a consumer's settings: the same connections
    with clients.lease(base) as a, clients.lease({**base, "security.protocol": "SSL"}) as c:
        assert a is not c
    assert clients.connection_conf({**base, "sasl.password": "p", "fetch.min.bytes": "1"}) == {
        **base, "sasl.password": "p"}


@pytest.mark.c_extensions
def test_the_choice_of_client_is_made_per_cluster() -> None:
    with clients.lease({"bootstrap.servers": "b:9092"}) as plain:
        assert plain.lookups() is not None and plain.wire_refusal is None
    with clients.lease({"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
                        "sasl.mechanism": "GSSAPI"}) as kerberos:
        assert kerberos.lookups() is None and "GSSAPI" in str(kerberos.wire_refusal)
    assert "compression.type=zstd" in str(clients.produce_refusal(
        {"bootstrap.servers": "b:9092", "compression.type": "zstd"}))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _cluster(clock: Clock) -> tuple[Cluster, list[list[str] | None]]:
    cluster = Cluster(Settings.of({"bootstrap.servers": "127.0.0.1:1"}), clock=clock)
    asked: list[list[str] | None] = []

    def metadata(topics: list[str] | None, authorized: bool = False,
                 auto_create: bool = False) -> Metadata:
        asked.append(None if topics is None else list(topics))
        names = ["a", "b"] if topics is None else list(topics)
        answer = Metadata({1: ("h", 1)}, 1, {t: TopicMetadata(0, {0: 1}, {0: 7}) for t in names})
        for name, meta in answer.topics.items():  # what Cluster.metadata keeps
            cluster.topics[name] = Cached(meta, clock())
        return answer

    cluster.metadata = metadata  # type: ignore[method-assign]
    return cluster, asked


def test_leaders_are_kept_until_stale_or_old() -> None:
    clock = Clock()
    cluster, asked = _cluster(clock)
    assert cluster.leaders(["a"], max_age=10)["a"].leaders == {0: 1}
    cluster.leaders(["a"], max_age=10)
    assert asked == [["a"]]  # the second call asked nothing
    cluster.stale("a")  # an answer said a leader moved
    cluster.leaders(["a"], max_age=10)
    clock.now = 11  # older than max_age
    cluster.leaders(["a"], max_age=10)
    assert asked == [["a"], ["a"], ["a"]]


def test_every_topic_is_listed_again_only_when_old() -> None:
    clock = Clock()
    cluster, asked = _cluster(clock)
    cluster.listed = None
    assert sorted(cluster.leaders(None, max_age=10)) == ["a", "b"]
    cluster.listed = clock.now
    cluster.leaders(None, max_age=10)
    assert asked == [None]


@pytest.mark.parametrize("conf", [{"kafka.topic.metadata.refresh.interval.ms": "2500"}, {}])
def test_the_source_finds_new_partitions_within_its_discovery_interval(conf) -> None:
    from connectors.kafka.source.clusters import DISCOVERY_INTERVAL, discovery_interval
    from connectors.kafka.source.options import KafkaSourceOptions

    opts = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1",
                                            "subscribe": "t", **conf})
    assert discovery_interval(opts.clusters[0]) == (2.5 if conf else DISCOVERY_INTERVAL)
