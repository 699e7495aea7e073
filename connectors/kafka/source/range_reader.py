"""Executor side of the ``eo_kafka`` source: cached consumers and the range reader.

:func:`read_range` reads one :class:`~connectors.kafka.source.offsets.OffsetRange` ``[start, end)``
and yields ``pyarrow.RecordBatch``es in Spark's Kafka schema. It stops on *position*, not
on a message count: compaction and transaction markers leave gaps in the offsets, so
"end - start messages" would wait forever (or read into the next window).

Consumers are cached per Python worker, keyed by their configuration, so a micro-batch
does not pay consumer start-up (and a metadata round trip) for every partition.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import operator
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.core.errors import KafkaSourceError
from connectors.kafka.common import LIBRDKAFKA_LOG
from connectors.kafka.source.offsets import OffsetRange, report_data_loss

log = logging.getLogger(__name__)

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)

# Per Python worker: config -> Consumer. Spark reuses Python workers across tasks
# (spark.python.worker.reuse, on by default), so consumers outlive one task.
_CONSUMERS: dict[tuple[tuple[str, str], ...], Any] = {}
_MAX_CACHED = 8


def arrow_schema(include_headers: bool, with_cluster: bool) -> pa.Schema:
    """Spark's Kafka source schema as Arrow (plus ``headers`` and ``cluster`` when asked)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADERS_TYPE))
    if with_cluster:
        fields.append(pa.field("cluster", pa.string()))
    return pa.schema(fields)


def spark_schema_ddl(include_headers: bool, with_cluster: bool) -> str:
    ddl = (
        "key binary, value binary, topic string, partition int, offset bigint, "
        "timestamp timestamp, timestampType int"
    )
    if include_headers:
        ddl += ", headers array<struct<key: string, value: binary>>"
    if with_cluster:
        ddl += ", cluster string"
    return ddl


def cached_consumer(conf: Mapping[str, str]) -> Any:
    """The worker's consumer for ``conf``, created on first use."""
    key = tuple(sorted(conf.items()))
    consumer = _CONSUMERS.get(key)
    if consumer is None:
        from confluent_kafka import Consumer

        if len(_CONSUMERS) >= _MAX_CACHED:
            _, old = _CONSUMERS.popitem()
            _close_quietly(old)
        consumer = Consumer({**conf, "logger": LIBRDKAFKA_LOG})
        _CONSUMERS[key] = consumer
    return consumer


def drop_consumer(conf: Mapping[str, str]) -> None:
    """Forget (and close) a consumer after an error left it in an unknown state."""
    consumer = _CONSUMERS.pop(tuple(sorted(conf.items())), None)
    if consumer is not None:
        _close_quietly(consumer)


def close_cached_consumers() -> None:
    """Close every consumer this process cached (see ``connectors.kafka.close_cached_clients``)."""
    while _CONSUMERS:
        _close_quietly(_CONSUMERS.popitem()[1])


def _close_quietly(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception:  # noqa: BLE001, S110 - closing a consumer we are discarding
        pass


def read_range(
    r: OffsetRange,
    conf: Mapping[str, str],
    *,
    include_headers: bool = False,
    cluster: str | None = None,
    fail_on_data_loss: bool = True,
    poll_timeout_s: float = 120.0,
    batch_records: int = 20000,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``[r.start, r.end)`` as record batches, by position.

    The range is done when a record at offset >= ``end - 1`` arrived, or the partition EOF
    is at or past ``end`` (the last offsets were transaction markers or compacted away).
    Offsets before the log start are data loss (``fail_on_data_loss``), except for a new
    partition, which starts at its earliest offset.
    """
    if r.size == 0:
        return
    consumer = cached_consumer(conf)
    try:
        yield from _read(_RangeReader(consumer, r, include_headers, cluster,
                                      fail_on_data_loss, poll_timeout_s, batch_records))
    except GeneratorExit:
        # Spark stopped reading early (a limit); the consumer is still fine.
        raise
    except BaseException:
        drop_consumer(conf)
        raise


def _read(reader: _RangeReader) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import TopicPartition

    consumer, r = reader.consumer, reader.r
    consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
    try:
        while not reader.done:
            # The cyclic GC off while one consume() list is turned into a batch: every
            # Message is a GC-tracked object, so tens of thousands of them per call would
            # run generation-0 collections (and promote into full ones) that find nothing
            # to free. It is on again before the batch leaves, so Spark's code and ours
            # between batches collect as usual.
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                batch = reader.step()
            finally:
                if gc_was_on:
                    gc.enable()
            if batch is not None:
                yield batch
    finally:
        # Stop fetching this partition: the next range may be another one.
        try:
            consumer.unassign()
        except Exception:  # noqa: BLE001, S110 - the consumer is dropped on error anyway
            pass
        release_free_memory()


def release_free_memory() -> None:
    """Give the C heap's free pages back to the OS after a range (glibc ``malloc_trim``).

    librdkafka's fetch buffers come from its broker threads' malloc arenas; once freed, glibc
    keeps them, so a reused Python worker's RSS climbs with every query it serves (257 MB
    after one 1M-record read, ~430 MB after seven reads in one session) although what it
    holds is bounded. A no-op where the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Any:
    global _TRIM
    if _TRIM is None:
        try:
            import ctypes
            import ctypes.util

            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    return _TRIM or None


_TRIM: Any = None


class _RangeReader:
    """The state of one range read: the position, the deadline, whether it is done.

    :meth:`step` makes one ``consume()`` call and returns at most one batch; the caller
    loops until :attr:`done`."""

    def __init__(
        self,
        consumer: Any,
        r: OffsetRange,
        include_headers: bool,
        cluster: str | None,
        fail_on_data_loss: bool,
        poll_timeout_s: float,
        batch_records: int,
    ) -> None:
        from confluent_kafka import KafkaError

        self.consumer, self.r, self.cluster = consumer, r, cluster
        self.fail_on_data_loss, self.poll_timeout_s = fail_on_data_loss, poll_timeout_s
        self.batch_records = batch_records
        self.schema = arrow_schema(include_headers, cluster is not None)
        self.position = r.start
        self.done = False
        self.deadline = time.monotonic() + poll_timeout_s
        self.eof_code = KafkaError._PARTITION_EOF
        self.reset_codes = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)

    def _seek(self, position: int) -> None:
        from confluent_kafka import TopicPartition

        self.position = position
        if position >= self.r.end:
            self.done = True
        else:
            self.consumer.assign([TopicPartition(self.r.topic, self.r.partition, position)])

    def step(self) -> pa.RecordBatch | None:
        from confluent_kafka import Message

        r, end = self.r, self.r.end
        # Ask for no more than the range still holds: records past ``end`` are the next
        # window's, and a smaller ask returns as soon as the range is complete. (Gaps from
        # markers or compaction make the ask too large by a little; the cut below drops
        # what lies past ``end``, and the partition EOF ends a range that ends in a gap.)
        want = max(1, min(self.batch_records, end - self.position))
        msgs = self.consumer.consume(want, 1.0)
        if not msgs:
            self._no_records()
            return None
        errors = list(map(Message.error, msgs))
        # Identity, not ``errors.count(None)``: KafkaError's == raises on None.
        if any(map(operator.is_not, errors, itertools.repeat(None, len(errors)))):
            msgs = self._errors(msgs, errors)
            if not msgs:
                return None
        # Records (no error) always carry an offset; the stubs allow None for events.
        offsets: list[int] = list(map(Message.offset, msgs))  # type: ignore[arg-type]
        if offsets[-1] >= end - 1:
            self.done = True
            if offsets[-1] >= end:
                cut = bisect.bisect_left(offsets, end)
                msgs, offsets = msgs[:cut], offsets[:cut]
                if not msgs:
                    return None
        self.position = offsets[-1] + 1
        self.deadline = time.monotonic() + self.poll_timeout_s
        return _to_batch(msgs, offsets, r.topic, r.partition, self.cluster, self.schema)

    def _no_records(self) -> None:
        # Brokers differ on a fetch outside the log: Kafka answers OFFSET_OUT_OF_RANGE
        # (handled in _errors), others just return nothing. So a stall checks the
        # watermarks itself.
        jump = _stalled(self.consumer, self.r, self.position, self.fail_on_data_loss,
                        self.poll_timeout_s)
        if jump is not None:
            self._seek(jump)
            return
        if time.monotonic() > self.deadline:
            raise KafkaSourceError(
                f"eo_kafka: reading {self.r.describe()} made no progress for "
                f"{self.poll_timeout_s:.0f}s (at offset {self.position}); the broker is "
                "unreachable or an open transaction holds the last stable offset "
                "(kafkaConsumer.pollTimeoutMs sets this limit)"
            )

    def _errors(self, msgs: list[Any], errors: list[Any]) -> list[Any]:
        """The slow path of a consume() list with error events: EOF, out of range, or a
        failure; returns the records to keep."""
        good = []
        for m, err in zip(msgs, errors, strict=True):
            if err is None:
                good.append(m)
                continue
            code = err.code()
            if code == self.eof_code:
                if m.offset() >= self.r.end:
                    self.done = True
            elif code in self.reset_codes:
                self._seek(_out_of_range(self.consumer, self.r, self.position, err,
                                         self.fail_on_data_loss, self.poll_timeout_s))
                return []
            elif err.fatal() or not err.retriable():
                raise KafkaSourceError(
                    f"eo_kafka: reading {self.r.describe()} at offset {self.position}: {err}"
                )
            else:
                log.debug("eo_kafka: transient error on %s: %s", self.r.describe(), err)
        return good


def _stalled(
    consumer: Any, r: OffsetRange, position: int, fail_on_data_loss: bool, timeout: float
) -> int | None:
    """No records came: the new position if ``position`` is outside the log, else None."""
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(
        TopicPartition(r.topic, r.partition), timeout=timeout, cached=False
    )
    if position < low or position > high:
        return _out_of_range(consumer, r, position, "no records at this offset",
                             fail_on_data_loss, timeout)
    return None


def _out_of_range(
    consumer: Any,
    r: OffsetRange,
    position: int,
    err: Any,
    fail_on_data_loss: bool,
    timeout: float,
) -> int:
    """``position`` is outside the log: decide whether that is data loss; return where to go."""
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(
        TopicPartition(r.topic, r.partition), timeout=timeout, cached=False
    )
    if position < low:
        if not r.new_partition:
            report_data_loss(
                fail_on_data_loss,
                f"{r.describe()}: offsets [{position}, {min(low, r.end)}) were deleted "
                f"(log now starts at {low}; retention or compaction removed them)",
            )
        return low
    report_data_loss(
        fail_on_data_loss,
        f"{r.describe()}: offset {position} is beyond the end of the log ({high}); "
        f"offsets [{position}, {r.end}) are not available ({err})",
    )
    return r.end


def _to_batch(
    msgs: list[Any],
    offsets: list[int],
    topic: str,
    partition: int,
    cluster: str | None,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """Messages -> one batch in ``schema`` (``arrow_schema``: headers when it has them)."""
    from confluent_kafka import Message

    # ``map`` over the C-level Message methods: one C loop per column, no Python frame
    # per record; constant columns are repeated, not built.
    n = len(msgs)
    keys = list(map(Message.key, msgs))
    pairs = list(map(Message.timestamp, msgs))  # (type, milliseconds)
    stamp_types = list(map(_FIRST, pairs))
    first_type = stamp_types[0]
    columns: list[pa.Array] = [
        pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary()),
        pa.array(list(map(Message.value, msgs)), pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),  # type: ignore[attr-defined]
        pa.repeat(pa.scalar(partition, pa.int32()), n),  # type: ignore[attr-defined]
        pa.array(offsets, pa.int64()),
        # librdkafka: milliseconds; Arrow/Spark: microseconds (one vectorised multiply).
        pc.multiply(pa.array(list(map(_SECOND, pairs)), pa.int64()), 1000).cast(TIMESTAMP_TYPE),
        # librdkafka's type (1 create time, 2 log append time, 0 none) minus 1 is Spark's.
        (pa.repeat(pa.scalar(first_type - 1, pa.int32()), n)  # type: ignore[attr-defined]
         if stamp_types.count(first_type) == n
         else pa.array([t - 1 for t in stamp_types], pa.int32())),
    ]
    if schema.get_field_index("headers") >= 0:
        columns.append(pa.array([_headers(m.headers()) for m in msgs], HEADERS_TYPE))
    if cluster is not None:
        columns.append(pa.repeat(pa.scalar(cluster, pa.string()), n))  # type: ignore[attr-defined]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _headers(h: list[tuple[str, bytes | None]] | None) -> list[dict[str, Any]] | None:
    if not h:
        return None
    return [{"key": k, "value": v} for k, v in h]


def sample_record_bytes(
    conf: Mapping[str, str], topic: str, partition: int, start: int, end: int, n: int = 500
) -> float | None:
    """Average bytes (key + value + headers) of up to ``n`` records from ``start``.

    Used by the driver for ``maxBytesPerTrigger``; None when nothing could be read.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    sample_conf: dict[str, Any] = dict(conf)
    sample_conf["auto.offset.reset"] = "earliest"
    sample_conf["logger"] = LIBRDKAFKA_LOG
    consumer = Consumer(sample_conf)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        total = count = 0
        deadline = time.monotonic() + 10.0
        while count < n and time.monotonic() < deadline:
            for m in consumer.consume(n - count, 1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        deadline = 0.0
                    continue
                if (m.offset() or 0) >= end:
                    deadline = 0.0
                    break
                size = len(m.key() or b"") + len(m.value() or b"")
                headers: Any = m.headers() or []
                for hk, hv in headers:
                    size += len(hk) + len(hv or b"")
                total += size
                count += 1
        return total / count if count else None
    finally:
        consumer.close()
