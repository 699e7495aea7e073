"""The Schema Registry options of the ``eo_kafka`` source, declared once
(docs/schema-registry.md derives its table from :data:`FORMAT_OPTIONS`), and their reading
into :class:`~connectors.kafka.registry.formats.SourceFormats`. A module of their own beside
:mod:`connectors.kafka.source.options`, which reads them in ``from_options``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from connectors.core.declared import CHOICE, PREFIXED, STRING, Opt, read_option
from connectors.core.options import OptionReader
from connectors.kafka.common import FAMILY
from connectors.kafka.registry import formats as registry_formats

if TYPE_CHECKING:
    from connectors.kafka.source.options import ClusterSpec


def _format_options(column: str) -> tuple[Opt, ...]:
    return (
        Opt(f"{column}Format", f"{column}_format", CHOICE, "binary",
            choices=registry_formats.FORMATS,
            help=f"`binary`: the `{column}` column is the record's bytes (Spark's schema); "
            f"`avro` / `json-schema` / `protobuf`: Avro / JSON / Protobuf in the Confluent wire "
            f"format, decoded into a typed `{column}` column (a struct for a record, object "
            "schema or message) of the "
            "subject's reader schema; needs `schemaRegistry.url`"),
        Opt(f"{column}Subject", f"{column}_subject", STRING,
            shown_default=f"`<topic>-{column}`",
            help=f"the registry subject of the {column}'s reader schema (the default, "
            "TopicNameStrategy, needs exactly one subscribed topic)"),
        Opt(f"{column}SchemaVersion", f"{column}_schema_version", STRING, "latest",
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


def parse_formats(r: OptionReader,
                  clusters: tuple[ClusterSpec, ...]) -> registry_formats.SourceFormats | None:
    """The formats of a source's options (no network: :func:`registry_formats.resolve`
    fetches the reader schemas); the default subject needs the one topic read by name."""
    read = {o.spark: read_option(r, o) for o in FORMAT_OPTIONS}
    values: dict[str, Any] = {k: v for k, (_, v) in read.items()}
    names = {k: n for k, (n, _) in read.items()}  # as declared: Spark lower-cases keys
    topics: tuple[str, ...] = ()
    if len(clusters) == 1 and clusters[0].subscribe_pattern is None:
        c = clusters[0]
        topics = c.subscribe or tuple(sorted({t for t, _ in c.assign}))
    elif len(clusters) > 1:
        topics = tuple(sorted({t for c in clusters for t in c.subscribe}
                              | {t for c in clusters for t, _ in c.assign}))
        topics = topics if all(c.subscribe_pattern is None for c in clusters) else ()
    return registry_formats.parse(
        FAMILY,
        formats={c: values[f"{c}Format"] for c in ("key", "value")},
        subjects={c: values[f"{c}Subject"] for c in ("key", "value")},
        versions={c: (None if not r.has(f"{c}SchemaVersion") else values[f"{c}SchemaVersion"])
                  for c in ("key", "value")},
        registry=values[SCHEMA_REGISTRY.spark] or {},
        topics=topics,
        names=names,
        on_error=values[ON_DECODE_ERROR.spark],
    )
