"""Every request the wire client sends and every answer it reads, each version side by side:
the bodies as bytes, the answers as plain values. No connection, no state: the callers
(:mod:`~connectors.kafka.wire.cluster`, :mod:`~connectors.kafka.wire.admin`,
:mod:`~connectors.kafka.wire.producer`, :mod:`~connectors.kafka.wire.sender`) decide what
to send and what an answer means.

Two families of versions:

- **Without tagged fields** (Kafka 2.1 and later, 4.x included): ApiVersions 0, Metadata 7
  and 8, FindCoordinator 1, InitProducerId 1, AddPartitionsToTxn 2, AddOffsetsToTxn 2,
  TxnOffsetCommit 2, EndTxn 2, Produce 7, ListOffsets 4, DescribeGroups 3, CreateTopics 4,
  DescribeConfigs 1.
- **Flexible** (KIP-482: compact strings and arrays, tagged fields), for transactions v2
  (KIP-890 part 2, Kafka 4.0 and later): ApiVersions 3 (the cluster's finalized features),
  Produce 12, TxnOffsetCommit 5, EndTxn 5. Under transactions v2 a partition joins the
  transaction with its first Produce (the leader asks the coordinator itself) and the fact
  group with its TxnOffsetCommit, so AddPartitionsToTxn and AddOffsetsToTxn are never sent;
  every EndTxn bumps the producer epoch and writes its markers with the new one, so a request
  of the ended transaction that reaches a broker late is refused as fenced instead of joining
  the next one (docs/design.md, "The wire client's failures", step 7).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from connectors.kafka.wire.protocol import Reader, compact, string, uvarint

#: The client software name ApiVersions v3 sends (the distribution's).
CLIENT = "pyspark-exactly-once"
#: An empty tagged-field section.
NO_TAGS = b"\x00"
#: The cluster-wide feature and level that turn transactions v2 on.
TRANSACTION_VERSION, TV2_LEVEL = "transaction.version", 2
#: Metadata v8 (Kafka 2.3) answers with each topic's authorized operations (KIP-430); v7
#: where the broker is older.
METADATA_AUTHORIZED = 8
#: "Not told" in an authorized-operations field.
NO_OPERATIONS = -2147483648

# -- ApiVersions ---------------------------------------------------------------------------------
def api_versions_v0() -> bytes:
    return b""


def read_api_versions_v0(r: Reader) -> tuple[int, dict[int, tuple[int, int]]]:
    """``(error code, API key -> (lowest, highest) version)``."""
    error = r.take(">h")
    return error, {k: (lo, hi) for k, lo, hi in r.array(lambda: r.take(">hhh"))}


def api_versions_v3() -> bytes:
    """ApiVersions v3: the client's name and version (a broker checks they are
    ``[a-zA-Z0-9](?:[a-zA-Z0-9\\-.]*[a-zA-Z0-9])?``)."""
    try:
        ours = version(CLIENT)
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        ours = "0"
    cleaned = "".join(c if c.isalnum() or c in "-." else "-" for c in ours).strip("-.") or "0"
    return compact(CLIENT) + compact(cleaned) + NO_TAGS


def read_api_versions_v3(r: Reader) -> tuple[int, dict[str, int]]:
    """``(error code, finalized feature -> its max level)``."""
    error = r.take(">h")
    for _ in range(r.compact_count()):
        r.take(">hhh")
        r.tags()
    r.take(">i")  # throttle
    features: dict[str, int] = {}
    raw = r.tags().get(2)  # FinalizedFeatures
    if raw is not None:
        f = Reader(raw)
        for _ in range(f.compact_count()):
            name = f.compact_string() or ""
            features[name], _ = f.take(">hh")  # max level, min level
            f.tags()
    return error, features


# -- Metadata -----------------------------------------------------------------------------------
@dataclass
class TopicMetadata:
    """One topic of a Metadata answer: its error code, each partition's leader (-1 where the
    partition has an error or no leader), leader epoch and error, and the principal's
    authorized operations (a bit per ACL operation code; None where not asked or not told)."""

    error: int
    leaders: dict[int, int] = field(default_factory=dict)
    epochs: dict[int, int] = field(default_factory=dict)
    errors: dict[int, int] = field(default_factory=dict)
    authorized: int | None = None


@dataclass
class Metadata:
    brokers: dict[int, tuple[str, int]]
    controller: int
    topics: dict[str, TopicMetadata]


def metadata(topics: Iterable[str] | None, version: int, authorized: bool = False,
             auto_create: bool = False) -> bytes:
    """Metadata v7 or v8 of ``topics`` (None: all); a topic is created only with
    ``auto_create`` (where the broker allows it)."""
    names = None if topics is None else list(topics)
    body = struct.pack(">i", -1) if names is None else (
        struct.pack(">i", len(names)) + b"".join(string(t) for t in names))
    body += b"\x01" if auto_create else b"\x00"
    if version >= METADATA_AUTHORIZED:
        body += b"\x00" + (b"\x01" if authorized else b"\x00")  # cluster, topic operations
    return body


def read_metadata(r: Reader, version: int) -> Metadata:
    r.take(">i")  # throttle
    brokers = {node: (host or "", port) for node, host, port, _rack in r.array(
        lambda: (r.take(">i"), r.string(), r.take(">i"), r.string()))}
    r.string()  # cluster id
    controller = r.take(">i")
    topics = {}
    for _ in range(r.take(">i")):
        error = r.take(">h")
        name = r.string() or ""
        r.take(">b")  # is_internal
        meta = TopicMetadata(error)
        for _ in range(r.take(">i")):
            perror, index, leader, epoch = r.take(">hiii")
            for _ in range(3):  # replicas, isr, offline
                count = r.take(">i")
                r.at += 4 * max(count, 0)
            meta.leaders[index] = leader if perror == 0 else -1
            meta.epochs[index] = epoch
            meta.errors[index] = perror
        if version >= METADATA_AUTHORIZED:
            ops = r.take(">i")
            meta.authorized = None if ops == NO_OPERATIONS else ops
        topics[name] = meta
    if version >= METADATA_AUTHORIZED:
        r.take(">i")  # cluster authorized operations
    return Metadata(brokers, controller, topics)


# -- FindCoordinator ----------------------------------------------------------------------------
def find_coordinator(key: str, key_type: int) -> bytes:
    return string(key) + struct.pack(">b", key_type)


def read_find_coordinator(r: Reader) -> tuple[int, int, str, int]:
    """``(error code, node, host, port)``."""
    _, error = r.take(">ih")
    r.string()  # error message
    node = r.take(">i")
    host = r.string() or ""
    return error, int(node), host, int(r.take(">i"))


# -- InitProducerId -----------------------------------------------------------------------------
def init_producer_id(transactional_id: str | None, transaction_timeout_ms: int) -> bytes:
    return string(transactional_id) + struct.pack(">i", transaction_timeout_ms)


def read_init_producer_id(r: Reader) -> tuple[int, int, int]:
    """``(error code, producer id, epoch)``."""
    _, error, pid, epoch = r.take(">ihqh")
    return error, pid, epoch


# -- AddPartitionsToTxn, AddOffsetsToTxn (transactions v1) --------------------------------------
def add_partitions(transactional_id: str, producer_id: int, epoch: int, topic: str,
                   partitions: Sequence[int]) -> bytes:
    return (string(transactional_id) + struct.pack(">qhi", producer_id, epoch, 1)
            + string(topic) + struct.pack(">i", len(partitions))
            + np.asarray(partitions, ">i4").tobytes())


def read_add_partitions(r: Reader) -> dict[int, int]:
    """Each partition's error code (one topic asked)."""
    r.take(">i")  # throttle
    out: dict[int, int] = {}
    for _ in range(r.take(">i")):
        r.string()
        n = r.take(">i")
        answers = np.frombuffer(r.data[r.at:r.at + 6 * n], dtype=[("p", ">i4"), ("e", ">i2")])
        r.at += 6 * n
        out.update(zip(answers["p"].tolist(), answers["e"].tolist(), strict=True))
    return out


def add_offsets(transactional_id: str, producer_id: int, epoch: int, group: str) -> bytes:
    return string(transactional_id) + struct.pack(">qh", producer_id, epoch) + string(group)


def read_add_offsets(r: Reader) -> int:
    _, error = r.take(">ih")
    return int(error)


# -- TxnOffsetCommit: v2, and v5 (transactions v2) ----------------------------------------------
def txn_offset_commit_v2(transactional_id: str, group: str, producer_id: int, epoch: int,
                         topic: str, partition: int, offset: int, metadata: str) -> bytes:
    """One offset (no leader epoch)."""
    return (string(transactional_id) + string(group) + struct.pack(">qh", producer_id, epoch)
            + struct.pack(">i", 1) + string(topic)
            + struct.pack(">iiqi", 1, partition, offset, -1) + string(metadata))


def read_txn_offset_commit_v2(r: Reader) -> list[int]:
    """Each partition's error code."""
    r.take(">i")  # throttle
    errors: list[int] = []
    for _ in range(r.take(">i")):
        r.string()
        errors.extend(r.take(">ih")[1] for _ in range(r.take(">i")))
    return errors


def txn_offset_commit_v5(transactional_id: str, group: str, producer_id: int, epoch: int,
                         topic: str, partition: int, offset: int, metadata: str) -> bytes:
    """One offset, outside any consumer generation."""
    return (compact(transactional_id) + compact(group) + struct.pack(">qhi", producer_id,
                                                                     epoch, -1)
            + compact("") + compact(None) + uvarint(2) + compact(topic) + uvarint(2)
            + struct.pack(">iqi", partition, offset, -1) + compact(metadata)
            + NO_TAGS + NO_TAGS + NO_TAGS)


def read_txn_offset_commit_v5(r: Reader) -> list[int]:
    r.take(">i")  # throttle
    out = []
    for _ in range(r.compact_count()):
        r.compact_string()
        for _ in range(r.compact_count()):
            _, error = r.take(">ih")
            r.tags()
            out.append(error)
        r.tags()
    return out


# -- EndTxn: v2, and v5 (transactions v2: bumps the epoch) --------------------------------------
def end_txn_v2(transactional_id: str, producer_id: int, epoch: int, commit: bool) -> bytes:
    return string(transactional_id) + struct.pack(">qhb", producer_id, epoch, int(commit))


def read_end_txn_v2(r: Reader) -> tuple[int, int, int]:
    """``(error code, -1, -1)``: v2 answers no producer id or epoch."""
    return int(r.take(">ih")[1]), -1, -1


def end_txn_v5(transactional_id: str, producer_id: int, epoch: int, commit: bool) -> bytes:
    return (compact(transactional_id) + struct.pack(">qhb", producer_id, epoch, int(commit))
            + NO_TAGS)


def read_end_txn_v5(r: Reader) -> tuple[int, int, int]:
    """``(error code, producer id, the bumped epoch)``."""
    _, error, producer_id, epoch = r.take(">ihqh")
    return error, producer_id, epoch


# -- Produce: v7, and v12 (transactions v2) -----------------------------------------------------
def produce_head_v7(transactional_id: str | None, timeout_ms: int, topic: str) -> bytes:
    """Produce v7 up to the topic's partition array (acks=all, one topic)."""
    return string(transactional_id) + struct.pack(">hii", -1, timeout_ms, 1) + string(topic)


def produce_head_v12(transactional_id: str | None, timeout_ms: int, topic: str) -> bytes:
    """Produce v12 up to the topic's partition array (acks=all, one topic)."""
    return (compact(transactional_id) + struct.pack(">hi", -1, timeout_ms) + uvarint(2)
            + compact(topic))


def produce_parts_v7(head: bytes,
                     batches: Sequence[tuple[int, memoryview]]) -> list[bytes | memoryview]:
    """Produce v7 of ``batches`` (partition, the batch's bytes), the bytes sent as they are
    (no copy)."""
    out: list[bytes | memoryview] = [head + struct.pack(">i", len(batches))]
    for part, data in batches:
        out.append(struct.pack(">ii", part, len(data)))
        out.append(data)
    return out


def produce_parts_v12(head: bytes,
                      batches: Sequence[tuple[int, memoryview]]) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = [head + uvarint(len(batches) + 1)]
    for part, data in batches:
        out.append(struct.pack(">i", part) + uvarint(len(data) + 1))
        out.append(data)
        out.append(NO_TAGS)
    out.append(NO_TAGS + NO_TAGS)  # the topic's, the request's
    return out


def read_produce_v7(r: Reader) -> Iterator[tuple[int, int]]:
    """Each partition's ``(index, error code)``."""
    for _ in range(r.take(">i")):
        r.string()
        for _ in range(r.take(">i")):
            part, code = r.take(">ih")
            r.at += 24  # base offset, log append time, log start offset
            yield part, code
    r.take(">i")  # throttle


def read_produce_v12(r: Reader) -> Iterator[tuple[int, int]]:
    for _ in range(r.compact_count()):
        r.compact_string()
        for _ in range(r.compact_count()):
            part, code = r.take(">ih")
            r.at += 24  # base offset, log append time, log start offset
            for _ in range(r.compact_count()):  # record errors
                r.take(">i")
                r.compact_string()
                r.tags()
            r.compact_string()  # error message
            r.tags()  # current leader (KIP-951)
            yield part, code
        r.tags()
    r.take(">i")  # throttle
    r.tags()


# -- ListOffsets v4 -----------------------------------------------------------------------------
def list_offsets(wanted: Iterable[tuple[str, int, int, int]], isolation: int) -> bytes:
    """``(topic, partition, timestamp, leader epoch)`` each, no replica. The leader epoch is
    the one the asker's metadata names (-1: none known): a broker that is no longer that
    epoch's leader answers FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH instead of offsets
    from a log it no longer leads (KIP-320), so a node back from a partition or a restart
    cannot hand out an end older than the real one."""
    by_topic: dict[str, list[tuple[int, int, int]]] = {}
    for topic, part, ts, epoch in wanted:
        by_topic.setdefault(topic, []).append((part, epoch, ts))
    body = struct.pack(">ib", -1, isolation) + struct.pack(">i", len(by_topic))
    for topic, parts in by_topic.items():
        body += string(topic) + struct.pack(">i", len(parts))
        body += b"".join(struct.pack(">iiq", p, epoch, ts) for p, epoch, ts in parts)
    return body


def read_list_offsets(r: Reader) -> dict[tuple[str, int], tuple[int, int]]:
    """``(topic, partition) -> (error code, offset)``."""
    r.take(">i")  # throttle
    out = {}
    for _ in range(r.take(">i")):
        topic = r.string() or ""
        for _ in range(r.take(">i")):
            index, error, _ts, offset, _epoch = r.take(">ihqqi")
            out[(topic, index)] = (error, offset)
    return out


# -- OffsetFetch v7 (flexible: require_stable, KIP-447) --------------------------------------------
def offset_fetch_v7(group: str, topic: str, partitions: Sequence[int],
                    require_stable: bool) -> bytes:
    """A group's committed offsets of ``partitions`` of ``topic``; ``require_stable``: the
    coordinator answers UNSTABLE_OFFSET_COMMIT while a transaction's offset commit to the
    group is still open, instead of the last stable one."""
    return (compact(group) + uvarint(2) + compact(topic) + uvarint(len(partitions) + 1)
            + b"".join(struct.pack(">i", p) for p in partitions) + NO_TAGS
            + (b"\x01" if require_stable else b"\x00") + NO_TAGS)


def read_offset_fetch_v7(r: Reader) -> tuple[int, dict[tuple[str, int],
                                                      tuple[int, str | None, int]]]:
    """``(the group's error code, (topic, partition) -> (offset, metadata, error code))``;
    offset -1: none committed."""
    r.take(">i")  # throttle
    out = {}
    for _ in range(r.compact_count()):
        topic = r.compact_string() or ""
        for _ in range(r.compact_count()):
            partition, offset, _epoch = r.take(">iqi")
            metadata = r.compact_string()
            error = r.take(">h")
            r.tags()
            out[(topic, partition)] = (offset, metadata, error)
        r.tags()
    return r.take(">h"), out


# -- DescribeGroups v3 --------------------------------------------------------------------------
def describe_groups(group: str) -> bytes:
    return struct.pack(">i", 1) + string(group) + b"\x01"  # with authorized operations


def read_describe_groups(r: Reader) -> dict[str | None, tuple[int, str, int | None]]:
    """``group -> (error code, state, authorized operations)``."""
    r.take(">i")  # throttle
    out = {}
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
        out[name] = (error, state, None if ops == NO_OPERATIONS else ops)
    return out


# -- CreateTopics v4 ----------------------------------------------------------------------------
def create_topics(topic: str, partitions: int, timeout_ms: int) -> bytes:
    """One topic, the broker's default replication, no assignments, no configs."""
    return (struct.pack(">i", 1) + string(topic) + struct.pack(">ih", partitions, -1)
            + struct.pack(">ii", 0, 0) + struct.pack(">ib", timeout_ms, 0))


def read_create_topics(r: Reader) -> dict[str | None, tuple[int, str | None]]:
    """``topic -> (error code, message)``."""
    r.take(">i")  # throttle
    out = {}
    for _ in range(r.take(">i")):
        name, error, message = r.string(), r.take(">h"), r.string()
        out[name] = (error, message)
    return out


# -- DescribeConfigs v1 -------------------------------------------------------------------------
def describe_broker_config(node: int, name: str) -> bytes:
    """One config of broker ``node``'s resource (type 4), without synonyms."""
    return (struct.pack(">ib", 1, 4) + string(str(node)) + struct.pack(">i", 1) + string(name)
            + b"\x00")


def read_describe_configs(r: Reader) -> tuple[int, str | None, dict[str | None, str | None]]:
    """``(error code, message, config -> value)`` of the one resource asked."""
    r.take(">i")  # throttle
    error, message, values = 0, None, {}
    for _ in range(r.take(">i")):
        error, message = r.take(">h"), r.string()
        r.take(">b"), r.string()  # resource type, name
        for _ in range(r.take(">i")):
            key, val = r.string(), r.string()
            r.take(">bbb")  # read_only, source, is_sensitive
            for _ in range(r.take(">i")):  # synonyms
                r.string(), r.string(), r.take(">b")
            values[key] = val
    return error, message, values
