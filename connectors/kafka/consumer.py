"""Executor side of the ``eo_kafka`` source: cached consumers and the range reader.

:func:`read_range` reads one :class:`~connectors.kafka.offsets.OffsetRange` ``[start, end)``
and yields ``pyarrow.RecordBatch``es in Spark's Kafka schema. It stops on *position*, not
on a message count: compaction and transaction markers leave gaps in the offsets, so
"end - start messages" would wait forever (or read into the next window).

Consumers are cached per Python worker, keyed by their configuration, so a micro-batch
does not pay consumer start-up (and a metadata round trip) for every partition.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.core.errors import KafkaSourceError
from connectors.kafka.offsets import OffsetRange, report_data_loss

log = logging.getLogger(__name__)

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

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
        consumer = Consumer(dict(conf))
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
        yield from _read(
            consumer, r, include_headers, cluster, fail_on_data_loss, poll_timeout_s,
            batch_records,
        )
    except GeneratorExit:
        # Spark stopped reading early (a limit); the consumer is still fine.
        raise
    except BaseException:
        drop_consumer(conf)
        raise


def _read(
    consumer: Any,
    r: OffsetRange,
    include_headers: bool,
    cluster: str | None,
    fail_on_data_loss: bool,
    poll_timeout_s: float,
    batch_records: int,
) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import KafkaError, TopicPartition

    topic, partition, end = r.topic, r.partition, r.end
    position = r.start
    consumer.assign([TopicPartition(topic, partition, position)])
    schema = arrow_schema(include_headers, cluster is not None)
    last_wanted = end - 1
    deadline = time.monotonic() + poll_timeout_s
    eof_codes = (KafkaError._PARTITION_EOF,)
    reset_codes = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
    try:
        while True:
            msgs = consumer.consume(batch_records, 1.0)
            if not msgs:
                # Brokers differ on a fetch outside the log: Kafka answers
                # OFFSET_OUT_OF_RANGE (handled below), others just return nothing. So a
                # stall checks the watermarks itself.
                jump = _stalled(consumer, r, position, fail_on_data_loss, poll_timeout_s)
                if jump is not None:
                    position = jump
                    if position >= end:
                        return
                    consumer.assign([TopicPartition(topic, partition, position)])
                    continue
                if time.monotonic() > deadline:
                    raise KafkaSourceError(
                        f"eo_kafka: reading {r.describe()} made no progress for "
                        f"{poll_timeout_s:.0f}s (at offset {position}); the broker is "
                        "unreachable or an open transaction holds the last stable offset "
                        "(kafkaConsumer.pollTimeoutMs sets this limit)"
                    )
                continue
            good = [m for m in msgs if m.error() is None]
            done = False
            if len(good) != len(msgs):
                for m in msgs:
                    err = m.error()
                    if err is None:
                        continue
                    code = err.code()
                    if code in eof_codes:
                        if m.offset() >= end:
                            done = True
                    elif code in reset_codes:
                        position = _out_of_range(
                            consumer, r, position, err, fail_on_data_loss, poll_timeout_s
                        )
                        if position >= end:
                            return
                        consumer.assign([TopicPartition(topic, partition, position)])
                        good = []
                        break
                    elif err.fatal() or not err.retriable():
                        raise KafkaSourceError(
                            f"eo_kafka: reading {r.describe()} at offset {position}: {err}"
                        )
                    else:
                        log.debug("eo_kafka: transient error on %s: %s", r.describe(), err)
            if good:
                offsets = [m.offset() for m in good]
                if offsets[-1] >= last_wanted:
                    done = True
                    if offsets[-1] >= end:
                        cut = bisect.bisect_left(offsets, end)
                        good, offsets = good[:cut], offsets[:cut]
                if good:
                    position = offsets[-1] + 1
                    yield _to_batch(good, offsets, topic, partition, cluster, schema)
                deadline = time.monotonic() + poll_timeout_s
            if done:
                return
    finally:
        # Stop fetching this partition: the next range may be another one.
        try:
            consumer.unassign()
        except Exception:  # noqa: BLE001, S110 - the consumer is dropped on error anyway
            pass


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
    # One list comprehension per column: the per-message Python work is the whole cost.
    n = len(msgs)
    stamps = [m.timestamp() for m in msgs]
    ts = pa.array([s[1] for s in stamps], pa.int64())
    columns: list[pa.Array] = [
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),  # type: ignore[attr-defined]
        pa.repeat(pa.scalar(partition, pa.int32()), n),  # type: ignore[attr-defined]
        pa.array(offsets, pa.int64()),
        pc.multiply(ts, 1000).cast(TIMESTAMP_TYPE),
        pa.array([s[0] - 1 for s in stamps], pa.int32()),
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

    sample_conf = dict(conf)
    sample_conf["auto.offset.reset"] = "earliest"
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
