"""The exactly-once Kafka sink (``eo_kafka`` write side): monotonic recovery keys.

DESIGN.md section 6. Spark's own Kafka sink is at-least-once: a retried task or a replayed
batch sends its rows again. This sink tags every record with a recovery key (header
``eo-rk`` = sink id, batch id, writer partition, seq; see :mod:`connectors.kafka.recovery`)
and, on a retry, scans what the earlier attempt already wrote and skips it (the Apache Apex
exactly-once Kafka output operator, mapped onto Spark micro-batches).
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.core import failpoints
from connectors.core.errors import KafkaSinkError, OptionError
from connectors.core.options import OptionReader, RedactedDict
from connectors.core.sink import BatchSink, TaskInfo
from connectors.core.storage import storage_for
from connectors.core.wal import WriteAheadLog
from connectors.kafka import partitioner, recovery

log = logging.getLogger(__name__)

FAMILY = "eo_kafka"

#: Producer settings the guarantee rests on (DESIGN.md section 6, "Producer").
PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    # Only failed deliveries call back into Python: a per-record success callback would
    # cost as much as the produce() call itself. Failures still fail the task.
    "delivery.report.only.error": "true",
}

# librdkafka producer-only properties, dropped from the recovery scan's consumer config so
# librdkafka does not warn about them on every retry.
_PRODUCER_ONLY = frozenset(
    {
        "acks",
        "request.required.acks",
        "enable.idempotence",
        "enable.gapless.guarantee",
        "delivery.report.only.error",
        "linger.ms",
        "queue.buffering.max.ms",
        "batch.size",
        "batch.num.messages",
        "compression.type",
        "compression.codec",
        "compression.level",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "message.send.max.retries",
        "retries",
        "retry.backoff.ms",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "request.timeout.ms",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
        "partitioner",
        "sticky.partitioning.linger.ms",
        "transaction.timeout.ms",
        "transactional.id",
        "queuing.strategy",
        "dr_msg_cb",
        "dr_cb",
    }
)

_ACKS_SAFE = {"all", "-1"}
_TRUE = {"true", "1", "yes", "on"}

# Failpoints, one per protocol step (see KafkaSink docstring).
FP_AFTER_MARKER = "kafka_sink.after_marker"
FP_MID_PRODUCE = "kafka_sink.mid_produce"
FP_AFTER_FLUSH = "kafka_sink.after_flush"
FP_BEFORE_COMMIT = "kafka_sink.before_commit"
FP_AFTER_COMMIT = "kafka_sink.after_commit"

_SEQ_PACK = recovery._SEQ.pack
HEADER = recovery.HEADER


def check_producer_config(conf: Mapping[str, str], unsafe: bool) -> None:
    """Refuse settings that break exactly-once, unless ``unsafe`` (then only warn).

    ``transactional.id`` is refused even with ``unsafe``: the sink derives it from the sink id
    and the writer partition so that a retry fences the attempt it replaces.
    """
    if "transactional.id" in conf:
        raise OptionError(
            f"{FAMILY}: option 'kafka.transactional.id' cannot be set: the sink derives it as "
            "'<sink_id>-<writer partition>' so a retry fences its zombie; set "
            "transactional=true instead",
            option="kafka.transactional.id",
        )
    problems: list[tuple[str, str]] = []
    for name in ("acks", "request.required.acks"):
        value = conf.get(name)
        if value is not None and str(value).strip().lower() not in _ACKS_SAFE:
            problems.append(
                (name, f"{name}={value!r} lets the broker acknowledge records that a leader "
                 "failover then loses; use 'all' (the default)")
            )
    value = conf.get("enable.idempotence")
    if value is not None and str(value).strip().lower() not in _TRUE:
        problems.append(
            ("enable.idempotence", f"enable.idempotence={value!r} allows reordered and "
             "duplicated records within a partition, which breaks the max-seq recovery rule; "
             "use 'true' (the default)")
        )
    if not problems:
        return
    if unsafe:
        for name, why in problems:
            log.warning("%s: unsafe producer setting kafka.%s accepted (unsafe=true): %s; the "
                        "sink is no longer exactly-once", FAMILY, name, why)
        return
    name, why = problems[0]
    raise OptionError(
        f"{FAMILY}: option 'kafka.{name}' breaks the exactly-once guarantee: {why}, or set "
        "option unsafe=true to accept at-least-once delivery",
        option=f"kafka.{name}",
    )


def consumer_config(
    producer_conf: Mapping[str, str], sink_id: str, isolation: str
) -> dict[str, Any]:
    conf: dict[str, Any] = {k: v for k, v in producer_conf.items() if k not in _PRODUCER_ONLY}
    conf.update(
        {
            "group.id": f"eo-sink-scan-{sink_id}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            # At the end of a partition the broker parks a fetch for fetch.wait.max.ms
            # (500 ms by default) before librdkafka can report EOF; a scan ends there.
            "fetch.wait.max.ms": 10,
        }
    )
    return conf


# -- per-worker caches (Python workers are reused across tasks) -------------------------------
class _ProducerSlot:
    """A cached non-transactional producer plus the delivery errors of the current task."""

    def __init__(self, conf: Mapping[str, str]) -> None:
        from confluent_kafka import Producer

        self.errors: list[str] = []
        full: dict[str, Any] = dict(conf)
        # The Python client parses this one itself and wants a bool, not librdkafka's string.
        if "delivery.report.only.error" in full:
            full["delivery.report.only.error"] = (
                str(full["delivery.report.only.error"]).strip().lower() in _TRUE
            )
        full["on_delivery"] = self._on_delivery
        self.producer = Producer(full)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")


_CACHE_LOCK = threading.Lock()
_PRODUCERS: dict[tuple[tuple[str, str], ...], _ProducerSlot] = {}
_ADMINS: dict[tuple[tuple[str, str], ...], Any] = {}


def _conf_key(conf: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in conf.items()))


def _admin(conf: Mapping[str, str]) -> Any:
    key = _conf_key(conf)
    with _CACHE_LOCK:
        admin = _ADMINS.get(key)
        if admin is None:
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({k: v for k, v in conf.items() if k not in _PRODUCER_ONLY})
            _ADMINS[key] = admin
        return admin


def _cached_producer(conf: Mapping[str, str]) -> _ProducerSlot:
    key = _conf_key(conf)
    with _CACHE_LOCK:
        slot = _PRODUCERS.get(key)
        if slot is None:
            slot = _ProducerSlot(conf)
            _PRODUCERS[key] = slot
        return slot


def _evict_producer(conf: Mapping[str, str]) -> None:
    with _CACHE_LOCK:
        _PRODUCERS.pop(_conf_key(conf), None)


def close_cached_producers(timeout: float = 5.0) -> None:
    """Flush (up to ``timeout`` seconds each) and drop every producer and admin client this
    process cached (see ``connectors.kafka.close_cached_clients``)."""
    with _CACHE_LOCK:
        slots = list(_PRODUCERS.values())
        _PRODUCERS.clear()
        _ADMINS.clear()
    for slot in slots:
        _close_producer(slot.producer, timeout)


def _close_producer(producer: Any, timeout: float) -> None:
    """Flush for up to ``timeout`` seconds, drop what is left, and shut the client down."""
    left = producer.flush(timeout)
    if left:
        log.warning("%s: closing a producer with %d undelivered records", FAMILY, left)
        producer.purge()
    close = getattr(producer, "close", None)  # Producer.close: confluent-kafka >= 2.11
    if close is not None:
        # A fenced or failed transactional producer cannot abort its transaction again;
        # close() says so in a RuntimeWarning. The producer is discarded either way.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                close()
            except Exception as e:  # noqa: BLE001 - see above
                log.debug("%s: closing a producer: %s", FAMILY, e)
        for w in caught:
            log.debug("%s: closing a producer: %s", FAMILY, w.message)


# -- rows of one task, ready to produce -------------------------------------------------------
@dataclass
class _Rows:
    n: int
    values: list[bytes | None]
    keys: pa.Array | None
    topics: list[str]  # distinct topic names
    topic_idx: np.ndarray  # per row, index into topics
    explicit: pa.Array | None  # per row partition column (nullable) or None
    headers: list[Any] | None  # per row list of (str, bytes) or None


def _as_binary(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.binary() if pa.types.is_string(arr.type) else pa.large_binary())
    if pa.types.is_null(arr.type):
        arr = pa.nulls(len(arr), pa.binary())
    return arr


def _headers_sort_key(headers: pa.ChunkedArray) -> pa.Array:
    """A binary column that orders rows by their headers (tie-break after key and value)."""
    out: list[bytes | None] = []
    for h in headers.to_pylist():
        if h is None:
            out.append(None)
            continue
        parts = []
        for item in h:
            k = (item.get("key") or "").encode()
            v = item.get("value") or b""
            parts.append(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
        out.append(b"".join(parts))
    return pa.array(out, pa.binary())


def deterministic_order(table: pa.Table) -> pa.Table:
    """Rows sorted by (key, value, topic, partition, headers), nulls first.

    Spark does not promise the order of rows inside a partition after a shuffle, so a replay
    could number the same rows differently. Sorting makes seq a function of the rows alone;
    rows that tie on every column are identical, so their order does not matter.
    """
    if table.num_rows <= 1:
        return table
    cols: list[str] = []
    work = table
    for name in ("key", "value", "topic", "partition"):
        if name in table.column_names and not pa.types.is_null(table.schema.field(name).type):
            cols.append(name)
    if "headers" in table.column_names and table.column("headers").null_count < table.num_rows:
        work = work.append_column("__eo_headers_key", _headers_sort_key(table.column("headers")))
        cols.append("__eo_headers_key")
    if not cols:
        return table
    try:  # pyarrow >= 25 takes the null placement per key
        order = pc.sort_indices(work, sort_keys=[(c, "ascending", "at_start") for c in cols])
    except (TypeError, ValueError):
        order = pc.sort_indices(
            work, sort_keys=[(c, "ascending") for c in cols], null_placement="at_start"
        )
    return table.take(order)


# -- the sink ---------------------------------------------------------------------------------
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
    seconds: float = 0.0
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)


class KafkaSink(BatchSink):
    """Writes a DataFrame to Kafka exactly once per (sink_id, batch id).

    Writes: records built from the columns ``value`` (required, binary or string),
    ``key``, ``headers`` (``array<struct<key:string,value:binary>>``), ``topic`` and
    ``partition``, exactly as Spark's own Kafka sink reads them; the ``topic`` option wins
    over a ``topic`` column. Every record also gets the recovery-key header ``eo-rk``.

    Guarantee: each row of batch B appears exactly once in Kafka when (1) B's content is the
    same on replay (a replayable source such as ``eo_kafka``; Spark's batch ids or
    ``KafkaWindows`` ids; batch ids only increase), (2) ``sink_id`` and ``walPath`` stay the
    same across restarts, (3) the producer keeps ``enable.idempotence=true`` and
    ``acks=all`` (other settings are refused unless ``unsafe=true``), and (4) without
    ``transactional=true``, a failed task attempt is dead before its retry starts: Spark
    speculation must be off. With ``transactional=true`` the retry fences the old attempt
    and ``read_committed`` consumers never see a task's partial output.

    Unit of parallelism: one Spark task (writer partition) per input partition; each runs
    its own idempotent (or transactional) producer.

    Protocol for batch B, writer partition w (DESIGN.md section 6):

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
    """

    family = FAMILY

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
    ) -> None:
        if not sink_id or not str(sink_id).strip():
            raise OptionError(
                f"{FAMILY}: option 'sink_id' is required: a stable name for this sink, unique "
                "per output (it is part of every recovery key and transactional.id)",
                option="sink_id",
            )
        if not wal_path or not str(wal_path).strip():
            raise OptionError(
                f"{FAMILY}: option 'walPath' is required: a directory (local or hdfs://) for "
                "the sink's commit log and started markers, stable across restarts",
                option="walPath",
            )
        self.sink_id = str(sink_id).strip()
        recovery.key_prefix(self.sink_id, 0, 0)  # validates the sink id's length
        self.wal_path = str(wal_path).strip()
        conf = RedactedDict(PRODUCER_DEFAULTS)
        for k, v in (kafka_options or {}).items():
            key = str(k)
            key = key[len("kafka.") :] if key.lower().startswith("kafka.") else key
            conf[key] = _stringify(v)
        if bootstrap_servers:
            conf["bootstrap.servers"] = bootstrap_servers
        if not conf.get("bootstrap.servers"):
            raise OptionError(
                f"{FAMILY}: option 'kafka.bootstrap.servers' is required; set it to the "
                "brokers' host:port list",
                option="kafka.bootstrap.servers",
            )
        check_producer_config(conf, unsafe)
        acks = str(conf.get("request.required.acks", conf.get("acks", "all"))).lower()
        user_keys = {str(k).lower().removeprefix("kafka.") for k in (kafka_options or {})}
        if acks not in _ACKS_SAFE and "enable.idempotence" not in user_keys:
            # unsafe=true with weaker acks: librdkafka refuses idempotence without acks=all.
            conf["enable.idempotence"] = "false"
        self.producer_conf = conf
        self.topic = topic.strip() if topic and topic.strip() else None
        self.deterministic_order = bool(deterministic_order)
        self.transactional = bool(transactional)
        self.unsafe = bool(unsafe)
        self.flush_timeout = float(flush_timeout)
        self.scan_timeout = float(scan_timeout)
        self._wal: WriteAheadLog | None = None
        self._markers: recovery.MarkerStore | None = None
        self._identity_checked = False

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: pa.Schema | None = None) -> KafkaSink:
        """Build the sink from Spark's string options (``writeStream.format("eo_kafka")``)."""
        r = OptionReader(options, family=FAMILY)
        sink_id = r.required("sink_id", "a stable name for this sink, unique per output")
        wal_path = r.required("walPath", "a directory for the sink's commit log and markers")
        servers = r.required("kafka.bootstrap.servers", "the brokers' host:port list")
        sink = cls(
            sink_id,
            wal_path,
            bootstrap_servers=servers,
            topic=r.string("topic"),
            kafka_options=r.prefixed("kafka."),
            deterministic_order=r.boolean("deterministicOrder", False),
            transactional=r.boolean("transactional", False),
            unsafe=r.boolean("unsafe", False),
            flush_timeout=r.duration("flushTimeout", 300.0, minimum=1) or 300.0,
            scan_timeout=r.duration("scanTimeout", 120.0, minimum=1) or 120.0,
        )
        r.warn_unknown(prefixes=("kafka.",), ignore=("batchId", "checkpointLocation"))
        return sink

    def __repr__(self) -> str:
        return (
            f"KafkaSink(sink_id={self.sink_id!r}, topic={self.topic!r}, "
            f"transactional={self.transactional}, conf={self.producer_conf!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_wal"] = None
        state["_markers"] = None
        return state

    # -- state ------------------------------------------------------------------------------
    def _state(self) -> tuple[WriteAheadLog, recovery.MarkerStore]:
        if self._wal is None or self._markers is None:
            storage, root = storage_for(self.wal_path)
            self._wal = WriteAheadLog(storage, root, "commits")
            self._markers = recovery.MarkerStore(storage, root)
        return self._wal, self._markers

    def last_committed(self) -> int | None:
        return self._state()[0].last_committed()

    def _check_identity(self) -> None:
        """One walPath belongs to one sink id: sharing it would skip the other's batches."""
        if self._identity_checked:
            return
        wal, _ = self._state()
        storage = wal.storage
        path = storage.join(wal.root, "sink.json")
        import json

        if storage.exists(path):
            owner = json.loads(storage.read(path)).get("sink_id")
            if owner != self.sink_id:
                raise OptionError(
                    f"{FAMILY}: walPath {storage.url(wal.root)} belongs to sink_id {owner!r}, "
                    f"not {self.sink_id!r}; give each sink its own walPath",
                    option="walPath",
                )
        else:
            storage.write_atomic(path, json.dumps({"sink_id": self.sink_id}).encode())
        self._identity_checked = True

    def check_schema(self, schema: pa.Schema) -> None:
        names = schema.names
        if "value" not in names:
            raise KafkaSinkError(
                f"{FAMILY}: the DataFrame has no 'value' column (columns: {names}); select "
                "the record payload as 'value' (binary or string), optionally with 'key', "
                "'headers', 'topic' and 'partition'"
            )
        for name in ("key", "value"):
            if name in names:
                t = schema.field(name).type
                if not (
                    pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
                    or pa.types.is_large_string(t) or pa.types.is_null(t)
                ):
                    raise KafkaSinkError(
                        f"{FAMILY}: column '{name}' has type {t}; it must be binary or string "
                        f"(cast it, e.g. to_json(...) or cast({name} as string))"
                    )
        if "topic" in names:
            t = schema.field("topic").type
            if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
                raise KafkaSinkError(f"{FAMILY}: column 'topic' has type {t}; it must be string")
        elif self.topic is None:
            raise KafkaSinkError(
                f"{FAMILY}: no target topic: set option 'topic' or add a 'topic' column"
            )
        if "partition" in names and not pa.types.is_integer(schema.field("partition").type):
            raise KafkaSinkError(
                f"{FAMILY}: column 'partition' has type {schema.field('partition').type}; it "
                "must be an integer"
            )
        if "headers" in names:
            t = schema.field("headers").type
            ok = pa.types.is_list(t) and pa.types.is_struct(t.value_type)
            item = t.value_type if ok else None
            fields = {item.field(i).name for i in range(item.num_fields)} if item else set()
            if not ok or not {"key", "value"} <= fields:
                raise KafkaSinkError(
                    f"{FAMILY}: column 'headers' has type {t}; it must be "
                    "array<struct<key:string,value:binary>>"
                )
        self._check_identity()
        if not self.transactional:
            _warn_if_speculative()

    # -- executor side ---------------------------------------------------------------------
    def stage(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> TaskReport:
        began = time.perf_counter()
        b, w = task.batch_id, task.writer_id
        report = TaskReport(writer=w, attempt=task.attempt)
        chunks = list(batches)
        wal, markers = self._state()
        # 1. A committed batch writes nothing (a replay after the driver crashed between our
        #    commit and Spark's own commit log).
        last = wal.last_committed()
        if last is not None and last >= b:
            log.info("%s %s: batch %d already committed; writer %d writes nothing",
                     FAMILY, self.sink_id, b, w)
            report.already_committed = True
            return report
        table = pa.Table.from_batches(chunks) if chunks else None
        if table is None or table.num_rows == 0:
            return report
        if not self.deterministic_order:
            table = deterministic_order(table)
        rows = self._rows(table)
        report.rows = rows.n
        seqs = np.arange(rows.n, dtype=np.int64)

        marker = markers.get(b, w)
        counts = dict(marker.partition_counts) if marker is not None else {}
        missing = [t for t in rows.topics if t not in counts]
        if missing:
            if marker is not None:
                raise KafkaSinkError(
                    f"{FAMILY} {self.sink_id}: retry of batch {b} writer {w} writes to topics "
                    f"{missing} that its first attempt did not; the batch's input is not the "
                    "same on replay"
                )
            counts.update(self._partition_counts(missing))
        per_row_count = np.asarray([counts[t] for t in rows.topics], dtype=np.int64)[rows.topic_idx]
        parts = partitioner.route(rows.keys, rows.explicit, seqs, per_row_count)
        self._check_explicit(rows, parts, per_row_count)
        # A small id per target (topic, partition), for the vectorised dedupe decision.
        base = np.concatenate([[0], np.cumsum([counts[t] for t in rows.topics])]).astype(np.int64)
        target_ids = base[rows.topic_idx] + parts
        used = np.unique(target_ids)
        tp_of = {int(i): _tp_of(int(i), rows.topics, base) for i in used}
        names = {i: f"{t}[{p}]" for i, (t, p) in tp_of.items()}

        prefix = recovery.key_prefix(self.sink_id, b, w)
        handle = self._producer(w)
        producer, errors = handle.producer, handle.errors
        txn_producer = producer if self.transactional else None
        try:
            skip = None
            if marker is not None:
                # 2. Retry: what did earlier attempts of (B, w) already write?
                report.retry = True
                start = marker.start_offsets()
                unknown = [names[i] for i, tp in tp_of.items() if tp not in start]
                if unknown:
                    raise KafkaSinkError(
                        f"{FAMILY} {self.sink_id}: retry of batch {b} writer {w} routes rows to "
                        f"{unknown}, which its first attempt did not target; the batch's input "
                        "is not the same on replay"
                    )
                result = self._scan(prefix, start)
                report.scan_records, report.scan_seconds = result.records_read, result.seconds
                id_of = {tp: i for i, tp in tp_of.items()}
                present = {id_of[tp]: s for tp, s in result.seqs.items() if s and tp in id_of}
                stray = [
                    f"{t}[{p}]" for (t, p), s in result.seqs.items() if s and (t, p) not in id_of
                ]
                if stray:
                    raise KafkaSinkError(
                        f"{FAMILY} {self.sink_id}: recovery scan found records of batch {b} "
                        f"writer {w} in {stray}, where this attempt routes nothing; the "
                        "batch's input is not the same on replay"
                    )
                skip = recovery.decide(seqs, target_ids, present, names)
                report.skipped = int(skip.sum())
                log.info("%s %s: batch %d writer %d retry: %d of %d rows already written "
                         "(scan read %d records in %.2fs)", FAMILY, self.sink_id, b, w,
                         report.skipped, rows.n, result.records_read, result.seconds)
            else:
                # 2. First attempt: the marker goes down before the first record does.
                marker = recovery.StartedMarker(
                    sink_id=self.sink_id,
                    batch_id=b,
                    writer=w,
                    partition_counts={t: counts[t] for t in rows.topics},
                    watermarks=self._watermarks(list(tp_of.values())),
                )
                markers.put(marker)
                failpoints.hit(FP_AFTER_MARKER, b)
            # 3. Produce in seq order, flush, fail on any delivery error.
            if txn_producer is not None:
                txn_producer.begin_transaction()
            todo = np.arange(rows.n) if skip is None else np.nonzero(~skip)[0]
            # Seq order matters only within a target partition (that is what the max-seq
            # rule reads). Producing partition by partition lets librdkafka fill one
            # partition's batches at a time instead of interleaving small ones.
            order = todo[np.argsort(target_ids[todo], kind="stable")]
            report.produced = self._produce(producer, rows, parts, prefix, order, b)
            remaining = producer.flush(self.flush_timeout)
            if remaining:
                raise KafkaSinkError(
                    f"{FAMILY} {self.sink_id}: {remaining} records of batch {b} writer {w} were "
                    f"not delivered within flushTimeout={self.flush_timeout:.0f}s"
                )
            if errors:
                raise KafkaSinkError(
                    f"{FAMILY} {self.sink_id}: {len(errors)} records of batch {b} writer {w} "
                    f"failed delivery, e.g. {errors[:3]}; the task fails and its retry skips "
                    "what was written"
                )
            failpoints.hit(FP_AFTER_FLUSH, b)
            if txn_producer is not None:
                txn_producer.commit_transaction(self.flush_timeout)
        except BaseException:
            self._after_failure(handle)
            raise
        finally:
            if txn_producer is not None:
                # A transactional producer serves one task attempt: release it now, not
                # whenever the garbage collector gets to it (a failed attempt's producer
                # is kept alive by the exception's traceback).
                _close_producer(txn_producer, min(self.flush_timeout, 30.0))
        report.partitions = _partition_counts(tp_of, target_ids)
        report.seconds = time.perf_counter() - began
        log.info("%s %s: batch %d writer %d produced %d, skipped %d in %.2fs", FAMILY,
                 self.sink_id, b, w, report.produced, report.skipped, report.seconds)
        return report

    def _rows(self, table: pa.Table) -> _Rows:
        n = table.num_rows
        names = table.column_names
        values = _as_binary(table.column("value")).to_pylist()
        keys = _as_binary(table.column("key")) if "key" in names else None
        if keys is not None and keys.null_count == n:
            keys = None
        if self.topic is not None:
            topics = [self.topic]
            topic_idx = np.zeros(n, dtype=np.int64)
        else:
            col = table.column("topic")
            if col.null_count:
                raise KafkaSinkError(
                    f"{FAMILY} {self.sink_id}: {col.null_count} rows have a null 'topic' and no "
                    "'topic' option is set; give every row a topic or set the option"
                )
            enc = pc.dictionary_encode(col).combine_chunks()
            topics = [str(t) for t in enc.dictionary.to_pylist()]
            topic_idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        explicit = None
        if "partition" in names:
            col = table.column("partition").combine_chunks()
            explicit = col if col.null_count < n else None
        headers = None
        if "headers" in names and table.column("headers").null_count < n:
            headers = [
                [(h["key"], h["value"]) for h in row] if row else None
                for row in table.column("headers").to_pylist()
            ]
        return _Rows(n, values, keys, topics, topic_idx, explicit, headers)

    def _check_explicit(self, rows: _Rows, parts: np.ndarray, counts: np.ndarray) -> None:
        bad = (parts < 0) | (parts >= counts)
        if bad.any():
            i = int(np.nonzero(bad)[0][0])
            raise KafkaSinkError(
                f"{FAMILY} {self.sink_id}: {int(bad.sum())} rows name a partition that does not "
                f"exist, e.g. partition {int(parts[i])} of topic "
                f"{rows.topics[int(rows.topic_idx[i])]!r}, which has {int(counts[i])} "
                f"partitions (valid: 0..{int(counts[i]) - 1})"
            )

    def _produce(
        self,
        producer: Any,
        rows: _Rows,
        parts: np.ndarray,
        prefix: bytes,
        todo: np.ndarray,
        batch_id: int,
    ) -> int:
        """Produce the rows ``todo`` in that order (ascending seq per partition)."""
        produce = producer.produce
        poll = producer.poll
        pack = _SEQ_PACK
        values = rows.values
        keys = rows.keys.to_pylist() if rows.keys is not None else [None] * rows.n
        partitions = parts.tolist()
        order: Sequence[int] = todo.tolist()
        single = rows.topics[0] if len(rows.topics) == 1 else None
        topic_of = None if single is not None else [rows.topics[i] for i in rows.topic_idx.tolist()]
        headers = rows.headers
        armed = failpoints.wants_count(FP_MID_PRODUCE)
        # produce() is called positionally: (topic, value, key, partition, callback,
        # on_delivery, timestamp, headers). Keyword parsing alone would cost a third of the
        # per-record Python time.
        if single is not None and headers is None and armed is None:
            # The hot loop: one topic, no user headers, no failpoint armed.
            for i in order:
                while True:
                    try:
                        produce(single, values[i], keys[i], partitions[i], None, None, 0,
                                [(HEADER, prefix + pack(i))])
                        break
                    except BufferError:
                        poll(0.05)
            return len(order)
        count = 0
        for i in order:
            h = [(HEADER, prefix + pack(i))]
            if headers is not None and headers[i]:
                h.extend(headers[i])
            topic = single if topic_of is None else topic_of[i]
            while True:
                try:
                    produce(topic, values[i], keys[i], partitions[i], None, None, 0, h)
                    break
                except BufferError:
                    poll(0.05)
            count += 1
            if armed is not None and count >= armed:
                if count == armed:
                    # Make "n records written" literally true before crashing, so a retry
                    # really has to skip them (a test of the dedupe, not of luck).
                    producer.flush(self.flush_timeout)
                failpoints.hit(FP_MID_PRODUCE, batch_id, count)
        return count

    # -- Kafka clients (created on the executor, never pickled) ------------------------------
    def _producer(self, writer: int) -> _ProducerSlot:
        if not self.transactional:
            slot = _cached_producer(self.producer_conf)
            # Anything a failed earlier task left in this worker's producer must be settled
            # before this task scans, or the scan could miss records still in flight.
            slot.producer.flush(self.flush_timeout)
            slot.errors.clear()
            return slot
        conf = dict(self.producer_conf)
        conf["transactional.id"] = f"{self.sink_id}-{writer}"
        slot = _ProducerSlot(conf)
        # Fences every older producer with this transactional.id (a zombie attempt) and
        # aborts its open transaction, before this attempt scans or writes.
        slot.producer.init_transactions(self.flush_timeout)
        return slot

    def _after_failure(self, slot: _ProducerSlot) -> None:
        if self.transactional:
            try:
                slot.producer.abort_transaction(min(self.flush_timeout, 30.0))
            except Exception as e:  # noqa: BLE001 - the retry's init_transactions fences it
                log.warning("%s %s: abort_transaction after a failed task: %s", FAMILY,
                            self.sink_id, e)
            return
        # Settle or drop what the failed attempt queued: its retry may run in this worker
        # and must not race records of this attempt still in flight.
        left = slot.producer.flush(min(self.flush_timeout, 30.0))
        if left:
            slot.producer.purge()
        _evict_producer(self.producer_conf)

    def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        admin = _admin(self.producer_conf)
        out: dict[str, int] = {}
        for t in topics:
            meta = admin.list_topics(topic=t, timeout=30)
            info = meta.topics.get(t)
            if info is None or info.error is not None or not info.partitions:
                why = info.error if info is not None else "unknown topic"
                raise KafkaSinkError(
                    f"{FAMILY} {self.sink_id}: target topic {t!r} is not available ({why}); "
                    "create it first (the sink routes every record itself and needs the "
                    "topic's partition count)"
                )
            out[t] = len(info.partitions)
        return out

    def _watermarks(self, tps: list[tuple[str, int]]) -> dict[str, dict[str, int]]:
        """High watermarks ("latest") of the target partitions, before anything is produced.

        On brokers that under-report "latest" (the embedded test broker answers the last
        record batch's base offset + 1), the mark is lower than the true end: safe, the
        recovery scan just reads a little more.
        """
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        admin = _admin(self.producer_conf)
        futures = admin.list_offsets(
            {TopicPartition(t, p): OffsetSpec.latest() for t, p in tps},
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=30,
        )
        out: dict[str, dict[str, int]] = {}
        for tp, fut in futures.items():
            try:
                offset = fut.result().offset
            except Exception as e:
                raise KafkaSinkError(
                    f"{FAMILY} {self.sink_id}: cannot read the end offset of "
                    f"{tp.topic}[{tp.partition}] for the started marker: {e}"
                ) from e
            out.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
        return out

    def _scan(self, prefix: bytes, start: dict[tuple[str, int], int]) -> recovery.ScanResult:
        from confluent_kafka import Consumer

        # Only committed records count as written under transactions: an aborted attempt's
        # records must be produced again.
        isolation = "read_committed" if self.transactional else "read_uncommitted"
        # Stop offsets are high watermarks (ListOffsets read_uncommitted): a read_committed
        # consumer would be told the last stable offset, which another writer's open
        # transaction can hold below records this task's earlier attempt committed.
        marks = self._watermarks(list(start))
        stop = {(t, int(p)): o for t, parts in marks.items() for p, o in parts.items()}
        consumer = Consumer(consumer_config(self.producer_conf, self.sink_id, isolation))
        try:
            return recovery.scan(consumer, prefix, start, stop, self.scan_timeout)
        finally:
            consumer.close()

    # -- driver side -----------------------------------------------------------------------
    def commit(self, batch_id: int, messages: Sequence[Any]) -> None:
        wal, markers = self._state()
        if self.is_committed(batch_id):
            log.info("%s %s: batch %d already committed", FAMILY, self.sink_id, batch_id)
            return
        reports = [m for m in messages if isinstance(m, TaskReport)]
        partitions: dict[str, dict[str, int]] = {}
        for r in reports:
            for t, parts in r.partitions.items():
                dst = partitions.setdefault(t, {})
                for p, n in parts.items():
                    dst[p] = dst.get(p, 0) + n
        info = {
            "sink_id": self.sink_id,
            "rows": sum(r.rows for r in reports),
            "produced": sum(r.produced for r in reports),
            "skipped": sum(r.skipped for r in reports),
            "retried_tasks": sum(1 for r in reports if r.retry),
            "writers": len(reports),
            "slowest_task_s": round(max((r.seconds for r in reports), default=0.0), 3),
            "scan_s": round(sum(r.scan_seconds for r in reports), 3),
            "partitions": partitions,
            "committed_ms": int(time.time() * 1000),
        }
        failpoints.hit(FP_BEFORE_COMMIT, batch_id)
        # 4. The batch is committed once this marker exists; every later attempt or replay
        #    of its tasks writes nothing.
        wal.commit(batch_id, info)
        failpoints.hit(FP_AFTER_COMMIT, batch_id)
        markers.purge(batch_id)
        wal.purge(batch_id - 9, keep_last=0)
        log.info("%s %s: committed batch %d: %d rows, %d produced, %d skipped as already "
                 "written", FAMILY, self.sink_id, batch_id, info["rows"], info["produced"],
                 info["skipped"])

    def abort(self, batch_id: int, messages: Sequence[Any | None]) -> None:
        # Records already in Kafka cannot be taken back, and they need not be: the started
        # markers stay, so the batch's retry scans and skips them.
        log.warning("%s %s: batch %d aborted; its retry will skip what was written",
                    FAMILY, self.sink_id, batch_id)

    def commit_info(self, batch_id: int) -> dict[str, Any] | None:
        return self._state()[0].commit_info(batch_id)


_SPECULATION_WARNED = False


def _warn_if_speculative() -> None:
    """Speculative twins are zombies the non-transactional scan cannot see coming."""
    global _SPECULATION_WARNED
    if _SPECULATION_WARNED:
        return
    try:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        enabled = sc is not None and sc.getConf().get("spark.speculation", "false") == "true"
    except Exception:  # noqa: BLE001 - not on a Spark driver: nothing to check
        return
    if enabled:
        _SPECULATION_WARNED = True
        log.warning(
            "%s: spark.speculation=true: a speculative task attempt can keep producing after "
            "its twin's retry scanned, which breaks exactly-once without transactions; set "
            "spark.speculation=false or option transactional=true", FAMILY)


def _tp_of(target_id: int, topics: list[str], base: np.ndarray) -> tuple[str, int]:
    t = int(np.searchsorted(base, target_id, side="right") - 1)
    return topics[t], target_id - int(base[t])


def _partition_counts(
    tp_of: Mapping[int, tuple[str, int]], target_ids: np.ndarray
) -> dict[str, dict[str, int]]:
    ids, counts = np.unique(target_ids, return_counts=True)
    out: dict[str, dict[str, int]] = {}
    for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
        t, p = tp_of[i]
        out.setdefault(t, {})[str(p)] = c
    return out


def _stringify(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = ["KafkaSink", "TaskReport", "check_producer_config", "deterministic_order"]
