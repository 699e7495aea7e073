"""Adapts the one sink protocol (``connectors.core.sink``) to Spark, once, for every sink.

Two adapters, same protocol underneath:

- ``SinkStreamWriter`` / ``SinkBatchWriter``: the Python DataSource writers behind
  ``writeStream.format("eo_jdbc")`` and ``df.write.format(...)``. Executors run
  ``write(iterator of RecordBatch)`` -> ``sink.stage``; Spark hands the winning attempts'
  messages to ``commit(messages, batchId)`` on the driver -> ``sink.commit``.
- ``write_dataframe(sink, df, batch_id)``: the ``foreachBatch`` path.
  ``df.mapInArrow(stage)`` runs ``sink.stage`` per partition and ``collect()`` brings the
  pickled messages to the driver, which calls ``sink.commit`` once.

The batch id on executors comes from the local property ``streaming.sql.batchId`` (stable on
replay), never from a task attempt id (it changes on retry).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from connectors.core import contact
from connectors.core.errors import ConnectorError, OptionError
from connectors.core.sink import BatchSink, TaskInfo
from connectors.monitoring import channel

log = logging.getLogger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"
_MESSAGE_SCHEMA = pa.schema([pa.field("message", pa.binary())])


@dataclass
class StagedMessage(WriterCommitMessage):
    """Carries a sink's stage message from an executor task to the driver's commit."""

    writer_id: int
    attempt: int
    payload: Any


def arrow_schema(schema: StructType) -> pa.Schema:
    """Spark schema -> Arrow schema, with timestamps as ``timestamp[us, UTC]`` like Spark's."""
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def _task_info(batch_id: int | None = None, offset: int = 0) -> TaskInfo:
    ctx = TaskContext.get()
    if ctx is None:
        raise ConnectorError("a sink's stage step ran outside a Spark task")
    # The driver's checks reached every system this task's sink uses before any task ran:
    # an outage met here is ridden through, never taken for a first contact.
    contact.in_task()
    if batch_id is None:
        prop = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if prop is None:
            raise ConnectorError(
                f"no '{BATCH_ID_PROPERTY}' local property in this task: the streaming writer "
                "was used outside a streaming query"
            )
        batch_id = int(prop) + offset  # the sink's numbering (see BatchSink.batch_offset)
    return TaskInfo(batch_id=batch_id, writer_id=ctx.partitionId(), attempt=ctx.attemptNumber())


def _unwrap(messages: Sequence[WriterCommitMessage | None]) -> list[Any]:
    return [m.payload if isinstance(m, StagedMessage) else None for m in messages]


def _commit(sink: BatchSink, batch_id: int, staged: Sequence[Any]) -> None:
    """``sink.commit`` with the winning attempts' payloads, once.

    Spark hands over exactly one attempt per writer partition; two messages for one
    partition would apply a partition twice, so they fail the batch before the sink sees
    them (the one duplicate-writer check of every sink).
    """
    messages = [m for m in staged if isinstance(m, StagedMessage)]
    writers = [m.writer_id for m in messages]
    if len(writers) != len(set(writers)):
        raise ConnectorError(
            f"{sink.family}: batch {batch_id} got two messages for one writer partition "
            f"({sorted(writers)}); exactly one attempt per partition may win; nothing was "
            "committed"
        )
    payloads = [m.payload for m in messages if m.payload is not None]
    # Spark's attemptNumber of a winning attempt is how many attempts of its task failed or
    # were superseded before it: counted as failures, never as output (docs/monitoring.md).
    failed = sum(max(0, int(m.attempt)) for m in messages)
    if failed:
        channel.count_event(sink.family, _sink_id(sink), batch_id, failed_attempts=failed)
    started = time.perf_counter()
    sink.commit(batch_id, payloads)
    log.info(
        "%s: committed batch %d (%d writer partitions) in %.1f ms",
        sink.family,
        batch_id,
        len(payloads),
        (time.perf_counter() - started) * 1000,
    )


def _abort(sink: BatchSink, batch_id: int, payloads: Sequence[Any | None]) -> None:
    """``sink.abort``, counted (``eo_sink_batches_aborted_total``)."""
    log.warning("%s: aborting batch %d", sink.family, batch_id)
    channel.abort_event(sink.family, _sink_id(sink), batch_id)
    sink.abort(batch_id, payloads)


def _sink_id(sink: BatchSink) -> str | None:
    try:
        value = sink.sink_id
    except AttributeError:
        return None
    return None if value is None else str(value)


def _staged(task: TaskInfo, payload: Any) -> StagedMessage:
    """A task's message; its process's storage counts go to the serving driver meanwhile."""
    channel.storage_totals()
    return StagedMessage(task.writer_id, task.attempt, payload)


def check_sink(sink: BatchSink, schema: pa.Schema, session: Any = None) -> None:
    """Driver-side checks before any task runs: the sink's own, then Spark's settings."""
    sink.check_schema(schema)
    sink.check_service()
    warn_if_speculative(sink, session)


_SPECULATION_WARNED = False


def warn_if_speculative(sink: BatchSink, session: Any = None) -> None:
    """Speculative twins are zombies a sink with a ``zombie_risk`` cannot see coming."""
    global _SPECULATION_WARNED
    if sink.zombie_risk is None or _SPECULATION_WARNED:
        return
    try:
        if session is None:
            from pyspark.sql import SparkSession

            session = SparkSession.getActiveSession()
        if session is None:
            return  # not on a Spark driver (a DataSource planner process): nothing to check
        enabled = str(session.conf.get("spark.speculation", "false")).strip().lower() == "true"
    except Exception:  # noqa: BLE001 - a warning only; never fail a write over it
        log.debug("could not read spark.speculation", exc_info=True)
        return
    if enabled:
        _SPECULATION_WARNED = True
        log.warning("%s: spark.speculation=true: %s", sink.family, sink.zombie_risk)


class SinkStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format(<sink>)``: one instance per micro-batch, built on the driver."""

    def __init__(self, sink: BatchSink) -> None:
        self.sink = sink
        # Read once on the driver, per micro-batch; tasks get it pickled with the writer.
        self.offset = sink.batch_offset()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        task = _task_info(offset=self.offset)
        return _staged(task, self.sink.stage(task, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _commit(self.sink, batchId + self.offset, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _abort(self.sink, batchId + self.offset, _unwrap(messages))


class SinkBatchWriter(DataSourceArrowWriter):
    """``df.write.format(<sink>).option("batchId", N)``: a one-off batch with a stable id."""

    def __init__(self, sink: BatchSink, batch_id: int) -> None:
        self.sink = sink
        self.batch_id = batch_id + sink.batch_offset()
        if not sink.admit(self.batch_id):
            log.info("%s: batch %d already committed; its tasks write nothing", sink.family,
                     batch_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        task = _task_info(self.batch_id)
        return _staged(task, self.sink.stage(task, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.sink, self.batch_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.sink, self.batch_id, _unwrap(messages))


def batch_id_option(options: Any, family: str) -> int:
    """The ``batchId`` a batch (non-streaming) write must carry for exactly-once."""
    raw = options.get("batchId") if hasattr(options, "get") else None
    if raw is None:
        raise OptionError(
            f"{family}: option 'batchId' is required for a batch write (df.write): it is the "
            "identity that makes a re-run of the same job a no-op; pass a stable integer, e.g. "
            "a KafkaWindows window id, or use sink.write(df, batch_id)",
            option="batchId",
        )
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(
            f"{family}: option 'batchId' must be an integer >= 0, got {raw!r}", option="batchId"
        ) from None
    if value < 0:
        raise OptionError(f"{family}: option 'batchId' must be >= 0, got {value}", option="batchId")
    return value


def refuse_overwrite(overwrite: bool, family: str) -> None:
    if overwrite:
        raise OptionError(
            f"{family}: overwrite/complete output mode is not supported: an exactly-once sink "
            "applies each batch once; use mode 'append' (or outputMode 'append'/'update')",
            option="mode",
        )


def write_dataframe(sink: BatchSink, df: Any, batch_id: int) -> None:
    """The ``foreachBatch`` path: stage per partition with mapInArrow, commit on the driver.

    - *admit*: map ``batch_id`` to the sink's numbering (``batch_offset``, after a reset)
      and admit it: ownership of the sink's state first, then the batch order. The last
      committed batch again is a replay: return. A lower one raises.
    - *check*: validate the schema and the service on the driver, before any task runs.
    - *budget*: a sink with an ``inline_budget`` gets a copy whose tasks hand a partition
      of at most ``budget / planned partitions`` rows to the driver instead of staging it.
    - *stage*: ``mapInArrow`` runs ``stage`` once per partition (Spark retries failed
      tasks); ``collect`` returns one pickled message per partition, the winning
      attempt's.
    - *commit*: ``sink.commit`` makes the batch visible once; on failure, ``sink.abort``
      cleans up.

    Only DataFrame API calls: nothing here touches ``sparkContext``, ``_jdf`` or ``rdd`` of
    a Spark Connect session.
    """
    if batch_id is None or int(batch_id) < 0:
        raise ConnectorError(f"{sink.family}: batch_id must be an integer >= 0, got {batch_id!r}")
    batch_id = int(batch_id) + sink.batch_offset()
    # admit
    if not sink.admit(batch_id):
        log.info("%s: batch %d already committed; replay is a no-op", sink.family, batch_id)
        return
    # check
    check_sink(sink, arrow_schema(df.schema), df.sparkSession)
    # budget
    run = sink
    if sink.inline_budget > 0:
        run = sink.with_inline_limit(max(1, sink.inline_budget // planned_partitions(df)))

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_info(batch_id)
        message = pickle.dumps(_staged(task, run.stage(task, batches)))
        yield pa.RecordBatch.from_arrays([pa.array([message], pa.binary())], schema=_MESSAGE_SCHEMA)

    # stage
    try:
        rows = df.mapInArrow(stage, "message binary").collect()
    except Exception:
        _abort(run, batch_id, [])
        raise
    messages = [pickle.loads(r["message"]) for r in rows]  # noqa: S301 - our own tasks' output
    staged = sorted(messages, key=lambda m: m.writer_id)
    # commit
    try:
        _commit(run, batch_id, staged)
    except Exception:
        _abort(run, batch_id, [m.payload for m in staged])
        raise


def is_connect(obj: Any) -> bool:
    """True for a Spark Connect DataFrame or session: it has no JVM objects to reach."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def planned_partitions(df: Any) -> int:
    """The number of partitions ``df`` will have, without running it.

    Under adaptive execution ``df.rdd.getNumPartitions()`` *executes* the shuffle stages
    (measured: it ran a job), and the adaptive plan's own partitioning is unknown until
    then; the plan AQE starts from gives an upper bound (AQE only coalesces), which is what
    keeps the driver's share of a batch under the sink's inline budget. A Spark Connect
    DataFrame has no JVM plan to read: the configured parallelism bounds it instead.
    """
    if not is_connect(df):
        try:
            plan = df._jdf.queryExecution().executedPlan()
            if plan.nodeName() == "AdaptiveSparkPlan":
                plan = plan.inputPlan()
            n = int(plan.outputPartitioning().numPartitions())
            if n >= 1:
                return n
        except Exception:  # noqa: BLE001 - an unexpected plan: be conservative
            log.debug("could not read the planned partition count", exc_info=True)
    session = df.sparkSession
    return max(1, int(session.conf.get("spark.sql.shuffle.partitions", "200")),
               _default_parallelism(session))


def _default_parallelism(session: Any) -> int:
    if is_connect(session):
        value = session.conf.get("spark.default.parallelism", None)
        return int(value) if value else 1
    return int(session.sparkContext.defaultParallelism)
