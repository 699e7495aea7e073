"""Kafka records as Spark rows: the source's schema, ``consume()`` lists turned into
``pyarrow.RecordBatch``es in it (executor side, no network).

``to_batch`` runs once per ``consume()`` list and Kafka partition, so it avoids a Python
frame per record: ``map`` over the C-level ``Message`` methods builds each column in a C
loop, and constant columns are repeated, not built (docs/kafka-source.md, "Performance").
``sample_record_bytes`` (driver side) measures the average record for ``maxBytesPerTrigger``.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.kafka.common import LIBRDKAFKA_LOG

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


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


def to_batch(
    msgs: list[Any],
    offsets: list[int],
    topic: str,
    partition: int,
    cluster: str | None,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """Messages of one Kafka partition -> one batch in ``schema`` (``arrow_schema``:
    headers when it has them)."""
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


def concat(batches: list[pa.RecordBatch], schema: pa.Schema, rows: int) -> list[pa.RecordBatch]:
    """``batches`` as few batches of up to ``rows`` rows (one copy; a single batch as is):
    a grouped read makes one small batch per Kafka partition, and Spark pays per batch."""
    if len(batches) == 1:
        return batches
    table = pa.Table.from_batches(batches, schema).combine_chunks()
    return table.to_batches(max_chunksize=rows)


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
