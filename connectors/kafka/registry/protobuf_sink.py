"""Spark columns -> Protobuf records in the Confluent wire format (the sink's
``valueFormat=protobuf``; docs/schema-registry.md, "Protobuf").

The schema of a struct column (:func:`file_descriptor`, proto3, the inverse of the source's
mapping in :mod:`connectors.kafka.registry.protobuf_schema`): one message named
``avroRecordName`` in package ``avroRecordNamespace``, its fields numbered 1, 2, ... in
the struct's order:

| Spark SQL | Protobuf |
|---|---|
| `struct` | a nested message (named after the field, CamelCase) |
| `tinyint`, `smallint`, `int` / `bigint` | `int32` / `int64` |
| `float`, `double`, `boolean`, `string`, `binary` | `float`, `double`, `bool`, `string`, `bytes` |
| `timestamp` | `google.protobuf.Timestamp` |
| `array<T>` | `repeated T` (a null element has no protobuf form: refused at the record) |
| `map<K, V>`, K `string`/`int`/`bigint`/`boolean` | `map<K, V>` |
| a nullable scalar field | proto3 `optional` (explicit presence: null stays null) |

proto3 ``optional`` rather than the wrapper messages: it keeps the field's own type on the
wire (a reader without wrappers reads it as the scalar), needs no import, and protobuf
readers since 3.15 know it. ``date``, ``timestamp_ntz``, ``decimal``, a nested array or a
map of arrays have no faithful proto3 type and are refused on the driver, naming the column.

The schema is registered as a base64 serialized ``FileDescriptorProto``, as confluent-kafka's
``ProtobufSerializer`` registers it (Apicurio Registry 2.4.2 refuses ``.proto`` text);
each record is the 5-byte header, the message indexes (``0``: the file's first message) and
the payload, made by upb.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry import protobuf_schema as ps
from connectors.kafka.registry.avro import MAGIC
from connectors.kafka.registry.protobuf import encode_indexes

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {pa.int8(): _F.TYPE_INT32, pa.int16(): _F.TYPE_INT32, pa.int32(): _F.TYPE_INT32,
            pa.int64(): _F.TYPE_INT64, pa.float32(): _F.TYPE_FLOAT,
            pa.float64(): _F.TYPE_DOUBLE, pa.bool_(): _F.TYPE_BOOL, pa.string(): _F.TYPE_STRING,
            pa.large_string(): _F.TYPE_STRING, pa.binary(): _F.TYPE_BYTES,
            pa.large_binary(): _F.TYPE_BYTES}
_MAP_KEYS = {pa.string(), pa.large_string(), pa.int32(), pa.int64(), pa.bool_()}
_TIMESTAMP_FILE = "google/protobuf/timestamp.proto"


def file_descriptor(t: pa.DataType, name: str, package: str, column: str
                    ) -> descriptor_pb2.FileDescriptorProto:
    """The proto3 file of a struct column of Arrow (Spark) type ``t`` (see the module)."""
    if not pa.types.is_struct(t):
        raise KafkaSinkError(
            f"eo_kafka: {column}Format=protobuf needs a struct {column} column (a protobuf "
            f"record is a message), but it is {t}; wrap it: struct({column}) as {column}")
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package or 'eo'}.{name}.proto",
                                             syntax="proto3", package=package)
    msg = fdp.message_type.add(name=name)
    if _message(msg, t, column, f"{package}.{name}" if package else name):
        fdp.dependency.append(_TIMESTAMP_FILE)
    return fdp


def _camel(name: str) -> str:
    out = "".join(p[:1].upper() + p[1:] for p in name.replace("-", "_").split("_") if p)
    return out if out[:1].isalpha() else "M" + out


def _message(msg: descriptor_pb2.DescriptorProto, t: pa.StructType, path: str,
             scope: str) -> bool:
    """Fills ``msg`` with the fields of ``t``; True when a Timestamp is used."""
    stamps = False
    taken: set[str] = set()

    def nested(base: str) -> descriptor_pb2.DescriptorProto:
        n, i = base, 1
        while n in taken:
            i += 1
            n = f"{base}{i}"
        taken.add(n)
        return msg.nested_type.add(name=n)

    for number, f in enumerate(t, start=1):
        where = f"{path}.{f.name}"
        field = msg.field.add(name=f.name, number=number, label=_F.LABEL_OPTIONAL)
        ft = f.type
        if pa.types.is_map(ft):
            if ft.key_type not in _MAP_KEYS:
                raise KafkaSinkError(f"eo_kafka: {where} is a map with {ft.key_type} keys; "
                                     "protobuf map keys are string, integer or bool")
            entry = nested(_camel(f.name) + "Entry")
            entry.options.map_entry = True
            key = entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL)
            _single(key, ft.key_type, where + "{}", scope, nested)
            value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
            stamps |= _single(value, ft.item_type, where + "{}", scope, nested)
            field.label = _F.LABEL_REPEATED
            field.type = _F.TYPE_MESSAGE
            field.type_name = f".{scope}.{entry.name}"
            continue
        if pa.types.is_list(ft) or pa.types.is_large_list(ft):
            field.label = _F.LABEL_REPEATED
            stamps |= _single(field, ft.value_type, where + "[]", scope, nested)
            continue
        stamps |= _single(field, ft, where, scope, nested)
        if f.nullable and field.type != _F.TYPE_MESSAGE:
            field.proto3_optional = True
            field.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name="_" + f.name)
    # synthetic oneofs must follow every real one (there are none): nothing to reorder
    return stamps


def _single(field: descriptor_pb2.FieldDescriptorProto, t: pa.DataType, where: str,
            scope: str, nested: Callable[[str], descriptor_pb2.DescriptorProto]) -> bool:
    if pa.types.is_struct(t):
        sub = nested(_camel(where.rsplit(".", 1)[-1].strip("[]{}")) or "Item")
        field.type = _F.TYPE_MESSAGE
        field.type_name = f".{scope}.{sub.name}"
        return _message(sub, t, where, f"{scope}.{sub.name}")
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise KafkaSinkError(
                f"eo_kafka: {where} is a timestamp without a time zone (timestamp_ntz): a "
                "google.protobuf.Timestamp is an instant; cast it to timestamp or a string")
        field.type = _F.TYPE_MESSAGE
        field.type_name = ".google.protobuf.Timestamp"
        return True
    kind = _SCALARS.get(t)
    if kind is None:
        hint = ("cast it to a string (exact) or a double" if pa.types.is_decimal(t) else
                "cast it to a timestamp or a string" if pa.types.is_date32(t) else
                "wrap the inner collection in a struct" if pa.types.is_list(t)
                or pa.types.is_map(t) else "cast it to a supported type")
        raise KafkaSinkError(f"eo_kafka: {where} has type {t}, which has no Protobuf "
                             f"mapping here; {hint}")
    field.type = kind
    return False


def registered_text(fdp: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.b64encode(fdp.SerializeToString()).decode("ascii")


#: A schema with its imports (a packed ``FileDescriptorSet``): the subject's latest with its
#: registry references, resolved on the driver for useLatestVersion.
PACKED = "fds:"


def message_of(schema: str) -> Descriptor:
    """The first message of a schema: :data:`PACKED` with its imports, or a registered one
    (base64 or ``.proto`` text; imports: the well-known files)."""
    if schema.startswith(PACKED):
        from connectors.kafka.registry.protobuf import unpack

        return ps.message_at(unpack(schema[len(PACKED):]), [0])
    return ps.message_at(ps.build_pool(ps.file_proto(schema)), [0])


# -- encoding (executor) ----------------------------------------------------------------------
Setter = Callable[[Any, Any], None]


def plan(desc: Descriptor, t: pa.StructType, path: str) -> list[tuple[str, Setter]]:
    """How each field of a struct value of type ``t`` is set on a message of ``desc``; a
    column without a field of that name is an error naming it (checked on the driver)."""
    out = []
    for f in t:
        field = desc.fields_by_name.get(f.name)
        if field is None:
            raise KafkaSinkError(
                f"eo_kafka: {path}.{f.name} has no field in the Protobuf message "
                f"{desc.full_name} (fields: {sorted(desc.fields_by_name)}); drop or rename it")
        out.append((f.name, _setter(field, f.type, f"{path}.{f.name}")))
    return out


def _setter(field: FieldDescriptor, t: pa.DataType, path: str) -> Setter:
    name = field.name
    if ps.is_map(field):
        vfield = field.message_type.fields_by_name["value"]
        if vfield.message_type is not None:
            inner = _message_filler(vfield, t.item_type, path + "{}")

            def map_msg(msg: Any, v: Any) -> None:
                m = getattr(msg, name)
                for k, x in v:
                    inner(m[k], x)
            return map_msg

        def map_scalar(msg: Any, v: Any) -> None:
            m = getattr(msg, name)
            for k, x in v:
                if x is None:
                    raise ValueError(f"{path} holds a null map value (key {k!r})")
                m[k] = x
        return map_scalar
    if ps.is_repeated(field):
        if field.message_type is not None:
            inner = _message_filler(field, t.value_type, path + "[]")

            def rep_msg(msg: Any, v: Any) -> None:
                rep = getattr(msg, name)
                for x in v:
                    if x is None:
                        raise ValueError(f"{path} holds a null element")
                    inner(rep.add(), x)
            return rep_msg

        def rep_scalar(msg: Any, v: Any) -> None:
            if None in v:
                raise ValueError(f"{path} holds a null element")
            getattr(msg, name).extend(v)
        return rep_scalar
    if field.message_type is not None:
        fill = _message_filler(field, t, path)
        return lambda msg, v: fill(getattr(msg, name), v)
    return lambda msg, v: setattr(msg, name, v)


def _message_filler(field: FieldDescriptor, t: pa.DataType, path: str) -> Setter:
    full = field.message_type.full_name
    if full == ps.TIMESTAMP:
        def stamp(m: Any, v: Any) -> None:
            micros = v if isinstance(v, int) else _micros(v)
            m.seconds, m.nanos = micros // 1_000_000, (micros % 1_000_000) * 1000
        return stamp
    if full in ps.WRAPPERS:
        def wrapped(m: Any, v: Any) -> None:
            m.value = v
        return wrapped
    if not pa.types.is_struct(t):
        raise KafkaSinkError(f"eo_kafka: {path} is {t}, but the Protobuf field is the message "
                             f"{full}; give a struct")
    setters = plan(field.message_type, t, path)

    def fill(m: Any, v: Any) -> None:
        m.SetInParent()
        for n, s in setters:
            x = v.get(n)
            if x is not None:
                s(m, x)
    return fill


def _micros(v: Any) -> int:
    import datetime as dt

    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    d = v - epoch
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


class ProtobufEncoder:
    """One struct column -> framed Protobuf records with the resolved writer schema."""

    def __init__(self, column: str, schema: str, schema_id: int,
                 t: pa.DataType | None = None) -> None:
        self.column = column
        self.schema_id = schema_id
        desc = message_of(schema)
        self.header = bytes([MAGIC]) + schema_id.to_bytes(4, "big") + \
            encode_indexes(ps.index_path(desc))
        self._cls = message_factory.GetMessageClass(desc)
        self._type = t
        self._plan = plan(desc, t, column) if t is not None and pa.types.is_struct(t) else []

    def encode(self, values: pa.Array) -> pa.Array:
        if values.type != self._type:  # planned once per column type, not per batch
            if not pa.types.is_struct(values.type):
                raise KafkaSinkError(f"eo_kafka: {self.column}Format=protobuf needs a struct "
                                     f"column, got {values.type}")
            self._plan = plan(self._cls.DESCRIPTOR, values.type, self.column)
            self._type = values.type
        cls, setters, header = self._cls, self._plan, self.header
        if any(pa.types.is_timestamp(f.type) for f in values.type):
            values = _stamps_as_micros(values)
        out: list[bytes | None] = []
        for row in values.to_pylist():
            if row is None:
                out.append(None)
                continue
            msg = cls()
            try:
                for n, s in setters:
                    x = row[n]
                    if x is not None:
                        s(msg, x)
            except (ValueError, TypeError) as e:
                raise KafkaSinkError(
                    f"eo_kafka: a {self.column} does not fit its Protobuf schema (id "
                    f"{self.schema_id}): {type(e).__name__}: {e}") from e
            out.append(header + msg.SerializeToString())
        return pa.array(out, pa.binary())


def _stamps_as_micros(values: pa.StructArray) -> pa.StructArray:
    """Top-level timestamps as int64 microseconds (no datetime per record)."""
    children = []
    for f, child in zip(values.type, values.flatten(), strict=True):
        if pa.types.is_timestamp(f.type):
            child = child.cast(pa.timestamp("us", tz=f.type.tz), safe=False).cast(pa.int64())
        children.append(child)
    return pa.StructArray.from_arrays(
        children, names=[f.name for f in values.type],
        mask=values.is_null() if values.null_count else None)
