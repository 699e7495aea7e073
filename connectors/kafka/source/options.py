"""Options of the ``eo_kafka`` source (:class:`KafkaSourceOptions`, :class:`ClusterSpec`,
:class:`StartSpec`): Spark's Kafka source options, same names and semantics
(docs/kafka-source.md), parsed once into frozen, picklable specs that travel to executors.
The sink's are in :mod:`connectors.kafka.sink.options`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.declared import read_option
from connectors.core.errors import KafkaSourceError, OptionError
from connectors.core.options import OptionReader, RedactedDict
from connectors.core.storage import StorageOptions, check_state_path, parse_storage_options
from connectors.kafka.common import (
    CONNECT_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RETRY_TIMEOUT,
    FAMILY,
    METADATA_RETRY_TIMEOUT,
)
from connectors.kafka.config import check_client_config, spelled
from connectors.kafka.registry import formats as registry_formats
from connectors.kafka.source import declaration as opt
from connectors.kafka.source.format_options import SCHEMA_REGISTRY, parse_formats
from connectors.kafka.source.offsets import (
    DEFAULT_TARGET_RECORDS,
    TP,
    Offsets,
    decode_offsets,
    encode_offsets,
    parse_assign,
    parse_partition_offsets,
)

DEFAULT_GROUP_PREFIX = opt.DEFAULT_GROUP_PREFIX


# -- the source ------------------------------------------------------------------------------
# librdkafka settings the source owns. Users set the Spark-level option instead.
_REFUSED_KAFKA = {
    "enable.auto.commit": "the source commits offsets itself after each window "
    "(see kafka.group.id / groupIdPrefix); remove kafka.enable.auto.commit",
    "auto.offset.reset": "use startingOffsets (earliest | latest | group | JSON) instead",
    "enable.auto.offset.store": "the source reads by position and stores no offsets",
}

# Reader defaults that users may override through kafka.*.
_READER_DEFAULTS = {
    "isolation.level": "read_committed",
    # 32 MiB of prefetch per partition keeps a Python worker's memory bounded whatever the
    # backlog (librdkafka's default is 64 MiB).
    "queued.max.messages.kbytes": "32768",
    # Throughput with the same bound (docs/kafka-source.md, "Performance"): a range reader
    # has one partition, so one fetch may bring 10 MiB of it (librdkafka's default is
    # 1 MiB); and a full prefetch queue postpones the next fetch by 10 ms, not
    # librdkafka's 1 s, which a Python reader drains the queue well within.
    "max.partition.fetch.bytes": str(10 * 1024 * 1024),
    "fetch.queue.backoff.ms": "10",
    # A fetch of ranges at their end parks at the broker this long, and the next task's
    # first fetch waits behind it (librdkafka: 500 ms, per task; docs: "Many partitions").
    "fetch.wait.max.ms": "10",
}


@dataclass(frozen=True)
class StartSpec:
    """Where a query starts (or, for ``endingOffsets``, where a batch read ends).

    ``kind`` is ``earliest``, ``latest``, ``group``, ``offsets`` (per-partition JSON, with
    -2/-1), ``timestamps`` (per-partition millis) or ``timestamp`` (one millis for all).
    """

    kind: str
    offsets: tuple[tuple[str, int, int], ...] = ()
    timestamp: int | None = None

    def offset_map(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self.offsets}


@dataclass(frozen=True)
class ClusterSpec:
    """One Kafka cluster of the source and what to read from it."""

    name: str
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    starting: StartSpec = StartSpec("latest")
    # librdkafka settings from kafka.* (bootstrap.servers included); repr hides secrets.
    kafka: RedactedDict = field(default_factory=RedactedDict, compare=False)

    def describe_subscription(self) -> str:
        if self.subscribe:
            return f"subscribe={','.join(self.subscribe)}"
        if self.subscribe_pattern is not None:
            return f"subscribePattern={self.subscribe_pattern}"
        return "assign=" + json.dumps(_assign_json(self.assign), sort_keys=True)

    def matches(self, topic: str) -> bool:
        if self.subscribe:
            return topic in self.subscribe
        if self.subscribe_pattern is not None:
            return re.fullmatch(self.subscribe_pattern, topic) is not None
        return any(t == topic for t, _ in self.assign)

    def reader_conf(self, group_id: str) -> dict[str, str]:
        """librdkafka configuration of the executors' range readers."""
        conf: dict[str, str] = dict(_READER_DEFAULTS)
        conf.update(self.kafka)
        conf.update(
            {
                # Required by librdkafka; the readers only assign(), never join or commit.
                "group.id": conf.get("group.id", group_id),
                "enable.auto.commit": "false",
                "enable.auto.offset.store": "false",
                "enable.partition.eof": "true",
                # An offset outside the log is reported, never silently reset: that is how
                # data loss is detected (failOnDataLoss).
                "auto.offset.reset": "error",
            }
        )
        return conf


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The parsed, validated options of an ``eo_kafka`` read (picklable, no connections).

    Build it with :meth:`from_options` from Spark's string options. Option names and
    semantics are Spark's built-in Kafka source's; docs/kafka-source.md lists them.
    """

    clusters: tuple[ClusterSpec, ...]
    multi_cluster: bool = False
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
        r = OptionReader(options, family=FAMILY)
        default_start = "earliest" if batch else "latest"
        top_kafka = r.prefixed("kafka.")
        _refuse_kafka_settings(r, top_kafka)
        clusters_json = r.json(opt.CLUSTERS.spark, expect=list)
        fail_on_data_loss = read_option(r, opt.FAIL_ON_DATA_LOSS)[1]

        if clusters_json is None:
            sub = r.exclusive("subscribe", "subscribePattern", "assign", required=True)
            bootstrap = r.required(opt.BOOTSTRAP.spark, opt.BOOTSTRAP.hint)
            spec = _cluster_spec(
                r, name="", bootstrap=bootstrap, which=sub, source=None,
                kafka=top_kafka, default_start=default_start,
            )
            clusters: tuple[ClusterSpec, ...] = (spec,)
            multi = False
        else:
            for name in ("subscribe", "subscribePattern", "assign"):
                if r.has(name):
                    raise r.error(
                        name,
                        "cannot be combined with 'clusters'",
                        "put subscribe/subscribePattern/assign inside each clusters entry",
                    )
            clusters = _parse_clusters(r, clusters_json, top_kafka, default_start)
            multi = True

        ending: StartSpec | None = None
        ending_text = r.string(opt.ENDING_OFFSETS.spark)
        if ending_text is not None:
            if not batch:
                raise r.error(
                    "endingOffsets",
                    "is only valid for batch reads (spark.read)",
                    "remove it from the streaming query, or use Trigger.AvailableNow",
                )
            if ending_text.lower() == "latest":
                ending = StartSpec("latest")
            elif ending_text.lower() == "earliest":
                raise r.error("endingOffsets", "cannot be 'earliest'", "use 'latest' or JSON")
            else:
                parsed = parse_partition_offsets(ending_text, "endingOffsets", allow_earliest=False)
                ending = StartSpec("offsets", _triples(parsed))
        elif batch:
            ending = StartSpec("latest")

        max_offsets = read_option(r, opt.MAX_OFFSETS)[1]
        min_offsets = read_option(r, opt.MIN_OFFSETS)[1]
        max_delay = read_option(r, opt.MAX_TRIGGER_DELAY)[1]
        if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
            raise r.error(
                "minOffsetsPerTrigger",
                f"({min_offsets}) is larger than maxOffsetsPerTrigger ({max_offsets})",
                "make minOffsetsPerTrigger <= maxOffsetsPerTrigger",
            )
        max_bytes = read_option(r, opt.MAX_BYTES)[1]
        min_partitions = read_option(r, opt.MIN_PARTITIONS)[1]
        max_per_partition = read_option(r, opt.MAX_RECORDS_PER_PARTITION)[1]
        target_records = read_option(r, opt.TARGET_RECORDS)[1]
        include_headers = read_option(r, opt.INCLUDE_HEADERS)[1]
        wal_path = read_option(r, opt.WAL_PATH)[1]
        storage = parse_storage_options(r)
        if wal_path is not None:
            check_state_path(wal_path, storage, FAMILY, "walPath")
        elif storage:
            raise r.error(f"storage.{storage.values[0][0]}", "is set but walPath is not",
                          "storage.* options configure the store of walPath; set walPath or "
                          "remove them")
        group_id = _group_id(r, top_kafka, clusters, wal_path)
        poll_ms = read_option(r, opt.POLL_TIMEOUT)[1]
        strategy = read_option(r, opt.TIMESTAMP_STRATEGY)[1]
        arrow_batch = read_option(r, opt.ARROW_BATCH)[1]
        window = read_option(r, opt.WINDOW)[1]
        if window is not None and wal_path is None:
            raise r.error("eo.window", "needs walPath", "set walPath to the windows' WAL")
        retry_timeout = read_option(r, METADATA_RETRY_TIMEOUT)[1]
        connect_timeout = read_option(r, CONNECT_TIMEOUT)[1]
        formats = parse_formats(r, clusters)
        r.refuse_unknown(prefixes=("kafka.", SCHEMA_REGISTRY.spark))
        for c in clusters:  # the readers' whole configuration: fails here, not in a task
            check_client_config(FAMILY, c.reader_conf(group_id), "consumer",
                                option=spelled(r, c.name if multi else None))
        return cls(
            clusters=clusters,
            multi_cluster=multi,
            ending=ending,
            max_offsets_per_trigger=max_offsets,
            min_offsets_per_trigger=min_offsets,
            max_trigger_delay=float(max_delay if max_delay is not None else 900.0),
            max_bytes_per_trigger=max_bytes,
            min_partitions=min_partitions,
            max_records_per_partition=max_per_partition,
            target_records_per_partition=(DEFAULT_TARGET_RECORDS if target_records is None
                                          else target_records),
            fail_on_data_loss=fail_on_data_loss,
            include_headers=include_headers,
            group_id=group_id,
            wal_path=wal_path,
            storage=storage,
            poll_timeout=(poll_ms or 120_000) / 1000.0,
            metadata_retry_timeout=retry_timeout,
            connect_timeout=connect_timeout,
            timestamp_strategy=strategy or "error",
            arrow_batch_records=arrow_batch or 20000,
            window=window,
            formats=formats,
        )

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


def _refuse_kafka_settings(r: OptionReader, kafka: Mapping[str, str]) -> None:
    for key, why in _REFUSED_KAFKA.items():
        if key in kafka:
            raise r.error(f"kafka.{key}", "is not supported by the eo_kafka source", why)


def _triples(parsed: Mapping[tuple[str, int], int]) -> tuple[tuple[str, int, int], ...]:
    return tuple(sorted((t, p, o) for (t, p), o in parsed.items()))


def _assign_json(assign: tuple[tuple[str, int], ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for t, p in assign:
        out.setdefault(t, []).append(p)
    return out


def _parse_start(r: OptionReader, text: str | None, option: str, default: str) -> StartSpec:
    if text is None:
        return StartSpec(default)
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest", "group"):
        return StartSpec(lowered)
    if not text.strip().startswith("{"):
        raise r.error(
            option,
            f"has invalid value {text!r}",
            "use 'earliest', 'latest', 'group' or per-partition JSON "
            '{"topic": {"0": 23, "1": -2}} (-2 = earliest, -1 = latest)',
        )
    return StartSpec("offsets", _triples(parse_partition_offsets(text, option)))


def _cluster_spec(
    r: OptionReader,
    *,
    name: str,
    bootstrap: str,
    which: str | None,
    source: Mapping[str, Any] | None,
    kafka: Mapping[str, str],
    default_start: str,
) -> ClusterSpec:
    """One cluster, from the top-level options (``source=None``) or a ``clusters`` entry."""

    def get(opt: str) -> str | None:
        if source is None:
            return r.string(opt)
        for k, v in source.items():
            if k.lower() == opt.lower():
                return v if isinstance(v, str) else json.dumps(v)
        return None

    where = "" if source is None else f" (clusters entry {name!r})"
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    if which == "subscribe":
        subscribe = tuple(t.strip() for t in (get("subscribe") or "").split(",") if t.strip())
        if not subscribe:
            raise r.error("subscribe" + where, "names no topic", "give 'topicA,topicB'")
    elif which == "subscribePattern":
        pattern = get("subscribePattern") or ""
        try:
            re.compile(pattern)
        except re.error as e:
            raise r.error(
                "subscribePattern" + where, f"is not a valid regular expression ({e})",
                "give a Java/Python regex such as 'events-.*'",
            ) from None
    else:
        assign = parse_assign(get("assign") or "", "assign" + where)

    starting_text = get("startingOffsets") if source is not None else None
    if starting_text is None:
        starting_text = r.string("startingOffsets")
    by_ts_text = r.string("startingOffsetsByTimestamp")
    ts_text = r.string("startingTimestamp")
    given = [n for n, v in (("startingOffsets", starting_text),
                            ("startingOffsetsByTimestamp", by_ts_text),
                            ("startingTimestamp", ts_text)) if v is not None]
    if len(given) > 1 and source is None:
        raise OptionError(
            f"{FAMILY}: options {given} cannot be used together; set only one of "
            "startingOffsets, startingOffsetsByTimestamp, startingTimestamp",
            option=given[0],
        )
    if ts_text is not None and (source is None or starting_text is None):
        try:
            ts = int(ts_text)
        except ValueError:
            raise r.error(
                "startingTimestamp", f"must be epoch milliseconds, got {ts_text!r}",
                "give an integer such as 1700000000000",
            ) from None
        if ts < 0:
            raise r.error("startingTimestamp", "is negative", "give epoch milliseconds >= 0")
        starting = StartSpec("timestamp", timestamp=ts)
    elif by_ts_text is not None and (source is None or starting_text is None):
        parsed = parse_partition_offsets(by_ts_text, "startingOffsetsByTimestamp", timestamps=True)
        starting = StartSpec("timestamps", _triples(parsed))
    else:
        starting = _parse_start(r, starting_text, "startingOffsets" + where, default_start)

    conf = RedactedDict(kafka)
    conf["bootstrap.servers"] = bootstrap
    return ClusterSpec(
        name=name,
        bootstrap=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=starting,
        kafka=conf,
    )


def _parse_clusters(
    r: OptionReader, entries: list[Any], top_kafka: Mapping[str, str], default_start: str
) -> tuple[ClusterSpec, ...]:
    valid = (
        'give a JSON list such as [{"name": "east", "bootstrap": "h1:9092", '
        '"subscribe": "events"}, {"bootstrap": "h2:9092", "assign": {"t": [0]}}]'
    )
    if not entries:
        raise r.error("clusters", "is an empty list", valid)
    out: list[ClusterSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise r.error("clusters", f"entry {i} is not an object", valid)
        lowered = {str(k).lower(): v for k, v in entry.items()}
        bootstrap = lowered.get("bootstrap") or lowered.get("kafka.bootstrap.servers")
        if not isinstance(bootstrap, str) or not bootstrap.strip():
            raise r.error("clusters", f"entry {i} has no 'bootstrap'", valid)
        name = str(lowered.get("name") or bootstrap)
        if name in seen:
            raise r.error("clusters", f"names cluster {name!r} twice", "give unique names")
        seen.add(name)
        present = [k for k in ("subscribe", "subscribepattern", "assign") if k in lowered]
        if len(present) != 1:
            raise r.error(
                "clusters",
                f"entry {name!r} must have exactly one of subscribe, subscribePattern, assign "
                f"(has {present or 'none'})",
                valid,
            )
        which = {"subscribe": "subscribe", "subscribepattern": "subscribePattern",
                 "assign": "assign"}[present[0]]
        kafka = RedactedDict(top_kafka)
        kafka.pop("bootstrap.servers", None)
        for k, v in lowered.items():
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers":
                kafka[k[len("kafka."):]] = str(v)
        _refuse_kafka_settings(r, kafka)
        out.append(
            _cluster_spec(
                r, name=name, bootstrap=bootstrap.strip(), which=which, source=entry,
                kafka=kafka, default_start=default_start,
            )
        )
    return tuple(out)


def _group_id(
    r: OptionReader,
    kafka: Mapping[str, str],
    clusters: tuple[ClusterSpec, ...],
    wal_path: str | None,
) -> str:
    """``kafka.group.id`` as given; else ``<groupIdPrefix>-<stable identity>``.

    The identity is a hash of ``walPath`` when set (one WAL = one pipeline), else of the
    clusters and subscriptions. It never changes between runs, so lag tools keep one group.
    """
    explicit = kafka.get("group.id")
    prefix = r.string(opt.GROUP_ID_PREFIX.spark)
    if explicit is not None and prefix is not None:
        raise OptionError(
            f"{FAMILY}: options ['kafka.group.id', 'groupIdPrefix'] cannot be used together; "
            "set only one",
            option="groupIdPrefix",
        )
    if explicit is not None:
        return explicit
    if wal_path is not None:
        identity = "wal:" + wal_path
    else:
        identity = ";".join(f"{c.bootstrap}|{c.describe_subscription()}" for c in clusters)
    digest = hashlib.sha1(identity.encode(), usedforsecurity=False).hexdigest()[:12]
    return f"{prefix or DEFAULT_GROUP_PREFIX}-{digest}"

