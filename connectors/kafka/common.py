"""What the Kafka source and the Kafka sink share: the one module of ``connectors.kafka`` that
both import, so that neither imports the other.

- ``FAMILY`` (``eo_kafka``), the name in both connectors' messages and option errors.
- The options both take, declared once (:mod:`connectors.core.declared`):
  ``connectTimeout`` (:data:`CONNECT_TIMEOUT`) and ``metadataRetryTimeout``
  (:data:`METADATA_RETRY_TIMEOUT`), and the names of all they share
  (:data:`SHARED_OPTIONS`: the source can tell a sink's options by what is left).
- Where librdkafka's own log lines go. librdkafka repeats every failed connection attempt
  (thousands of lines against an unreachable broker). Every client the connectors create
  passes ``logger=LIBRDKAFKA_LOG``, so those lines reach Python logging as DEBUG records of
  ``connectors.kafka.librdkafka`` and stay out of the user's console; our own errors say
  what broke.
- Retry of Kafka admin and metadata requests on errors Kafka itself calls transient. A new
  topic's leader is not known for a moment; a rolling restart moves leaders; a group
  coordinator loads its state after a failover. Kafka answers those with
  NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS and the
  like, and the right reaction is to ask again shortly. Every ListOffsets, metadata and
  group-offset request of the source and the sink goes through :func:`retrying`, which asks
  again with exponential backoff until a deadline (the option ``metadataRetryTimeout``,
  default 60 s), then fails with one error that names the request, the topic-partitions and
  the last error. Anything else fails at once. A cluster that does not answer its first
  request within ``connectTimeout`` fails with :func:`unreachable`'s message.
- :class:`ClientCache`, the one cache of the librdkafka clients a process keeps between
  tasks (the source's consumers; the sink's producers, admin clients and commit-fact
  consumers): bounded in count, least recently used closed first, idle ones closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

from connectors.core.declared import DURATION, Opt
from connectors.core.errors import ConnectorError, KafkaClientError, outage
from connectors.core.options import scrub_known
from connectors.core.retry import retry_until
from connectors.kafka.access import denied, is_access_error, kafka_error  # noqa: F401 - kafka_error: public here too

log = logging.getLogger(__name__)

T = TypeVar("T")

FAMILY = "eo_kafka"
#: Seconds the first request to a cluster may take (option ``connectTimeout``).
DEFAULT_CONNECT_TIMEOUT = 30.0
#: The default deadline of :func:`retrying`, in seconds (option ``metadataRetryTimeout``).
DEFAULT_RETRY_TIMEOUT = 60.0


CONNECT_TIMEOUT = Opt(
    "connectTimeout", "connect_timeout", DURATION, DEFAULT_CONNECT_TIMEOUT, minimum=0.1,
    help="the bound on the driver's first request to the cluster, counted from the start of "
    "the call, before any task runs: an unreachable cluster fails in that time with one error "
    "that names the bootstrap servers and librdkafka's last connection error. A broker that "
    "answers but fails the handshake (a security protocol mismatch) or the authentication "
    "fails at once, with that cause first; librdkafka's own connection logs go to the Python "
    "logger `connectors.kafka.librdkafka` at DEBUG")
METADATA_RETRY_TIMEOUT = Opt(
    "metadataRetryTimeout", "metadata_retry_timeout", DURATION, DEFAULT_RETRY_TIMEOUT, minimum=0,
    help="how long metadata, ListOffsets and commit-fact requests are retried on transient "
    "errors (a new topic's leader not known yet, a leader election, a coordinator loading) "
    "before the task fails")
#: What the source and the sink both take (``kafka.*`` and ``storage.*`` as prefixes): any
#: other option of the sink's declaration is the sink's alone.
SHARED_OPTIONS = ("kafka.", "storage.", "walPath", CONNECT_TIMEOUT.spark,
                  METADATA_RETRY_TIMEOUT.spark)


# -- librdkafka's log lines --------------------------------------------------------------------
class _Quiet(logging.Filter):
    """Demote every librdkafka record to DEBUG (shown only when that logger enables it),
    and scrub the secrets this process knows from the records that pass (librdkafka redacts
    its own configuration dumps; this covers whatever else it may quote)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.msg, record.args = scrub_known(record.getMessage()), ()
        return True


LIBRDKAFKA_LOG = logging.getLogger("connectors.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(_Quiet())


# -- transient errors and the retry ------------------------------------------------------------
# Transient by Kafka's protocol, whatever librdkafka's retriable flag says in a given path
# (an error from a future of the admin API does not always carry it).
_TRANSIENT_NAMES = (
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "REQUEST_TIMED_OUT",
    "NOT_ENOUGH_REPLICAS",
    "UNSTABLE_OFFSET_COMMIT",
    "OFFSET_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "REBALANCE_IN_PROGRESS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "NETWORK_EXCEPTION",
    "_TRANSPORT",
    "_TIMED_OUT",
    "_WAIT_COORD",
    # a broker restarting: its handle goes and comes back, every broker may be down briefly
    "_DESTROY_BROKER",
    "_ALL_BROKERS_DOWN",
    "_NODE_UPDATE",
)


# Never transient, whatever a path's retriable flag says: asking again with the same
# credentials or certificates gets the same answer, only later.
_NEVER_TRANSIENT = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL")


def is_transient(exc: BaseException) -> bool:
    """True for an error a retry can cure: librdkafka's ``retriable()`` or a code Kafka's
    protocol defines as transient (the wire client's errors too); never for a fatal
    error."""
    if isinstance(exc, KafkaClientError):  # the wire client's: it knows Kafka's codes
        return bool(getattr(exc, "retriable", False))
    err = kafka_error(exc)
    if err is None or is_access_error(err):
        return False  # no retry grants an ACL or fixes a password
    if err.fatal() or str(err.name()) in _NEVER_TRANSIENT:
        return False
    if err.retriable():
        return True
    return str(err.name()) in _TRANSIENT_NAMES


#: The longest one try of a request retried by :func:`retrying` may take: a request sent to a
#: broker that has just died waits until its timeout, and one try must not eat the whole
#: ``metadataRetryTimeout`` (the next try asks a metadata refresh and the new leader).
ATTEMPT_TIMEOUT = 10.0


def attempt_timeout(budget: float) -> float:
    """One try's timeout within ``budget`` seconds (:data:`ATTEMPT_TIMEOUT` at most)."""
    return max(1.0, min(budget, ATTEMPT_TIMEOUT))


def retrying(
    call: Callable[[], T],
    *,
    what: str,
    error: type[ConnectorError],
    timeout: float = DEFAULT_RETRY_TIMEOUT,
    first_backoff: float = 0.05,
    max_backoff: float = 2.0,
) -> T:
    """``call()``, asked again on transient Kafka errors until ``timeout`` seconds have
    passed (:func:`connectors.core.retry.retry_until`). ``what`` names the request and its
    objects ("ListOffsets of orders[3]"); the final error is ``error`` with ``what``, the
    attempts and the last Kafka error."""

    def give_up(e: Exception, attempts: int, transient: bool) -> Exception:
        message = denied(e, who=what, conf={}, needs=(), request="request")
        if message is not None:
            return error(message)
        if not transient:
            return error(f"{what} failed: {e}")
        return outage(error, f"{what} still failed after {attempts} attempts in "
                             f"{timeout:.0f}s (metadataRetryTimeout): {e}")

    def on_retry(e: Exception, attempt: int, pause: float) -> None:
        log.info("%s: transient error (attempt %d), asking again: %s", what, attempt, e)

    return retry_until(call, timeout=timeout, transient=is_transient, give_up=give_up,
                       on_retry=on_retry, first_backoff=first_backoff, max_backoff=max_backoff)


def unreachable(who: str, bootstrap: Any, timeout: float, error: BaseException | str,
                where: str = "from here") -> str:
    """The one error of a cluster that did not answer the first request within
    ``connectTimeout``: the bootstrap servers and the likely causes (no secrets)."""
    return (
        f"{who}: cannot reach Kafka at {bootstrap} within connectTimeout={timeout:g}s "
        f"({error}). Likely causes: the brokers are down or unreachable {where} (host, "
        "port, firewall, advertised.listeners); a TLS/SASL mismatch (kafka.security.protocol, "
        "kafka.sasl.mechanism); or failed authentication (kafka.sasl.username/password)"
    )


#: ``reconnect.backoff.ms`` of clients made per task attempt or per short-lived process
#: (admin clients), unless the user sets it. After
#: its first metadata answer a new librdkafka client drops the bootstrap connection and
#: opens one to the broker it learned, which waits half the backoff: 50 ms with librdkafka's
#: 100 ms default, 10 ms with this (a transactional task's set-up: ~62 ms -> ~21 ms on
#: loopback). Reconnects still back off exponentially to reconnect.backoff.max.ms.
SHORT_LIVED_RECONNECT_BACKOFF_MS = "20"


# -- the clients a process keeps between tasks --------------------------------------------------
C = TypeVar("C")

#: Seconds a cached client may stay unused before it is closed (see :class:`ClientCache`).
CLIENT_IDLE_SECONDS = 120.0


class ClientCache(Generic[C]):
    """The librdkafka clients of one kind that a process keeps between tasks, by key.

    Spark reuses its Python workers across tasks, so a client made for one task serves the
    next one with the same configuration without a new connection. Every librdkafka client
    brings its own threads (one per broker, plus two), sockets and buffers, so the cache
    bounds them:

    - at most ``size`` clients; the least recently used one that no task holds is closed to
      make room (a client a task holds is never closed under it);
    - a client unused for ``idle_seconds`` is closed, by a reaper thread (one per process),
      so an idle worker does not keep connections, threads and reconnect attempts to a
      cluster it stopped reading.

    A task takes a client with :meth:`lease` (a context manager) and gives it back at the
    end; :meth:`discard` closes a client whose state an error made unknown once its lease
    ends. Keys are whatever identifies the configuration (sorted items of the conf).
    ``exclusive``: a client that is not thread-safe (the wire path's producers) is leased to
    one holder at a time; a second concurrent holder of the same key gets a client of its
    own.
    """

    def __init__(self, kind: str, size: int, close: Callable[[C], None],
                 idle_seconds: float = CLIENT_IDLE_SECONDS, exclusive: bool = False) -> None:
        self.kind, self.size, self.idle_seconds = kind, size, idle_seconds
        self.exclusive = exclusive
        self._making: set[Hashable] = set()  # exclusive: slots a thread is making a client for
        self._close = close
        self._lock = threading.Lock()
        self._clients: OrderedDict[Hashable, _Entry[C]] = OrderedDict()
        _CACHES.append(self)

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    @contextlib.contextmanager
    def lease(self, key: Hashable, make: Callable[[], C]) -> Iterator[C]:
        """The cached client for ``key`` (made with ``make()`` on first use), held by the
        caller until the ``with`` block ends."""
        entry = self._acquire(key, make)
        try:
            yield entry.client
        finally:
            self._release(entry)

    def acquire(self, key: Hashable, make: Callable[[], C]) -> Lease[C]:
        """:meth:`lease` for a holder that spans several calls (a task attempt's hooks):
        ``Lease.client`` until ``Lease.release()``."""
        return Lease(self, self._acquire(key, make))

    def put(self, key: Hashable, client: C) -> None:
        """Cache ``client`` under ``key`` (tests put stand-ins this way)."""
        evicted = []
        with self._lock:
            old = self._clients.pop(key, None)
            if old is not None and old.leases == 0:
                evicted.append(old)
            self._clients[key] = _Entry(client)
            evicted.extend(self._make_room())
        self._close_all(evicted)

    def discard(self, key: Hashable) -> None:
        """Forget the client of ``key`` (an error left it in an unknown state): closed now,
        or when the task holding it gives it back."""
        with self._lock:
            entry = self._clients.pop(key, None)
            if entry is None:
                return
            entry.discarded = True
            if entry.leases:
                return
        self._close_all([entry])

    def clear(self) -> None:
        """Close every client no task holds; forget the rest (closed when given back)."""
        with self._lock:
            entries = list(self._clients.values())
            self._clients.clear()
            idle = []
            for e in entries:
                e.discarded = True
                if not e.leases:
                    idle.append(e)
        self._close_all(idle)

    def _forget(self, entry: _Entry[C]) -> None:
        with self._lock:
            for key, cached in list(self._clients.items()):
                if cached is entry:
                    del self._clients[key]

    def reap(self, now: float | None = None) -> int:
        """Close the clients unused for ``idle_seconds``; return how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [k for k, e in self._clients.items()
                     if not e.leases and now - e.last_used >= self.idle_seconds]
            entries = [self._clients.pop(k) for k in stale]
        self._close_all(entries)
        return len(entries)

    def _acquire(self, key: Hashable, make: Callable[[], C]) -> _Entry[C]:
        _Reaper.ensure()
        if self.exclusive:
            return self._acquire_alone(key, make)
        with self._lock:
            entry = self._clients.get(key)
            if entry is not None:
                self._clients.move_to_end(key)
                entry.leases += 1
                return entry
        made = _Entry(make())  # outside the lock: a new client may take a while
        with self._lock:
            entry = self._clients.get(key)
            spare = [] if entry is None else [made]  # another thread made one first
            if entry is None:
                entry = self._clients[key] = made
            else:
                self._clients.move_to_end(key)
            entry.leases += 1
            evicted = self._make_room()
        self._close_all(spare + evicted)
        return entry

    def _acquire_alone(self, key: Hashable, make: Callable[[], C]) -> _Entry[C]:
        """An exclusive lease: the first slot ``(key, i)`` whose client nobody holds, or a
        new client in the first free slot."""
        with self._lock:
            i = 0
            while True:
                slot = (key, i)
                entry = self._clients.get(slot)
                if entry is None and slot not in self._making:
                    self._making.add(slot)
                    break
                if entry is not None and entry.leases == 0 and not entry.discarded:
                    self._clients.move_to_end(slot)
                    entry.leases = 1
                    return entry
                i += 1
        try:
            made = _Entry(make())  # outside the lock: a new client may take a while
        finally:
            with self._lock:
                self._making.discard(slot)
        with self._lock:
            made.leases = 1
            self._clients[slot] = made
            evicted = self._make_room()
        self._close_all(evicted)
        return made

    def _release(self, entry: _Entry[C]) -> None:
        with self._lock:
            entry.leases -= 1
            entry.last_used = time.monotonic()
            closing = entry.discarded and entry.leases == 0
            evicted = [] if closing else self._make_room()
        self._close_all(([entry] if closing else []) + evicted)

    def _make_room(self) -> list[_Entry[C]]:
        """Under the lock: drop least recently used idle clients while over ``size``."""
        out = []
        over = len(self._clients) - self.size
        for key in list(self._clients):
            if over <= 0:
                break
            if self._clients[key].leases == 0:
                out.append(self._clients.pop(key))
                over -= 1
        return out

    def _close_all(self, entries: list[_Entry[C]]) -> None:
        for e in entries:
            try:
                self._close(e.client)
            except Exception as exc:  # noqa: BLE001 - a client we are discarding anyway
                log.debug("closing a cached %s: %s", self.kind, exc)

    def _forget_after_fork(self) -> None:
        # A forked child must neither use nor close its parent's librdkafka handles (their
        # threads did not survive the fork). Nor may it free them: dropping the last
        # reference runs rd_kafka_destroy, which crashed the child with SIGSEGV (Spark's
        # gateway launch forks with a preexec_fn, so this hook runs there). They are kept
        # until the child exits or execs.
        _ABANDONED_AFTER_FORK.append(self._clients)
        self._lock = threading.Lock()
        self._clients = OrderedDict()


class Lease(Generic[C]):
    """A client held from :meth:`ClientCache.acquire` until :meth:`release` (idempotent)."""

    def __init__(self, cache: ClientCache[C], entry: _Entry[C]) -> None:
        self._cache, self._entry = cache, entry
        self.client = entry.client
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._cache._release(self._entry)

    def discard(self) -> None:
        """Give the client back to be closed (an error left it in an unknown state)."""
        self._entry.discarded = True
        self._cache._forget(self._entry)
        self.release()


class _Entry(Generic[C]):
    __slots__ = ("client", "leases", "last_used", "discarded")

    def __init__(self, client: C) -> None:
        self.client = client
        self.leases = 0
        self.last_used = time.monotonic()
        self.discarded = False




def cached_client_counts() -> dict[str, int]:
    """``{kind: clients cached}`` of every client cache of this process."""
    counts: dict[str, int] = {}
    for cache in _CACHES:
        counts[cache.kind] = counts.get(cache.kind, 0) + len(cache)
    return counts


def client_bounds() -> dict[str, int]:
    """``{kind: the most clients that kind keeps}`` (what :func:`cached_client_counts` may
    reach)."""
    bounds: dict[str, int] = {}
    for cache in _CACHES:
        bounds[cache.kind] = bounds.get(cache.kind, 0) + cache.size
    return bounds


def close_client_caches() -> None:
    """Close every cached client of this process (``connectors.kafka.close_cached_clients``)."""
    for cache in _CACHES:
        cache.clear()


class _Reaper:
    """One daemon thread per process closes idle clients of every cache."""

    _thread: threading.Thread | None = None
    _pid = 0
    _lock = threading.Lock()

    @classmethod
    def ensure(cls) -> None:
        if cls._thread is not None and cls._pid == os.getpid():
            return
        with cls._lock:
            if cls._thread is not None and cls._pid == os.getpid():
                return
            cls._pid = os.getpid()
            cls._thread = threading.Thread(target=cls._run, name="eo-kafka-client-reaper",
                                           daemon=True)
            cls._thread.start()

    @staticmethod
    def _run() -> None:
        while True:
            wait = min((c.idle_seconds for c in _CACHES), default=CLIENT_IDLE_SECONDS)
            time.sleep(min(5.0, max(0.05, wait / 4)))
            for cache in list(_CACHES):
                cache.reap()


_CACHES: list[ClientCache[Any]] = []
#: The parent's clients, never freed in a forked child (see ``_forget_after_fork``).
_ABANDONED_AFTER_FORK: list[Any] = []


def _after_fork_in_child() -> None:
    _Reaper._thread = None
    _Reaper._lock = threading.Lock()
    for cache in _CACHES:
        cache._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
