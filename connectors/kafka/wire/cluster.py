"""A client's view of one Kafka cluster over the wire: the brokers it knows, one connection
per node, look-ups any live broker answers (ApiVersions, Metadata, FindCoordinator), and the
retry every request goes through.

What librdkafka and the Java client do, and what this does the same way:

- **Bootstrap and failover.** Look-ups go to the last broker that answered while its
  connection works, else to the next of the bootstrap servers and every broker a Metadata
  answer named, in turn: a dead node is never the only door.
- **Metadata is asked again, never trusted stale.** A caller that meets
  ``NOT_LEADER_OR_FOLLOWER``, ``LEADER_NOT_AVAILABLE`` or ``UNKNOWN_TOPIC_OR_PARTITION`` asks
  for the topic's metadata again before its next try (librdkafka's admin client instead
  keeps a partition it saw leaderless "permanently" so until its cache expires, up to
  ``metadata.max.age.ms``: docs/design.md, "Kafka nodes that move or go away").
- **Coordinators** (a group's, a transactional id's) are found once and found again when
  one answers ``NOT_COORDINATOR``/``COORDINATOR_NOT_AVAILABLE`` or its connection is lost.
- **Retries** with librdkafka's backoff (``retry.backoff.ms`` doubling to
  ``retry.backoff.max.ms``; after a lost connection ``reconnect.backoff.ms`` doubling to
  ``reconnect.backoff.max.ms``), only for errors Kafka marks retriable, within a deadline.

No thread and no process-global state: a :class:`Cluster` belongs to its caller, which
closes it.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

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
    Connection,
    ConnectionLost,
    UnsupportedBroker,
    WireError,
    _Reader,
    string,
)
from connectors.kafka.wire.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Errors after which a partition's leader must be asked again (the metadata is stale).
STALE_LEADER = frozenset({3, 5, 6, 74, 75})
#: Key types of FindCoordinator.
GROUP, TRANSACTION = 0, 1
#: Metadata v8 (Kafka 2.3) answers with each topic's authorized operations (KIP-430); v7
#: where the broker is older.
METADATA_AUTHORIZED = 8


@dataclass
class TopicMetadata:
    """One topic of a Metadata answer: its error code, each partition's leader (-1 where the
    partition has an error or no leader) and error, and the principal's authorized
    operations (a bit per ACL operation code; None where not asked or not told)."""

    error: int
    leaders: dict[int, int] = field(default_factory=dict)
    errors: dict[int, int] = field(default_factory=dict)
    authorized: int | None = None


@dataclass
class Metadata:
    brokers: dict[int, tuple[str, int]]
    controller: int
    topics: dict[str, TopicMetadata]


def metadata_body(topics: Iterable[str] | None, version: int, authorized: bool) -> bytes:
    """A Metadata request of ``topics`` (None: all), never creating one."""
    names = None if topics is None else list(topics)
    body = struct.pack(">i", -1) if names is None else (
        struct.pack(">i", len(names)) + b"".join(string(t) for t in names))
    body += b"\x00"  # allow_auto_topic_creation
    if version >= METADATA_AUTHORIZED:
        body += b"\x00" + (b"\x01" if authorized else b"\x00")  # cluster, topic operations
    return body


def read_metadata(r: _Reader, version: int) -> Metadata:
    """A Metadata v7 or v8 answer."""
    r.take(">i")  # throttle
    brokers = {node: (host or "", port) for node, host, port, _rack in r.array(
        lambda: (r.take(">i"), r.string(), r.take(">i"), r.string()))}
    r.string()  # cluster id
    controller = r.take(">i")
    topics = {}
    for _ in range(r.take(">i")):
        error = r.take(">h")
        name = r.string() or ""
        r.take(">b")  # is_internal
        meta = TopicMetadata(error)
        for _ in range(r.take(">i")):
            perror, index, leader, _epoch = r.take(">hiii")
            for _ in range(3):  # replicas, isr, offline
                count = r.take(">i")
                r.at += 4 * max(count, 0)
            meta.leaders[index] = leader if perror == 0 else -1
            meta.errors[index] = perror
        if version >= METADATA_AUTHORIZED:
            ops = r.take(">i")
            meta.authorized = None if ops == -2147483648 else ops
        topics[name] = meta
    if version >= METADATA_AUTHORIZED:
        r.take(">i")  # cluster authorized operations
    return Metadata(brokers, controller, topics)


class Cluster:
    """The brokers of one cluster, reached over the wire (see the module's docstring).

    ``needs``: request versions every broker must serve (checked with ``ApiVersions`` on
    each new look-up connection, :class:`UnsupportedBroker` otherwise); ``on_versions``: a
    hook that sees each new look-up connection and the version ranges its broker serves."""

    def __init__(self, settings: Settings, who: str, retry_timeout: float, *,
                 needs: Mapping[int, int] | None = None,
                 on_versions: Callable[[Connection, dict[int, tuple[int, int]]], None]
                 | None = None) -> None:
        self.settings = settings
        #: Look-up connections give up on a broker that does not accept within
        #: LOOKUP_TIMEOUT (a node cut off by the network never answers a SYN) and try the next.
        self._lookup_settings = dataclasses.replace(
            settings, connect_timeout=min(settings.connect_timeout, LOOKUP_TIMEOUT))
        self.who = who
        self.retry_timeout = retry_timeout
        self.needs = dict(needs or {})
        self.on_versions = on_versions
        self.brokers: dict[int, tuple[str, int]] = {}
        self.connections: dict[int, Connection] = {}
        self.bootstrap: Connection | None = None
        #: What the last look-up broker serves: API key -> (lowest, highest) version.
        self.ranges: dict[int, tuple[int, int]] = {}
        self.controller = -1
        self.coordinators: dict[tuple[int, str], int] = {}
        self._next_bootstrap = 0

    # -- connections ----------------------------------------------------------------------------
    def connect(self) -> Connection:
        """A connection for look-ups: the last one while it works, else the next bootstrap
        server or known broker that answers."""
        if self.bootstrap is not None and self.bootstrap.usable():
            return self.bootstrap
        candidates = list(self.settings.bootstrap) + sorted(set(self.brokers.values()))
        errors = []
        for i in range(len(candidates)):
            host, port = candidates[(self._next_bootstrap + i) % len(candidates)]
            try:
                conn = Connection(host, port, self._lookup_settings)
            except OSError as e:
                errors.append(f"{host}:{port}: {e}")
                continue
            self._next_bootstrap = (self._next_bootstrap + i + 1) % len(candidates)
            try:
                self._check_versions(conn)
            except ConnectionLost as e:
                errors.append(f"{host}:{port}: {e}")
                continue
            except BaseException:
                conn.close()
                raise
            self.bootstrap = conn
            return conn
        raise WireError(f"{self.who}: no broker answered: {'; '.join(errors)}",
                        NETWORK_EXCEPTION)

    def _check_versions(self, conn: Connection) -> None:
        r = conn.call(API_VERSIONS, b"", LOOKUP_TIMEOUT)  # v0: no body
        error = r.take(">h")
        ranges = {k: (lo, hi) for k, lo, hi in r.array(lambda: r.take(">hhh"))}
        missing = [f"{API_NAMES.get(api, api)} v{v}" for api, v in self.needs.items()
                   if not (ranges.get(api, (1, 0))[0] <= v <= ranges.get(api, (1, 0))[1])]
        if error or missing:
            raise UnsupportedBroker(f"{self.who}: broker {conn.address} does not serve "
                                    f"{', '.join(missing) or f'ApiVersions (error {error})'}")
        self.ranges = ranges
        if self.on_versions is not None:
            self.on_versions(conn, ranges)

    def serves(self, api: int, version: int) -> bool:
        """Whether the look-up broker serves ``version`` of ``api`` (asks it first)."""
        self.connect()
        lo, hi = self.ranges.get(api, (1, 0))
        return lo <= version <= hi

    def connection(self, node: int) -> Connection:
        """A working connection to ``node`` (a new one when the last broke, or when its SASL
        session is near its end and nothing waits on it)."""
        conn = self.connections.get(node)
        if conn is not None and conn.usable() and not (conn.expiring() and not conn.pending):
            return conn
        if conn is not None:
            conn.close()
        if node not in self.brokers:
            self.metadata(())
        if node not in self.brokers:
            raise WireError(f"{self.who}: broker {node} is not in the cluster's metadata",
                            NETWORK_EXCEPTION)
        host, port = self.brokers[node]
        try:
            conn = Connection(host, port, self.settings)
        except OSError as e:
            raise WireError(f"{self.who}: cannot connect to broker {node} at {host}:{port}: "
                            f"{e}", NETWORK_EXCEPTION) from None
        self.connections[node] = conn
        return conn

    def close(self) -> None:
        for conn in {id(c): c for c in (self.bootstrap, *self.connections.values())
                     if c}.values():
            conn.close()
        self.connections.clear()
        self.bootstrap = None

    # -- look-ups -------------------------------------------------------------------------------
    def metadata(self, topics: Iterable[str] | None, authorized: bool = False) -> Metadata:
        """One Metadata answer from any live broker (``topics`` None: every topic; ``()``:
        only the brokers), remembered: its brokers and controller. One try: callers retry."""
        conn = self.connect()
        version = (METADATA_AUTHORIZED if self.ranges.get(METADATA, (0, 7))[1]
                   >= METADATA_AUTHORIZED else 7)
        r = conn.call(METADATA, metadata_body(topics, version, authorized), LOOKUP_TIMEOUT,
                      version=version)
        answer = read_metadata(r, version)
        self.brokers.update(answer.brokers)
        self.controller = answer.controller
        return answer

    def coordinator(self, key: str, key_type: int) -> int:
        """The node coordinating group or transactional id ``key`` (found once, again after
        :meth:`forget`). One try: callers retry."""
        found = self.coordinators.get((key_type, key))
        if found is not None:
            return found
        r = self.connect().call(FIND_COORDINATOR, string(key) + struct.pack(">b", key_type),
                                LOOKUP_TIMEOUT)
        _, error = r.take(">ih")
        r.string()
        node = r.take(">i")
        host = r.string() or ""
        port = r.take(">i")
        check(error, f"{self.who}: FindCoordinator of {key!r}")
        self.brokers[node] = (host, port)
        self.coordinators[(key_type, key)] = int(node)
        return int(node)

    def forget(self, key: str | None = None, key_type: int | None = None) -> None:
        """Find the coordinator of ``key`` again next time (every coordinator: no key)."""
        if key is None:
            self.coordinators.clear()
        else:
            self.coordinators.pop((GROUP if key_type is None else key_type, key), None)

    # -- retries --------------------------------------------------------------------------------
    def backoff(self, attempt: int, reconnect: bool = False) -> float:
        """librdkafka's backoff: ``retry.backoff.ms`` doubling to its maximum, or after a
        connection failed, ``reconnect.backoff.ms`` doubling to its maximum."""
        s = self.settings
        first, most = ((s.reconnect_backoff, s.reconnect_backoff_max) if reconnect
                       else (s.retry_backoff, s.retry_backoff_max))
        return float(min(first * (2 ** min(attempt, 16)), most))

    def retrying(self, ask: Callable[[], T], what: str, timeout: float | None = None, *,
                 poll: Mapping[int, float] | None = None) -> T:
        """``ask()`` until it succeeds, a non-retriable error, or ``timeout`` (default:
        ``retry_timeout``). A lost connection counts as retriable (look-ups are safe to send
        again) and every coordinator is found again; ``poll``: error codes asked again at a
        short fixed interval instead of the doubling backoff."""
        budget = self.retry_timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
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
                left = deadline - time.monotonic()
                if e.code not in RETRIABLE:
                    raise
                if left <= 0:
                    raise WireError(f"{self.who}: {what}: still {e.name} after "
                                    f"{budget:.0f}s and {attempt} "
                                    f"attempts ({e})", e.code) from None
                pause = min(pause, left)  # the last attempt at the deadline, not before it
                log.debug("%s: %s: %s; asking again in %.2fs", self.who, what, e, pause)
                time.sleep(pause)


def check(code: int, what: str) -> None:
    """Raise :class:`WireError` for a Kafka error code (0: nothing)."""
    if code:
        raise WireError(f"{what}: {ERRORS.get(code, f'error {code}')}", code)


def coordinator_moved(code: int) -> bool:
    return code in COORDINATOR_MOVED
