"""Producers of the exactly-once Kafka sink: configuration policy and per-worker caching.

- **Policy.** ``PRODUCER_DEFAULTS`` are the settings the guarantee rests on
  (docs/kafka-sink.md, "Producer defaults"); ``check_producer_config`` refuses user settings
  that break it unless ``unsafe=true``; ``transactional_id`` names a task's transactional
  producer.
- **Caching.** Python workers are reused across tasks, so the recovery-key mode keeps one
  idempotent producer (and one admin client) per configuration, in bounded
  client caches (``ClientCache``: ``MAX_PRODUCERS``, ``MAX_ADMINS``; idle
  ones closed); the transactional mode makes one producer per task attempt
  (``transactional_producer``) and closes it after. ``close_cached_producers`` releases
  what a process cached.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from connectors.core.errors import OptionError
from connectors.core.options import RedactedDict
from connectors.kafka.common import (
    FAMILY,
    LIBRDKAFKA_LOG,
    SHORT_LIVED_RECONNECT_BACKOFF_MS,
    ClientCache,
    Lease,
)

log = logging.getLogger(__name__)

#: Producer settings the guarantee rests on (docs/kafka-sink.md, "Producer defaults").
PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    # Only failed deliveries call back into Python: a per-record success callback would
    # cost as much as the produce() call itself. Failures still fail the task.
    "delivery.report.only.error": "true",
}

# librdkafka producer-only properties, dropped from the recovery scan's consumer config so
# librdkafka does not warn about them on every retry.
_PRODUCER_ONLY = frozenset(
    {
        "acks",
        "request.required.acks",
        "enable.idempotence",
        "enable.gapless.guarantee",
        "delivery.report.only.error",
        "linger.ms",
        "queue.buffering.max.ms",
        "batch.size",
        "batch.num.messages",
        "compression.type",
        "compression.codec",
        "compression.level",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "message.send.max.retries",
        "retries",
        "retry.backoff.ms",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "request.timeout.ms",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
        "partitioner",
        "sticky.partitioning.linger.ms",
        "transaction.timeout.ms",
        "transactional.id",
        "queuing.strategy",
        "dr_msg_cb",
        "dr_cb",
    }
)


_ACKS_SAFE = {"all", "-1"}
_TRUE = {"true", "1", "yes", "on"}


def check_producer_config(conf: Mapping[str, str], unsafe: bool) -> None:
    """Refuse settings that break exactly-once, unless ``unsafe`` (then only warn).

    ``transactional.id`` is refused even with ``unsafe``: the sink derives it from the sink id
    and the writer partition so that a retry fences the attempt it replaces.
    """
    if "transactional.id" in conf:
        raise OptionError(
            f"{FAMILY}: option 'kafka.transactional.id' cannot be set: the sink derives it as "
            "'<sink_id>-<writer partition>' so a retry fences its zombie; set "
            "transactional=true instead",
            option="kafka.transactional.id",
        )
    problems: list[tuple[str, str]] = []
    for name in ("acks", "request.required.acks"):
        value = conf.get(name)
        if value is not None and str(value).strip().lower() not in _ACKS_SAFE:
            problems.append(
                (name, f"{name}={value!r} lets the broker acknowledge records that a leader "
                 "failover then loses; use 'all' (the default)")
            )
    value = conf.get("enable.idempotence")
    if value is not None and str(value).strip().lower() not in _TRUE:
        problems.append(
            ("enable.idempotence", f"enable.idempotence={value!r} allows reordered and "
             "duplicated records within a partition, which breaks the max-seq recovery rule; "
             "use 'true' (the default)")
        )
    if not problems:
        return
    if unsafe:
        for name, why in problems:
            log.warning("%s: unsafe producer setting kafka.%s accepted (unsafe=true): %s; the "
                        "sink is no longer exactly-once", FAMILY, name, why)
        return
    name, why = problems[0]
    raise OptionError(
        f"{FAMILY}: option 'kafka.{name}' breaks the exactly-once guarantee: {why}, or set "
        "option unsafe=true to accept at-least-once delivery",
        option=f"kafka.{name}",
    )


def consumer_config(
    producer_conf: Mapping[str, str], sink_id: str, isolation: str
) -> dict[str, Any]:
    conf: dict[str, Any] = {k: v for k, v in producer_conf.items() if k not in _PRODUCER_ONLY}
    conf.update(
        {
            "group.id": f"eo-sink-scan-{sink_id}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            # At the end of a partition the broker parks a fetch for fetch.wait.max.ms
            # (500 ms by default) before librdkafka can report EOF; a scan ends there.
            "fetch.wait.max.ms": 10,
            "logger": LIBRDKAFKA_LOG,
        }
    )
    return conf


def producer_config(kafka_options: Mapping[str, Any] | None, bootstrap_servers: str | None,
                    unsafe: bool) -> RedactedDict:
    """The producer configuration of a sink: ``PRODUCER_DEFAULTS``, then the user's
    ``kafka.*`` settings, checked by ``check_producer_config``."""
    conf = RedactedDict(PRODUCER_DEFAULTS)
    for k, v in (kafka_options or {}).items():
        key = str(k)
        key = key[len("kafka.") :] if key.lower().startswith("kafka.") else key
        conf[key] = _stringify(v)
    if bootstrap_servers:
        conf["bootstrap.servers"] = bootstrap_servers
    if not conf.get("bootstrap.servers"):
        raise OptionError(
            f"{FAMILY}: option 'kafka.bootstrap.servers' is required; set it to the "
            "brokers' host:port list",
            option="kafka.bootstrap.servers",
        )
    check_producer_config(conf, unsafe)
    acks = str(conf.get("request.required.acks", conf.get("acks", "all"))).lower()
    user_keys = {str(k).lower().removeprefix("kafka.") for k in (kafka_options or {})}
    if acks not in _ACKS_SAFE and "enable.idempotence" not in user_keys:
        # unsafe=true with weaker acks: librdkafka refuses idempotence without acks=all.
        conf["enable.idempotence"] = "false"
    return conf


def transactional_id(sink_id: str, writer: int) -> str:
    """``<sink_id>-<writer partition>``: stable across attempts, so a retry fences the
    attempt it replaces (never a task attempt id)."""
    return f"{sink_id}-{writer}"


# -- per-worker caches (Python workers are reused across tasks) -------------------------------
class ProducerSlot:
    """A producer plus the delivery errors of the current task."""

    def __init__(self, conf: Mapping[str, str]) -> None:
        from confluent_kafka import Producer

        self.errors: list[str] = []
        self.conf = conf  # names the principal in an authorization error
        full: dict[str, Any] = dict(conf)
        # The Python client parses this one itself and wants a bool, not librdkafka's string.
        if "delivery.report.only.error" in full:
            full["delivery.report.only.error"] = (
                str(full["delivery.report.only.error"]).strip().lower() in _TRUE
            )
        full["on_delivery"] = self.on_delivery
        full["logger"] = LIBRDKAFKA_LOG
        self.producer = Producer(full)

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")


#: Idempotent producers a worker keeps (one per sink configuration it wrote with).
MAX_PRODUCERS = 4
#: Admin clients a worker keeps (metadata and ListOffsets of the sink's targets).
MAX_ADMINS = 4


def _conf_key(conf: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in conf.items()))


def _close_slot(slot: ProducerSlot) -> None:
    close_producer(slot.producer, 5.0)


def _drop(_client: Any) -> None:
    """AdminClient has no close(): the cache dropping the last reference destroys it."""


_PRODUCERS: ClientCache[ProducerSlot] = ClientCache("producer", MAX_PRODUCERS, _close_slot)
_ADMINS: ClientCache[Any] = ClientCache("admin", MAX_ADMINS, _drop)


@contextlib.contextmanager
def admin(conf: Mapping[str, str], auto_create: bool = False) -> Iterator[Any]:
    """The worker's admin client for a producer configuration (metadata, ListOffsets),
    held for the ``with`` block.

    Its metadata requests create a missing topic (when the broker allows it) only with
    ``auto_create``: librdkafka's admin client is a producer handle, for which
    ``allow.auto.create.topics`` defaults to true."""

    with _ADMINS.lease((*_conf_key(conf), ("\0auto_create", str(auto_create))),
                       lambda: new_admin(conf, auto_create)) as c:
        yield c


def new_admin(conf: Mapping[str, str], auto_create: bool = False) -> Any:
    """An admin client of its own for a producer configuration, not cached: a first contact
    reads the connection errors of this client only (``error_cb``), not what a cached one
    met a minute ago, and never inherits a cached client's state."""
    from connectors.kafka.connect import watched_admin

    admin_conf: dict[str, Any] = {k: v for k, v in conf.items() if k not in _PRODUCER_ONLY}
    admin_conf["allow.auto.create.topics"] = "true" if auto_create else "false"
    # Often the first client of a short-lived process (the driver's planner worker).
    admin_conf.setdefault("reconnect.backoff.ms", SHORT_LIVED_RECONNECT_BACKOFF_MS)
    admin_conf["logger"] = LIBRDKAFKA_LOG
    return watched_admin(admin_conf)  # its connection errors explain a first contact


def cached_producer(conf: Mapping[str, str]) -> Lease[ProducerSlot]:
    """The worker's idempotent producer for ``conf``, held until ``Lease.release()``
    (``Lease.discard()`` after an error)."""
    return _PRODUCERS.acquire(_conf_key(conf), lambda: ProducerSlot(conf))


def close_cached_producers() -> None:
    """Flush (up to 5 s each) and close every producer and admin client this process
    cached (see ``connectors.kafka.close_cached_clients``)."""
    _PRODUCERS.clear()
    _ADMINS.clear()


def close_producer(producer: Any, timeout: float) -> None:
    """Flush for up to ``timeout`` seconds, drop what is left, and shut the client down."""
    try:
        left = producer.flush(timeout)
    except Exception as e:  # noqa: BLE001 - discarded anyway; never mask the task's error
        # A producer in a fatal state (fenced, or denied its transactional id) raises here;
        # raising from the task's cleanup would replace the error that says why.
        log.debug("%s: flushing a producer being closed: %s", FAMILY, e)
        left = len(producer)
    if left:
        log.warning("%s: closing a producer with %d undelivered records", FAMILY, left)
        producer.purge()
    close = getattr(producer, "close", None)  # Producer.close: confluent-kafka >= 2.11
    if close is not None:
        # A fenced or failed transactional producer cannot abort its transaction again;
        # close() says so in a RuntimeWarning. The producer is discarded either way.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                close()
            except Exception as e:  # noqa: BLE001 - see above
                log.debug("%s: closing a producer: %s", FAMILY, e)
        for w in caught:
            log.debug("%s: closing a producer: %s", FAMILY, w.message)



def transactional_producer(conf: Mapping[str, str], sink_id: str, writer: int) -> ProducerSlot:
    """A producer for one task attempt of ``(sink_id, writer)``, not yet initialised (it
    connects in the background; :func:`init_transactions` follows)."""
    full = dict(conf)
    full["transactional.id"] = transactional_id(sink_id, writer)
    full.setdefault("reconnect.backoff.ms", SHORT_LIVED_RECONNECT_BACKOFF_MS)
    return ProducerSlot(full)


def init_transactions(slot: ProducerSlot, timeout: float) -> None:
    """``init_transactions``: fences every older producer with this transactional.id (a
    zombie attempt) and completes or aborts its open transaction."""
    # A metadata request first: it waits for a broker connection. init_transactions on a
    # client with none up yet finds no broker to ask for its transaction coordinator and
    # tries again only after librdkafka's 500 ms timer, which half of all task attempts
    # paid (bench/kafka_sink_throughput.py, "txn_task_setup_ms").
    try:
        slot.producer.list_topics(timeout=timeout)
        slot.producer.init_transactions(timeout)
    except Exception as e:
        from connectors.core.errors import KafkaSinkError
        from connectors.kafka import access

        tid = str(slot.conf.get("transactional.id", ""))
        prefix = tid.rsplit("-", 1)[0] + "-"
        needs = [a.bind(sink_id=prefix[:-1], topic="", facts_topic="")
                 for a in access.ROLES["transactional-sink"] if a.resource == "TRANSACTIONAL_ID"]
        denied = access.denied(e, who=f"{FAMILY} {prefix[:-1]}", conf=slot.conf, needs=needs,
                               request=f"InitProducerId of transactional.id {tid!r}")
        if denied is not None:
            raise KafkaSinkError(denied) from None
        raise


def _stringify(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
