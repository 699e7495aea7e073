"""The transactional sink's wire path: Kafka record batches built from Arrow buffers and
sent with Kafka's own requests (docs/design.md, "Record batches on the wire").

librdkafka takes records one by one: every record becomes a message struct, a queue entry
and a copy, and its broker thread then writes each into a batch. At 1,000 partitions that
per-record work was about 0.45 CPU-seconds per million records in the Python worker, as much
as the broker's own work (docs/kafka-sink.md, "Into 1,000 partitions"). Here one C call
(``_record_batch.encode``) writes a chunk of rows as finished record batches, one per target
partition, straight from the Arrow buffers, and :class:`WireProducer` sends them in one
Produce request per leader:

- ``FindCoordinator`` and ``InitProducerId`` with the task's transactional.id: the same
  fencing as ``init_transactions`` (docs/design.md, 2T); a new producer epoch, so every
  partition's sequence starts at 0;
- ``AddPartitionsToTxn`` for the partitions a chunk writes, ``Produce`` (acks=all,
  transactional batches with the producer id, epoch and each partition's next sequence);
- the commit fact with ``AddOffsetsToTxn`` and ``TxnOffsetCommit`` (what
  ``send_offsets_to_transaction`` sends), then ``EndTxn``: commit, or abort on failure.

The request versions and the connection are in :mod:`connectors.kafka.sink.wire_protocol`.
Transient errors (a leader moving, a coordinator loading, the previous attempt's
transaction still ending) are asked again until ``metadataRetryTimeout``, a produce batch
with the same sequence (the broker drops a duplicate). A broken connection fails the task:
its retry fences this attempt and aborts its transaction, as with librdkafka.

:func:`unsupported` says when the path does not apply (GSSAPI or OAUTHBEARER logins,
compression, no C extension);
the sink then produces through librdkafka, as before.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.kafka.sink.wire_protocol import (
    ADD_OFFSETS,
    ADD_PARTITIONS,
    API_NAMES,
    API_VERSIONS,
    CHUNK_BYTES,
    COORDINATOR_MOVED,
    DUPLICATE_SEQUENCE,
    END_TXN,
    ERRORS,
    FENCED,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    MAX_REQUEST_BYTES,
    METADATA,
    OUT_OF_ORDER_SEQUENCE,
    PRODUCE,
    RETRIABLE,
    TXN_OFFSET_COMMIT,
    VERSIONS,
    Connection,
    Settings,
    UnsupportedBroker,
    WireError,
    encode,
    encoder_built,
    string,
)
from connectors.kafka.sink.wire_sasl import MECHANISMS, mechanism_of

log = logging.getLogger(__name__)

__all__ = ["CHUNK_BYTES", "Settings", "UnsupportedBroker", "WireError", "WireProducer",
           "available", "unsupported"]


#: Why the wire path was not taken, logged once per process and reason.
_SKIPPED: set[str] = set()


def note_skipped(why: str) -> None:
    """Log once per process and reason that records go through librdkafka."""
    if why not in _SKIPPED:
        _SKIPPED.add(why)
        log.info("%s; records go through librdkafka, not as record batches", why)


def available() -> bool:
    """Whether the record-batch encoder (the C extension) is built here."""
    return encoder_built()


def unsupported(conf: Mapping[str, Any]) -> str | None:
    """Why the wire path cannot send with this producer configuration (None: it can)."""
    if not encoder_built():
        return "the _record_batch extension is not built (no C compiler at install time)"
    protocol = str(conf.get("security.protocol", "plaintext")).lower()
    if protocol not in ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"):
        return f"security.protocol={protocol}"
    if protocol.startswith("sasl_") and mechanism_of(conf) not in MECHANISMS:
        return (f"sasl.mechanism={mechanism_of(conf)} (the wire path speaks "
                f"{', '.join(MECHANISMS)})")
    for key in ("compression.type", "compression.codec"):
        codec = str(conf.get(key, "none")).lower()
        if codec not in ("none", ""):
            return f"{key}={codec} (the wire path writes uncompressed batches)"
    for key in ("ssl.keystore.location", "ssl.engine.location", "ssl.providers",
                "ssl.certificate.pem", "ssl.key.pem", "ssl.ca.pem", "ssl_key", "ssl.crl.location"):
        if key in conf:
            return f"{key} is set (the wire path reads PEM files: ssl.ca.location, " \
                   "ssl.certificate.location, ssl.key.location)"
    return None


class WireProducer:
    """One task attempt's transactional producer on Kafka's wire protocol."""

    def __init__(self, settings: Settings, transactional_id: str | None, who: str,
                 retry_timeout: float) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.who = who
        self.retry_timeout = retry_timeout
        self.brokers: dict[int, tuple[str, int]] = {}
        self.connections: dict[int, Connection] = {}
        self.bootstrap: Connection | None = None
        self.coordinator: Connection | None = None
        self.producer_id, self.epoch = -1, -1
        self.added: set[tuple[str, int]] = set()
        self.leaders: dict[str, np.ndarray] = {}
        self.seqs: dict[str, np.ndarray] = {}
        self.groups: dict[str, Connection] = {}
        self.open = False

    # -- set-up ---------------------------------------------------------------------------------
    def connect(self) -> Connection:
        if self.bootstrap is not None:
            return self.bootstrap
        errors = []
        for host, port in self.settings.bootstrap:
            try:
                conn = Connection(host, port, self.settings)
            except OSError as e:
                errors.append(f"{host}:{port}: {e}")
                continue
            self._check_versions(conn)
            self.bootstrap = conn
            return conn
        raise KafkaSinkError(f"{self.who}: no bootstrap server answered: {'; '.join(errors)}")

    def _check_versions(self, conn: Connection) -> None:
        r = conn.call(API_VERSIONS, b"")  # v0: no body
        error = r.take(">h")
        ranges = {k: (lo, hi) for k, lo, hi in r.array(lambda: r.take(">hhh"))}
        missing = [f"{API_NAMES[api]} v{v}" for api, v in VERSIONS.items()
                   if not (ranges.get(api, (1, 0))[0] <= v <= ranges.get(api, (1, 0))[1])]
        if error or missing:
            raise UnsupportedBroker(f"{self.who}: broker {conn.address} does not serve "
                                    f"{', '.join(missing) or f'ApiVersions (error {error})'}")

    def init(self, timeout: float) -> None:
        """``InitProducerId``: fences every older producer of this transactional.id and
        completes or aborts its open transaction (retried while it is being completed).
        Without a transactional.id: a producer id for idempotent writes (any broker)."""
        self.connect()
        body = string(self.transactional_id) + struct.pack(
            ">i", self.settings.transaction_timeout_ms)

        def ask() -> None:
            to = self.connect() if self.transactional_id is None else self.txn_coordinator()
            r = to.call(INIT_PRODUCER_ID, body)
            _, error, pid, epoch = r.take(">ihqh")
            self._check(error, "InitProducerId", coordinator=True)
            self.producer_id, self.epoch = pid, epoch

        self._retrying(ask, f"InitProducerId of transactional.id {self.transactional_id!r}",
                       max(timeout, self.retry_timeout))

    def txn_coordinator(self) -> Connection:
        if self.transactional_id is None:
            raise KafkaSinkError(f"{self.who}: no transaction without a transactional.id "
                                 "(internal)")
        if self.coordinator is None:
            self.coordinator = self._find_coordinator(self.transactional_id, 1)
        return self.coordinator

    def _find_coordinator(self, key: str, key_type: int) -> Connection:
        r = self.connect().call(FIND_COORDINATOR, string(key) + struct.pack(">b", key_type))
        _, error = r.take(">ih")
        r.string()
        node = r.take(">i")
        host = r.string() or ""
        port = r.take(">i")
        self._check(error, f"FindCoordinator of {key!r}")
        self.brokers[node] = (host, port)
        return self.connection(node)

    def connection(self, node: int) -> Connection:
        conn = self.connections.get(node)
        if conn is None:
            host, port = self.brokers[node]
            try:
                conn = Connection(host, port, self.settings)
            except OSError as e:
                raise KafkaSinkError(f"{self.who}: cannot connect to broker {node} at "
                                     f"{host}:{port}: {e}") from None
            self.connections[node] = conn
        return conn

    def prepare(self, topic: str, group: str) -> None:
        """What the transaction will need, asked before the rows come: the target's leaders
        and the fact group's coordinator."""
        self.refresh(topic)
        self.group_coordinator(group)

    def group_coordinator(self, group: str, again: bool = False) -> Connection:
        if again or group not in self.groups:
            self.groups[group] = self._find_coordinator(group, 0)
        return self.groups[group]

    def refresh(self, topic: str, partitions: int = 0) -> None:
        """Metadata of ``topic``: every partition's leader (asked again while one of the
        first ``partitions``, or of all the broker names, has none)."""

        def ask() -> None:
            r = self.connect().call(METADATA, struct.pack(">i", 1) + string(topic) + b"\x00")
            r.take(">i")  # throttle
            for node, host, port, _rack in r.array(
                    lambda: (r.take(">i"), r.string(), r.take(">i"), r.string())):
                self.brokers[node] = (host or "", port)
            r.string()  # cluster id
            r.take(">i")  # controller
            found: dict[int, int] = {}
            for _ in range(r.take(">i")):
                error = r.take(">h")
                name = r.string()
                r.take(">b")
                for _ in range(r.take(">i")):
                    perror, index, leader, _epoch = r.take(">hiii")
                    for _ in range(3):  # replicas, isr, offline
                        count = r.take(">i")
                        r.at += 4 * max(count, 0)
                    if name == topic:
                        found[index] = leader if perror == 0 else -1
                self._check(error, f"Metadata of topic {name!r}")
            leaders = np.full(max(partitions, len(found)), -1, dtype=np.int64)
            for index, leader in found.items():
                if 0 <= index < len(leaders):
                    leaders[index] = leader
            if (leaders < 0).any():
                missing = np.flatnonzero(leaders < 0)[:5].tolist()
                raise WireError(f"{self.who}: partitions {missing} of {topic!r} have no leader",
                                5)
            self.leaders[topic] = leaders

        self._retrying(ask, f"Metadata of topic {topic!r}", self.retry_timeout)

    # -- the transaction ------------------------------------------------------------------------
    def add_partitions(self, topic: str, partitions: Iterable[int]) -> None:
        todo = sorted({int(p) for p in partitions} - {p for t, p in self.added if t == topic})
        if not todo:
            return
        body = (string(self.transactional_id)
                + struct.pack(">qhi", self.producer_id, self.epoch, 1) + string(topic)
                + struct.pack(">i", len(todo)) + np.asarray(todo, ">i4").tobytes())

        def ask() -> None:
            r = self.txn_coordinator().call(ADD_PARTITIONS, body)
            r.take(">i")
            for _ in range(r.take(">i")):
                r.string()
                n = r.take(">i")
                answers = np.frombuffer(r.data[r.at:r.at + 6 * n],
                                        dtype=[("p", ">i4"), ("e", ">i2")])
                r.at += 6 * n
                for code in set(answers["e"].tolist()) - {0}:
                    self._check(int(code), f"AddPartitionsToTxn of {topic!r}",
                                coordinator=True)

        self._retrying(ask, f"AddPartitionsToTxn of {len(todo)} partitions of {topic!r}",
                       self.retry_timeout)
        self.added.update((topic, p) for p in todo)
        self.open = True

    def produce(self, topic: str, partition_count: int, values: pa.Array,
                keys: pa.Array | None, parts: np.ndarray, order: np.ndarray,
                header: tuple[str, bytes] | None = None) -> int:
        """Send the rows ``order`` (grouped by target partition) to ``topic`` (in this
        transaction, if transactional); returns the number of records. ``header``: a
        recovery key on each record (``wire_protocol.encode``)."""
        if not len(order):
            return 0
        if len(self.leaders.get(topic, ())) < partition_count:
            self.refresh(topic, partition_count)
        seqs = self.seqs.setdefault(topic, np.zeros(0, dtype=np.int64))
        if len(seqs) < len(self.leaders[topic]):  # new partitions start at sequence 0
            seqs = self.seqs[topic] = np.concatenate(
                [seqs, np.zeros(len(self.leaders[topic]) - len(seqs), dtype=np.int64)])
        data, batches, partitions = encode(
            values, keys, order, parts, seqs, self.producer_id, self.epoch,
            self.settings.max_batch_bytes, transactional=self.transactional_id is not None,
            header=header)
        sizes = batches[:, 2] - batches[:, 1]
        if (sizes > self.settings.max_batch_bytes).any():  # one record alone is too big
            i = int(np.argmax(sizes))
            raise KafkaSinkError(
                f"{self.who}: a record for {topic}[{int(partitions[batches[i, 0]])}] is too "
                f"large: {int(sizes[i])} bytes as a record batch, above message.max.bytes="
                f"{self.settings.max_batch_bytes} (option kafka.message.max.bytes; the "
                "topic's max.message.bytes bounds it on the broker); nothing of the task is "
                "committed")
        if self.transactional_id is not None:
            self.add_partitions(topic, partitions[np.unique(batches[:, 0])].tolist())
        pending = [(int(partitions[g]), int(a), int(b)) for g, a, b, _ in batches.tolist()]
        view = memoryview(data)
        deadline = time.monotonic() + self.retry_timeout
        while pending:
            failed = self._send(topic, pending, view)
            if not failed:
                break
            codes = sorted({code for _, code in failed})
            if time.monotonic() > deadline:
                raise WireError(f"{self.who}: Produce to {topic!r} still failing after "
                                f"{self.retry_timeout:.0f}s: {self._describe(failed)}",
                                codes[0])
            log.info("%s: Produce to %r: %s; asking again", self.who, topic,
                     self._describe(failed))
            time.sleep(0.1)
            self.refresh(topic, partition_count)
            pending = [batch for batch, _ in failed]
        return int(batches[:, 3].sum())

    def _describe(self, failed: list[tuple[tuple[int, int, int], int]]) -> str:
        names = sorted({ERRORS.get(code, str(code)) for _, code in failed})
        return f"{len(failed)} batches, {', '.join(names)}"

    def _send(self, topic: str, batches: list[tuple[int, int, int]],
              view: memoryview) -> list[tuple[tuple[int, int, int], int]]:
        """One round: each leader gets requests of at most one batch per partition, in
        sequence order; returns the batches to send again with their error codes."""
        leaders = self.leaders[topic]
        rounds: dict[int, list[tuple[list[tuple[int, int, int]], list[int]]]] = {}
        after: dict[int, int] = {}  # partition -> the first request its next batch may join
        for batch in batches:
            p, size = batch[0], batch[2] - batch[1]
            queue = rounds.setdefault(int(leaders[p]), [])
            j = after.get(p, 0)
            while j < len(queue) and queue[j][1][0] + size > MAX_REQUEST_BYTES:
                j += 1
            if j == len(queue):
                queue.append(([], [0]))
            queue[j][0].append(batch)
            queue[j][1][0] += size
            after[p] = j + 1
        sent: list[tuple[Connection, list[tuple[int, int, int]]]] = []
        head = string(self.transactional_id) + struct.pack(">hi", -1, int(
            self.settings.request_timeout * 1000)) + struct.pack(">i", 1) + string(topic)
        for node, requests in rounds.items():
            conn = self.connection(node)
            for request, _ in requests:
                parts: list[bytes | memoryview] = [head + struct.pack(">i", len(request))]
                for p, a, b in request:
                    parts.append(struct.pack(">ii", p, b - a))
                    parts.append(view[a:b])
                conn.send(PRODUCE, parts)
                sent.append((conn, request))
        failed: list[tuple[tuple[int, int, int], int]] = []
        broken: set[int] = set()
        for conn, request in sent:
            r = conn.receive()
            by_partition = {b[0]: b for b in request}
            for _ in range(r.take(">i")):
                r.string()
                for _ in range(r.take(">i")):
                    p, code = r.take(">ih")
                    r.at += 24  # base offset, log append time, log start offset
                    if code in (0, DUPLICATE_SEQUENCE):
                        continue
                    if code in RETRIABLE:
                        broken.add(p)
                        failed.append((by_partition[p], code))
                    elif code == OUT_OF_ORDER_SEQUENCE and p in broken:
                        failed.append((by_partition[p], code))  # behind a failed batch
                    else:
                        self._check(code, f"Produce to {topic}[{p}]")
        return failed

    def send_offset(self, group: str, topic: str, partition: int, offset: int,
                    metadata: str) -> None:
        """``send_offsets_to_transaction`` of one offset: AddOffsetsToTxn, then
        TxnOffsetCommit to the group's coordinator."""
        ids = struct.pack(">qh", self.producer_id, self.epoch)

        def add() -> None:
            r = self.txn_coordinator().call(ADD_OFFSETS, string(self.transactional_id) + ids
                                            + string(group))
            _, error = r.take(">ih")
            self._check(error, f"AddOffsetsToTxn of group {group!r}", coordinator=True)

        self._retrying(add, f"AddOffsetsToTxn of group {group!r}", self.retry_timeout)
        self.open = True
        body = (string(self.transactional_id) + string(group) + ids + struct.pack(">i", 1)
                + string(topic) + struct.pack(">iiqi", 1, partition, offset, -1)
                + string(metadata))
        moved = [False]

        def commit() -> None:
            r = self.group_coordinator(group, again=moved[0]).call(TXN_OFFSET_COMMIT, body)
            r.take(">i")
            for _ in range(r.take(">i")):
                r.string()
                for _ in range(r.take(">i")):
                    _, error = r.take(">ih")
                    moved[0] = error in COORDINATOR_MOVED
                    self._check(error, f"TxnOffsetCommit of group {group!r}")

        self._retrying(commit, f"TxnOffsetCommit of group {group!r}", self.retry_timeout)

    def end(self, commit: bool) -> None:
        """``EndTxn``: commit or abort what this attempt added."""
        body = string(self.transactional_id) + struct.pack(">qhb", self.producer_id, self.epoch,
                                                          1 if commit else 0)

        def ask() -> None:
            r = self.txn_coordinator().call(END_TXN, body)
            _, error = r.take(">ih")
            self._check(error, "EndTxn", coordinator=True)

        self._retrying(ask, "EndTxn (commit)" if commit else "EndTxn (abort)",
                       self.retry_timeout)
        self.open = False

    # confluent-kafka's Producer.flush and purge, for the recovery-key mode's slot: every
    # produce() call returns once the broker acknowledged its records.
    def flush(self, timeout: float = 0.0) -> int:
        return 0

    def purge(self) -> None:
        pass

    def close(self) -> None:
        for conn in {id(c): c for c in (self.bootstrap, self.coordinator,
                                        *self.connections.values()) if c}.values():
            conn.close()
        self.connections.clear()
        self.groups.clear()
        self.bootstrap = self.coordinator = None

    # -- errors ---------------------------------------------------------------------------------
    def _check(self, code: int, request: str, coordinator: bool = False) -> None:
        if code == 0:
            return
        if coordinator and code in COORDINATOR_MOVED:
            self.coordinator = None
        name = ERRORS.get(code, f"error {code}")
        if code in FENCED:
            raise WireError(f"{self.who}: {request}: {name}: a newer attempt of this task "
                            f"fenced transactional.id {self.transactional_id!r}", code)
        raise WireError(f"{self.who}: {request}: {name}", code)

    def _retrying(self, ask: Callable[[], None], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                ask()
                return
            except WireError as e:
                if e.code not in RETRIABLE or time.monotonic() + delay > deadline:
                    if e.code in RETRIABLE:
                        raise WireError(f"{self.who}: {what}: still {e.name} after "
                                        f"{timeout:.0f}s", e.code) from None
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
