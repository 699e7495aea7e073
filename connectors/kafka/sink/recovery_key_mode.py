"""The recovery-key delivery mode of the exactly-once Kafka sink, its default (docs/design.md,
"Kafka sink: recovery keys").

:class:`RecoveryKeyWriter`: the recovery-key header ``eo-rk`` on every record, a started
marker before the first record, and on a retry a scan that skips what is already there
(:mod:`connectors.kafka.sink.recovery`). A cached idempotent producer per worker: by
default record batches on the wire (:mod:`connectors.kafka.sink.wire_transport`), else
librdkafka (:mod:`connectors.kafka.sink.librdkafka_transport`). The steps every mode shares
are :class:`connectors.kafka.sink.writer.KafkaWriter`'s.
"""

from __future__ import annotations

import logging

from connectors.core import failpoints
from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.core.sink_state import SinkState
from connectors.kafka import clients
from connectors.kafka.common import FAMILY
from connectors.kafka.sink import ordering, producers, recovery, transport
from connectors.kafka.sink.librdkafka_transport import LibrdkafkaTransport
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.partitioner import NullKeyRuns, null_key_start
from connectors.kafka.sink.transport import Chunk, ProducePath, Transport
from connectors.kafka.sink.wire_transport import WireTransport
from connectors.kafka.sink.writer import KafkaWriter

log = logging.getLogger(__name__)

# Failpoint of this mode's step 2 (see the KafkaSink docstring).
FP_AFTER_MARKER = "kafka_sink.after_marker"


class RecoveryKeyWriter(KafkaWriter):
    """Recovery keys and started markers; a cached idempotent producer per worker."""

    #: What a retry's scan counts as written.
    isolation = "read_uncommitted"

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo,
                 path: ProducePath) -> None:
        super().__init__(options, state, task, path)
        self.markers = recovery.MarkerStore(state.storage, state.root, state)
        self.marker: recovery.StartedMarker | None = None
        self.order = ordering.default()

    def header_prefix(self) -> bytes:
        """The key version of the started marker (a retry's records and scan match its
        first attempt's), else the current one."""
        version = self.marker.key_version if self.marker is not None else recovery.VERSION
        return recovery.key_prefix(self.sink_id, self.task.batch_id, self.task.writer_id,
                                   version)

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

    def recover(self, head: Chunk) -> Chunk:
        b, w = self.task.batch_id, self.task.writer_id
        rows, routing = head.rows, head.routing
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
            return head
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
        return Chunk(rows, routing, head.order[~skip[head.order]])

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

    def open_transport(self, wire_ok: bool = True) -> Transport:
        if wire_ok and transport.wire_here(self.path, self.options):
            try:
                return WireTransport.idempotent(self.options, self.task)
            except Exception as e:
                old = clients.broker_refusal(e)  # brokers older than Kafka 2.1
                if old is None:
                    raise
                transport.note_librdkafka(old)
        return LibrdkafkaTransport.idempotent(self.options, self.task, self.path)
