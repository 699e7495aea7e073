"""Kafka's wire protocol, as far as this package speaks it: the API keys and versions, error
codes, the primitive encodings and one broker connection. The requests themselves are
encoded and read in :mod:`connectors.kafka.wire.requests`, record batches in
:mod:`connectors.kafka.wire.record_batch`.

The request versions without tagged fields are used (:data:`VERSIONS`: Kafka 2.1 and
later, 4.x included); ``ApiVersions`` confirms them on every new look-up connection. Where
the cluster has transactions v2 (KIP-890 part 2), the transactional path speaks the
flexible versions of :data:`TV2_VERSIONS` instead.
"""

from __future__ import annotations

import functools
import select
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from connectors.core.errors import KafkaClientError
from connectors.kafka.common import FAMILY
from connectors.kafka.wire.sasl import (
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SaslFailed,
    authenticate,
)
from connectors.kafka.wire.settings import Settings

# API keys and the (non-flexible) versions the client speaks.
PRODUCE, LIST_OFFSETS, METADATA, OFFSET_FETCH, FIND_COORDINATOR, DESCRIBE_GROUPS = (
    0, 2, 3, 9, 10, 15)
API_VERSIONS = 18
CREATE_TOPICS, INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN = 19, 22, 24, 25, 26
TXN_OFFSET_COMMIT, DESCRIBE_CONFIGS = 28, 32
#: What the producer needs of every broker (ApiVersions on each new look-up connection).
VERSIONS = {PRODUCE: 7, METADATA: 7, FIND_COORDINATOR: 1, INIT_PRODUCER_ID: 1,
            ADD_PARTITIONS: 2, ADD_OFFSETS: 2, END_TXN: 2, TXN_OFFSET_COMMIT: 2,
            SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 1}
#: The admin look-ups' versions (:mod:`connectors.kafka.wire.admin`), asked of the cluster
#: before their first use.
ADMIN_VERSIONS = {LIST_OFFSETS: 4, DESCRIBE_GROUPS: 3, CREATE_TOPICS: 4, DESCRIBE_CONFIGS: 1,
                  OFFSET_FETCH: 7}
#: Transactions v2 (KIP-890 part 2, Kafka 4.0): the partitions and the fact group join the
#: transaction with the Produce and TxnOffsetCommit themselves, and every EndTxn bumps the
#: producer epoch. ApiVersions v3 tells whether the cluster finalized ``transaction.version``.
TV2_VERSIONS = {PRODUCE: 12, END_TXN: 5, TXN_OFFSET_COMMIT: 5, API_VERSIONS: 3}
#: The first version of each request with tagged fields (KIP-482: a header with tagged
#: fields, compact strings and arrays); an ApiVersions answer's header never has them.
FLEXIBLE_FROM = {PRODUCE: 9, METADATA: 9, OFFSET_FETCH: 6, FIND_COORDINATOR: 3,
                 INIT_PRODUCER_ID: 2, ADD_PARTITIONS: 3, ADD_OFFSETS: 3, END_TXN: 3,
                 TXN_OFFSET_COMMIT: 3, API_VERSIONS: 3, SASL_AUTHENTICATE: 2}
API_NAMES = {PRODUCE: "Produce", LIST_OFFSETS: "ListOffsets", METADATA: "Metadata",
             OFFSET_FETCH: "OffsetFetch",
             FIND_COORDINATOR: "FindCoordinator", DESCRIBE_GROUPS: "DescribeGroups",
             API_VERSIONS: "ApiVersions", CREATE_TOPICS: "CreateTopics",
             INIT_PRODUCER_ID: "InitProducerId", ADD_PARTITIONS: "AddPartitionsToTxn",
             ADD_OFFSETS: "AddOffsetsToTxn", END_TXN: "EndTxn",
             TXN_OFFSET_COMMIT: "TxnOffsetCommit", DESCRIBE_CONFIGS: "DescribeConfigs",
             SASL_HANDSHAKE: "SaslHandshake", SASL_AUTHENTICATE: "SaslAuthenticate"}

#: Kafka's error codes this module names (org.apache.kafka.common.protocol.Errors).
ERRORS = {
    -1: "UNKNOWN_SERVER_ERROR", 2: "CORRUPT_MESSAGE", 3: "UNKNOWN_TOPIC_OR_PARTITION",
    5: "LEADER_NOT_AVAILABLE", 6: "NOT_LEADER_OR_FOLLOWER", 7: "REQUEST_TIMED_OUT",
    10: "MESSAGE_TOO_LARGE", 13: "NETWORK_EXCEPTION", 14: "COORDINATOR_LOAD_IN_PROGRESS",
    15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR", 18: "RECORD_LIST_TOO_LARGE",
    19: "NOT_ENOUGH_REPLICAS", 20: "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    29: "TOPIC_AUTHORIZATION_FAILED", 30: "GROUP_AUTHORIZATION_FAILED",
    31: "CLUSTER_AUTHORIZATION_FAILED", 35: "UNSUPPORTED_VERSION",
    36: "TOPIC_ALREADY_EXISTS", 37: "INVALID_PARTITIONS", 38: "INVALID_REPLICATION_FACTOR",
    41: "NOT_CONTROLLER", 69: "GROUP_ID_NOT_FOUND",
    45: "OUT_OF_ORDER_SEQUENCE_NUMBER", 46: "DUPLICATE_SEQUENCE_NUMBER",
    47: "INVALID_PRODUCER_EPOCH", 48: "INVALID_TXN_STATE", 49: "INVALID_PRODUCER_ID_MAPPING",
    50: "INVALID_TRANSACTION_TIMEOUT", 51: "CONCURRENT_TRANSACTIONS",
    53: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", 56: "KAFKA_STORAGE_ERROR",
    58: "SASL_AUTHENTICATION_FAILED", 59: "UNKNOWN_PRODUCER_ID",
    74: "FENCED_LEADER_EPOCH", 75: "UNKNOWN_LEADER_EPOCH", 87: "INVALID_RECORD",
    88: "UNSTABLE_OFFSET_COMMIT", 89: "THROTTLING_QUOTA_EXCEEDED", 90: "PRODUCER_FENCED",
    120: "TRANSACTION_ABORTABLE",
}
#: Asked again (Kafka marks them retriable; CONCURRENT_TRANSACTIONS: the previous attempt's
#: transaction is still being completed or aborted).
RETRIABLE = frozenset({3, 5, 6, 7, 13, 14, 15, 16, 19, 20, 41, 51, 56, 74, 75, 88, 89})
#: A partition's leader moved or is being elected: its metadata is stale.
STALE_LEADER = frozenset({3, 5, 6, 74, 75})
#: The coordinator moved or is not there: find it again.
COORDINATOR_MOVED = frozenset({15, 16})
#: This producer was fenced by a newer attempt of the same task.
FENCED = frozenset({47, 90})
DUPLICATE_SEQUENCE, OUT_OF_ORDER_SEQUENCE, NETWORK_EXCEPTION = 46, 45, 13
#: The previous transaction of the transactional.id still writing its commit markers.
CONCURRENT_TRANSACTIONS = 51

#: The longest wait for a lookup any live broker answers at once (Metadata, FindCoordinator,
#: ApiVersions): a broker that does not answer in this time is left for the next one.
LOOKUP_TIMEOUT = 10.0
#: A SASL session is renewed (a new connection) when this share of its lifetime has passed
#: (KIP-368: the broker closes a connection whose session expired).
REAUTH_AT = 0.85


class WireError(KafkaClientError):
    """A Kafka error answer, or a connection that failed (:class:`ConnectionLost`); ``code``
    is Kafka's error code. Its message names the connector that asked (``who``); the
    connectors' own errors wrap it where they add what to do (``raise ... from``)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
        self.name = ERRORS.get(code, f"error {code}")

    @property
    def retriable(self) -> bool:
        """Kafka marks the error retriable (asking again may succeed)."""
        return self.code in RETRIABLE


# -- encoding -----------------------------------------------------------------------------------
def string(s: str | None) -> bytes:
    if s is None:
        return b"\xff\xff"
    b = s.encode()
    return struct.pack(">h", len(b)) + b


class Reader:
    """Reads an answer's fields in order (``at``: the next byte)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data, self.at = memoryview(data), 0

    def take(self, fmt: str) -> Any:
        out = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return out if len(out) > 1 else out[0]

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        s = bytes(self.data[self.at:self.at + n]).decode()
        self.at += n
        return s

    def array(self, item: Callable[[], Any]) -> list[Any]:
        return [item() for _ in range(max(self.take(">i"), 0))]

    # Flexible versions (KIP-482): unsigned varint lengths, plus one, 0 for null.
    def uvarint(self) -> int:
        out, shift = 0, 0
        while True:
            b = self.data[self.at]
            self.at += 1
            out |= (b & 0x7F) << shift
            if b < 0x80:
                return out
            shift += 7
            if shift > 28:
                raise ProtocolViolation("an unsigned varint longer than 5 bytes")

    def compact_string(self) -> str | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        s = bytes(self.data[self.at:self.at + n]).decode()
        self.at += n
        return s

    def compact_count(self) -> int:
        """A compact array's length (a null array: 0)."""
        return max(self.uvarint() - 1, 0)

    def tags(self) -> dict[int, memoryview]:
        """A tagged-field section: each tag's raw bytes."""
        out = {}
        for _ in range(self.uvarint()):
            tag, size = self.uvarint(), self.uvarint()
            out[tag] = self.data[self.at:self.at + size]
            self.at += size
        return out


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def compact(s: str | None) -> bytes:
    """A compact (nullable) string of a flexible version."""
    if s is None:
        return b"\x00"
    b = s.encode()
    return uvarint(len(b) + 1) + b


# -- connections --------------------------------------------------------------------------------
class ConnectionLost(WireError):
    """A broker connection that broke, timed out or answered out of protocol: every request
    still unanswered on it has an unknown outcome (``unanswered``). Retriable: the caller
    connects again and sends again (a Produce with its same sequence)."""

    def __init__(self, message: str, unanswered: int) -> None:
        super().__init__(message, NETWORK_EXCEPTION)
        self.unanswered = unanswered


F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """``method`` under the connection's lock."""

    @functools.wraps(method)
    def run(self: Connection, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            return method(self, *args, **kwargs)

    return cast(F, run)


class Connection:
    """One broker connection. Requests may be pipelined; each answer is matched to its
    request by correlation id, never by position. Any failure (a timeout, a reset, a frame
    too large or out of protocol) closes the connection for good (``broken``): a caller
    never reads a stale answer from it. Several threads may share it: each send, receive
    and call holds its lock, and an answer read for another caller waits for it in
    ``answers``. ``counts``: requests sent, by API key (a counter the owner reads)."""

    def __init__(self, host: str, port: int, settings: Settings,
                 counts: Counter[int] | None = None) -> None:
        self.address = f"{host}:{port}"
        self.settings = settings
        self.lock = threading.RLock()
        self.counts: Counter[int] = Counter() if counts is None else counts
        sock = socket.create_connection((host, port), timeout=settings.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.send_buffer)
        if settings.receive_buffer > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, settings.receive_buffer)
        if settings.keepalive:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if settings.ssl_context is not None:
            sock = settings.ssl_context.wrap_socket(sock, server_hostname=host)
        sock.settimeout(settings.socket_timeout)
        self.sock = sock
        self.client_id = string(settings.client_id)
        self.next_id = 0
        self.pending: dict[int, int] = {}  # correlation id -> API key, in send order
        self.flexible: set[int] = set()  # correlation ids whose answer header has tags
        self.answers: dict[int, bytearray] = {}  # answers read ahead of their turn
        self.broken = False
        self.renew_at = float("inf")
        if settings.login is not None:
            try:
                lifetime_ms = authenticate(self.call, settings.login)
            except SaslFailed as e:
                self.close()
                raise WireError(f"{FAMILY}: {self.address}: {e}", 58) from None
            if lifetime_ms > 0:  # KIP-368: the broker closes the session at its end
                self.renew_at = time.monotonic() + REAUTH_AT * lifetime_ms / 1000.0

    @_locked
    def usable(self) -> bool:
        """Not broken, and not closed by the broker while it sat idle (``connections.max.idle.ms``,
        a restart, a load balancer's idle timeout). A broker never writes unasked, so an idle
        connection with something to read has been closed (or broke the protocol): it is
        closed here, before a request is sent into it and counted as lost. TLS housekeeping
        (a session ticket) is read and the connection kept."""
        if self.broken:
            return False
        if self.pending or self.answers:
            return True
        sock = self.sock
        tls = sock if isinstance(sock, ssl.SSLSocket) else None
        try:
            readable = bool(select.select([sock], [], [], 0)[0]) or (
                tls is not None and tls.pending() > 0)
        except (OSError, ValueError):
            readable = True
        if not readable:
            return True
        try:
            if tls is not None:
                tls.setblocking(False)
                try:
                    tls.recv(1)  # b"" (closed), a byte (out of protocol) or housekeeping
                finally:
                    tls.settimeout(self.settings.socket_timeout)
            else:
                sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return True
        except OSError:
            pass
        self.close()
        return False

    def expiring(self) -> bool:
        """The SASL session is near its end: open a new connection before the next burst."""
        return time.monotonic() >= self.renew_at

    @_locked
    def send(self, api: int, parts: Sequence[bytes | memoryview],
             version: int | None = None) -> int:
        """Send one request (``version``: default :data:`VERSIONS`'); its correlation id, to
        :meth:`receive` its answer by."""
        if self.broken:
            raise self._lost(api, "the connection was already closed")
        self.next_id = (self.next_id + 1) & 0x7FFFFFFF
        if version is None:
            version = VERSIONS.get(api, ADMIN_VERSIONS.get(api, 0))
        header = struct.pack(">hhi", api, version, self.next_id) + self.client_id
        if version >= FLEXIBLE_FROM.get(api, 1 << 15):
            header += b"\x00"  # request header v2: no tagged fields
            if api != API_VERSIONS:
                self.flexible.add(self.next_id)
        size = len(header) + sum(len(p) for p in parts)
        self.pending[self.next_id] = api
        self.counts[api] += 1
        try:
            self.sock.sendall(struct.pack(">i", size) + header)
            for p in parts:
                self.sock.sendall(p)
        except OSError as e:
            raise self._lost(api, e) from None
        return self.next_id

    @_locked
    def receive(self, correlation: int | None = None) -> Reader:
        """The answer to ``correlation`` (default: the oldest request unanswered). Answers
        of other requests read on the way are kept for their own :meth:`receive`."""
        if correlation is None:
            correlation = next(iter(self.pending))
        api = self.pending.get(correlation)
        if api is None:
            raise WireError(f"{FAMILY}: no request {correlation} waits on "
                            f"{self.address} (internal)", -1)
        body = self.answers.pop(correlation, None)
        while body is None:
            if self.broken:
                raise self._lost(api, "the connection was closed")
            try:
                size = struct.unpack(">i", self._read(4))[0]
                if not 4 <= size <= self.settings.max_frame_bytes:
                    raise ProtocolViolation(f"an answer of {size} bytes (at most "
                                            f"{self.settings.max_frame_bytes}, "
                                            "receive.message.max.bytes)")
                frame = self._read(size)
                got = struct.unpack_from(">i", frame)[0]
                if got not in self.pending or got in self.answers:
                    raise ProtocolViolation(f"an answer to request {got}, which is not "
                                            "waiting")
            except (OSError, ProtocolViolation) as e:
                raise self._lost(api, e) from None
            if got == correlation:
                body = frame
            else:
                self.answers[got] = frame
        del self.pending[correlation]
        reader = Reader(body)
        reader.at = 4
        if correlation in self.flexible:
            self.flexible.discard(correlation)
            reader.tags()  # response header v1
        return reader

    @_locked
    def call(self, api: int, body: bytes, timeout: float | None = None,
             version: int | None = None) -> Reader:
        """Send and wait for the answer; ``timeout``: a shorter wait than the socket's (a
        lookup any live broker can answer at once goes elsewhere sooner)."""
        if timeout is None or self.broken:
            return self.receive(self.send(api, [body], version))
        self.sock.settimeout(min(timeout, self.settings.socket_timeout))
        try:
            return self.receive(self.send(api, [body], version))
        finally:
            if not self.broken:
                self.sock.settimeout(self.settings.socket_timeout)

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise ConnectionError(f"{self.address} closed the connection")
            got += k
        return buf

    def _lost(self, api: int, error: object) -> ConnectionLost:
        """Close for good; the error names the broker, the request and how many requests
        have an unknown outcome now."""
        unanswered = len(self.pending)
        self.close()
        what = str(error) or type(error).__name__
        return ConnectionLost(
            f"{FAMILY}: the connection to broker {self.address} broke during "
            f"{API_NAMES.get(api, f'request {api}')} ({what}); {unanswered} requests "
            "unanswered", unanswered)

    @_locked
    def close(self) -> None:
        self.broken = True
        try:
            self.sock.close()
        except OSError:
            pass


class ProtocolViolation(Exception):
    """An answer no correct broker sends (internal: it closes the connection)."""


class UnsupportedBroker(WireError):
    """The broker does not serve a request version the wire client needs."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 35)
