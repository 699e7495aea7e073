"""Avro in the Confluent wire format <-> Arrow columns (executor side, no network but the
registry lookup of a writer schema id a worker has not seen yet).

- :func:`arrow_type`: the Arrow (and so Spark) type of an Avro schema, with Spark's own
  ``from_avro`` mapping (docs/schema-registry.md, "Type mapping"; a union of several
  non-null types is a struct of ``member0``, ``member1``..., :mod:`avro_unions`); a schema
  that Spark types cannot represent (a recursive record) is refused with the path of the
  offending field;
- :class:`AvroDecoder`: one binary column of framed records -> one Arrow array of the
  reader schema's type. Each record's writer schema (its id) is resolved to the reader
  schema with the Avro specification's resolution rules (fastavro implements them: added
  fields with defaults, removed fields, promotions, enum and union rules).

Why fastavro, per record (measured, docs/schema-registry.md "Decoder choice"): the
Arrow-native Avro readers on PyPI read Avro *container files*. One of them
(polars-avro 0.13, Rust) decodes a container built around the payloads 21x faster, but it
loops forever on a block with trailing bytes, which one poison record makes; a decoder
that a single bad record can hang is not one a source can use. fastavro is the reference
library confluent-kafka's own AvroDeserializer uses, and it is strict: every error here is
a clear one, never a stall.

**Fast path** (``_avro_decode.c``): a flat record schema (primitive fields, nullable ones,
the int/long/string logical types) whose records all carry the reader schema's own id is
decoded column by column in C straight into Arrow buffers. Any record it does not take
(another schema id, bytes it cannot decode) sends the whole batch down the fastavro path,
which resolves other schemas and names a bad record: the fast path never decides what a
record means, and the unit tests hold it to fastavro on random records.

A record is never skipped: a payload that is not framed, names an unknown schema id, does
not resolve to the reader schema, does not decode, or leaves bytes over after the record
fails the task with topic, partition, offset and schema id (:class:`DecodeError`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute in the fast path

from connectors.core.errors import KafkaSourceError
from connectors.kafka.registry import avro_unions

try:  # the columnar fast path (setup.py builds it; optional)
    from connectors.kafka.registry import _avro_decode  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - no C compiler at install time
    _avro_decode = None

MAGIC = 0
HEADER = 5
TIMESTAMP_UTC = pa.timestamp("us", tz="UTC")

#: Logical types whose Python objects (fastavro's ``UUID``, ``time``) Arrow would not take:
#: they are written from and read as their underlying type, which is Spark's mapping too.
_RAW_LOGICAL = frozenset({"uuid", "time-millis", "time-micros"})
#: What the decoder also reads as the underlying int or long and converts in Arrow, column
#: by column: no ``datetime`` per value, and the range is Arrow's, not Python's (a valid
#: record dated after 9999 decodes; ``datetime`` would refuse it).
_READ_RAW = _RAW_LOGICAL | {"date", "timestamp-millis", "timestamp-micros",
                            "local-timestamp-millis", "local-timestamp-micros"}


class SchemaNotRepresentable(KafkaSourceError):
    """An Avro schema with no Spark SQL type (recursion, a union whose branches decode
    alike)."""


class DecodeError(KafkaSourceError):
    """A record that cannot be decoded: which record, which schema, why."""


# -- schema -> Arrow type ---------------------------------------------------------------------
def arrow_type(schema: Any, where: str = "value", millis: bool = False) -> pa.DataType:
    """The Arrow type of a parsed-JSON Avro schema (Spark's ``from_avro`` mapping);
    ``millis``: ``*-millis`` timestamps as millisecond timestamps (the type the decoder
    builds from the raw longs, then casts to microseconds)."""
    return _arrow(schema, {}, (), where, None, millis)


def _named(schema: Mapping[str, Any], namespace: str | None) -> str:
    name = str(schema.get("name", ""))
    ns = schema.get("namespace", namespace)
    return name if "." in name or not ns else f"{ns}.{name}"


def _arrow(schema: Any, names: dict[str, Any], stack: tuple[str, ...], path: str,
           namespace: str | None = None, millis: bool = False) -> pa.DataType:
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return _arrow(branches[0], names, stack, path, namespace, millis)
        if not branches:
            raise SchemaNotRepresentable(
                f"eo_kafka: the Avro schema of {path} is a union of null only; Spark has no "
                "column type for it")
        members = [_arrow(b, names, stack, f"{path}.member{i}", namespace, millis)
                   for i, b in enumerate(branches)]  # first: names the branches define
        try:
            avro_unions.check_distinct(branches, names, namespace, path)
        except ValueError as e:
            raise SchemaNotRepresentable(str(e)) from None
        return avro_unions.union_type(members)
    if isinstance(schema, str):
        primitive = _PRIMITIVES.get(schema)
        if primitive is not None:
            return primitive
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        for key in (full, schema):
            if key in stack:
                raise SchemaNotRepresentable(
                    f"eo_kafka: the Avro schema of {path} is recursive (record {key!r} "
                    "contains itself); Spark SQL types cannot represent recursion")
            if key in names:
                return _arrow(names[key], names, stack, path, namespace, millis)
        raise SchemaNotRepresentable(f"eo_kafka: {path} names an unknown Avro type {schema!r}")
    if not isinstance(schema, Mapping):
        raise SchemaNotRepresentable(f"eo_kafka: {path} has an invalid Avro schema {schema!r}")
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if kind == "record" or kind == "error":
        full = _named(schema, namespace)
        names[full] = schema
        ns = full.rsplit(".", 1)[0] if "." in full else namespace
        fields = [
            pa.field(f["name"], _arrow(f["type"], names, (*stack, full),
                                       f"{path}.{f['name']}", ns, millis))
            for f in schema.get("fields", [])
        ]
        return pa.struct(fields)
    if kind == "enum":
        names[_named(schema, namespace)] = schema
        return pa.string()
    if kind == "fixed":
        names[_named(schema, namespace)] = schema
        if logical == "decimal":
            return _decimal(schema, path)
        return pa.binary()
    if kind == "array":
        return pa.list_(_arrow(schema["items"], names, stack, path + "[]", namespace, millis))
    if kind == "map":
        return pa.map_(pa.string(), _arrow(schema["values"], names, stack, path + "{}",
                                           namespace, millis))
    if isinstance(kind, (str, list, dict)):
        if logical == "decimal" and kind == "bytes":
            return _decimal(schema, path)
        if logical == "date" and kind == "int":
            return pa.date32()
        unit = "ms" if millis and str(logical).endswith("-millis") else "us"
        if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
            return pa.timestamp(unit, tz="UTC")
        if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
            return pa.timestamp(unit)
        return _arrow(kind, names, stack, path, namespace, millis)
    raise SchemaNotRepresentable(f"eo_kafka: {path} has an invalid Avro schema {schema!r}")


def _decimal(schema: Mapping[str, Any], path: str) -> pa.DataType:
    precision, scale = int(schema.get("precision", 0)), int(schema.get("scale", 0))
    if not 0 < precision <= 38 or not 0 <= scale <= precision:
        raise SchemaNotRepresentable(
            f"eo_kafka: {path} is an Avro decimal({precision}, {scale}); Spark's decimals "
            "take precision 1..38 and 0 <= scale <= precision")
    return pa.decimal128(precision, scale)


_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
    "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}


def strip_raw_logical(schema: Any, raw: frozenset[str] = _RAW_LOGICAL) -> Any:
    """``schema`` without the logical types in ``raw``, for fastavro to read and write as
    their underlying type (by default uuid and time-*)."""
    if isinstance(schema, list):
        return [strip_raw_logical(s, raw) for s in schema]
    if isinstance(schema, Mapping):
        out = {k: strip_raw_logical(v, raw) if k in ("type", "items", "values") else v
               for k, v in schema.items() if not (k == "logicalType" and v in raw)}
        if "fields" in schema:
            out["fields"] = [{**f, "type": strip_raw_logical(f["type"], raw)}
                             for f in schema["fields"]]
        return out
    return schema


# -- decoding ----------------------------------------------------------------------------------
WriterLookup = Callable[[int], "str | None"]

_OPS = {"boolean": 1, "int": 2, "long": 3, "float": 4, "double": 5, "string": 6, "bytes": 7}
#: logical types the fast path reads as their underlying type, and how Arrow gets them
_FAST_LOGICAL = {("int", "date"), ("int", "time-millis"), ("long", "time-micros"),
                 ("long", "timestamp-millis"), ("long", "timestamp-micros"),
                 ("long", "local-timestamp-millis"), ("long", "local-timestamp-micros"),
                 ("string", "uuid")}
_STORAGE = {1: pa.uint8(), 2: pa.int32(), 3: pa.int64(), 4: pa.float32(), 5: pa.float64(),
            6: pa.string(), 7: pa.binary()}


def fast_program(schema: Any) -> tuple[bytes, tuple[str | None, ...]] | None:
    """The C decoder's program for a flat record schema, and each field's logical type;
    None when the schema is not one it decodes."""
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        return None
    ops = bytearray()
    logicals: list[str | None] = []
    for f in schema.get("fields", []):
        t, flags = f["type"], 0
        if isinstance(t, list):
            if len(t) != 2 or "null" not in t or t[0] == t[1]:
                return None
            flags = 0x10 | (0x20 if t[1] == "null" else 0)
            t = t[0] if t[1] == "null" else t[1]
        logical = None
        if isinstance(t, Mapping):
            logical = t.get("logicalType")
            t = t.get("type")
            if logical is not None and (t, logical) not in _FAST_LOGICAL:
                return None
        if not isinstance(t, str) or t not in _OPS:
            return None
        ops.append(_OPS[t] | flags)
        logicals.append(logical)
    return (bytes(ops), tuple(logicals)) if ops else None


class AvroDecoder:
    """Decodes one column (``key`` or ``value``) of framed Avro records into the reader
    schema's Arrow type. ``writer_schema(id)`` returns a writer schema's JSON text (None
    when the registry has no such id); it is asked once per id per decoder."""

    def __init__(self, column: str, reader_schema: str, reader_id: int | None,
                 writer_schema: WriterLookup, subject: str | None = None) -> None:
        from fastavro import parse_schema

        self.column = column
        self.subject = subject
        reader = json.loads(reader_schema)
        self.type = arrow_type(reader, column)
        self._read_type = arrow_type(reader, column, millis=True)
        self._reader_json = reader
        self._reader = parse_schema(strip_raw_logical(reader, _READ_RAW), named_schemas={})
        self._reader_id = reader_id
        self._writer_schema = writer_schema
        self._fast = fast_program(reader) if _avro_decode is not None else None
        # a union of several types: fastavro names its records, then the values are tagged
        self._tag = avro_unions.tagger(reader) if avro_unions.has_union(reader) else None
        # schema id -> (writer, reader or None when they are the same schema)
        self._plans: dict[int, tuple[Any, Any]] = {}

    def _plan(self, schema_id: int, where: str) -> tuple[Any, Any]:
        plan = self._plans.get(schema_id)
        if plan is not None:
            return plan
        from fastavro import parse_schema

        if schema_id == self._reader_id:
            plan = (self._reader, None)
        else:
            text = self._writer_schema(schema_id)
            if text is None:
                raise DecodeError(
                    f"eo_kafka: cannot decode the {self.column} at {where}: schema id "
                    f"{schema_id} is not in the schema registry; the record was written "
                    "with a schema of another registry, or the schema was deleted")
            writer_json = json.loads(text)
            writer = parse_schema(strip_raw_logical(writer_json, _READ_RAW), named_schemas={})
            plan = (writer, None if writer_json == self._reader_json else self._reader)
        self._plans[schema_id] = plan
        return plan

    def decode(self, values: pa.Array, where: Callable[[int], str]) -> pa.Array:
        """``values`` (binary, framed) -> an array of :attr:`type`; a null stays null.
        ``where(i)`` names record ``i`` (topic, partition, offset) for an error."""
        if self._fast is not None and self._reader_id is not None and len(values):
            fast = self._decode_fast(values)
            if fast is not None:
                return fast
        from fastavro import schemaless_reader

        out: list[Any] = []
        append = out.append
        plans = self._plans
        tag = self._tag
        for i, payload in enumerate(values.to_pylist()):
            if payload is None:
                append(None)
                continue
            if len(payload) < HEADER or payload[0] != MAGIC:
                raise DecodeError(
                    f"eo_kafka: the {self.column} at {where(i)} is not in the Confluent wire "
                    f"format (magic byte 0 and a 4-byte schema id, then the Avro payload): "
                    f"{len(payload)} bytes starting {payload[:8]!r}; "
                    f"{self.column}Format=avro reads only records written that way")
            schema_id = int.from_bytes(payload[1:HEADER], "big")
            plan = plans.get(schema_id) or self._plan(schema_id, where(i))
            buf = io.BytesIO(payload)
            buf.seek(HEADER)
            try:
                record = schemaless_reader(buf, plan[0], plan[1],
                                           return_record_name=tag is not None)
                if tag is not None:
                    record = tag(record)
            except Exception as e:  # noqa: BLE001 - any decode failure names the record
                raise self._error(where(i), schema_id, e) from e
            if buf.tell() != len(payload):
                raise DecodeError(
                    f"eo_kafka: the {self.column} at {where(i)} (schema id {schema_id}) has "
                    f"{len(payload) - buf.tell()} bytes left after the record: it was not "
                    "written with that schema")
            append(record)
        try:
            built = pa.array(out, type=self._read_type)
            return built if built.type == self.type else built.cast(self.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise DecodeError(
                f"eo_kafka: the decoded {self.column}s of {where(0)} onwards do not fit "
                f"the Spark type {self.type}: {e}") from e

    def _decode_fast(self, values: pa.Array) -> pa.Array | None:
        """The C path (see the module), or None to decode with fastavro."""
        if self._fast is None or self._reader_id is None:
            return None
        if values.offset or values.type != pa.binary():
            values = pa.concat_arrays([values.cast(pa.binary())])
        validity, offsets, data = values.buffers()[:3]
        n = len(values)
        program, logicals = self._fast
        out = _avro_decode.decode(program, n, validity, offsets, data or b"", self._reader_id)
        if isinstance(out, int):
            return None
        valid, fields = out
        children = []
        try:
            for op, logical, bufs, field in zip(program, logicals, fields, self.type,
                                                strict=True):
                storage = _STORAGE[op & 0x0F]
                arr = pa.Array.from_buffers(storage, n, [pa.py_buffer(b) for b in bufs])
                if storage == pa.uint8():
                    arr = arr.cast(pa.bool_())
                elif logical in ("timestamp-millis", "local-timestamp-millis"):
                    arr = pa.compute.multiply_checked(arr, 1000)
                if arr.type != field.type:
                    arr = arr.cast(field.type)
                children.append(arr)
        except (pa.ArrowInvalid, OverflowError):  # out of range: fastavro's path says where
            return None
        mask = None
        if values.null_count:
            mask = pa.compute.invert(pa.Array.from_buffers(pa.bool_(), n,
                                                           [None, pa.py_buffer(valid)]))
        return pa.StructArray.from_arrays(children, fields=list(self.type), mask=mask)

    def _error(self, where: str, schema_id: int, e: Exception) -> DecodeError:
        kind = type(e).__name__
        subject = f" (reader: subject {self.subject!r})" if self.subject else ""
        if kind == "SchemaResolutionError":
            return DecodeError(
                f"eo_kafka: the {self.column} at {where} was written with schema id "
                f"{schema_id}, which does not resolve to the reader schema{subject}: {e}; "
                "the writer and reader schemas must be compatible (Avro schema resolution)")
        return DecodeError(
            f"eo_kafka: cannot decode the {self.column} at {where} with schema id "
            f"{schema_id}{subject}: {kind}: {e}; the bytes are not an Avro record of "
            "that schema")
