"""Commit facts of the transactional Kafka sink (docs/design.md, "Kafka sink:
transactional path", steps 2T, 2E and 3T; docs/kafka-sink.md, "Commit facts and offsets
retention").

A task attempt of batch B, writer w commits its rows and a *commit fact* in one Kafka
transaction, so data and fact become visible together or not at all. The fact is a
consumer-group offset, sent with ``send_offsets_to_transaction``:

- group ``eo-sink-<sink_id>-w<w>`` (one per writer partition, like the transactional.id
  ``<sink_id>-<w>``, so no writer ever waits on another's transaction);
- partition 0 of the **facts topic** (``factsTopic``, default ``eo-sink-facts``): one
  partition that nothing ever writes to, so its log end offset stays 0;
- offset 0 (:data:`FACT_OFFSET`), and the batch id with the attempt's counts in the offset's
  metadata (small JSON), which a retry reports instead of writing again.

Offset 0 on an empty partition is a lag of 0: Kafka's consumer-group command and lag
monitors see the sink's groups as caught up, never as consumers falling behind (an offset
B on a partition of the target topic showed the whole partition as lag). The broker refuses
offsets of topics that do not exist, so the driver creates the facts topic when it is
missing (:func:`ensure_facts_topic`).

A retry reads the fact back with one stable offset fetch (a ``read_committed`` consumer's
``committed()``, which librdkafka sends with ``require_stable``: the broker answers only
once no transaction holding an offset of that group is pending; the retry's
``init_transactions`` has just completed or aborted the only one that could be). Metadata
naming batch B means "batch B of this writer committed"; anything else means it did not.

**Expiry.** Kafka deletes the offsets of a group without members
``offsets.retention.minutes`` after their commit (7 days by default). A fact is needed only
until the driver's commit of its batch, but a query that crashed in between and stayed down
longer would find no fact and write the batch again. So every attempt that is about to open
a transaction first creates its task's started marker (``started/B/w`` in ``walPath``,
create-if-absent, holding the time). A later attempt of (B, w) that finds no fact but an
older marker than the broker's retention (minus a margin for clocks) cannot tell whether the
earlier attempt committed: :func:`guard_expiry` refuses, naming the batch, the times and
what to check, unless ``expiredFactPolicy`` says what to do.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from connectors.core.errors import KafkaSinkError
from connectors.core.sink_state import SinkState
from connectors.kafka import clients
from connectors.kafka.common import (
    FAMILY,
    SHORT_LIVED_RECONNECT_BACKOFF_MS,
    ClientCache,
    Lease,
    retrying,
)
from connectors.kafka.sink import producers

log = logging.getLogger(__name__)

GROUP_PREFIX = "eo-sink-"
#: The default facts topic, shared by every transactional sink of a cluster.
DEFAULT_FACTS_TOPIC = "eo-sink-facts"
#: Every fact is the offset 0 of partition 0 of the facts topic; the batch is in the metadata.
FACT_OFFSET = 0
# Kafka's offset.metadata.max.bytes default is 4096; keep well inside it.
_MAX_METADATA = 3000
#: What the sink assumes when it may not read the broker's ``offsets.retention.minutes``
#: (DescribeConfigs on the cluster): an hour, far below Kafka's default of 7 days, so an
#: unreadable setting errs towards refusing.
FALLBACK_RETENTION_S = 3600.0
#: Reads of a fact whose metadata confluent-kafka could not decode before the task fails
#: (:meth:`CommitFact.decode` says why that happens).
_UNREADABLE_TRIES = 5
#: Policies for a fact that may have expired (``expiredFactPolicy``).
EXPIRED_FACT_POLICIES = ("fail", "rewrite", "skip")


def group_id(sink_id: str, writer: int) -> str:
    """The consumer group holding writer ``writer``'s commit facts."""
    return f"{GROUP_PREFIX}{sink_id}-w{writer}"


def ensure_facts_topic(conf: Any, topic: str, timeout: float) -> bool:
    """Create the facts topic (one partition, the broker's replication factor) unless it
    exists; True if this call created it. Another sink creating it at the same time is
    fine. Through the process's cluster (:meth:`connectors.kafka.clients.KafkaCluster.
    create_topic`: the wire client, as every admin request in a query's processes,
    docs/design.md, "Kafka nodes that move or go away")."""
    with clients.lease(conf) as cluster:
        created = cluster.create_topic(topic, 1, who=f"{FAMILY} sink", error=KafkaSinkError,
                                       timeout=timeout)
    if created:
        log.info("%s: created the commit-facts topic %r (1 partition)", FAMILY, topic)
    return created


def scope_of(wal_path: str) -> str:
    """The fact's scope: which output it belongs to. Facts of every sink share one topic and
    the group names only the sink id, so a fact also names the sink's ``walPath`` (a digest):
    a sink id used again with another ``walPath`` (a new output) never takes the old
    output's facts for its own."""
    return hashlib.sha256(wal_path.rstrip("/").encode()).hexdigest()[:16]


@dataclass
class CommitFact:
    """What a committed task attempt recorded about itself."""

    batch_id: int
    rows: int
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)
    scope: str = ""

    def encode(self) -> str:
        body = {"b": self.batch_id, "s": self.scope, "rows": self.rows,
                "partitions": self.partitions}
        text = json.dumps(body, separators=(",", ":"))
        if len(text) > _MAX_METADATA:  # very many target partitions: keep the count only
            text = json.dumps({"b": self.batch_id, "s": self.scope, "rows": self.rows},
                              separators=(",", ":"))
        return text

    @classmethod
    def found(cls, offset: int, metadata: str | None, batch_id: int,
              scope: str) -> CommitFact | None:
        """The fact of ``batch_id`` in ``scope`` that a group's committed ``offset`` and its
        ``metadata`` hold, else None (no fact, another batch's, another output's)."""
        if offset != FACT_OFFSET:
            return None
        fact = cls.decode(metadata)
        if fact is None or (fact.batch_id, fact.scope) != (batch_id, scope):
            return None
        return fact

    @classmethod
    def decode(cls, metadata: str | None) -> CommitFact | None:
        """The fact the metadata holds, None if it holds none (no offset, or not ours).

        Only the first JSON value counts: confluent-kafka 2.x builds the metadata string
        as if librdkafka's copy ended with a NUL byte, which it does not, and so may append
        whatever follows it in memory (seen on Kafka 4.1.2 with confluent-kafka 2.16.1).
        The wire path stores a NUL after the JSON, which ends such a read where it should;
        for facts without one, the JSON's own end is the end."""
        try:
            body, _ = json.JSONDecoder().raw_decode((metadata or "{}").lstrip())
        except ValueError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("b"), int):
            return None
        return cls(batch_id=body["b"], rows=int(body.get("rows", 0)),
                   partitions=body.get("partitions") or {}, scope=str(body.get("s", "")))


def read_fact_wire(cluster: Any, sink_id: str, writer: int, facts_topic: str, batch_id: int,
                   scope: str, timeout: float) -> CommitFact | None:
    """:func:`read_fact` over the wire client (``cluster``: a
    :class:`connectors.kafka.wire.cluster.Cluster`): one stable OffsetFetch to the group's
    coordinator, on the connections the task's producer uses."""
    from connectors.kafka.wire import admin

    group = group_id(sink_id, writer)
    got = admin.committed(cluster, group, facts_topic, [0], timeout,
                          who=f"{FAMILY} {sink_id}").get(0)
    return None if got is None else CommitFact.found(*got, batch_id, scope)


def read_fact(conf: Any, sink_id: str, writer: int, facts_topic: str, batch_id: int,
              scope: str, timeout: float) -> CommitFact | None:
    """The fact of (batch_id, writer) in ``scope`` when its transaction committed, else
    None."""
    lease = fact_writer(conf, sink_id, writer, facts_topic, timeout)
    try:
        return lease.client.read(facts_topic, batch_id, scope, timeout)
    finally:
        lease.release()


# -- expiry ---------------------------------------------------------------------------------
def guard_expiry(state: SinkState, conf: Any, sink_id: str, batch_id: int, writer: int,
                 policy: str, timeout: float) -> tuple[bool, bool]:
    """Before an attempt of (batch_id, writer) that found no commit fact opens a
    transaction: create the task's started marker, or, if an earlier attempt created it,
    make sure its fact cannot have expired since. Returns ``(write, earlier)``: ``write``
    True to write the task's rows, False (``expiredFactPolicy=skip``) to treat the task as
    committed; ``earlier`` True when an earlier attempt had created the marker (and, with no
    fact, never committed: the fence aborted or found aborted its transaction). Raises
    with ``fail``."""
    now_ms = int(time.time() * 1000)
    try:
        state.put_marker(batch_id, writer, json.dumps(
            {"started_ms": now_ms, "sink_id": sink_id}, separators=(",", ":")).encode())
        return True, False  # no earlier attempt of (B, w) ever opened a transaction
    except FileExistsError:
        marker = state.get_marker(batch_id, writer) or {}
    started_ms = int(marker.get("started_ms", now_ms))
    age_s = max(0.0, (now_ms - started_ms) / 1000)
    retention_s, known = offsets_retention(conf, timeout)
    if age_s < retention_s - expiry_margin(retention_s):
        return True, True  # any fact of that attempt is younger than the retention: none
    started = datetime.fromtimestamp(started_ms / 1000, tz=timezone.utc)
    setting = (f"the broker's offsets.retention.minutes ({retention_s / 60:g} min)" if known
               else f"{retention_s / 60:g} min (assumed: the broker's offsets.retention.minutes "
                    "could not be read; grant DESCRIBE_CONFIGS on the cluster)")
    what = (f"{FAMILY} {sink_id}: batch {batch_id}, writer {writer}: an earlier attempt "
            f"began {age_s / 3600:.1f} h ago ({started:%Y-%m-%d %H:%M:%S} UTC), longer ago than "
            f"{setting}, and its commit fact (group {group_id(sink_id, writer)!r}) is not "
            "there: Kafka may have deleted it, so whether that attempt's transaction committed "
            "cannot be told")
    if policy == "rewrite":
        log.warning("%s; expiredFactPolicy=rewrite: writing the task's rows again (they may "
                    "now be in the topic twice)", what)
        return True, True
    if policy == "skip":
        log.warning("%s; expiredFactPolicy=skip: treating the task as committed (its rows are "
                    "not written)", what)
        return False, True
    raise KafkaSinkError(
        f"{what}. Nothing was written. Check with a read_committed consumer whether the "
        f"target topic holds batch {batch_id}'s rows of this writer, then restart once with "
        "expiredFactPolicy=skip if it does or expiredFactPolicy=rewrite if it does not, and "
        "set it back to fail (docs/kafka-sink.md, \"Commit facts and offsets retention\")")


def expiry_margin(retention_s: float) -> float:
    """Slack for clocks between executors: a tenth of the retention, at most 10 minutes."""
    return min(retention_s / 10, 600.0)


_RETENTION: dict[str, tuple[float, bool]] = {}
_RETENTION_LOCK = threading.Lock()


def offsets_retention(conf: Any, timeout: float) -> tuple[float, bool]:
    """``(seconds, known)``: the broker's ``offsets.retention.minutes`` (DescribeConfigs of
    one broker, once per process and cluster), or :data:`FALLBACK_RETENTION_S` when it
    cannot be read."""
    key = str(conf.get("bootstrap.servers"))
    with _RETENTION_LOCK:
        if key in _RETENTION:
            return _RETENTION[key]
    try:
        found = (_describe_retention(conf, timeout), True)
    except Exception as e:  # noqa: BLE001 - any failure: assume the short fallback
        log.warning("%s: cannot read the broker's offsets.retention.minutes (%s); assuming "
                    "%g min for the commit-fact expiry check", FAMILY, e,
                    FALLBACK_RETENTION_S / 60)
        found = (FALLBACK_RETENTION_S, False)
    with _RETENTION_LOCK:
        _RETENTION[key] = found
    return found


def _describe_retention(conf: Any, timeout: float) -> float:
    """The broker's ``offsets.retention.minutes`` in seconds (DescribeConfigs, through the
    process's cluster)."""
    with clients.lease(conf) as cluster:
        value = cluster.broker_config("offsets.retention.minutes", who=f"{FAMILY} sink",
                                      timeout=timeout)
    if value is None:
        raise KafkaSinkError(f"{FAMILY}: the broker did not report offsets.retention.minutes")
    return float(value) * 60


# -- per-worker cache: a FactWriter per (producer configuration, group) ------------------------
#: A new client costs a connection set-up (~60 ms on loopback) per task attempt; a worker
#: keeps the fact clients of the writer partitions it served last (each is a librdkafka
#: consumer with its own threads, so not many).
MAX_CACHED = 8
_CACHE: ClientCache[FactWriter] = ClientCache("commit-fact", MAX_CACHED,
                                              lambda facts: facts.close())


def fact_writer(conf: Any, sink_id: str, writer: int, facts_topic: str,
                timeout: float) -> Lease[FactWriter]:
    """The worker's :class:`FactWriter` of (sink_id, writer), created on first use, held
    until ``Lease.release()`` (``Lease.discard()`` after an error). The first one of a
    process and cluster makes sure the facts topic exists (the driver did, unless the sink's
    protocol is driven without it)."""
    conf_key = ensure_once(conf, facts_topic, timeout)
    return _CACHE.acquire((conf_key, sink_id, writer), lambda: FactWriter(conf, sink_id, writer))


def ensure_once(conf: Any, facts_topic: str, timeout: float) -> tuple[tuple[str, str], ...]:
    """:func:`ensure_facts_topic`, once per process, configuration and topic (a task of a
    sink driven without the driver's check); returns the configuration's key."""
    conf_key = tuple(sorted((k, str(v)) for k, v in conf.items()))
    if (conf_key, facts_topic) not in _TOPICS_SEEN:
        ensure_facts_topic(conf, facts_topic, timeout)
        _TOPICS_SEEN.add((conf_key, facts_topic))
    return conf_key


_TOPICS_SEEN: set[tuple[Any, str]] = set()


def close_cached_fact_writers() -> None:
    _CACHE.clear()


class FactWriter:
    """Reads a writer's commit fact, and adds the next one to the open transaction of a
    producer: a consumer that never joins the group, cached per worker (``fact_writer``)."""

    def __init__(self, conf: Any, sink_id: str, writer: int) -> None:
        from confluent_kafka import Consumer

        self.group = group_id(sink_id, writer)
        consumer_conf = producers.consumer_config(conf, sink_id, "read_committed")
        consumer_conf["group.id"] = self.group
        consumer_conf.setdefault("reconnect.backoff.ms",
                                 SHORT_LIVED_RECONNECT_BACKOFF_MS)
        # Never joins the group: it fetches the group's committed offset (read_committed
        # makes librdkafka ask with require_stable) and lends send_offsets_to_transaction
        # the group's metadata (generation -1, no member id), which the broker accepts for
        # a group without members.
        self._consumer = Consumer(consumer_conf)
        self._sink_id, self._writer = sink_id, writer

    def read(self, facts_topic: str, batch_id: int, scope: str,
             timeout: float) -> CommitFact | None:
        """One OffsetFetch (require_stable) to the group's coordinator; transient errors (a
        coordinator loading or moving, an offset still unstable) are asked again for up to
        ``timeout`` seconds."""
        from confluent_kafka import KafkaException, TopicPartition

        def fetch() -> tuple[int, str | None] | None:
            for _ in range(_UNREADABLE_TRIES):
                for tp in self._consumer.committed([TopicPartition(facts_topic, 0)], timeout=30):
                    if tp.error is not None:
                        raise KafkaException(tp.error)
                    try:
                        return int(tp.offset), tp.metadata
                    except UnicodeDecodeError:  # bytes past the metadata's end (decode)
                        break
                else:
                    return None
            raise KafkaSinkError(
                f"{FAMILY} {self._sink_id}: the commit fact of writer {self._writer} (group "
                f"{self.group!r}) could not be decoded in {_UNREADABLE_TRIES} reads; nothing "
                "was written, and the task's retry reads it again")

        got = retrying(fetch, what=f"{FAMILY} {self._sink_id}: commit fact of writer "
                                   f"{self._writer} (group {self.group!r})",
                       error=KafkaSinkError, timeout=timeout)
        return None if got is None else CommitFact.found(*got, batch_id, scope)

    def send(self, producer: Any, facts_topic: str, fact: CommitFact, timeout: float) -> None:
        from confluent_kafka import TopicPartition

        producer.send_offsets_to_transaction(
            [TopicPartition(facts_topic, 0, FACT_OFFSET, metadata=fact.encode())],
            self._consumer.consumer_group_metadata(), timeout)

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as e:  # noqa: BLE001 - nothing to release beyond the handle
            log.debug("%s: closing the fact consumer of %s: %s", FAMILY, self.group, e)
