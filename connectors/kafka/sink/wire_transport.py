"""The Kafka sink's records as record batches on the wire: the
:class:`~connectors.kafka.sink.transport.Transport` over :class:`wire.WireProducer`
(docs/design.md, "Record batches on the wire" and "Kafka sink: transports").

Every send returns once the brokers acknowledged its records (or fails with nothing of its
own left in flight, ``wire_send.Sender``), so ``flush`` has nothing to wait for and the
``mid_produce`` failpoint counts acknowledged records.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.kafka import access
from connectors.kafka.common import FAMILY, ClientCache, Lease
from connectors.kafka.sink import commit_facts, producers, recovery, wire
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.transport import Chunk, Transport

log = logging.getLogger(__name__)

#: Rows per send of the recovery-key mode (its chunk is the whole task): bounds the encoded
#: bytes a task holds at once.
WIRE_PIECE = 262_144

#: Idempotent wire producers a worker keeps, one per sink configuration: a producer id
#: serves task after task (a new one per task would leave the broker a producer state per
#: partition for each, kept ``producer.id.expiration.ms``, a day by default).
_IDEMPOTENT: ClientCache[wire.WireProducer] = ClientCache(
    "wire idempotent producers", 4, lambda producer: producer.close(), exclusive=True)


def cached_idempotent(conf: Mapping[str, Any], who: str,
                      retry_timeout: float) -> Lease[wire.WireProducer]:
    """The worker's idempotent wire producer for ``conf`` (made on first use), held until
    ``Lease.release()``; ``Lease.discard()`` after an error (its sequences are unknown)."""
    key = tuple(sorted((str(k), str(v)) for k, v in conf.items()))

    def make() -> wire.WireProducer:
        producer = wire.WireProducer(wire.Settings.of(conf), None, who, retry_timeout)
        try:
            producer.init(retry_timeout)
        except BaseException:
            producer.close()
            raise
        return producer

    return _IDEMPOTENT.acquire(key, make)


class WireTransport(Transport):
    """A wire producer: the worker's cached idempotent one (:meth:`idempotent`), or a
    transactional one per task attempt (:meth:`transactional`)."""

    def __init__(self, options: KafkaSinkOptions, task: TaskInfo, producer: wire.WireProducer,
                 lease: Lease[wire.WireProducer] | None = None) -> None:
        super().__init__(options, task)
        self.producer = producer
        self.lease = lease  # idempotent: the worker's cache holds the producer
        self.txn = producer.transactional_id is not None
        self.group = commit_facts.group_id(options.sink_id, task.writer_id)
        self.piece_rows = 0 if self.txn else WIRE_PIECE
        self.chunk_bytes = wire.CHUNK_BYTES

    @classmethod
    def idempotent(cls, options: KafkaSinkOptions, task: TaskInfo) -> WireTransport:
        """The worker's idempotent wire producer (``wire.UnsupportedBroker``: a broker
        older than Kafka 2.1)."""
        lease = cached_idempotent(options.producer_conf, f"{FAMILY} {options.sink_id}",
                                  options.metadata_retry_timeout)
        return cls(options, task, lease.client, lease=lease)

    @classmethod
    def transactional(cls, options: KafkaSinkOptions, task: TaskInfo) -> WireTransport:
        """A transactional wire producer of its own (``fence`` connects it)."""
        producer = wire.WireProducer(
            wire.Settings.of(options.producer_conf),
            producers.transactional_id(options.sink_id, task.writer_id),
            f"{FAMILY} {options.sink_id}", options.metadata_retry_timeout)
        return cls(options, task, producer)

    @property
    def uncertain(self) -> bool:
        return self.producer.uncertain

    # -- the steps ------------------------------------------------------------------------------
    def fence(self) -> None:
        """2T on the wire: ``InitProducerId``, then what the transaction will need (the
        target's leaders, the fact group's coordinator); ``wire.UnsupportedBroker`` for a
        broker older than Kafka 3.6."""
        if not self.txn:
            return
        self.producer.init(self.options.flush_timeout)
        if self.options.topic is not None:
            self.producer.prepare(self.options.topic, self.group)

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
            # failures"). Its sequences are unknown: the producer is discarded.
            if producer.uncertain:
                log.warning("%s %s: batch %d writer %d failed with Produce requests whose "
                            "outcome is unknown after message.timeout.ms; a retry that scans "
                            "before they are settled could write their records again",
                            FAMILY, sink_id, self.task.batch_id, self.task.writer_id)
            if self.lease is not None:
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
        if not self.txn or not isinstance(error, wire.WireError):
            return None
        o = self.options
        denied = access.denied(
            error, who=f"{FAMILY} {o.sink_id}", conf=o.producer_conf,
            needs=[a.bind(sink_id=o.sink_id, topic=o.topic or "", facts_topic=o.facts_topic)
                   for a in access.ROLES["transactional-sink"]],
            request=f"batch {self.task.batch_id} writer {self.task.writer_id}")
        return None if denied is None else KafkaSinkError(denied)

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()  # back to the worker's cache (closed there if discarded)
        else:
            self.producer.close()
