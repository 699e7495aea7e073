"""The flexible request versions (KIP-482: compact strings and arrays, tagged fields) the wire
path speaks for transactions v2 (KIP-890 part 2, Kafka 4.0 and later): ApiVersions v3 (the
cluster's finalized features), Produce v12, TxnOffsetCommit v5 and EndTxn v5.

Under transactions v2 a partition joins the transaction with its first Produce (the leader
asks the coordinator itself) and the fact group with its TxnOffsetCommit, so
``AddPartitionsToTxn`` and ``AddOffsetsToTxn`` are never sent; and every ``EndTxn`` bumps the
producer epoch and writes its markers with the new one, so a request of the ended transaction
that reaches a broker late is refused as fenced instead of joining the next one
(docs/design.md, "The wire client's failures", step 7).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

from connectors.kafka.wire.protocol import (
    API_VERSIONS,
    TV2_VERSIONS,
    Connection,
    _Reader,
    compact,
    uvarint,
)

#: The cluster-wide feature and level that turn transactions v2 on.
TRANSACTION_VERSION, TV2_LEVEL = "transaction.version", 2
#: The client software name ApiVersions v3 sends (the distribution's).
CLIENT = "pyspark-exactly-once"
#: An empty tagged-field section.
NO_TAGS = b"\x00"


def api_versions() -> bytes:
    """ApiVersions v3: the client's name and version (a broker checks they are
    ``[a-zA-Z0-9](?:[a-zA-Z0-9\\-.]*[a-zA-Z0-9])?``)."""
    try:
        ours = version(CLIENT)
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        ours = "0"
    cleaned = "".join(c if c.isalnum() or c in "-." else "-" for c in ours).strip("-.") or "0"
    return compact(CLIENT) + compact(cleaned) + NO_TAGS


def transactions_v2(conn: Connection, ranges: dict[int, tuple[int, int]],
                    timeout: float) -> bool:
    """Whether the cluster finalized ``transaction.version`` 2 and ``conn``, whose request
    versions are ``ranges`` (ApiVersions v0), serves its requests."""
    if any(ranges.get(api, (1, 0))[1] < v for api, v in TV2_VERSIONS.items()):
        return False
    r = conn.call(API_VERSIONS, api_versions(), timeout, TV2_VERSIONS[API_VERSIONS])
    error, features = finalized_features(r)
    return not error and features.get(TRANSACTION_VERSION, 0) >= TV2_LEVEL


def finalized_features(r: _Reader) -> tuple[int, dict[str, int]]:
    """An ApiVersions v3 answer: ``(error code, finalized feature -> its max level)``."""
    error = r.take(">h")
    for _ in range(r.compact_count()):
        r.take(">hhh")
        r.tags()
    r.take(">i")  # throttle
    features: dict[str, int] = {}
    raw = r.tags().get(2)  # FinalizedFeatures
    if raw is not None:
        f = _Reader(raw)
        for _ in range(f.compact_count()):
            name = f.compact_string() or ""
            features[name], _ = f.take(">hh")  # max level, min level
            f.tags()
    return error, features


def produce_head(transactional_id: str | None, timeout_ms: int, topic: str) -> bytes:
    """Produce v12 up to the topic's partition array: one topic."""
    return (compact(transactional_id) + struct.pack(">hi", -1, timeout_ms) + uvarint(2)
            + compact(topic))


def produce_parts(head: bytes, request: list[tuple[int, int, int]],
                  view: memoryview) -> list[bytes | memoryview]:
    """Produce v12 of ``request`` (partition, start, end in ``view``)."""
    out: list[bytes | memoryview] = [head + uvarint(len(request) + 1)]
    for part, a, b in request:
        out.append(struct.pack(">i", part) + uvarint(b - a + 1))
        out.append(view[a:b])
        out.append(NO_TAGS)
    out.append(NO_TAGS + NO_TAGS)  # the topic's, the request's
    return out


def produce_answers(r: _Reader) -> Iterator[tuple[int, int]]:
    """A Produce v12 answer: each partition's (index, error code)."""
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


def txn_offset_commit(transactional_id: str, group: str, producer_id: int, epoch: int,
                      topic: str, partition: int, offset: int, metadata: str) -> bytes:
    """TxnOffsetCommit v5 of one offset, outside any consumer generation."""
    return (compact(transactional_id) + compact(group) + struct.pack(">qhi", producer_id,
                                                                     epoch, -1)
            + compact("") + compact(None) + uvarint(2) + compact(topic) + uvarint(2)
            + struct.pack(">iqi", partition, offset, -1) + compact(metadata)
            + NO_TAGS + NO_TAGS + NO_TAGS)


def txn_offset_commit_errors(r: _Reader) -> list[int]:
    """A TxnOffsetCommit v5 answer: each partition's error code."""
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


def end_txn(transactional_id: str, producer_id: int, epoch: int, commit: bool) -> bytes:
    return (compact(transactional_id) + struct.pack(">qhb", producer_id, epoch, int(commit))
            + NO_TAGS)


def end_txn_answer(r: _Reader) -> tuple[int, int, int]:
    """An EndTxn v5 answer: (error code, producer id, the bumped epoch)."""
    _, error, producer_id, epoch = r.take(">ihqh")
    return error, producer_id, epoch
