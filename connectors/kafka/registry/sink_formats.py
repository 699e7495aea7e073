"""The Kafka sink's Schema Registry formats: struct (or scalar) ``key``/``value`` columns
written as Avro or JSON Schema records (:mod:`connectors.kafka.registry.json_schema_sink`)
in the Confluent wire format.

1. :func:`parse` (driver, no network): the declared options
   (:mod:`connectors.kafka.sink.format_options`);
2. :func:`resolve` (driver, once per batch, before any task): for each formatted column the
   subject (an explicit one, else the naming strategy: TopicNameStrategy ``<topic>-value``,
   RecordNameStrategy ``<record full name>``, TopicRecordNameStrategy
   ``<topic>-<record full name>``) and the writer schema with its id:

   - ``useLatestVersion=true``: the subject's latest schema, which the column must fit;
   - otherwise the Avro schema of the column's Spark type (Spark's ``to_avro`` mapping,
     nullable fields as ``["null", T]`` with default null), looked up under the subject;
     with ``autoRegister=true`` registered when missing, which the registry refuses when
     it is incompatible with the subject's versions (an error that says so).

   Workers get the schema and its id with the task: no registry call per record or task,
   and a retried batch writes the same id (ids never change), so exactly-once holds as
   without a format: the registry is not part of the commit;
3. :func:`encode_batch` (executor): the column -> framed bytes, one fastavro
   ``schemaless_writer`` call per record.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.core.options import option_error
from connectors.kafka.registry import json_schema, json_schema_sink
from connectors.kafka.registry.avro import (
    MAGIC,
    _avro_decode,
    arrow_type,
    fast_program,
    strip_raw_logical,
)
from connectors.kafka.registry.client import RegistryError, RegistrySpec, client_for

STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")
FAMILY = "eo_kafka"


@dataclass(frozen=True)
class ColumnEncoding:
    column: str
    subject: str | None
    #: resolved on the driver
    schema: str | None = None
    schema_id: int | None = None
    #: ``avro``, ``json-schema`` or ``protobuf``
    kind: str = "avro"


@dataclass(frozen=True)
class SinkFormats:
    registry: RegistrySpec
    columns: tuple[ColumnEncoding, ...]
    strategy: str = "TopicNameStrategy"
    auto_register: bool = False
    use_latest_version: bool = False
    record_name: str = "topLevelRecord"
    record_namespace: str = ""


def parse(values: Mapping[str, Any], names: Mapping[str, str]) -> SinkFormats | None:
    """From the declared options' values (keyed by Spark name); None when no column has a
    registry format."""
    columns = []
    for column in ("key", "value"):
        if str(values[f"{column}Format"]).lower() == "binary":
            if values[f"{column}Subject"] is not None:
                raise option_error(FAMILY, names[f"{column}Subject"],
                                   f"is set but {names[f'{column}Format']} is binary",
                                   f"set {names[f'{column}Format']}=avro, or remove it")
            continue
        columns.append(ColumnEncoding(column, values[f"{column}Subject"],
                                      kind=str(values[f"{column}Format"]).lower()))
    registry = values["schemaRegistry."] or {}
    if not columns:
        if registry:
            reg, key, value = names["schemaRegistry."], names["keyFormat"], names["valueFormat"]
            first = next(iter(registry))
            raise option_error(FAMILY, f"{reg}{first}" if reg.endswith(".") else
                               f"{reg}[{first!r}]",
                               f"is set but neither {key} nor {value} needs a registry",
                               f"set {value}=avro (or {key}), or remove {reg}")
        return None
    if values["autoRegister"] and values["useLatestVersion"]:
        raise option_error(FAMILY, names["autoRegister"],
                           f"cannot be used together with {names['useLatestVersion']}",
                           "write the latest registered schema (useLatestVersion) or register "
                           "the DataFrame's own (autoRegister), not both")
    chosen = str(values["subjectNameStrategy"]).lower()
    strategy = next(s for s in STRATEGIES if s.lower() == chosen)
    reg = names["schemaRegistry."]  # the Python argument schema_registry: its keys as reg.key
    return SinkFormats(RegistrySpec.parse(FAMILY, registry, reg if reg.endswith(".")
                                          else f"{reg}."), tuple(columns), strategy,
                       bool(values["autoRegister"]), bool(values["useLatestVersion"]),
                       values["avroRecordName"], values["avroRecordNamespace"] or "")


# -- Spark type -> Avro schema ---------------------------------------------------------------
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


def _full_name(schema: Any) -> str | None:
    """The record name a RecordNameStrategy subject takes: an Avro record's full name, a
    JSON Schema's ``title`` (as Confluent's serializers name it)."""
    if isinstance(schema, Mapping) and schema.get("type") == "object" and schema.get("title"):
        return str(schema["title"])
    if isinstance(schema, Mapping) and schema.get("type") == "record":
        name, ns = str(schema["name"]), schema.get("namespace")
        return name if "." in name or not ns else f"{ns}.{name}"
    return None


def resolve(formats: SinkFormats, schema: pa.Schema, topic: str | None) -> SinkFormats:
    """Each column's writer schema and id (driver side): see the module's step 2."""
    client = client_for(formats.registry, FAMILY)
    columns = []
    for c in formats.columns:
        i = schema.get_field_index(c.column)
        if i < 0:
            raise KafkaSinkError(f"eo_kafka: {c.column}Format={c.kind}, but the DataFrame "
                                 f"has no '{c.column}' column (columns: {schema.names})")
        col_type = schema.field(i).type
        json_kind = c.kind == "json-schema"
        if c.kind == "protobuf":
            columns.append(_resolve_protobuf(client, formats, c, col_type, topic))
            continue
        derived = (json_schema_sink.json_schema(col_type, formats.record_name, c.column)
                   if json_kind else
                   avro_schema(col_type, formats.record_name, formats.record_namespace))
        subject = c.subject or _subject(formats, c.column, topic, derived)
        if formats.use_latest_version:
            found = client.subject_version(subject, "latest")
            writer_text, schema_id = found.schema, found.id
            _check_fits(col_type, json.loads(writer_text), c.column, subject, c.kind)
        else:
            writer_text = json.dumps(derived)
            schema_id = _lookup_or_register(client, subject, writer_text, formats, c.column,
                                            "JSON" if json_kind else "AVRO")
        columns.append(dataclasses.replace(c, subject=subject, schema=writer_text,
                                           schema_id=schema_id))
    return dataclasses.replace(formats, columns=tuple(columns))


def _resolve_protobuf(client: Any, formats: SinkFormats, c: ColumnEncoding,
                      col_type: pa.DataType, topic: str | None) -> ColumnEncoding:
    """A protobuf column's writer schema and id: the proto3 file of its Spark type
    (:mod:`~connectors.kafka.registry.protobuf_sink`), or the subject's latest."""
    protobuf_sink = _protobuf_sink()
    fdp = protobuf_sink.file_descriptor(col_type, formats.record_name,
                                        formats.record_namespace, c.column)
    record = f"{fdp.package}.{formats.record_name}" if fdp.package else formats.record_name
    subject = c.subject or _subject(formats, c.column, topic, {"type": "record",
                                                               "name": record})
    if formats.use_latest_version:
        from connectors.kafka.registry import protobuf, protobuf_schema

        found = client.subject_version(subject, "latest")  # with its references, packed:
        text = protobuf_sink.PACKED + protobuf.pack(protobuf_schema.registered_files(
            client, found))
        schema_id = found.id
        protobuf_sink.plan(protobuf_sink.message_of(text), col_type, c.column)  # it fits
    else:
        text = protobuf_sink.registered_text(fdp)
        schema_id = _lookup_or_register(client, subject, text, formats, c.column, "PROTOBUF")
    return dataclasses.replace(c, subject=subject, schema=text, schema_id=schema_id)


def _protobuf_sink() -> Any:
    """The Protobuf encoder, whose dependencies are an extra (imported when used)."""
    try:
        from connectors.kafka.registry import protobuf_sink
    except ImportError as e:
        raise KafkaSinkError('eo_kafka: valueFormat/keyFormat=protobuf needs the protobuf '
                             'package: pip install "pyspark-exactly-once[protobuf]"') from e
    return protobuf_sink


def _subject(formats: SinkFormats, column: str, topic: str | None, derived: Any) -> str:
    record = _full_name(derived)
    if formats.strategy != "TopicNameStrategy" and record is None:
        raise KafkaSinkError(f"eo_kafka: subjectNameStrategy={formats.strategy} names the "
                             f"subject after a record, but the {column} column is not a struct")
    if formats.strategy == "RecordNameStrategy":
        return str(record)
    if topic is None:
        raise option_error(FAMILY, f"{column}Subject",
                           f"is needed: {formats.strategy} names the subject after the topic, "
                           "and the sink has no 'topic' option (rows carry their own)",
                           f"set the 'topic' option or {column}Subject")
    return f"{topic}-{column}" if formats.strategy == "TopicNameStrategy" else f"{topic}-{record}"


def _lookup_or_register(client: Any, subject: str, schema_text: str, formats: SinkFormats,
                        column: str, schema_type: str) -> int:
    import urllib.parse

    path = f"/subjects/{urllib.parse.quote(subject, safe='')}"
    body = {"schema": schema_text, "schemaType": schema_type}
    if formats.auto_register:
        try:
            doc = client.request("POST", path + "/versions", body)
        except RegistryError as e:
            if e.status == 409:
                raise KafkaSinkError(
                    f"eo_kafka: the schema registry refused the {column} schema of the "
                    f"DataFrame under subject {subject!r} as incompatible with its versions "
                    f"(compatibility rules of the subject): {e}; change the DataFrame, or the "
                    "subject's compatibility level") from None
            raise
        return int(doc["id"])
    doc = client.request("POST", path, body, not_found=True)
    if doc is None:
        raise KafkaSinkError(
            f"eo_kafka: the {column} schema of the DataFrame is not registered under subject "
            f"{subject!r} (autoRegister=false): register it, set autoRegister=true, or "
            f"useLatestVersion=true to write with the subject's latest schema (in Python: "
            f"auto_register=True, use_latest_version=True). The schema: "
            f"{schema_text[:500]}")
    return int(doc["id"])


def _check_fits(t: pa.DataType, writer: Any, column: str, subject: str, kind: str) -> None:
    """The column can be written with ``writer`` (a struct: every non-defaulted field of an
    Avro schema, every required property of a JSON Schema, is a column; Arrow types agree
    with the schema's)."""
    if kind == "json-schema":
        want = json_schema.arrow_type(writer, column)
        needed = set(writer.get("required", ())) if isinstance(writer, Mapping) else set()
    else:
        want = arrow_type(writer, column)
        needed = {f["name"] for f in writer.get("fields", []) if "default" not in f} \
            if isinstance(writer, Mapping) else set()
    if pa.types.is_struct(want) and pa.types.is_struct(t):
        have = {f.name for f in t}
        missing = [f.name for f in want if f.name not in have and f.name in needed]
        if missing:
            raise KafkaSinkError(
                f"eo_kafka: the latest schema of subject {subject!r} needs the {column} "
                f"fields {missing}, which the DataFrame's {column} struct does not have")


# -- encoding (executor) ----------------------------------------------------------------------
class AvroEncoder:
    """One column -> framed Avro bytes with the resolved writer schema."""

    def __init__(self, enc: ColumnEncoding) -> None:
        from fastavro import parse_schema

        if enc.schema is None or enc.schema_id is None:
            raise ValueError(f"{enc.column}: the encoding is not resolved")
        self.column = enc.column
        self.header = bytes([MAGIC]) + enc.schema_id.to_bytes(4, "big")
        self.schema_id = enc.schema_id
        writer = json.loads(enc.schema)
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


def encoded_schema(schema: pa.Schema, formats: SinkFormats) -> pa.Schema:
    for c in formats.columns:
        schema = schema.set(schema.get_field_index(c.column), pa.field(c.column, pa.binary()))
    return schema


def encoder(enc: ColumnEncoding) -> Any:
    """The executor's encoder of one resolved column."""
    if enc.kind == "protobuf":
        if enc.schema is None or enc.schema_id is None:
            raise ValueError(f"{enc.column}: the encoding is not resolved")
        return _protobuf_sink().ProtobufEncoder(enc.column, enc.schema, enc.schema_id)
    if enc.kind == "json-schema":
        if enc.schema_id is None:
            raise ValueError(f"{enc.column}: the encoding is not resolved")
        return json_schema_sink.JsonEncoder(enc.column, enc.schema_id)
    return AvroEncoder(enc)


def encode_batch(batch: pa.RecordBatch,
                 encoders: Mapping[str, Any]
                 ) -> pa.RecordBatch:
    columns = list(batch.columns)
    schema = batch.schema
    for name, encoder in encoders.items():
        i = schema.get_field_index(name)
        columns[i] = encoder.encode(batch.column(i))
        schema = schema.set(i, pa.field(name, pa.binary()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
