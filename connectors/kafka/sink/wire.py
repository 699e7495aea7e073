"""The Kafka sink's wire path: Kafka record batches built from Arrow buffers and sent with
Kafka's own requests (docs/design.md, "Record batches on the wire", and "The wire client's
failures" for what happens to requests in flight on each failure).

librdkafka takes records one by one (docs/kafka-sink.md, "Into 1,000 partitions", for what
that costs); here one C call (``_record_batch.encode``) writes a chunk of rows as record
batches straight from the Arrow buffers, and :class:`WireProducer` sends them
(:mod:`connectors.kafka.sink.wire_send`):

- ``FindCoordinator`` and ``InitProducerId`` with the task's transactional.id: the same
  fencing as ``init_transactions`` (docs/design.md, 2T); a new producer epoch, so every
  partition's sequence starts at 0. Without a transactional.id: an idempotent producer id;
- ``AddPartitionsToTxn`` for the partitions a chunk writes, ``Produce`` (acks=all, the
  producer id, epoch and each partition's next sequence);
- the commit fact with ``AddOffsetsToTxn`` and ``TxnOffsetCommit`` (what
  ``send_offsets_to_transaction`` sends), then ``EndTxn``: commit, or abort on failure.
  Under transactions v2 (KIP-890 part 2, where the cluster finalized it) no
  ``AddPartitionsToTxn`` or ``AddOffsetsToTxn``: :mod:`connectors.kafka.wire.flexible`.

Failures are met as librdkafka meets them: a Produce batch is sent again always with its
same producer id, epoch and sequence (so the broker keeps one copy whatever arrives late),
until ``message.timeout.ms``; other requests until ``metadataRetryTimeout``.

:func:`unsupported` says when the path does not apply (GSSAPI or OAUTHBEARER logins,
compression, a connection setting it does not honour, no C extension); the sink then
produces through librdkafka.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.kafka.sink import wire_send
from connectors.kafka.sink.wire_encode import CHUNK_BYTES, encode, encoder_built
from connectors.kafka.wire import flexible
from connectors.kafka.wire.cluster import GROUP, TRANSACTION, Cluster
from connectors.kafka.wire.protocol import (
    ADD_OFFSETS,
    ADD_PARTITIONS,
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_MOVED,
    END_TXN,
    ERRORS,
    FENCED,
    INIT_PRODUCER_ID,
    LOOKUP_TIMEOUT,
    TV2_VERSIONS,
    TXN_OFFSET_COMMIT,
    VERSIONS,
    Connection,
    UnsupportedBroker,
    WireError,
    string,
)
from connectors.kafka.wire.settings import Settings, connection_unsupported

log = logging.getLogger(__name__)

__all__ = ["CHUNK_BYTES", "Settings", "UnsupportedBroker", "WireError", "WireProducer",
           "available", "unsupported"]

T = TypeVar("T")

#: The first AddPartitionsToTxn version of brokers that verify a transaction's partitions
#: before appending (KIP-890 part 1, Kafka 3.6): older brokers let a late Produce of an
#: aborted transaction open a new one, so transactions on the wire need 3.6 or later.
VERIFYING_ADD_PARTITIONS = 4

#: How often ``retrying`` asks again after CONCURRENT_TRANSACTIONS.
CONCURRENT_POLL = 0.05

#: What was logged once per process (why the wire path was not taken, the transactions'
#: version).
_SKIPPED: set[str] = set()


def note_skipped(why: str) -> None:
    """Log once per process and reason that records go through librdkafka."""
    note_once(f"{why}; records go through librdkafka, not as record batches")


def note_once(what: str) -> None:
    """Log ``what`` once per process."""
    if what not in _SKIPPED:
        _SKIPPED.add(what)
        log.info("%s", what)


def available() -> bool:
    """Whether the record-batch encoder (the C extension) is built here."""
    return encoder_built()


def unsupported(conf: Mapping[str, Any]) -> str | None:
    """Why the wire path cannot send with this producer configuration (None: it can)."""
    if not encoder_built():
        return "the _record_batch extension is not built (no C compiler at install time)"
    for key in ("compression.type", "compression.codec"):
        codec = str(conf.get(key, "none")).lower()
        if codec not in ("none", ""):
            return f"{key}={codec} (the wire path writes uncompressed batches)"
    return connection_unsupported(conf)


class WireProducer:
    """One producer on Kafka's wire protocol: transactional (one task attempt) with a
    ``transactional_id``, else idempotent (kept by a worker, task after task). Never used by
    two threads at once (the worker's cache leases it to one holder)."""

    def __init__(self, settings: Settings, transactional_id: str | None, who: str,
                 retry_timeout: float) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.who = who
        self.retry_timeout = retry_timeout
        #: The brokers, their connections, the coordinators: the wire client's
        #: (connectors/kafka/wire/cluster.py); every broker must serve :data:`VERSIONS`.
        self.cluster = Cluster(settings, who, retry_timeout, needs=VERSIONS,
                               on_versions=self._on_versions)
        self.producer_id, self.epoch = -1, -1
        self.added: set[tuple[str, int]] = set()
        self.leaders: dict[str, np.ndarray] = {}
        self.seqs: dict[str, np.ndarray] = {}
        self.open = False
        #: Transactions v2 (KIP-890 part 2): decided on the first connection, kept for the
        #: producer's life (a transaction never changes version half-way).
        self.tv2: bool | None = None
        #: Requests whose outcome is unknown (a connection lost under them and no answer
        #: came since): an abort must not race them (docs/design.md).
        self.uncertain = False

    # -- connections ----------------------------------------------------------------------------
    def connect(self) -> Connection:
        """A connection for metadata and coordinator lookups (any live broker)."""
        return self.cluster.connect()

    def _on_versions(self, conn: Connection, ranges: dict[int, tuple[int, int]]) -> None:
        if (self.transactional_id is not None
                and ranges[ADD_PARTITIONS][1] < VERIFYING_ADD_PARTITIONS):
            raise UnsupportedBroker(
                f"{self.who}: broker {conn.address} is older than Kafka 3.6 and does not "
                "verify a transaction's partitions before appending (KIP-890), so a late "
                "Produce of an aborted transaction could open another; transactions go "
                "through librdkafka there")
        if self.tv2 is None and self.transactional_id is not None:
            self.tv2 = flexible.transactions_v2(conn, ranges, LOOKUP_TIMEOUT)
            note_once(f"{self.who}: transactions v{2 if self.tv2 else 1} on the wire "
                      f"(broker {conn.address})")

    def connection(self, node: int) -> Connection:
        """A working connection to ``node``."""
        return self.cluster.connection(node)

    def close(self) -> None:
        self.cluster.close()

    # -- set-up ---------------------------------------------------------------------------------
    def init(self, timeout: float) -> None:
        """``InitProducerId``: fences every older producer of this transactional.id and
        completes or aborts its open transaction (retried while it is being completed).
        Without a transactional.id: a producer id for idempotent writes (any broker)."""
        body = string(self.transactional_id) + struct.pack(
            ">i", self.settings.transaction_timeout_ms)

        def ask() -> None:
            to = self.connect() if self.transactional_id is None else self.txn_coordinator()
            r = to.call(INIT_PRODUCER_ID, body)
            _, error, pid, epoch = r.take(">ihqh")
            self.check(error, "InitProducerId", coordinator=True)
            self.producer_id, self.epoch = pid, epoch
            self.seqs.clear()  # a new producer id or epoch: every sequence starts at 0

        self.retrying(ask, f"InitProducerId of transactional.id {self.transactional_id!r}",
                      max(timeout, self.retry_timeout))

    def txn_coordinator(self) -> Connection:
        if self.transactional_id is None:
            raise KafkaSinkError(f"{self.who}: no transaction without a transactional.id "
                                 "(internal)")
        return self.connection(self.cluster.coordinator(self.transactional_id, TRANSACTION))

    def prepare(self, topic: str, group: str) -> None:
        """What the transaction will need, asked before the rows come: the target's leaders
        and the fact group's coordinator."""
        self.refresh(topic)
        self.retrying(lambda: self.group_coordinator(group), f"FindCoordinator of {group!r}",
                      self.retry_timeout)

    def group_coordinator(self, group: str) -> Connection:
        return self.connection(self.cluster.coordinator(group, GROUP))

    def refresh(self, topic: str, partitions: int = 0) -> None:
        """Metadata of ``topic`` from any live broker: every partition's leader (asked again
        while one of the first ``partitions``, or of all the broker names, has none)."""

        def ask() -> None:
            meta = self.cluster.metadata([topic])
            for name, answer in meta.topics.items():
                self.check(answer.error, f"Metadata of topic {name!r}")
            found = meta.topics[topic].leaders if topic in meta.topics else {}
            leaders = np.full(max(partitions, len(found)), -1, dtype=np.int64)
            for index, leader in found.items():
                if 0 <= index < len(leaders):
                    leaders[index] = leader
            if (leaders < 0).any():
                missing = np.flatnonzero(leaders < 0)[:5].tolist()
                raise WireError(f"{self.who}: partitions {missing} of {topic!r} have no leader",
                                5)
            self.leaders[topic] = leaders

        self.retrying(ask, f"Metadata of topic {topic!r}", self.retry_timeout)

    # -- the transaction ------------------------------------------------------------------------
    def add_partitions(self, topic: str, partitions: Iterable[int]) -> None:
        if self.tv2:  # each partition joins with its first Produce
            self.open = True
            return
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
                    self.check(int(code), f"AddPartitionsToTxn of {topic!r}",
                                coordinator=True)

        self.open = True  # from the first try: the coordinator may have added some
        self.retrying(ask, f"AddPartitionsToTxn of {len(todo)} partitions of {topic!r}",
                      self.retry_timeout)
        self.added.update((topic, p) for p in todo)

    def produce(self, topic: str, partition_count: int, values: pa.Array,
                keys: pa.Array | None, parts: np.ndarray, order: np.ndarray,
                header: tuple[str, bytes] | None = None) -> int:
        """Send the rows ``order`` (grouped by target partition) to ``topic`` (in this
        transaction, if transactional) and return once every batch is acknowledged; returns
        the number of records. ``header``: a recovery key on each record
        (``wire_encode.encode``)."""
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
        wire_send.Sender(self, topic, partition_count, memoryview(data)).run(pending)
        return int(batches[:, 3].sum())

    def send_offset(self, group: str, topic: str, partition: int, offset: int,
                    metadata: str) -> None:
        """``send_offsets_to_transaction`` of one offset: AddOffsetsToTxn, then
        TxnOffsetCommit to the group's coordinator."""
        if self.tv2:  # the group joins with the TxnOffsetCommit
            self.open = True
            body = flexible.txn_offset_commit(
                str(self.transactional_id), group, self.producer_id, self.epoch, topic,
                partition, offset, metadata)
            self._commit_offset(group, body, TV2_VERSIONS[TXN_OFFSET_COMMIT])
            return
        ids = struct.pack(">qh", self.producer_id, self.epoch)

        def add() -> None:
            r = self.txn_coordinator().call(ADD_OFFSETS, string(self.transactional_id) + ids
                                            + string(group))
            _, error = r.take(">ih")
            self.check(error, f"AddOffsetsToTxn of group {group!r}", coordinator=True)

        self.open = True
        self.retrying(add, f"AddOffsetsToTxn of group {group!r}", self.retry_timeout)
        body = (string(self.transactional_id) + string(group) + ids + struct.pack(">i", 1)
                + string(topic) + struct.pack(">iiqi", 1, partition, offset, -1)
                + string(metadata))

        self._commit_offset(group, body, VERSIONS[TXN_OFFSET_COMMIT])

    def _commit_offset(self, group: str, body: bytes, version: int) -> None:
        def commit() -> None:
            r = self.group_coordinator(group).call(TXN_OFFSET_COMMIT, body, version=version)
            if version >= TV2_VERSIONS[TXN_OFFSET_COMMIT]:
                errors = flexible.txn_offset_commit_errors(r)
            else:
                r.take(">i")  # throttle
                errors = []
                for _ in range(r.take(">i")):
                    r.string()
                    errors.extend(r.take(">ih")[1] for _ in range(r.take(">i")))
            for error in errors:
                if error in COORDINATOR_MOVED:
                    self.cluster.forget(group, GROUP)
                self.check(error, f"TxnOffsetCommit of group {group!r}")

        self.retrying(commit, f"TxnOffsetCommit of group {group!r}", self.retry_timeout)

    def end(self, commit: bool) -> None:
        """``EndTxn``: commit or abort what this attempt added. Sent again after a lost
        answer: the coordinator answers a repeated EndTxn of the same outcome with success
        (under transactions v2 too: it knows the epoch it bumped)."""
        v2 = bool(self.tv2)
        version = TV2_VERSIONS[END_TXN] if v2 else VERSIONS[END_TXN]
        body = (flexible.end_txn(str(self.transactional_id), self.producer_id, self.epoch,
                                      commit) if v2 else string(self.transactional_id)
                + struct.pack(">qhb", self.producer_id, self.epoch, 1 if commit else 0))

        def ask() -> None:
            r = self.txn_coordinator().call(END_TXN, body, version=version)
            error, pid, epoch = (flexible.end_txn_answer(r) if v2
                                 else (r.take(">ih")[1], -1, -1))
            self.check(error, "EndTxn", coordinator=True)
            if pid >= 0:  # v2: the epoch the markers carry, the next transaction's
                self.producer_id, self.epoch = pid, epoch
                self.seqs.clear()

        self.retrying(ask, "EndTxn (commit)" if commit else "EndTxn (abort)",
                      self.retry_timeout)
        self.open = False

    # -- errors ---------------------------------------------------------------------------------
    def check(self, code: int, request: str, coordinator: bool = False) -> None:
        if code == 0:
            return
        if coordinator and code in COORDINATOR_MOVED and self.transactional_id is not None:
            self.cluster.forget(self.transactional_id, TRANSACTION)
        name = ERRORS.get(code, f"error {code}")
        if code in FENCED:
            raise WireError(f"{self.who}: {request}: {name}: a newer attempt of this task "
                            f"fenced transactional.id {self.transactional_id!r}", code)
        raise WireError(f"{self.who}: {request}: {name}", code)

    def backoff(self, attempt: int, reconnect: bool = False) -> float:
        return self.cluster.backoff(attempt, reconnect)

    def retrying(self, ask: Callable[[], T], what: str, timeout: float) -> T:
        """``ask()`` until it succeeds, a non-retriable error, or ``timeout`` (the wire
        client's retry: a lost connection is retriable and every coordinator is found again).
        CONCURRENT_TRANSACTIONS, the previous transaction's markers still being written,
        ends on the broker's time, not ours: it is polled at a short, fixed interval (Java
        polls AddPartitionsToTxn at 20 ms) instead of doubling to 1 s, which overshot their
        end by up to a second per task."""
        return self.cluster.retrying(ask, what, timeout,
                                     poll={CONCURRENT_TRANSACTIONS: CONCURRENT_POLL})
