"""Commit facts of the transactional Kafka sink (DESIGN.md section 6, "Transactional mode").

A task attempt of batch B, writer w commits its rows and a *commit fact* in one Kafka
transaction, so data and fact become visible together or not at all. The fact is a
consumer-group offset, sent with ``send_offsets_to_transaction``:

- group ``eo-sink-<sink_id>-w<w>`` (one per writer partition, like the transactional.id
  ``<sink_id>-<w>``, so no writer ever waits on another's transaction);
- partition 0 of the first target topic (sorted), offset B (the broker refuses offsets of
  topics that do not exist, and the target topic exists);
- metadata: a small JSON with the attempt's counts (rows, per-partition counts), which a
  retry reports instead of writing again.

A retry reads the fact back with one stable offset fetch (a ``read_committed`` consumer's
``committed()``, which librdkafka sends with ``require_stable``: the broker answers only
once no transaction holding an offset of that group is pending; the retry's
``init_transactions`` has just completed or aborted the only one that could be). Offset B
means "batch B of this writer committed"; anything else means it did not.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import KafkaSinkError
from connectors.kafka.common import FAMILY, ClientCache, Lease, retrying
from connectors.kafka.sink import producers

log = logging.getLogger(__name__)

GROUP_PREFIX = "eo-sink-"
# Kafka's offset.metadata.max.bytes default is 4096; keep well inside it.
_MAX_METADATA = 3000


def group_id(sink_id: str, writer: int) -> str:
    """The consumer group holding writer ``writer``'s commit facts."""
    return f"{GROUP_PREFIX}{sink_id}-w{writer}"


def fact_partition(topics: list[str]) -> tuple[str, int]:
    """Where a writer's fact is stored: partition 0 of the first target topic."""
    return sorted(topics)[0], 0


@dataclass
class CommitFact:
    """What a committed task attempt recorded about itself."""

    batch_id: int
    rows: int
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)

    def encode(self) -> str:
        body = {"b": self.batch_id, "rows": self.rows, "partitions": self.partitions}
        text = json.dumps(body, separators=(",", ":"))
        if len(text) > _MAX_METADATA:  # very many target partitions: keep the count only
            text = json.dumps({"b": self.batch_id, "rows": self.rows}, separators=(",", ":"))
        return text

    @classmethod
    def decode(cls, batch_id: int, metadata: str | None) -> CommitFact:
        try:
            body = json.loads(metadata or "{}")
        except ValueError:
            body = {}
        return cls(batch_id=batch_id, rows=int(body.get("rows", 0)),
                   partitions=body.get("partitions") or {})


def read_fact(conf: Any, sink_id: str, writer: int, topics: list[str], batch_id: int,
              timeout: float) -> CommitFact | None:
    """The fact of (batch_id, writer) when its transaction committed, else None."""
    lease = fact_writer(conf, sink_id, writer)
    try:
        return lease.client.read(topics, batch_id, timeout)
    finally:
        lease.release()


# -- per-worker cache: a FactWriter per (producer configuration, group) ------------------------
#: A new client costs a connection set-up (~60 ms on loopback) per task attempt; a worker
#: keeps the fact clients of the writer partitions it served last (each is a librdkafka
#: consumer with its own threads, so not many).
MAX_CACHED = 8
_CACHE: ClientCache[FactWriter] = ClientCache("commit-fact", MAX_CACHED,
                                              lambda facts: facts.close())


def fact_writer(conf: Any, sink_id: str, writer: int) -> Lease[FactWriter]:
    """The worker's :class:`FactWriter` of (sink_id, writer), created on first use, held
    until ``Lease.release()`` (``Lease.discard()`` after an error)."""
    key = (tuple(sorted((k, str(v)) for k, v in conf.items())), sink_id, writer)
    return _CACHE.acquire(key, lambda: FactWriter(conf, sink_id, writer))


def close_cached_fact_writers() -> None:
    _CACHE.clear()


class FactWriter:
    """Reads a writer's commit fact, and adds the next one to the open transaction of a
    producer: a consumer that never joins the group, cached per worker (``fact_writer``)."""

    def __init__(self, conf: Any, sink_id: str, writer: int) -> None:
        from confluent_kafka import Consumer

        self.group = group_id(sink_id, writer)
        consumer_conf = producers.consumer_config(conf, sink_id, "read_committed")
        consumer_conf["group.id"] = self.group
        consumer_conf.setdefault("reconnect.backoff.ms",
                                 producers.SHORT_LIVED_RECONNECT_BACKOFF_MS)
        # Never joins the group: it fetches the group's committed offset (read_committed
        # makes librdkafka ask with require_stable) and lends send_offsets_to_transaction
        # the group's metadata (generation -1, no member id), which the broker accepts for
        # a group without members.
        self._consumer = Consumer(consumer_conf)
        self._sink_id, self._writer = sink_id, writer

    def read(self, topics: list[str], batch_id: int, timeout: float) -> CommitFact | None:
        """One OffsetFetch (require_stable) to the group's coordinator; transient errors (a
        coordinator loading or moving, an offset still unstable) are asked again for up to
        ``timeout`` seconds."""
        from confluent_kafka import KafkaException, TopicPartition

        topic, partition = fact_partition(topics)

        def fetch() -> Any:
            for tp in self._consumer.committed([TopicPartition(topic, partition)], timeout=30):
                if tp.error is not None:
                    raise KafkaException(tp.error)
                return tp
            return None

        tp = retrying(fetch, what=f"{FAMILY} {self._sink_id}: commit fact of writer "
                                  f"{self._writer} (group {self.group!r})",
                      error=KafkaSinkError, timeout=timeout)
        if tp is None or tp.offset != batch_id:
            return None
        return CommitFact.decode(batch_id, tp.metadata)

    def send(self, producer: Any, topics: list[str], fact: CommitFact, timeout: float) -> None:
        from confluent_kafka import TopicPartition

        topic, partition = fact_partition(topics)
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, partition, fact.batch_id, metadata=fact.encode())],
            self._consumer.consumer_group_metadata(), timeout)

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as e:  # noqa: BLE001 - nothing to release beyond the handle
            log.debug("%s: closing the fact consumer of %s: %s", FAMILY, self.group, e)
