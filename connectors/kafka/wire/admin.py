"""The admin look-ups the connectors make in a query's processes, over the wire: topics with
the principal's authorized operations, groups with theirs, a topic created, a broker's
config, offsets by time or end.

Why not librdkafka's admin client: its requests that wait for the controller or a group
coordinator share an enqueue-once object between a timeout timer and the broker-state
watch, and under node kills it aborted the Python process
(``rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0' failed``), taking a
query's driver or worker with it; and its ListOffsets keeps answering LEADER_NOT_AVAILABLE
from a cached leaderless partition until the cache expires. Here each request goes to a
broker that can answer it now, a stale leader or coordinator is looked up again, and a
failure is an exception with a deadline (docs/design.md, "Kafka nodes that move or go
away").

Versions without tagged fields (Kafka 2.1-2.4 and later, 4.x included): Metadata 8,
DescribeGroups 3, ListOffsets 4, CreateTopics 4, DescribeConfigs 1. A broker that serves
none of them raises :class:`UnsupportedBroker`; callers then use librdkafka.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from connectors.kafka.wire.cluster import (
    GROUP,
    METADATA_AUTHORIZED,
    STALE_LEADER,
    Cluster,
    TopicMetadata,
    check,
)
from connectors.kafka.wire.protocol import (
    COORDINATOR_MOVED,
    ERRORS,
    LOOKUP_TIMEOUT,
    METADATA,
    RETRIABLE,
    UnsupportedBroker,
    WireError,
    string,
)

LIST_OFFSETS, DESCRIBE_GROUPS, CREATE_TOPICS, DESCRIBE_CONFIGS = 2, 15, 19, 32
ADMIN_VERSIONS = {LIST_OFFSETS: 4, DESCRIBE_GROUPS: 3, CREATE_TOPICS: 4, DESCRIBE_CONFIGS: 1}
TOPIC_ALREADY_EXISTS, NOT_CONTROLLER, GROUP_AUTHORIZATION_FAILED = 36, 41, 30
#: ListOffsets' special timestamps.
LATEST, EARLIEST = -1, -2
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
#: Kafka's ACL operation codes (org.apache.kafka.common.acl.AclOperation), the bits of an
#: authorized-operations field (KIP-430).
ACL_OPERATIONS = {3: "READ", 4: "WRITE", 5: "CREATE", 6: "DELETE", 7: "ALTER", 8: "DESCRIBE",
                  9: "CLUSTER_ACTION", 10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS",
                  12: "IDEMPOTENT_WRITE", 13: "CREATE_TOKENS", 14: "DESCRIBE_TOKENS"}


def operations(bits: int | None) -> set[str]:
    """The names of the operations an authorized-operations field grants."""
    if bits is None:
        return set()
    return {name for code, name in ACL_OPERATIONS.items() if bits & (1 << code)}


def _require(cluster: Cluster, api: int) -> int:
    version = ADMIN_VERSIONS.get(api, 0)
    if not cluster.serves(api, version):
        raise UnsupportedBroker(f"{cluster.who}: the cluster does not serve "
                                f"{_NAMES[api]} v{version}")
    return version


_NAMES = {LIST_OFFSETS: "ListOffsets", DESCRIBE_GROUPS: "DescribeGroups",
          CREATE_TOPICS: "CreateTopics", DESCRIBE_CONFIGS: "DescribeConfigs"}


# -- topics and groups ----------------------------------------------------------------------------
def describe_topics(cluster: Cluster, topics: Iterable[str],
                    timeout: float | None = None) -> dict[str, TopicMetadata]:
    """Each topic's metadata with the principal's authorized operations (Metadata v8 from any
    live broker). A topic that does not exist answers UNKNOWN_TOPIC_OR_PARTITION in its
    ``error``; denied answers TOPIC_AUTHORIZATION_FAILED there."""
    names = sorted(set(topics))

    def ask() -> dict[str, TopicMetadata]:
        if not cluster.serves(METADATA, METADATA_AUTHORIZED):
            raise UnsupportedBroker(f"{cluster.who}: the cluster does not serve Metadata v8 "
                                    "(Kafka 2.3), which tells authorized operations")
        return cluster.metadata(names, authorized=True).topics

    return cluster.retrying(ask, f"Metadata of {names}", timeout)


@dataclass(frozen=True)
class GroupDescription:
    error: int
    state: str
    authorized: int | None


def describe_groups(cluster: Cluster, groups: Iterable[str],
                    timeout: float | None = None) -> dict[str, GroupDescription]:
    """Each group's state and the principal's authorized operations on it (DescribeGroups v3
    to the group's coordinator, found with FindCoordinator). A group that does not exist is
    ``Dead`` (or GROUP_ID_NOT_FOUND on brokers with the new group coordinator); denied
    answers GROUP_AUTHORIZATION_FAILED in ``error``."""
    out: dict[str, GroupDescription] = {}
    for group in sorted(set(groups)):
        def ask(group: str = group) -> GroupDescription:
            version = _require(cluster, DESCRIBE_GROUPS)
            try:
                node = cluster.coordinator(group, GROUP)
            except WireError as e:
                if e.code == GROUP_AUTHORIZATION_FAILED:  # no DESCRIBE on the group
                    return GroupDescription(e.code, "", None)
                raise
            r = cluster.connection(node).call(
                DESCRIBE_GROUPS, struct.pack(">i", 1) + string(group) + b"\x01",
                LOOKUP_TIMEOUT, version=version)
            r.take(">i")  # throttle
            answers = []
            for _ in range(r.take(">i")):
                error = r.take(">h")
                name = r.string()
                state = r.string() or ""
                r.string()  # protocol type
                r.string()  # protocol data
                for _ in range(r.take(">i")):  # members
                    r.string(), r.string(), r.string()
                    for _ in range(2):  # metadata, assignment (bytes)
                        size = r.take(">i")
                        r.at += max(size, 0)
                ops = r.take(">i")
                answers.append((name, GroupDescription(
                    error, state, None if ops == -2147483648 else ops)))
            found = dict(answers).get(group)
            if found is None:
                raise WireError(f"{cluster.who}: DescribeGroups did not answer for {group!r}",
                                -1)
            if found.error in COORDINATOR_MOVED or found.error == 14:
                cluster.forget(group, GROUP)
                check(found.error, f"{cluster.who}: DescribeGroups of {group!r}")
            return found

        out[group] = cluster.retrying(ask, f"DescribeGroups of {group!r}", timeout)
    return out


def create_topic(cluster: Cluster, topic: str, partitions: int,
                 timeout: float | None = None) -> bool:
    """Create ``topic`` with ``partitions`` partitions and the broker's default replication
    (CreateTopics v4, to the controller the metadata names: in KRaft any broker forwards it).
    True if this call created it; False if it existed (another creator at the same time is
    fine)."""
    body = (struct.pack(">i", 1) + string(topic) + struct.pack(">ih", partitions, -1)
            + struct.pack(">ii", 0, 0))  # no assignments, no configs
    request_ms = int(cluster.settings.request_timeout * 1000)
    body += struct.pack(">ib", request_ms, 0)

    def ask() -> bool:
        version = _require(cluster, CREATE_TOPICS)
        meta = cluster.metadata([topic])
        if meta.topics.get(topic, TopicMetadata(3)).error == 0:
            return False
        node = meta.controller if meta.controller in cluster.brokers else next(
            iter(cluster.brokers))
        r = cluster.connection(node).call(CREATE_TOPICS, body, version=version)
        r.take(">i")
        for _ in range(r.take(">i")):
            name, error, message = r.string(), r.take(">h"), r.string()
            if name != topic:
                continue
            if error == TOPIC_ALREADY_EXISTS:
                return False
            if error:
                raise WireError(f"{cluster.who}: CreateTopics of {topic!r}: "
                                f"{ERRORS.get(error, error)} ({message})", error)
        return True

    return bool(cluster.retrying(ask, f"CreateTopics of {topic!r}", timeout))


def broker_config(cluster: Cluster, name: str, timeout: float | None = None) -> str | None:
    """The value of broker config ``name`` as a live broker reports it (DescribeConfigs v1
    of that broker's resource, sent to it)."""

    def ask() -> str | None:
        version = _require(cluster, DESCRIBE_CONFIGS)
        if not cluster.brokers:
            cluster.metadata(())
        node = min(cluster.brokers)
        body = (struct.pack(">ib", 1, 4) + string(str(node)) + struct.pack(">i", 1)
                + string(name) + b"\x00")
        r = cluster.connection(node).call(DESCRIBE_CONFIGS, body, version=version)
        r.take(">i")
        value = None
        for _ in range(r.take(">i")):
            error, message = r.take(">h"), r.string()
            r.take(">b"), r.string()
            if error:
                raise WireError(f"{cluster.who}: DescribeConfigs of broker {node}: "
                                f"{ERRORS.get(error, error)} ({message})", error)
            for _ in range(r.take(">i")):
                key, val = r.string(), r.string()
                r.take(">bbb")  # read_only, source, is_sensitive
                for _ in range(r.take(">i")):  # synonyms
                    r.string(), r.string(), r.take(">b")
                if key == name:
                    value = val
        return value

    return cluster.retrying(ask, f"DescribeConfigs {name!r}", timeout)


# -- offsets --------------------------------------------------------------------------------------
def list_offsets(cluster: Cluster, wanted: Mapping[tuple[str, int], int], isolation: int,
                 timeout: float | None = None) -> dict[tuple[str, int], int]:
    """ListOffsets v4 of each ``(topic, partition) -> timestamp`` (:data:`LATEST`,
    :data:`EARLIEST` or milliseconds: the first offset at or after it, -1 where none), each
    partition asked of its leader. A partition whose leader moved or is being elected is
    asked again after fresh metadata, until ``timeout`` (default the cluster's
    ``retry_timeout``); answered ones are kept."""
    version_box: list[int] = []
    todo = dict(wanted)
    out: dict[tuple[str, int], int] = {}

    def round_() -> None:
        if not version_box:
            version_box.append(_require(cluster, LIST_OFFSETS))
        meta = cluster.metadata(sorted({t for t, _ in todo}))
        by_leader: dict[int, list[tuple[str, int]]] = {}
        pending: list[tuple[tuple[str, int], int]] = []
        for tp in sorted(todo):
            topic = meta.topics.get(tp[0])
            leader = -1 if topic is None else topic.leaders.get(tp[1], -1)
            if topic is not None and topic.error and topic.error not in RETRIABLE:
                check(topic.error, f"{cluster.who}: Metadata of topic {tp[0]!r}")
            if leader < 0 or leader not in cluster.brokers:
                pending.append((tp, 5 if topic is None or not topic.error else topic.error))
            else:
                by_leader.setdefault(leader, []).append(tp)
        for node, tps in by_leader.items():
            try:
                answers = _ask_leader(cluster, node, tps, todo, isolation, version_box[0])
            except WireError as e:
                if e.code not in RETRIABLE:
                    raise
                pending += [(tp, e.code) for tp in tps]
                continue
            for tp, (error, offset) in answers.items():
                if error == 0:
                    out[tp] = offset
                    todo.pop(tp, None)
                elif error in RETRIABLE:
                    pending.append((tp, error))
                else:
                    check(error, f"{cluster.who}: ListOffsets of {tp[0]}[{tp[1]}]")
        if pending:
            code = pending[0][1]
            names = [f"{t}[{p}]" for (t, p), _ in pending[:5]]
            raise WireError(f"{cluster.who}: ListOffsets gave no offset for {names}"
                            + (" (the leader is moving)" if code in STALE_LEADER else ""),
                            code)

    names = [f"{t}[{p}]" for t, p in sorted(wanted)[:5]]
    cluster.retrying(round_, f"ListOffsets of {names}{' ...' if len(wanted) > 5 else ''}",
                     timeout)
    return out


def _ask_leader(cluster: Cluster, node: int, tps: list[tuple[str, int]],
                wanted: Mapping[tuple[str, int], int], isolation: int,
                version: int) -> dict[tuple[str, int], tuple[int, int]]:
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    body = struct.pack(">ib", -1, isolation) + struct.pack(">i", len(by_topic))
    for topic, parts in by_topic.items():
        body += string(topic) + struct.pack(">i", len(parts))
        body += b"".join(struct.pack(">iiq", p, -1, wanted[(topic, p)]) for p in parts)
    # LOOKUP_TIMEOUT, not the socket's 60 s: a leader cut off behind a listener that still
    # accepts would otherwise spend the whole retry budget on one request, where fresh
    # metadata names the new leader about 10 s after the cut.
    r = cluster.connection(node).call(LIST_OFFSETS, body, LOOKUP_TIMEOUT, version=version)
    r.take(">i")  # throttle
    out = {}
    for _ in range(r.take(">i")):
        topic = r.string() or ""
        for _ in range(r.take(">i")):
            index, error, _ts, offset, _epoch = r.take(">ihqqi")
            out[(topic, index)] = (error, offset)
    return out
