"""Protobuf in the Confluent wire format <-> Arrow columns, both directions (the source's and
the sink's ``valueFormat=protobuf``; docs/schema-registry.md, "Protobuf"); the schema
mappings are in :mod:`~connectors.kafka.registry.protobuf_schema`.

A record is the magic byte 0, the 4-byte big-endian schema id, the **message indexes** (a
zigzag varint count, then that many zigzag varint indexes: the path to the message in the
schema file, ``[1, 0]`` being the first nested message of the file's second message; the
single byte 0 stands for ``[0]``, the file's first message), then the protobuf payload.

Each record is parsed by the ``protobuf`` package (upb, C) with its **writer's** message
(the schema id and the index path); its fields are read by name into the reader's Spark
type (the subject's first message): a field the writer does not have reads as its proto3
default (null where the reader's field has presence), a field the reader does not have is
dropped, as protobuf itself reads an older or newer message. The top-level fields are
gathered into one Python list per column and made into Arrow arrays at once (no pandas,
no per-record Arrow calls). A record that does not decode fails the task naming topic,
partition, offset and schema id (:class:`~connectors.kafka.registry.framing.DecodeError`).

Writing (:class:`ProtobufEncoder`), each struct row is set field by field on a message of
the writer schema (its setters planned once per column type) and serialized by upb; a row
that does not fit the message fails the task naming the column and the schema id.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry import protobuf_schema as ps
from connectors.kafka.registry.client import RegisteredSchema, RegistryClient, RegistryError
from connectors.kafka.registry.framing import HEADER, MAGIC, DecodeError, WriterSchema, header


# -- framing ----------------------------------------------------------------------------------
def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _write_varint(out: bytearray, n: int) -> None:
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def encode_indexes(path: list[int]) -> bytes:
    """The message-index bytes of a path (``[0]`` -> the single byte 0)."""
    if list(path) == [0]:
        return b"\x00"
    out = bytearray()
    _write_varint(out, _zigzag(len(path)))
    for i in path:
        _write_varint(out, _zigzag(i))
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("the message indexes end inside a varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("a message-index varint is longer than 10 bytes")


def decode_indexes(data: bytes, pos: int = HEADER) -> tuple[list[int], int]:
    """The message-index path at ``pos`` and the payload's start (a count of 0 is ``[0]``)."""
    count, pos = _read_varint(data, pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > 100:
        raise ValueError(f"the message-index count is {count}")
    path = []
    for _ in range(count):
        i, pos = _read_varint(data, pos)
        if i < 0:
            raise ValueError(f"a message index is negative ({i})")
        path.append(i)
    return path, pos


# -- the reader schema that travels with the query ---------------------------------------------
def pack(files: list[descriptor_pb2.FileDescriptorProto]) -> str:
    """A self-contained reader schema: a base64 ``FileDescriptorSet``, the main file last."""
    return base64.b64encode(descriptor_pb2.FileDescriptorSet(file=files)
                            .SerializeToString()).decode("ascii")


def unpack(text: str) -> FileDescriptor:
    fds = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(text))
    return ps.build_pool(list(fds.file))


def reader_type(packed: str, column: str) -> pa.DataType:
    return ps.arrow_type(ps.message_at(unpack(packed), [0]), column)


# -- decoding (the source) --------------------------------------------------------------------
Getter = Callable[[Any], Any]


class ProtobufDecoder:
    """One column of framed Protobuf records -> the reader message's Arrow struct."""

    def __init__(self, column: str, reader_schema: str, reader_id: int | None,
                 writer_file: Callable[[int], FileDescriptor | None],
                 subject: str | None = None) -> None:
        self.column = column
        self.subject = subject
        file = unpack(reader_schema)
        self.reader = ps.message_at(file, [0])
        self.type = ps.arrow_type(self.reader, column)
        self._files: dict[int, FileDescriptor | None] = {}
        if reader_id is not None:
            self._files[reader_id] = file
        self._writer_file = writer_file
        #: (schema id, index path) -> (message class, the top-level field getters)
        self._plans: dict[tuple[int, tuple[int, ...]], tuple[Any, list[Getter]]] = {}

    def _plan(self, schema_id: int, path: tuple[int, ...]) -> tuple[Any, list[Getter]]:
        plan = self._plans.get((schema_id, path))
        if plan is None:
            if schema_id not in self._files:
                self._files[schema_id] = self._writer_file(schema_id)
            file = self._files[schema_id]
            if file is None:
                raise LookupError(f"the registry has no schema with id {schema_id}")
            writer = ps.message_at(file, list(path))
            cls = message_factory.GetMessageClass(writer)
            plan = (cls, [_getter(f, writer.fields_by_name.get(f.name)) for f in
                          self.reader.fields])
            self._plans[(schema_id, path)] = plan
        return plan

    def decode(self, values: pa.Array, where: Callable[[int], str]) -> pa.Array:
        fields = list(self.reader.fields)
        columns: list[list[Any]] = [[] for _ in fields]
        valid: list[bool] = []
        for i, payload in enumerate(values.to_pylist()):
            if payload is None:
                valid.append(False)
                for col in columns:
                    col.append(None)
                continue
            if len(payload) < HEADER + 1 or payload[0] != MAGIC:
                raise DecodeError(
                    f"eo_kafka: the {self.column} at {where(i)} is not in the Confluent wire "
                    "format (magic byte 0, a 4-byte schema id, the message indexes, then the "
                    f"protobuf payload): {len(payload)} bytes starting {payload[:8]!r}")
            schema_id = int.from_bytes(payload[1:HEADER], "big")
            try:
                path, start = decode_indexes(payload)
                cls, getters = self._plan(schema_id, tuple(path))
                msg = cls.FromString(payload[start:])
                for col, get in zip(columns, getters, strict=True):
                    col.append(get(msg))
            except RegistryError:
                raise  # the registry unreachable: not the record's fault, never a dead letter
            except Exception as e:  # noqa: BLE001 - upb's DecodeError, a bad index path, ...
                raise DecodeError(
                    f"eo_kafka: cannot decode the {self.column} at {where(i)} (schema id "
                    f"{schema_id}): {type(e).__name__}: {e}; the bytes are not a Protobuf "
                    "record of a registered schema") from e
            valid.append(True)
        children = []
        for f, col in zip(self.type, columns, strict=True):
            try:
                children.append(pa.array(col, type=f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                row = next((r for r, v in enumerate(col) if not _fits(v, f.type)), 0)
                raise DecodeError(
                    f"eo_kafka: the {self.column}.{f.name} at {where(row)} does not fit the "
                    f"Spark type {f.type} of the reader schema (a writer's field of another "
                    f"type under the same name?): {e}") from e
        mask = pa.array([not v for v in valid], pa.bool_())
        return pa.StructArray.from_arrays(children, fields=list(self.type), mask=mask)


def _fits(value: Any, t: pa.DataType) -> bool:
    try:
        pa.array([value], type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
    return True


def _getter(reader: FieldDescriptor, writer: FieldDescriptor | None) -> Getter:
    """Reads the reader field ``reader`` off a message of the writer's type (``writer``:
    its field of the same name, or None: the reader's default)."""
    name = reader.name
    if writer is None:
        if ps.is_repeated(reader):
            return lambda m: []
        if ps.has_presence(reader):
            return lambda m: None
        default = _convert(reader, None)(reader.default_value)
        return lambda m: default
    if ps.is_map(reader):
        value = _convert(reader.message_type.fields_by_name["value"],
                         writer.message_type.fields_by_name["value"])
        return lambda m: [(k, value(v)) for k, v in getattr(m, name).items()]
    conv = _convert(reader, writer)
    if ps.is_repeated(reader):
        return lambda m: [conv(v) for v in getattr(m, name)]
    if ps.has_presence(writer):
        return lambda m: conv(getattr(m, name)) if m.HasField(name) else None
    return lambda m: conv(getattr(m, name))


def _convert(reader: FieldDescriptor, writer: FieldDescriptor | None) -> Getter:
    """One (non-repeated) value of ``reader``'s type -> what ``pa.array`` takes."""
    if reader.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        name = reader.message_type.full_name
        if name == ps.TIMESTAMP:
            return lambda v: v.seconds * 1_000_000 + v.nanos // 1000
        if name in ps.WRAPPERS:
            return lambda v: v.value
        sub = reader.message_type
        wsub: Descriptor | None = writer.message_type if writer is not None and \
            writer.message_type is not None else None
        getters = [(f.name, _getter(f, wsub.fields_by_name.get(f.name) if wsub else None))
                   for f in sub.fields]
        return lambda v: {n: g(v) for n, g in getters}
    if reader.type == FieldDescriptor.TYPE_ENUM:
        names = {v.number: v.name for v in reader.enum_type.values}
        return lambda v: names.get(v, str(v))
    return lambda v: v


# -- encoding (the sink) ----------------------------------------------------------------------
#: A schema with its imports (a packed ``FileDescriptorSet``): the subject's latest with its
#: registry references, resolved on the driver for useLatestVersion.
PACKED = "fds:"


def message_of(schema: str) -> Descriptor:
    """The first message of a schema: :data:`PACKED` with its imports, or a registered one
    (base64 or ``.proto`` text; imports: the well-known files)."""
    if schema.startswith(PACKED):
        return ps.message_at(unpack(schema[len(PACKED):]), [0])
    return ps.message_at(ps.build_pool(ps.file_proto(schema)), [0])


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
        self.header = header(schema_id) + encode_indexes(ps.index_path(desc))
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

# -- the format (serde.FORMATS["protobuf"]) ---------------------------------------------------
def reader_schema(client: RegistryClient, found: RegisteredSchema) -> str:
    """The reader schema a query carries to its tasks: self-contained, its imports (the
    registry references) packed with it (:func:`pack`)."""
    return pack(ps.registered_files(client, found))


def decoder(column: str, schema: str, schema_id: int | None, subject: str | None,
            client: RegistryClient) -> ProtobufDecoder:
    def writer_file(schema_id: int) -> FileDescriptor | None:
        found = client.schema_by_id(schema_id)
        return None if found is None else ps.build_pool(ps.registered_files(client, found))

    return ProtobufDecoder(column, schema, schema_id, writer_file, subject)


def writer_schema(t: pa.DataType, name: str, namespace: str, column: str) -> WriterSchema:
    """The proto3 file of a struct column (:func:`~.protobuf_schema.file_descriptor`), and
    its message's full name."""
    fdp = ps.file_descriptor(t, name, namespace, column)
    record = f"{fdp.package}.{name}" if fdp.package else name
    return WriterSchema(ps.registered_text(fdp), record)


def latest_writer(client: RegistryClient, found: RegisteredSchema, t: pa.DataType,
                  column: str, subject: str) -> str:
    """A subject's latest schema (:data:`PACKED` with its references) to write with, once
    every field of the column is checked to have a field in its message."""
    text = PACKED + pack(ps.registered_files(client, found))
    plan(message_of(text), t, column)  # it fits
    return text


def encoder(column: str, schema: str, schema_id: int) -> ProtobufEncoder:
    return ProtobufEncoder(column, schema, schema_id)
