"""What the producer knows of one partition it writes: its leader, its sequences, the record
batches it holds, and what the broker knows of the producer there (docs/design.md, "The
wire producer's state").

This is librdkafka's ``rd_kafka_toppar_t`` idempotence fields and franz-go's per-partition
record buffer (``recBuf``): the next sequence to give, the first one not yet acknowledged,
the batches waiting and in flight in sequence order, whether the partition joined the open
transaction, and whether the broker knows the producer id there. No I/O: the sender
(:mod:`connectors.kafka.wire.sender`) asks :meth:`PartitionState.sendable` what may go and
reports every answer, loss and refusal back, and the rules below decide.

The rules, each the Java producer's and librdkafka's:

- **A sequence is spent only by the batch it was given to.** A batch is encoded once, with
  its producer id, epoch and base sequence in its bytes (:meth:`spend` checks them), and
  every send of it sends those bytes: a retriable failure never re-encodes, never gives
  its sequence to other rows. Sequences of batches that were never sent go back when a
  produce call fails (:meth:`release_unsent`); a sent one stays spent.
- **In sequence order, without a gap**: the next batch to send directly follows the last
  one in flight, or, with nothing in flight, is the first one not acknowledged. So after a
  retriable answer nothing more goes until every batch in flight is answered and the
  backoff has passed; then the failed batch goes first.
- **At most five in flight** (:data:`MAX_IN_FLIGHT`, what a broker keeps per producer and
  partition to recognise a duplicate), and **one** while the broker may not know the
  producer id there (:attr:`known`): a broker takes any first sequence from a producer id
  it does not know, so a second batch taken before a first that was refused for now would
  leave the first out of order for good.
- **Answers**: acknowledged or ``DUPLICATE_SEQUENCE_NUMBER`` (the broker has this very
  batch from an earlier send): done, and the broker knows the producer id. A retriable
  error, or ``OUT_OF_ORDER_SEQUENCE_NUMBER`` for a batch behind one not yet acknowledged:
  sent again, same bytes, after a backoff. ``OUT_OF_ORDER_SEQUENCE_NUMBER`` for the first
  batch not acknowledged (a real gap in the broker's log), ``UNKNOWN_PRODUCER_ID`` (the
  broker lost the producer's state), a fencing error or any other error: refused; the
  producer call fails once nothing is in flight, and the producer must abort its
  transaction or take a new producer id (:class:`connectors.kafka.wire.state.Producer`).
- **A connection lost** under batches in flight: their outcome is unknown; they are sent
  again, same bytes, and whichever copy reaches the broker second is dropped there. Until
  an answer settles them, the partition is :attr:`unresolved`.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from connectors.kafka.wire.protocol import (
    DUPLICATE_SEQUENCE,
    OUT_OF_ORDER_SEQUENCE,
    RETRIABLE,
    STALE_LEADER,
    WireError,
)
from connectors.kafka.wire.record_batch import base_sequence

#: Batches of one partition in flight at most (Java's ``max.in.flight.requests.per.connection``
#: and librdkafka's cap for an idempotent producer): a broker remembers the last five batches
#: of a producer on a partition, so every resend falls inside the window it deduplicates.
MAX_IN_FLIGHT = 5



@dataclass(eq=False)
class Batch:
    """One record batch of one partition, encoded once: ``data`` carries its producer id,
    epoch and base sequence ``seq``, and every send of it sends these bytes."""

    topic: str
    partition: int
    seq: int
    records: int
    data: memoryview
    #: How many times it was sent.
    sends: int = 0
    #: Sent on a connection that was lost before its answer: the broker may or may not have
    #: it, until an answer to a later send says.
    lost: bool = False

    @property
    def end(self) -> int:
        """The sequence after its last record."""
        return self.seq + self.records

    def __repr__(self) -> str:
        return f"Batch({self.topic}[{self.partition}] seq {self.seq}+{self.records})"


class SequenceError(WireError):
    """A rule of the partition state was broken by the code that drives it (internal):
    the producer stops rather than send a sequence twice or out of order."""

    def __init__(self, message: str) -> None:
        super().__init__(f"the wire producer broke its own rule: {message} (internal)", -1)


@dataclass(eq=False)
class PartitionState:
    """One partition the producer writes (see the module's docstring for the rules)."""

    topic: str
    partition: int
    #: The broker knows the producer id here (a batch of it acknowledged): it refuses a gap
    #: in the sequences, so batches may pipeline.
    known: bool = False
    #: The leader's node id (-1: not known) and its leader epoch, from the last Metadata.
    leader: int = -1
    leader_epoch: int = -1
    #: The base sequence the next batch gets.
    next_seq: int = 0
    #: The first sequence not acknowledged (every one below it is).
    acked: int = 0
    #: Batches to send, for the first time or again, in sequence order.
    queue: deque[Batch] = field(default_factory=deque)
    #: Batches sent and not answered, in sequence order, and the node they went to.
    in_flight: deque[Batch] = field(default_factory=deque)
    node: int = -1
    #: In the open transaction (transactions v1: AddPartitionsToTxn answered; v2: its first
    #: Produce sent).
    added: bool = False
    #: Not before this time (the clock's) is anything sent again after a retriable answer;
    #: ``retries`` such answers in a row (the backoff doubles).
    retry_at: float = 0.0
    retries: int = 0
    #: The answer that refused a batch: nothing more is sent to this partition.
    refused: WireError | None = None
    #: The leader must be asked again before the next send.
    stale: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition

    def __repr__(self) -> str:
        return (f"PartitionState({self.topic}[{self.partition}] next {self.next_seq} acked "
                f"{self.acked} queue {len(self.queue)} in flight {len(self.in_flight)})")

    # -- sequences -------------------------------------------------------------------------------
    def spend(self, batch: Batch) -> None:
        """Give ``batch`` the next sequence: its bytes must carry it."""
        if batch.seq != self.next_seq or base_sequence(batch.data) != batch.seq % (1 << 31):
            raise SequenceError(f"{batch!r} does not carry {self.topic}[{self.partition}]'s "
                                f"next sequence {self.next_seq}")
        if self.refused is not None:
            raise SequenceError(f"{batch!r} added to a partition that refused a batch")
        self.next_seq += batch.records
        self.queue.append(batch)

    def release_unsent(self) -> int:
        """A produce call failed: the batches never sent give their sequences back (the
        broker never saw them); returns how many. Batches sent at least once stay spent."""
        released = 0
        while self.queue and self.queue[-1].sends == 0:
            batch = self.queue.pop()
            self.next_seq = batch.seq
            released += 1
        return released

    def reset(self, known: bool) -> None:
        """A new producer id or epoch: sequences start at 0 again and nothing of the old one
        is sent any more (its batches carry the old identity in their bytes)."""
        self.queue.clear()
        self.in_flight.clear()
        self.next_seq = self.acked = 0
        self.retries, self.retry_at = 0, 0.0
        self.refused = None
        self.added = False
        self.known = known

    # -- sending ---------------------------------------------------------------------------------
    @property
    def limit(self) -> int:
        """Batches that may be in flight at once."""
        return MAX_IN_FLIGHT if self.known else 1

    def sendable(self, now: float) -> Batch | None:
        """The batch that may be sent now, or None."""
        if not self.queue or self.refused is not None or self.leader < 0 or self.stale:
            return None
        if now < self.retry_at or len(self.in_flight) >= self.limit:
            return None
        head = self.queue[0]
        follows = self.in_flight[-1].end if self.in_flight else self.acked
        if head.seq != follows:
            return None  # a batch before it waits to be sent again: after it, not before
        if self.in_flight and self.node != self.leader:
            return None  # the leader moved under batches in flight: they settle first
        return head

    def sent(self, batch: Batch, node: int) -> None:
        """``batch`` (the head of the queue, :meth:`sendable`) went to ``node``."""
        if not self.queue or self.queue[0] is not batch:
            raise SequenceError(f"{batch!r} sent out of its partition's order")
        self.queue.popleft()
        self.in_flight.append(batch)
        self.node = node
        batch.sends += 1

    # -- answers ---------------------------------------------------------------------------------
    def answered(self, batch: Batch, code: int, now: float, pause: float,
                 error: WireError | None = None) -> bool:
        """The broker's answer ``code`` for ``batch``; True when it is settled (appended, or
        the broker had it already). ``pause``: the backoff before a resend; ``error``: the
        refusal to keep if the answer refuses the batch."""
        if not self.in_flight or self.in_flight[0] is not batch:
            raise SequenceError(f"an answer for {batch!r}, which is not the first of its "
                                "partition in flight")
        self.in_flight.popleft()
        if code in (0, DUPLICATE_SEQUENCE):
            if batch.seq != self.acked:
                raise SequenceError(f"{batch!r} acknowledged before sequence {self.acked}")
            self.acked = batch.end
            self.known = True
            self.retries = 0
            batch.lost = False
            return True
        behind = code == OUT_OF_ORDER_SEQUENCE and batch.seq != self.acked
        if code in RETRIABLE or behind:
            self.again(batch, now, pause)
            if code in STALE_LEADER:
                self.stale = True
            return False
        self.refused = error if error is not None else WireError(
            f"Produce to {self.topic}[{self.partition}] refused", code)
        self.queue.appendleft(batch)  # sent and refused: spent, never sent again
        return False

    def again(self, batch: Batch, now: float, pause: float) -> None:
        """Send ``batch`` again, in its place in sequence order, not before ``pause``."""
        at = bisect.bisect_left([b.seq for b in self.queue], batch.seq)
        self.queue.insert(at, batch)
        self.backoff(now, pause)

    def backoff(self, now: float, pause: float) -> None:
        """Wait ``pause`` before sending again (one more retry in a row), unless already
        waiting: the batches behind a failed one fail with it, one retry for all."""
        if self.retry_at <= now:
            self.retries += 1
            self.retry_at = now + pause

    def lost(self, node: int, now: float, pause: float,
             unsent: frozenset[int] = frozenset()) -> list[Batch]:
        """The connection to ``node`` was lost under this partition's batches in flight:
        every one of them is sent again, its outcome unknown (but those whose ``id`` is in
        ``unsent``: handed out, never written to a connection); returns them."""
        if not self.in_flight or self.node != node:
            return []
        gone = list(self.in_flight)
        self.in_flight.clear()
        for batch in reversed(gone):
            if id(batch) in unsent:
                batch.sends -= 1
            else:
                batch.lost = True
            self.queue.appendleft(batch)
        self.backoff(now, pause)
        self.stale = True
        return gone

    # -- what is left ----------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        """Nothing to send and nothing in flight."""
        return not self.queue and not self.in_flight

    @property
    def unresolved(self) -> bool:
        """A batch sent on a lost connection and not settled since: the broker may still
        append it (a request of it in the network), or may have."""
        return any(b.lost for b in self.queue) or any(b.lost for b in self.in_flight)

    @property
    def clean(self) -> bool:
        """Every sequence spent here is acknowledged: the partition can go on as it is."""
        return self.settled and self.refused is None and self.acked == self.next_seq
