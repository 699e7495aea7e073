"""Protobuf schemas <-> descriptors and Spark (Arrow) types, both directions (the source's
and the sink's ``valueFormat=protobuf``; docs/schema-registry.md, "Protobuf"); the codec
that uses them is :mod:`~connectors.kafka.registry.protobuf`.

A registry serves a Protobuf schema (``schemaType`` ``PROTOBUF``) in one of two forms, and
both are read:

- a base64 serialized ``FileDescriptorProto``: what confluent-kafka's
  ``ProtobufSerializer`` registers, and the only form Apicurio Registry 2.4.2 (the test
  tier's) stores as given (it answers a ``.proto`` text with an HTTP 500);
- ``.proto`` text (Confluent's registry, Karapace): compiled at run time by protoc as
  ``grpcio-tools`` bundles it (``grpc_tools.protoc``, in-process, no binary on the PATH)
  into a ``FileDescriptorSet``. protoc is Google's own parser, so every construct a writer
  may use (options, nested types, ``oneof``, ``map``, imports) is read as the writer meant.

Imports are the schema's registry references (each fetched by subject and version), and the
``google/protobuf/*.proto`` well-known files, which the ``protobuf`` package ships.

**Reading.** The Spark type of a message (:func:`arrow_type`):

| Protobuf | Spark SQL |
|---|---|
| `int32`, `sint32`, `sfixed32` | `int` |
| `int64`, `sint64`, `sfixed64`, `uint32`, `fixed32` | `bigint` |
| `uint64`, `fixed64` | `decimal(20,0)` (exact: a `bigint` cannot hold 2^64 - 1) |
| `float`, `double`, `bool`, `string` | `float`, `double`, `boolean`, `string` |
| `bytes` | `binary` |
| an enum | `string` (the value's name; a number the enum does not name reads as its digits) |
| a message | `struct` (null when absent) |
| `repeated T` | `array<T>` |
| `map<K, V>` | `map<K, V>` |
| `google.protobuf.Timestamp` | `timestamp` |
| `google.protobuf.*Value` (wrappers) | the wrapped scalar, null when absent |
| a `oneof` member, a proto3 `optional` | the member's type, null when not set |
| an absent proto3 scalar without presence | its default (0, `""`, false, the first enum \
value), as protobuf reads it |
| a recursive message | refused, naming the message |

**Writing.** The schema of a struct column (:func:`file_descriptor`, proto3, the inverse
of the reading mapping above): one message named ``avroRecordName`` in package
``avroRecordNamespace``, its fields numbered 1, 2, ... in the struct's order:

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
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry.framing import TIMESTAMP_UTC, SchemaNotRepresentable

WELL_KNOWN_PREFIX = "google/protobuf/"
TIMESTAMP = "google.protobuf.Timestamp"
WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(), "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(), "google.protobuf.UInt64Value": pa.decimal128(20, 0),
    "google.protobuf.Int32Value": pa.int32(), "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(), "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
UINT64 = pa.decimal128(20, 0)
_T = FieldDescriptor
SCALARS: dict[int, pa.DataType] = {
    _T.TYPE_INT32: pa.int32(), _T.TYPE_SINT32: pa.int32(), _T.TYPE_SFIXED32: pa.int32(),
    _T.TYPE_INT64: pa.int64(), _T.TYPE_SINT64: pa.int64(), _T.TYPE_SFIXED64: pa.int64(),
    _T.TYPE_UINT32: pa.int64(), _T.TYPE_FIXED32: pa.int64(),
    _T.TYPE_UINT64: UINT64, _T.TYPE_FIXED64: UINT64,
    _T.TYPE_FLOAT: pa.float32(), _T.TYPE_DOUBLE: pa.float64(), _T.TYPE_BOOL: pa.bool_(),
    _T.TYPE_STRING: pa.string(), _T.TYPE_BYTES: pa.binary(), _T.TYPE_ENUM: pa.string(),
}


def file_proto(text: str, name: str = "schema.proto",
               imports: dict[str, str] | None = None) -> list[descriptor_pb2.FileDescriptorProto]:
    """The ``FileDescriptorProto`` of a registry schema (base64 or ``.proto`` text), the
    last of the list; before it, the files its ``.proto`` text imports (``imports``: file
    name -> schema text, the registry references; well-known files are the package's)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        fdp = descriptor_pb2.FileDescriptorProto.FromString(raw)
        if fdp.message_type or fdp.enum_type or fdp.name:
            return [fdp]
    except Exception:  # noqa: BLE001, S110 - not base64 of a descriptor: .proto text
        pass
    return _compile(text, name, imports or {})


def _compile(text: str, name: str, imports: dict[str, str]
             ) -> list[descriptor_pb2.FileDescriptorProto]:
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise SchemaNotRepresentable(
            "eo_kafka: a Protobuf schema in .proto text needs protoc, which grpcio-tools "
            'bundles: pip install "pyspark-exactly-once[protobuf]"') from e
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="eo-proto-") as tmp:
        root = Path(tmp)
        for file, body in {**imports, name: text}.items():
            (root / file).parent.mkdir(parents=True, exist_ok=True)
            (root / file).write_text(body, encoding="utf-8")
        out = root / "out.pb"
        err = root / "err.txt"
        import contextlib
        import os

        # protoc writes its complaints to fd 2: catch them for the message
        with open(err, "w+b") as sink, contextlib.ExitStack():
            saved = os.dup(2)
            os.dup2(sink.fileno(), 2)
            try:
                code = protoc.main(["protoc", f"-I{root}", f"-I{well_known}",
                                    f"--descriptor_set_out={out}", "--include_imports", name])
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        if code != 0:
            raise SchemaNotRepresentable(
                "eo_kafka: protoc cannot compile the Protobuf schema: "
                f"{err.read_text(errors='replace').strip()[:500]}")
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return list(fds.file)


def build_pool(files: list[descriptor_pb2.FileDescriptorProto]) -> FileDescriptor:
    """A pool of ``files`` (the main one last) and the well-known files they import; the
    main file's descriptor."""
    from google.protobuf import (  # noqa: F401 - registers the well-known files
        any_pb2,
        duration_pb2,
        empty_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    default = descriptor_pool.Default()

    def add_well_known(dep: str) -> None:
        if dep in added:
            return
        fdp = descriptor_pb2.FileDescriptorProto()
        try:
            default.FindFileByName(dep).CopyToProto(fdp)
        except KeyError as e:
            raise SchemaNotRepresentable(
                f"eo_kafka: the Protobuf schema imports {dep!r}, which is neither a registry "
                "reference nor a well-known file") from e
        for d in fdp.dependency:
            add_well_known(d)
        pool.Add(fdp)
        added.add(dep)

    own = {f.name for f in files}
    for f in files:
        for dep in f.dependency:
            if dep not in own and dep not in added:
                add_well_known(dep)
        if f.name not in added:
            pool.Add(f)
            added.add(f.name)
    return pool.FindFileByName(files[-1].name)


def message_at(file: FileDescriptor, indexes: list[int]) -> Descriptor:
    """The message a Confluent message-index path names (``[0]``: the file's first)."""
    if not indexes:
        indexes = [0]
    types = list(file.message_types_by_name.values())
    desc: Descriptor | None = None
    for depth, i in enumerate(indexes):
        if i < 0 or i >= len(types):
            raise IndexError(f"message index path {indexes} names no message (level {depth} "
                             f"has {len(types)})")
        desc = types[i]
        types = list(desc.nested_types)
    if desc is None:
        raise IndexError(f"message index path {indexes} is empty")
    return desc


def index_path(desc: Descriptor) -> list[int]:
    """The Confluent message-index path of a message (the inverse of :func:`message_at`)."""
    path: list[int] = []
    while desc is not None:
        parent = desc.containing_type
        siblings = list(parent.nested_types) if parent is not None else \
            list(desc.file.message_types_by_name.values())
        path.append(siblings.index(desc))
        desc = parent
    return path[::-1]


def is_repeated(field: FieldDescriptor) -> bool:
    """``repeated`` (protobuf 7 dropped ``label``; older ones lack ``is_repeated``)."""
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else \
        getattr(field, "label", 0) == FieldDescriptor.LABEL_REPEATED


def is_map(field: FieldDescriptor) -> bool:
    return (field.message_type is not None and is_repeated(field)
            and field.message_type.GetOptions().map_entry)


def has_presence(field: FieldDescriptor) -> bool:
    return bool(field.has_presence)


def arrow_type(desc: Descriptor, path: str = "value") -> pa.DataType:
    """The Arrow (Spark) type of a message (see the module's table)."""
    return _message(desc, path, ())


def _message(desc: Descriptor, path: str, seen: tuple[str, ...]) -> pa.DataType:
    if desc.full_name in seen:
        raise SchemaNotRepresentable(
            f"eo_kafka: {path} is of the recursive message {desc.full_name!r}; Spark types "
            "cannot represent recursion (make the recursive field bytes, or flatten it)")
    seen = (*seen, desc.full_name)
    return pa.struct([pa.field(f.name, field_type(f, f"{path}.{f.name}", seen))
                      for f in desc.fields])


def field_type(f: FieldDescriptor, path: str, seen: tuple[str, ...] = ()) -> pa.DataType:
    if is_map(f):
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return pa.map_(_single(key, path + "{}", seen), _single(value, path + "{}", seen))
    single = _single(f, path, seen)
    return pa.list_(single) if is_repeated(f) else single


def _single(f: FieldDescriptor, path: str, seen: tuple[str, ...]) -> pa.DataType:
    if f.type in (_T.TYPE_MESSAGE, _T.TYPE_GROUP):
        name = f.message_type.full_name
        if name == TIMESTAMP:
            return TIMESTAMP_UTC
        if name in WRAPPERS:
            return WRAPPERS[name]
        return _message(f.message_type, path, seen)
    return SCALARS[f.type]


Reader = Callable[[Any], Any]


def registered_files(client: Any, found: Any, name: str = "schema.proto"
                     ) -> list[descriptor_pb2.FileDescriptorProto]:
    """The files of a registered schema (``found``: a
    :class:`~connectors.kafka.registry.client.RegisteredSchema`), its references first
    (each fetched by subject and version, recursively), the schema's own file last."""
    files: list[descriptor_pb2.FileDescriptorProto] = []
    imports: dict[str, str] = {}
    for ref in found.references:
        if not isinstance(ref, dict) or "name" not in ref or "subject" not in ref:
            continue
        dep = client.subject_version(ref["subject"], ref.get("version") or "latest")
        dep_files = registered_files(client, dep, ref["name"])
        dep_files[-1].name = ref["name"]  # imported by this name, whatever it was built as
        files.extend(dep_files)
        imports[ref["name"]] = dep.schema
    own = file_proto(found.schema, name, imports)
    if len(own) > 1:  # compiled from text: protoc's set holds the imports already
        return own
    seen: set[str] = set()
    unique = []
    for f in [*files, *own]:
        if f.name not in seen:
            seen.add(f.name)
            unique.append(f)
    return unique


# -- Spark type -> proto3 file (writing) -------------------------------------------------------
_F = descriptor_pb2.FieldDescriptorProto
_PROTO_SCALARS = {pa.int8(): _F.TYPE_INT32, pa.int16(): _F.TYPE_INT32, pa.int32(): _F.TYPE_INT32,
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
    if _fill_message(msg, t, column, f"{package}.{name}" if package else name):
        fdp.dependency.append(_TIMESTAMP_FILE)
    return fdp


def _camel(name: str) -> str:
    out = "".join(p[:1].upper() + p[1:] for p in name.replace("-", "_").split("_") if p)
    return out if out[:1].isalpha() else "M" + out


def _fill_message(msg: descriptor_pb2.DescriptorProto, t: pa.StructType, path: str,
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
            _proto_field(key, ft.key_type, where + "{}", scope, nested)
            value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
            stamps |= _proto_field(value, ft.item_type, where + "{}", scope, nested)
            field.label = _F.LABEL_REPEATED
            field.type = _F.TYPE_MESSAGE
            field.type_name = f".{scope}.{entry.name}"
            continue
        if pa.types.is_list(ft) or pa.types.is_large_list(ft):
            field.label = _F.LABEL_REPEATED
            stamps |= _proto_field(field, ft.value_type, where + "[]", scope, nested)
            continue
        stamps |= _proto_field(field, ft, where, scope, nested)
        if f.nullable and field.type != _F.TYPE_MESSAGE:
            field.proto3_optional = True
            field.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name="_" + f.name)
    # synthetic oneofs must follow every real one (there are none): nothing to reorder
    return stamps


def _proto_field(field: descriptor_pb2.FieldDescriptorProto, t: pa.DataType, where: str,
            scope: str, nested: Callable[[str], descriptor_pb2.DescriptorProto]) -> bool:
    if pa.types.is_struct(t):
        sub = nested(_camel(where.rsplit(".", 1)[-1].strip("[]{}")) or "Item")
        field.type = _F.TYPE_MESSAGE
        field.type_name = f".{scope}.{sub.name}"
        return _fill_message(sub, t, where, f"{scope}.{sub.name}")
    if pa.types.is_timestamp(t):
        if t.tz is None:
            raise KafkaSinkError(
                f"eo_kafka: {where} is a timestamp without a time zone (timestamp_ntz): a "
                "google.protobuf.Timestamp is an instant; cast it to timestamp or a string")
        field.type = _F.TYPE_MESSAGE
        field.type_name = ".google.protobuf.Timestamp"
        return True
    kind = _PROTO_SCALARS.get(t)
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
