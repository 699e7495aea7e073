"""How the Kafka sink's records reach the brokers (docs/design.md, "Kafka sink: transports").

A :class:`Transport` serves one task attempt. The task's driver
(:class:`connectors.kafka.sink.writer.KafkaWriter`) runs every transport through the same
steps: ``fence``, ``begin``, ``send`` chunk after chunk, ``flush``, then ``commit`` with the
commit fact, or ``abort``. Two implementations:

- :class:`connectors.kafka.sink.wire_transport.WireTransport`: record batches built from the
  Arrow buffers and sent with Kafka's own requests (the wire client,
  :mod:`connectors.kafka.wire`);
- :class:`connectors.kafka.sink.librdkafka_transport.LibrdkafkaTransport`: confluent-kafka's
  producer. Its hand-off (``rd_kafka_produce_batch``, the keyed C loop, or ``produce()``) is
  one strategy, chosen when it opens.

Which one a sink's tasks use is decided once, on the driver, by :func:`choose`, from the
options and the schema. Only what one machine or broker can tell is checked where the
transport opens: whether the C extension is built on this worker, and whether the broker
speaks the wire client's requests.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from connectors.core import failpoints
from connectors.core.sink import TaskInfo
from connectors.kafka import clients
from connectors.kafka.common import FAMILY
from connectors.kafka.sink import commit_facts
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.rows import Routing, Rows

#: Failpoint after ``#n`` records of an attempt are sent (acknowledged, or queued and
#: flushed; see the KafkaSink docstring).
FP_MID_PRODUCE = "kafka_sink.mid_produce"


@dataclass(frozen=True)
class ProducePath:
    """The produce path of a sink's tasks, chosen on the driver (:func:`choose`)."""

    #: Record batches on the wire; else librdkafka.
    wire: bool
    #: The rows carry a ``headers`` column (the wire path writes no user headers, and the
    #: librdkafka batch call takes none).
    headers: bool = False


def choose(options: KafkaSinkOptions, schema: pa.Schema | None) -> ProducePath:
    """The produce path the options and the schema (None: not known) allow; the reason for
    not taking the wire path is logged once per process."""
    headers = schema is not None and "headers" in schema.names
    if not options.wire_produce:
        return ProducePath(False, headers)
    if headers:
        why: str | None = "a headers column (the wire path writes no user headers)"
    elif options.transactional and (options.topic is None or options.recovery_key_headers):
        # A topic column or recovery keys need the whole task first (writer.chunks), and
        # those tasks have always gone through librdkafka.
        why = ("a transactional task that needs its whole input first (a topic column, or "
               "recoveryKeyHeaders=true)")
    else:
        why = clients.produce_refusal(options.producer_conf)
    if why is not None:
        note_librdkafka(f"{FAMILY} {options.sink_id}: {why}")
        return ProducePath(False, headers)
    return ProducePath(True, headers)


def note_librdkafka(why: str) -> None:
    """Say once per process and reason that records go through librdkafka."""
    clients.note_once(f"{why}; records go through librdkafka, not as record batches")


def wire_here(path: ProducePath, options: KafkaSinkOptions) -> bool:
    """The driver chose the wire path, and this worker can take it (its C extension is
    built: a cluster's workers need not match the driver)."""
    if not path.wire:
        return False
    why = clients.produce_refusal(options.producer_conf)
    if why is not None:
        note_librdkafka(f"{FAMILY} {options.sink_id}: {why}")
    return why is None


@dataclass
class Chunk:
    """Rows of a task routed and ready to send: ``order`` are the rows to send, in send
    order (grouped by target partition, ascending seq within each)."""

    rows: Rows
    routing: Routing
    order: np.ndarray


class Transport(abc.ABC):
    """One task attempt's way to the brokers: the steps the task driver calls, in order."""

    #: Arrow bytes a streaming task gathers into one chunk before sending it (0: each Arrow
    #: batch as Spark hands it over).
    chunk_bytes = 0
    #: Rows per send call (0: no bound); bounds what one call encodes at once.
    piece_rows = 0

    def __init__(self, options: KafkaSinkOptions, task: TaskInfo) -> None:
        self.options = options
        self.task = task

    @property
    def uncertain(self) -> bool:
        """Requests whose outcome is unknown (sent, never answered): an abort must not race
        them (docs/design.md, "The wire client's failures")."""
        return False

    @abc.abstractmethod
    def fence(self) -> None:
        """2T. Fence earlier attempts of the task's transactional.id (a transactional
        transport; an idempotent one has nothing to fence)."""

    @abc.abstractmethod
    def read_fact(self, batch_id: int, scope: str,
                  timeout: float) -> commit_facts.CommitFact | None:
        """2T. (after the fence) The commit fact of the task's (``batch_id``, writer) in
        ``scope`` if an earlier attempt's transaction committed it, else None: one stable
        OffsetFetch of the writer's fact group."""

    @abc.abstractmethod
    def begin(self) -> None:
        """Before the first record."""

    def send(self, chunk: Chunk, done: int, prefix: bytes | None) -> int:
        """Send ``chunk.order``, in that order, each with a recovery-key header of ``prefix``
        and its seq (None: no header); returns the number of records. ``done`` records of the
        attempt went before: the ``mid_produce`` failpoint fires at its exact count."""
        armed = failpoints.wants_count(FP_MID_PRODUCE)
        count = done
        for topic, piece in pieces(chunk.rows, chunk.order, done, armed, self.piece_rows):
            count += self.send_piece(chunk, topic, piece, prefix)
            if armed is not None and count >= armed:
                if count == armed:
                    # Make "n records written" literally true before crashing, so a retry
                    # really has to skip them (a test of the dedupe, not of luck).
                    self.settle_queued()
                failpoints.hit(FP_MID_PRODUCE, self.task.batch_id, count)
        return count - done

    @abc.abstractmethod
    def send_piece(self, chunk: Chunk, topic: str, piece: np.ndarray,
                   prefix: bytes | None) -> int:
        """Send the rows ``piece`` of ``chunk`` (one topic) to ``topic``."""

    @abc.abstractmethod
    def settle_queued(self) -> None:
        """Wait until what was sent so far is delivered (the ``mid_produce`` failpoint)."""

    @abc.abstractmethod
    def flush(self) -> None:
        """3. (end) Every record sent is delivered; fail the task on any delivery error."""

    @abc.abstractmethod
    def commit(self, fact: commit_facts.CommitFact) -> None:
        """3T. (end) Add the commit fact to the transaction and commit it."""

    @abc.abstractmethod
    def abort(self) -> bool:
        """The attempt failed: settle or give up what it sent; True when this aborted an
        open transaction."""

    def explain(self, error: BaseException) -> Exception | None:
        """A clearer error for ``error`` (an access denial names the ACL), or None."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """The attempt is over, failed or not."""


def pieces(rows: Rows, todo: np.ndarray, done: int, armed: int | None,
           most: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """``(topic, piece)`` in send order: ``todo`` (grouped by target) cut at each change of
    topic, at the ``mid_produce`` failpoint's count (``done`` records went before), and into
    pieces of at most ``most`` rows (0: no bound). Every piece is sent whole before the next
    is asked for."""
    count = done
    topic_of = rows.topic_idx[todo]
    for run in np.split(todo, np.flatnonzero(np.diff(topic_of)) + 1):
        if not len(run):
            continue
        cuts = set(range(most, len(run), most)) if most else set()
        if armed is not None and count < armed < count + len(run):
            cuts.add(armed - count)
        topic = rows.topics[int(rows.topic_idx[run[0]])]
        for piece in np.split(run, sorted(cuts)):
            yield topic, piece
        count += len(run)
