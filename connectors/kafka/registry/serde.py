"""The registry formats as types (docs/schema-registry.md): what a column's decoder (the
source) and encoder (the sink) are, what a format does on the driver, and the one table from
a format's name (``keyFormat``/``valueFormat``) to the module that holds both of its
directions, as confluent-kafka-python's ``schema_registry`` keeps ``avro.py``,
``json_schema.py`` and ``protobuf.py``, each a serializer and a deserializer:

| format | module | the registry's ``schemaType`` |
|---|---|---|
| ``avro`` | :mod:`~connectors.kafka.registry.avro` | ``AVRO`` |
| ``json-schema`` | :mod:`~connectors.kafka.registry.json_schema` | ``JSON`` |
| ``protobuf`` | :mod:`~connectors.kafka.registry.protobuf` (an extra) | ``PROTOBUF`` |

The source (:mod:`~connectors.kafka.registry.source_formats`) and the sink
(:mod:`~connectors.kafka.registry.sink_formats`) look a column's format up here
(:func:`format_of`) and call it through :class:`Format`; neither names a format itself. What
every format shares (the wire header, the errors) is in
:mod:`~connectors.kafka.registry.framing`, below the format modules, so that the imports
point one way: this table -> a format -> framing. A format's module is imported when it is
first used, since Protobuf's dependencies are an extra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from connectors.kafka.registry.client import RegisteredSchema, RegistryClient
from connectors.kafka.registry.framing import WriterSchema


class Decoder(Protocol):
    """One column (``key`` or ``value``) of framed records -> an Arrow array of the reader
    schema's Spark type, on the source's executors."""

    #: the Spark (Arrow) type of the decoded column
    type: pa.DataType

    def decode(self, values: pa.Array, where: Callable[[int], str]) -> pa.Array:
        """``values`` (binary, framed) -> an array of :attr:`type`, a null staying null;
        ``where(i)`` names record ``i`` (topic, partition, offset) for the
        :class:`~connectors.kafka.registry.framing.DecodeError` of a record that does not
        decode."""
        ...


class Encoder(Protocol):
    """One column -> framed records of the writer schema resolved on the driver, on the
    sink's executors."""

    def encode(self, values: pa.Array) -> pa.Array:
        """``values`` -> a binary array of framed records, a null staying null."""
        ...


class Format(Protocol):
    """What the source and the sink do with one format; each format's module is one."""

    def reader_schema(self, client: RegistryClient, found: RegisteredSchema) -> str:
        """The source's reader schema (a subject's version) as the query carries it."""
        ...

    def reader_type(self, schema: str, column: str) -> pa.DataType:
        """The Spark type of a reader schema (as :meth:`reader_schema` made it); a schema
        Spark cannot type raises
        :class:`~connectors.kafka.registry.framing.SchemaNotRepresentable`."""
        ...

    def decoder(self, column: str, schema: str, schema_id: int | None, subject: str | None,
                client: RegistryClient) -> Decoder:
        """The executor's decoder of a resolved column; ``client`` looks up the writer
        schemas of ids it has not seen."""
        ...

    def writer_schema(self, t: pa.DataType, name: str, namespace: str,
                      column: str) -> WriterSchema:
        """The sink's schema of a column of Spark type ``t`` (``avroRecordName``,
        ``avroRecordNamespace``)."""
        ...

    def latest_writer(self, client: RegistryClient, found: RegisteredSchema, t: pa.DataType,
                      column: str, subject: str) -> str:
        """The schema text to write with when ``useLatestVersion`` takes the subject's latest
        (``found``), once a column of type ``t`` is checked to fit it."""
        ...

    def encoder(self, column: str, schema: str, schema_id: int) -> Encoder:
        """The executor's encoder of a resolved column."""
        ...


@dataclass(frozen=True)
class Entry:
    """One row of the table: the registry's name of the format, and its module."""

    #: the registry's ``schemaType``
    schema_type: str
    load: Callable[[], Format]
    #: the package extra its dependencies come with (None: the base install's)
    extra: str | None = None

    def install_hint(self) -> str:
        return (f'needs the {self.extra} package: pip install '
                f'"pyspark-exactly-once[{self.extra}]"')


def _avro() -> Format:
    from connectors.kafka.registry import avro

    return avro


def _json_schema() -> Format:
    from connectors.kafka.registry import json_schema

    return json_schema


def _protobuf() -> Format:
    from connectors.kafka.registry import protobuf

    return protobuf


#: A format's name -> its entry.
FORMATS: Mapping[str, Entry] = {
    "avro": Entry("AVRO", _avro),
    "json-schema": Entry("JSON", _json_schema),
    "protobuf": Entry("PROTOBUF", _protobuf, extra="protobuf"),
}
#: The formats a key or value column can have, of the source and the sink: ``binary`` (the
#: bytes as they are, Spark's Kafka source) and the table's.
COLUMN_FORMATS = ("binary", *FORMATS)


def format_of(name: str, refuse: Callable[[str], Exception] | None = None) -> Format:
    """The format called ``name`` (a key of :data:`FORMATS`). When its :attr:`Entry.extra`
    is not installed: ``refuse(hint)`` is raised (the caller's error naming its option,
    ``hint`` the install command), or the ImportError when ``refuse`` is None."""
    entry = FORMATS[name]
    try:
        return entry.load()
    except ImportError as e:
        if entry.extra is None or refuse is None:
            raise
        raise refuse(entry.install_hint()) from e
