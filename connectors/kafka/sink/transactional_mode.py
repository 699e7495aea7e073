"""The transactional delivery mode of the exactly-once Kafka sink (``transactional=true``;
docs/design.md, "Kafka sink: transactional path").

:class:`TransactionalWriter`: one Kafka transaction per task attempt holds its rows and a
commit fact (:mod:`connectors.kafka.sink.commit_facts`); ``init_transactions`` fences a
zombie attempt first, then one stable offset fetch tells whether an earlier attempt
committed. No recovery-key header, no sort, no scan. The rows go out as Kafka record batches
built from the Arrow buffers (:mod:`connectors.kafka.sink.wire`), or, where that path does not
apply, to librdkafka, an Arrow batch per call (:mod:`connectors.kafka.sink.batch_produce`).
The steps every mode shares are :class:`connectors.kafka.sink.writer.KafkaWriter`'s.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.core import failpoints
from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.core.sink_state import SinkState
from connectors.core.threads import Background
from connectors.kafka import access
from connectors.kafka.common import FAMILY, Lease
from connectors.kafka.sink import batch_produce, commit_facts, producers, recovery, wire
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.partitioner import NullKeyRuns
from connectors.kafka.sink.producers import ProducerSlot
from connectors.kafka.sink.rows import Routing, Rows, route, shape
from connectors.kafka.sink.writer import (
    FP_AFTER_FLUSH,
    FP_MID_PRODUCE,
    KafkaWriter,
    TaskReport,
    drain,
)
from connectors.monitoring import channel

log = logging.getLogger(__name__)

# Failpoint after this mode's commit (see the KafkaSink docstring).
FP_AFTER_TXN_COMMIT = "kafka_sink.after_txn_commit"


class TransactionalWriter(KafkaWriter):
    """``transactional=true``: one Kafka transaction per task attempt holds its rows and
    its commit fact (docs/design.md, "Kafka sink: transactional path").

    ``init_transactions`` (with transactional.id ``<sink_id>-<w>``) fences any earlier
    attempt of (B, w) and completes or aborts its open transaction; one stable offset fetch
    then tells whether that attempt committed. If it did, this one writes nothing and
    reports the counts the fact recorded; otherwise it produces every row (no recovery-key
    header unless ``recoveryKeyHeaders=true``, no sort), adds the fact, and commits.
    """

    def row_order(self) -> str | None:
        return None  # one transaction per attempt: no seq to number

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo) -> None:
        super().__init__(options, state, task)
        self.facts: commit_facts.FactWriter | None = None
        self.facts_lease: Lease[commit_facts.FactWriter] | None = None
        self.in_txn = False
        self.fact: commit_facts.CommitFact | None = None

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
        # Both clients are created here and connect in the background while the rows come;
        # fence() then fences and reads.
        self.facts_lease = commit_facts.fact_writer(
            self.options.producer_conf, self.sink_id, self.task.writer_id,
            self.options.facts_topic, self.options.connect_timeout)
        self.facts = self.facts_lease.client
        try:
            return producers.transactional_producer(
                self.options.producer_conf, self.sink_id, self.task.writer_id)
        except BaseException:
            self.facts_lease.release()
            self.facts_lease, self.facts = None, None
            raise

    def write(self, batches: Iterator[pa.RecordBatch]) -> TaskReport:
        topic = self.options.topic
        if topic is None or self.options.recovery_key_headers:
            # A topic column needs every row's topic (and its partition count) first, and
            # recovery keys number the task's rows: both need the whole task first.
            return super().write(batches)
        if self.options.wire_produce:
            why = wire.unsupported(self.options.producer_conf)
            if why is None:
                return self.write_wire(iter(batches), topic)
            wire.note_skipped(f"{FAMILY} {self.sink_id}: {why}")
        return self.write_streaming(iter(batches), topic)

    def write_streaming(self, batches: Iterator[pa.RecordBatch], topic: str,
                        admitted: bool = False) -> TaskReport:
        """The whole task in one transaction, produced Arrow batch by Arrow batch as Spark
        hands them over: the JVM's conversion of the next batch overlaps producing this one,
        and the task holds one batch, not all of its rows."""
        began = time.perf_counter()
        report = self.report
        if not admitted and not self.admitted():
            drain(batches)
            return report
        slot = self.open_producer()
        with self.attempt(slot):
            # 2T. runs on a thread of its own while Spark hands over the first rows (the
            # source's read, upstream in the same task): the fence and the fact read are
            # done when they come. The marker (2E) still waits for a row.
            fence = Background(lambda: self.fence(slot), name="eo-kafka-sink-fence")
            first = self.first_rows(batches, fence, began)
            fence.result()
            if first is None:
                return report
            counts = self.partition_counts([topic])
            self.settle_fact()
            if report.already_committed:
                report.rows = first.num_rows + drain(batches)  # the task's rows, as below
                return report
            # 3T. One transaction: every row, then the commit fact, then commit.
            report.setup_seconds = time.perf_counter() - began - report.input_seconds
            self.begin(slot)
            runs = self.null_key_runs()  # carried from batch to batch
            for batch in itertools.chain([first], batches):
                if not batch.num_rows:
                    continue
                rows = shape(pa.Table.from_batches([batch]), topic, self.sink_id)
                routing = route(rows, counts, self.sink_id, runs)
                order = np.argsort(routing.target_ids, kind="stable")
                report.produced += self.produce(slot, rows, routing.parts, order,
                                                done=report.produced)
                report.rows += rows.n
                self.count(routing)
            self.settle(slot, None)
        return self.finish(began)

    def write_wire(self, batches: Iterator[pa.RecordBatch], topic: str) -> TaskReport:
        """:meth:`write_streaming` with record batches built from the Arrow buffers and sent
        with Kafka's own requests (:mod:`connectors.kafka.sink.wire`), in chunks of about
        ``wire.CHUNK_BYTES``: the same steps, the same transaction and commit fact."""
        began = time.perf_counter()
        report = self.report
        if not self.admitted():
            drain(batches)
            return report
        self.facts_lease = commit_facts.fact_writer(
            self.options.producer_conf, self.sink_id, self.task.writer_id,
            self.options.facts_topic, self.options.connect_timeout)
        self.facts = self.facts_lease.client
        producer = wire.WireProducer(
            wire.Settings.of(self.options.producer_conf),
            producers.transactional_id(self.sink_id, self.task.writer_id),
            f"{FAMILY} {self.sink_id}", self.options.metadata_retry_timeout)
        group = commit_facts.group_id(self.sink_id, self.task.writer_id)

        def fence() -> None:
            self.fence(producer)
            producer.prepare(topic, group)  # the leaders and the fact's coordinator

        with self.wire_attempt(producer, topic):
            # 2T. during the wait for the first rows, as in write_streaming.
            fence_thread = Background(fence, name="eo-kafka-sink-fence")
            first = self.first_rows(batches, fence_thread, began)
            try:
                fence_thread.result()
                fallback = first is not None and "headers" in first.schema.names
            except wire.UnsupportedBroker as e:
                # A broker older than Kafka 2.1: librdkafka negotiates older versions.
                wire.note_skipped(str(e))
                fallback = True
            if not fallback:
                if first is None:
                    return report
                self.send_wire(producer, itertools.chain([first], batches), topic, began)
                return self.finish(began)
        # Record headers (or an old broker) go through librdkafka; its init_transactions
        # fences this producer's epoch (it opened no transaction).
        rest = batches if first is None else itertools.chain([first], batches)
        return self.write_streaming(rest, topic, admitted=True)

    @contextlib.contextmanager
    def wire_attempt(self, producer: wire.WireProducer, topic: str) -> Iterator[None]:
        """A wire attempt's end: on failure its transaction is aborted (and an access
        error names the ACL to grant); always, its connections and fact client go."""
        b, w = self.task.batch_id, self.task.writer_id
        try:
            yield
        except wire.WireError as e:
            self.abandon(producer)
            denied = access.denied(
                e, who=f"{FAMILY} {self.sink_id}", conf=self.options.producer_conf,
                needs=[a.bind(sink_id=self.sink_id, topic=topic,
                              facts_topic=self.options.facts_topic)
                       for a in access.ROLES["transactional-sink"]],
                request=f"batch {b} writer {w}")
            if denied is not None:
                raise KafkaSinkError(denied) from None
            raise
        except BaseException:
            self.abandon(producer)
            raise
        finally:
            producer.close()
            if self.facts_lease is not None:
                self.facts_lease.release()
                self.facts_lease, self.facts = None, None

    def send_wire(self, producer: wire.WireProducer, batches: Iterator[pa.RecordBatch],
                  topic: str, began: float) -> None:
        """2E and 3T on the wire: the fact decides; then every row in chunks, the commit
        fact, ``EndTxn(commit)``."""
        report = self.report
        b, w = self.task.batch_id, self.task.writer_id
        counts = self.partition_counts([topic])
        self.settle_fact()
        if report.already_committed:
            report.rows = drain(batches)
            return
        report.setup_seconds = time.perf_counter() - began - report.input_seconds
        runs = self.null_key_runs()  # carried from chunk to chunk
        chunk: list[pa.RecordBatch] = []
        size = 0
        for batch in batches:
            if not batch.num_rows:
                continue
            chunk.append(batch)
            size += batch.nbytes
            if size >= wire.CHUNK_BYTES:
                self.produce_chunk(producer, chunk, topic, counts, runs)
                chunk, size = [], 0
        flushed = time.perf_counter()
        if chunk:
            self.produce_chunk(producer, chunk, topic, counts, runs)
        report.flush_seconds = time.perf_counter() - flushed
        failpoints.hit(FP_AFTER_FLUSH, b)
        committed = time.perf_counter()
        fact = commit_facts.CommitFact(b, report.produced, report.partitions,
                                       commit_facts.scope_of(self.options.wal_path))
        # A NUL after the JSON: confluent-kafka's read stops there (CommitFact.decode).
        producer.send_offset(commit_facts.group_id(self.sink_id, w), self.options.facts_topic,
                             0, commit_facts.FACT_OFFSET, fact.encode() + "\x00")
        producer.end(commit=True)
        report.commit_seconds = time.perf_counter() - committed
        failpoints.hit(FP_AFTER_TXN_COMMIT, b)

    def produce_chunk(self, producer: wire.WireProducer, chunk: list[pa.RecordBatch],
                      topic: str, counts: dict[str, int], runs: NullKeyRuns) -> None:
        """Route one chunk of rows and send it; the ``mid_produce`` failpoint fires at its
        exact count, once that many records are acknowledged."""
        report = self.report
        rows = shape(pa.Table.from_batches(chunk), topic, self.sink_id)
        routing = route(rows, counts, self.sink_id, runs)
        order = np.argsort(routing.parts, kind="stable")
        armed = failpoints.wants_count(FP_MID_PRODUCE)
        for _, piece in self.pieces(rows, order, report.produced, armed):
            report.produced += producer.produce(topic, counts[topic], rows.value_array,
                                                rows.keys, routing.parts, piece)
            self.mid_produce(producer, report.produced, armed)
        report.rows += rows.n
        self.count(routing)

    def first_rows(self, batches: Iterator[pa.RecordBatch], fence: Background[None],
                   began: float) -> pa.RecordBatch | None:
        """The task's first non-empty Arrow batch (None: it has none), with ``fence`` (2T,
        on its thread meanwhile) joined, failed or not; the caller takes its result."""
        try:
            return next((x for x in batches if x.num_rows), None)
        finally:
            self.report.input_seconds = time.perf_counter() - began
            fence.join()

    def count(self, routing: Routing) -> None:
        """Add a chunk's rows per target partition to the task's report."""
        for t, parts in routing.partition_counts().items():
            dst = self.report.partitions.setdefault(t, {})
            for p, n in parts.items():
                dst[p] = dst.get(p, 0) + n

    def abandon(self, producer: wire.WireProducer) -> None:
        """A failed wire attempt: abort its transaction (the retry's InitProducerId would
        abort it too) and drop the fact client, whose state is unknown."""
        if self.facts_lease is not None:
            self.facts_lease.discard()
            self.facts_lease, self.facts = None, None
        if not producer.open:
            return
        if producer.uncertain and not producer.tv2:
            # A request whose outcome is unknown may still reach a broker: an abort now could
            # let it land after the markers. The retry's InitProducerId bumps the epoch
            # instead, which aborts this transaction and fences anything of it still in
            # flight (docs/design.md, "The wire client's failures", 7). Under transactions
            # v2 the abort itself bumps the epoch, so it is sent.
            log.info("%s %s: requests of the failed attempt have an unknown outcome; its "
                     "transaction is left to the retry's InitProducerId to abort", FAMILY,
                     self.sink_id)
            return
        try:
            producer.end(commit=False)
        except Exception as e:  # noqa: BLE001 - the retry's InitProducerId fences it
            log.warning("%s %s: aborting the transaction of a failed task: %s", FAMILY,
                        self.sink_id, e)
            return
        self.aborted()

    def aborted(self) -> None:
        """This failing attempt aborted its transaction: counted where it ran (its report
        never reaches a commit; docs/monitoring.md)."""
        channel.count_event(FAMILY, self.sink_id, self.task.batch_id, transactions_aborted=1)

    def recover(self, rows: Rows, routing: Routing, slot: ProducerSlot) -> np.ndarray | None:
        # 2T. (the whole-task path) Fence, then read the commit fact; 2E.
        self.fence(slot)
        self.settle_fact()
        return None

    def fence(self, slot: ProducerSlot | wire.WireProducer) -> None:
        """2T. Fence earlier attempts of (B, w), then read their commit fact
        (``self.fact``)."""
        began = time.perf_counter()
        # Fence first: init_transactions completes or aborts an earlier attempt's open
        # transaction, so the fact read below sees its outcome.
        if isinstance(slot, wire.WireProducer):
            slot.init(self.options.flush_timeout)
        else:
            producers.init_transactions(slot, self.options.flush_timeout)
        if self.facts is None:
            raise KafkaSinkError(f"{FAMILY} {self.sink_id}: no commit-fact client (internal)")
        self.fact = self.facts.read(self.options.facts_topic, self.task.batch_id,
                                    commit_facts.scope_of(self.options.wal_path),
                                    self.options.metadata_retry_timeout)
        self.report.scan_seconds = time.perf_counter() - began

    def settle_fact(self) -> None:
        """After :meth:`fence`, once the task has rows: sets ``already_committed`` from the
        fact; with no fact, the started marker guards against a fact Kafka expired (2E)."""
        b = self.task.batch_id
        fact = self.fact
        report = self.report
        report.retry = self.task.attempt > 0 or fact is not None
        # 2E. No fact: create the task's started marker first, or, when an earlier attempt
        #     did, refuse if its fact may have expired (commit_facts.guard_expiry).
        if fact is None:
            write, earlier = commit_facts.guard_expiry(
                self.state, self.options.producer_conf, self.sink_id, b, self.task.writer_id,
                self.options.expired_fact_policy, self.options.metadata_retry_timeout)
            if earlier:
                # That attempt began and never committed: fence() ended it (a zombie's open
                # transaction aborted) or it had failed. Counted, never as output.
                report.retry = True
                report.fenced = 1
            if not write:
                fact = commit_facts.CommitFact(b, 0)  # expiredFactPolicy=skip
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
        # 3T. (end) The commit fact goes into the transaction, which then commits.
        fact = commit_facts.CommitFact(self.task.batch_id, report.produced, report.partitions,
                                       commit_facts.scope_of(self.options.wal_path))
        if self.facts is None:
            raise KafkaSinkError(f"{FAMILY} {self.sink_id}: no commit-fact client (internal)")
        self.facts.send(slot.producer, self.options.facts_topic, fact, timeout)
        slot.producer.commit_transaction(timeout)
        self.in_txn = False  # committed: a failure after this has no transaction to abort
        report.commit_seconds = time.perf_counter() - began
        failpoints.hit(FP_AFTER_TXN_COMMIT, self.task.batch_id)

    def on_failure(self, slot: ProducerSlot) -> None:
        if self.facts_lease is not None:
            self.facts_lease.discard()  # its state is unknown after an error
            self.facts_lease, self.facts = None, None
        if not self.in_txn:
            return
        try:
            slot.producer.abort_transaction(min(self.options.flush_timeout, 30.0))
        except Exception as e:  # noqa: BLE001 - the retry's init_transactions fences it
            log.warning("%s %s: abort_transaction after a failed task: %s", FAMILY,
                        self.sink_id, e)
            return
        self.aborted()

    def release(self, slot: ProducerSlot) -> None:
        # A transactional producer serves one task attempt: release it now, not whenever
        # the garbage collector gets to it (a failed attempt's producer is kept alive by
        # the exception's traceback).
        producers.close_producer(slot.producer, min(self.options.flush_timeout, 30.0))
        if self.facts_lease is not None:
            self.facts_lease.release()

