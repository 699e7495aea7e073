"""The delivery modes of the exactly-once Kafka sink, one task attempt each (DESIGN.md s. 6).

As in flink-connector-kafka (``KafkaWriter`` / ``ExactlyOnceKafkaWriter``), the mode is a
type, chosen once per task by ``KafkaSink.stage``:

- :class:`KafkaWriter`, the base: steps 1 and 3 of the protocol. A committed batch writes
  nothing; rows are routed by the sink itself, produced in seq order partition by partition,
  flushed, and any delivery error fails the task. What a mode adds are hooks: how step 2
  finds what an earlier attempt wrote (``recover``), which producer serves the attempt
  (``open_producer``) and how its output becomes final or is given up (``begin``,
  ``complete``, ``on_failure``, ``release``).
- :class:`RecoveryKeyWriter`: the recovery-key header ``eo-rk`` on every record, a started
  marker before the first record, and on a retry a scan that skips what is already there. A
  cached idempotent producer per worker.
- :class:`TransactionalWriter` (``transactional=true``): one Kafka transaction per task
  attempt holds its rows and a commit fact (:mod:`connectors.kafka.sink.commit_facts`);
  ``init_transactions`` fences a zombie attempt first, then one stable offset fetch tells
  whether an earlier attempt committed. No recovery-key header, no sort, no scan; each
  Arrow batch goes to librdkafka in one call (:mod:`connectors.kafka.sink.batch_produce`).
"""

from __future__ import annotations

import contextlib
import itertools
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
from connectors.kafka.common import FAMILY, retrying
from connectors.kafka.sink import batch_produce, commit_facts, producers, recovery, targets
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.producers import ProducerSlot
from connectors.kafka.sink.rows import Routing, Rows, deterministic_order, picker, route, shape

log = logging.getLogger(__name__)

# Failpoints, one per protocol step (see the KafkaSink docstring).
FP_AFTER_MARKER = "kafka_sink.after_marker"
FP_MID_PRODUCE = "kafka_sink.mid_produce"
FP_AFTER_FLUSH = "kafka_sink.after_flush"
FP_AFTER_TXN_COMMIT = "kafka_sink.after_txn_commit"



@dataclass
class TaskReport:
    """The stage message of one task (picklable, small)."""

    writer: int
    attempt: int
    rows: int = 0
    produced: int = 0
    skipped: int = 0
    retry: bool = False
    already_committed: bool = False
    scan_records: int = 0
    scan_seconds: float = 0.0
    commit_seconds: float = 0.0  # transactional: commit fact + commit_transaction
    seconds: float = 0.0
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)


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
        chunks = list(batches)
        if not self.admitted():
            return report
        table = pa.Table.from_batches(chunks) if chunks else None
        if table is None or table.num_rows == 0:
            return report
        # The producer first: a new client connects while the rows are shaped and routed.
        slot = self.open_producer()
        with self.attempt(slot):
            if self.ordered and not self.options.deterministic_order:
                table = deterministic_order(table)
            rows = shape(table, self.options.topic, self.sink_id)
            report.rows = rows.n
            routing = route(rows, self.partition_counts(rows.topics), self.sink_id)
            # 2. (the mode's) Which rows did earlier attempts of (B, w) already write?
            skip = self.recover(rows, routing, slot)
            if report.already_committed:
                return report
            # 3. Produce in seq order, flush, fail on any delivery error.
            self.begin(slot)
            todo = np.arange(rows.n) if skip is None else np.nonzero(~skip)[0]
            # Seq order matters only within a target partition (that is what the max-seq
            # rule reads). Producing partition by partition lets librdkafka fill one
            # partition's batches at a time instead of interleaving small ones.
            order = todo[np.argsort(routing.target_ids[todo], kind="stable")]
            report.produced = self.produce(slot.producer, rows, routing.parts, order)
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
        self.flush(slot)
        failpoints.hit(FP_AFTER_FLUSH, self.task.batch_id)
        self.complete(slot, rows, self.report)

    def admitted(self) -> bool:
        """1. A committed batch writes nothing (a replay after the driver crashed between our
        commit and Spark's own commit log). Ownership and the batch order come first
        (SinkState.admit): another sink's commit of batch b, or a lower batch id, must not
        pass for a replay."""
        b, w = self.task.batch_id, self.task.writer_id
        if self.state.admit(FAMILY, self.sink_id, b, recovery.RESET_COMMAND):
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
    #: Whether rows are put in a deterministic order first (the recovery keys' seq needs it).
    ordered = True

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
    def produce(self, producer: Any, rows: Rows, parts: np.ndarray, todo: np.ndarray,
                done: int = 0) -> int:
        """Produce the rows ``todo`` in that order (ascending seq per partition); ``done``
        records of this attempt went before (the ``mid_produce`` failpoint counts them)."""
        rk = self.batch_handle(producer, rows)
        if rk is not None:
            return self.produce_batched(producer, rk, rows, parts, todo, done)
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

    def produce_batched(self, producer: Any, rk: int, rows: Rows, parts: np.ndarray,
                        todo: np.ndarray, done: int) -> int:
        """``produce`` with ``rd_kafka_produce_batch``, one call per run of one topic (``todo``
        is grouped by target); the ``mid_produce`` failpoint fires at its exact count, then
        after each call."""
        armed = failpoints.wants_count(FP_MID_PRODUCE)

        def wait() -> None:  # the queue is full: let librdkafka send some of it
            producer.poll(0.001)

        count = done
        topic_of = rows.topic_idx[todo]
        for run in np.split(todo, np.flatnonzero(np.diff(topic_of)) + 1):
            topic = rows.topics[int(rows.topic_idx[run[0]])]
            pieces = [run]
            if armed is not None and count < armed < count + len(run):
                pieces = [run[:armed - count], run[armed - count:]]
            for piece in pieces:
                count += batch_produce.produce(rk, topic, rows.value_array, rows.keys, parts, piece,
                                        wait)
                self.mid_produce(producer, count, armed)
        return count - done

    def flush(self, slot: ProducerSlot) -> None:
        b, w, timeout = self.task.batch_id, self.task.writer_id, self.options.flush_timeout
        remaining = slot.producer.flush(timeout)
        if remaining:
            raise KafkaSinkError(
                f"{FAMILY} {self.sink_id}: {remaining} records of batch {b} writer {w} were "
                f"not delivered within flushTimeout={timeout:.0f}s"
            )
        if slot.errors:
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

        admin = producers.admin(self.options.producer_conf)

        def list_offsets() -> dict[str, dict[str, int]]:
            futures = admin.list_offsets(
                {TopicPartition(t, p): OffsetSpec.latest() for t, p in tps},
                isolation_level=IsolationLevel.READ_UNCOMMITTED,
                request_timeout=30,
            )
            out: dict[str, dict[str, int]] = {}
            for tp, fut in futures.items():
                out.setdefault(tp.topic, {})[str(tp.partition)] = int(fut.result().offset)
            return out

        names = ", ".join(f"{t}[{p}]" for t, p in tps[:5]) + (" ..." if len(tps) > 5 else "")
        return retrying(
            list_offsets,
            what=f"{FAMILY} {self.sink_id}: ListOffsets (end offsets for the started marker) "
                 f"of {names}",
            error=KafkaSinkError, timeout=self.options.metadata_retry_timeout,
        )


class RecoveryKeyWriter(KafkaWriter):
    """Recovery keys and started markers; a cached idempotent producer per worker."""

    #: What a retry's scan counts as written.
    isolation = "read_uncommitted"

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo) -> None:
        super().__init__(options, state, task)
        self.markers = recovery.MarkerStore(state.storage, state.root, state)
        self.marker: recovery.StartedMarker | None = None

    def header_prefix(self) -> bytes:
        return recovery.key_prefix(self.sink_id, self.task.batch_id, self.task.writer_id)

    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        """A retry routes with the counts its first attempt recorded, so partitions added
        in between do not move its rows."""
        self.marker = self.markers.get(self.task.batch_id, self.task.writer_id)
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
                                 self.options.scan_timeout)
        finally:
            consumer.close()

    def open_producer(self) -> ProducerSlot:
        slot = producers.cached_producer(self.options.producer_conf)
        # Anything a failed earlier task left in this worker's producer must be settled
        # before this task scans, or the scan could miss records still in flight.
        slot.producer.flush(self.options.flush_timeout)
        slot.errors.clear()
        return slot

    def on_failure(self, slot: ProducerSlot) -> None:
        # Settle or drop what the failed attempt queued: its retry may run in this worker
        # and must not race records of this attempt still in flight.
        left = slot.producer.flush(min(self.options.flush_timeout, 30.0))
        if left:
            slot.producer.purge()
        producers.evict_producer(self.options.producer_conf)


class TransactionalWriter(KafkaWriter):
    """``transactional=true``: one Kafka transaction per task attempt holds its rows and
    its commit fact (DESIGN.md section 6, "Transactional mode").

    ``init_transactions`` (with transactional.id ``<sink_id>-<w>``) fences any earlier
    attempt of (B, w) and completes or aborts its open transaction; one stable offset fetch
    then tells whether that attempt committed. If it did, this one writes nothing and
    reports the counts the fact recorded; otherwise it produces every row (no recovery-key
    header unless ``recoveryKeyHeaders=true``, no sort), adds the fact, and commits.
    """

    ordered = False

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo) -> None:
        super().__init__(options, state, task)
        self.facts: commit_facts.FactWriter | None = None
        self.topics: list[str] = []
        self.in_txn = False

    def header_prefix(self) -> bytes | None:
        if not self.options.recovery_key_headers:
            return None
        return recovery.key_prefix(self.sink_id, self.task.batch_id, self.task.writer_id)

    def batch_handle(self, producer: Any, rows: Rows) -> int | None:
        # Safe here: librdkafka refuses to commit a transaction with a failed delivery, so
        # the delivery reports batch produce does not see still fail the task.
        if not self.options.batch_produce or rows.headers is not None or self.header_prefix():
            return None
        return batch_produce.handle(producer)

    def open_producer(self) -> ProducerSlot:
        # Both clients are created here and connect in the background while the rows are
        # shaped; recover() then fences and reads.
        self.facts = commit_facts.fact_writer(self.options.producer_conf, self.sink_id,
                                          self.task.writer_id)
        return producers.transactional_producer(
            self.options.producer_conf, self.sink_id, self.task.writer_id)

    def write(self, batches: Iterator[pa.RecordBatch]) -> TaskReport:
        topic = self.options.topic
        if topic is None or self.options.recovery_key_headers:
            # The commit fact's place depends on every row's topic, and recovery keys number
            # the task's rows: both need the whole task first.
            return super().write(batches)
        return self.write_streaming(iter(batches), topic)

    def write_streaming(self, batches: Iterator[pa.RecordBatch], topic: str) -> TaskReport:
        """The whole task in one transaction, produced Arrow batch by Arrow batch as Spark
        hands them over: the JVM's conversion of the next batch overlaps producing this one,
        and the task holds one batch, not all of its rows."""
        began = time.perf_counter()
        report = self.report
        if not self.admitted():
            _drain(batches)
            return report
        first = next((x for x in batches if x.num_rows), None)
        if first is None:
            return report
        slot = self.open_producer()
        with self.attempt(slot):
            counts = self.partition_counts([topic])
            self.check_fact([topic], slot)
            if report.already_committed:
                report.rows = first.num_rows + _drain(batches)  # the task's rows, as below
                return report
            self.begin(slot)
            for batch in itertools.chain([first], batches):
                if not batch.num_rows:
                    continue
                rows = shape(pa.Table.from_batches([batch]), topic, self.sink_id)
                routing = route(rows, counts, self.sink_id)
                order = np.argsort(routing.target_ids, kind="stable")
                report.produced += self.produce(slot.producer, rows, routing.parts, order,
                                                done=report.produced)
                report.rows += rows.n
                for t, parts in routing.partition_counts().items():
                    dst = report.partitions.setdefault(t, {})
                    for p, n in parts.items():
                        dst[p] = dst.get(p, 0) + n
            self.settle(slot, None)
        return self.finish(began)

    def recover(self, rows: Rows, routing: Routing, slot: ProducerSlot) -> np.ndarray | None:
        self.check_fact(list(rows.topics), slot)
        return None

    def check_fact(self, topics: list[str], slot: ProducerSlot) -> None:
        """Fence, then read the fact of an earlier attempt (sets ``already_committed``)."""
        b = self.task.batch_id
        self.topics = topics
        began = time.perf_counter()
        # Fence first: init_transactions completes or aborts an earlier attempt's open
        # transaction, so the fact read below sees its outcome.
        producers.init_transactions(slot, self.options.flush_timeout)
        if self.facts is None:
            raise KafkaSinkError(f"{FAMILY} {self.sink_id}: no commit-fact client (internal)")
        fact = self.facts.read(self.topics, b, self.options.metadata_retry_timeout)
        report = self.report
        report.scan_seconds = time.perf_counter() - began
        report.retry = self.task.attempt > 0 or fact is not None
        if fact is not None:
            # An earlier attempt of (B, w) committed its transaction: its rows are there.
            report.already_committed = True
            report.skipped = fact.rows
            report.partitions = fact.partitions
            log.info("%s %s: batch %d writer %d: an earlier attempt committed %d rows; this "
                     "one writes nothing", FAMILY, self.sink_id, b, self.task.writer_id,
                     fact.rows)

    def begin(self, slot: ProducerSlot) -> None:
        slot.producer.begin_transaction()
        self.in_txn = True

    def complete(self, slot: ProducerSlot, rows: Rows | None, report: TaskReport) -> None:
        began = time.perf_counter()
        timeout = self.options.flush_timeout
        fact = commit_facts.CommitFact(self.task.batch_id, report.produced, report.partitions)
        if self.facts is None:
            raise KafkaSinkError(f"{FAMILY} {self.sink_id}: no commit-fact client (internal)")
        self.facts.send(slot.producer, self.topics, fact, timeout)
        slot.producer.commit_transaction(timeout)
        report.commit_seconds = time.perf_counter() - began
        failpoints.hit(FP_AFTER_TXN_COMMIT, self.task.batch_id)

    def on_failure(self, slot: ProducerSlot) -> None:
        if self.facts is not None:
            commit_facts.drop_fact_writer(self.facts)  # its state is unknown after an error
            self.facts = None
        if not self.in_txn:
            return
        try:
            slot.producer.abort_transaction(min(self.options.flush_timeout, 30.0))
        except Exception as e:  # noqa: BLE001 - the retry's init_transactions fences it
            log.warning("%s %s: abort_transaction after a failed task: %s", FAMILY,
                        self.sink_id, e)

    def release(self, slot: ProducerSlot) -> None:
        # A transactional producer serves one task attempt: release it now, not whenever
        # the garbage collector gets to it (a failed attempt's producer is kept alive by
        # the exception's traceback).
        producers.close_producer(slot.producer, min(self.options.flush_timeout, 30.0))


def _drain(batches: Iterator[pa.RecordBatch]) -> int:
    """Read what Spark still hands over (as the whole-task path does before deciding);
    returns the number of rows."""
    return sum(batch.num_rows for batch in batches)


def writer_for(options: KafkaSinkOptions, state: SinkState, task: TaskInfo) -> KafkaWriter:
    """The delivery mode the options choose, for one task attempt."""
    mode = TransactionalWriter if options.transactional else RecoveryKeyWriter
    return mode(options, state, task)
