"""One task attempt of the exactly-once Kafka sink, in any delivery mode (docs/design.md,
"Kafka sink: recovery keys", steps 1 and 3).

As in flink-connector-kafka (``KafkaWriter`` / ``ExactlyOnceKafkaWriter``), the mode is a
type, chosen once per task by ``KafkaSink.stage`` (``writer_for``):

- :class:`KafkaWriter`, the base (this module): steps 1 and 3 of the protocol. A committed
  batch writes nothing; rows are routed by the sink itself, produced in seq order partition
  by partition, flushed, and any delivery error fails the task. What a mode adds are hooks:
  how step 2 finds what an earlier attempt wrote (``recover``), which producer serves the
  attempt (``open_producer``) and how its output becomes final or is given up (``begin``,
  ``complete``, ``on_failure``, ``release``).
- :class:`~connectors.kafka.sink.recovery_key_mode.RecoveryKeyWriter`: the recovery-key
  header ``eo-rk`` on every record, a started marker before the first record, and on a
  retry a scan that skips what is already there. A cached idempotent producer per worker.
- :class:`~connectors.kafka.sink.transactional_mode.TransactionalWriter`
  (``transactional=true``): one Kafka transaction per task attempt holds its rows and a
  commit fact (:mod:`connectors.kafka.sink.commit_facts`); ``init_transactions`` fences a
  zombie attempt first, then one stable offset fetch tells whether an earlier attempt
  committed. No recovery-key header, no sort, no scan; each Arrow batch goes to librdkafka
  in one call (:mod:`connectors.kafka.sink.batch_produce`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.core import failpoints
from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.core.sink_state import SinkState
from connectors.kafka import access
from connectors.kafka.common import FAMILY, attempt_timeout, retrying
from connectors.kafka.sink import batch_produce, ordering, producers, recovery, targets
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.partitioner import ByteRuns, NullKeyRuns, null_key_start
from connectors.kafka.sink.producers import ProducerSlot
from connectors.kafka.sink.rows import Routing, Rows, picker, route, shape

log = logging.getLogger(__name__)

# Failpoints of the steps every mode shares (see the KafkaSink docstring).
FP_MID_PRODUCE = "kafka_sink.mid_produce"
FP_AFTER_FLUSH = "kafka_sink.after_flush"


@dataclass
class TaskReport:
    """The stage message of one task (picklable, small)."""

    writer: int
    attempt: int
    rows: int = 0
    produced: int = 0
    skipped: int = 0
    retry: bool = False
    fenced: int = 0  # transactional: earlier attempts that began and never committed
    already_committed: bool = False
    scan_records: int = 0
    scan_seconds: float = 0.0
    input_seconds: float = 0.0  # waiting for Spark to hand over the task's (first) rows
    setup_seconds: float = 0.0  # from then to its first record
    flush_seconds: float = 0.0
    commit_seconds: float = 0.0  # transactional: commit fact + commit_transaction
    seconds: float = 0.0
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)


def drain(batches: Iterator[pa.RecordBatch]) -> int:
    """Read what Spark still hands over; returns the number of rows."""
    return sum(batch.num_rows for batch in batches)


class KafkaWriter:
    """One task attempt writing batch B, writer partition w: steps 1 and 3, and the hooks
    a delivery mode fills in (step 2 and the producer's lifecycle)."""

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo) -> None:
        self.options = options
        self.state = state
        self.task = task
        self.sink_id = options.sink_id
        self.report = TaskReport(writer=task.writer_id, attempt=task.attempt)

    def write(self, batches: Iterator[pa.RecordBatch]) -> TaskReport:
        began = time.perf_counter()
        report = self.report
        if not self.admitted():
            drain(batches)
            return report
        # The producer first: a new client connects while Spark hands over the task's rows
        # (the source's read, upstream in the same task, often takes longer).
        slot = self.open_producer()
        with self.attempt(slot):
            chunks = list(batches)
            report.input_seconds = time.perf_counter() - began
            table = pa.Table.from_batches(chunks) if chunks else None
            if table is None or table.num_rows == 0:
                return report
            numbering = self.row_order()
            if numbering is not None and not self.options.deterministic_order:
                table = ordering.deterministic_order(table, numbering)
            rows = shape(table, self.options.topic, self.sink_id)
            report.rows = rows.n
            counts = self.partition_counts(rows.topics)
            routing = route(rows, counts, self.sink_id, self.null_key_runs())
            # 2. (the mode's) Which rows did earlier attempts of (B, w) already write?
            skip = self.recover(rows, routing, slot)
            if report.already_committed:
                return report
            # 3. Produce in seq order, flush, fail on any delivery error.
            report.setup_seconds = time.perf_counter() - began - report.input_seconds
            self.begin(slot)
            todo = np.arange(rows.n) if skip is None else np.nonzero(~skip)[0]
            # Seq order matters only within a target partition (that is what the max-seq
            # rule reads). Producing partition by partition lets librdkafka fill one
            # partition's batches at a time instead of interleaving small ones.
            order = todo[np.argsort(routing.target_ids[todo], kind="stable")]
            report.produced = self.produce(slot, rows, routing.parts, order)
            report.partitions = routing.partition_counts()
            self.settle(slot, rows)
        return self.finish(began)

    @contextlib.contextmanager
    def attempt(self, slot: ProducerSlot) -> Iterator[None]:
        """The producer's lifecycle around one attempt: settled on failure, then released."""
        try:
            yield
        except BaseException:
            self.on_failure(slot)
            raise
        finally:
            self.release(slot)

    def settle(self, slot: ProducerSlot, rows: Rows | None) -> None:
        """3. (end) Flush, fail on any delivery error, and make the records final."""
        began = time.perf_counter()
        self.flush(slot)
        self.report.flush_seconds = time.perf_counter() - began
        failpoints.hit(FP_AFTER_FLUSH, self.task.batch_id)
        self.complete(slot, rows, self.report)

    def admitted(self) -> bool:
        """1. A committed batch writes nothing (a replay after the driver crashed between our
        commit and Spark's own commit log). Ownership and the batch order come first
        (SinkState.admit): another sink's commit of batch b, or a lower batch id, must not
        pass for a replay."""
        b, w = self.task.batch_id, self.task.writer_id
        if self.state.admit(FAMILY, self.sink_id, b):
            return True
        log.info("%s %s: batch %d already committed; writer %d writes nothing",
                 FAMILY, self.sink_id, b, w)
        self.report.already_committed = True
        return False

    def finish(self, began: float) -> TaskReport:
        report = self.report
        report.seconds = time.perf_counter() - began
        log.info("%s %s: batch %d writer %d produced %d, skipped %d in %.2fs", FAMILY,
                 self.sink_id, self.task.batch_id, self.task.writer_id, report.produced,
                 report.skipped, report.seconds)
        return report

    # -- hooks of a delivery mode ------------------------------------------------------------
    def row_order(self) -> str | None:
        """The deterministic order rows are numbered in (:mod:`connectors.kafka.sink.ordering`;
        the recovery keys' seq needs one), or None to keep them as they come."""
        return ordering.default()

    def null_key_runs(self) -> NullKeyRuns:
        """How this attempt cuts its null-key rows into runs (after :meth:`row_order`): a
        new one per attempt, given the task's rows in seq order."""
        return ByteRuns(null_key_start(self.task.batch_id, self.task.writer_id),
                        self.options.null_key_run_bytes)

    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        """The partition count of every target topic, which routing depends on."""
        return self.fetch_partition_counts(topics)

    def recover(self, rows: Rows, routing: Routing, slot: ProducerSlot) -> np.ndarray | None:
        """Step 2: a mask of the rows already written (None: write them all)."""
        return None

    def header_prefix(self) -> bytes | None:
        """The recovery-key header of this attempt's records, without the seq (None: no
        header)."""
        return None

    def batch_handle(self, producer: Any, rows: Rows) -> int | None:
        """The librdkafka handle to enqueue the rows with Arrow batch by Arrow batch
        (:mod:`connectors.kafka.sink.batch_produce`), or None to produce record by record."""
        return None

    def open_producer(self) -> ProducerSlot:
        raise NotImplementedError

    def begin(self, slot: ProducerSlot) -> None:
        """Before the first record."""

    def complete(self, slot: ProducerSlot, rows: Rows | None, report: TaskReport) -> None:
        """After the flush: make the attempt's records final."""

    def on_failure(self, slot: ProducerSlot) -> None:
        """The attempt failed: settle or give up what it queued."""

    def release(self, slot: ProducerSlot) -> None:
        """The attempt is over, failed or not."""

    # -- shared steps ---------------------------------------------------------------------------
    def produce(self, slot: ProducerSlot, rows: Rows, parts: np.ndarray, todo: np.ndarray,
                done: int = 0) -> int:
        """Produce the rows ``todo`` in that order (ascending seq per partition); ``done``
        records of this attempt went before (the ``mid_produce`` failpoint counts them)."""
        producer: Any = slot.producer
        rk = self.batch_handle(producer, rows)
        if rk is not None:
            return self.produce_batched(slot, rk, rows, parts, todo, done)
        produce = producer.produce
        poll = producer.poll
        pack = recovery.pack_seq
        prefix = self.header_prefix()
        header = recovery.HEADER
        values = rows.values
        keys = rows.keys.to_pylist() if rows.keys is not None else [None] * rows.n
        order: Sequence[int] = todo.tolist()
        single = rows.topics[0] if len(rows.topics) == 1 else None
        headers = rows.headers
        armed = failpoints.wants_count(FP_MID_PRODUCE)
        # produce() is called positionally: (topic, value, key, partition, callback,
        # on_delivery, timestamp, headers). Keyword parsing alone would cost a third of the
        # per-record Python time.
        if single is not None and headers is None and armed is None and prefix is not None:
            # The hot loop: one topic, no user headers, no failpoint armed. Header values
            # (bytes, which the garbage collector does not track) are built by numpy and
            # every column is laid out in produce order first.
            pick = picker(order)
            header_values = recovery.header_values(prefix, todo)
            for v, k, p, key in zip(pick(values), pick(keys), parts[todo].tolist(),
                                    header_values, strict=True):
                while True:
                    try:
                        produce(single, v, k, p, None, None, 0, [(header, key)])
                        break
                    except BufferError:
                        poll(0.05)
            return len(order)
        partitions = parts.tolist()
        if single is not None and headers is None and armed is None and prefix is None:
            # The transactional mode's hot loop: no header at all.
            for i in order:
                while True:
                    try:
                        produce(single, values[i], keys[i], partitions[i])
                        break
                    except BufferError:
                        poll(0.05)
            return len(order)
        topic_of = None if single is not None else [rows.topics[i] for i in rows.topic_idx.tolist()]
        count = done
        for i in order:
            h = [] if prefix is None else [(header, prefix + pack(i))]
            if headers is not None and headers[i]:
                h.extend(headers[i])
            topic = single if topic_of is None else topic_of[i]
            while True:
                try:
                    produce(topic, values[i], keys[i], partitions[i], None, None, 0, h or None)
                    break
                except BufferError:
                    poll(0.05)
            count += 1
            self.mid_produce(producer, count, armed)
        return count - done

    def mid_produce(self, producer: Any, count: int, armed: int | None) -> None:
        """The ``mid_produce`` failpoint, once ``count`` records of the attempt are queued."""
        if armed is not None and count >= armed:
            if count == armed:
                # Make "n records written" literally true before crashing, so a retry
                # really has to skip them (a test of the dedupe, not of luck).
                producer.flush(self.options.flush_timeout)
            failpoints.hit(FP_MID_PRODUCE, self.task.batch_id, count)

    def produce_batched(self, slot: ProducerSlot, rk: int, rows: Rows, parts: np.ndarray,
                        todo: np.ndarray, done: int) -> int:
        """``produce`` with ``rd_kafka_produce_batch`` (with a recovery-key header:
        ``batch_produce.produce_keyed``), one call per run of one topic (``todo`` is grouped
        by target); the ``mid_produce`` failpoint fires at its exact count, then after each
        call."""
        if not len(todo):  # a retry that finds every row written
            return 0
        producer = slot.producer
        armed = failpoints.wants_count(FP_MID_PRODUCE)
        prefix = self.header_prefix()

        def wait() -> None:  # the queue is full: let librdkafka send some of it
            producer.poll(0.001)

        count = done
        for topic, piece in self.pieces(rows, todo, done, armed):
            if prefix is None:
                count += batch_produce.produce(rk, topic, rows.value_array, rows.keys,
                                               parts, piece, wait)
            else:
                count += batch_produce.produce_keyed(
                    producer, slot.on_delivery, rk, topic, rows.value_array, rows.keys,
                    parts, piece, recovery.HEADER, prefix, wait)
            self.mid_produce(producer, count, armed)
        return count - done

    def pieces(self, rows: Rows, todo: np.ndarray, done: int, armed: int | None,
               most: int = 0) -> Iterator[tuple[str, np.ndarray]]:
        """``(topic, piece)`` in produce order: ``todo`` (grouped by target) cut at each
        change of topic, at the ``mid_produce`` failpoint's count (``done`` records went
        before), and into pieces of at most ``most`` rows (0: no bound). Every piece is
        produced whole before the next is asked for."""
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

    def flush(self, slot: ProducerSlot) -> None:
        b, w, timeout = self.task.batch_id, self.task.writer_id, self.options.flush_timeout
        remaining = slot.producer.flush(timeout)
        if remaining:
            raise KafkaSinkError(
                f"{FAMILY} {self.sink_id}: {remaining} records of batch {b} writer {w} were "
                f"not delivered within flushTimeout={timeout:.0f}s"
            )
        if slot.errors:
            # "<topic>[<partition>]: <error>": a denied WRITE names the ACL to grant.
            topic = slot.errors[0].split("[", 1)[0]
            denied = access.denied(slot.errors[0], who=f"{FAMILY} {self.sink_id}",
                                   conf=self.options.producer_conf,
                                   needs=[access.Acl("TOPIC", topic, "LITERAL", "WRITE",
                                                     "Produce")],
                                   request=f"producing batch {b} writer {w}")
            if denied is not None:
                raise KafkaSinkError(denied)
            raise KafkaSinkError(
                f"{FAMILY} {self.sink_id}: {len(slot.errors)} records of batch {b} writer {w} "
                f"failed delivery, e.g. {slot.errors[:3]}; the task fails and its retry skips "
                "what was written"
            )

    def fetch_partition_counts(self, topics: list[str]) -> dict[str, int]:
        return targets.partition_counts(self.options, topics)

    def watermarks(self, tps: list[tuple[str, int]]) -> dict[str, dict[str, int]]:
        """High watermarks ("latest") of the target partitions, before anything is produced
        (ListOffsets, read_uncommitted; transient errors such as a leader election are
        asked again until ``metadataRetryTimeout``)."""
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        from connectors.kafka.wire import admin as wire_admin
        from connectors.kafka.wire.cluster import Cluster
        from connectors.kafka.wire.protocol import UnsupportedBroker, WireError
        from connectors.kafka.wire.settings import Settings, connection_unsupported

        names = ", ".join(f"{t}[{p}]" for t, p in tps[:5]) + (" ..." if len(tps) > 5 else "")
        what = (f"{FAMILY} {self.sink_id}: ListOffsets (end offsets for the started marker) "
                f"of {names}")
        conf = self.options.producer_conf
        if connection_unsupported(conf) is None:  # the wire client: docs/design.md, "Kafka
            # nodes that move or go away"
            cluster = Cluster(Settings.of(conf), f"{FAMILY} {self.sink_id}",
                              self.options.metadata_retry_timeout)
            try:
                got = wire_admin.list_offsets(cluster, dict.fromkeys(tps, wire_admin.LATEST),
                                              wire_admin.READ_UNCOMMITTED)
                wire_out: dict[str, dict[str, int]] = {}
                for (t, p), offset in got.items():
                    wire_out.setdefault(t, {})[str(p)] = int(offset)
                return wire_out
            except UnsupportedBroker:
                pass  # older than the requests we speak: librdkafka below
            except WireError as e:
                raise KafkaSinkError(f"{what} failed: {e}") from None
            finally:
                cluster.close()

        def list_offsets() -> dict[str, dict[str, int]]:
            with producers.admin(self.options.producer_conf) as admin:
                futures = admin.list_offsets(
                    {TopicPartition(t, p): OffsetSpec.latest() for t, p in tps},
                    isolation_level=IsolationLevel.READ_UNCOMMITTED,
                    request_timeout=attempt_timeout(30),
                )
                out: dict[str, dict[str, int]] = {}
                for tp, fut in futures.items():
                    out.setdefault(tp.topic, {})[str(tp.partition)] = int(fut.result().offset)
                return out

        return retrying(list_offsets, what=what, error=KafkaSinkError,
                        timeout=self.options.metadata_retry_timeout)
