"""JSON Schema in the Confluent wire format -> Arrow columns (the source's
``valueFormat=json-schema``; docs/schema-registry.md, "What the source does").

The payload after the 5-byte header is the record as UTF-8 JSON text. The reader schema (a
JSON Schema from the registry) gives the Spark type, Spark's ``from_json`` style:

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
partition, offset and schema id (:class:`~connectors.kafka.registry.avro.DecodeError`).
Properties the reader schema does not name are ignored, missing ones are null (a reader
of a newer or older compatible schema). The records are not validated against the writer
schema's constraints (patterns, ranges): the reader gets what the writer wrote, typed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from connectors.kafka.registry.avro import (
    HEADER,
    MAGIC,
    TIMESTAMP_UTC,
    DecodeError,
    SchemaNotRepresentable,
)


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
        self._conv = _converter(self.type)

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


def _converter(t: pa.DataType) -> Callable[[Any], Any]:
    """JSON values -> what ``pa.array`` takes for ``t``, strictly: a value of another JSON
    type raises (``true`` is no integer, ``"1"`` no number)."""
    if pa.types.is_struct(t):
        fields = [(f.name, _converter(f.type)) for f in t]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            if not isinstance(v, dict):
                raise TypeError(f"expected an object, got {type(v).__name__}")
            return {name: conv(v.get(name)) for name, conv in fields}
        return struct
    if pa.types.is_list(t):
        item = _converter(t.value_type)

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
        import datetime as dt

        def date(v: Any) -> Any:
            return None if v is None else dt.date.fromisoformat(_text(v))
        return date
    if pa.types.is_timestamp(t):
        import datetime as dt

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
