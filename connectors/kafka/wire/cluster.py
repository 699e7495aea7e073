"""One Kafka cluster as this process reaches it over the wire: the brokers it knows, one
connection per node shared by every caller, the topics' leaders kept between calls, the
coordinators found, and the retry every request goes through.

What librdkafka and the Java client do, and what this does the same way:

- **Bootstrap and failover.** Look-ups go to the last broker that answered while its
  connection works, else to the next of the bootstrap servers and every broker a Metadata
  answer named, in turn: a dead node is never the only door.
- **Metadata is kept, and asked again when it is stale**: a topic's leaders are kept
  between calls (:meth:`Cluster.leaders`) until ``metadata.max.age.ms`` passes or a caller
  meets ``NOT_LEADER_OR_FOLLOWER``, ``LEADER_NOT_AVAILABLE``, ``UNKNOWN_TOPIC_OR_PARTITION``
  or a lost connection (:meth:`Cluster.stale`); then the next call asks again (librdkafka's
  admin client instead keeps a partition it saw leaderless "permanently" so until its cache
  expires, up to ``metadata.max.age.ms``: docs/design.md, "Kafka nodes that move or go
  away").
- **Requests to several leaders go out together** (:meth:`Cluster.parallel`): each
  connection gets its request, then the answers are read.
- **Coordinators** (a group's, a transactional id's) are found once and found again when
  one answers ``NOT_COORDINATOR``/``COORDINATOR_NOT_AVAILABLE`` or its connection is lost.
- **Retries** with librdkafka's backoff (``retry.backoff.ms`` doubling to
  ``retry.backoff.max.ms``; after a lost connection ``reconnect.backoff.ms`` doubling to
  ``reconnect.backoff.max.ms``), only for errors Kafka marks retriable, within a deadline.

A :class:`Cluster` has no thread: its callers' threads share it (each connection has a lock
of its own; :attr:`Cluster.lock` guards what it knows). It belongs to whoever made it; the
connectors share one per process and cluster (:mod:`connectors.kafka.clients`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from connectors.kafka.common import FAMILY
from connectors.kafka.wire import requests
from connectors.kafka.wire.protocol import (
    API_NAMES,
    API_VERSIONS,
    COORDINATOR_MOVED,
    ERRORS,
    FIND_COORDINATOR,
    LOOKUP_TIMEOUT,
    METADATA,
    NETWORK_EXCEPTION,
    RETRIABLE,
    TV2_VERSIONS,
    Connection,
    ConnectionLost,
    Reader,
    UnsupportedBroker,
    WireError,
)
from connectors.kafka.wire.requests import METADATA_AUTHORIZED, Metadata, TopicMetadata
from connectors.kafka.wire.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Key types of FindCoordinator.
GROUP, TRANSACTION = 0, 1
#: How long a topic's leaders are kept without news of a change (librdkafka's
#: ``metadata.max.age.ms`` is 15 minutes, Java's 5): any answer that says a leader moved
#: makes them stale at once, so the age only bounds what a caller can learn no other way.
METADATA_MAX_AGE = 300.0
#: (producer id, topic, partition) a cluster remembers as known to its brokers, at most.
KNOWN_MAX = 1_000_000


@dataclass
class Cached:
    """A topic's metadata as last answered, and when (the cluster's clock)."""

    meta: TopicMetadata
    at: float
    stale: bool = False


class Cluster:
    """The brokers of one cluster, reached over the wire (see the module's docstring)."""

    def __init__(self, settings: Settings, name: str | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        #: How errors name the cluster: its bootstrap servers.
        self.name = name or ",".join(f"{h}:{p}" for h, p in settings.bootstrap)
        #: Look-up connections give up on a broker that does not accept within
        #: LOOKUP_TIMEOUT (a node cut off by the network never answers a SYN) and try the next.
        self._lookup_settings = dataclasses.replace(
            settings, connect_timeout=min(settings.connect_timeout, LOOKUP_TIMEOUT))
        self.clock, self.sleep = clock, sleep
        self.lock = threading.RLock()
        self.brokers: dict[int, tuple[str, int]] = {}
        self.connections: dict[int, Connection] = {}
        self.bootstrap: Connection | None = None
        #: What the look-up broker serves: API key -> (lowest, highest) version.
        self.ranges: dict[int, tuple[int, int]] = {}
        #: The cluster's finalized features (ApiVersions v3), asked once per look-up
        #: connection that serves it (None: not asked on this one yet).
        self.features: dict[str, int] | None = None
        self.controller = -1
        self.coordinators: dict[tuple[int, str], int] = {}
        self.topics: dict[str, Cached] = {}
        #: When every topic was last listed (None: never; :meth:`leaders` of None).
        self.listed: float | None = None
        #: (producer id, topic, partition) with a batch acknowledged in this process: the
        #: broker knows the producer id there and refuses a gap in its sequences.
        self.known: set[tuple[int, str, int]] = set()
        #: Requests sent, by API key (every connection of this cluster counts here).
        self.counts: Counter[int] = Counter()
        #: What :meth:`note` logged (once per cluster).
        self.said: set[str] = set()
        self._next_bootstrap = 0

    # -- connections -----------------------------------------------------------------------------
    def connect(self) -> Connection:
        """A connection for look-ups: the last one while it works, else the next bootstrap
        server or known broker that answers ApiVersions."""
        with self.lock:
            if self.bootstrap is not None and self.bootstrap.usable():
                return self.bootstrap
            candidates = list(self.settings.bootstrap) + sorted(set(self.brokers.values()))
            errors = []
            for i in range(len(candidates)):
                host, port = candidates[(self._next_bootstrap + i) % len(candidates)]
                try:
                    conn = Connection(host, port, self._lookup_settings, self.counts)
                except OSError as e:
                    errors.append(f"{host}:{port}: {e}")
                    continue
                self._next_bootstrap = (self._next_bootstrap + i + 1) % len(candidates)
                try:
                    error, ranges = requests.read_api_versions_v0(
                        conn.call(API_VERSIONS, requests.api_versions_v0(), LOOKUP_TIMEOUT,
                                  version=0))
                except ConnectionLost as e:
                    errors.append(f"{host}:{port}: {e}")
                    continue
                except BaseException:
                    conn.close()
                    raise
                if error:
                    conn.close()
                    raise UnsupportedBroker(f"{FAMILY}: broker {conn.address} answered "
                                            f"ApiVersions with {ERRORS.get(error, error)}")
                self.bootstrap, self.ranges, self.features = conn, ranges, None
                return conn
            raise WireError(f"{FAMILY}: no broker of {self.name} answered: "
                            f"{'; '.join(errors)}", NETWORK_EXCEPTION)

    def serves(self, api: int, version: int) -> bool:
        """Whether the look-up broker serves ``version`` of ``api`` (asks it first)."""
        self.connect()
        lo, hi = self.ranges.get(api, (1, 0))
        return lo <= version <= hi

    def require(self, needs: Mapping[int, int], who: str) -> None:
        """:class:`UnsupportedBroker` unless the look-up broker serves every ``needs``
        version (API key -> version)."""
        conn = self.connect()
        missing = [f"{API_NAMES.get(api, api)} v{v}" for api, v in needs.items()
                   if not self.serves(api, v)]
        if missing:
            raise UnsupportedBroker(f"{who}: broker {conn.address} does not serve "
                                    f"{', '.join(missing)}")

    def finalized(self) -> dict[str, int]:
        """The cluster's finalized features (``transaction.version``...) as the look-up
        broker tells them (ApiVersions v3; empty where it does not serve it)."""
        with self.lock:
            conn = self.connect()
            if self.features is None:
                if any(not self.serves(api, v) for api, v in TV2_VERSIONS.items()):
                    self.features = {}
                else:
                    error, features = requests.read_api_versions_v3(conn.call(
                        API_VERSIONS, requests.api_versions_v3(), LOOKUP_TIMEOUT,
                        TV2_VERSIONS[API_VERSIONS]))
                    self.features = {} if error else features
            return self.features

    def connection(self, node: int) -> Connection:
        """A working connection to ``node`` (a new one when the last broke, or when its SASL
        session is near its end and nothing waits on it)."""
        with self.lock:
            conn = self.connections.get(node)
            if conn is not None and conn.usable() and not (conn.expiring() and not conn.pending):
                return conn
            if conn is not None:
                conn.close()
            if node not in self.brokers:
                self.metadata(())
            if node not in self.brokers:
                raise WireError(f"{FAMILY}: broker {node} is not in the metadata of "
                                f"{self.name}", NETWORK_EXCEPTION)
            host, port = self.brokers[node]
            try:
                conn = Connection(host, port, self.settings, self.counts)
            except OSError as e:
                raise WireError(f"{FAMILY}: cannot connect to broker {node} at {host}:{port}: "
                                f"{e}", NETWORK_EXCEPTION) from None
            self.connections[node] = conn
            return conn

    def close(self) -> None:
        with self.lock:
            for conn in {id(c): c for c in (self.bootstrap, *self.connections.values())
                         if c}.values():
                conn.close()
            self.connections.clear()
            self.bootstrap = None

    # -- look-ups --------------------------------------------------------------------------------
    def metadata(self, topics: Iterable[str] | None, authorized: bool = False,
                 auto_create: bool = False) -> Metadata:
        """One Metadata answer from any live broker (``topics`` None: every topic; ``()``:
        only the brokers), remembered: its brokers, controller and each topic's leaders.
        One try: callers retry."""
        with self.lock:
            conn = self.connect()
            version = (METADATA_AUTHORIZED if self.ranges.get(METADATA, (0, 7))[1]
                       >= METADATA_AUTHORIZED else 7)
            r = conn.call(METADATA, requests.metadata(topics, version, authorized, auto_create),
                          LOOKUP_TIMEOUT, version=version)
            answer = requests.read_metadata(r, version)
            self.brokers.update(answer.brokers)
            self.controller = answer.controller
            now = self.clock()
            if topics is None:  # every topic: the ones not named are gone
                self.topics = {}
            for name, meta in answer.topics.items():
                if meta.error == 0:
                    self.topics[name] = Cached(meta, now)
                else:
                    self.topics.pop(name, None)
            return answer

    def leaders(self, topics: Iterable[str] | None,
                max_age: float = METADATA_MAX_AGE) -> dict[str, TopicMetadata]:
        """The metadata of ``topics`` (None: every topic of the cluster): kept answers while
        younger than ``max_age`` and not :meth:`stale`, else one Metadata request for the
        rest (a topic in error or unknown is in the answer with its error). One try: callers
        retry."""
        with self.lock:
            now = self.clock()
            if topics is None:
                fresh = self.listed is not None and now - self.listed < max_age and not any(
                    c.stale for c in self.topics.values())
                if not fresh:
                    answer = self.metadata(None)
                    self.listed = now
                    return dict(answer.topics)
                return {name: c.meta for name, c in self.topics.items()}
            names = sorted(set(topics))
            out: dict[str, TopicMetadata] = {}
            ask = []
            for name in names:
                cached = self.topics.get(name)
                if cached is None or cached.stale or now - cached.at >= max_age:
                    ask.append(name)
                else:
                    out[name] = cached.meta
            if ask:
                answer = self.metadata(ask)
                for name in ask:
                    out[name] = answer.topics.get(name, TopicMetadata(3))
            return out

    def topic_leaders(self, topic: str, partitions: int, who: str,
                      timeout: float) -> TopicMetadata:
        """Every partition's leader of ``topic`` (kept metadata unless it is stale), asked
        again while one of the first ``partitions``, or of all the metadata names, has none,
        until ``timeout``."""

        def ask() -> TopicMetadata:
            found = self.leaders([topic])[topic]
            check(found.error, f"{who}: Metadata of topic {topic!r}")
            count = max(partitions, len(found.leaders))
            missing = [i for i in range(count) if found.leaders.get(i, -1) < 0]
            if missing:
                self.stale(topic)
                raise WireError(f"{who}: partitions {missing[:5]} of {topic!r} have no "
                                "leader", 5)
            return found

        return self.retrying(ask, f"Metadata of topic {topic!r}", timeout, who=who)

    def stale(self, topic: str) -> None:
        """A leader of ``topic`` moved (an answer said so): ask its metadata again next
        time."""
        with self.lock:
            cached = self.topics.get(topic)
            if cached is not None:
                cached.stale = True

    def coordinator(self, key: str, key_type: int) -> int:
        """The node coordinating group or transactional id ``key`` (found once, again after
        :meth:`forget`). One try: callers retry."""
        with self.lock:
            found = self.coordinators.get((key_type, key))
            if found is not None:
                return found
            error, node, host, port = requests.read_find_coordinator(self.connect().call(
                FIND_COORDINATOR, requests.find_coordinator(key, key_type), LOOKUP_TIMEOUT))
            check(error, f"{FAMILY}: FindCoordinator of {key!r}")
            self.brokers[node] = (host, port)
            self.coordinators[(key_type, key)] = node
            return node

    def forget(self, key: str | None = None, key_type: int | None = None) -> None:
        """Find the coordinator of ``key`` again next time (every coordinator: no key)."""
        with self.lock:
            if key is None:
                self.coordinators.clear()
            else:
                self.coordinators.pop((GROUP if key_type is None else key_type, key), None)

    def parallel(self, asks: Mapping[int, tuple[int, bytes, int]],
                 timeout: float = LOOKUP_TIMEOUT) -> dict[int, Reader | WireError]:
        """One request to each node (``node -> (API key, body, version)``), all sent before
        any answer is read; each node's answer, or the error that stands for it (a
        connection that failed: its request's outcome is unknown)."""
        sent: dict[int, tuple[Connection, int]] = {}
        out: dict[int, Reader | WireError] = {}
        for node, (api, body, version) in asks.items():
            try:
                conn = self.connection(node)
                with conn.lock:
                    conn.sock.settimeout(min(timeout, self.settings.socket_timeout))
                    sent[node] = conn, conn.send(api, [body], version)
            except WireError as e:
                out[node] = e
        for node, (conn, correlation) in sent.items():
            try:
                out[node] = conn.receive(correlation)
            except WireError as e:
                out[node] = e
            finally:
                with conn.lock:
                    if not conn.broken:
                        conn.sock.settimeout(self.settings.socket_timeout)
        return out

    # -- what the brokers know of producers ------------------------------------------------------
    def knows(self, producer_id: int, topic: str, partition: int) -> bool:
        with self.lock:
            return (producer_id, topic, partition) in self.known

    def learned(self, producer_id: int, topic: str, partition: int) -> None:
        """A batch of ``producer_id`` was acknowledged on the partition."""
        with self.lock:
            if len(self.known) >= KNOWN_MAX:
                self.known.clear()  # bounded: at worst the next writes wait once more
            self.known.add((producer_id, topic, partition))

    def note(self, what: str) -> None:
        """Log ``what`` at INFO once for this cluster (per process)."""
        with self.lock:
            if what in self.said or len(self.said) >= 1000:
                return
            self.said.add(what)
        log.info("%s", what)

    # -- retries ---------------------------------------------------------------------------------
    def backoff(self, attempt: int, reconnect: bool = False) -> float:
        """librdkafka's backoff: ``retry.backoff.ms`` doubling to its maximum, or after a
        connection failed, ``reconnect.backoff.ms`` doubling to its maximum."""
        s = self.settings
        first, most = ((s.reconnect_backoff, s.reconnect_backoff_max) if reconnect
                       else (s.retry_backoff, s.retry_backoff_max))
        return float(min(first * (2 ** min(attempt, 16)), most))

    def retrying(self, ask: Callable[[], T], what: str, timeout: float, *, who: str = FAMILY,
                 poll: Mapping[int, float] | None = None) -> T:
        """``ask()`` until it succeeds, a non-retriable error, or ``timeout``. A lost
        connection counts as retriable (look-ups are safe to send again) and every
        coordinator is found again; ``poll``: error codes asked again at a short fixed
        interval instead of the doubling backoff."""
        deadline = self.clock() + timeout
        attempt = 0
        while True:
            try:
                return ask()
            except WireError as e:
                lost = isinstance(e, ConnectionLost) or e.code == NETWORK_EXCEPTION
                if lost:
                    self.forget()
                pause = self.backoff(attempt, reconnect=lost)
                if poll and e.code in poll:
                    pause = min(pause, poll[e.code])
                attempt += 1
                left = deadline - self.clock()
                if e.code not in RETRIABLE:
                    raise
                if left <= 0:
                    raise WireError(f"{who}: {what}: still {e.name} after {timeout:.0f}s and "
                                    f"{attempt} attempts ({e})", e.code) from None
                pause = min(pause, left)  # the last attempt at the deadline, not before it
                log.debug("%s: %s: %s; asking again in %.2fs", who, what, e, pause)
                self.sleep(pause)


def check(code: int, what: str) -> None:
    """Raise :class:`WireError` for a Kafka error code (0: nothing)."""
    if code:
        raise WireError(f"{what}: {ERRORS.get(code, f'error {code}')}", code)


def coordinator_moved(code: int) -> bool:
    return code in COORDINATOR_MOVED
