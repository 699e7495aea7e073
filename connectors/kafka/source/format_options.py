"""The Schema Registry options of the ``eo_kafka`` source, declared once
(docs/schema-registry.md derives its table from :data:`FORMAT_OPTIONS`), and their values
made into :class:`~connectors.kafka.registry.source_formats.SourceFormats`. The source reads them
with its other options (``declaration.READ_OPTIONS``) and hands their values here; this
module knows nothing else of the source.
"""

from __future__ import annotations

from connectors.core.declared import CHOICE, PREFIXED, STRING, Opt, Values
from connectors.kafka.common import FAMILY
from connectors.kafka.registry import serde
from connectors.kafka.registry import source_formats as registry_formats


def _format_options(column: str) -> tuple[Opt, ...]:
    return (
        Opt(f"{column}Format", f"{column}_format", CHOICE, "binary",
            choices=serde.COLUMN_FORMATS,
            help=f"`binary`: the `{column}` column is the record's bytes (Spark's schema); "
            f"`avro` / `json-schema` / `protobuf`: Avro / JSON / Protobuf in the Confluent wire "
            f"format, decoded into a typed `{column}` column (a struct for a record, object "
            "schema or message) of the "
            "subject's reader schema; needs `schemaRegistry.url`"),
        Opt(f"{column}Subject", f"{column}_subject", STRING,
            shown_default=f"`<topic>-{column}`",
            help=f"the registry subject of the {column}'s reader schema (the default, "
            "TopicNameStrategy, needs exactly one subscribed topic)"),
        # No declared default, so that a version set with a binary column is refused.
        Opt(f"{column}SchemaVersion", f"{column}_schema_version", STRING,
            shown_default="`latest`",
            help=f"the subject's version that is the {column}'s reader schema: `latest` "
            "(when the query starts) or a number. Records written with other compatible "
            "schemas are resolved to it (Avro schema resolution)"),
    )


KEY_FORMAT_OPTIONS = _format_options("key")
VALUE_FORMAT_OPTIONS = _format_options("value")
SCHEMA_REGISTRY = Opt(
    "schemaRegistry.", "schema_registry", PREFIXED, arg_note="(keys without `schemaRegistry.`)",
    help="the schema registry: `url` (required by a registry format), "
    "`basic.auth.user.info` (`user:password`, a secret), `ssl.ca.location`, "
    "`ssl.certificate.location`, `ssl.key.location`, `ssl.key.password`, `timeout` "
    "(seconds, default 30); any other key is an error")
ON_DECODE_ERROR = Opt(
    "onDecodeError", "on_decode_error", CHOICE, "fail", choices=("fail", "dlq"),
    help="a record that cannot be decoded (not framed, an unknown schema id, a schema that "
    "does not resolve, bytes that do not decode): `fail` fails the task naming topic, "
    "partition, offset and schema id; `dlq` keeps the row with its column null, the reason "
    "in a `decodeError` column and the record's bytes in `rawValue` (`rawKey`), for a "
    "dead-letter topic. Nothing is skipped either way")
#: The source's Schema Registry options, declared once (the docs table derives from it).
FORMAT_OPTIONS = (*VALUE_FORMAT_OPTIONS, *KEY_FORMAT_OPTIONS, ON_DECODE_ERROR, SCHEMA_REGISTRY)


def parse_formats(v: Values, topics: tuple[str, ...]) -> registry_formats.SourceFormats | None:
    """The formats from the values of :data:`FORMAT_OPTIONS` (no network:
    :func:`registry_formats.resolve` fetches the reader schemas); ``topics``: the topics
    read, when they are known by name (the default subject needs exactly one)."""
    names = {o.spark: v.name(o.arg) for o in FORMAT_OPTIONS}  # as declared: Spark lower-cases keys
    return registry_formats.parse(
        FAMILY,
        formats={c: v[f"{c}_format"] for c in ("key", "value")},
        subjects={c: v[f"{c}_subject"] for c in ("key", "value")},
        versions={c: v[f"{c}_schema_version"] for c in ("key", "value")},
        registry=v[SCHEMA_REGISTRY.arg] or {},
        topics=topics,
        names=names,
        on_error=v[ON_DECODE_ERROR.arg],
    )
