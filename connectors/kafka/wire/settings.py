"""The wire client's settings: what it takes from a connector's librdkafka configuration,
which of librdkafka's connection settings it honours itself, and the TLS context librdkafka
would build. A setting of a connection family it does not honour makes the connectors use
librdkafka for that cluster instead (``not_honoured``, :func:`connection_unsupported`).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connectors.kafka.wire.sasl import MECHANISMS, Login, mechanism_of

#: The largest record batch (librdkafka's and the broker's default ``message.max.bytes``;
#: ``kafka.message.max.bytes`` lowers or raises it).
DEFAULT_MAX_BATCH_BYTES = 1_000_000

#: librdkafka settings the wire path honours itself (``Settings.of``); every other setting
#: of the families in :data:`CONNECTION_FAMILIES` sends the records through librdkafka
#: instead (:func:`connection_unsupported`), so no setting that shapes a connection is silently
#: ignored. Settings of other families (linger, batching, queueing) have no meaning here.
HONOURED = frozenset({
    "bootstrap.servers", "metadata.broker.list", "client.id", "security.protocol",
    "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.cipher.suites", "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "socket.timeout.ms", "socket.connection.setup.timeout.ms", "socket.keepalive.enable",
    "socket.nagle.disable", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
    "request.timeout.ms", "message.timeout.ms", "delivery.timeout.ms", "transaction.timeout.ms",
    "message.max.bytes", "receive.message.max.bytes", "retry.backoff.ms",
    "retry.backoff.max.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms",
    "broker.address.family",
})
#: Prefixes of the settings that shape a connection (see :data:`HONOURED`).
CONNECTION_FAMILIES = ("ssl.", "ssl_", "sasl.", "socket.", "broker.", "security.",
                       "client.dns.", "connections.", "reconnect.", "https.", "oauthbearer")


def _ms(conf: Mapping[str, Any], key: str, default: int) -> float:
    return int(conf.get(key, default)) / 1000.0


@dataclass(frozen=True)
class Settings:
    """What the wire path takes from the sink's librdkafka producer configuration, with
    librdkafka's defaults (``request_timeout``: what the broker may take for ``acks=all``;
    ``socket_timeout``: how long the client waits for any answer, always above it;
    ``delivery_timeout``: ``message.timeout.ms``, how long a batch may be sent again)."""

    bootstrap: tuple[tuple[str, int], ...]
    client_id: str
    request_timeout: float
    socket_timeout: float
    connect_timeout: float
    delivery_timeout: float
    retry_backoff: float
    retry_backoff_max: float
    reconnect_backoff: float
    reconnect_backoff_max: float
    send_buffer: int
    receive_buffer: int
    transaction_timeout_ms: int
    max_batch_bytes: int
    max_frame_bytes: int
    keepalive: bool
    ssl_context: ssl.SSLContext | None
    login: Login | None

    @classmethod
    def of(cls, conf: Mapping[str, Any], client_id: str = "eo-kafka-sink") -> Settings:
        servers = []
        listed = conf.get("bootstrap.servers") or conf.get("metadata.broker.list") or ""
        for item in str(listed).split(","):
            item = item.strip()
            item = item.split("://", 1)[-1]
            if not item:
                continue
            host, _, port = item.rpartition(":")
            servers.append((host.strip("[]") or "localhost", int(port or 9092)))
        request_timeout = _ms(conf, "request.timeout.ms", 30000)
        return cls(
            bootstrap=tuple(servers),
            client_id=str(conf.get("client.id", client_id)),
            request_timeout=request_timeout,
            # librdkafka waits socket.timeout.ms for a Produce answer; the broker may take
            # request.timeout.ms to answer one, so the client always waits longer than that.
            socket_timeout=max(_ms(conf, "socket.timeout.ms", 60000), request_timeout + 5.0),
            connect_timeout=_ms(conf, "socket.connection.setup.timeout.ms", 30000),
            delivery_timeout=_ms(conf, "message.timeout.ms",
                                 int(conf.get("delivery.timeout.ms", 300000))),
            retry_backoff=_ms(conf, "retry.backoff.ms", 100),
            retry_backoff_max=_ms(conf, "retry.backoff.max.ms", 1000),
            reconnect_backoff=_ms(conf, "reconnect.backoff.ms", 100),
            reconnect_backoff_max=_ms(conf, "reconnect.backoff.max.ms", 10000),
            send_buffer=int(conf.get("socket.send.buffer.bytes", 4 << 20)) or 4 << 20,
            receive_buffer=int(conf.get("socket.receive.buffer.bytes", 0)),
            transaction_timeout_ms=int(conf.get("transaction.timeout.ms", 60000)),
            max_batch_bytes=int(conf.get("message.max.bytes", DEFAULT_MAX_BATCH_BYTES)),
            max_frame_bytes=int(conf.get("receive.message.max.bytes", 100_000_000)) + 512,
            keepalive=str(conf.get("socket.keepalive.enable", "false")).lower() == "true",
            ssl_context=_ssl_context(conf),
            login=Login.of(conf),
        )


def _ssl_context(conf: Mapping[str, Any]) -> ssl.SSLContext | None:
    """The TLS settings librdkafka would use: ``ssl.ca.location`` a file, a directory or
    ``probe`` (the system's trust store), client certificate, cipher suites, verification."""
    if str(conf.get("security.protocol", "plaintext")).lower() not in ("ssl", "sasl_ssl"):
        return None
    ca = conf.get("ssl.ca.location")
    if ca and os.path.isdir(str(ca)):
        context = ssl.create_default_context(capath=str(ca))
    elif ca and str(ca).lower() != "probe":
        context = ssl.create_default_context(cafile=str(ca))
    else:
        context = ssl.create_default_context()  # the system's trust store
    if conf.get("ssl.cipher.suites"):
        context.set_ciphers(str(conf["ssl.cipher.suites"]))
    if str(conf.get("enable.ssl.certificate.verification", "true")).lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif str(conf.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        context.check_hostname = False
    if conf.get("ssl.certificate.location"):
        context.load_cert_chain(conf["ssl.certificate.location"], conf.get("ssl.key.location"),
                                conf.get("ssl.key.password"))
    return context


def not_honoured(conf: Mapping[str, Any]) -> list[str]:
    """The settings of ``conf`` that shape a connection and that the wire path does not
    honour (sorted); ``broker.address.family`` other than ``any``/``v4`` counts too."""
    out = sorted(k for k in conf if k not in HONOURED
                 and str(k).lower().startswith(CONNECTION_FAMILIES))
    if str(conf.get("broker.address.family", "any")).lower() not in ("any", "v4"):
        out.append("broker.address.family")
    if str(conf.get("socket.nagle.disable", "true")).lower() == "false":
        out.append("socket.nagle.disable")
    return out


def connection_unsupported(conf: Mapping[str, Any]) -> str | None:
    """Why the wire client cannot connect with this librdkafka configuration the way
    librdkafka would (None: it can): a security protocol or SASL mechanism it does not
    speak, or a connection setting it does not honour."""
    protocol = str(conf.get("security.protocol", "plaintext")).lower()
    if protocol not in ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"):
        return f"security.protocol={protocol}"
    if protocol.startswith("sasl_") and mechanism_of(conf) not in MECHANISMS:
        return (f"sasl.mechanism={mechanism_of(conf)} (the wire client speaks "
                f"{', '.join(MECHANISMS)})")
    ignored = not_honoured(conf)
    if ignored:
        return (f"{', '.join(ignored)} set (the wire client does not honour "
                f"{'it' if len(ignored) == 1 else 'them'}; docs/kafka-sink.md, Produce paths)")
    return None
