"""Read-only lookups for the operator's commands (``eo-connectors lag``, ``transactions``):
a topic's partitions, a consumer group's committed offsets (the partitions' ends come from
the process's cluster object, ``kafka/clients``). None of them can change the cluster they
look at, and none can take the process down.

- **No topic is ever created by a lookup.** A metadata request that names a topic creates it
  on a broker with ``auto.create.topics.enable=true`` (Kafka's default) when the client
  allows it, and librdkafka's producer and admin clients allow it by default: a mistyped
  ``--topic`` would create the typo. Lookups by name go through a consumer with
  ``allow.auto.create.topics=false``, forced over any user setting; listing every topic
  never creates one. A topic that does not exist is :class:`TopicNotFound`, naming it.
- **Committed offsets come from a consumer's** ``committed()`` **on explicit partitions**,
  with the group's ``group.id``: the consumer never subscribes, so it never joins the group
  nor disturbs its members. librdkafka's admin ``ListConsumerGroupOffsets`` is not used: it
  dereferences a NULL consumer group when the broker answers ``NOT_COORDINATOR`` (a
  coordinator still loading after a broker start, or moving; librdkafka issue #5040, open
  in librdkafka 2.16), which kills the process with SIGSEGV. The consumer's own group
  handle is never NULL; it looks the coordinator up again by itself.
- Transient errors (a coordinator loading or moving, a leader election) are asked again
  until the caller's deadline (``kafka/common.is_transient``); anything else, or the
  deadline, is :class:`LookupFailed` with the last error, which the caller words (and turns
  into the missing ACL when it is a denial, ``kafka/access.denied``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from connectors.core.errors import ConnectorError
from connectors.core.retry import retry_until
from connectors.kafka.common import LIBRDKAFKA_LOG, is_transient, kafka_error

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The group of the consumers that only read metadata and partition ends: never joined,
#: never committed to (librdkafka's consumer insists on a group.id).
LOOKUP_GROUP = "eo-connectors-cli"
#: Kafka's own internal topics: no consumer group commits offsets on them.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


class TopicNotFound(ConnectorError):
    """A topic named by the operator does not exist (and was not created by looking)."""

    def __init__(self, topic: str, where: str, who: str) -> None:
        super().__init__(f"{who}: topic {topic!r} does not exist at {where} (nothing was "
                         "created; check the name, e.g. against `kafka-topics.sh --list`)")
        self.topic = topic


class LookupFailed(ConnectorError):
    """A lookup that failed for good: ``cause`` is the last Kafka error (a denial, or a
    transient error that outlasted the deadline)."""

    def __init__(self, what: str, cause: BaseException, attempts: int, transient: bool) -> None:
        detail = (f"still failing after {attempts} attempts ({cause})" if transient
                  else str(cause))
        super().__init__(f"{what}: {detail}")
        self.cause, self.attempts, self.transient = cause, attempts, transient


def consumer(conf: Mapping[str, Any], group: str = LOOKUP_GROUP,
             isolation: str = "read_committed") -> Any:
    """A consumer that only looks: ``group.id`` ``group`` (never subscribed, never
    committed to), no topic auto-creation whatever ``conf`` says."""
    from confluent_kafka import Consumer, KafkaException

    try:
        return Consumer({**conf, "group.id": group, "enable.auto.commit": False,
                         "allow.auto.create.topics": False, "isolation.level": isolation,
                         "logger": LIBRDKAFKA_LOG})
    except (KafkaException, ValueError, TypeError) as e:
        raise ConnectorError(f"Kafka client settings (--kafka, --kafka-config): {e}") from None


def ask(call: Callable[[], T], what: str, timeout: float,
        transient: Callable[[BaseException], bool] = is_transient) -> T:
    """``call()``, asked again on ``transient`` Kafka errors for up to ``timeout`` seconds;
    :class:`LookupFailed` otherwise."""

    def give_up(e: Exception, attempts: int, transient: bool) -> Exception:
        return LookupFailed(what, e, attempts, transient)

    def on_retry(e: Exception, attempt: int, pause: float) -> None:
        log.info("%s: transient error (attempt %d), asking again in %.2fs: %s", what, attempt,
                 pause, e)

    return retry_until(call, timeout=timeout, transient=transient, give_up=give_up,
                       on_retry=on_retry, max_backoff=1.0)


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def topic_partitions(client: Any, topic: str, timeout: float, where: str,
                     who: str) -> list[int]:
    """The partitions of ``topic``, read with :func:`consumer`'s client (never created).
    ``where`` (the bootstrap servers) and ``who`` (the command) name it in errors.
    :class:`TopicNotFound` when it does not exist; :class:`LookupFailed` (a denial:
    ``TOPIC_AUTHORIZATION_FAILED``) when it cannot be described."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + timeout

    def describe() -> list[int] | None:
        meta = client.list_topics(topic=topic, timeout=_left(deadline)).topics.get(topic)
        if meta is None:
            return None
        if meta.error is not None:
            if meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise KafkaException(meta.error)
        if not meta.partitions:
            # A topic being created has no partitions in its first metadata answer.
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
        return sorted(meta.partitions)

    found = ask(describe, f"metadata of topic {topic!r}", timeout)
    if found is None:
        raise TopicNotFound(topic, where, who)
    return found


def all_topics(client: Any, timeout: float) -> dict[str, list[int]]:
    """Every topic the principal may describe (Kafka's internal ones left out), with its
    partitions: one metadata request for all topics, which never creates any."""
    deadline = time.monotonic() + timeout

    def listing() -> dict[str, list[int]]:
        meta = client.list_topics(timeout=_left(deadline))
        return {name: sorted(t.partitions) for name, t in meta.topics.items()
                if name not in INTERNAL_TOPICS and t.partitions}

    return ask(listing, "metadata of all topics", timeout)


def committed(client: Any, partitions: Iterable[tuple[str, int]],
              timeout: float) -> dict[tuple[str, int], int]:
    """The group's committed offset of each of ``partitions`` that has one (``client``:
    :func:`consumer` with the group's id). One OffsetFetch to the group's coordinator,
    asked again while the coordinator is looked up, loads or moves.

    ``committed()`` waits for a coordinator for as long as it is given, and a FindCoordinator
    that the broker denies (no DESCRIBE on the group) only reaches the consumer's event
    queue. So each call gets a slice of the deadline (1 s, 2 s, 4 s...), and between slices
    the queue is read: a denial there ends the wait at once."""
    from confluent_kafka import KafkaException, TopicPartition

    wanted = [TopicPartition(t, p) for t, p in partitions]
    if not wanted:
        return {}
    deadline = time.monotonic() + timeout
    slices = [0.5]

    def fetch() -> dict[tuple[str, int], int]:
        slices[0] = min(slices[0] * 2, 8.0)
        try:
            answer = client.committed(wanted, timeout=min(_left(deadline), slices[0]))
        except KafkaException as e:
            raise _queued_error(client) or e from None
        out: dict[tuple[str, int], int] = {}
        for tp in answer:
            if tp.error is not None:
                raise KafkaException(tp.error)
            if tp.offset >= 0:
                out[(str(tp.topic), int(tp.partition))] = int(tp.offset)
        return out

    return ask(fetch, f"committed offsets of {len(wanted)} partition(s)", timeout)


def stable_committed(conf: Mapping[str, Any], group: str,
                     partitions: Iterable[tuple[str, int]],
                     timeout: float) -> dict[tuple[str, int], int]:
    """:func:`committed` asked with ``require_stable`` (a ``read_committed`` consumer of
    ``group``), for partitions a plain OffsetFetch found no offset for; ``{}`` when it has
    no answer within ``timeout``.

    Kafka 4's group coordinator answers a plain OffsetFetch from the group's state as of its
    partition's high watermark. Right after the coordinator moved, the new leader's high
    watermark can still stand before commits the old leader acknowledged, so the answer is
    briefly older than they are: in the cluster tier, "no committed offsets" for a group
    that had them. A stable fetch is served as a write and waits for that state. It also
    waits on a transaction holding one of the offsets, hence the bound."""
    client = consumer(conf, group, isolation="read_committed")
    try:
        return committed(client, partitions, timeout)
    except LookupFailed as e:
        if not e.transient:
            raise
        log.info("committed offsets of group %r with require_stable: no answer within %.0fs "
                 "(%s); the plain answer stands", group, timeout, e.cause)
        return {}
    finally:
        client.close()


def _queued_error(client: Any) -> Exception | None:
    """An error the consumer's group handle queued that no retry cures (a denied
    FindCoordinator), if there is one."""
    from confluent_kafka import KafkaException

    while (event := client.poll(0)) is not None:
        err = event.error()
        if err is not None and not is_transient(KafkaException(err)):
            return KafkaException(err)
    return None


def error_name(exc: BaseException) -> str | None:
    """The Kafka error name inside ``exc`` (a :class:`LookupFailed`'s cause too)."""
    cause = exc.cause if isinstance(exc, LookupFailed) else exc
    err = kafka_error(cause)
    return None if err is None else str(err.name())
