"""The ``eo_kafka`` source, read side (DESIGN.md section 5): options, planning and the window WAL.

This module knows Kafka but not Spark. ``connectors/spark/kafka_source.py`` adapts it to
PySpark's ``DataSourceStreamReader``/``DataSourceReader``; ``connectors/kafka/windows.py``
builds the batch-window API on it; ``connectors/kafka/consumer.py`` reads the ranges.

Three objects:

- :class:`KafkaSourceOptions`: Spark's string options parsed once into a frozen, picklable
  spec (it travels to executors inside the reader);
- :class:`KafkaPlanner`: the driver-side runtime: partition discovery, watermarks,
  starting offsets, admission control, the window WAL and group commits. Its clients are
  created lazily and never pickled;
- :class:`Window`: one planned window ``{window, start, end}`` as the WAL stores it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core import failpoints
from connectors.core.errors import KafkaSourceError, OptionError
from connectors.core.options import OptionReader, RedactedDict
from connectors.kafka.offsets import (
    EARLIEST,
    LATEST,
    TP,
    OffsetRange,
    decode_offsets,
    encode_offsets,
    limit_offsets,
    parse_partition_offsets,
    plan_ranges,
    records_for_bytes,
    report_data_loss,
    split_ranges,
    total_records,
    tp_name,
)

log = logging.getLogger(__name__)

FAMILY = "eo_kafka"
WAL_KIND = "source"
#: Windows kept in the WAL after a purge, for ``wal show`` and debugging.
WAL_KEEP_WINDOWS = 100
DEFAULT_GROUP_PREFIX = "eo-kafka-source"

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
}


# -- the spec ------------------------------------------------------------------------------
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
    max_trigger_delay_s: float = 900.0
    max_bytes_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    group_id: str = DEFAULT_GROUP_PREFIX
    wal_path: str | None = None
    poll_timeout_s: float = 120.0
    timestamp_strategy: str = "error"
    arrow_batch_records: int = 20000
    #: ``KafkaWindows`` pins a batch read to one window of the WAL with this.
    window: int | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, batch: bool = False) -> KafkaSourceOptions:
        """Parse Spark's options. ``batch=True`` for ``spark.read`` (allows endingOffsets)."""
        r = OptionReader(options, family=FAMILY)
        default_start = "earliest" if batch else "latest"
        top_kafka = r.prefixed("kafka.")
        _refuse_kafka_settings(r, top_kafka)
        clusters_json = r.json("clusters", expect=list)
        fail_on_data_loss = r.boolean("failOnDataLoss", True)

        if clusters_json is None:
            sub = r.exclusive("subscribe", "subscribePattern", "assign", required=True)
            bootstrap = r.required("kafka.bootstrap.servers", "e.g. 'host1:9092,host2:9092'")
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
        ending_text = r.string("endingOffsets")
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

        max_offsets = r.integer("maxOffsetsPerTrigger", None, minimum=1)
        min_offsets = r.integer("minOffsetsPerTrigger", None, minimum=1)
        max_delay = r.duration("maxTriggerDelay", 900.0, minimum=0)
        if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
            raise r.error(
                "minOffsetsPerTrigger",
                f"({min_offsets}) is larger than maxOffsetsPerTrigger ({max_offsets})",
                "make minOffsetsPerTrigger <= maxOffsetsPerTrigger",
            )
        max_bytes = r.integer("maxBytesPerTrigger", None, minimum=1)
        min_partitions = r.integer("minPartitions", None, minimum=1)
        max_per_partition = r.integer("maxRecordsPerPartition", None, minimum=1)
        include_headers = r.boolean("includeHeaders", False)
        wal_path = r.string("walPath")
        if wal_path is not None:
            from connectors.core.storage import storage_for

            storage_for(wal_path)  # refuses object stores and bad URLs now, not mid-query
        group_id = _group_id(r, top_kafka, clusters, wal_path)
        poll_ms = r.integer("kafkaConsumer.pollTimeoutMs", 120_000, minimum=1)
        strategy = r.choice(
            "startingOffsetsByTimestampStrategy", ["error", "latest"], default="error"
        )
        arrow_batch = r.integer("arrowBatchRecords", 20000, minimum=1)
        window = r.integer("eo.window", None, minimum=0)
        if window is not None and wal_path is None:
            raise r.error("eo.window", "needs walPath", "set walPath to the windows' WAL")
        r.warn_unknown(prefixes=("kafka.",))
        return cls(
            clusters=clusters,
            multi_cluster=multi,
            ending=ending,
            max_offsets_per_trigger=max_offsets,
            min_offsets_per_trigger=min_offsets,
            max_trigger_delay_s=float(max_delay if max_delay is not None else 900.0),
            max_bytes_per_trigger=max_bytes,
            min_partitions=min_partitions,
            max_records_per_partition=max_per_partition,
            fail_on_data_loss=fail_on_data_loss,
            include_headers=include_headers,
            group_id=group_id,
            wal_path=wal_path,
            poll_timeout_s=(poll_ms or 120_000) / 1000.0,
            timestamp_strategy=strategy or "error",
            arrow_batch_records=arrow_batch or 20000,
            window=window,
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
        return encode_offsets(offsets, self.multi_cluster)

    def decode(self, obj: Mapping[str, Any]) -> dict[TP, int]:
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


def _parse_assign(r: OptionReader, text: str, option: str) -> tuple[tuple[str, int], ...]:
    valid = 'give JSON like {"topicA": [0, 1], "topicB": [2]}'
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        raise r.error(option, "is not valid JSON", valid) from None
    if not isinstance(obj, dict) or not obj:
        raise r.error(option, "must be a non-empty JSON object", valid)
    out: list[tuple[str, int]] = []
    for topic, parts in obj.items():
        if not isinstance(parts, list) or not parts:
            raise r.error(option, f"has no partition list for topic {topic!r}", valid)
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise r.error(option, f"has an invalid partition {p!r} in {topic!r}", valid)
            out.append((topic, p))
    return tuple(sorted(set(out)))


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
        assign = _parse_assign(r, get("assign") or "", "assign" + where)

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
    prefix = r.string("groupIdPrefix")
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


# -- windows -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One planned window: ``[start, end)`` per partition, as Spark offset JSON dicts."""

    window: int
    start: dict[str, Any]
    end: dict[str, Any]

    def record(self) -> dict[str, Any]:
        return {"window": self.window, "start": self.start, "end": self.end}


# -- the planner ---------------------------------------------------------------------------
class KafkaPlanner:
    """Driver-side runtime of the source: metadata, offsets, admission control, WAL, commits.

    Picklable: its clients are created on first use and dropped by ``__getstate__``, so the
    Spark reader that owns it can travel to executors without a live connection.
    """

    def __init__(self, opts: KafkaSourceOptions) -> None:
        self.opts = opts
        self._admins: dict[str, Any] = {}
        self._committers: dict[str, Any] = {}
        self._wal: Any = None
        self._avg_record_bytes: float | None = None
        self._avg_samples = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admins"] = {}
        state["_committers"] = {}
        state["_wal"] = None
        return state

    # -- clients ---------------------------------------------------------------------------
    def admin(self, cluster: ClusterSpec) -> Any:
        client = self._admins.get(cluster.name)
        if client is None:
            from confluent_kafka.admin import AdminClient

            conf: dict[str, Any] = {k: v for k, v in cluster.kafka.items() if _admin_key(k)}
            client = AdminClient(conf)
            self._admins[cluster.name] = client
        return client

    def committer(self, cluster: ClusterSpec) -> Any:
        """A consumer in the source's group; it only commits offsets, never subscribes."""
        client = self._committers.get(cluster.name)
        if client is None:
            from confluent_kafka import Consumer

            conf = cluster.reader_conf(self.opts.group_id)
            conf["group.id"] = self.opts.group_id
            client = Consumer(conf)
            self._committers[cluster.name] = client
        return client

    def close(self) -> None:
        for c in self._committers.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110 - closing on stop; nothing to recover
                pass
        self._committers = {}
        self._admins = {}

    @property
    def wal(self) -> Any:
        if self.opts.wal_path is None:
            return None
        if self._wal is None:
            from connectors.core.wal import WriteAheadLog

            self._wal = WriteAheadLog.open(self.opts.wal_path, WAL_KIND)
        return self._wal

    # -- metadata --------------------------------------------------------------------------
    def partitions(self) -> dict[TP, None]:
        """Current partitions matched by every cluster's subscription (sorted)."""
        out: dict[TP, None] = {}
        for c in self.opts.clusters:
            try:
                md = self.admin(c).list_topics(timeout=self.opts.poll_timeout_s)
            except Exception as e:
                raise KafkaSourceError(
                    f"eo_kafka: cannot list topics of cluster {c.name or c.bootstrap}: {e}"
                ) from e
            if c.assign:
                for t, p in c.assign:
                    meta = md.topics.get(t)
                    if meta is not None and meta.error is None and p in meta.partitions:
                        out[(c.name, t, p)] = None
                continue
            for topic, meta in md.topics.items():
                if meta.error is not None or topic.startswith("__"):
                    continue
                if c.matches(topic):
                    for p in meta.partitions:
                        out[(c.name, topic, p)] = None
        return dict.fromkeys(sorted(out))

    def _list_offsets(self, tps: list[TP], spec_for: Any) -> dict[TP, int]:
        from confluent_kafka import IsolationLevel, TopicPartition

        out: dict[TP, int] = {}
        for c in self.opts.clusters:
            mine = [tp for tp in tps if tp[0] == c.name]
            if not mine:
                continue
            isolation = (
                IsolationLevel.READ_COMMITTED
                if c.reader_conf(self.opts.group_id)["isolation.level"] == "read_committed"
                else IsolationLevel.READ_UNCOMMITTED
            )
            request = {TopicPartition(tp[1], tp[2]): spec_for(tp) for tp in mine}
            try:
                futures = self.admin(c).list_offsets(
                    request, isolation_level=isolation, request_timeout=self.opts.poll_timeout_s
                )
                for ktp, fut in futures.items():
                    out[(c.name, ktp.topic, ktp.partition)] = fut.result().offset
            except Exception as e:
                raise KafkaSourceError(
                    f"eo_kafka: ListOffsets failed on cluster {c.name or c.bootstrap} for "
                    f"{[tp_name(tp) for tp in mine][:5]}: {e}"
                ) from e
        return out

    def latest(self, tps: list[TP]) -> dict[TP, int]:
        """High watermarks (the last stable offset under read_committed)."""
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.latest()
        return self._list_offsets(tps, lambda _tp: spec)

    def earliest(self, tps: list[TP]) -> dict[TP, int]:
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.earliest()
        return self._list_offsets(tps, lambda _tp: spec)

    def for_times(self, times: Mapping[TP, int]) -> dict[TP, int]:
        """First offset with timestamp >= the given millis; -1 where there is none."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(list(times), lambda tp: OffsetSpec.for_timestamp(times[tp]))

    def group_offsets(self, cluster: ClusterSpec, tps: list[TP]) -> dict[TP, int]:
        """The source group's committed offsets (absent where the group has none)."""
        from confluent_kafka import TopicPartition

        mine = [TopicPartition(t, p) for c, t, p in tps if c == cluster.name]
        if not mine:
            return {}
        try:
            got = self.committer(cluster).committed(mine, timeout=self.opts.poll_timeout_s)
        except Exception as e:
            raise KafkaSourceError(
                f"eo_kafka: cannot fetch committed offsets of group {self.opts.group_id!r} "
                f"on cluster {cluster.name or cluster.bootstrap}: {e}"
            ) from e
        return {(cluster.name, k.topic, k.partition): k.offset for k in got if k.offset >= 0}

    # -- starting and latest offsets -------------------------------------------------------
    def initial_offsets(self) -> dict[TP, int]:
        """Concrete starting offsets of every current partition (Spark's initialOffset)."""
        tps = list(self.partitions())
        out: dict[TP, int] = {}
        for c in self.opts.clusters:
            mine = [tp for tp in tps if tp[0] == c.name]
            out.update(self._resolve(c, c.starting, mine, "startingOffsets"))
        return out

    def ending_offsets(self, tps: list[TP]) -> dict[TP, int]:
        spec = self.opts.ending or StartSpec("latest")
        out: dict[TP, int] = {}
        for c in self.opts.clusters:
            mine = [tp for tp in tps if tp[0] == c.name]
            out.update(self._resolve(c, spec, mine, "endingOffsets"))
        return out

    def _resolve(
        self, c: ClusterSpec, spec: StartSpec, tps: list[TP], option: str
    ) -> dict[TP, int]:
        if not tps and spec.kind not in ("offsets", "timestamps"):
            return {}
        if spec.kind == "earliest":
            return self.earliest(tps)
        if spec.kind == "latest":
            return self.latest(tps)
        if spec.kind == "group":
            committed = self.group_offsets(c, tps)
            missing = [tp for tp in tps if tp not in committed]
            committed.update(self.earliest(missing) if missing else {})
            return committed
        if spec.kind == "timestamp":
            assert_ts = spec.timestamp if spec.timestamp is not None else 0
            return self._by_time(c, {tp: assert_ts for tp in tps}, "startingTimestamp")
        given = spec.offset_map()
        wanted = {(c.name, t, p): v for (t, p), v in given.items()}
        unknown = [tp for tp in wanted if tp not in tps]
        missing = [tp for tp in tps if tp not in wanted]
        if unknown or missing:
            raise KafkaSourceError(
                f"eo_kafka: option '{option}' must name exactly the partitions of the "
                f"subscription: unknown {[tp_name(t) for t in unknown]}, missing "
                f"{[tp_name(t) for t in missing]}; current partitions "
                f"{[tp_name(t) for t in tps][:20]}"
            )
        if spec.kind == "timestamps":
            return self._by_time(c, wanted, "startingOffsetsByTimestamp")
        out = {tp: v for tp, v in wanted.items() if v >= 0}
        earliest = [tp for tp, v in wanted.items() if v == EARLIEST]
        latest = [tp for tp, v in wanted.items() if v == LATEST]
        if earliest:
            out.update(self.earliest(earliest))
        if latest:
            out.update(self.latest(latest))
        return out

    def _by_time(self, c: ClusterSpec, times: Mapping[TP, int], option: str) -> dict[TP, int]:
        found = self.for_times(times)
        missing = [tp for tp, off in found.items() if off < 0]
        if missing and self.opts.timestamp_strategy == "error":
            raise KafkaSourceError(
                f"eo_kafka: option '{option}': no record at or after the timestamp in "
                f"{[tp_name(tp) for tp in missing]}; use an earlier timestamp, or set "
                "startingOffsetsByTimestampStrategy=latest to start at the end there"
            )
        if missing:
            found.update(self.latest(missing))
        return found

    def next_end(
        self,
        start: Mapping[TP, int],
        *,
        latest: Mapping[TP, int],
        max_records: int | None,
        max_bytes: int | None,
    ) -> dict[TP, int]:
        """The end of the next window from ``start`` (admission control applied).

        - partitions of ``start`` that disappeared: data loss (error, or dropped with a
          warning under failOnDataLoss=false);
        - new partitions join from earliest;
        - the budget (``max_records``, and ``max_bytes`` through the average record size)
          is split across partitions in proportion to their backlog.
        """
        fail = self.opts.fail_on_data_loss
        gone = [tp for tp in start if tp not in latest]
        for tp in gone:
            report_data_loss(
                fail,
                f"{tp_name(tp)} no longer exists (topic or partition deleted); offsets from "
                f"{start[tp]} on are not readable",
            )
        for tp, off in latest.items():
            if tp in start and off < start[tp] and fail:
                report_data_loss(
                    True,
                    f"{tp_name(tp)}: the start offset {start[tp]} is beyond the end of the "
                    f"log ({off}); offsets were deleted or the topic was recreated",
                )
        new = [tp for tp in latest if tp not in start]
        eff_start = {tp: start[tp] for tp in latest if tp in start}
        if new:
            eff_start.update(self.earliest(new))
        budget = max_records
        if max_bytes is not None:
            by_bytes = records_for_bytes(max_bytes, self.avg_record_bytes(eff_start, latest))
            budget = by_bytes if budget is None else min(budget, by_bytes)
        if budget is None:
            end = dict(latest)
        else:
            end = limit_offsets(eff_start, latest, budget)
        for tp in new:  # a new partition is part of the offsets from now on, data or not
            end.setdefault(tp, eff_start[tp])
        return end

    def avg_record_bytes(self, start: Mapping[TP, int], latest: Mapping[TP, int]) -> float:
        """Average record size (key + value + headers), sampled from the backlog.

        Re-sampled every 10 windows, so a changing record size is followed without
        paying a fetch per trigger.
        """
        if self._avg_record_bytes is not None and self._avg_samples % 10 != 0:
            self._avg_samples += 1
            return self._avg_record_bytes
        self._avg_samples += 1
        backlog = sorted(
            ((latest[tp] - start.get(tp, 0), tp) for tp in latest if latest[tp] > start.get(tp, 0)),
            reverse=True,
        )
        if not backlog:
            return self._avg_record_bytes or 1024.0
        _, tp = backlog[0]
        from connectors.kafka.consumer import sample_record_bytes

        c = self.opts.cluster(tp[0])
        avg = sample_record_bytes(
            c.reader_conf(self.opts.group_id), tp[1], tp[2], start.get(tp, 0), latest[tp]
        )
        if avg is not None:
            self._avg_record_bytes = avg
        return self._avg_record_bytes or 1024.0

    # -- planning --------------------------------------------------------------------------
    def ranges(self, start: Mapping[TP, int], end: Mapping[TP, int]) -> list[OffsetRange]:
        """The Spark partitions of window ``[start, end)``: a pure function of its inputs."""
        ranges = plan_ranges(start, end, fail_on_data_loss=self.opts.fail_on_data_loss)
        return split_ranges(
            ranges, self.opts.min_partitions, self.opts.max_records_per_partition
        )

    # -- the window WAL --------------------------------------------------------------------
    def record_window(self, start: dict[str, Any], end: dict[str, Any]) -> int | None:
        """Append ``{window, start, end}`` to ``<walPath>/source``; return the window id.

        The id is the WAL's own counter: a window identical to the last record is a replay
        and keeps its id; any other window gets ``last + 1`` (0 for an empty WAL). In
        streaming, Spark re-plans a replayed batch with the same (start, end) from its
        offset log, so the replay maps to the same window id.
        """
        wal = self.wal
        if wal is None or start == end:
            return None
        last = wal.last()
        if last is not None:
            seq, rec = last
            if rec.get("start") == start and rec.get("end") == end:
                return int(seq)
            window = seq + 1
        else:
            window = 0
        wal.append(window, Window(window, start, end).record())
        log.info("eo_kafka: window %d planned in %r", window, wal)
        return window

    def find_window(self, end: dict[str, Any], search: int = 20) -> int | None:
        """The id of the (recent) window that ends at ``end``."""
        wal = self.wal
        if wal is None:
            return None
        for seq in list(reversed(wal.seqs()))[:search]:
            rec = wal.get(seq)
            if rec is not None and rec.get("end") == end:
                return int(seq)
        return None

    def commit(self, end: dict[str, Any], window: int | None = None) -> int | None:
        """Spark's ``commit(end)`` / a window's commit.

        1. mark the window that ends at ``end`` committed in the WAL;
        2. commit ``end`` to the consumer group, so lag tools see the pipeline;
        3. purge old windows (the newest ``WAL_KEEP_WINDOWS`` stay for inspection).
        """
        if window is None:
            window = self.find_window(end)
        batch = -1 if window is None else window
        # 1.
        if window is not None:
            self.wal.commit(window, {"end": end})
        failpoints.hit("kafka_source.after_wal_commit", batch)
        # 2.
        self.commit_group(self.opts.decode(end))
        failpoints.hit("kafka_source.after_group_commit", batch)
        # 3.
        if window is not None:
            self.wal.purge(window, keep_last=WAL_KEEP_WINDOWS)
        return window

    def commit_group(self, offsets: Mapping[TP, int]) -> None:
        """Commit ``offsets`` (next offsets to read) to the source's consumer group.

        Failure only costs lag visibility, never correctness (Spark's checkpoint or the
        WAL drives replays), so it is logged, not raised.
        """
        from confluent_kafka import TopicPartition

        for c in self.opts.clusters:
            mine = [TopicPartition(t, p, o) for (cn, t, p), o in sorted(offsets.items())
                    if cn == c.name]
            if not mine:
                continue
            try:
                self.committer(c).commit(offsets=mine, asynchronous=False)
            except Exception as e:  # noqa: BLE001 - monitoring only, see docstring
                log.warning(
                    "eo_kafka: committing offsets to group %r on %s failed: %s",
                    self.opts.group_id, c.name or c.bootstrap, e,
                )

    # -- batch windows ---------------------------------------------------------------------
    def next_window(self) -> Window | None:
        """The window a batch read with ``walPath`` gets (DESIGN.md section 5).

        - the last window is uncommitted: it again, with exactly the same ranges;
        - otherwise a new window ``[last end, latest)`` (limited by maxOffsetsPerTrigger /
          maxBytesPerTrigger), appended to the WAL before any data is read;
        - None when there is nothing new to read.
        """
        wal = self.wal
        if wal is None:
            raise KafkaSourceError("eo_kafka: batch windows need the walPath option")
        last = wal.last()
        if last is not None and not wal.is_committed(last[0]):
            seq, rec = last
            return Window(int(seq), rec["start"], rec["end"])
        if last is not None:
            start = self.opts.decode(last[1]["end"])
            window = last[0] + 1
        else:
            start = self.initial_offsets()
            window = 0
        tps = sorted(set(self.partitions()) | set(start))
        current = [tp for tp in tps if tp in self.partitions()]
        latest = self.latest(current)
        end = self.next_end(
            start,
            latest=latest,
            max_records=self.opts.max_offsets_per_trigger,
            max_bytes=self.opts.max_bytes_per_trigger,
        )
        if total_records(start, end) == 0 and set(end) <= set(start):
            return None
        w = Window(window, self.opts.encode(start), self.opts.encode(end))
        wal.append(window, w.record())
        log.info("eo_kafka: batch window %d opened: %s", window, w.end)
        return w

    def window(self, window: int) -> Window:
        wal = self.wal
        rec = None if wal is None else wal.get(window)
        if rec is None:
            raise KafkaSourceError(
                f"eo_kafka: window {window} is not in the WAL {self.opts.wal_path!r} "
                "(purged, or a different walPath)"
            )
        return Window(window, rec["start"], rec["end"])


def _admin_key(key: str) -> bool:
    # Consumer-only settings make AdminClient warn; pass the connection/security ones.
    consumer_only = (
        "group.", "isolation.level", "auto.", "enable.auto", "enable.partition.eof",
        "queued.", "fetch.", "max.poll", "session.timeout", "heartbeat", "partition.assignment",
        "check.crcs", "group.id",
    )
    return not key.startswith(consumer_only)


def now() -> float:
    return time.monotonic()
