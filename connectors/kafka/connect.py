"""The first request to a Kafka cluster: bounded by ``connectTimeout`` in total, and a
diagnosis that names the likely cause first.

The source (``Clusters``, on the driver) and the sink (``targets.check_reachable``) ask a
cluster for metadata before anything else. :func:`first_contact` asks in short slices until
``connectTimeout`` has passed since the call started, and between the slices reads what
librdkafka reported about the connection (``error_cb``, :class:`ConnectWatch`):

- a broker that answers TCP but fails the handshake (a SASL client on a PLAINTEXT listener,
  TLS against a plain listener or the reverse) or refuses authentication will not get better
  by waiting: the call fails as soon as librdkafka has seen it twice, with the security
  protocol mismatch (or the authentication, or the certificate) named first and what to
  check. Two of librdkafka's reports are ambiguous: a listener that closes the connection
  during a TLS handshake or during the first plaintext request may be a listener of the
  other protocol, or a proxy whose brokers are down (HAProxy accepts and closes). Those are
  confirmed by one probe of the listener (:func:`speaks_kafka_plaintext`,
  :func:`speaks_tls`) before they end the wait; unconfirmed, the wait goes on;
- a broker that does not answer (refused, unresolvable, filtered) is asked until the deadline,
  then fails with :func:`connectors.kafka.common.unreachable`'s message and librdkafka's last
  connection error.

No message holds a secret: librdkafka's words are passed through
:func:`connectors.kafka.config.scrub` with the client's configuration.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from connectors.core.errors import ConnectorError, outage
from connectors.kafka.common import unreachable
from connectors.kafka.config import SECURITY_PROTOCOLS, scrub

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A handshake failure seen this often is a verdict, not a blip (a broker restarting can
#: drop one connection mid-handshake).
HANDSHAKE_FAILURES = 2
#: The first and the longest slice of the first request, in seconds: short enough to read
#: librdkafka's connection errors soon, long enough for a TLS handshake to a remote cluster
#: (the connection carries on across slices).
FIRST_SLICE, MAX_SLICE = 0.25, 2.0

# What librdkafka's connection errors mean, by cause.
_SASL_ON_PLAIN = "sasl on a listener without SASL"
_TLS_ON_PLAIN = "TLS on a listener without TLS"
_PLAIN_ON_TLS = "no TLS on a TLS listener"
_CERTIFICATE = "certificate"
_AUTHENTICATION = "authentication"
_HANDSHAKE = "handshake"


def _cause(name: str, text: str) -> str | None:
    """The cause of one librdkafka error (``error_cb``), or None for "not reachable"."""
    lowered = text.lower()
    if "certificate verify failed" in lowered or "certificate verification" in lowered:
        return _CERTIFICATE
    if "ssl handshake failed" in lowered:
        if "plaintext broker listener" in lowered or "closed by peer" in lowered:
            return _TLS_ON_PLAIN
        return _HANDSHAKE
    if "while requesting apiversion" in lowered and "security.protocol" in lowered:
        return _PLAIN_ON_TLS
    if name == "_AUTHENTICATION" or "authentication" in lowered:
        if "not valid in current sasl state" in lowered or "supported mechanisms:  (" in text:
            return _SASL_ON_PLAIN
        return _AUTHENTICATION
    return None


class ConnectWatch:
    """A client's ``error_cb``: keeps what librdkafka reported about its connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: deque[tuple[str, str]] = deque(maxlen=32)

    def __call__(self, err: Any) -> None:
        with self._lock:
            self._seen.append((str(err.name()), str(err.str())))

    def verdict(self) -> tuple[str, str] | None:
        """``(cause, librdkafka's words)`` once a handshake or authentication failure was
        seen :data:`HANDSHAKE_FAILURES` times (an unambiguous one first); None while it may
        still connect."""
        counts: dict[str, int] = {}
        with self._lock:
            seen = list(self._seen)
        found: list[tuple[str, str]] = []
        for name, text in seen:
            cause = _cause(name, text)
            if cause is not None:
                counts[cause] = counts.get(cause, 0) + 1
                if counts[cause] == HANDSHAKE_FAILURES:
                    found.append((cause, text))
        found.sort(key=lambda f: f[0] in _AMBIGUOUS)
        return found[0] if found else None

    def last(self) -> str | None:
        """librdkafka's latest connection error (``Connect to ... failed: ...``)."""
        with self._lock:
            for name, text in reversed(self._seen):
                if name != "_ALL_BROKERS_DOWN":
                    return text
        return None


_WATCHES: weakref.WeakKeyDictionary[Any, ConnectWatch] = weakref.WeakKeyDictionary()

#: A listener closing the connection says this much; the probes say what it speaks.
_AMBIGUOUS = (_TLS_ON_PLAIN, _PLAIN_ON_TLS)
#: The longest a probe may take, in seconds.
PROBE_TIMEOUT = 2.0


def _address(said: str, bootstrap: Any) -> tuple[str, int] | None:
    """The broker librdkafka's message is about (``sasl_ssl://h:9093/bootstrap: ...``),
    else the first bootstrap server."""
    m = re.match(r"^(?:\w+://)?\[?([^\s\[\]/]+?)\]?:(\d+)/", said)
    if m is None:
        m = re.match(r"^\s*(?:\w+://)?\[?([^\s,\[\]]+?)\]?:(\d+)", str(bootstrap))
    return None if m is None else (m.group(1), int(m.group(2)))


def speaks_kafka_plaintext(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the listener answers a plaintext Kafka ApiVersions request (a PLAINTEXT or
    SASL_PLAINTEXT listener does, before any authentication)."""
    correlation = 0x656F6B31
    # size, api_key 18 (ApiVersions), version 0, correlation id, null client id
    request = struct.pack(">ihhih", 10, 18, 0, correlation, -1)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(request)
            answer = b""
            while len(answer) < 8:
                chunk = sock.recv(8 - len(answer))
                if not chunk:
                    return False
                answer += chunk
    except OSError:
        return False
    size, got = struct.unpack(">ii", answer)
    return got == correlation and 0 < size < 1 << 20


def speaks_tls(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the listener completes a TLS handshake (its certificate is not judged: the
    question is only which protocol it speaks)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # a probe of the protocol; no data is exchanged
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock, \
                context.wrap_socket(sock, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


def _confirmed(cause: str, said: str, bootstrap: Any, timeout: float) -> bool:
    address = _address(said, bootstrap)
    if address is None:
        return False
    probe = speaks_kafka_plaintext if cause == _TLS_ON_PLAIN else speaks_tls
    return probe(*address, timeout=max(0.1, min(PROBE_TIMEOUT, timeout)))


def watched_admin(conf: Mapping[str, Any]) -> Any:
    """An ``AdminClient`` for ``conf`` whose connection errors :func:`first_contact` reads."""
    from confluent_kafka.admin import AdminClient

    watch = ConnectWatch()
    full: dict[str, Any] = {**conf, "error_cb": watch}
    client = AdminClient(full)
    _WATCHES[client] = watch
    return client


def first_contact(client: Any, ask: Callable[[float], T], *, timeout: float,
                  who: str, bootstrap: Any, conf: Mapping[str, Any],
                  error: type[ConnectorError], where: str = "from here",
                  started: float | None = None) -> T:
    """``ask(seconds)`` (a metadata request of ``client``) until it answers, within
    ``timeout`` seconds from ``started`` (default: now) in total. Fails early, with the
    cause, on a handshake or authentication failure; at the deadline as unreachable."""
    began = time.monotonic() if started is None else started
    deadline = began + timeout
    try:
        watch = _WATCHES.get(client)
    except TypeError:  # a client that takes no weak reference (a test's stand-in)
        watch = None
    wait = FIRST_SLICE
    last: BaseException | None = None
    probed: set[str] = set()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            return ask(min(wait, left))
        except ConnectorError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the first request: ask again
            last = e
        wait = min(wait * 2, MAX_SLICE)
        if watch is None:
            continue
        client.poll(0)  # serves error_cb
        found = watch.verdict()
        if found is None:
            continue
        cause, said = found
        if cause in _AMBIGUOUS:
            if cause in probed:
                continue
            probed.add(cause)
            if not _confirmed(cause, said, bootstrap, deadline - time.monotonic()):
                continue
        raise error(diagnose(who, bootstrap, conf, cause, said)) from None
    detail: Any = last if watch is None or watch.last() is None else watch.last()
    raise outage(error, unreachable(who, bootstrap, timeout, scrub(str(detail), conf),
                                    where)) from None


def diagnose(who: str, bootstrap: Any, conf: Mapping[str, Any], cause: str,
             said: str) -> str:
    """The message of a broker that answered but failed the handshake: cause first, then
    what to check, then librdkafka's words (scrubbed)."""
    protocol = str(conf.get("security.protocol", "PLAINTEXT")).upper()
    shown = f"kafka.security.protocol={protocol}" + (
        "" if "security.protocol" in conf else " (the default)")
    said = scrub(said, conf)
    valid = ", ".join(SECURITY_PROTOCOLS)
    check = (f"Check which protocol the listener at {bootstrap} uses (the broker's "
             "`listeners` and `listener.security.protocol.map`, or ask the cluster's "
             f"operator) and set kafka.security.protocol to match ({valid}); kafka.sasl.* "
             "settings apply to SASL_* listeners only")
    if cause in (_SASL_ON_PLAIN, _TLS_ON_PLAIN, _PLAIN_ON_TLS, _HANDSHAKE):
        listener = {
            _SASL_ON_PLAIN: "does not offer SASL authentication (a PLAINTEXT or SSL listener?)",
            _TLS_ON_PLAIN: "does not speak TLS (a PLAINTEXT or SASL_PLAINTEXT listener?)",
            _PLAIN_ON_TLS: "expects TLS (an SSL or SASL_SSL listener?)",
            _HANDSHAKE: "did not complete the TLS handshake",
        }[cause]
        return (f"{who}: security protocol mismatch (most likely): the broker at {bootstrap} "
                f"answered, but with {shown} the listener {listener}. {check}. librdkafka "
                f"said: {said}")
    if cause == _CERTIFICATE:
        return (f"{who}: TLS certificate not accepted: the broker at {bootstrap} answered, "
                "but its certificate failed verification: check kafka.ssl.ca.location (the "
                "CA that signed the broker's certificate) and that the host name in "
                "kafka.bootstrap.servers is in the certificate "
                f"(kafka.ssl.endpoint.identification.algorithm). librdkafka said: {said}")
    mechanism = conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI"))
    user = conf.get("sasl.username")
    as_user = f", kafka.sasl.username={user}" if user else ""
    return (f"{who}: authentication failed: the broker at {bootstrap} refused the "
            f"credentials (kafka.sasl.mechanism={mechanism}{as_user}): check the username and "
            "kafka.sasl.password, and that the listener enables that mechanism (for SCRAM, "
            f"that the user was created for it). librdkafka said: {said}")
