"""The Schema Registry options of the ``eo_kafka`` sink, declared once
(docs/schema-registry.md derives its table from :data:`SINK_FORMAT_OPTIONS`). A table of
their own beside :mod:`connectors.kafka.sink.options`: :class:`~connectors.kafka.sink.KafkaSink`
takes them off (:func:`split` for Spark's options, by argument name for the constructor's)
before its own options are parsed, and encodes the formatted columns before its delivery
mode sees them (:mod:`connectors.kafka.registry.sink_formats`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from connectors.core.declared import (
    BOOLEAN,
    CHOICE,
    PREFIXED,
    STRING,
    Opt,
    python_values,
    read_option,
)
from connectors.core.options import OptionReader
from connectors.kafka.common import FAMILY
from connectors.kafka.registry import serde, sink_formats


def _column(column: str) -> tuple[Opt, ...]:
    return (
        Opt(f"{column}Format", f"{column}_format", CHOICE, "binary", choices=serde.COLUMN_FORMATS,
            help=f"`binary`: the `{column}` column is written as it is (binary or string); "
            f"`avro` / `json-schema` / `protobuf`: the `{column}` column (a struct, or a scalar; "
            "a struct for `protobuf`) is written as Avro / JSON / Protobuf in the Confluent wire "
            "format, with the schema of its Spark type "
            "(or the subject's latest); needs `schemaRegistry.url`"),
        Opt(f"{column}Subject", f"{column}_subject", STRING,
            shown_default="from `subjectNameStrategy`",
            help=f"the registry subject of the {column} schema, instead of the strategy's"),
    )


SINK_FORMAT_OPTIONS: tuple[Opt, ...] = (
    *_column("value"),
    *_column("key"),
    Opt("subjectNameStrategy", "subject_name_strategy", CHOICE, "TopicNameStrategy",
        choices=sink_formats.STRATEGIES,
        help="the subject of a column's schema: `TopicNameStrategy` (`<topic>-value`, needs the "
        "`topic` option), `RecordNameStrategy` (the record's full name), "
        "`TopicRecordNameStrategy` (`<topic>-<record full name>`)"),
    Opt("autoRegister", "auto_register", BOOLEAN, False,
        help="register the DataFrame's schema under the subject when it is not there yet; the "
        "registry refuses one incompatible with the subject's versions, and the write fails "
        "before any task runs. `false`: the schema must be registered already"),
    Opt("useLatestVersion", "use_latest_version", BOOLEAN, False,
        help="write with the subject's latest schema (the DataFrame's column must fit it) "
        "instead of the schema of its Spark type"),
    Opt("avroRecordName", "avro_record_name", STRING, "topLevelRecord",
        help="the record name of the schema made from a struct column (Spark's `to_avro` name)"),
    Opt("avroRecordNamespace", "avro_record_namespace", STRING, "",
        shown_default="none", help="its namespace"),
    Opt("schemaRegistry.", "schema_registry", PREFIXED, arg_note="(keys without `schemaRegistry.`)",
        help="the schema registry, as for the source: `url`, `basic.auth.user.info`, "
        "`ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`, "
        "`ssl.key.password`, `timeout`"),
)


def split(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the sink's own options, the format options)``, by Spark name (any case)."""
    names = {o.spark.lower() for o in SINK_FORMAT_OPTIONS if not o.kind.prefix}
    mine: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for k, v in options.items():
        lowered = str(k).lower()
        (mine if lowered in names or lowered.startswith("schemaregistry.") else rest)[k] = v
    return rest, mine


def parse_formats(options: Mapping[str, Any]) -> sink_formats.SinkFormats | None:
    """The sink's formats from its format options (:func:`split`); no network."""
    r = OptionReader(options, family=FAMILY)
    read = {o.spark: read_option(r, o) for o in SINK_FORMAT_OPTIONS}
    values = {k: v for k, (_, v) in read.items()}
    names = {k: n for k, (n, _) in read.items()}  # as declared: Spark lower-cases keys
    return sink_formats.parse(values, names)


def python_formats(arguments: Mapping[str, Any]) -> sink_formats.SinkFormats | None:
    """The sink's formats from the constructor's format arguments (``value_format=...``)."""
    v = python_values(SINK_FORMAT_OPTIONS, arguments, FAMILY, "KafkaSink")
    return sink_formats.parse({o.spark: v[o.arg] for o in SINK_FORMAT_OPTIONS},
                              {o.spark: v.name(o.arg) for o in SINK_FORMAT_OPTIONS})
