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
DescribeGroups 3, ListOffsets 4, CreateTopics 4, DescribeConfigs 1; and OffsetFetch 7
(flexible, Kafka 2.5, for its ``require_stable``). A broker that serves none of them raises
:class:`UnsupportedBroker`; callers then use librdkafka.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from connectors.kafka.common import FAMILY
from connectors.kafka.wire import requests
from connectors.kafka.wire.cluster import GROUP, Cluster, check
from connectors.kafka.wire.protocol import (
    ADMIN_VERSIONS,
    API_NAMES,
    COORDINATOR_MOVED,
    CREATE_TOPICS,
    DESCRIBE_CONFIGS,
    DESCRIBE_GROUPS,
    ERRORS,
    LIST_OFFSETS,
    LOOKUP_TIMEOUT,
    METADATA,
    OFFSET_FETCH,
    RETRIABLE,
    STALE_LEADER,
    UnsupportedBroker,
    WireError,
)
from connectors.kafka.wire.requests import METADATA_AUTHORIZED, TopicMetadata

TOPIC_ALREADY_EXISTS, GROUP_AUTHORIZATION_FAILED, COORDINATOR_LOADING = 36, 30, 14
UNKNOWN_TOPIC = 3
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


def _require(cluster: Cluster, api: int, who: str) -> int:
    version = ADMIN_VERSIONS[api]
    if not cluster.serves(api, version):
        raise UnsupportedBroker(f"{who}: the cluster does not serve "
                                f"{API_NAMES[api]} v{version}")
    return version


# -- topics and groups ----------------------------------------------------------------------------
def describe_topics(cluster: Cluster, topics: Iterable[str], timeout: float,
                    who: str = FAMILY) -> dict[str, TopicMetadata]:
    """Each topic's metadata with the principal's authorized operations (Metadata v8 from any
    live broker). A topic that does not exist answers UNKNOWN_TOPIC_OR_PARTITION in its
    ``error``; denied answers TOPIC_AUTHORIZATION_FAILED there."""
    names = sorted(set(topics))

    def ask() -> dict[str, TopicMetadata]:
        if not cluster.serves(METADATA, METADATA_AUTHORIZED):
            raise UnsupportedBroker(f"{who}: the cluster does not serve Metadata v8 "
                                    "(Kafka 2.3), which tells authorized operations")
        return cluster.metadata(names, authorized=True).topics

    return cluster.retrying(ask, f"Metadata of {names}", timeout, who=who)


@dataclass(frozen=True)
class GroupDescription:
    error: int
    state: str
    authorized: int | None


def describe_groups(cluster: Cluster, groups: Iterable[str], timeout: float,
                    who: str = FAMILY) -> dict[str, GroupDescription]:
    """Each group's state and the principal's authorized operations on it (DescribeGroups v3
    to the group's coordinator, found with FindCoordinator). A group that does not exist is
    ``Dead`` (or GROUP_ID_NOT_FOUND on brokers with the new group coordinator); denied
    answers GROUP_AUTHORIZATION_FAILED in ``error``."""
    out: dict[str, GroupDescription] = {}
    for group in sorted(set(groups)):
        def ask(group: str = group) -> GroupDescription:
            version = _require(cluster, DESCRIBE_GROUPS, who)
            try:
                node = cluster.coordinator(group, GROUP)
            except WireError as e:
                if e.code == GROUP_AUTHORIZATION_FAILED:  # no DESCRIBE on the group
                    return GroupDescription(e.code, "", None)
                raise
            answers = requests.read_describe_groups(cluster.connection(node).call(
                DESCRIBE_GROUPS, requests.describe_groups(group), LOOKUP_TIMEOUT,
                version=version))
            if group not in answers:
                raise WireError(f"{who}: DescribeGroups did not answer for {group!r}", -1)
            found = GroupDescription(*answers[group])
            if found.error in COORDINATOR_MOVED or found.error == COORDINATOR_LOADING:
                cluster.forget(group, GROUP)
                check(found.error, f"{who}: DescribeGroups of {group!r}")
            return found

        out[group] = cluster.retrying(ask, f"DescribeGroups of {group!r}", timeout, who=who)
    return out


def create_topic(cluster: Cluster, topic: str, partitions: int, timeout: float,
                 who: str = FAMILY) -> bool:
    """Create ``topic`` with ``partitions`` partitions and the broker's default replication
    (CreateTopics v4, to the controller the metadata names: in KRaft any broker forwards it).
    True if this call created it; False if it existed (another creator at the same time is
    fine)."""
    body = requests.create_topics(topic, partitions,
                                  int(cluster.settings.request_timeout * 1000))

    def ask() -> bool:
        version = _require(cluster, CREATE_TOPICS, who)
        meta = cluster.metadata([topic])
        if meta.topics.get(topic, TopicMetadata(3)).error == 0:
            return False
        node = meta.controller if meta.controller in cluster.brokers else next(
            iter(cluster.brokers))
        answers = requests.read_create_topics(cluster.connection(node).call(
            CREATE_TOPICS, body, version=version))
        error, message = answers.get(topic, (0, None))
        if error == TOPIC_ALREADY_EXISTS:
            return False
        if error:
            raise WireError(f"{who}: CreateTopics of {topic!r}: {ERRORS.get(error, error)} "
                            f"({message})", error)
        return True

    return bool(cluster.retrying(ask, f"CreateTopics of {topic!r}", timeout, who=who))


def broker_config(cluster: Cluster, name: str, timeout: float,
                  who: str = FAMILY) -> str | None:
    """The value of broker config ``name`` as a live broker reports it (DescribeConfigs v1
    of that broker's resource, sent to it)."""

    def ask() -> str | None:
        version = _require(cluster, DESCRIBE_CONFIGS, who)
        if not cluster.brokers:
            cluster.metadata(())
        node = min(cluster.brokers)
        error, message, values = requests.read_describe_configs(cluster.connection(node).call(
            DESCRIBE_CONFIGS, requests.describe_broker_config(node, name), version=version))
        if error:
            raise WireError(f"{who}: DescribeConfigs of broker {node}: "
                            f"{ERRORS.get(error, error)} ({message})", error)
        return values.get(name)

    return cluster.retrying(ask, f"DescribeConfigs {name!r}", timeout, who=who)


# -- offsets --------------------------------------------------------------------------------------
def committed(cluster: Cluster, group: str, topic: str, partitions: list[int], timeout: float,
              who: str = FAMILY) -> dict[int, tuple[int, str | None]]:
    """Group ``group``'s committed offset and its metadata of each of ``partitions`` of
    ``topic`` (offset -1: none), stable (OffsetFetch v7 with ``require_stable`` to the group's
    coordinator: an offset committed inside a transaction that is still open is waited for,
    UNSTABLE_OFFSET_COMMIT asked again). The group need not exist, and is not joined."""
    body = requests.offset_fetch_v7(group, topic, partitions, require_stable=True)

    def ask() -> dict[int, tuple[int, str | None]]:
        version = _require(cluster, OFFSET_FETCH, who)
        node = cluster.coordinator(group, GROUP)
        error, got = requests.read_offset_fetch_v7(cluster.connection(node).call(
            OFFSET_FETCH, body, LOOKUP_TIMEOUT, version=version))
        for code in [error, *(e for _, _, e in got.values())]:
            if code in COORDINATOR_MOVED or code == COORDINATOR_LOADING:
                cluster.forget(group, GROUP)
            check(code, f"{who}: OffsetFetch of group {group!r}")
        return {p: (offset, metadata) for (t, p), (offset, metadata, _) in got.items()
                if t == topic}

    return cluster.retrying(ask, f"OffsetFetch of group {group!r}", timeout, who=who)



def list_offsets(cluster: Cluster, wanted: Mapping[tuple[str, int], int], isolation: int,
                 timeout: float, who: str = FAMILY,
                 gone_ok: bool = False) -> dict[tuple[str, int], int]:
    """ListOffsets v4 of each ``(topic, partition) -> timestamp`` (:data:`LATEST`,
    :data:`EARLIEST` or milliseconds: the first offset at or after it, -1 where none): one
    request per leader, all sent before any answer is read, the leaders the cluster keeps
    (no Metadata while they are fresh). A partition whose leader moved or is being elected
    is asked again after fresh metadata, until ``timeout``; answered ones are kept.
    ``gone_ok``: a partition that fresh metadata, asked after its ListOffsets failed, no
    longer has (its topic deleted, or fewer partitions) is left out of the answer instead
    (the caller knew it: it is gone, not late)."""
    todo = dict(wanted)
    out: dict[tuple[str, int], int] = {}
    failed_before: set[tuple[str, int]] = set()  # asked, failed: the next metadata is fresh

    def round_() -> None:
        version = _require(cluster, LIST_OFFSETS, who)
        topics = cluster.leaders({t for t, _ in todo})
        if gone_ok:
            for tp in sorted(failed_before & set(todo)):
                meta = topics[tp[0]]
                if meta.error == UNKNOWN_TOPIC or (not meta.error
                                                   and tp[1] not in meta.leaders):
                    todo.pop(tp)
            if not todo:
                return
        by_leader: dict[int, list[tuple[str, int]]] = {}
        pending: list[tuple[tuple[str, int], int]] = []
        for tp in sorted(todo):
            topic = topics[tp[0]]
            leader = topic.leaders.get(tp[1], -1)
            if topic.error and topic.error not in RETRIABLE:
                check(topic.error, f"{who}: Metadata of topic {tp[0]!r}")
            if leader < 0 or leader not in cluster.brokers:
                pending.append((tp, topic.error or 5))
            else:
                by_leader.setdefault(leader, []).append(tp)
        answers = cluster.parallel({
            node: (LIST_OFFSETS, requests.list_offsets(
                [(t, p, todo[(t, p)], topics[t].epochs.get(p, -1)) for t, p in tps],
                isolation), version)
            for node, tps in by_leader.items()})
        for node, tps in by_leader.items():
            answer = answers[node]
            if isinstance(answer, WireError):
                if answer.code not in RETRIABLE:
                    raise answer
                pending += [(tp, answer.code) for tp in tps]
                continue
            got = requests.read_list_offsets(answer)
            for tp in tps:
                error, offset = got.get(tp, (5, -1))
                if error == 0:
                    out[tp] = offset
                    todo.pop(tp, None)
                elif error in RETRIABLE:
                    pending.append((tp, error))
                else:
                    check(error, f"{who}: ListOffsets of {tp[0]}[{tp[1]}]")
        if pending:
            failed_before.update(tp for tp, _ in pending)
            for name in {t for (t, _), _ in pending}:
                cluster.stale(name)
            code = pending[0][1]
            names = [f"{t}[{p}]" for (t, p), _ in pending[:5]]
            raise WireError(f"{who}: ListOffsets gave no offset for {names}"
                            + (" (the leader is moving)" if code in STALE_LEADER else ""),
                            code)

    names = [f"{t}[{p}]" for t, p in sorted(wanted)[:5]]
    cluster.retrying(round_, f"ListOffsets of {names}{' ...' if len(wanted) > 5 else ''}",
                     timeout, who=who)
    return out
