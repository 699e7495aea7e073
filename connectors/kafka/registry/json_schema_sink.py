"""Spark columns -> JSON Schema records in the Confluent wire format (the sink's
``valueFormat=json-schema``; docs/schema-registry.md, "Writing").

The schema of a column's Spark type (:func:`json_schema`, draft-07, the inverse of the
source's mapping in :mod:`connectors.kafka.registry.json_schema`):

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
driver (``sink_formats._check_fits``).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry.avro import MAGIC

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
        self.header = bytes([MAGIC]) + schema_id.to_bytes(4, "big")

    def encode(self, values: pa.Array) -> pa.Array:
        conv = _converter(values.type)
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


def _converter(t: pa.DataType) -> Callable[[Any], Any]:
    """Python values of Arrow type ``t`` (``to_pylist``) -> what ``json`` writes."""
    if pa.types.is_struct(t):
        fields = [(f.name, _converter(f.type)) for f in t]
        return lambda v: None if v is None else {n: c(v.get(n)) for n, c in fields}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = _converter(t.value_type)
        return lambda v: None if v is None else [item(x) for x in v]
    if pa.types.is_map(t):
        value = _converter(t.item_type)
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
