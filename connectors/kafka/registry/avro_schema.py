"""Avro schemas <-> Spark (Arrow) types, both directions (docs/schema-registry.md, "Type
mapping"); the codec that uses them is :mod:`~connectors.kafka.registry.avro`.

- :func:`arrow_type` (reading): the Arrow (and so Spark) type of an Avro schema, with
  Spark's own ``from_avro`` mapping (a union of several non-null types is a struct of
  ``member0``, ``member1``..., :mod:`~connectors.kafka.registry.avro_unions`); a schema that
  Spark types cannot represent (a recursive record) is refused with the path of the
  offending field;
- :func:`avro_schema` (writing): the Avro schema of a column's Spark type, Spark's
  ``to_avro`` mapping;
- :func:`strip_raw_logical`: a schema without the logical types fastavro would turn into
  Python objects Arrow does not take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry import avro_unions
from connectors.kafka.registry.framing import SchemaNotRepresentable

#: Logical types whose Python objects (fastavro's ``UUID``, ``time``) Arrow would not take:
#: they are written from and read as their underlying type, which is Spark's mapping too.
RAW_LOGICAL = frozenset({"uuid", "time-millis", "time-micros"})
#: What the decoder also reads as the underlying int or long and converts in Arrow, column
#: by column: no ``datetime`` per value, and the range is Arrow's, not Python's (a valid
#: record dated after 9999 decodes; ``datetime`` would refuse it).
READ_RAW = RAW_LOGICAL | {"date", "timestamp-millis", "timestamp-micros",
                           "local-timestamp-millis", "local-timestamp-micros"}


# -- Avro schema -> Arrow type (reading) ------------------------------------------------------
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


def strip_raw_logical(schema: Any, raw: frozenset[str] = RAW_LOGICAL) -> Any:
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


# -- Spark type -> Avro schema (writing) ------------------------------------------------------
def avro_schema(t: pa.DataType, name: str, namespace: str = "") -> Any:
    """The Avro schema of an Arrow (Spark) type, as Spark's ``to_avro`` makes it, except that
    a nullable field is ``["null", T]`` with default null (what registries' compatibility
    checks and later readers need to add and drop fields)."""
    counter = [0]

    def conv(t: pa.DataType, name: str, ns: str) -> Any:
        if pa.types.is_struct(t):
            counter[0] += 1
            fields = []
            for f in t:
                inner = conv(f.type, f.name, f"{ns}.{name}" if ns else name)
                fields.append({"name": f.name, "type": ["null", inner], "default": None}
                              if f.nullable else {"name": f.name, "type": inner})
            out: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
            if ns:
                out["namespace"] = ns
            return out
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return {"type": "array", "items": ["null", conv(t.value_type, name, ns)]}
        if pa.types.is_map(t):
            if not pa.types.is_string(t.key_type):
                raise KafkaSinkError(f"eo_kafka: {name} is a map with {t.key_type} keys; Avro "
                                     "maps take string keys only")
            return {"type": "map", "values": ["null", conv(t.item_type, name, ns)]}
        if pa.types.is_decimal(t):
            return {"type": "bytes", "logicalType": "decimal", "precision": t.precision,
                    "scale": t.scale}
        if pa.types.is_timestamp(t):
            return {"type": "long", "logicalType":
                    "timestamp-micros" if t.tz else "local-timestamp-micros"}
        simple = {pa.bool_(): "boolean", pa.int8(): "int", pa.int16(): "int", pa.int32(): "int",
                  pa.int64(): "long", pa.float32(): "float", pa.float64(): "double",
                  pa.string(): "string", pa.large_string(): "string", pa.binary(): "bytes",
                  pa.large_binary(): "bytes"}.get(t)
        if simple is not None:
            return simple
        if pa.types.is_date32(t):
            return {"type": "int", "logicalType": "date"}
        raise KafkaSinkError(f"eo_kafka: {name} has type {t}, which has no Avro mapping here")

    return conv(t, name, namespace)



def record_name(schema: Any) -> str | None:
    """The full name of the record ``schema`` is, which a RecordNameStrategy subject takes;
    None when it is not a record."""
    if isinstance(schema, Mapping) and schema.get("type") == "record":
        name, ns = str(schema["name"]), schema.get("namespace")
        return name if "." in name or not ns else f"{ns}.{name}"
    return None
