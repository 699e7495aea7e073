"""Options of the ``eo_kafka`` source (:class:`KafkaSourceOptions`): Spark's Kafka source
options, same names and semantics (docs/kafka-source.md), read through their one declaration
(:mod:`connectors.kafka.source.declaration`) into a frozen, picklable spec that travels to
executors (with :class:`ClusterSpec` and :class:`StartSpec`, :mod:`connectors.kafka.source.specs`).

A query's options are parsed once (:meth:`KafkaSourceOptions.parse`, when Spark asks for the
schema); the kind of read then takes its defaults without parsing again
(:meth:`KafkaSourceOptions.for_read`). The sink's are in :mod:`connectors.kafka.sink.options`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.declared import Values, spark_values
from connectors.core.errors import KafkaSourceError, OptionError
from connectors.core.options import OptionReader, RedactedDict, option_error, required_error
from connectors.core.storage import StorageOptions, check_state_path
from connectors.kafka.common import DEFAULT_CONNECT_TIMEOUT, DEFAULT_RETRY_TIMEOUT, FAMILY
from connectors.kafka.config import check_client_config, spelled
from connectors.kafka.registry import source_formats as registry_formats
from connectors.kafka.source import declaration as opt
from connectors.kafka.source import kinds
from connectors.kafka.source.format_options import parse_formats
from connectors.kafka.source.offsets import (
    DEFAULT_TARGET_RECORDS,
    TP,
    Offsets,
    decode_offsets,
    encode_offsets,
)
from connectors.kafka.source.specs import ClusterSpec, StartSpec

__all__ = ["DEFAULT_GROUP_PREFIX", "ClusterSpec", "KafkaSourceOptions", "StartSpec"]

DEFAULT_GROUP_PREFIX = opt.DEFAULT_GROUP_PREFIX

# librdkafka settings the source owns. Users set the Spark-level option instead.
_REFUSED_KAFKA = {
    "enable.auto.commit": "the source commits offsets itself after each window "
    "(see kafka.group.id / groupIdPrefix); remove kafka.enable.auto.commit",
    "auto.offset.reset": "use startingOffsets (earliest | latest | group | JSON) instead",
    "enable.auto.offset.store": "the source reads by position and stores no offsets",
}
#: The values that go into a derived field rather than a field of their own name.
_DERIVED_FROM = (
    opt.BOOTSTRAP.arg, opt.SUBSCRIBE.arg, opt.SUBSCRIBE_PATTERN.arg, opt.ASSIGN.arg,
    opt.STARTING_OFFSETS.arg, opt.STARTING_BY_TIMESTAMP.arg, opt.STARTING_TIMESTAMP.arg,
    opt.KAFKA.arg, opt.GROUP_ID_PREFIX.arg, opt.CLUSTERS.arg, opt.IGNORE_UNKNOWN_OPTIONS.arg,
    *(o.arg for o in opt.FORMAT_OPTIONS),
)
_SUBSCRIPTION = (opt.SUBSCRIBE, opt.SUBSCRIBE_PATTERN, opt.ASSIGN)
_STARTS = (opt.STARTING_OFFSETS, opt.STARTING_BY_TIMESTAMP, opt.STARTING_TIMESTAMP)


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The parsed, validated options of an ``eo_kafka`` read (picklable, no connections).

    Build it with :meth:`from_options` from Spark's string options; or, to parse once and
    choose the kind of read later (Spark's reader does), with :meth:`parse` and then
    :meth:`for_read`. Option names and semantics are Spark's built-in Kafka source's;
    docs/kafka-source.md lists them.
    """

    clusters: tuple[ClusterSpec, ...]
    multi_cluster: bool = False
    #: ``endingOffsets``: as given until :meth:`for_read` makes it a batch read's end
    ending: StartSpec | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = 900.0
    max_bytes_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    #: ``targetRecordsPerPartition``: smaller Kafka partition ranges are grouped up to this
    target_records_per_partition: int = DEFAULT_TARGET_RECORDS
    fail_on_data_loss: bool = True
    include_headers: bool = False
    group_id: str = DEFAULT_GROUP_PREFIX
    wal_path: str | None = None
    #: ``storage.*``: how to reach an object store holding ``walPath``
    storage: StorageOptions = field(default_factory=StorageOptions)
    #: ``kafkaConsumer.pollTimeoutMs`` (Spark's name), in seconds
    poll_timeout: float = 120.0
    metadata_retry_timeout: float = DEFAULT_RETRY_TIMEOUT
    timestamp_strategy: str = "error"
    arrow_batch_records: int = 20000
    #: ``connectTimeout``: the bound on the first request to each cluster
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    #: ``KafkaWindows`` pins a batch read to one window of the WAL with this.
    window: int | None = None
    #: ``keyFormat``/``valueFormat`` other than binary: the Schema Registry formats
    formats: registry_formats.SourceFormats | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, batch: bool = False) -> KafkaSourceOptions:
        """Parse Spark's options. ``batch=True`` for ``spark.read`` (allows endingOffsets)."""
        return cls.parse(options).for_read(batch)

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> KafkaSourceOptions:
        """Every option read through its declaration and checked (an unknown one refused,
        naming the closest declared one; the readers' librdkafka configuration checked by
        librdkafka), into the spec of either kind of read: :meth:`for_read` picks one."""
        values = spark_values(opt.READ_OPTIONS, options, FAMILY)
        # How the user spelled the options (kafka.* settings in librdkafka's verdicts); the
        # values are all read above.
        return cls._build(values, OptionReader(options, family=FAMILY))

    def for_read(self, batch: bool) -> KafkaSourceOptions:
        """The spec of a streaming read (``batch=False``) or a batch read (``spark.read``),
        without parsing again: a cluster whose start was not given starts at the read's
        default (streaming ``latest``, batch ``earliest``, as in Spark), and only a batch
        read has an end (``endingOffsets``, default ``latest``)."""
        if not batch:
            if self.ending is not None:
                raise option_error(
                    FAMILY, opt.ENDING_OFFSETS.spark, "is only valid for batch reads (spark.read)",
                    "remove it from the streaming query, or use Trigger.AvailableNow")
            return self
        clusters = tuple(dataclasses.replace(c, starting=StartSpec("earliest"))
                         if c.default_start else c for c in self.clusters)
        return dataclasses.replace(self, clusters=clusters,
                                   ending=self.ending or StartSpec("latest"))

    @classmethod
    def _build(cls, v: Values, spelling: OptionReader) -> KafkaSourceOptions:
        """What ties options together, from their values: the clusters and their
        subscriptions and starts, the bounds, the WAL, the group, the formats."""
        top_kafka = v[opt.KAFKA.arg] or RedactedDict()
        _refuse_kafka_settings(top_kafka)
        entries = v[opt.CLUSTERS.arg]
        if entries is None:
            clusters: tuple[ClusterSpec, ...] = (_single_cluster(v, top_kafka),)
            multi = False
        else:
            for o in _SUBSCRIPTION:
                if spelling.present(o.spark):
                    raise v.error(o.arg, "cannot be combined with 'clusters'",
                                  "put subscribe/subscribePattern/assign inside each clusters "
                                  "entry")
            clusters = _parse_clusters(v, entries, top_kafka)
            multi = True

        max_offsets = v[opt.MAX_OFFSETS.arg]
        min_offsets = v[opt.MIN_OFFSETS.arg]
        if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
            raise v.error(opt.MIN_OFFSETS.arg,
                          f"({min_offsets}) is larger than maxOffsetsPerTrigger ({max_offsets})",
                          "make minOffsetsPerTrigger <= maxOffsetsPerTrigger")
        wal_path, storage = v[opt.WAL_PATH.arg], v[opt.STORAGE_OPTIONS.arg]
        if wal_path is not None:
            check_state_path(wal_path, storage, FAMILY, v.name(opt.WAL_PATH.arg))
        elif storage:
            raise option_error(FAMILY, f"storage.{storage.values[0][0]}",
                               "is set but walPath is not", "storage.* options configure the "
                               "store of walPath; set walPath or remove them")
        group_id = _group_id(v, top_kafka, clusters)
        if v[opt.WINDOW.arg] is not None and wal_path is None:
            raise v.error(opt.WINDOW.arg, "needs walPath", "set walPath to the windows' WAL")
        formats = parse_formats(v, _named_topics(clusters))
        for c in clusters:  # the readers' whole configuration: fails here, not in a task
            option = spelled(spelling, c.name if multi else None)
            if not c.kafka.get("group.id", "-").strip():
                # confluent-kafka aborts the process (an assertion) on a blank group.id
                raise option_error(FAMILY, option("group.id"), "is empty",
                                   "give the consumer group's id, or remove it (the group is "
                                   "then <groupIdPrefix>-<hash>)")
            check_client_config(FAMILY, c.reader_conf(group_id), "consumer", option=option)
        return v.build(cls, used=_DERIVED_FROM, clusters=clusters, multi_cluster=multi,
                       group_id=group_id, poll_timeout=v[opt.POLL_TIMEOUT.arg] / 1000.0,
                       formats=formats)

    def cluster(self, name: str) -> ClusterSpec:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KafkaSourceError(
            f"eo_kafka: offsets name cluster {name!r}, which is not in the 'clusters' option "
            f"({[c.name for c in self.clusters]}); a query's clusters cannot change between runs"
        )

    def encode(self, offsets: Mapping[TP, int]) -> dict[str, Any]:
        """Offsets -> Spark's offset JSON dict (Spark's offset log, the window WAL)."""
        return encode_offsets(offsets, self.multi_cluster)

    def decode(self, obj: Mapping[str, Any]) -> Offsets:
        """Spark's offset JSON dict -> offsets ``{(cluster, topic, partition): next_offset}``."""
        return decode_offsets(obj, self.multi_cluster)


def _refuse_kafka_settings(kafka: Mapping[str, str]) -> None:
    for key, why in _REFUSED_KAFKA.items():
        if key in kafka:
            raise option_error(FAMILY, f"kafka.{key}", "is not supported by the eo_kafka source",
                               why)


def _single_cluster(v: Values, kafka: Mapping[str, str]) -> ClusterSpec:
    """The one cluster of the top-level options: exactly one subscription, the brokers, at
    most one kind of start."""
    present = [o.spark for o in _SUBSCRIPTION if v[o.arg] is not None]
    names = [o.spark for o in _SUBSCRIPTION]
    if len(present) > 1:
        raise OptionError(f"{FAMILY}: options {present} cannot be used together; set only one "
                          f"of {names}", option=present[0])
    if not present:
        raise OptionError(f"{FAMILY}: one of the options {names} is required, none was set",
                          option=names[0])
    bootstrap = v[opt.BOOTSTRAP.arg]
    if bootstrap is None:
        raise required_error(FAMILY, v.name(opt.BOOTSTRAP.arg), opt.BOOTSTRAP.hint)
    starts = [o.spark for o in _STARTS if v[o.arg] is not None]
    if len(starts) > 1:
        raise OptionError(
            f"{FAMILY}: options {starts} cannot be used together; set only one of "
            f"{', '.join(o.spark for o in _STARTS)}", option=starts[0])
    return _cluster_spec(
        v, name="", bootstrap=bootstrap, subscribe=v[opt.SUBSCRIBE.arg] or (),
        pattern=v[opt.SUBSCRIBE_PATTERN.arg], assign=v[opt.ASSIGN.arg] or (), start=None,
        kafka=kafka)


def _cluster_spec(
    v: Values,
    *,
    name: str,
    bootstrap: str,
    subscribe: tuple[str, ...],
    pattern: str | None,
    assign: tuple[tuple[str, int], ...],
    start: StartSpec | None,
    kafka: Mapping[str, str],
) -> ClusterSpec:
    """One cluster. Its start: its ``clusters`` entry's ``startingOffsets``, else the
    top-level one, else ``startingTimestamp``, else ``startingOffsetsByTimestamp``, else
    the read's default (:meth:`KafkaSourceOptions.for_read`)."""
    for o in (opt.STARTING_OFFSETS, opt.STARTING_TIMESTAMP, opt.STARTING_BY_TIMESTAMP):
        start = start or v[o.arg]
    conf = RedactedDict(kafka)
    conf["bootstrap.servers"] = bootstrap
    return ClusterSpec(
        name=name,
        bootstrap=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=start or StartSpec("latest"),
        kafka=conf,
        default_start=start is None,
    )


def _parse_clusters(
    v: Values, entries: list[Any], top_kafka: Mapping[str, str]
) -> tuple[ClusterSpec, ...]:
    valid = (
        'give a JSON list such as [{"name": "east", "bootstrap": "h1:9092", '
        '"subscribe": "events"}, {"bootstrap": "h2:9092", "assign": {"t": [0]}}]'
    )
    if not entries:
        raise v.error(opt.CLUSTERS.arg, "is an empty list", valid)
    out: list[ClusterSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise v.error(opt.CLUSTERS.arg, f"entry {i} is not an object", valid)
        lowered = {str(k).lower(): value for k, value in entry.items()}
        bootstrap = lowered.get("bootstrap") or lowered.get("kafka.bootstrap.servers")
        if not isinstance(bootstrap, str) or not bootstrap.strip():
            raise v.error(opt.CLUSTERS.arg, f"entry {i} has no 'bootstrap'", valid)
        name = str(lowered.get("name") or bootstrap)
        if name in seen:
            raise v.error(opt.CLUSTERS.arg, f"names cluster {name!r} twice", "give unique names")
        seen.add(name)
        present = [o for o in _SUBSCRIPTION if o.spark.lower() in lowered]
        if len(present) != 1:
            raise v.error(
                opt.CLUSTERS.arg,
                f"entry {name!r} must have exactly one of subscribe, subscribePattern, assign "
                f"(has {[o.spark.lower() for o in present] or 'none'})",
                valid,
            )
        kafka = RedactedDict(top_kafka)
        kafka.pop("bootstrap.servers", None)
        for k, value in lowered.items():
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers":
                kafka[k[len("kafka."):]] = str(value)
        _refuse_kafka_settings(kafka)
        where = f" (clusters entry {name!r})"
        which = present[0]
        text = _entry_text(lowered, which.spark) or ""
        start_text = _entry_text(lowered, opt.STARTING_OFFSETS.spark)
        out.append(_cluster_spec(
            v, name=name, bootstrap=bootstrap.strip(),
            subscribe=kinds.TOPICS.parse(text, which.spark + where, FAMILY)
            if which is opt.SUBSCRIBE else (),
            pattern=kinds.PATTERN.parse(text, which.spark + where, FAMILY)
            if which is opt.SUBSCRIBE_PATTERN else None,
            assign=kinds.PARTITIONS.parse(text, which.spark + where, FAMILY)
            if which is opt.ASSIGN else (),
            start=None if start_text is None
            else kinds.START.parse(start_text, opt.STARTING_OFFSETS.spark + where, FAMILY),
            kafka=kafka,
        ))
    return tuple(out)


def _entry_text(lowered: Mapping[str, Any], option: str) -> str | None:
    """A field of a ``clusters`` entry as Spark's option text (a JSON value as JSON)."""
    value = lowered.get(option.lower())
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _named_topics(clusters: tuple[ClusterSpec, ...]) -> tuple[str, ...]:
    """The topics read, when every cluster names its topics (no pattern); else ()."""
    if any(c.subscribe_pattern is not None for c in clusters):
        return ()
    if len(clusters) == 1:
        c = clusters[0]
        return c.subscribe or tuple(sorted({t for t, _ in c.assign}))
    return tuple(sorted({t for c in clusters for t in c.subscribe}
                        | {t for c in clusters for t, _ in c.assign}))


def _group_id(v: Values, kafka: Mapping[str, str], clusters: tuple[ClusterSpec, ...]) -> str:
    """``kafka.group.id`` as given; else ``<groupIdPrefix>-<stable identity>``.

    The identity is a hash of ``walPath`` when set (one WAL = one pipeline), else of the
    clusters and subscriptions. It never changes between runs, so lag tools keep one group.
    """
    explicit = kafka.get("group.id")
    prefix = v[opt.GROUP_ID_PREFIX.arg]
    if explicit is not None and prefix is not None:
        raise OptionError(
            f"{FAMILY}: options ['kafka.group.id', 'groupIdPrefix'] cannot be used together; "
            "set only one",
            option="groupIdPrefix",
        )
    if explicit is not None:
        return explicit
    wal_path = v[opt.WAL_PATH.arg]
    if wal_path is not None:
        identity = "wal:" + wal_path
    else:
        identity = ";".join(f"{c.bootstrap}|{c.describe_subscription()}" for c in clusters)
    digest = hashlib.sha1(identity.encode(), usedforsecurity=False).hexdigest()[:12]
    return f"{prefix or DEFAULT_GROUP_PREFIX}-{digest}"
