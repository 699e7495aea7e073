"""The exactly-once Kafka sink (``eo_kafka`` write side): recovery keys or transactions.

docs/design.md, "Kafka sink: recovery keys" and "Kafka sink: transactional path". Spark's
own Kafka sink is at-least-once: a retried task or a replayed batch sends its rows again.
By default this sink tags every record with a recovery key
(header ``eo-rk`` = sink id, batch id, writer partition, seq; see
:mod:`connectors.kafka.sink.recovery`) and, on a retry, scans what the earlier attempt already
wrote and skips it (the Apache Apex exactly-once Kafka output operator, mapped onto Spark
micro-batches). With ``transactional=true`` each task attempt commits its rows and a commit
fact in one Kafka transaction instead (:mod:`connectors.kafka.sink.commit_facts`).

This module is the protocol; it chooses the produce path once on the driver
(``check_schema``, ``transport.choose``) and the delivery mode once per task
(``writer_for``). Beside it: ``options`` (the parsed options), ``writer`` (the task driver),
``recovery_key_mode`` and ``transactional_mode`` (the delivery modes, one task attempt each),
``transport``, ``wire_transport`` and ``librdkafka_transport`` (the ways to the brokers),
``producers`` (producer config policy and caching), ``rows`` (row shaping and routing),
``recovery`` (recovery keys, markers, the scan).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from connectors.core import contact, failpoints
from connectors.core.declared import checked_arguments, given
from connectors.core.errors import KafkaSinkError
from connectors.core.sink import BatchSink, TaskInfo
from connectors.core.sink_state import SinkState
from connectors.core.storage import require_directory, storage_for
from connectors.kafka.common import FAMILY
from connectors.kafka.registry import sink_formats
from connectors.kafka.registry.sink_formats import SinkFormats
from connectors.kafka.sink import format_options, recovery, targets, transport
from connectors.kafka.sink.format_options import SINK_FORMAT_OPTIONS
from connectors.kafka.sink.options import KAFKA_SINK_OPTIONS, KafkaSinkOptions
from connectors.kafka.sink.ordering import deterministic_order  # noqa: F401
from connectors.kafka.sink.producers import (  # noqa: F401 - public names of this module
    PRODUCER_DEFAULTS,
    check_producer_config,
)
from connectors.kafka.sink.recovery_key_mode import RecoveryKeyWriter
from connectors.kafka.sink.rows import check_columns
from connectors.kafka.sink.transactional_mode import TransactionalWriter
from connectors.kafka.sink.writer import KafkaWriter, TaskReport
from connectors.monitoring import channel

log = logging.getLogger(__name__)

# Failpoints of the driver's step (the tasks' are in ``writer`` and the mode modules).
FP_BEFORE_COMMIT = "kafka_sink.before_commit"
FP_AFTER_COMMIT = "kafka_sink.after_commit"


#: (walPath, storage options, sink_id) whose ownership this process verified. An owner
#: record is created once and never changes; every task and commit still admits its batch.
_IDENTITY_CHECKED: set[tuple[Any, ...]] = set()
#: How long a process trusts a passed ``check_service`` of one configuration. Spark makes
#: the sink anew twice per micro-batch (to plan the batch's write, then for its commit), in
#: Python workers on the driver that it reuses; each check asks the cluster (metadata,
#: the facts topic, ACLs): 2-23 ms, about 10 on average on loopback, twice per batch on its
#: critical path. Checked again after this long, so a query restarted later is checked.
SERVICE_CHECK_TTL_S = 60.0
_SERVICE_CHECKED: dict[tuple[Any, ...], float] = {}


class KafkaSink(BatchSink):
    """Writes a DataFrame to Kafka exactly once per (sink_id, batch id).

    Writes: records built from the columns ``value`` (required, binary or string),
    ``key``, ``headers`` (``array<struct<key:string,value:binary>>``), ``topic`` and
    ``partition``, exactly as Spark's own Kafka sink reads them; the ``topic`` option wins
    over a ``topic`` column. In the recovery-key mode every record also gets the header
    ``eo-rk`` (with ``transactional=true`` only when ``recovery_key_headers=True``).

    Guarantee: each row of batch B appears exactly once in Kafka when (1) B's content is the
    same on replay (a replayable source such as ``eo_kafka``; Spark's batch ids or
    ``KafkaWindows`` ids; batch ids only increase), (2) ``sink_id`` and ``walPath`` stay the
    same across restarts, (3) the producer keeps ``enable.idempotence=true`` and
    ``acks=all`` (other settings are refused unless ``unsafe=true``), and (4) without
    ``transactional=true``, a failed task attempt is dead before its retry starts: Spark
    speculation must be off. With ``transactional=true`` the retry fences the old attempt,
    ``read_committed`` consumers never see a task's partial output, and steps 2-3 below are
    replaced by: find the commit fact of an earlier attempt (one offset fetch); if there is
    none, produce every row, add the fact and commit the transaction
    (:class:`connectors.kafka.sink.transactional_mode.TransactionalWriter`).

    Unit of parallelism: one Spark task (writer partition) per input partition; each runs
    its own idempotent (or transactional) producer.

    Protocol for batch B, writer partition w (docs/design.md, "Kafka sink: recovery keys"):

    1. Task start: if the sink WAL says B is committed, write nothing and report it.
    2. If the started marker ``started/B/w`` exists, this is a retry: scan the target
       partitions from the watermarks stored in the marker to partition EOF and skip the
       rows at or below the max seq of (sink, B, w) found per target partition. Otherwise
       write the marker, holding the target partitions' high watermarks and the topics'
       partition counts, *before* producing anything (failpoint
       ``kafka_sink.after_marker``).
    3. Produce the rows in seq order (failpoint ``kafka_sink.mid_produce`` after ``#n``
       records), ``flush()``, fail the task on any delivery error (failpoint
       ``kafka_sink.after_flush``; with ``transactional=true`` this is before the task's
       transaction commits), and report counts.
    4. Driver ``commit(B)``: record B as committed in the WAL (failpoints
       ``kafka_sink.before_commit``, ``kafka_sink.after_commit``) and purge the markers of
       B and older batches.

    As a ``foreachBatch`` callable (``writeStream.foreachBatch(sink)``) or through
    ``sink.write(df, batch_id)``, the batch id must be stable on replay (Spark's batchId or a
    ``KafkaWindows`` window id).

    Schema Registry formats (``value_format="avro"``, ``schema_registry={"url": ...}``;
    ``SINK_FORMAT_OPTIONS``, docs/schema-registry.md): the driver resolves each formatted
    column's subject and writer schema id before any task runs (:meth:`check_schema`);
    each task encodes the column into the Confluent wire format before the delivery mode
    sees the rows, so a retried batch writes the same bytes.
    """

    family = FAMILY
    formats: SinkFormats | None

    @checked_arguments(KAFKA_SINK_OPTIONS + SINK_FORMAT_OPTIONS)
    def __init__(
        self,
        sink_id: str,
        wal_path: str,
        *,
        bootstrap_servers: str | None = None,
        topic: str | None = None,
        kafka_options: Mapping[str, Any] | None = None,
        deterministic_order: bool = False,
        transactional: bool = False,
        unsafe: bool = False,
        flush_timeout: float = 300.0,
        scan_timeout: float = 120.0,
        metadata_retry_timeout: float = 60.0,
        recovery_key_headers: bool = False,
        facts_topic: str = "eo-sink-facts",
        expired_fact_policy: str = "fail",
        connect_timeout: float = 30.0,
        fail_on_unknown_topic: bool = False,
        batch_produce: bool = True,
        wire_produce: bool = True,
        null_key_run_bytes: int = 10_000_000,
        storage_options: Mapping[str, Any] | None = None,
        value_format: str = "binary",
        value_subject: str | None = None,
        key_format: str = "binary",
        key_subject: str | None = None,
        subject_name_strategy: str = "TopicNameStrategy",
        auto_register: bool = False,
        use_latest_version: bool = False,
        avro_record_name: str = "topLevelRecord",
        avro_record_namespace: str = "",
        schema_registry: Mapping[str, Any] | None = None,
    ) -> None:
        """The arguments are the DataSource's options in snake_case (``KAFKA_SINK_OPTIONS``,
        the table in docs/kafka-sink.md, and ``SINK_FORMAT_OPTIONS``, the table in
        docs/schema-registry.md); durations in seconds (or strings such as ``"30s"``);
        ``kafka_options`` are librdkafka settings without ``kafka.``, ``schema_registry``
        the registry's settings without ``schemaRegistry.``."""
        arguments = given(locals())
        formats = {o.arg: arguments.pop(o.arg) for o in SINK_FORMAT_OPTIONS}
        self._init(KafkaSinkOptions.create(**arguments))
        self.formats = format_options.python_formats(formats)

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: pa.Schema | None = None) -> KafkaSink:
        """Build the sink from Spark's string options (``writeStream.format("eo_kafka")``);
        the format options are taken off first (``format_options.split``)."""
        own, formats = format_options.split(options)
        sink = cls.from_parsed(KafkaSinkOptions.from_options(own))
        sink.formats = format_options.parse_formats(formats)
        return sink

    def _init(self, options: KafkaSinkOptions) -> None:
        self.options = options  # also read as attributes: sink.sink_id, sink.topic, ...
        self.formats = None
        self._wal: SinkState | None = None
        self._identity_checked = False
        self._cluster_checked = False
        #: The produce path of this sink's tasks (``transport.choose``), set on the driver
        #: by :meth:`check_schema`.
        self.path: transport.ProducePath | None = None

    @property
    def zombie_risk(self) -> str | None:
        if self.transactional:
            return None  # the retry's init_transactions fences the zombie
        return ("a speculative task attempt can keep producing after its twin's retry "
                "scanned, which breaks exactly-once without transactions; set "
                "spark.speculation=false or option transactional=true")

    def __repr__(self) -> str:
        return (
            f"KafkaSink(sink_id={self.sink_id!r}, topic={self.topic!r}, "
            f"transactional={self.transactional}, conf={self.producer_conf!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_wal"] = None
        return state

    # -- state ------------------------------------------------------------------------------
    def _state(self) -> SinkState:
        """The sink's WAL at ``walPath`` (commit log, owner, started markers)."""
        if self._wal is None:
            self._wal = recovery.sink_state(*storage_for(
                self.wal_path, options=self.options.storage, family=FAMILY))
        return self._wal

    def last_committed(self) -> int | None:
        return self._state().last_committed()

    def commit_info(self, batch_id: int) -> dict[str, Any] | None:
        return self._state().commit_info(batch_id)

    def check_schema(self, schema: pa.Schema) -> None:
        if self.formats is not None:
            # The writer schemas and ids, on the driver before any task (once: ids never
            # change); the tasks see the encoded columns.
            if not all(c.schema is not None for c in self.formats.columns):
                self.formats = sink_formats.resolve(self.formats, schema, self.topic)
            schema = sink_formats.encoded_schema(schema, self.formats)
        check_columns(schema, self.topic)
        self.path = transport.choose(self.options, schema)
        # One walPath belongs to one sink id: sharing it would skip the other's batches.
        key = (self.wal_path, self.options.storage, self.sink_id)
        if not self._identity_checked and key not in _IDENTITY_CHECKED:
            state = self._state()
            state.check_storage()  # first: the probe's create names a bad store best
            require_directory(self.wal_path, FAMILY, "walPath", self.options.storage)
            state.claim(FAMILY, self.sink_id)
            self._identity_checked = True
            _IDENTITY_CHECKED.add(key)  # ownership never changes: once per process

    def check_service(self) -> None:
        """The cluster answers within ``connectTimeout``, and the ``topic`` option names a
        topic that exists (or that the broker may create, with a warning): one clear error
        before any task runs. Once per configuration and process within
        :data:`SERVICE_CHECK_TTL_S`."""
        if self._cluster_checked:
            return
        o = self.options
        key = (tuple(sorted((k, str(v)) for k, v in self.producer_conf.items())), self.topic,
               self.transactional, o.facts_topic)
        now = time.monotonic()
        if now - _SERVICE_CHECKED.get(key, now - SERVICE_CHECK_TTL_S) < SERVICE_CHECK_TTL_S:
            self._cluster_checked = True
            return
        try:
            targets.check_reachable(o)
            if self.topic is not None:
                targets.partition_counts(o, [self.topic])
            if self.transactional:
                targets.ensure_facts_topic(o)
            targets.check_access(o)
        except KafkaSinkError as e:
            if not (e.unreachable and contact.reached((FAMILY, key))):
                raise
            # Checked before in this process: an outage now is no reason to stop the query;
            # the batch's own requests wait it out within their retry budgets.
            log.warning("%s; it answered this configuration's check before, so the batch "
                        "goes on and its requests wait within their retry budgets", e)
            self._cluster_checked = True
            return
        self._cluster_checked = True
        _SERVICE_CHECKED[key] = now
        contact.mark((FAMILY, key))  # answered: an outage from now on is ridden through

    def admit(self, batch_id: int) -> bool:
        """Ownership of walPath, then the batch order (``SinkState.admit``)."""
        return self._state().admit(FAMILY, self.sink_id, batch_id)

    def batch_offset(self) -> int:
        return self._state().batch_offset()

    # -- the protocol -----------------------------------------------------------------------
    def stage(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> TaskReport:
        """1.-3. Executor: one task attempt, in the delivery mode the options choose (the
        formatted columns encoded first)."""
        if self.formats is not None:
            encoders = {c.column: sink_formats.encoder(c) for c in self.formats.columns}
            batches = (sink_formats.encode_batch(b, encoders) for b in batches)
        path = self.path
        if path is None:
            # Staged without check_schema (a direct Python call): the first rows' schema.
            first = next(batches, None)
            path = transport.choose(self.options, None if first is None else first.schema)
            batches = itertools.chain([] if first is None else [first], batches)
        return writer_for(self.options, self._state(), task, path).write(batches)

    def commit(self, batch_id: int, messages: Sequence[Any]) -> None:
        """4. Driver: record the batch as committed; a no-op for a committed batch."""
        started = time.perf_counter()
        state = self._state()
        # Ownership before "already committed": another sink's commit of this batch id
        # must not pass for ours.
        if not state.admit(FAMILY, self.sink_id, batch_id):
            log.info("%s %s: batch %d already committed", FAMILY, self.sink_id, batch_id)
            channel.replay_event(FAMILY, self.sink_id, batch_id)
            return
        reports = [m for m in messages if isinstance(m, TaskReport)]
        partitions: dict[str, dict[str, int]] = {}
        for r in reports:
            for t, parts in r.partitions.items():
                dst = partitions.setdefault(t, {})
                for p, n in parts.items():
                    dst[p] = dst.get(p, 0) + n
        failpoints.hit(FP_BEFORE_COMMIT, batch_id)
        # 4. The batch is committed once this marker exists; every later attempt or replay
        #    of its tasks writes nothing.
        info = state.record_commit(
            batch_id,
            self.sink_id,
            sum(r.rows for r in reports),
            produced=sum(r.produced for r in reports),
            skipped=sum(r.skipped for r in reports),
            retried_tasks=sum(1 for r in reports if r.retry),
            writers=len(reports),
            slowest_task_s=round(max((r.seconds for r in reports), default=0.0), 3),
            scan_s=round(sum(r.scan_seconds for r in reports), 3),
            txn_commit_s=round(max((r.commit_seconds for r in reports), default=0.0), 3),
            input_s=round(max((r.input_seconds for r in reports), default=0.0), 3),
            setup_s=round(max((r.setup_seconds for r in reports), default=0.0), 3),
            flush_s=round(max((r.flush_seconds for r in reports), default=0.0), 3),
            partitions=partitions,
        )
        failpoints.hit(FP_AFTER_COMMIT, batch_id)
        # Started markers, one per task that wrote (both modes): by name.
        state.retain(batch_id, [r.writer for r in reports])
        log.info("%s %s: committed batch %d: %d rows, %d produced, %d skipped as already "
                 "written", FAMILY, self.sink_id, batch_id, info["rows"], info["produced"],
                 info["skipped"])
        # Observation only, from the winning attempts' reports (docs/monitoring.md).
        steps = {"stage": max((r.seconds for r in reports), default=0.0),
                 "produce": max((r.flush_seconds for r in reports), default=0.0),
                 "commit": time.perf_counter() - started}
        if self.transactional:
            steps["txn_commit"] = max((r.commit_seconds for r in reports), default=0.0)
        channel.commit_event(
            FAMILY, self.sink_id, batch_id, rows=sum(r.rows for r in reports),
            produced=sum(r.produced for r in reports), skipped_rows=sum(r.skipped for r in reports),
            retried_tasks=sum(1 for r in reports if r.retry),
            fenced=sum(r.fenced for r in reports),
            scans=sum(1 for r in reports if r.scan_records or r.scan_seconds),
            scan_records=sum(r.scan_records for r in reports),
            scan_seconds=sum(r.scan_seconds for r in reports), steps=steps)

    def abort(self, batch_id: int, messages: Sequence[Any | None]) -> None:
        # Records already in Kafka cannot be taken back, and they need not be: the started
        # markers (or, transactional, the commit facts) stay, so the batch's retry skips
        # what its tasks committed.
        log.warning("%s %s: batch %d aborted; its retry will skip what was committed",
                    FAMILY, self.sink_id, batch_id)


def writer_for(options: KafkaSinkOptions, state: SinkState, task: TaskInfo,
               path: transport.ProducePath | None = None) -> KafkaWriter:
    """The delivery mode the options choose, for one task attempt on ``path`` (None: the
    path the options alone choose)."""
    mode = TransactionalWriter if options.transactional else RecoveryKeyWriter
    return mode(options, state, task, path or transport.choose(options, None))


__all__ = ["KafkaSink", "TaskReport", "check_producer_config", "deterministic_order"]
