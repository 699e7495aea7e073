"""Open transactions of a transactional Kafka sink: find them, and abort a hanging one
(``eo-connectors transactions``; docs/kafka-sink.md, "Stuck readers").

A task killed inside its transaction leaves it open, and ``read_committed`` readers of every
partition it wrote stop at the last stable offset (LSO) until the transaction ends: Spark's
retry of the task aborts it at once (its ``init_transactions`` fences the dead attempt),
else the broker aborts it ``transaction.timeout.ms`` after it began.

What this module can see without Kafka's DescribeTransactions/ListTransactions (which
confluent-kafka does not expose): per partition of the target topic, the LSO against the
high watermark (a gap is an open transaction, or one whose markers are being written) and
the timestamp of the first record past the LSO (how long readers have been held). Aborting
needs no admin API: ``init_transactions`` with the sink's transactional id ``<sink_id>-<w>``
aborts that id's open transaction, as the task's own retry would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.kafka import clients, lookup
from connectors.kafka.common import FAMILY
from connectors.kafka.sink.producers import transactional_id
from connectors.kafka.wire.protocol import WireError


@dataclass
class PartitionEnds:
    """One partition of the target topic: readers of ``read_committed`` see up to ``lso``."""

    topic: str
    partition: int
    lso: int
    high_watermark: int
    #: age of the first record past the LSO (its producer's timestamp), when there is one
    held_for_s: float | None = None

    @property
    def held(self) -> bool:
        return self.lso < self.high_watermark

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "held": self.held}


def partition_states(conf: dict[str, Any], topic: str, timeout: float) -> list[PartitionEnds]:
    """LSO and high watermark of every partition of ``topic``, with how long a held one has
    been held."""
    # A metadata request naming the topic must not create a mistyped one: the process's
    # cluster asks without auto-creation.
    who = f"{FAMILY} transactions"
    with clients.lease(conf) as kafka:
        info = kafka.topics([topic], who=who, error=ConnectorError, timeout=timeout)[topic]
        if info.error == 3:  # UNKNOWN_TOPIC_OR_PARTITION
            raise lookup.TopicNotFound(topic, str(conf.get("bootstrap.servers")), who)
        if info.error:  # the caller names a denial
            raise WireError(f"{who}: metadata of topic {topic!r}", info.error)
        wanted = dict.fromkeys(((topic, p) for p in range(info.partitions)), -1)

        def offsets(committed: bool) -> dict[int, int]:
            got = kafka.list_offsets(wanted, committed=committed, who=who,
                                     error=ConnectorError, timeout=timeout,
                                     what=f"{who}: ListOffsets of {topic!r}")
            return {p: o for (_, p), o in got.items()}

        stable = offsets(True)
        high = offsets(False)
    states = [PartitionEnds(topic, p, stable[p], high[p]) for p in sorted(stable)]
    held = [s for s in states if s.held]
    if held:
        _held_ages(conf, held, timeout)
    return states


def _held_ages(conf: dict[str, Any], held: list[PartitionEnds], timeout: float) -> None:
    """The age of the first record past the LSO of each held partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": "eo-connectors-cli-transactions",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted",
                         "allow.auto.create.topics": False})
    try:
        consumer.assign([TopicPartition(s.topic, s.partition, s.lso) for s in held])
        waiting = {(s.topic, s.partition): s for s in held}
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for m in consumer.consume(len(waiting), 0.5):
                if m.error() is not None:
                    continue
                s = waiting.pop((str(m.topic()), int(m.partition() or 0)), None)
                if s is None:
                    continue
                _, ts = m.timestamp()
                if ts > 0:
                    s.held_for_s = round(max(0.0, time.time() - ts / 1000), 1)
    finally:
        consumer.close()


def abort_open(conf: dict[str, Any], sink_id: str, writers: int, timeout: float) -> list[str]:
    """Abort the open transaction of every transactional id ``<sink_id>-0`` ..
    ``<sink_id>-<writers-1>`` (``init_transactions`` fences the last producer of each id
    and aborts what it left open); returns the ids. A task still running with one of them
    fails at its commit and Spark retries it: nothing is lost or doubled, but stop the
    query first where you can."""
    from confluent_kafka import Producer

    done = []
    for w in range(writers):
        tid = transactional_id(sink_id, w)
        producer = Producer({**conf, "transactional.id": tid})
        try:
            producer.init_transactions(timeout)
        finally:
            producer.flush(0)
        done.append(tid)
    return done


def report(conf: dict[str, Any], topic: str, sink_id: str, abort_writers: int, timeout: float,
           confirm: Callable[[str], bool]) -> tuple[dict[str, Any], list[str]]:
    """``eo-connectors transactions``: the held partitions of ``topic`` (JSON document and
    text lines); with ``abort_writers`` > 0, after ``confirm(ids)``, the open transactions
    of ``<sink_id>-0`` .. ``-<abort_writers-1>`` aborted first. A denied request names the
    ACL (docs/security.md, role ``transactions``)."""
    from connectors.kafka import access

    acls = [a.bind(topic=topic, sink_id=sink_id) for a in access.ROLES["transactions"]]

    def named(call: Callable[[], Any], kind: str, request: str) -> Any:
        try:
            return call()
        except Exception as e:
            message = access.denied(e, who="transactions", conf=conf, request=request,
                                    needs=[a for a in acls if a.resource == kind])
            if message is not None:
                raise ConnectorError(message) from None
            if isinstance(e, ConnectorError):
                raise
            raise ConnectorError(f"transactions: {request} failed: {e}") from None

    def states_now() -> list[PartitionEnds]:
        states: list[PartitionEnds] = named(lambda: partition_states(conf, topic, timeout),
                                             "TOPIC", f"offsets of topic {topic!r}")
        return states

    states = states_now()
    aborted: list[str] = []
    if abort_writers:
        ids = f"{sink_id}-0 .. {sink_id}-{abort_writers - 1}"
        if not confirm(ids):
            raise ConnectorError("transactions: not confirmed; nothing aborted")
        aborted = named(lambda: abort_open(conf, sink_id, abort_writers, timeout),
                        "TRANSACTIONAL_ID", f"init_transactions of {ids}")
        states = states_now()
    held = [s for s in states if s.held]
    lines = [f"{s.topic}[{s.partition}]: readers held at {s.lso} of {s.high_watermark}"
             + (f" for {s.held_for_s:g} s" if s.held_for_s is not None else "") for s in held]
    if aborted:
        lines.insert(0, f"aborted the open transactions of {', '.join(aborted)}")
    if not held:
        lines.append(f"{topic}: no partition holds read_committed readers")
    else:
        lines.append(f"Kafka's kafka-transactions.sh describe --transactional-id {sink_id}-<w> "
                     "shows each id's state; --abort --writers N ends them")
    return ({"topic": topic, "aborted": aborted,
             "partitions": [s.as_dict() for s in states]}, lines)
