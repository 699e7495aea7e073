"""PySpark readers of the ``eo_kafka`` source (docs/design.md, "Kafka source").

- :class:`KafkaStreamReader`: ``spark.readStream.format("eo_kafka")``: micro-batches with
  admission control (``getDefaultReadLimit``/``latestOffset(start, limit)``),
  ``Trigger.AvailableNow``, the window WAL and consumer-group commits;
- :class:`KafkaBatchReader`: ``spark.read.format("eo_kafka")``: a bounded range
  (``startingOffsets``..``endingOffsets``), or with ``walPath`` the next batch window.

This is the Spark boundary of the source: Spark's offset JSON dicts are decoded into typed
offsets ``{(cluster, topic, partition): next_offset}`` on the way in and encoded on the way
out, here and nowhere else; the planner works on typed offsets only.

Exactly-once reading: ``partitions(start, end)`` is a pure function of the offsets Spark
stores in its offset log, so a replayed batch reads the same records into the same Spark
partitions. Each Spark partition reads one Kafka partition range (or a slice of one, with
``minPartitions``/``maxRecordsPerPartition``), or a group of small ranges with one consumer
(``targetRecordsPerPartition``; docs/kafka-source.md, "Many partitions").
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from connectors.core import failpoints
from connectors.core.declared import spark_names
from connectors.core.options import OptionReader
from connectors.kafka.common import SHARED_OPTIONS
from connectors.kafka.registry import source_formats as formats_schema
from connectors.kafka.registry.source_formats import SourceFormats
from connectors.kafka.sink.options import KAFKA_SINK_OPTIONS
from connectors.kafka.source.offsets import TP, OffsetRange, clamp_offsets, total_records
from connectors.kafka.source.planner import KafkaPlanner, KafkaSourceOptions
from connectors.kafka.source.range_reader import read_ranges, spark_schema_ddl
from connectors.kafka.source.records import arrow_schema

log = logging.getLogger(__name__)


#: Options of the eo_kafka sink that the source does not take (lower-cased, as Spark passes
#: them): one of them means Spark is asking a write for its schema. The sink's declaration
#: minus what both connectors take (kafka/common.py); a unit test holds both halves against
#: the source's parser.
_SHARED = tuple(s.lower() for s in SHARED_OPTIONS)
_SINK_ONLY = frozenset(
    n for n in spark_names(KAFKA_SINK_OPTIONS)
    if not any(n == s or (s.endswith(".") and n.startswith(s)) for s in _SHARED))


def source_schema(options: dict[str, str]) -> tuple[StructType | str, KafkaSourceOptions | None]:
    """Spark's Kafka schema, plus ``headers`` (includeHeaders) and ``cluster`` (clusters);
    and the options parsed for it, which the DataSource keeps for its readers (None for a
    write's options)."""
    # Spark asks for the schema at load(): parse every option now, so a bad one raises at
    # the line that set it rather than from awaitTermination() seconds after start(). This
    # is the query's one parse: Spark pickles the DataSource, with the spec, to each process
    # that makes a reader of it (a stream has two: the source runner's and the one whose
    # read() the tasks run). A write (sink options, which hold sink_id) may reach here too;
    # its writer parses them.
    if any(str(k).lower() in _SINK_ONLY for k in options):
        r = OptionReader(options, family="eo_kafka")
        return spark_schema_ddl(r.boolean("includeHeaders", False), r.has("clusters")), None
    opts = KafkaSourceOptions.parse(options)
    if opts.formats is not None:  # typed key/value: their reader schemas, asked once here
        return _formats_schema(formats_schema.resolve(opts.formats), opts), opts
    return spark_schema_ddl(opts.include_headers, opts.multi_cluster), opts


#: Where a column's reader schema travels from ``schema()`` to the readers: the metadata of
#: its field in the schema Spark hands back, so every reader of the query decodes to the
#: schema the DataFrame was typed with, even if the subject has a newer version by then.
_SCHEMA_KEY = "eo_kafka.readerSchema"


def _formats_schema(formats: SourceFormats, opts: KafkaSourceOptions) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    base = arrow_schema(opts.include_headers, opts.multi_cluster)
    schema = from_arrow_schema(formats_schema.arrow_schema(base, formats))
    for c in formats.columns:
        schema[c.column].metadata = {_SCHEMA_KEY: {"id": c.schema_id, "schema": c.schema,
                                                   "subject": c.subject}}
    return schema


def _with_formats(opts: KafkaSourceOptions, schema: StructType) -> KafkaSourceOptions:
    """``opts`` with the reader schemas of ``schema()`` (or, if Spark dropped the field
    metadata, of the registry now)."""
    if opts.formats is None:
        return opts
    columns = []
    for c in opts.formats.columns:
        meta = (schema[c.column].metadata or {}).get(_SCHEMA_KEY) if c.column in schema.names \
            else None
        if not meta:
            return dataclasses.replace(opts, formats=formats_schema.resolve(opts.formats))
        columns.append(dataclasses.replace(c, schema=meta["schema"], schema_id=meta["id"]))
    return dataclasses.replace(opts, formats=dataclasses.replace(opts.formats,
                                                                 columns=tuple(columns)))


def _spec(options: dict[str, str], parsed: KafkaSourceOptions | None, batch: bool,
          schema: StructType) -> KafkaSourceOptions:
    """The reader's spec: from the options ``schema()`` parsed, or, when the user gave the
    schema and Spark never asked for it, parsed here."""
    opts = parsed if parsed is not None else KafkaSourceOptions.parse(options)
    return _with_formats(opts.for_read(batch), schema)


def stream_reader(options: dict[str, str], schema: StructType,
                  parsed: KafkaSourceOptions | None = None) -> DataSourceStreamReader:
    return KafkaStreamReader(_spec(options, parsed, False, schema), schema)


def batch_reader(options: dict[str, str], schema: StructType,
                 parsed: KafkaSourceOptions | None = None) -> DataSourceReader:
    return KafkaBatchReader(_spec(options, parsed, True, schema), schema)


class KafkaInputPartition(InputPartition):
    """One Spark partition: the offset ranges one consumer reads, in order (picklable)."""

    def __init__(self, ranges: tuple[OffsetRange, ...]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


def _read(opts: KafkaSourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    ranges: tuple[OffsetRange, ...] | None = getattr(partition, "ranges", None)
    if not ranges:
        # partitions() planned nothing (an empty window); Spark still runs one task with
        # a plain InputPartition.
        return iter(())
    cluster = opts.cluster(ranges[0].cluster)
    batches = read_ranges(
        ranges,
        cluster.reader_conf(opts.group_id),
        include_headers=opts.include_headers,
        cluster=(cluster.name if opts.multi_cluster else None),
        fail_on_data_loss=opts.fail_on_data_loss,
        poll_timeout_s=opts.poll_timeout,
        batch_records=opts.arrow_batch_records,
    )
    if opts.formats is not None:
        base = arrow_schema(opts.include_headers, opts.multi_cluster)
        batches = formats_schema.decode_batches(
            batches, opts.formats, formats_schema.arrow_schema(base, opts.formats))
    if failpoints.wants_count(MID_READ) is None:
        return batches
    return _counting(batches)


MID_READ = "kafka_source.mid_read"


def _counting(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Recovery tests only: crash an executor after ``#n`` rows of a batch's task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    prop = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    batch_id = int(prop) if prop is not None else None
    rows = 0
    for b in batches:
        rows += b.num_rows
        failpoints.hit(MID_READ, batch_id, rows)
        yield b


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads Kafka topics as micro-batches; exactly-once in combination with Spark's
    checkpoint (the offset log drives replays) and an exactly-once sink.

    Unit of parallelism: one Spark partition per Kafka partition range per micro-batch
    (more with minPartitions/maxRecordsPerPartition), small ranges grouped into one Spark
    partition up to targetRecordsPerPartition records. The driver-side state (clients, the
    AvailableNow target, the trigger clock) lives in Spark's long-lived planner process;
    the object is pickled to executors, where only ``read`` runs.
    """

    def __init__(self, opts: KafkaSourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.planner = KafkaPlanner(opts)
        self.planner.check_wal()  # a walPath on a store that cannot commit fails the start
        self._latest: dict[TP, int] | None = None
        self._target: dict[TP, int] | None = None
        self._last_trigger = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_latest"] = None
        return state

    # -- offsets ---------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        offsets = self.planner.initial_offsets()
        log.info("eo_kafka: starting offsets %s", offsets)
        return self.opts.encode(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.opts
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = list(self.planner.partitions())
        self._target = self.planner.latest(tps)
        log.info("eo_kafka: Trigger.AvailableNow target %s", self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        start_map = self.opts.decode(start)
        tps = list(self.planner.partitions())
        latest = self.planner.latest(tps)
        self._latest = dict(latest)
        if self._target is not None:
            # AvailableNow: nothing that arrived after prepareForTriggerAvailableNow, and
            # partitions gone since then keep their start so the query can finish.
            latest = clamp_offsets(latest, self._target)
        max_rows: int | None = None
        max_bytes: int | None = None
        min_rows: int | None = None
        if not isinstance(limit, ReadAllAvailable):
            # Spark passes one limit; the options may configure several (Spark's
            # CompositeReadLimit), so all configured ones apply, the given one winning.
            max_rows = self.opts.max_offsets_per_trigger
            max_bytes = self.opts.max_bytes_per_trigger
            min_rows = self.opts.min_offsets_per_trigger
            if isinstance(limit, ReadMaxRows):
                max_rows = limit.max_rows
            elif isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes
            elif isinstance(limit, ReadMinRows):
                min_rows = limit.min_rows
        if min_rows is not None and self._target is None:
            backlog = total_records(start_map, latest)
            waited = time.monotonic() - self._last_trigger
            if backlog < min_rows and waited < self.opts.max_trigger_delay:
                log.debug("eo_kafka: %d < minOffsetsPerTrigger=%d, waited %.1fs; no batch",
                          backlog, min_rows, waited)
                return start
        end = self.planner.next_end(
            start_map, latest=latest, max_records=max_rows, max_bytes=max_bytes
        )
        if self._target is not None:
            for tp, off in start_map.items():
                end.setdefault(tp, off)
        if end == start_map:
            return start
        self._last_trigger = time.monotonic()
        return self.opts.encode(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._latest is None:
            return None
        return self.opts.encode(self._latest)

    # -- planning and reading --------------------------------------------------------------
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        start_map, end_map = self.opts.decode(start), self.opts.decode(end)
        groups = self.planner.ranges(start_map, end_map)
        window = self.planner.record_window(start_map, end_map)
        log.info("eo_kafka: window %s: %d Spark partitions, %d ranges, %d offsets", window,
                 len(groups), sum(len(g) for g in groups), sum(r.size for g in groups for r in g))
        return [KafkaInputPartition(g) for g in groups]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self.planner.commit(self.opts.decode(end))

    def stop(self) -> None:
        self.planner.close()


class KafkaBatchReader(DataSourceReader):
    """Reads a bounded range of Kafka topics (``spark.read``).

    Without ``walPath``: ``startingOffsets`` (default earliest) to ``endingOffsets``
    (default latest). With ``walPath``: the next batch window (the last uncommitted window
    again, or a new one from the last committed end); ``connectors.KafkaWindows`` commits
    windows. Unit of parallelism: as the stream reader.
    """

    def __init__(self, opts: KafkaSourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.planner = KafkaPlanner(opts)
        if opts.window is None:
            self.planner.check_wal()

    def _ranges(self) -> list[tuple[OffsetRange, ...]]:
        p = self.planner
        if self.opts.window is not None:
            w = p.window(self.opts.window)
            return p.ranges(w.start, w.end)
        if self.opts.wal_path is not None:
            nxt = p.next_window()
            if nxt is None:
                return []
            return p.ranges(nxt.start, nxt.end)
        start = p.initial_offsets()
        end = p.ending_offsets(sorted(start))
        return p.ranges(start, end)

    def partitions(self) -> Sequence[InputPartition]:
        try:
            return [KafkaInputPartition(r) for r in self._ranges()]
        finally:
            self.planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return _read(self.opts, partition)
