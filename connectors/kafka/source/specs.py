"""What a read of the ``eo_kafka`` source reads, as frozen, picklable specs: where it starts
(:class:`StartSpec`) and each cluster with its subscription (:class:`ClusterSpec`).

They sit below the options' declaration and parsing (``kinds``, ``declaration``,
``options``), which build them, so that every import among those modules points one way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from connectors.core.options import RedactedDict

# Reader defaults that users may override through kafka.*.
READER_DEFAULTS = {
    "isolation.level": "read_committed",
    # 32 MiB of prefetch per partition keeps a Python worker's memory bounded whatever the
    # backlog (librdkafka's default is 64 MiB).
    "queued.max.messages.kbytes": "32768",
    # Throughput with the same bound (docs/kafka-source.md, "Performance"): a range reader
    # has one partition, so one fetch may bring 10 MiB of it (librdkafka's default is
    # 1 MiB); and a full prefetch queue postpones the next fetch by 10 ms, not
    # librdkafka's 1 s, which a Python reader drains the queue well within.
    "max.partition.fetch.bytes": str(10 * 1024 * 1024),
    "fetch.queue.backoff.ms": "10",
    # A fetch of ranges at their end parks at the broker this long, and the next task's
    # first fetch waits behind it (librdkafka: 500 ms, per task; docs: "Many partitions").
    "fetch.wait.max.ms": "10",
}


@dataclass(frozen=True)
class StartSpec:
    """Where a query starts (or, for ``endingOffsets``, where a batch read ends).

    ``kind`` is ``earliest``, ``latest``, ``group``, ``offsets`` (per-partition JSON, with
    -2/-1), ``timestamps`` (per-partition millis) or ``timestamp`` (one millis for all).
    """

    kind: str
    offsets: tuple[tuple[str, int, int], ...] = ()
    timestamp: int | None = None

    def offset_map(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self.offsets}


@dataclass(frozen=True)
class ClusterSpec:
    """One Kafka cluster of the source and what to read from it."""

    name: str
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()
    starting: StartSpec = StartSpec("latest")
    # librdkafka settings from kafka.* (bootstrap.servers included); repr hides secrets.
    kafka: RedactedDict = field(default_factory=RedactedDict, compare=False)
    #: No start was given for this cluster: ``starting`` is the read's default, streaming
    #: ``latest`` or batch ``earliest`` (``KafkaSourceOptions.for_read`` sets it).
    default_start: bool = False

    def describe_subscription(self) -> str:
        if self.subscribe:
            return f"subscribe={','.join(self.subscribe)}"
        if self.subscribe_pattern is not None:
            return f"subscribePattern={self.subscribe_pattern}"
        return "assign=" + json.dumps(_assign_json(self.assign), sort_keys=True)

    def matches(self, topic: str) -> bool:
        if self.subscribe:
            return topic in self.subscribe
        if self.subscribe_pattern is not None:
            return re.fullmatch(self.subscribe_pattern, topic) is not None
        return any(t == topic for t, _ in self.assign)

    def reader_conf(self, group_id: str) -> dict[str, str]:
        """librdkafka configuration of the executors' range readers."""
        conf: dict[str, str] = dict(READER_DEFAULTS)
        conf.update(self.kafka)
        conf.update(
            {
                # Required by librdkafka; the readers only assign(), never join or commit.
                "group.id": conf.get("group.id", group_id),
                "enable.auto.commit": "false",
                "enable.auto.offset.store": "false",
                "enable.partition.eof": "true",
                # An offset outside the log is reported, never silently reset: that is how
                # data loss is detected (failOnDataLoss).
                "auto.offset.reset": "error",
            }
        )
        return conf


def _assign_json(assign: tuple[tuple[str, int], ...]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for t, p in assign:
        out.setdefault(t, []).append(p)
    return out
