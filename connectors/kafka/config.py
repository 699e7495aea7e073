"""librdkafka settings (``kafka.*``) checked when options are parsed, and kept secret.

:func:`check_client_config` is the one check of the source, the sink and ``KafkaWindows``
(through the source's options): it hands the configuration a component will use to
librdkafka itself, by building a client of the right kind and destroying it at once, so a
misspelled property (``kafka.fetch.max.bytez``) or a bad value
(``kafka.security.protocol=SASL_SSLL``) fails at ``load()``, ``start()`` or the constructor,
with an :class:`~connectors.core.errors.OptionError` that names the option as the user wrote
it, says what is wrong, and names the nearest valid property or the valid values. Without
the check such a setting passes the driver and fails seconds later inside a task, in
librdkafka's words and hundreds of log lines.

Building the client makes no network call: the check drops ``bootstrap.servers`` (no broker
to connect to), and for the SASL mechanisms whose set-up talks to a server when the client
starts (OAUTHBEARER with OIDC fetches a token, GSSAPI runs ``kinit``) it checks the settings
with the transport's TLS part only and asks librdkafka whether the build supports the
mechanism (``builtin.features``).

:func:`scrub` removes the values of secret settings from any text (librdkafka's error
strings, which we quote in our own errors); :func:`is_secret` decides what is secret.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from connectors.core.errors import OptionError
from connectors.core.options import (
    MIN_SCRUBBED,
    REDACTED,
    OptionReader,
    closest,
    is_secret,
    scrub_known,
)

log = logging.getLogger(__name__)

#: Where librdkafka lists every property, its values and which client takes it.
CONFIGURATION_URL = "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("GSSAPI", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
#: The librdkafka feature each mechanism needs (``builtin.features`` refuses a missing one).
_MECHANISM_FEATURE = {"GSSAPI": "sasl_gssapi", "PLAIN": "sasl_plain",
                      "SCRAM-SHA-256": "sasl_scram", "SCRAM-SHA-512": "sasl_scram",
                      "OAUTHBEARER": "sasl_oauthbearer"}
#: Mechanisms whose client start contacts a server (token endpoint, KDC): checked without
#: the SASL layer, see the module docstring.
_MECHANISM_STARTS_IO = ("GSSAPI", "OAUTHBEARER")

#: librdkafka's property names (librdkafka 2.x, ``rd_kafka_conf_properties_show``, callbacks
#: left out): the vocabulary of "did you mean". librdkafka itself decides what is valid; a
#: unit test holds every name here against the installed librdkafka.
PROPERTIES = (
    "acks", "allow.auto.create.topics", "api.version.fallback.ms", "api.version.request",
    "api.version.request.timeout.ms", "auto.commit.enable", "auto.commit.interval.ms",
    "auto.offset.reset", "batch.num.messages", "batch.size", "bootstrap.servers",
    "broker.address.family", "broker.address.ttl", "broker.version.fallback",
    "builtin.features", "check.crcs", "client.dns.lookup", "client.id", "client.rack",
    "compression.codec", "compression.level", "compression.type", "connections.max.idle.ms",
    "consume.callback.max.messages", "coordinator.query.interval.ms", "debug",
    "delivery.report.only.error", "delivery.timeout.ms", "enable.auto.commit",
    "enable.auto.offset.store", "enable.gapless.guarantee", "enable.idempotence",
    "enable.metrics.push", "enable.partition.eof", "enable.random.seed",
    "enable.sasl.oauthbearer.unsecure.jwt", "enable.ssl.certificate.verification",
    "enabled_events", "fetch.error.backoff.ms", "fetch.max.bytes", "fetch.message.max.bytes",
    "fetch.min.bytes", "fetch.queue.backoff.ms", "fetch.wait.max.ms", "group.id",
    "group.instance.id", "group.protocol", "group.protocol.type", "group.remote.assignor",
    "heartbeat.interval.ms", "https.ca.location", "https.ca.pem", "interceptors",
    "internal.termination.signal", "isolation.level", "linger.ms", "log.connection.close",
    "log.queue", "log.thread.name", "log_level", "max.in.flight",
    "max.in.flight.requests.per.connection", "max.partition.fetch.bytes",
    "max.poll.interval.ms", "max.poll.records", "message.copy.max.bytes", "message.max.bytes",
    "message.send.max.retries", "message.timeout.ms", "metadata.broker.list",
    "metadata.max.age.ms", "metadata.recovery.rebootstrap.trigger.ms",
    "metadata.recovery.strategy", "offset.store.method", "offset.store.path",
    "offset.store.sync.interval.ms", "partition.assignment.strategy", "partitioner",
    "plugin.library.paths", "produce.offset.report", "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes", "queue.buffering.max.messages", "queue.buffering.max.ms",
    "queued.max.messages.kbytes", "queued.min.messages", "queuing.strategy",
    "receive.message.max.bytes", "reconnect.backoff.jitter.ms", "reconnect.backoff.max.ms",
    "reconnect.backoff.ms", "request.required.acks", "request.timeout.ms", "retries",
    "retry.backoff.max.ms", "retry.backoff.ms", "sasl.kerberos.keytab",
    "sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal", "sasl.kerberos.service.name", "sasl.mechanism",
    "sasl.mechanisms", "sasl.oauthbearer.assertion.algorithm",
    "sasl.oauthbearer.assertion.claim.aud", "sasl.oauthbearer.assertion.claim.exp.seconds",
    "sasl.oauthbearer.assertion.claim.iss", "sasl.oauthbearer.assertion.claim.jti.include",
    "sasl.oauthbearer.assertion.claim.nbf.seconds", "sasl.oauthbearer.assertion.claim.sub",
    "sasl.oauthbearer.assertion.file", "sasl.oauthbearer.assertion.jwt.template.file",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem", "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.credentials.client.secret", "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config", "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.grant.type", "sasl.oauthbearer.metadata.authentication.type",
    "sasl.oauthbearer.method", "sasl.oauthbearer.scope", "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.token.endpoint.url", "sasl.password", "sasl.username",
    "security.protocol", "session.timeout.ms", "share.acknowledgement.mode",
    "socket.blocking.max.ms", "socket.connection.setup.timeout.ms", "socket.keepalive.enable",
    "socket.max.fails", "socket.nagle.disable", "socket.receive.buffer.bytes",
    "socket.send.buffer.bytes", "socket.timeout.ms", "ssl.ca.certificate.stores",
    "ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location", "ssl.certificate.pem",
    "ssl.cipher.suites", "ssl.crl.location", "ssl.curves.list",
    "ssl.endpoint.identification.algorithm", "ssl.engine.id", "ssl.engine.location",
    "ssl.key.location", "ssl.key.password", "ssl.key.pem", "ssl.keystore.location",
    "ssl.keystore.password", "ssl.providers", "ssl.sigalgs.list", "ssl_ca", "ssl_certificate",
    "ssl_key", "statistics.interval.ms", "sticky.partitioning.linger.ms",
    "topic.blacklist", "topic.metadata.propagation.max.ms", "topic.metadata.refresh.fast.cnt",
    "topic.metadata.refresh.fast.interval.ms", "topic.metadata.refresh.interval.ms",
    "topic.metadata.refresh.sparse", "transaction.timeout.ms", "transactional.id",
)

#: librdkafka's aliases: its messages name the property on the right.
ALIASES = {
    "acks": "request.required.acks", "bootstrap.servers": "metadata.broker.list",
    "compression.type": "compression.codec", "delivery.timeout.ms": "message.timeout.ms",
    "enable.auto.commit": "auto.commit.enable", "linger.ms": "queue.buffering.max.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "max.partition.fetch.bytes": "fetch.message.max.bytes",
    "retries": "message.send.max.retries", "sasl.mechanism": "sasl.mechanisms",
    "sasl.oauthbearer.client.credentials.client.id": "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.credentials.client.secret": "sasl.oauthbearer.client.secret",
}

def secret_values(conf: Mapping[str, Any]) -> list[str]:
    """The values of the secret settings in ``conf``, longest first."""
    values = {str(v) for k, v in conf.items()
              if is_secret(str(k)) and v is not None and len(str(v)) >= MIN_SCRUBBED}
    return sorted(values, key=len, reverse=True)


def scrub(text: str, conf: Mapping[str, Any]) -> str:
    """``text`` with every secret value of ``conf`` (and every one this process knows,
    :func:`~connectors.core.options.scrub_known`) replaced by ``***``."""
    for value in secret_values(conf):
        text = text.replace(value, REDACTED)
    return scrub_known(text)


def _mechanism(conf: Mapping[str, Any]) -> tuple[str, str] | None:
    for key in ("sasl.mechanism", "sasl.mechanisms"):
        if conf.get(key) is not None:
            return key, str(conf[key]).strip()
    return None


def _protocol(conf: Mapping[str, Any]) -> str:
    return str(conf.get("security.protocol", "PLAINTEXT")).strip().upper()


# The result per configuration (clients are cheap, but parsing runs several times per query
# on the driver, and each client's own warnings should be logged once per process).
_CHECKED: OrderedDict[tuple[Any, ...], str | None] = OrderedDict()
_CHECKED_LOCK = threading.Lock()
_CHECKED_SIZE = 64


class _Lines:
    """A ``logger`` for a throwaway client: keeps librdkafka's lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append((level, msg % args if args else msg))


def check_client_config(family: str, conf: Mapping[str, Any], client: str,
                        option: Callable[[str], str] = lambda key: f"kafka.{key}",
                        also_for: str | None = None) -> None:
    """Let librdkafka check ``conf`` as the configuration of a ``client`` (``"consumer"``,
    ``"producer"``) without connecting anywhere; raise an :class:`OptionError` naming the
    option (``option(key)``: how the user spelled ``key``), what is wrong and what is valid.
    librdkafka's configuration warnings are logged once per configuration, except that a
    setting of the other client kind is ignored, when the component also runs that kind
    (``also_for``: the sink's recovery scan is a consumer)."""
    _check_security(family, conf, option)
    key = (client, *sorted((str(k), str(v)) for k, v in conf.items()))
    with _CHECKED_LOCK:
        known = key in _CHECKED
        problem = _CHECKED.get(key)
    if not known:
        problem = _librdkafka_verdict(family, conf, client, also_for)
        with _CHECKED_LOCK:
            _CHECKED[key] = problem
            while len(_CHECKED) > _CHECKED_SIZE:
                _CHECKED.popitem(last=False)
    if problem is not None:
        raise _config_error(family, conf, problem, option)


def spelled(r: OptionReader, cluster: str | None = None) -> Callable[[str], str]:
    """How the user wrote the option of librdkafka setting ``key``: ``kafka.<key>`` as
    given to ``r``, or, for a setting of a ``clusters`` entry, that entry."""

    def name(key: str) -> str:
        top = f"kafka.{key}"
        if cluster is None or r.present(top):
            return r.spelling(top)
        return f"{top} (clusters entry {cluster!r})"

    return name


def _check_security(family: str, conf: Mapping[str, Any],
                    option: Callable[[str], str]) -> None:
    """``security.protocol`` and ``sasl.mechanism``, ahead of librdkafka: it checks a
    mechanism only under a SASL protocol, and then asks for a username before it looks at
    the mechanism's name."""
    if "security.protocol" in conf and _protocol(conf) not in SECURITY_PROTOCOLS:
        value = str(conf["security.protocol"])
        raise OptionError(
            f"{family}: option '{option('security.protocol')}' has invalid value {value!r}; "
            f"valid values: {', '.join(SECURITY_PROTOCOLS)}"
            + _did_you_mean(value.upper(), SECURITY_PROTOCOLS),
            option=option("security.protocol"))
    found = _mechanism(conf)
    if found is not None and found[1] not in SASL_MECHANISMS:
        key, value = found
        raise OptionError(
            f"{family}: option '{option(key)}' has invalid value {value!r}; valid values: "
            f"{', '.join(SASL_MECHANISMS)} (exactly so, in capitals)"
            + _did_you_mean(value.upper(), SASL_MECHANISMS),
            option=option(key))


def _did_you_mean(value: str, valid: tuple[str, ...]) -> str:
    match = value if value in valid else closest(value, valid)
    return f" (did you mean {match!r}?)" if match else ""


def _librdkafka_verdict(family: str, conf: Mapping[str, Any], client: str,
                        also_for: str | None) -> str | None:
    """librdkafka's complaint about ``conf`` (None when it takes it); logs its warnings."""
    from confluent_kafka import Consumer, Producer

    probe: dict[str, Any] = {str(k): v for k, v in conf.items()
                             if str(k) not in ("bootstrap.servers", "metadata.broker.list")}
    if client == "producer" and "delivery.report.only.error" in probe:
        # The Python client parses this one itself and wants a bool.
        probe["delivery.report.only.error"] = \
            str(probe["delivery.report.only.error"]).strip().lower() in ("true", "1")
    found = _mechanism(probe)
    if found is not None and found[1] in _MECHANISM_STARTS_IO and "SASL" in _protocol(probe):
        # No token fetch, no kinit: the mechanism's build support and the TLS part only.
        probe["security.protocol"] = "SSL" if _protocol(probe) == "SASL_SSL" else "PLAINTEXT"
        probe.pop(found[0])
        probe["builtin.features"] = _MECHANISM_FEATURE[found[1]]
    lines = _Lines()
    probe["logger"] = lines
    if client == "consumer":
        probe.setdefault("group.id", "eo-config-check")
    try:
        if client == "consumer":
            Consumer(probe).close()
        else:
            Producer(probe).flush(0)  # serves its log lines; nothing was produced
    except Exception as e:  # noqa: BLE001 - librdkafka's KafkaException, or the client's own
        from connectors.kafka.common import kafka_error

        err = kafka_error(e)
        return str(err.str()) if err is not None else str(e)
    ignored = f"is a {also_for} property" if also_for else None
    for _level, line in lines.lines:
        if "CONFWARN" in line and "bootstrap.servers" not in line \
                and (ignored is None or ignored not in line):
            log.warning("%s: librdkafka: %s", family, scrub(line.split("]: ", 1)[-1], conf))
    return None


def _config_error(family: str, conf: Mapping[str, Any], problem: str,
                  option: Callable[[str], str]) -> OptionError:
    problem = scrub(problem.removeprefix("Failed to create consumer: ")
                    .removeprefix("Failed to create producer: "), conf)
    key = _named_key(problem, conf)
    if key is None:
        return OptionError(f"{family}: the kafka.* settings were refused by librdkafka: "
                           f"{problem}; see {CONFIGURATION_URL}", option=None)
    name = option(key)
    if problem.startswith("No such configuration property"):
        match = closest(key, PROPERTIES)
        hint = f"did you mean '{option(match)}'? " if match else ""
        return OptionError(
            f"{family}: option '{name}' is not a librdkafka property; {hint}valid properties: "
            f"{CONFIGURATION_URL}", option=name)
    return OptionError(f"{family}: option '{name}' was refused by librdkafka: {problem}; "
                       f"valid values: {CONFIGURATION_URL}", option=name)


def _named_key(problem: str, conf: Mapping[str, Any]) -> str | None:
    """The setting librdkafka's message is about: a quoted name (or the alias the user
    set for it), else the longest key of ``conf`` the message mentions."""
    keys = sorted((str(k) for k in conf), key=len, reverse=True)
    for key in keys:
        for name in (key.lower(), ALIASES.get(key.lower(), "")):
            if name and (f'"{name}"' in problem or f"`{name}`" in problem):
                return key
    for key in keys:
        if key.lower() in problem:
            return key
    return None
