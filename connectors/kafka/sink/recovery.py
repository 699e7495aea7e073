"""Recovery keys, started markers, the recovery scan and the dedupe decision (docs/design.md,
"Kafka sink: recovery keys").

Recovery key
    Every record the sink writes carries one header ``eo-rk`` whose value is, in version 2
    (written since 2026-11-26)::

        offset  size  field
        0       1     version = 2
        1       8     sink tag: BLAKE2b-64 of the sink id (UTF-8)
        9       v     batch id, unsigned LEB128 varint
        9+v     w     writer partition, unsigned LEB128 varint
        9+v+w   8     seq (unsigned, big-endian): position of the row in its writer
                      partition's deterministic order, 0-based

    20 bytes for batch ids below 16,384 and writers below 128, whatever the sink id. Version
    1 (still read, and written by a retry whose first attempt wrote it: the started marker
    records the version) held the sink id itself: version, n = its length (1..255), the id,
    batch id (8 bytes), writer (4 bytes), seq (8 bytes), 41 bytes for a 19-byte id. The
    broker pays for every header byte: paired runs at 1,000 partitions wrote 1.02M rows/s
    with the 41-byte value against 1.30M with an 8-byte one.

    Everything before ``seq`` is constant for one (sink, batch, writer), so the sink builds
    it once and appends 8 bytes per record. Consumers that do not care ignore the header;
    consumers that do can decode it with :func:`decode` to trace a record back to the Spark
    batch and task that wrote it (``RecoveryKey.of_sink`` tells a sink's tag).

Started marker
    ``<walPath>/started/<batch:020d>/<writer:05d>.json``, written by the first attempt of a
    task *before it produces anything*. It holds the high watermark of every target partition
    and the partition count of every target topic. A later attempt of the same task finds it
    and scans from those watermarks instead of writing again.

Dedupe decision
    The producer is idempotent (in-order, gapless within a partition), and rows are produced
    in seq order, so if the scan finds seq ``s`` of this (sink, batch, writer) in partition
    ``p``, every row of this writer routed to ``p`` with seq <= s is already there. Those are
    skipped; the rest are produced. :func:`decide` also checks the seqs found against this
    attempt's routing, so non-deterministic input fails loudly instead of silently dropping or
    doubling rows, and a gap left by a failed delivery is filled instead of skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from connectors.core.errors import KafkaSinkError
from connectors.core.sink_state import SinkState
from connectors.core.storage import Storage
from connectors.kafka import access
from connectors.kafka.common import FAMILY
from connectors.kafka.sink import ordering
from connectors.kafka.sink.partitioner import (
    LEGACY_NULL_KEY_RUN,
    NULL_KEY_RUN_BYTES,
    ByteRuns,
    NullKeyRuns,
    RowRuns,
)
from connectors.kafka.wire.protocol import uvarint

log = logging.getLogger(__name__)

HEADER = "eo-rk"
#: The key version the sink writes (a retry writes its first attempt's: ``StartedMarker``).
VERSION = 2
#: The versions :func:`decode` and the recovery scan read.
VERSIONS = (1, 2)
MAX_SINK_ID_BYTES = 255
_TAG_BYTES = 8
_TAIL = struct.Struct(">QIQ")  # batch id, writer, seq
_SEQ = struct.Struct(">Q")
_BATCH_WRITER = struct.Struct(">QI")
#: ``seq -> 8 bytes``: the tail of a header value after ``key_prefix`` (a bound method: the
#: sink's produce loop calls it once per record).
pack_seq = _SEQ.pack


class RecoveryKeyError(ValueError):
    """A header value is not a recovery key this version of the sink can read."""


class RecoveryKey(NamedTuple):
    """A decoded ``eo-rk`` value. ``sink_id`` is the id (version 1) or ``#`` and the hex
    sink tag (version 2): :meth:`of_sink` compares either."""

    sink_id: str
    batch_id: int
    writer: int
    seq: int
    version: int = VERSION

    def of_sink(self, sink_id: str) -> bool:
        return self.sink_id in (sink_id, "#" + _tag(sink_id.encode("utf-8")).hex())


def _sink_bytes(sink_id: str) -> bytes:
    raw = sink_id.encode("utf-8")
    if not 1 <= len(raw) <= MAX_SINK_ID_BYTES:
        raise KafkaSinkError(
            f"eo_kafka: sink_id {sink_id!r} is {len(raw)} bytes in UTF-8; a recovery key holds "
            f"1..{MAX_SINK_ID_BYTES} bytes, choose a shorter stable name"
        )
    return raw


def sink_tag(sink_id: str) -> bytes:
    """The 8 bytes that stand for the sink id in a version 2 key."""
    return _tag(_sink_bytes(sink_id))


def _tag(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=_TAG_BYTES).digest()


def _read_uvarint(value: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while at < len(value) and shift < 70:
        b = value[at]
        n |= (b & 0x7F) << shift
        at += 1
        if not b & 0x80:
            return n, at
        shift += 7
    raise RecoveryKeyError("truncated varint in eo-rk header value")


def key_prefix(sink_id: str, batch_id: int, writer: int, version: int = VERSION) -> bytes:
    """Everything of the header value except the trailing 8-byte seq."""
    if version == 2:
        return bytes((2,)) + sink_tag(sink_id) + uvarint(batch_id) + uvarint(writer)
    if version != 1:
        raise RecoveryKeyError(f"eo-rk version {version} is not supported (known: {VERSIONS})")
    raw = _sink_bytes(sink_id)
    return bytes((1, len(raw))) + raw + _BATCH_WRITER.pack(batch_id, writer)


def header_values(prefix: bytes, seqs: np.ndarray) -> list[bytes]:
    """``[prefix + pack_seq(s) for s in seqs]``, built by numpy."""
    width = len(prefix)
    out = np.empty(len(seqs), dtype=[("prefix", f"V{width}"), ("seq", ">u8")])
    out["prefix"] = np.frombuffer(prefix, dtype=f"V{width}")[0]
    out["seq"] = seqs
    return out.view(f"V{width + 8}").tolist()


def encode(key: RecoveryKey) -> bytes:
    """``key`` (its ``sink_id`` the id itself) in ``key.version``."""
    return key_prefix(key.sink_id, key.batch_id, key.writer, key.version) + pack_seq(key.seq)


def decode(value: bytes | None) -> RecoveryKey:
    """Parse an ``eo-rk`` header value; :class:`RecoveryKeyError` for anything foreign."""
    if not value:
        raise RecoveryKeyError("empty eo-rk header value")
    if value[0] not in VERSIONS:
        raise RecoveryKeyError(
            f"eo-rk version {value[0]} is not supported (this sink reads versions "
            f"{', '.join(map(str, VERSIONS))})"
        )
    if value[0] == 2:
        at = 1 + _TAG_BYTES
        batch_id, at = _read_uvarint(value, at)
        writer, at = _read_uvarint(value, at)
        if len(value) != at + _SEQ.size:
            raise RecoveryKeyError(
                f"eo-rk version 2 header value has {len(value)} bytes; its fields take "
                f"{at + _SEQ.size}")
        return RecoveryKey("#" + value[1:1 + _TAG_BYTES].hex(), batch_id, writer,
                           _SEQ.unpack_from(value, at)[0], 2)
    if len(value) < 2:
        raise RecoveryKeyError("truncated eo-rk header value")
    n = value[1]
    if n == 0 or len(value) != 2 + n + _TAIL.size:
        raise RecoveryKeyError(
            f"eo-rk header value has {len(value)} bytes; version 1 with a {n}-byte sink "
            f"id needs {2 + n + _TAIL.size}"
        )
    try:
        sink_id = value[2 : 2 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecoveryKeyError("eo-rk sink id is not UTF-8") from e
    batch_id, writer, seq = _TAIL.unpack_from(value, 2 + n)
    return RecoveryKey(sink_id, batch_id, writer, seq, 1)


def find_key(headers: Iterable[tuple[str, bytes | None]] | None) -> RecoveryKey | None:
    """The recovery key among a record's headers, or None (foreign or absent)."""
    for name, value in headers or ():
        if name == HEADER:
            try:
                return decode(value)
            except RecoveryKeyError:
                return None
    return None


# -- started markers -------------------------------------------------------------------------
@dataclass
class StartedMarker:
    """What the first attempt of task (batch, writer) knew before producing.

    ``watermarks`` are ListOffsets "latest" answers. A Kafka-protocol broker that under-reports
    them (some answer the last batch's base offset + 1) only makes the scan read
    a little more: it never starts *after* a record this task wrote, which is all that counts.
    """

    sink_id: str
    batch_id: int
    writer: int
    partition_counts: dict[str, int]
    watermarks: dict[str, dict[str, int]]
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    #: The byte budget of the null-key runs the attempt routed with (``nullKeyRunBytes``);
    #: None in a marker written before the runs were counted in bytes.
    null_key_run_bytes: int | None = NULL_KEY_RUN_BYTES
    #: Such an older marker's run in rows (``null_key_run``; a marker without it was written
    #: under runs of :data:`~connectors.kafka.sink.partitioner.LEGACY_NULL_KEY_RUN`).
    null_key_run: int | None = None
    #: The deterministic order its seqs number (``connectors.kafka.sink.ordering``).
    order: str = ordering.SORTED
    #: The recovery-key version its records carry.
    key_version: int = 1

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "sink_id": self.sink_id,
                "batch_id": self.batch_id,
                "writer": self.writer,
                "partition_counts": self.partition_counts,
                "watermarks": self.watermarks,
                "created_ms": self.created_ms,
                **({"null_key_run_bytes": self.null_key_run_bytes}
                   if self.null_key_run_bytes is not None
                   else {"null_key_run": self.null_key_run or LEGACY_NULL_KEY_RUN}),
                "order": self.order,
                "key_version": self.key_version,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> StartedMarker:
        return cls(
            sink_id=d["sink_id"],
            batch_id=int(d["batch_id"]),
            writer=int(d["writer"]),
            partition_counts={t: int(c) for t, c in d["partition_counts"].items()},
            watermarks={
                t: {str(p): int(o) for p, o in parts.items()}
                for t, parts in d["watermarks"].items()
            },
            created_ms=int(d.get("created_ms", 0)),
            null_key_run_bytes=(int(d["null_key_run_bytes"]) if "null_key_run_bytes" in d
                                else None),
            null_key_run=(None if "null_key_run_bytes" in d
                          else int(d.get("null_key_run", LEGACY_NULL_KEY_RUN))),
            order=str(d.get("order", ordering.SORTED)),
            key_version=int(d.get("key_version", 1)),
        )

    def null_key_runs(self, start: int) -> NullKeyRuns:
        """The null-key runs the attempt routed with, from ``start``: bytes, or, in a marker
        from before the runs were counted in bytes, rows."""
        if self.null_key_run_bytes is not None:
            return ByteRuns(start, self.null_key_run_bytes)
        return RowRuns(start, self.null_key_run or LEGACY_NULL_KEY_RUN)

    def start_offsets(self) -> dict[tuple[str, int], int]:
        return {(t, int(p)): o for t, parts in self.watermarks.items() for p, o in parts.items()}


class MarkerStore:
    """``<walPath>/started/<batch>/<writer>.json``: started markers, kept as the task markers
    of the sink's :class:`~connectors.core.sink_state.SinkState`."""

    def __init__(self, storage: Storage, root: str, state: SinkState | None = None) -> None:
        self.state = state or sink_state(storage, root)

    def path(self, batch_id: int, writer: int) -> str:
        return self.state.marker_path(batch_id, writer)

    def get(self, batch_id: int, writer: int) -> StartedMarker | None:
        record = self.state.get_marker(batch_id, writer)
        return None if record is None else StartedMarker.from_record(record)

    def put(self, marker: StartedMarker) -> None:
        """Create the marker. Two attempts of one task racing (a zombie and its retry):
        the one that loses the create stops before producing anything."""
        try:
            self.state.put_marker(marker.batch_id, marker.writer, marker.to_json())
        except FileExistsError:
            raise KafkaSinkError(
                f"{FAMILY} {marker.sink_id}: batch {marker.batch_id} writer {marker.writer}: "
                "another attempt of this task wrote its started marker first (a speculative "
                "or zombie attempt); this attempt stops before producing, and Spark's retry "
                "will skip what that attempt wrote") from None

    def batches(self) -> list[int]:
        return self.state.marker_batches()

    def purge(self, up_to_batch: int) -> int:
        """Delete the markers of every batch <= ``up_to_batch`` (all committed)."""
        return self.state.purge_markers(up_to_batch)


#: Commit markers the sink keeps (``WriteAheadLog.retain``): enough for ``wal show``.
KEEP_COMMITS = 10


def sink_state(storage: Storage, root: str) -> SinkState:
    """The Kafka sink's state under ``walPath``: commit log ``commits/``, owner record
    ``sink.json``, started markers ``started/``, reset record ``reset.json``."""
    return SinkState(storage, root, log_kind="commits", keep=KEEP_COMMITS, owner_record=True,
                     markers="started", reset_file="reset.json", what="walPath",
                     family=FAMILY, reset_flag="--wal-path")



# -- the scan --------------------------------------------------------------------------------
@dataclass
class ScanResult:
    """Seqs of this (sink, batch, writer) found per target partition, and the scan's cost."""

    seqs: dict[tuple[str, int], list[int]]
    records_read: int
    seconds: float

    def max_seq(self) -> dict[tuple[str, int], int]:
        return {tp: max(s) for tp, s in self.seqs.items() if s}


def scan(
    consumer: Any,
    prefix: bytes,
    start: Mapping[tuple[str, int], int],
    stop_at_least: Mapping[tuple[str, int], int],
    timeout: float,
    conf: Mapping[str, Any] | None = None,
) -> ScanResult:
    """Read every partition of ``start`` from its offset to partition EOF, collecting seqs.

    ``consumer`` is a confluent-kafka Consumer with ``enable.partition.eof=true``. A
    partition is done at an EOF whose offset is >= ``stop_at_least`` (the high watermark
    taken when the scan began): under ``read_committed`` EOF comes at the last stable
    offset, which another writer's open transaction can hold back below records this task
    committed earlier, so EOF alone is not enough there. We read to EOF rather than to a
    ListOffsets mark because some Kafka-protocol brokers under-report "latest". ``conf``
    (the client's settings) names the principal in an authorization error.
    """
    from confluent_kafka import KafkaError, TopicPartition

    conf = conf or {}
    began = time.perf_counter()
    seqs: dict[tuple[str, int], list[int]] = {tp: [] for tp in start}
    if not start:
        return ScanResult(seqs, 0, 0.0)
    consumer.assign([TopicPartition(t, p, o) for (t, p), o in start.items()])
    pending = set(start)
    size = len(prefix) + _SEQ.size
    unpack_seq = _SEQ.unpack_from
    read = 0
    deadline = time.monotonic() + timeout
    try:
        while pending:
            if time.monotonic() > deadline:
                raise KafkaSinkError(
                    f"eo_kafka: recovery scan did not reach the end of {sorted(pending)} within "
                    f"{timeout:.0f}s ({read} records read); the broker is slow or a transaction "
                    "stays open; raise option 'scanTimeout' or check the broker"
                )
            # Drain what is already fetched without waiting; block (briefly) only when
            # nothing is: consume(n, timeout) would otherwise wait out the timeout whenever
            # fewer than n records are available.
            batch = consumer.consume(10000, 0) or consumer.consume(1, 0.5)
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        tp = (m.topic(), m.partition())
                        if m.offset() >= stop_at_least.get(tp, 0):
                            pending.discard(tp)
                        continue
                    if m.topic() is None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                        # librdkafka looks up the coordinator of the consumer's group.id
                        # although the scan only assigns and never commits: the role needs
                        # no ACL on that group, so its denial is not the scan's failure.
                        continue
                    topic_read = access.Acl("TOPIC", str(m.topic()), "LITERAL", "READ", "scan")
                    denied = access.denied(err, who=FAMILY, conf=conf, needs=[topic_read],
                                           request=f"recovery scan of {m.topic()}"
                                                   f"[{m.partition()}]")
                    raise KafkaSinkError(denied or (
                        f"eo_kafka: recovery scan of {m.topic()}[{m.partition()}] failed: {err}"
                    )) from None
                read += 1
                headers = m.headers()
                if not headers:
                    continue
                for name, value in headers:
                    if name == HEADER and value is not None and len(value) == size:
                        if value.startswith(prefix):
                            seqs[(m.topic(), m.partition())].append(
                                unpack_seq(value, size - _SEQ.size)[0]
                            )
                        break
    finally:
        consumer.unassign()
    return ScanResult(seqs, read, time.perf_counter() - began)


# -- the dedupe decision ---------------------------------------------------------------------
def skip_mask(
    seqs: np.ndarray, targets: np.ndarray, present_max: Mapping[int, int]
) -> np.ndarray:
    """True for every row already written: ``seq <= max seq present in its target``.

    ``targets`` holds a small integer id per row (one id per target topic-partition) and
    ``present_max`` maps such an id to the max seq the scan found there; ids absent from it
    had nothing written.
    """
    if not present_max or len(seqs) == 0:
        return np.zeros(len(seqs), dtype=bool)
    size = max(int(targets.max()), max(present_max)) + 1
    limit = np.full(size, -1, dtype=np.int64)
    for target, seq in present_max.items():
        limit[target] = seq
    return seqs.astype(np.int64) <= limit[targets]


def decide(
    seqs: np.ndarray,
    targets: np.ndarray,
    present: Mapping[int, Iterable[int]],
    names: Mapping[int, str],
) -> np.ndarray:
    """The dedupe decision of a retry: which rows (True) are already written.

    The rule is step 2 of docs/design.md, "Kafka sink: recovery keys": rows at or below the
    max seq present in their target partition are skipped. Two checks keep it honest:

    - a seq found in partition p that this attempt does not route to p means the batch's
      input differs from the attempt that wrote it (non-deterministic input, or
      ``deterministicOrder=true`` on input whose order is not stable). Skipping by max seq
      would then drop or double rows, so this raises :class:`KafkaSinkError`;
    - a seq of ours *missing* below the max (a gap) can only follow a failed delivery, for
      example a ``message.timeout.ms`` expiry, after which librdkafka's idempotent producer
      may continue with a new epoch. Those rows are produced again rather than lost, with a
      warning.
    """
    present_max: dict[int, int] = {}
    found_by_target: dict[int, np.ndarray] = {}
    for target, found in present.items():
        got = np.unique(np.fromiter(found, dtype=np.int64))
        if len(got):
            present_max[target] = int(got[-1])
            found_by_target[target] = got
    skip = skip_mask(seqs, targets, present_max)
    for target, got in found_by_target.items():
        in_target = targets == target
        mine = seqs[in_target].astype(np.int64)
        foreign = np.setdiff1d(got, mine)
        if len(foreign):
            raise KafkaSinkError(
                f"eo_kafka: recovery scan of {names.get(target, target)} found {len(foreign)} "
                f"records of this task that this attempt does not route there (seqs "
                f"{foreign[:5].tolist()}, max seq found {int(got[-1])}). The batch's input is "
                "not the same on replay: make it deterministic, or leave "
                "deterministicOrder=false so rows are sorted before numbering; refusing to "
                "guess which rows are written"
            )
        expected = mine[mine <= got[-1]]
        if len(expected) != len(got):
            gap = np.setdiff1d(expected, got)
            log.warning(
                "eo_kafka: %s holds %d of this task's rows up to seq %d but misses %d below it "
                "(a failed delivery left a gap, e.g. seqs %s); producing those again",
                names.get(target, target), len(got), int(got[-1]), len(gap), gap[:5].tolist(),
            )
            rows = np.nonzero(in_target)[0]
            skip[rows[np.isin(mine, gap)]] = False
    return skip
