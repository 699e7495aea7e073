"""The Kafka sink's Schema Registry formats: struct (or scalar) ``key``/``value`` columns
written as Avro, JSON Schema or Protobuf records in the Confluent wire format, each format
looked up in the table of :mod:`~connectors.kafka.registry.serde` (its module writes it).

1. :func:`parse` (driver, no network): the declared options
   (:mod:`connectors.kafka.sink.format_options`);
2. :func:`resolve` (driver, once per batch, before any task): for each formatted column the
   subject (an explicit one, else the naming strategy: TopicNameStrategy ``<topic>-value``,
   RecordNameStrategy ``<record full name>``, TopicRecordNameStrategy
   ``<topic>-<record full name>``) and the writer schema with its id:

   - ``useLatestVersion=true``: the subject's latest schema, which the column must fit;
   - otherwise the schema of the column's Spark type (for Avro Spark's ``to_avro`` mapping,
     nullable fields as ``["null", T]`` with default null), looked up under the subject;
     with ``autoRegister=true`` registered when missing, which the registry refuses when
     it is incompatible with the subject's versions (an error that says so).

   Workers get the schema and its id with the task: no registry call per record or task,
   and a retried batch writes the same id (ids never change), so exactly-once holds as
   without a format: the registry is not part of the commit;
3. :func:`encode_batch` (executor): the column -> framed bytes, by the format's
   :class:`~connectors.kafka.registry.serde.Encoder`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.core.options import option_error
from connectors.kafka.registry import serde
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
        fmt = _format(c.kind)
        derived = fmt.writer_schema(col_type, formats.record_name, formats.record_namespace,
                                    c.column)
        subject = c.subject or _subject(formats, c.column, topic, derived.record)
        if formats.use_latest_version:
            found = client.subject_version(subject, "latest")
            writer_text = fmt.latest_writer(client, found, col_type, c.column, subject)
            schema_id = found.id
        else:
            writer_text = derived.text
            schema_id = _lookup_or_register(client, subject, writer_text, formats, c.column,
                                            serde.FORMATS[c.kind].schema_type)
        columns.append(dataclasses.replace(c, subject=subject, schema=writer_text,
                                           schema_id=schema_id))
    return dataclasses.replace(formats, columns=tuple(columns))


def _format(kind: str) -> serde.Format:
    """The format's module; one whose dependencies are an extra is imported when used."""
    return serde.format_of(kind, lambda hint: KafkaSinkError(
        f"eo_kafka: valueFormat/keyFormat={kind} {hint}"))


def _subject(formats: SinkFormats, column: str, topic: str | None, record: str | None) -> str:
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


def encoded_schema(schema: pa.Schema, formats: SinkFormats) -> pa.Schema:
    for c in formats.columns:
        schema = schema.set(schema.get_field_index(c.column), pa.field(c.column, pa.binary()))
    return schema


def encoder(enc: ColumnEncoding) -> serde.Encoder:
    """The executor's encoder of one resolved column."""
    if enc.schema is None or enc.schema_id is None:
        raise ValueError(f"{enc.column}: the encoding is not resolved")
    return _format(enc.kind).encoder(enc.column, enc.schema, enc.schema_id)


def encode_batch(batch: pa.RecordBatch, encoders: Mapping[str, serde.Encoder]
                 ) -> pa.RecordBatch:
    columns = list(batch.columns)
    schema = batch.schema
    for name, encoder in encoders.items():
        i = schema.get_field_index(name)
        columns[i] = encoder.encode(batch.column(i))
        schema = schema.set(i, pa.field(name, pa.binary()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
