"""Avro in the Confluent wire format <-> Arrow columns, both directions (executor side, no
network but the registry lookup of a writer schema id a worker has not seen yet); the type
mappings are in :mod:`~connectors.kafka.registry.avro_schema`.

- :class:`AvroDecoder` (the source): one binary column of framed records -> one Arrow array
  of the reader schema's type. Each record's writer schema (its id) is resolved to the reader
  schema with the Avro specification's resolution rules (fastavro implements them: added
  fields with defaults, removed fields, promotions, enum and union rules).
- :class:`AvroEncoder` (the sink): one column -> framed records of the resolved writer
  schema, one fastavro ``schemaless_writer`` call per record, or the C path below.
- the format's entry points the table of :mod:`~connectors.kafka.registry.serde` names
  (:func:`reader_schema`, :func:`reader_type`, :func:`decoder`, :func:`writer_schema`,
  :func:`latest_writer`, :func:`encoder`).

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

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry import avro_unions
from connectors.kafka.registry.avro_schema import (
    READ_RAW,
    arrow_type,
    avro_schema,
    record_name,
    strip_raw_logical,
)
from connectors.kafka.registry.client import RegisteredSchema, RegistryClient
from connectors.kafka.registry.framing import (
    HEADER,
    MAGIC,
    DecodeError,
    WriterSchema,
    check_fits,
    header,
)

try:  # the columnar fast path, both directions (setup.py builds it; optional)
    from connectors.kafka.registry import _avro_decode  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - no C compiler at install time
    _avro_decode = None


# -- the C path's program ---------------------------------------------------------------------
#: A writer schema's JSON text by its id (None: the registry has no such id)
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




# -- decoding (the source) ---------------------------------------------------------------------
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
        self._reader = parse_schema(strip_raw_logical(reader, READ_RAW), named_schemas={})
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
            writer = parse_schema(strip_raw_logical(writer_json, READ_RAW), named_schemas={})
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


# -- encoding (the sink) -----------------------------------------------------------------------
class AvroEncoder:
    """One column -> framed Avro bytes with the resolved writer schema."""

    def __init__(self, column: str, schema: str, schema_id: int) -> None:
        from fastavro import parse_schema

        self.column = column
        self.header = header(schema_id)
        self.schema_id = schema_id
        writer = json.loads(schema)
        self._schema = parse_schema(strip_raw_logical(writer), named_schemas={})
        fast = fast_program(writer) if _avro_decode is not None else None
        self._fast = None if fast is None else (
            fast[0], fast[1], tuple(f["name"] for f in writer["fields"]))

    def encode(self, values: pa.Array) -> pa.Array:
        if self._fast is not None and pa.types.is_struct(values.type) and len(values):
            fast = self._encode_fast(values)
            if fast is not None:
                return fast
        from fastavro import schemaless_writer

        has_map = _has_map(values.type)
        out: list[bytes | None] = []
        for row in values.to_pylist():
            if row is None:
                out.append(None)
                continue
            buf = io.BytesIO()
            buf.write(self.header)
            try:
                schemaless_writer(buf, self._schema, _dicts(row, values.type) if has_map else row)
            except Exception as e:  # noqa: BLE001 - names the schema and the cause
                raise KafkaSinkError(
                    f"eo_kafka: a {self.column} does not fit its Avro schema (id "
                    f"{self.schema_id}): {type(e).__name__}: {e}") from e
            out.append(buf.getvalue())
        return pa.array(out, pa.binary())

    def _encode_fast(self, values: pa.StructArray) -> pa.Array | None:
        """The C path for a flat record (``_avro_decode.encode``), or None for fastavro's
        (a column that does not match the schema's type, a null in a non-null field)."""
        if self._fast is None:
            return None
        program, logicals, names = self._fast
        if values.offset:
            values = pa.concat_arrays([values])
        n = len(values)
        fields = []
        try:
            for op, logical, name in zip(program, logicals, names, strict=True):
                i = values.type.get_field_index(name)
                if i < 0:
                    return None
                child = _storage(values.field(i), op & 0x0F, logical)
                if child is None:
                    return None
                if child.offset:
                    child = pa.concat_arrays([child])
                b = child.buffers()
                fields.append((b[0], b[1], None) if len(b) == 2 else (b[0], b[2] or b"", b[1]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        out = _avro_decode.encode(program, n, self.header, values.buffers()[0], fields)
        if isinstance(out, int):
            return None
        offsets, data = out
        return pa.Array.from_buffers(pa.binary(), n, [values.buffers()[0], pa.py_buffer(offsets),
                                                      pa.py_buffer(data)])


_FAST_STORAGE = {1: pa.bool_(), 2: pa.int32(), 3: pa.int64(), 4: pa.float32(),
                 5: pa.float64(), 6: pa.string(), 7: pa.binary()}


def _storage(arr: pa.Array, op: int, logical: str | None) -> pa.Array | None:
    """``arr`` as the Arrow type the C encoder reads for ``op``, or None when it is not one
    the schema's type takes as is (fastavro then converts or names the mismatch)."""
    t = arr.type
    if pa.types.is_timestamp(t):
        kinds = ("timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                 "local-timestamp-micros")
        if logical not in kinds or (t.tz is None) != str(logical).startswith("local"):
            return None
        unit = "ms" if logical.endswith("millis") else "us"
        return arr.cast(pa.timestamp(unit, tz=t.tz), safe=False).cast(pa.int64())
    if pa.types.is_date32(t):
        return arr.cast(pa.int32()) if logical == "date" else None
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                   "local-timestamp-micros", "date"):
        return None
    want = _FAST_STORAGE[op]
    if t == want:
        return arr
    if pa.types.is_integer(t) and pa.types.is_integer(want) and want.bit_width >= t.bit_width:
        return arr.cast(want)
    if (pa.types.is_large_string(t) and want == pa.string()) or (
            pa.types.is_large_binary(t) and want == pa.binary()):
        return arr.cast(want)
    return None


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    return False


def _dicts(value: Any, t: pa.DataType) -> Any:
    """Arrow's maps (lists of pairs) as dicts, which fastavro's map writer takes."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {k: _dicts(v, t.item_type) for k, v in value}
    if pa.types.is_struct(t):
        return {f.name: _dicts(value.get(f.name), f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_dicts(v, t.value_type) for v in value]
    return value



# -- the format (serde.FORMATS["avro"]) -------------------------------------------------------
def reader_schema(client: RegistryClient, found: RegisteredSchema) -> str:
    """The reader schema a query carries to its tasks: the registered text as it is."""
    return found.schema


def reader_type(schema: str, column: str) -> pa.DataType:
    return arrow_type(json.loads(schema), column)


def decoder(column: str, schema: str, schema_id: int | None, subject: str | None,
            client: RegistryClient) -> AvroDecoder:
    def writer_schema(schema_id: int) -> str | None:
        found = client.schema_by_id(schema_id)
        return None if found is None else found.schema

    return AvroDecoder(column, schema, schema_id, writer_schema, subject)


def writer_schema(t: pa.DataType, name: str, namespace: str, column: str) -> WriterSchema:
    """The schema of a column's Spark type (:func:`~.avro_schema.avro_schema`)."""
    derived = avro_schema(t, name, namespace)
    return WriterSchema(json.dumps(derived), record_name(derived))


def latest_writer(client: RegistryClient, found: RegisteredSchema, t: pa.DataType,
                  column: str, subject: str) -> str:
    """A subject's latest schema to write with, once the column is checked to fit it (every
    field without a default is a column)."""
    writer = json.loads(found.schema)
    want = arrow_type(writer, column)
    needed = {f["name"] for f in writer.get("fields", []) if "default" not in f} \
        if isinstance(writer, Mapping) else set()
    check_fits(t, want, needed, column, subject)
    return found.schema


def encoder(column: str, schema: str, schema_id: int) -> AvroEncoder:
    return AvroEncoder(column, schema, schema_id)
