"""Protobuf schemas of a Schema Registry -> descriptors and Spark (Arrow) types (the
source's ``valueFormat=protobuf``; docs/schema-registry.md, "Protobuf").

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

The Spark type of a message (:func:`arrow_type`):

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

from connectors.kafka.registry.avro import TIMESTAMP_UTC, SchemaNotRepresentable

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
