"""One task attempt of the exactly-once Kafka sink, in any delivery mode and over any
transport (docs/design.md, "Kafka sink: recovery keys", steps 1 and 3, and "Kafka sink:
transports").

As in flink-connector-kafka (``KafkaWriter`` / ``ExactlyOnceKafkaWriter``), the mode is a
type, chosen once per task by ``KafkaSink.stage`` (``writer_for``), and so is the transport
(:mod:`connectors.kafka.sink.transport`, chosen on the driver):

- :class:`KafkaWriter`, the base (this module): the one task driver. Steps 1 and 3 of the
  protocol: a committed batch writes nothing; rows are routed by the sink itself, sent in
  seq order partition by partition, chunk by chunk, flushed, and any delivery error fails
  the task. What a mode adds are hooks: what it learns while the rows come (``look``), how
  step 2 finds what an earlier attempt wrote (``recover``), which transport serves the
  attempt (``open_transport``) and how its output becomes final (``complete``).
- :class:`~connectors.kafka.sink.recovery_key_mode.RecoveryKeyWriter`: the recovery-key
  header ``eo-rk`` on every record, a started marker before the first record, and on a
  retry a scan that skips what is already there. The whole task in one chunk.
- :class:`~connectors.kafka.sink.transactional_mode.TransactionalWriter`
  (``transactional=true``): one Kafka transaction per task attempt holds its rows and a
  commit fact (:mod:`connectors.kafka.sink.commit_facts`); the fence and one stable offset
  fetch run while the rows come. No recovery-key header, no sort, no scan; the rows stream
  chunk by chunk.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from connectors.core import failpoints
from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.core.sink_state import SinkState
from connectors.core.threads import Background
from connectors.kafka import clients
from connectors.kafka.common import FAMILY
from connectors.kafka.sink import ordering, targets
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.partitioner import ByteRuns, NullKeyRuns, null_key_start
from connectors.kafka.sink.rows import route, shape
from connectors.kafka.sink.transport import Chunk, ProducePath, Transport, note_librdkafka

log = logging.getLogger(__name__)

# Failpoints of the steps every mode shares (see the KafkaSink docstring; FP_MID_PRODUCE
# fires in ``Transport.send``).
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


def gather(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[list[pa.RecordBatch]]:
    """The non-empty Arrow batches in groups of at least ``size`` bytes (0: one each); the
    last group may be smaller."""
    group: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        group.append(batch)
        held += batch.nbytes
        if held >= size:
            yield group
            group, held = [], 0
    if group:
        yield group


class KafkaWriter:
    """One task attempt writing batch B, writer partition w: steps 1 and 3, and the hooks
    a delivery mode fills in (step 2, and which transport serves the attempt)."""

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo,
                 path: ProducePath) -> None:
        self.options = options
        self.state = state
        self.task = task
        self.path = path
        self.sink_id = options.sink_id
        self.report = TaskReport(writer=task.writer_id, attempt=task.attempt)
        self.began = 0.0

    def write(self, batches: Iterator[pa.RecordBatch]) -> TaskReport:
        """The task driver of every mode and transport: admit, look (step 2) while the
        rows come, then send chunk after chunk, flush and make the records final."""
        self.began = began = time.perf_counter()
        report = self.report
        if not self.admitted():
            drain(batches)
            return report
        # The transport first: a new client connects while Spark hands over the task's rows
        # (the source's read, upstream in the same task, often takes longer).
        self.transport = self.open_transport()
        with self.attempt():
            first = self.first_rows(batches)
            if first is None:
                return report
            chunks = self.chunks(itertools.chain([first], batches))
            head = self.recover(next(chunks))  # 2. (the mode's)
            report.rows += head.rows.n
            if report.already_committed:
                report.rows += drain(batches)  # the task's rows, all the same
                return report
            # 3. Send chunk after chunk (ascending seq per partition), flush, fail on any
            #    delivery error, make the records final.
            report.setup_seconds = time.perf_counter() - began - report.input_seconds
            prefix = self.header_prefix()
            self.transport.begin()
            for chunk in itertools.chain([head], chunks):
                last = time.perf_counter()
                self.count(chunk)
                if chunk is not head:  # counted above
                    report.rows += chunk.rows.n
                report.produced += self.transport.send(chunk, report.produced, prefix)
            self.transport.flush()
            # The last chunk's send and the flush: what the task waits for after its input.
            report.flush_seconds = time.perf_counter() - last
            failpoints.hit(FP_AFTER_FLUSH, self.task.batch_id)
            self.complete()
        return self.finish(began)

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        """The transport's lifecycle around one attempt: settled on failure (a clearer error
        where it has one), then closed."""
        try:
            yield
        except BaseException as e:
            self.on_failure()
            better = self.transport.explain(e)
            if better is not None:
                raise better from None
            raise
        finally:
            self.transport.close()
            self.release()

    def first_rows(self, batches: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
        """The task's first non-empty Arrow batch (None: it has none). The mode's look
        (:meth:`look`, 2T) runs on a thread of its own meanwhile and is joined, failed or
        not; a broker too old for the wire path is met there (a transactional one) and
        the attempt goes on with librdkafka."""
        look = Background(self.look, name="eo-kafka-sink-fence") if self.looks else None
        try:
            first = next((x for x in batches if x.num_rows), None)
        finally:
            self.report.input_seconds = time.perf_counter() - self.began
            if look is not None:
                look.join()
        if look is not None:
            try:
                look.result()
            except Exception as e:
                old = clients.broker_refusal(e)  # brokers older than Kafka 3.6
                if old is None:
                    raise
                note_librdkafka(old)
                self.transport.close()
                self.transport = self.open_transport(wire_ok=False)
                self.look()  # librdkafka's init_transactions fences the wire producer's epoch
        return first

    def chunks(self, batches: Iterator[pa.RecordBatch]) -> Iterator[Chunk]:
        """The task's rows shaped, routed and put in send order, chunk by chunk: Arrow
        batches gathered to the transport's ``chunk_bytes``, or, where the mode needs them
        (:meth:`whole_task`), all of the task's rows in one chunk, ordered (:meth:`row_order`)."""
        topic, sink_id = self.options.topic, self.sink_id
        if self.whole_task():
            table = pa.Table.from_batches(list(batches))
            self.report.input_seconds = time.perf_counter() - self.began
            numbering = self.row_order()
            if numbering is not None and not self.options.deterministic_order:
                table = ordering.deterministic_order(table, numbering)
            tables: Iterator[pa.Table] = iter([table])
        else:
            tables = (pa.Table.from_batches(group)
                      for group in gather(batches, self.transport.chunk_bytes))
        counts: dict[str, int] = {}
        runs: NullKeyRuns | None = None  # carried from chunk to chunk
        for table in tables:
            rows = shape(table, topic, sink_id)
            missing = [t for t in rows.topics if t not in counts]
            if missing:
                counts.update(self.partition_counts(missing))
            if runs is None:
                runs = self.null_key_runs()
            routing = route(rows, counts, sink_id, runs)
            # Seq order matters only within a target partition (that is what the max-seq
            # rule reads). Sending partition by partition fills one partition's batches at
            # a time instead of interleaving small ones.
            yield Chunk(rows, routing, np.argsort(routing.target_ids, kind="stable"))

    def count(self, chunk: Chunk) -> None:
        """Add a chunk's rows per target partition to the task's report."""
        for t, parts in chunk.routing.partition_counts().items():
            dst = self.report.partitions.setdefault(t, {})
            for p, n in parts.items():
                dst[p] = dst.get(p, 0) + n

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
    #: Whether the mode looks (:meth:`look`) while the task's first rows come.
    looks = False

    def whole_task(self) -> bool:
        """Whether the mode needs all of the task's rows before the first is sent."""
        return True

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

    def open_transport(self, wire_ok: bool = True) -> Transport:
        """The attempt's transport, on the path the driver chose (``wire_ok=False``: never
        the wire)."""
        raise NotImplementedError

    def look(self) -> None:
        """2T. (where :attr:`looks`) What the mode learns before the rows come."""

    def recover(self, head: Chunk) -> Chunk:
        """Step 2, once the first chunk is routed: what earlier attempts wrote. Returns the
        chunk without the rows already written (or sets ``report.already_committed``)."""
        return head

    def header_prefix(self) -> bytes | None:
        """The recovery-key header of this attempt's records, without the seq (None: no
        header)."""
        return None

    def complete(self) -> None:
        """After the flush: make the attempt's records final."""

    def on_failure(self) -> None:
        """The attempt failed: settle or give up what it sent."""
        self.transport.abort()

    def release(self) -> None:
        """The attempt is over, failed or not (after the transport closed)."""

    def fetch_partition_counts(self, topics: list[str]) -> dict[str, int]:
        return targets.partition_counts(self.options, topics)

    def watermarks(self, tps: list[tuple[str, int]]) -> dict[str, dict[str, int]]:
        """High watermarks ("latest") of the target partitions, before anything is produced
        (ListOffsets, read_uncommitted, over the process's cluster: transient errors such as
        a leader election are asked again until ``metadataRetryTimeout``)."""
        names = ", ".join(f"{t}[{p}]" for t, p in tps[:5]) + (" ..." if len(tps) > 5 else "")
        with clients.lease(self.options.producer_conf) as cluster:
            got = cluster.list_offsets(
                dict.fromkeys(tps, -1), committed=False, who=f"{FAMILY} {self.sink_id}",
                error=KafkaSinkError, timeout=self.options.metadata_retry_timeout,
                what=f"{FAMILY} {self.sink_id}: ListOffsets (end offsets for the started "
                     f"marker) of {names}")
        out: dict[str, dict[str, int]] = {}
        for (t, p), offset in got.items():
            out.setdefault(t, {})[str(p)] = int(offset)
        return out