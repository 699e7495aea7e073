"""The source's Schema Registry formats: which column is decoded how (the picklable spec),
the reader schemas resolved on the driver, and the decoding of the reader's Arrow batches;
each column's format looked up in the table of :mod:`~connectors.kafka.registry.serde`
(its module reads it).

1. :func:`parse` (driver, no network): ``keyFormat``/``valueFormat``, the subjects (the
   TopicNameStrategy ``<topic>-key``/``<topic>-value`` by default), pinned versions and
   ``schemaRegistry.*``, validated when the query is defined;
2. :func:`resolve` (driver, once per query start): each reader schema from the registry
   (the subject's latest version or the pinned one), checked to have a Spark type; the
   resolved spec travels to the executors with the reader, so every task of a query
   decodes to the same schema;
3. :func:`decode_batches` (executor): each batch's framed ``key``/``value`` -> typed
   columns. A writer schema id a worker has not seen is asked from the registry once per
   worker process (:func:`~connectors.kafka.registry.client.client_for`), never per record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa

from connectors.core.errors import OptionError
from connectors.core.options import option_error
from connectors.kafka.registry import serde
from connectors.kafka.registry.client import RegistrySpec, client_for
from connectors.kafka.registry.framing import DecodeError


def column_type(kind: str, schema: str, column: str) -> pa.DataType:
    """The Arrow (Spark) type of a reader schema of format ``kind`` (as the format's
    :meth:`~connectors.kafka.registry.serde.Format.reader_schema` made it)."""
    return _format(kind, column).reader_type(schema, column)


def _format(kind: str, column: str) -> serde.Format:
    """The format's module; one whose dependencies are an extra is imported when used."""
    return serde.format_of(kind, lambda hint: OptionError(
        f"eo_kafka: {column}Format={kind} {hint}", option=f"{column}Format"))


@dataclass(frozen=True)
class ColumnFormat:
    """How one column (``key`` or ``value``) is decoded."""

    column: str
    kind: str
    subject: str
    #: a pinned version of the subject; None = its latest when the query starts
    version: int | None = None
    #: resolved on the driver (:func:`resolve`): the reader schema and its id
    schema: str | None = None
    schema_id: int | None = None


@dataclass(frozen=True)
class SourceFormats:
    """The registry formats of one source (None in the source options when both columns
    are plain bytes)."""

    registry: RegistrySpec
    columns: tuple[ColumnFormat, ...]
    #: ``onDecodeError``: ``fail`` the task, or ``dlq``: keep the row, its column null,
    #: the reason in ``decodeError`` and the record's bytes in ``rawKey``/``rawValue``
    on_error: str = "fail"

    def column(self, name: str) -> ColumnFormat | None:
        for c in self.columns:
            if c.column == name:
                return c
        return None

    @property
    def resolved(self) -> bool:
        return all(c.schema is not None for c in self.columns)


def parse(family: str, formats: Mapping[str, str], subjects: Mapping[str, str | None],
          versions: Mapping[str, str | None], registry: Mapping[str, str],
          topics: tuple[str, ...], names: Mapping[str, str],
          on_error: str = "fail") -> SourceFormats | None:
    """The spec from the declared options (``formats``/``subjects``/``versions`` keyed by
    column); ``topics``: the subscribed topics when they are known by name (the default
    subject needs exactly one); ``names``: each option's Spark spelling, for messages."""
    columns = []
    for column in ("key", "value"):
        kind = formats[column].lower()
        if kind == "binary":
            for given, what in ((subjects[column], "Subject"), (versions[column], "SchemaVersion")):
                if given is not None:
                    raise option_error(family, names[column + what],
                                       f"is set but {names[column + 'Format']} is binary",
                                       f"set {names[column + 'Format']}=avro, or remove it")
            continue
        subject = subjects[column]
        if subject is None:
            if len(topics) != 1:
                raise option_error(
                    family, names[column + "Subject"],
                    "is required when the source reads "
                    + ("a topic pattern" if not topics else f"{len(topics)} topics"),
                    f"name the subject of the {column} schema (the default, "
                    f"'<topic>-{column}', needs exactly one topic)")
            subject = f"{topics[0]}-{column}"
        version_text = versions[column]
        version: int | None = None
        if version_text is not None and version_text.lower() != "latest":
            try:
                version = int(version_text)
            except ValueError:
                version = 0
            if version < 1:
                raise option_error(family, names[column + "SchemaVersion"],
                                   f"has invalid value {version_text!r}",
                                   "give 'latest' or a version number >= 1")
        columns.append(ColumnFormat(column, kind, subject, version))
    if not columns:
        if on_error.lower() != "fail":
            raise option_error(family, names.get("onDecodeError", "onDecodeError"),
                               "is set but neither keyFormat nor valueFormat decodes anything",
                               "set valueFormat=avro (or keyFormat), or remove it")
        if registry:
            key = next(iter(registry))
            raise option_error(family, "schemaRegistry." + key,
                               "is set but neither keyFormat nor valueFormat needs a registry",
                               "set valueFormat=avro (or keyFormat), or remove schemaRegistry.*")
        return None
    return SourceFormats(RegistrySpec.parse(family, registry), tuple(columns),
                         on_error.lower())


def resolve(formats: SourceFormats) -> SourceFormats:
    """Each column's reader schema from the registry (driver side), checked to have a
    Spark type (:meth:`~connectors.kafka.registry.serde.Format.reader_type`)."""
    client = client_for(formats.registry)
    columns = []
    for c in formats.columns:
        found = client.subject_version(c.subject, c.version if c.version is not None
                                       else "latest")
        if found.schema_type.upper() != serde.FORMATS[c.kind].schema_type:
            raise OptionError(
                f"eo_kafka: subject {c.subject!r} holds a {found.schema_type} schema, but "
                f"{c.column}Format is {c.kind}; set {c.column}Format to the subject's format",
                option=f"{c.column}Format")
        fmt = _format(c.kind, c.column)
        text = fmt.reader_schema(client, found)
        fmt.reader_type(text, c.column)
        columns.append(dataclasses.replace(c, schema=text, schema_id=found.id))
    return dataclasses.replace(formats, columns=tuple(columns))


def arrow_schema(base: pa.Schema, formats: SourceFormats | None) -> pa.Schema:
    """The source's schema with each formatted column's decoded type (resolved formats)."""
    if formats is None:
        return base
    for c in formats.columns:
        if c.schema is None:
            raise ValueError(f"{c.column}: the format is not resolved")
        i = base.get_field_index(c.column)
        base = base.set(i, pa.field(c.column, column_type(c.kind, c.schema, c.column)))
    if formats.on_error == "dlq":
        base = base.append(pa.field(DECODE_ERROR, pa.string()))
        for c in formats.columns:
            base = base.append(pa.field(_raw_name(c.column), pa.binary()))
    return base


#: The dead-letter columns of ``onDecodeError=dlq``.
DECODE_ERROR = "decodeError"


def _raw_name(column: str) -> str:
    return "raw" + column.capitalize()


def decode_batches(batches: Iterator[pa.RecordBatch], formats: SourceFormats,
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The reader's batches (framed bytes) -> batches of ``schema`` (decoded columns)."""
    client = client_for(formats.registry)
    decoders: dict[str, serde.Decoder] = {}
    for c in formats.columns:
        if c.schema is None:
            raise ValueError(f"{c.column}: the format is not resolved")
        decoders[c.column] = serde.format_of(c.kind).decoder(c.column, c.schema, c.schema_id,
                                                             c.subject, client)
    for batch in batches:
        columns = list(batch.columns)

        def where(i: int, b: pa.RecordBatch = batch) -> str:
            return (f"topic {b.column('topic')[i].as_py()} partition "
                    f"{b.column('partition')[i].as_py()} offset {b.column('offset')[i].as_py()}")

        if formats.on_error == "dlq":
            yield _decode_keeping_errors(batch, columns, decoders, where, schema)
            continue
        for name, decoder in decoders.items():
            i = batch.schema.get_field_index(name)
            columns[i] = decoder.decode(batch.column(i), where)
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _decode_keeping_errors(batch: pa.RecordBatch, columns: list[pa.Array],
                           decoders: Mapping[str, serde.Decoder],
                           where: Callable[[int], str],
                           schema: pa.Schema) -> pa.RecordBatch:
    """``onDecodeError=dlq``: a record that does not decode keeps its row, with its column
    null, the error in ``decodeError`` and its bytes in ``rawKey``/``rawValue``; the batch
    is decoded whole first, record by record only when it holds a bad one."""
    n = batch.num_rows
    errors: list[str | None] = [None] * n
    raws = []
    for name, decoder in decoders.items():
        i = batch.schema.get_field_index(name)
        values = batch.column(i)
        try:
            columns[i] = decoder.decode(values, where)
            bad: set[int] = set()
        except DecodeError:
            parts, bad = [], set()
            for r in range(n):
                try:
                    parts.append(decoder.decode(values.slice(r, 1), _record(where, r)))
                except DecodeError as e:
                    bad.add(r)
                    errors[r] = "; ".join(filter(None, (errors[r], str(e))))
                    parts.append(pa.nulls(1, decoder.type))
            columns[i] = pa.concat_arrays(parts)
        raws.append(pa.array([values[r].as_py() if r in bad else None for r in range(n)],
                             pa.binary()) if bad else pa.nulls(n, pa.binary()))
    return pa.RecordBatch.from_arrays([*columns, pa.array(errors, pa.string()), *raws],
                                      schema=schema)


def _record(where: Callable[[int], str], r: int) -> Callable[[int], str]:
    """``where`` of a one-record slice: its record 0 is the batch's record ``r``."""
    return lambda _: where(r)
