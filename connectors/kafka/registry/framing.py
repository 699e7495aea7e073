"""What every registry format shares (confluent-kafka-python keeps the same in its
``schema_registry/common/serde.py``): the Confluent wire format's header, the errors of
reading a framed record or a schema, and the sink's check that a column fits a registered
schema. Below every format module and :mod:`~connectors.kafka.registry.serde`, so that
the formats and the table that names them import one way.

A framed record is the magic byte 0, the writer schema's id (4 bytes, big-endian), then the
format's payload (Protobuf puts its message indexes first).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

import pyarrow as pa

from connectors.core.errors import KafkaSinkError, KafkaSourceError

MAGIC = 0
HEADER = 5
#: The Spark ``timestamp`` every format's instants read as.
TIMESTAMP_UTC = pa.timestamp("us", tz="UTC")


def header(schema_id: int) -> bytes:
    """The 5 bytes before a payload written with schema ``schema_id``."""
    return bytes([MAGIC]) + schema_id.to_bytes(4, "big")


class WriterSchema(NamedTuple):
    """The sink's schema of a column's Spark type: the text it registers, and the full name
    of its record (a RecordNameStrategy subject's name; None when the column is no record)."""

    text: str
    record: str | None


class SchemaNotRepresentable(KafkaSourceError):
    """A schema with no Spark SQL type (recursion, a union whose branches decode alike)."""


class DecodeError(KafkaSourceError):
    """A record that cannot be decoded: which record, which schema, why."""


def check_fits(t: pa.DataType, want: pa.DataType, needed: Collection[str], column: str,
               subject: str) -> None:
    """A struct column of type ``t`` can be written with a subject's latest schema, whose
    Spark type is ``want``: each field the schema ``needed`` (not defaulted, required) is a
    column of the struct."""
    if pa.types.is_struct(want) and pa.types.is_struct(t):
        have = {f.name for f in t}
        missing = [f.name for f in want if f.name not in have and f.name in needed]
        if missing:
            raise KafkaSinkError(
                f"eo_kafka: the latest schema of subject {subject!r} needs the {column} "
                f"fields {missing}, which the DataFrame's {column} struct does not have")
