"""The Kafka clusters of this process: one :class:`KafkaCluster` per cluster and connection
settings, shared by every part that talks to it, and the one place that decides whether a
request goes over the project's wire client (:mod:`connectors.kafka.wire`) or librdkafka.

Who uses it: the source's planner (partitions, offsets), the sink's driver checks (the
targets' metadata, the facts topic, the ACL preflight) and tasks (the targets' partition
counts, the started marker's end offsets, the commit facts' retention, the wire producers),
``doctor`` and the CLI. Every one of them leases the process's object for its cluster
(:func:`lease`, :func:`acquire`), so the brokers' metadata, the leaders, the coordinators and
the connections are kept and shared instead of found again per call.

**The choice, made here once per cluster** (docs/design.md, "Kafka clients: one cluster
object per process"):

- look-ups (metadata, ListOffsets, CreateTopics, DescribeConfigs, the ACL preflight's
  Describes) go over the wire client, unless its connection settings are ones it cannot
  honour the way librdkafka would (a GSSAPI or OAUTHBEARER login, a setting it does not
  speak: :func:`connectors.kafka.wire.settings.connection_unsupported`), or the brokers
  turn out older than the request versions it speaks (``UnsupportedBroker``, remembered for
  the cluster); then librdkafka's admin client, with a new client after every transient
  failure;
- the first contact of a query (is the cluster there at all, does the handshake work)
  goes through librdkafka's admin client, whose connection logs name a wrong security
  protocol, certificate or password (:mod:`connectors.kafka.connect`);
- records go as record batches on the wire where :func:`produce_refusal` has nothing
  against the producer's settings (the C encoder built, no compression, the connection
  settings honoured), else through librdkafka; transactions on the wire need brokers that
  verify a transaction's partitions (Kafka 3.6), checked when a producer fences
  (:func:`broker_refusal` tells the callers that fall back).

The object is the process's, not a caller's: it is closed when no caller has used it for
``CLIENT_IDLE_SECONDS`` (the cache's reaper) or when the cache makes room.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from connectors.core.errors import ConnectorError, outage
from connectors.kafka.common import (
    FAMILY,
    LIBRDKAFKA_LOG,
    SHORT_LIVED_RECONNECT_BACKOFF_MS,
    ClientCache,
    Lease,
    attempt_timeout,
    retrying,
)
from connectors.kafka.wire import admin as wire_admin
from connectors.kafka.wire import record_batch
from connectors.kafka.wire.cluster import Cluster
from connectors.kafka.wire.producer import WireProducer
from connectors.kafka.wire.protocol import RETRIABLE, UnsupportedBroker, WireError
from connectors.kafka.wire.requests import TopicMetadata
from connectors.kafka.wire.settings import (
    CONNECTION_FAMILIES,
    Settings,
    connection_unsupported,
)

log = logging.getLogger(__name__)

__all__ = ["KafkaCluster", "TopicInfo", "acquire", "broker_refusal", "lease",
           "produce_refusal", "note_once"]

#: Settings that make two configurations different clusters to this process: the servers,
#: who the client is, and everything that shapes a connection (its timeouts included).
_KEY_SETTINGS = ("bootstrap.servers", "metadata.broker.list", "client.id",
                 "request.timeout.ms", "retry.backoff.ms", "retry.backoff.max.ms",
                 "receive.message.max.bytes", "topic.metadata.refresh.interval.ms")
#: The client id of the look-ups (a ``client.id`` setting wins).
CLIENT_ID = "eo-connectors"
#: Clusters a process keeps at once (their connections and metadata).
MAX_CLUSTERS = 8


def connection_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a librdkafka configuration that says which cluster and how to connect."""
    return {str(k): v for k, v in conf.items()
            if k in _KEY_SETTINGS or str(k).lower().startswith(CONNECTION_FAMILIES)}


@dataclass(frozen=True)
class TopicInfo:
    """A topic as the metadata tells it: its error (0: none; Kafka's code), its partition
    count and each partition's leader (-1: none now)."""

    error: int
    partitions: int
    leaders: Mapping[int, int]

    @classmethod
    def of(cls, meta: TopicMetadata) -> TopicInfo:
        count = max(meta.leaders, default=-1) + 1 if meta.error == 0 else 0
        return cls(meta.error, count, dict(meta.leaders))


class KafkaCluster:
    """One Kafka cluster as this process talks to it (see the module's docstring)."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        self.conf = connection_conf(conf)
        self.bootstrap = str(self.conf.get("bootstrap.servers",
                                           self.conf.get("metadata.broker.list", "")))
        #: Why the wire client cannot reach this cluster as librdkafka would (None: it can).
        self.wire_refusal: str | None = connection_unsupported(self.conf)
        self.wire: Cluster | None = None
        if self.wire_refusal is None:
            self.wire = Cluster(Settings.of(self.conf, client_id=CLIENT_ID), self.bootstrap)
        self._lock = threading.Lock()
        self._admins: dict[bool, Any] = {}
        #: Every Describe of the ACL preflight granted every operation: no authorizer (Kafka
        #: then reports all operations as authorized) or a super user. No ACL can be missing,
        #: so the preflight asks nothing more of this cluster.
        self.grants_everything = False

    def __repr__(self) -> str:
        return f"KafkaCluster({self.bootstrap!r}, wire={self.wire is not None})"

    # -- the choice -------------------------------------------------------------------------------
    def lookups(self) -> Cluster | None:
        """The wire client for look-ups, or None: librdkafka (the module's docstring)."""
        return self.wire

    def old_brokers(self, e: UnsupportedBroker) -> None:
        """The brokers do not serve the wire client's look-up versions: librdkafka for every
        look-up from now on, in this process."""
        if self.wire is not None:
            note_once(f"{FAMILY}: {self.bootstrap}: {e}; look-ups go through librdkafka")
            self.wire_refusal = str(e)
            self.wire.close()
            self.wire = None

    def admin(self, auto_create: bool = False) -> Any:
        """librdkafka's admin client of this cluster (made on first use). Its metadata
        requests create a missing topic (when the broker allows it) only with
        ``auto_create``."""
        with self._lock:
            client = self._admins.get(auto_create)
            if client is None:
                from connectors.kafka.connect import watched_admin

                conf = dict(self.conf)
                conf["allow.auto.create.topics"] = "true" if auto_create else "false"
                conf["logger"] = LIBRDKAFKA_LOG
                client = self._admins[auto_create] = watched_admin(conf)
            return client

    def drop_admin(self) -> None:
        """Forget librdkafka's admin clients (their view of the leaders is stale); the next
        request makes new ones."""
        with self._lock:
            self._admins.clear()

    def close(self) -> None:
        if self.wire is not None:
            self.wire.close()
        self.drop_admin()

    # -- look-ups ---------------------------------------------------------------------------------
    def first_contact(self, *, who: str, timeout: float, error: type[ConnectorError],
                      topic: str | None = None, where: str = "from here",
                      started: float | None = None) -> Any:
        """The first request of a query to this cluster, bounded by ``timeout``
        (``connectTimeout``) from ``started``: through a new librdkafka admin client of its
        own, whose connection logs name what failed (:func:`connectors.kafka.connect.
        first_contact`); ``topic``: ask that topic's metadata only, not the whole cluster's.
        Returns the metadata answer."""
        from connectors.kafka.connect import first_contact, watched_admin

        conf = dict(self.conf)
        conf["allow.auto.create.topics"] = "false"
        conf.setdefault("reconnect.backoff.ms", SHORT_LIVED_RECONNECT_BACKOFF_MS)
        conf["logger"] = LIBRDKAFKA_LOG
        admin = watched_admin(conf)
        return first_contact(
            admin, lambda seconds: admin.list_topics(topic=topic, timeout=seconds),
            timeout=timeout, who=who, bootstrap=self.bootstrap or None, conf=self.conf,
            error=error, where=where, started=started)

    def topics(self, names: Iterable[str] | None, *, who: str, error: type[ConnectorError],
               timeout: float, max_age: float | None = None,
               auto_create: bool = False) -> dict[str, TopicInfo]:
        """The metadata of the topics ``names`` (None: every topic of the cluster), kept
        for ``max_age`` seconds (None: the cluster's default; 0: asked now). A topic that
        does not exist is in the answer with UNKNOWN_TOPIC_OR_PARTITION (3), unless
        ``auto_create`` lets the broker create it."""
        what = f"{who}: metadata of {self.bootstrap}"
        wire = self.lookups()
        if wire is not None:
            try:
                return self._wire_topics(wire, names, who, timeout, max_age, auto_create)
            except UnsupportedBroker as e:
                self.old_brokers(e)
            except WireError as e:
                raise _wrap(error, f"{what} failed: {e}", e) from None
        listed = None if names is None else sorted(set(names))

        def ask() -> dict[str, TopicInfo]:
            admin = self.admin(auto_create)
            if listed is not None and len(listed) == 1:
                md = admin.list_topics(topic=listed[0], timeout=attempt_timeout(timeout))
            else:
                md = admin.list_topics(timeout=attempt_timeout(timeout))
            out = {}
            for name, meta in md.topics.items():
                if listed is not None and name not in listed:
                    continue
                code = 0 if meta.error is None else int(meta.error.code())
                leaders = {p: m.leader for p, m in meta.partitions.items()}
                out[name] = TopicInfo(code, len(meta.partitions) if not code else 0, leaders)
            for name in listed or ():
                out.setdefault(name, TopicInfo(3, 0, {}))
            return out

        return retrying(ask, what=what, error=error, timeout=timeout)

    def _wire_topics(self, wire: Cluster, names: Iterable[str] | None, who: str,
                     timeout: float, max_age: float | None,
                     auto_create: bool) -> dict[str, TopicInfo]:
        kwargs = {} if max_age is None else {"max_age": max_age}
        if names is None:
            every = wire.retrying(lambda: wire.leaders(None, **kwargs), "Metadata of every topic",
                                  timeout, who=who)
            return {n: TopicInfo.of(m) for n, m in every.items()}
        listed = sorted(set(names))
        if auto_create:
            answer = wire.retrying(lambda: wire.metadata(listed, auto_create=True),
                                   f"Metadata of {listed}", timeout, who=who)
            return {n: TopicInfo.of(answer.topics.get(n, TopicMetadata(3))) for n in listed}
        found = wire.retrying(lambda: wire.leaders(listed, **kwargs), f"Metadata of {listed}",
                              timeout, who=who)
        return {n: TopicInfo.of(m) for n, m in found.items()}

    def forget_leaders(self, topics: Iterable[str]) -> None:
        """The next look-up of ``topics``' leaders asks a broker (the wire client's kept
        metadata; librdkafka's admin client is made again)."""
        wire = self.lookups()
        if wire is None:
            self.drop_admin()
            return
        for topic in topics:
            wire.stale(topic)

    def list_offsets(self, wanted: Mapping[tuple[str, int], int], *, committed: bool,
                     who: str, error: type[ConnectorError], timeout: float,
                     what: str, gone_ok: bool = False) -> dict[tuple[str, int], int]:
        """ListOffsets of each ``(topic, partition) -> timestamp`` (-1: the end, the last
        stable offset when ``committed``; -2: the start; milliseconds: the first offset at or
        after it, -1 where none). Over the wire, one request per leader at once, asked again
        after fresh metadata while a leader moves, until ``timeout``; librdkafka's admin
        client only where the wire client cannot serve (docs/design.md, "Kafka nodes that
        move or go away"). ``gone_ok``: a partition that fresh metadata no longer has is left
        out of the answer (``wire.admin.list_offsets``), not waited for."""
        wire = self.lookups()
        if wire is not None:
            isolation = wire_admin.READ_COMMITTED if committed else wire_admin.READ_UNCOMMITTED
            try:
                return wire_admin.list_offsets(wire, wanted, isolation, timeout, who=who,
                                               gone_ok=gone_ok)
            except UnsupportedBroker as e:
                self.old_brokers(e)
            except WireError as e:
                raise _wrap(error, f"{what} failed: {e}", e) from None
        return self._list_offsets_librdkafka(wanted, committed, error, timeout, what)

    def _list_offsets_librdkafka(self, wanted: Mapping[tuple[str, int], int], committed: bool,
                                 error: type[ConnectorError], timeout: float,
                                 what: str) -> dict[tuple[str, int], int]:
        from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        def spec(ts: int) -> Any:
            return (OffsetSpec.latest() if ts == -1 else OffsetSpec.earliest() if ts == -2
                    else OffsetSpec.for_timestamp(ts))

        isolation = (IsolationLevel.READ_COMMITTED if committed
                     else IsolationLevel.READ_UNCOMMITTED)
        request = {TopicPartition(t, p): spec(int(ts)) for (t, p), ts in wanted.items()}

        def ask() -> dict[tuple[str, int], int]:
            futures = self.admin().list_offsets(request, isolation_level=isolation,
                                                request_timeout=attempt_timeout(timeout))
            try:
                got = {(ktp.topic, ktp.partition): fut.result().offset
                       for ktp, fut in futures.items()}
            except KafkaException:
                # librdkafka's admin client keeps a partition it saw without a leader
                # "permanently" so, answering LEADER_NOT_AVAILABLE until its metadata cache
                # expires: the next try asks with a new client (new metadata).
                self.drop_admin()
                raise
            invalid = [f"{t}[{p}]" for (t, p), o in got.items() if o == OFFSET_INVALID]
            if invalid:
                # A partition whose leader just moved can come back with no offset and no
                # error: asked again with a new client, never read as "the log ends at -1001".
                self.drop_admin()
                raise KafkaException(KafkaError(
                    KafkaError.LEADER_NOT_AVAILABLE,
                    f"ListOffsets gave no offset for {invalid[:5]}", retriable=True))
            return got

        return retrying(ask, what=what, error=error, timeout=timeout)

    def create_topic(self, topic: str, partitions: int, *, who: str,
                     error: type[ConnectorError], timeout: float) -> bool:
        """Create ``topic`` unless it exists; True if this call created it."""
        wire = self.lookups()
        if wire is not None:
            try:
                return wire_admin.create_topic(wire, topic, partitions, timeout, who=who)
            except UnsupportedBroker as e:
                self.old_brokers(e)
            except WireError as e:
                raise _wrap(error, str(e), e) from e
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        admin = self.admin()
        info = admin.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if info is not None and info.error is None and info.partitions:
            return False
        future = admin.create_topics([NewTopic(topic, partitions)],
                                     request_timeout=timeout)[topic]
        try:
            future.result(timeout)
        except KafkaException as e:
            if e.args and e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise
        return True

    def broker_config(self, name: str, *, who: str, timeout: float) -> str | None:
        """The value of broker config ``name`` as a live broker reports it (raises what
        the client met: callers decide what an unreadable value means)."""
        wire = self.lookups()
        if wire is not None:
            try:
                return wire_admin.broker_config(wire, name, timeout, who=who)
            except UnsupportedBroker as e:
                self.old_brokers(e)
        from confluent_kafka.admin import ConfigResource, ResourceType

        admin = self.admin()
        brokers = admin.list_topics(timeout=timeout).brokers
        resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource]
        return str(entries.result(timeout)[name].value)

    # -- the producers ----------------------------------------------------------------------------
    def producer(self, producer_conf: Mapping[str, Any], transactional_id: str | None,
                 who: str, retry_timeout: float) -> WireProducer:
        """A wire producer over this cluster's connections (:func:`produce_refusal` said
        yes to ``producer_conf``)."""
        if self.wire is None:
            raise WireError(f"{who}: the wire client cannot reach {self.bootstrap}: "
                            f"{self.wire_refusal} (internal)", -1)
        return WireProducer(self.wire, Settings.of(producer_conf), transactional_id, who,
                            retry_timeout)


#: OFFSET_INVALID of librdkafka (no offset).
OFFSET_INVALID = -1001

_CLUSTERS: ClientCache[KafkaCluster] = ClientCache("kafka clusters", MAX_CLUSTERS,
                                                   lambda c: c.close())
#: What :func:`note_once` logged.
_SAID: set[str] = set()
_SAID_LOCK = threading.Lock()


def _key(conf: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in connection_conf(conf).items()))


@contextmanager
def lease(conf: Mapping[str, Any]) -> Iterator[KafkaCluster]:
    """The process's :class:`KafkaCluster` for ``conf`` (made on first use), held for the
    ``with`` block."""
    with _CLUSTERS.lease(_key(conf), lambda: KafkaCluster(conf)) as cluster:
        yield cluster


def acquire(conf: Mapping[str, Any]) -> Lease[KafkaCluster]:
    """:func:`lease` for a holder that spans several calls (``Lease.release()`` at the end)."""
    return _CLUSTERS.acquire(_key(conf), lambda: KafkaCluster(conf))


def produce_refusal(producer_conf: Mapping[str, Any]) -> str | None:
    """Why records with this producer configuration cannot go as record batches on the
    wire (None: they can): the C encoder is not built here, compression, or a connection
    setting the wire client does not honour."""
    if not record_batch.encoder_built():
        return record_batch.NOT_BUILT
    for key in ("compression.type", "compression.codec"):
        codec = str(producer_conf.get(key, "none")).lower()
        if codec not in ("none", ""):
            return f"{key}={codec} (the wire path writes uncompressed batches)"
    return connection_unsupported(producer_conf)


def broker_refusal(error: BaseException) -> str | None:
    """The text of a broker too old for the wire client's requests, met when a producer
    opened or fenced (None: ``error`` is something else): the caller goes on with
    librdkafka."""
    return str(error) if isinstance(error, UnsupportedBroker) else None


def note_once(what: str) -> None:
    """Log ``what`` at INFO once per process (why a path was not taken)."""
    with _SAID_LOCK:
        if what in _SAID or len(_SAID) >= 1000:
            return
        _SAID.add(what)
    log.info("%s", what)


def _wrap(error: type[ConnectorError], message: str, cause: WireError) -> ConnectorError:
    """``error(message)``, marked unreachable when the wire client's retries ran out on a
    transient error (a broker gone, a leader moving: an outage, not a wrong setting)."""
    if cause.code in RETRIABLE:
        return outage(error, message)
    return error(message)
