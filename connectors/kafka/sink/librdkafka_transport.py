"""The Kafka sink's records through confluent-kafka's producer (librdkafka): the
:class:`~connectors.kafka.sink.transport.Transport` where the wire path does not apply
(docs/design.md, "Kafka sink: transports").

The hand-off is one strategy, chosen when the transport opens:

- ``rd_kafka_produce_batch`` over the Arrow buffers (:mod:`connectors.kafka.sink.batch_produce`),
  no header: the transactional mode;
- the keyed C loop (``batch_produce.produce_keyed``), the recovery-key header set in C, each
  record with confluent-kafka's own per-message state, so its delivery reports reach
  :meth:`ProducerSlot.on_delivery` as ``produce()``'s do;
- ``produce()`` record by record: a ``headers`` column, ``batchProduce=false``, or no
  extension.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.kafka import access
from connectors.kafka.common import FAMILY, Lease
from connectors.kafka.sink import batch_produce, commit_facts, producers, recovery
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.producers import ProducerSlot
from connectors.kafka.sink.rows import picker
from connectors.kafka.sink.transport import Chunk, ProducePath, Transport

log = logging.getLogger(__name__)


class LibrdkafkaTransport(Transport):
    """A librdkafka producer: the worker's cached idempotent one (:meth:`idempotent`), or one
    transactional producer per task attempt (:meth:`transactional`)."""

    def __init__(self, options: KafkaSinkOptions, task: TaskInfo, path: ProducePath,
                 slot: ProducerSlot, lease: Lease[ProducerSlot] | None = None,
                 facts: commit_facts.FactWriter | None = None) -> None:
        super().__init__(options, task)
        self.slot = slot
        self.producer: Any = slot.producer
        self.lease = lease  # idempotent: the worker's cache holds the producer
        self.facts = facts  # transactional: the commit fact's client
        self.in_txn = False
        if facts is None:  # recovery keys: the keyed C loop sets the header
            batched = batch_produce.keyed_available()
        else:  # no header; recoveryKeyHeaders=true takes produce()
            batched = not options.recovery_key_headers
        batched = batched and options.batch_produce and not path.headers
        #: rd_kafka_t handle for the batch call or the keyed C loop (None: produce()).
        self.rk = batch_produce.handle(self.producer) if batched else None

    @classmethod
    def idempotent(cls, options: KafkaSinkOptions, task: TaskInfo,
                   path: ProducePath) -> LibrdkafkaTransport:
        """The worker's idempotent producer for the options' configuration."""
        lease = producers.cached_producer(options.producer_conf)
        slot = lease.client
        try:
            # Anything a failed earlier task left in this worker's producer must be settled
            # before this task scans, or the scan could miss records still in flight.
            slot.producer.flush(options.flush_timeout)
        except BaseException:
            lease.discard()
            lease.release()
            raise
        slot.errors.clear()
        return cls(options, task, path, slot, lease=lease)

    @classmethod
    def transactional(cls, options: KafkaSinkOptions, task: TaskInfo, path: ProducePath,
                      facts: commit_facts.FactWriter) -> LibrdkafkaTransport:
        """A transactional producer of its own; it connects in the background until
        :meth:`fence`."""
        slot = producers.transactional_producer(options.producer_conf, options.sink_id,
                                                task.writer_id)
        return cls(options, task, path, slot, facts=facts)

    # -- the steps ------------------------------------------------------------------------------
    def fence(self) -> None:
        if self.facts is not None:
            producers.init_transactions(self.slot, self.options.flush_timeout)

    def read_fact(self, batch_id: int, scope: str,
                  timeout: float) -> commit_facts.CommitFact | None:
        """Through the worker's fact consumer (``commit_facts.FactWriter``), which also lends
        ``send_offsets_to_transaction`` the group's metadata."""
        if self.facts is None:
            raise KafkaSinkError(f"{FAMILY} {self.options.sink_id}: no commit-fact client "
                                 "(internal)")
        return self.facts.read(self.options.facts_topic, batch_id, scope, timeout)

    def begin(self) -> None:
        if self.facts is not None:
            self.producer.begin_transaction()
            self.in_txn = True

    def send_piece(self, chunk: Chunk, topic: str, piece: np.ndarray,
                   prefix: bytes | None) -> int:
        rows, parts = chunk.rows, chunk.routing.parts
        if self.rk is None:
            return self.produce_loop(chunk, topic, piece, prefix)
        if prefix is None:
            return batch_produce.produce(self.rk, topic, rows.value_array, rows.keys, parts,
                                         piece, self.wait)
        return batch_produce.produce_keyed(
            self.producer, self.slot.on_delivery, self.rk, topic, rows.value_array, rows.keys,
            parts, piece, recovery.HEADER, prefix, self.wait)

    def wait(self) -> None:
        """The queue is full: let librdkafka send some of it."""
        self.producer.poll(0.001)

    def produce_loop(self, chunk: Chunk, topic: str, piece: np.ndarray,
                     prefix: bytes | None) -> int:
        """``produce()`` record by record. It is called positionally: (topic, value, key,
        partition, callback, on_delivery, timestamp, headers); keyword parsing alone would
        cost a third of the per-record Python time."""
        produce, poll = self.producer.produce, self.producer.poll
        rows = chunk.rows
        order = piece.tolist()
        pick = picker(order)
        values, keys = pick(rows.values), pick(rows.key_list)
        parts = chunk.routing.parts[piece].tolist()
        header = recovery.HEADER
        if rows.headers is None and prefix is not None:
            # The recovery-key mode's hot loop. Header values (bytes, which the garbage
            # collector does not track) are built by numpy first.
            for v, k, p, key in zip(values, keys, parts, recovery.header_values(prefix, piece),
                                    strict=True):
                while True:
                    try:
                        produce(topic, v, k, p, None, None, 0, [(header, key)])
                        break
                    except BufferError:
                        poll(0.05)
        elif rows.headers is None:
            # The transactional mode's hot loop: no header at all.
            for v, k, p in zip(values, keys, parts, strict=True):
                while True:
                    try:
                        produce(topic, v, k, p)
                        break
                    except BufferError:
                        poll(0.05)
        else:
            pack = recovery.pack_seq
            for i, v, k, p, given in zip(order, values, keys, parts, pick(rows.headers),
                                         strict=True):
                h = [] if prefix is None else [(header, prefix + pack(i))]
                if given:
                    h.extend(given)
                while True:
                    try:
                        produce(topic, v, k, p, None, None, 0, h or None)
                        break
                    except BufferError:
                        poll(0.05)
        return len(order)

    def settle_queued(self) -> None:
        self.producer.flush(self.options.flush_timeout)

    def flush(self) -> None:
        b, w, timeout = self.task.batch_id, self.task.writer_id, self.options.flush_timeout
        sink_id = self.options.sink_id
        remaining = self.producer.flush(timeout)
        if remaining:
            raise KafkaSinkError(
                f"{FAMILY} {sink_id}: {remaining} records of batch {b} writer {w} were "
                f"not delivered within flushTimeout={timeout:.0f}s"
            )
        errors = self.slot.errors
        if errors:
            # "<topic>[<partition>]: <error>": a denied WRITE names the ACL to grant.
            topic = errors[0].split("[", 1)[0]
            denied = access.denied(errors[0], who=f"{FAMILY} {sink_id}",
                                   conf=self.options.producer_conf,
                                   needs=[access.Acl("TOPIC", topic, "LITERAL", "WRITE",
                                                     "Produce")],
                                   request=f"producing batch {b} writer {w}")
            if denied is not None:
                raise KafkaSinkError(denied)
            raise KafkaSinkError(
                f"{FAMILY} {sink_id}: {len(errors)} records of batch {b} writer {w} "
                f"failed delivery, e.g. {errors[:3]}; the task fails and its retry skips "
                "what was written"
            )

    def commit(self, fact: commit_facts.CommitFact) -> None:
        if self.facts is None:
            raise KafkaSinkError(f"{FAMILY} {self.options.sink_id}: no transaction to commit "
                                 "(internal)")
        timeout = self.options.flush_timeout
        self.facts.send(self.producer, self.options.facts_topic, fact, timeout)
        self.producer.commit_transaction(timeout)
        self.in_txn = False  # committed: a failure after this has no transaction to abort

    def abort(self) -> bool:
        if self.facts is None:
            # Settle or drop what the failed attempt queued: its retry may run in this
            # worker and must not race records of this attempt still in flight.
            left = self.producer.flush(min(self.options.flush_timeout, 30.0))
            if left:
                self.producer.purge()
            if self.lease is not None:
                self.lease.discard()
            return False
        if not self.in_txn:
            return False
        try:
            self.producer.abort_transaction(min(self.options.flush_timeout, 30.0))
        except Exception as e:  # noqa: BLE001 - the retry's init_transactions fences it
            log.warning("%s %s: abort_transaction after a failed task: %s", FAMILY,
                        self.options.sink_id, e)
            return False
        return True

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()  # back to the worker's cache (closed there if discarded)
            return
        # A transactional producer serves one task attempt: release it now, not whenever
        # the garbage collector gets to it (a failed attempt's producer is kept alive by
        # the exception's traceback).
        producers.close_producer(self.producer, min(self.options.flush_timeout, 30.0))
