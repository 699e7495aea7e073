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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from connectors.core.declared import DURATION, Opt
from connectors.core.errors import ConnectorError

log = logging.getLogger(__name__)

T = TypeVar("T")

FAMILY = "eo_kafka"
#: Seconds the first request to a cluster may take (option ``connectTimeout``).
DEFAULT_CONNECT_TIMEOUT = 30.0
#: The default deadline of :func:`retrying`, in seconds (option ``metadataRetryTimeout``).
DEFAULT_RETRY_TIMEOUT = 60.0


CONNECT_TIMEOUT = Opt(
    "connectTimeout", "connect_timeout", DURATION, DEFAULT_CONNECT_TIMEOUT, minimum=0.1,
    help="the bound on the driver's first request to the cluster, before any task runs. An "
    "unreachable cluster, a TLS/SASL mismatch or failed authentication fails in that time with "
    "one error that names the bootstrap servers and the likely causes; librdkafka's own "
    "connection logs go to the Python logger `connectors.kafka.librdkafka` at DEBUG")
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
    """Demote every librdkafka record to DEBUG (shown only when that logger enables it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


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
    "_TRANSPORT",
    "_TIMED_OUT",
    "_WAIT_COORD",
)


def kafka_error(exc: BaseException) -> Any | None:
    """The ``confluent_kafka.KafkaError`` inside ``exc`` (or ``exc`` itself), else None."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaError):
        return exc
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_transient(exc: BaseException) -> bool:
    """True for an error a retry can cure: librdkafka's ``retriable()`` or a code Kafka's
    protocol defines as transient; never for a fatal error."""
    err = kafka_error(exc)
    if err is None:
        return False
    if err.fatal():
        return False
    if err.retriable():
        return True
    return str(err.name()) in _TRANSIENT_NAMES


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
    passed. ``what`` names the request and its objects ("ListOffsets of orders[3]");
    the final error is ``error`` with ``what``, the attempts and the last Kafka error."""
    deadline = time.monotonic() + timeout
    backoff = first_backoff
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except ConnectorError:
            raise
        except Exception as e:
            if not is_transient(e):
                raise error(f"{what} failed: {e}") from e
            left = deadline - time.monotonic()
            if left <= 0:
                raise error(
                    f"{what} still failed after {attempt} attempts in {timeout:.0f}s "
                    f"(metadataRetryTimeout): {e}"
                ) from e
            log.info("%s: transient error (attempt %d), asking again: %s", what, attempt, e)
            time.sleep(min(backoff, left))
            backoff = min(backoff * 2, max_backoff)


def unreachable(who: str, bootstrap: Any, timeout: float, error: BaseException,
                where: str = "from here") -> str:
    """The one error of a cluster that did not answer the first request within
    ``connectTimeout``: the bootstrap servers and the likely causes (no secrets)."""
    return (
        f"{who}: cannot reach Kafka at {bootstrap} within connectTimeout={timeout:g}s "
        f"({error}). Likely causes: the brokers are down or unreachable {where} (host, "
        "port, firewall, advertised.listeners); a TLS/SASL mismatch (kafka.security.protocol, "
        "kafka.sasl.mechanism); or failed authentication (kafka.sasl.username/password)"
    )
