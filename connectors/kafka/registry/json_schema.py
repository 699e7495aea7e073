"""JSON Schema in the Confluent wire format <-> Arrow columns, both directions (the source's
and the sink's ``valueFormat=json-schema``; docs/schema-registry.md, "What the source does"
and "Writing"). The payload after the 5-byte header is the record as UTF-8 JSON text.

**Reading.** The reader schema (a JSON Schema from the registry) gives the Spark type,
Spark's ``from_json`` style (:func:`arrow_type`):

| JSON Schema | Spark SQL |
|---|---|
| `object` with `properties` | `struct` of the properties (each nullable) |
| `string` | `string` (`format: date` -> `date`, `format: date-time` -> `timestamp`) |
| `integer` / `number` / `boolean` | `bigint` / `double` / `boolean` |
| `array` with `items` | `array` |
| `["null", T]`, `oneOf`/`anyOf` of null and one schema | `T`, nullable |

Anything else (`$ref`, a union of several types, an object without properties) is refused
when the query starts, naming the property. A record is decoded by ``json.loads`` (C) and
the batch converted to Arrow at once; a record that is not framed, not JSON, not an object
where one is expected, or holds a value of another type fails the task naming topic,
partition, offset and schema id (:class:`~connectors.kafka.registry.framing.DecodeError`).
Properties the reader schema does not name are ignored, missing ones are null (a reader
of a newer or older compatible schema). The records are not validated against the writer
schema's constraints (patterns, ranges): the reader gets what the writer wrote, typed.

**Writing.** The schema of a column's Spark type (:func:`json_schema`, draft-07, the inverse
of the reading mapping):

| Spark SQL | JSON Schema |
|---|---|
| `struct` | `object` with `properties`, non-nullable fields `required` |
| `string` | `string` |
| `tinyint` ... `bigint` | `integer` |
| `float`, `double` | `number` (NaN and infinities have no JSON: refused at the record) |
| `decimal(p, s)`, p <= 15 | `number` (exact in a double; wider ones are refused) |
| `boolean` | `boolean` |
| `binary` | `string`, `contentEncoding: base64` |
| `date` | `string`, `format: date` |
| `timestamp` | `string`, `format: date-time` (UTC, `Z`) |
| `array<T>` | `array` of T |
| `map<string, T>` | `object` with `additionalProperties` T |
| a nullable field or element | `oneOf` null and T |

``timestamp_ntz`` has no JSON Schema type that keeps its meaning (RFC 3339 date-times carry
an offset): refused, naming the column. A record is the 5-byte header and the row as compact
UTF-8 JSON. Records are not validated against a registered schema's constraints (patterns,
ranges, enums) when ``useLatestVersion`` writes with one; their types are checked on the
driver (:func:`latest_writer`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry.client import RegisteredSchema, RegistryClient
from connectors.kafka.registry.framing import (
    HEADER,
    MAGIC,
    TIMESTAMP_UTC,
    DecodeError,
    SchemaNotRepresentable,
    WriterSchema,
    check_fits,
    header,
)


# -- reading (the source) ---------------------------------------------------------------------
def arrow_type(schema: Any, path: str = "value") -> pa.DataType:
    """The Arrow type of a JSON Schema (see the module's table)."""
    if isinstance(schema, bool) or not isinstance(schema, Mapping):
        raise SchemaNotRepresentable(f"eo_kafka: {path} has a JSON Schema Spark cannot type: "
                                     f"{json.dumps(schema)[:200]}")
    if "$ref" in schema:
        raise SchemaNotRepresentable(f"eo_kafka: {path} uses $ref, which this source does not "
                                     "follow yet; inline the definition")
    for key in ("oneOf", "anyOf"):
        if key in schema:
            branches = [b for b in schema[key] if not (isinstance(b, Mapping)
                                                        and b.get("type") == "null")]
            if len(branches) != 1:
                raise SchemaNotRepresentable(
                    f"eo_kafka: {path} is a {key} of several schemas; Spark has one type per "
                    "column (a union of null and one schema is fine)")
            return arrow_type(branches[0], path)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise SchemaNotRepresentable(f"eo_kafka: {path} has the types {kind}; Spark has "
                                         "one type per column")
        kind = kinds[0]
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        if not isinstance(props, Mapping) or not props:
            raise SchemaNotRepresentable(f"eo_kafka: {path} is an object without properties; "
                                         "name its properties to type it")
        return pa.struct([pa.field(k, arrow_type(v, f"{path}.{k}")) for k, v in props.items()])
    if kind == "array":
        return pa.list_(arrow_type(schema.get("items", {}), path + "[]"))
    if kind == "string":
        fmt = schema.get("format")
        return pa.date32() if fmt == "date" else TIMESTAMP_UTC if fmt == "date-time" \
            else pa.string()
    simple = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}.get(
        str(kind))
    if simple is None:
        raise SchemaNotRepresentable(f"eo_kafka: {path} has JSON Schema type {kind!r}, which "
                                     "has no Spark type here")
    return simple


class JsonSchemaDecoder:
    """One column of framed JSON records -> the reader schema's Arrow type."""

    def __init__(self, column: str, reader_schema: str, subject: str | None = None) -> None:
        self.column = column
        self.subject = subject
        self.type = arrow_type(json.loads(reader_schema), column)
        self._conv = _from_json(self.type)

    def decode(self, values: pa.Array, where: Callable[[int], str]) -> pa.Array:
        out: list[Any] = []
        loads, conv = json.loads, self._conv
        for i, payload in enumerate(values.to_pylist()):
            if payload is None:
                out.append(None)
                continue
            if len(payload) < HEADER or payload[0] != MAGIC:
                raise DecodeError(
                    f"eo_kafka: the {self.column} at {where(i)} is not in the Confluent wire "
                    f"format (magic byte 0 and a 4-byte schema id, then the JSON text): "
                    f"{len(payload)} bytes starting {payload[:8]!r}")
            schema_id = int.from_bytes(payload[1:HEADER], "big")
            try:
                out.append(conv(loads(payload[HEADER:])))
            except (ValueError, TypeError, UnicodeDecodeError) as e:
                raise DecodeError(
                    f"eo_kafka: cannot decode the {self.column} at {where(i)} (schema id "
                    f"{schema_id}): {type(e).__name__}: {e}; the bytes are not a JSON "
                    f"record of the reader schema's shape") from e
        try:
            return pa.array(out, type=self.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            for i, rec in enumerate(out):  # name the record that does not fit
                try:
                    pa.array([rec], type=self.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                    raise DecodeError(
                        f"eo_kafka: the {self.column} at {where(i)} does not fit the Spark "
                        f"type {self.type} of the reader schema: {e}") from e
            raise


def _from_json(t: pa.DataType) -> Callable[[Any], Any]:
    """JSON values -> what ``pa.array`` takes for ``t``, strictly: a value of another JSON
    type raises (``true`` is no integer, ``"1"`` no number)."""
    if pa.types.is_struct(t):
        fields = [(f.name, _from_json(f.type)) for f in t]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, dict):
                raise TypeError(f"expected an object, got {type(v).__name__}")
            return {name: conv(v.get(name)) for name, conv in fields}
        return struct
    if pa.types.is_list(t):
        item = _from_json(t.value_type)

        def array(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, list):
                raise TypeError(f"expected an array, got {type(v).__name__}")
            return [item(x) for x in v]
        return array
    if pa.types.is_integer(t):
        return _typed(int, "an integer", exclude=bool)
    if pa.types.is_floating(t):
        def number(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"expected a number, got {type(v).__name__}")
            return float(v)
        return number
    if pa.types.is_boolean(t):
        return _typed(bool, "a boolean")
    if pa.types.is_date32(t):
        def date(v: Any) -> Any:
            return None if v is None else dt.date.fromisoformat(_text(v))
        return date
    if pa.types.is_timestamp(t):
        def stamp(v: Any) -> Any:
            if v is None:
                return None
            parsed = dt.datetime.fromisoformat(_text(v).replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                raise ValueError(f"date-time {v!r} has no time zone offset (RFC 3339)")
            return parsed
        return stamp
    return _typed(str, "a string")


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _typed(kind: type, what: str, exclude: type | None = None) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v is None:
            return None
        if not isinstance(v, kind) or (exclude is not None and isinstance(v, exclude)):
            raise TypeError(f"expected {what}, got {type(v).__name__}")
        return v
    return check


# -- writing (the sink) ------------------------------------------------------------------------
#: The widest decimal a JSON number (read as a double by most consumers) keeps exactly.
EXACT_DECIMAL_DIGITS = 15


def json_schema(t: pa.DataType, title: str, column: str) -> dict[str, Any]:
    """The draft-07 JSON Schema of a column of Arrow (Spark) type ``t`` (see the module)."""
    top = {"$schema": "http://json-schema.org/draft-07/schema#", "title": title}
    return {**top, **_schema(t, column)}


def _schema(t: pa.DataType, path: str) -> dict[str, Any]:
    if pa.types.is_struct(t):
        props = {f.name: _nullable(_schema(f.type, f"{path}.{f.name}"), f.nullable) for f in t}
        out: dict[str, Any] = {"type": "object", "properties": props}
        required = [f.name for f in t if not f.nullable]
        return {**out, "required": required} if required else out
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "items": _nullable(_schema(t.value_type, path + "[]"), True)}
    if pa.types.is_map(t):
        if not pa.types.is_string(t.key_type):
            raise KafkaSinkError(f"eo_kafka: {path} is a map with {t.key_type} keys; JSON "
                                 "objects take string keys only")
        return {"type": "object",
                "additionalProperties": _nullable(_schema(t.item_type, path + "{}"), True)}
    if pa.types.is_decimal(t):
        if t.precision > EXACT_DECIMAL_DIGITS:
            raise KafkaSinkError(
                f"eo_kafka: {path} is {t}: a JSON number is read as a double, exact to "
                f"{EXACT_DECIMAL_DIGITS} digits only; cast it to a string (exact) or a double")
        return {"type": "number"}
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise KafkaSinkError(
                f"eo_kafka: {path} is a timestamp without a time zone (timestamp_ntz): a JSON "
                "Schema date-time carries an offset; cast it to timestamp or to a string")
        return {"type": "string", "format": "date-time"}
    if pa.types.is_date32(t):
        return {"type": "string", "format": "date"}
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return {"type": "string", "contentEncoding": "base64"}
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return {"type": "string"}
    if pa.types.is_boolean(t):
        return {"type": "boolean"}
    if pa.types.is_integer(t):
        return {"type": "integer"}
    if pa.types.is_floating(t):
        return {"type": "number"}
    raise KafkaSinkError(f"eo_kafka: {path} has type {t}, which has no JSON Schema mapping "
                         "here")


def _nullable(schema: dict[str, Any], nullable: bool) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, schema]} if nullable else schema


class JsonEncoder:
    """One column -> framed JSON records (the writer schema's id in the header)."""

    def __init__(self, column: str, schema_id: int) -> None:
        self.column = column
        self.schema_id = schema_id
        self.header = header(schema_id)

    def encode(self, values: pa.Array) -> pa.Array:
        conv = _to_json(values.type)
        dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False,
                                 ensure_ascii=False).encode
        out: list[bytes | None] = []
        for row in values.to_pylist():
            if row is None:
                out.append(None)
                continue
            try:
                out.append(self.header + dumps(conv(row)).encode())
            except ValueError as e:  # NaN or an infinity
                raise KafkaSinkError(
                    f"eo_kafka: a {self.column} has no JSON form (schema id {self.schema_id}): "
                    f"{e}; NaN and infinities are not JSON numbers") from e
        return pa.array(out, pa.binary())


def _to_json(t: pa.DataType) -> Callable[[Any], Any]:
    """Python values of Arrow type ``t`` (``to_pylist``) -> what ``json`` writes."""
    if pa.types.is_struct(t):
        fields = [(f.name, _to_json(f.type)) for f in t]
        return lambda v: None if v is None else {n: c(v.get(n)) for n, c in fields}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = _to_json(t.value_type)
        return lambda v: None if v is None else [item(x) for x in v]
    if pa.types.is_map(t):
        value = _to_json(t.item_type)
        return lambda v: None if v is None else {k: value(x) for k, x in v}
    if pa.types.is_decimal(t):
        return lambda v: None if v is None else float(v)
    if pa.types.is_timestamp(t):
        def stamp(v: Any) -> Any:
            if v is None:
                return None
            return v.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        return stamp
    if pa.types.is_date32(t):
        return lambda v: None if v is None else v.isoformat()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return lambda v: None if v is None else base64.b64encode(v).decode()
    return lambda v: v

# -- the format (serde.FORMATS["json-schema"]) ------------------------------------------------
def reader_schema(client: RegistryClient, found: RegisteredSchema) -> str:
    """The reader schema a query carries to its tasks: the registered text as it is."""
    return found.schema


def reader_type(schema: str, column: str) -> pa.DataType:
    return arrow_type(json.loads(schema), column)


def decoder(column: str, schema: str, schema_id: int | None, subject: str | None,
            client: RegistryClient) -> JsonSchemaDecoder:
    """The record's JSON names its fields: no writer schema is looked up."""
    return JsonSchemaDecoder(column, schema, subject)


def writer_schema(t: pa.DataType, name: str, namespace: str, column: str) -> WriterSchema:
    """The schema of a column's Spark type (:func:`json_schema`), titled ``name``, which a
    RecordNameStrategy subject takes when the column is a struct (as Confluent's serializers
    name it)."""
    derived = json_schema(t, name, column)
    record = str(derived["title"]) if derived.get("type") == "object" and derived.get(
        "title") else None
    return WriterSchema(json.dumps(derived), record)


def latest_writer(client: RegistryClient, found: RegisteredSchema, t: pa.DataType,
                  column: str, subject: str) -> str:
    """A subject's latest schema to write with, once the column is checked to fit it (every
    required property is a column)."""
    writer = json.loads(found.schema)
    want = arrow_type(writer, column)
    needed = set(writer.get("required", ())) if isinstance(writer, Mapping) else set()
    check_fits(t, want, needed, column, subject)
    return found.schema


def encoder(column: str, schema: str, schema_id: int) -> JsonEncoder:
    return JsonEncoder(column, schema_id)
