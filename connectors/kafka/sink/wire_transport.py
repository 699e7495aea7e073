"""The Kafka sink's records as record batches on the wire: the
:class:`~connectors.kafka.sink.transport.Transport` over the wire client's producer
(:class:`connectors.kafka.wire.producer.WireProducer`, docs/design.md, "Record batches on the
wire" and "Kafka sink: transports"). This adapter is all the sink holds of the wire client.

Every send returns once the brokers acknowledged its records (or fails with nothing of its
own left in flight: :mod:`connectors.kafka.wire.sender`), so ``flush`` has nothing to wait
for and the ``mid_produce`` failpoint counts acknowledged records.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from connectors.core.errors import KafkaSinkError, outage
from connectors.core.sink import TaskInfo
from connectors.kafka import access, clients
from connectors.kafka.common import FAMILY, ClientCache, Lease
from connectors.kafka.sink import commit_facts, producers, recovery
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.transport import Chunk, Transport
from connectors.kafka.wire import record_batch
from connectors.kafka.wire.producer import ProducerState, WireProducer
from connectors.kafka.wire.protocol import WireError

log = logging.getLogger(__name__)

#: Rows per send of the recovery-key mode (its chunk is the whole task): bounds the encoded
#: bytes a task holds at once.
WIRE_PIECE = 262_144

class Held:
    """A wire producer and the lease of the process's cluster it sends over, closed together
    (the cluster stays for its other users)."""

    def __init__(self, conf: Mapping[str, Any], transactional_id: str | None, who: str,
                 retry_timeout: float) -> None:
        self.cluster = clients.acquire(conf)
        try:
            self.producer = self.cluster.client.producer(conf, transactional_id, who,
                                                         retry_timeout)
        except BaseException:
            self.cluster.release()
            raise

    def close(self) -> None:
        self.producer.close()
        self.cluster.release()


#: Idempotent wire producers a worker keeps, one per sink configuration: a producer id
#: serves task after task (a new one per task would leave the broker a producer state per
#: partition for each, kept ``producer.id.expiration.ms``, a day by default).
_IDEMPOTENT: ClientCache[Held] = ClientCache(
    "wire idempotent producers", 4, lambda held: held.close(), exclusive=True)


def cached_idempotent(conf: Mapping[str, Any], who: str,
                      retry_timeout: float) -> Lease[Held]:
    """The worker's idempotent wire producer for ``conf`` (made on first use), held until
    ``Lease.release()``; ``Lease.discard()`` after an error that leaves it unusable. A
    producer that a failed send left RESET takes a new producer id here (librdkafka's
    idempotent producer does the same before its next message)."""
    key = tuple(sorted((str(k), str(v)) for k, v in conf.items()))

    def make() -> Held:
        held = Held(conf, None, who, retry_timeout)
        try:
            held.producer.init(retry_timeout)
        except BaseException:
            held.close()
            raise
        return held

    lease = _IDEMPOTENT.acquire(key, make)
    if lease.client.producer.state is ProducerState.RESET:
        try:
            lease.client.producer.init(retry_timeout)
        except BaseException:
            lease.discard()
            raise
    return lease


def sink_error(error: WireError) -> KafkaSinkError:
    """The wire client's ``error`` as the sink's (an outage where the client's retries ran out
    on a transient error)."""
    return (outage(KafkaSinkError, str(error)) if error.retriable
            else KafkaSinkError(str(error)))


class WireTransport(Transport):
    """A wire producer: the worker's cached idempotent one (:meth:`idempotent`), or a
    transactional one per task attempt (:meth:`transactional`)."""

    def __init__(self, options: KafkaSinkOptions, task: TaskInfo, held: Held,
                 lease: Lease[Held] | None = None) -> None:
        super().__init__(options, task)
        self.held = held
        self.producer: WireProducer = held.producer
        self.lease = lease  # idempotent: the worker's cache holds the producer
        self.txn = self.producer.transactional_id is not None
        self.group = commit_facts.group_id(options.sink_id, task.writer_id)
        self.piece_rows = 0 if self.txn else WIRE_PIECE
        self.chunk_bytes = record_batch.CHUNK_BYTES

    @classmethod
    def idempotent(cls, options: KafkaSinkOptions, task: TaskInfo) -> WireTransport:
        """The worker's idempotent wire producer (raises what ``clients.broker_refusal``
        names for brokers older than Kafka 2.1)."""
        try:
            lease = cached_idempotent(options.producer_conf, f"{FAMILY} {options.sink_id}",
                                      options.metadata_retry_timeout)
        except WireError as e:
            if clients.broker_refusal(e) is not None:
                raise  # the caller goes on with librdkafka
            raise sink_error(e) from None
        return cls(options, task, lease.client, lease=lease)

    @classmethod
    def transactional(cls, options: KafkaSinkOptions, task: TaskInfo) -> WireTransport:
        """A transactional wire producer of its own, over the process's cluster (``fence``
        gives it its epoch); the facts topic made sure of once per process."""
        commit_facts.ensure_once(options.producer_conf, options.facts_topic,
                                 options.connect_timeout)
        return cls(options, task, Held(
            options.producer_conf, producers.transactional_id(options.sink_id, task.writer_id),
            f"{FAMILY} {options.sink_id}", options.metadata_retry_timeout))

    @property
    def uncertain(self) -> bool:
        return self.producer.uncertain

    # -- the steps ------------------------------------------------------------------------------
    def fence(self) -> None:
        """2T on the wire: ``InitProducerId``, then what the transaction will need (the
        target's leaders, the fact group's coordinator); raises what ``clients.broker_refusal``
        names for brokers older than Kafka 3.6."""
        if not self.txn:
            return
        self.producer.init(self.options.flush_timeout)
        if self.options.topic is not None:
            self.producer.prepare(self.options.topic, self.group)

    def read_fact(self, batch_id: int, scope: str,
                  timeout: float) -> commit_facts.CommitFact | None:
        """Over the producer's own cluster: no client of its own."""
        return commit_facts.read_fact_wire(self.producer.cluster, self.options.sink_id,
                                           self.task.writer_id, self.options.facts_topic,
                                           batch_id, scope, timeout)

    def begin(self) -> None:
        """Nothing to send: a transaction opens with its first partitions
        (``AddPartitionsToTxn``, or under transactions v2 the first Produce)."""

    def send_piece(self, chunk: Chunk, topic: str, piece: np.ndarray,
                   prefix: bytes | None) -> int:
        rows = chunk.rows
        header = None if prefix is None else (recovery.HEADER, prefix)
        return self.producer.produce(topic, chunk.routing.counts[topic], rows.value_array,
                                     rows.keys, chunk.routing.parts, piece, header=header)

    def settle_queued(self) -> None:
        """Nothing queued: every send returned once its records were acknowledged."""

    def flush(self) -> None:
        """Nothing in flight (as :meth:`settle_queued`)."""

    def commit(self, fact: commit_facts.CommitFact) -> None:
        if not self.txn:
            raise KafkaSinkError(f"{FAMILY} {self.options.sink_id}: no transaction to commit "
                                 "(internal)")
        # A NUL after the JSON: confluent-kafka's read stops there (CommitFact.decode).
        self.producer.send_offset(self.group, self.options.facts_topic, 0,
                                  commit_facts.FACT_OFFSET, fact.encode() + "\x00")
        self.producer.end(commit=True)

    def abort(self) -> bool:
        producer = self.producer
        sink_id = self.options.sink_id
        if not self.txn:
            # Nothing is in flight by now: a failed send has waited for every answer due,
            # or sent until message.timeout.ms (docs/design.md, "The wire client's
            # failures"). A producer left RESET takes a new producer id before its next
            # task; one in any other state but READY is of no more use.
            if producer.uncertain:
                log.warning("%s %s: batch %d writer %d failed with Produce requests whose "
                            "outcome is unknown after message.timeout.ms; a retry that scans "
                            "before they are settled could write their records again",
                            FAMILY, sink_id, self.task.batch_id, self.task.writer_id)
            usable = producer.state in (ProducerState.READY, ProducerState.RESET)
            if self.lease is not None and not usable:
                self.lease.discard()
            return False
        if not producer.open:
            return False
        if producer.uncertain and not producer.tv2:
            # A request whose outcome is unknown may still reach a broker: an abort now could
            # let it land after the markers. The retry's InitProducerId bumps the epoch
            # instead, which aborts this transaction and fences anything of it still in
            # flight (docs/design.md, "The wire client's failures", 7). Under transactions
            # v2 the abort itself bumps the epoch, so it is sent.
            log.info("%s %s: requests of the failed attempt have an unknown outcome; its "
                     "transaction is left to the retry's InitProducerId to abort", FAMILY,
                     sink_id)
            return False
        try:
            producer.end(commit=False)
        except Exception as e:  # noqa: BLE001 - the retry's InitProducerId fences it
            log.warning("%s %s: aborting the transaction of a failed task: %s", FAMILY,
                        sink_id, e)
            return False
        return True

    def explain(self, error: BaseException) -> Exception | None:
        """The sink's error for one of the wire client's: an access denial names the ACL to
        grant; anything else keeps its text."""
        if not isinstance(error, WireError):
            return None
        if not self.txn:
            return sink_error(error)
        o = self.options
        denied = access.denied(
            error, who=f"{FAMILY} {o.sink_id}", conf=o.producer_conf,
            needs=[a.bind(sink_id=o.sink_id, topic=o.topic or "", facts_topic=o.facts_topic)
                   for a in access.ROLES["transactional-sink"]],
            request=f"batch {self.task.batch_id} writer {self.task.writer_id}")
        return sink_error(error) if denied is None else KafkaSinkError(denied)

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()  # back to the worker's cache (closed there if discarded)
        else:
            self.held.close()
