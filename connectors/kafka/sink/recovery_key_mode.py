"""The recovery-key delivery mode of the exactly-once Kafka sink, its default (docs/design.md,
"Kafka sink: recovery keys").

:class:`RecoveryKeyWriter`: the recovery-key header ``eo-rk`` on every record, a started
marker before the first record, and on a retry a scan that skips what is already there
(:mod:`connectors.kafka.sink.recovery`). A cached idempotent producer per worker: by
default record batches on the wire (:mod:`connectors.kafka.sink.wire`), else librdkafka. The
steps every mode shares are :class:`connectors.kafka.sink.writer.KafkaWriter`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from connectors.core import failpoints
from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.core.sink_state import SinkState
from connectors.kafka.common import FAMILY, ClientCache, Lease
from connectors.kafka.sink import batch_produce, ordering, producers, recovery, wire
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.partitioner import NullKeyRuns, null_key_start
from connectors.kafka.sink.producers import ProducerSlot
from connectors.kafka.sink.rows import Routing, Rows
from connectors.kafka.sink.writer import FP_MID_PRODUCE, KafkaWriter

log = logging.getLogger(__name__)

# Failpoint of this mode's step 2 (see the KafkaSink docstring).
FP_AFTER_MARKER = "kafka_sink.after_marker"
#: Rows per wire produce call: bounds the encoded bytes a task holds at once.
WIRE_PIECE = 262_144


class WireSlot:
    """The recovery-key mode's producer on the wire: an idempotent ``wire.WireProducer``
    where the mode expects a ``ProducerSlot`` (``producer``, ``errors``, ``conf``)."""

    def __init__(self, conf: Mapping[str, Any], who: str, retry_timeout: float) -> None:
        self.conf = conf
        self.errors: list[str] = []
        self.producer = wire.WireProducer(wire.Settings.of(conf), None, who, retry_timeout)
        self.producer.init(retry_timeout)


#: Idempotent wire producers a worker keeps, one per sink configuration: a producer id
#: serves task after task (a new one per task would leave the broker a producer state per
#: partition for each, kept ``producer.id.expiration.ms``, a day by default).
_IDEMPOTENT: ClientCache[WireSlot] = ClientCache(
    "wire idempotent producers", 4, lambda slot: slot.producer.close(), exclusive=True)


def cached_idempotent(conf: Mapping[str, Any], who: str,
                      retry_timeout: float) -> Lease[WireSlot]:
    """The worker's idempotent wire producer for ``conf`` (made on first use), held until
    ``Lease.release()``; ``Lease.discard()`` after an error (its sequences are unknown)."""
    key = tuple(sorted((str(k), str(v)) for k, v in conf.items()))
    return _IDEMPOTENT.acquire(key, lambda: WireSlot(conf, who, retry_timeout))


class RecoveryKeyWriter(KafkaWriter):
    """Recovery keys and started markers; a cached idempotent producer per worker."""

    #: What a retry's scan counts as written.
    isolation = "read_uncommitted"

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo) -> None:
        super().__init__(options, state, task)
        self.markers = recovery.MarkerStore(state.storage, state.root, state)
        self.marker: recovery.StartedMarker | None = None
        self.order = ordering.default()
        self.lease: Lease[ProducerSlot] | Lease[WireSlot] | None = None

    def header_prefix(self) -> bytes:
        """The key version of the started marker (a retry's records and scan match its
        first attempt's), else the current one."""
        version = self.marker.key_version if self.marker is not None else recovery.VERSION
        return recovery.key_prefix(self.sink_id, self.task.batch_id, self.task.writer_id,
                                   version)

    def batch_handle(self, producer: Any, rows: Rows) -> int | None:
        # The C loop sets the recovery-key header itself, and confluent-kafka's delivery
        # reports reach ProducerSlot.on_delivery as for produce(): flush() still fails the
        # task on any failed record.
        if (not self.options.batch_produce or rows.headers is not None
                or not batch_produce.keyed_available()):
            return None
        return batch_produce.handle(producer)

    def row_order(self) -> str:
        """A retry numbers its rows in the order its first attempt did (so it reads the
        started marker here, before the rows are ordered)."""
        self.marker = self.markers.get(self.task.batch_id, self.task.writer_id)
        if self.marker is None:
            self.order = ordering.default()
            return self.order
        unknown = (f"row order {self.marker.order!r}" if self.marker.order not in ordering.ORDERS
                   else f"recovery-key version {self.marker.key_version}"
                   if self.marker.key_version not in recovery.VERSIONS else None)
        if unknown is not None:
            raise KafkaSinkError(
                f"{FAMILY} {self.sink_id}: the started marker of batch {self.task.batch_id} "
                f"writer {self.task.writer_id} names {unknown}, which this version of the "
                f"connector does not know (row orders {', '.join(ordering.ORDERS)}; key "
                f"versions {', '.join(map(str, recovery.VERSIONS))}); retry the batch with "
                "the version that wrote it")
        self.order = self.marker.order
        return self.order

    def null_key_runs(self) -> NullKeyRuns:
        """A retry routes null keys in the runs its first attempt used, as its marker records
        them (markers from before the runs were counted in bytes: their runs of rows)."""
        if self.marker is None:
            return super().null_key_runs()
        return self.marker.null_key_runs(null_key_start(self.task.batch_id, self.task.writer_id))

    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        """A retry routes with the counts its first attempt recorded, so partitions added
        in between do not move its rows (``row_order`` read the marker)."""
        counts = dict(self.marker.partition_counts) if self.marker is not None else {}
        missing = [t for t in topics if t not in counts]
        if missing:
            if self.marker is not None:
                raise KafkaSinkError(
                    f"{FAMILY} {self.sink_id}: retry of batch {self.task.batch_id} writer "
                    f"{self.task.writer_id} writes to topics {missing} that its first attempt "
                    "did not; the batch's input is not the same on replay"
                )
            counts.update(self.fetch_partition_counts(missing))
        return counts

    def recover(self, rows: Rows, routing: Routing, slot: ProducerSlot) -> np.ndarray | None:
        b, w = self.task.batch_id, self.task.writer_id
        if self.marker is None:
            # 2. First attempt: the marker goes down before the first record does.
            self.markers.put(recovery.StartedMarker(
                sink_id=self.sink_id,
                batch_id=b,
                writer=w,
                partition_counts=routing.counts,
                null_key_run_bytes=self.options.null_key_run_bytes,
                order=self.order,
                key_version=recovery.VERSION,
                watermarks=self.watermarks(list(routing.tp_of.values())),
            ))
            failpoints.hit(FP_AFTER_MARKER, b)
            return None
        # 2. Retry: scan from the marker's watermarks; skip rows at or below the max seq.
        report = self.report
        report.retry = True
        start = self.marker.start_offsets()
        names = routing.names
        unknown = [names[i] for i, tp in routing.tp_of.items() if tp not in start]
        if unknown:
            raise KafkaSinkError(
                f"{FAMILY} {self.sink_id}: retry of batch {b} writer {w} routes rows to "
                f"{unknown}, which its first attempt did not target; the batch's input "
                "is not the same on replay"
            )
        result = self.scan(start)
        report.scan_records, report.scan_seconds = result.records_read, result.seconds
        id_of = routing.ids()
        present = {id_of[tp]: s for tp, s in result.seqs.items() if s and tp in id_of}
        stray = [f"{t}[{p}]" for (t, p), s in result.seqs.items() if s and (t, p) not in id_of]
        if stray:
            raise KafkaSinkError(
                f"{FAMILY} {self.sink_id}: recovery scan found records of batch {b} "
                f"writer {w} in {stray}, where this attempt routes nothing; the "
                "batch's input is not the same on replay"
            )
        skip = recovery.decide(rows.seqs, routing.target_ids, present, names)
        report.skipped = int(skip.sum())
        log.info("%s %s: batch %d writer %d retry: %d of %d rows already written "
                 "(scan read %d records in %.2fs)", FAMILY, self.sink_id, b, w,
                 report.skipped, rows.n, result.records_read, result.seconds)
        return skip

    def scan(self, start: dict[tuple[str, int], int]) -> recovery.ScanResult:
        from confluent_kafka import Consumer

        # Stop offsets are high watermarks (ListOffsets read_uncommitted): a read_committed
        # consumer would be told the last stable offset, which another writer's open
        # transaction can hold below records this task's earlier attempt committed.
        marks = self.watermarks(list(start))
        stop = {(t, int(p)): o for t, parts in marks.items() for p, o in parts.items()}
        consumer = Consumer(producers.consumer_config(
            self.options.producer_conf, self.sink_id, self.isolation))
        try:
            return recovery.scan(consumer, self.header_prefix(), start, stop,
                                 self.options.scan_timeout, self.options.producer_conf)
        finally:
            consumer.close()

    def open_producer(self) -> ProducerSlot:
        conf = self.options.producer_conf
        why = wire.unsupported(conf) if self.options.wire_produce else "wireProduce=false"
        if why is not None and self.options.wire_produce:
            wire.note_skipped(f"{FAMILY} {self.sink_id}: {why}")
        if why is None:
            try:
                wire_lease = cached_idempotent(conf, f"{FAMILY} {self.sink_id}",
                                                    self.options.metadata_retry_timeout)
            except wire.UnsupportedBroker as e:  # older than Kafka 2.1
                wire.note_skipped(str(e))
            else:
                self.lease = wire_lease
                return wire_lease.client  # type: ignore[return-value]  # a ProducerSlot's shape
        self.lease = producers.cached_producer(conf)
        slot = self.lease.client
        # Anything a failed earlier task left in this worker's producer must be settled
        # before this task scans, or the scan could miss records still in flight.
        slot.producer.flush(self.options.flush_timeout)
        slot.errors.clear()
        return slot

    def produce(self, slot: ProducerSlot, rows: Rows, parts: np.ndarray, todo: np.ndarray,
                done: int = 0) -> int:
        if not isinstance(slot, WireSlot):
            return super().produce(slot, rows, parts, todo, done)
        if rows.headers is not None:
            return self.produce_with_librdkafka(rows, parts, todo, done)
        # 3. Record batches with the recovery key built in, per target topic, in pieces of
        #    at most WIRE_PIECE rows (todo is grouped by target: a piece keeps each
        #    partition's rows in seq order); mid_produce fires at its exact count.
        header = (recovery.HEADER, self.header_prefix())
        armed = failpoints.wants_count(FP_MID_PRODUCE)
        count = done
        for topic, piece in self.pieces(rows, todo, done, armed, WIRE_PIECE):
            count += slot.producer.produce(topic, int(parts[piece].max()) + 1,
                                           rows.value_array, rows.keys, parts, piece,
                                           header=header)
            self.mid_produce(slot.producer, count, armed)
        return count - done

    def produce_with_librdkafka(self, rows: Rows, parts: np.ndarray, todo: np.ndarray,
                                done: int) -> int:
        """A ``headers`` column: these records go through the worker's librdkafka
        producer (the wire path writes no user headers), flushed before the task goes on."""
        lease = producers.cached_producer(self.options.producer_conf)
        try:
            slot = lease.client
            slot.errors.clear()
            produced = super().produce(slot, rows, parts, todo, done)
            self.flush(slot)
        except BaseException:
            lease.discard()
            raise
        lease.release()
        return produced

    def on_failure(self, slot: ProducerSlot) -> None:
        # Settle or drop what the failed attempt queued: its retry may run in this worker
        # and must not race records of this attempt still in flight. (On the wire nothing
        # is in flight by now: a failed produce() has waited for every answer due, or sent
        # until message.timeout.ms; docs/design.md, "The wire client's failures".)
        if isinstance(slot, WireSlot) and slot.producer.uncertain:
            log.warning("%s %s: batch %d writer %d failed with Produce requests whose "
                        "outcome is unknown after message.timeout.ms; a retry that scans "
                        "before they are settled could write their records again",
                        FAMILY, self.sink_id, self.task.batch_id, self.task.writer_id)
        left = slot.producer.flush(min(self.options.flush_timeout, 30.0))
        if left:
            slot.producer.purge()
        if self.lease is not None:
            self.lease.discard()

    def release(self, slot: ProducerSlot) -> None:
        if self.lease is not None:
            self.lease.release()  # back to the worker's cache (closed there if discarded)
