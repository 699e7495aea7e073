"""The wire producer's state and rules, with no I/O (docs/design.md, "The wire producer's
state"): the :class:`ProducerState` machine, the producer id and epoch, and a
:class:`~connectors.kafka.wire.partition.PartitionState` per partition written.
:class:`~connectors.kafka.wire.producer.WireProducer` speaks for it; the model-based tests
(tests/unit/test_kafka_wire_model.py) drive it against a model of the brokers' answers.

Every change of state goes through :meth:`Producer.to`, which refuses a transition the
table :data:`TRANSITIONS` does not hold, naming both states. The states, as librdkafka's
``rd_kafka_txn_state_t`` and ``rd_kafka_idemp_state_t`` and the Java producer's
``TransactionManager.State`` name theirs::

    UNINITIALISED --InitProducerId--> READY
    READY --first partition or offset of a transaction--> IN_TRANSACTION
    IN_TRANSACTION --EndTxn(commit)--> COMMITTING --answered--> READY
    IN_TRANSACTION | ABORTABLE --EndTxn(abort)--> ABORTING --answered--> READY
    IN_TRANSACTION | COMMITTING --a send or commit refused--> ABORTABLE
    READY --an idempotent send failed with a sequence spent and unsettled--> RESET
    RESET --InitProducerId (a new producer id)--> READY
    any but CLOSED --fenced by a newer epoch--> FENCED;  --an unknown outcome--> FATAL
    any --close--> CLOSED

A FENCED, FATAL or CLOSED producer sends nothing more: :meth:`Producer.requests` hands out
nothing outside :data:`SENDING`, and every request of :class:`~connectors.kafka.wire.
producer.WireProducer` asks :meth:`Producer.expect` first.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from connectors.kafka.wire.partition import MAX_IN_FLIGHT, Batch, PartitionState
from connectors.kafka.wire.protocol import ERRORS, FENCED, WireError
from connectors.kafka.wire.record_batch import MAX_REQUEST_BYTES
from connectors.kafka.wire.requests import TopicMetadata

#: A transaction the broker gave up on (Kafka 4): abort it.
TRANSACTION_ABORTABLE = 120


class ProducerState(enum.Enum):
    """Where a producer is (the module's docstring draws the machine)."""

    UNINITIALISED = "uninitialised"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE = "abortable"
    RESET = "reset"
    FENCED = "fenced"
    FATAL = "fatal"
    CLOSED = "closed"


S = ProducerState
#: Every legal transition: state -> the states it may become.
TRANSITIONS: dict[ProducerState, frozenset[ProducerState]] = {
    S.UNINITIALISED: frozenset({S.READY, S.FATAL, S.CLOSED}),
    S.READY: frozenset({S.IN_TRANSACTION, S.RESET, S.FENCED, S.FATAL, S.CLOSED}),
    S.IN_TRANSACTION: frozenset({S.COMMITTING, S.ABORTING, S.ABORTABLE, S.FENCED, S.FATAL,
                                 S.CLOSED}),
    S.COMMITTING: frozenset({S.READY, S.ABORTABLE, S.FENCED, S.FATAL, S.CLOSED}),
    S.ABORTING: frozenset({S.READY, S.FENCED, S.FATAL, S.CLOSED}),
    S.ABORTABLE: frozenset({S.ABORTING, S.FENCED, S.FATAL, S.CLOSED}),
    S.RESET: frozenset({S.READY, S.FATAL, S.CLOSED}),
    S.FENCED: frozenset({S.CLOSED}),
    S.FATAL: frozenset({S.CLOSED}),
    S.CLOSED: frozenset(),
}
#: The states in which a producer sends records.
SENDING = frozenset({S.READY, S.IN_TRANSACTION})


class IllegalTransition(WireError):
    """A producer was asked to change state in a way the machine does not allow (internal):
    it refuses rather than send from the wrong state."""

    def __init__(self, who: str, source: ProducerState, target: ProducerState,
                 doing: str = "") -> None:
        super().__init__(f"{who}: the wire producer cannot go from {source.name} to "
                         f"{target.name}{f' ({doing})' if doing else ''} (internal)", -1)
        self.source, self.target = source, target


class Producer:
    """A producer's state and rules, without I/O (see the module's docstring).
    ``transactional_id`` None: an idempotent producer."""

    def __init__(self, transactional_id: str | None, who: str) -> None:
        self.transactional_id = transactional_id
        self.who = who
        self.state = S.UNINITIALISED
        self.producer_id, self.epoch = -1, -1
        #: Transactions v2 (KIP-890 part 2): decided at the first InitProducerId, kept for the
        #: producer's life (a transaction never changes version half-way).
        self.tv2: bool | None = None
        self.partitions: dict[tuple[str, int], PartitionState] = {}
        #: Produce requests waiting for their answer, per node (at most MAX_IN_FLIGHT).
        self.waiting: Counter[int] = Counter()
        #: Transitions taken, for the model-based tests' statistics and for debugging.
        self.moves: Counter[tuple[ProducerState, ProducerState]] = Counter()

    @property
    def transactional(self) -> bool:
        return self.transactional_id is not None

    def __repr__(self) -> str:
        return (f"Producer({self.transactional_id!r}, {self.state.name}, id "
                f"{self.producer_id}, epoch {self.epoch})")

    # -- the machine -----------------------------------------------------------------------------
    def to(self, target: ProducerState, doing: str = "") -> None:
        """The one way to change state: refuses what :data:`TRANSITIONS` does not hold."""
        if target not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.who, self.state, target, doing)
        self.moves[(self.state, target)] += 1
        self.state = target

    def expect(self, states: Iterable[ProducerState], doing: str) -> None:
        """Refuse ``doing`` outside ``states`` (a fenced or failed producer sends nothing)."""
        allowed = frozenset(states)
        if self.state not in allowed:
            names = "/".join(sorted(s.name for s in allowed))
            raise IllegalTransition(self.who, self.state, next(iter(allowed)),
                                    f"{doing} needs {names}")

    @property
    def open(self) -> bool:
        """A transaction began and was not ended: it must be aborted."""
        return self.state in (S.IN_TRANSACTION, S.ABORTABLE)

    @property
    def uncertain(self) -> bool:
        """Produce requests whose outcome is unknown (sent on a connection lost before their
        answer, never settled since): an abort must not race them."""
        return any(p.unresolved for p in self.partitions.values())

    # -- identity --------------------------------------------------------------------------------
    def identified(self, producer_id: int, epoch: int,
                   known: Callable[[int, str, int], bool]) -> None:
        """InitProducerId answered: a producer id and epoch whose sequences start at 0 on
        every partition. ``known(producer_id, topic, partition)``: whether the broker knows
        the id there (it refuses a gap in a new epoch of an id it knows)."""
        self.to(S.READY, "InitProducerId")
        self._new_identity(producer_id, epoch, known)

    def _new_identity(self, producer_id: int, epoch: int,
                      known: Callable[[int, str, int], bool]) -> None:
        self.producer_id, self.epoch = producer_id, epoch
        for p in self.partitions.values():
            p.reset(known(producer_id, p.topic, p.partition))
        self.waiting.clear()

    # -- records ---------------------------------------------------------------------------------
    def partition(self, topic: str, index: int) -> PartitionState:
        key = (topic, index)
        p = self.partitions.get(key)
        if p is None:
            p = self.partitions[key] = PartitionState(topic, index)
        return p

    def take_leaders(self, topic: str, meta: TopicMetadata) -> None:
        """A Metadata answer of ``topic``: its partitions' leaders and epochs."""
        for p in self.partitions.values():
            if p.topic == topic:
                p.leader = meta.leaders.get(p.partition, -1)
                p.leader_epoch = meta.epochs.get(p.partition, -1)
                p.stale = False

    def next_sequences(self, topic: str, count: int) -> np.ndarray:
        """The next sequence of each partition ``0 .. count - 1`` of ``topic`` (0 for one not
        written yet)."""
        out = np.zeros(count, np.int64)
        for p in self.partitions.values():
            if p.topic == topic and p.partition < count:
                out[p.partition] = p.next_seq
        return out

    def spend(self, topic: str, data: bytearray, batches: np.ndarray, partitions: np.ndarray,
              leaders: Mapping[int, int], known: Callable[[int, str, int], bool]) -> list[Batch]:
        """The encoded ``batches`` (rows of (group, start, end, records)) of ``data``, group
        ``g`` for partition ``partitions[g]``, each given its partition's next sequence; a
        partition with nothing in flight takes its leader from ``leaders``; a partition new to
        the producer learns from ``known(producer_id, topic, partition)`` whether the broker
        knows the producer id there."""
        self.expect(SENDING, "records")
        view = memoryview(data)
        out = []
        for group, start, end, records in batches.tolist():
            index = int(partitions[group])
            p = self.partitions.get((topic, index))
            if p is None:
                p = self.partitions[(topic, index)] = PartitionState(
                    topic, index, known=known(self.producer_id, topic, index))
            if not p.in_flight and not p.stale:
                p.leader = leaders.get(index, -1)
            batch = Batch(topic, index, p.next_seq, records, view[start:end])
            p.spend(batch)
            out.append(batch)
        return out

    def joined(self) -> None:
        """The first partition or offset of a transaction: it is open from here."""
        if self.state is S.READY:
            self.to(S.IN_TRANSACTION, "a transaction's first partition")
        self.expect({S.IN_TRANSACTION}, "adding to the transaction")

    def to_add(self, topic: str) -> list[int]:
        """Transactions v1: the partitions of ``topic`` with records to send that are not in
        the transaction yet (AddPartitionsToTxn first)."""
        return sorted(p.partition for p in self.partitions.values()
                      if p.topic == topic and p.queue and not p.added)

    def added(self, topic: str, partitions: Iterable[int]) -> None:
        for index in partitions:
            self.partition(topic, index).added = True

    def requests(self, topic: str, now: float,
                 max_bytes: int = MAX_REQUEST_BYTES) -> list[tuple[int, list[Batch]]]:
        """The Produce requests that may go now, in send order: ``(leader node, batches)``,
        at most one batch per partition each, at most ``max_bytes``, at most
        :data:`MAX_IN_FLIGHT` waiting per node; their batches count as in flight from here.
        None while the producer may not send, or a batch of ``topic`` was refused."""
        mine = sorted((p for p in self.partitions.values() if p.topic == topic),
                      key=lambda p: p.partition)
        if self.state not in SENDING or any(p.refused is not None for p in mine):
            return []
        v1 = self.transactional and not self.tv2
        out: list[tuple[int, list[Batch]]] = []
        while True:
            round_: dict[int, list[Batch]] = {}
            sizes: Counter[int] = Counter()
            for p in mine:
                batch = p.sendable(now)
                if batch is None or (v1 and not p.added):
                    continue
                node = p.leader
                if node not in round_ and self.waiting[node] >= MAX_IN_FLIGHT:
                    continue
                if sizes[node] and sizes[node] + len(batch.data) > max_bytes:
                    continue
                round_.setdefault(node, []).append(batch)
                sizes[node] += len(batch.data)
                p.sent(batch, node)
                if self.transactional:
                    p.added = True  # v2: the partition joins with this Produce
            if not round_:
                return out
            for node, batches in round_.items():
                self.waiting[node] += 1
                out.append((node, batches))

    def answered(self, node: int, batch: Batch, code: int, now: float, pause: float,
                 error: WireError | None = None) -> bool:
        """The answer ``code`` to ``batch``'s send (its request already :meth:`finished`);
        True when the batch is settled."""
        return self.partition(batch.topic, batch.partition).answered(batch, code, now, pause,
                                                                     error)

    def finished(self, node: int) -> None:
        """A Produce request to ``node`` got its answer, or its connection was lost."""
        if self.waiting[node] > 0:
            self.waiting[node] -= 1

    def lost(self, node: int, now: float, pause: float,
             unsent: Iterable[Batch] = ()) -> list[Batch]:
        """The connection to ``node`` broke: every batch in flight there goes again, its
        outcome unknown, but ``unsent`` (handed out for a request no connection took);
        returns them."""
        self.waiting[node] = 0
        never = frozenset(id(b) for b in unsent)
        gone: list[Batch] = []
        for p in self.partitions.values():
            gone += p.lost(node, now, pause, never)
        return gone

    def settled(self, topic: str) -> bool:
        return all(p.settled for p in self.partitions.values() if p.topic == topic)

    def refusal(self, topic: str) -> WireError | None:
        """The first refused batch's error, by partition."""
        for p in sorted(self.partitions.values(), key=lambda p: p.partition):
            if p.topic == topic and p.refused is not None:
                return p.refused
        return None

    def failed(self, error: WireError) -> None:
        """A produce call gave up (a refusal, or ``message.timeout.ms``), nothing of it in
        flight any more but on lost connections: the batches never sent give their sequences
        back, and the producer moves on as librdkafka's and Java's do: a transaction must
        abort (ABORTABLE), or FENCED; an idempotent producer with a sequence spent and not
        acknowledged takes a new producer id before its next records (RESET)."""
        for p in self.partitions.values():
            p.release_unsent()
        if self.state not in SENDING:
            return
        if error.code in FENCED and self.transactional:
            self.to(S.FENCED, "a produce fenced")
        elif self.transactional:
            if self.state is S.READY:
                self.to(S.IN_TRANSACTION, "a produce failed")
            self.to(S.ABORTABLE, "a produce failed")
        elif not all(p.clean for p in self.partitions.values()):
            self.to(S.RESET, "a produce failed")

    # -- the end of a transaction ----------------------------------------------------------------
    def ending(self, commit: bool) -> None:
        if commit:
            self.expect({S.IN_TRANSACTION}, "commit")
            if not all(p.clean for p in self.partitions.values()):
                raise IllegalTransition(self.who, self.state, S.COMMITTING,
                                        "commit with records not acknowledged")
            self.to(S.COMMITTING, "EndTxn")
        else:
            self.to(S.ABORTING, "EndTxn")

    def ended(self, producer_id: int, epoch: int,
              known: Callable[[int, str, int], bool]) -> None:
        """EndTxn answered; under transactions v2 with the bumped epoch, every sequence then
        starts at 0 again."""
        self.to(S.READY, "EndTxn answered")
        if producer_id >= 0:
            self._new_identity(producer_id, epoch, known)
        else:
            for p in self.partitions.values():
                p.added = False
                p.queue.clear()  # unsent or lost batches of an aborted transaction

    def gave_up(self, error: WireError) -> None:
        """A transactional request (AddPartitionsToTxn, TxnOffsetCommit, EndTxn) failed for
        good. Fenced: FENCED. Inside the transaction, or a commit the broker answered
        TRANSACTION_ABORTABLE: the transaction must abort (ABORTABLE). A commit or abort whose
        outcome nobody knows: FATAL (the next attempt's InitProducerId settles it)."""
        name = ERRORS.get(error.code, str(error.code))
        if self.state in (S.FENCED, S.FATAL, S.CLOSED):
            return
        if error.code in FENCED:
            self.to(S.FENCED, name)
        elif self.state is S.IN_TRANSACTION or (
                self.state is S.COMMITTING and error.code == TRANSACTION_ABORTABLE):
            self.to(S.ABORTABLE, name)
        elif self.state is not S.ABORTABLE:
            self.to(S.FATAL, name)

    def close(self) -> None:
        if self.state is not S.CLOSED:
            self.to(S.CLOSED)
