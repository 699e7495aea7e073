"""Offset arithmetic of the ``eo_kafka`` source: pure functions, no network, no Spark.

Everything here is deterministic: the same inputs give the same outputs, in the same order.
That is what makes ``partitions(start, end)`` a pure function of ``(start, end)``, so a
replayed micro-batch reads exactly the rows it read the first time (docs/design.md,
"Kafka source").

Vocabulary:

- a *TP* is ``(cluster, topic, partition)``; ``cluster`` is ``""`` for a single-cluster source;
- an *offsets map* is ``{TP: next_offset}``: the next offset to read, i.e. ``last + 1``;
- Spark's offset JSON is ``{"<topic>": {"<partition>": next_offset}}`` for one cluster and
  ``{"<cluster>": {"<topic>": {"<partition>": next_offset}}}`` for several.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from connectors.core.errors import KafkaSourceError, OptionError
from connectors.kafka.common import is_transient, kafka_error, retrying

log = logging.getLogger(__name__)

TP = tuple[str, str, int]
TopicPartitionKey = tuple[str, int]
#: ``{TP: next_offset}``: how the planner and the window WAL hold offsets. Spark's offset
#: JSON is decoded into this (and encoded back) only where it crosses to Spark or to disk.
Offsets = dict[TP, int]

#: Spark's special offsets in startingOffsets/endingOffsets JSON.
LATEST = -1
EARLIEST = -2


# -- Spark's offset JSON -------------------------------------------------------------------
def encode_offsets(offsets: Mapping[TP, int], multi_cluster: bool) -> dict[str, Any]:
    """``{TP: offset}`` -> Spark's offset JSON dict (string keys, sorted for stable output)."""
    out: dict[str, Any] = {}
    for (cluster, topic, partition), offset in sorted(offsets.items()):
        level = out.setdefault(cluster, {}) if multi_cluster else out
        level.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def decode_offsets(obj: Mapping[str, Any], multi_cluster: bool) -> Offsets:
    """The inverse of :func:`encode_offsets`. Raises :class:`KafkaSourceError` on bad shape."""
    out: dict[TP, int] = {}
    if multi_cluster:
        for cluster, topics in obj.items():
            if not isinstance(topics, Mapping):
                raise KafkaSourceError(f"offset for cluster {cluster!r} is not an object: {obj}")
            for (topic, partition), offset in _topics(topics).items():
                out[(cluster, topic, partition)] = offset
    else:
        for (topic, partition), offset in _topics(obj).items():
            out[("", topic, partition)] = offset
    return out


def _topics(obj: Mapping[str, Any]) -> dict[TopicPartitionKey, int]:
    out: dict[TopicPartitionKey, int] = {}
    for topic, parts in obj.items():
        if not isinstance(parts, Mapping):
            raise KafkaSourceError(f"offsets of topic {topic!r} must be an object, got {parts!r}")
        for p, off in parts.items():
            out[(topic, int(p))] = int(off)
    return out


def parse_assign(text: str, option: str, family: str = "eo_kafka") -> tuple[tuple[str, int], ...]:
    """The ``assign`` option: ``{"topicA": [0, 1], "topicB": [2]}`` -> sorted
    ``(topic, partition)`` pairs."""
    valid = 'give JSON like {"topicA": [0, 1], "topicB": [2]}'

    def bad(problem: str) -> OptionError:
        return OptionError(f"{family}: option '{option}' {problem}; {valid}", option=option)

    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        raise bad("is not valid JSON") from None
    if not isinstance(obj, dict) or not obj:
        raise bad("must be a non-empty JSON object")
    out: list[tuple[str, int]] = []
    for topic, parts in obj.items():
        if not isinstance(parts, list) or not parts:
            raise bad(f"has no partition list for topic {topic!r}")
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise bad(f"has an invalid partition {p!r} in {topic!r}")
            out.append((topic, p))
    return tuple(sorted(set(out)))


def parse_partition_offsets(
    text: str,
    option: str,
    *,
    family: str = "eo_kafka",
    allow_earliest: bool = True,
    allow_latest: bool = True,
    timestamps: bool = False,
) -> dict[TopicPartitionKey, int]:
    """Parse a per-partition JSON option such as ``startingOffsets``.

    ``{"topicA": {"0": 23, "1": -2}, "topicB": {"0": -1}}`` -> ``{("topicA", 0): 23, ...}``.
    ``-2`` means earliest and ``-1`` latest (Spark's convention); ``timestamps=True`` parses
    ``startingOffsetsByTimestamp``, whose values are epoch milliseconds (>= 0).
    """

    def bad(problem: str) -> OptionError:
        if timestamps:
            valid = 'give {"topic": {"0": <epoch millis>, ...}, ...}'
        else:
            specials = [s for s, ok in (("-2 = earliest", allow_earliest),
                                        ("-1 = latest", allow_latest)) if ok]
            extra = f" ({', '.join(specials)})" if specials else ""
            valid = f'give {{"topic": {{"0": <offset>{extra}, ...}}, ...}}'
        return OptionError(f"{family}: option '{option}' {problem}; {valid}", option=option)

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"is not valid JSON (at position {e.pos})") from None
    if not isinstance(obj, dict) or not obj:
        raise bad("must be a non-empty JSON object of topics")
    out: dict[TopicPartitionKey, int] = {}
    for topic, parts in obj.items():
        if not isinstance(parts, dict) or not parts:
            raise bad(f"has no partition object for topic {topic!r}")
        for p, value in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise bad(f"has a non-numeric partition {p!r} in topic {topic!r}") from None
            if partition < 0:
                raise bad(f"has a negative partition {partition} in topic {topic!r}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"has a non-integer value {value!r} for {topic}-{partition}")
            if timestamps:
                if value < 0:
                    raise bad(f"has a negative timestamp {value} for {topic}-{partition}")
            elif value == EARLIEST and not allow_earliest:
                raise bad(f"cannot use -2 (earliest) for {topic}-{partition}")
            elif value == LATEST and not allow_latest:
                raise bad(f"cannot use -1 (latest) for {topic}-{partition}")
            elif value < EARLIEST:
                raise bad(f"has an invalid offset {value} for {topic}-{partition}")
            out[(topic, partition)] = value
    return out


# -- ranges --------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class OffsetRange:
    """``[start, end)`` of one Kafka partition; the unit a Spark task reads.

    ``new_partition`` marks a partition that first appeared in this window: it starts at
    offset 0 ("earliest") and offsets below the log start are not data loss for it.
    """

    cluster: str
    topic: str
    partition: int
    start: int
    end: int
    new_partition: bool = False

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    @property
    def tp(self) -> TP:
        return (self.cluster, self.topic, self.partition)

    def describe(self) -> str:
        c = f"{self.cluster}/" if self.cluster else ""
        return f"{c}{self.topic}-{self.partition} [{self.start}, {self.end})"


def plan_ranges(
    start: Mapping[TP, int],
    end: Mapping[TP, int],
    *,
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """One range per partition of ``end``, sorted; pure in ``(start, end)``.

    A partition missing from ``start`` is new: it is read from offset 0 (earliest). A
    partition whose end is below its start lost data (the topic was recreated, or offsets
    were given beyond the log): an error with ``fail_on_data_loss``, else a warning and the
    partition is skipped.
    """
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        e = end[tp]
        if tp in start:
            s, new = start[tp], False
        else:
            s, new = 0, True
        if e < s:
            report_data_loss(
                fail_on_data_loss,
                f"{_tp_name(tp)}: the end offset {e} is below the start offset {s}; "
                f"offsets [{e}, {s}) are not available (topic recreated or truncated?)",
            )
            continue
        if e > s:
            ranges.append(OffsetRange(tp[0], tp[1], tp[2], s, e, new))
    return ranges


def split_ranges(
    ranges: Iterable[OffsetRange],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[OffsetRange]:
    """Split Kafka partition ranges into Spark partitions, deterministically.

    - ``min_partitions``: when there are fewer non-empty ranges than this, the extra pieces
      go to the ranges in proportion to their size (largest remainder, ties broken by
      topic-partition), so the result has exactly ``min_partitions`` pieces whenever there
      are at least that many records.
    - ``max_records_per_partition``: no piece holds more than this many offsets.

    A range cut into ``k`` pieces gets boundaries ``start + size * j // k``. The output is
    sorted by (cluster, topic, partition, start).
    """
    rs = sorted(r for r in ranges if r.size > 0)
    if not rs:
        return []
    pieces = [1] * len(rs)
    if min_partitions is not None and min_partitions > len(rs):
        # A range cannot have more pieces than records.
        pieces = _apportion(min_partitions, [r.size for r in rs], [r.tp for r in rs])
    if max_records_per_partition is not None:
        cap = max_records_per_partition
        pieces = [max(k, -(-r.size // cap)) for k, r in zip(pieces, rs, strict=True)]
    out: list[OffsetRange] = []
    for r, k in zip(rs, pieces, strict=True):
        bounds = [r.start + (r.size * j) // k for j in range(k + 1)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            if b > a:
                out.append(replace(r, start=a, end=b))
    return out


#: Records per Spark partition below which Kafka partition ranges are grouped
#: (option ``targetRecordsPerPartition``; docs/kafka-source.md, "Many partitions").
DEFAULT_TARGET_RECORDS = 100_000


def group_ranges(
    ranges: Iterable[OffsetRange],
    target: int,
    *,
    min_groups: int | None = None,
    max_records: int | None = None,
) -> list[tuple[OffsetRange, ...]]:
    """The Spark partitions of a window: ``ranges`` (the output of :func:`split_ranges`)
    grouped by size, deterministically.

    A range of at least ``capacity`` records is a Spark partition of its own. Smaller ones
    are packed, in (cluster, topic, partition, start) order, into groups of at most
    ``capacity`` records, one consumer reading each group. ``capacity`` is ``target``,
    lowered so that no group passes ``max_records`` (maxRecordsPerPartition) and so that
    there are at least ``min_groups`` partitions (minPartitions) where the records allow.
    A group holds ranges of one cluster, and never two pieces of one Kafka partition (a
    consumer is assigned each partition once). ``target <= 1`` turns grouping off: one
    range per Spark partition.
    """
    rs = sorted(r for r in ranges if r.size > 0)
    capacity = target
    if max_records is not None:
        capacity = min(capacity, max_records)
    if min_groups is not None and capacity > 1:
        big = sum(1 for r in rs if r.size >= capacity)
        small = sum(r.size for r in rs if r.size < capacity)
        wanted = min_groups - big
        if wanted > 0 and small:
            capacity = min(capacity, max(1, small // wanted))
    out: list[tuple[OffsetRange, ...]] = []
    group: list[OffsetRange] = []
    held = 0
    for r in rs:
        if r.size >= capacity:
            out.append((r,))
            continue
        if group and (held + r.size > capacity or r.cluster != group[-1].cluster
                      or r.tp == group[-1].tp):
            out.append(tuple(group))
            group, held = [], 0
        group.append(r)
        held += r.size
    if group:
        out.append(tuple(group))
    while min_groups is not None and len(out) < min_groups:
        # Rounding left fewer partitions than minPartitions asks for: halve the largest
        # group (by records; ties by its ranges) until there are enough or none is left.
        groups = [g for g in out if len(g) > 1]
        if not groups:
            break
        g = max(groups, key=lambda g: (sum(r.size for r in g), g))
        half, held, cut = sum(r.size for r in g) / 2, 0, 1
        for cut in range(1, len(g)):
            held += g[cut - 1].size
            if held >= half:
                break
        out.remove(g)
        out.extend((g[:cut], g[cut:]))
    return sorted(out)


def _apportion(total: int, weights: list[int], keys: list[Any]) -> list[int]:
    """Split ``total`` in proportion to ``weights``, each share <= its weight, and every
    non-zero weight gets at least 1 while ``total`` allows (a small partition is not
    starved by a large one). When ``total`` is below the number of non-zero weights, the
    largest weights get 1 each. Deterministic: ties go by ``keys``."""
    nonzero = [i for i, w in enumerate(weights) if w > 0]
    if total < len(nonzero):
        share = [0] * len(weights)
        for i in sorted(nonzero, key=lambda i: (-weights[i], keys[i]))[:total]:
            share[i] = 1
        return share
    share = _largest_remainder(total, weights, keys)
    for i in sorted((i for i in nonzero if share[i] == 0), key=lambda i: keys[i]):
        donor = max((j for j in nonzero if share[j] > 1), key=lambda j: (share[j], keys[j]))
        share[donor] -= 1
        share[i] = 1
    return share


def _largest_remainder(total: int, weights: list[int], keys: list[Any]) -> list[int]:
    """Split ``total`` units in proportion to ``weights`` (each share <= its weight)."""
    weight_sum = sum(weights)
    if weight_sum <= 0:
        return [0] * len(weights)
    total = min(total, weight_sum)
    floors: list[int] = []
    rems: list[int] = []
    for w in weights:
        q, r = divmod(total * w, weight_sum)
        floors.append(q)
        rems.append(r)
    left = total - sum(floors)
    order = sorted(range(len(weights)), key=lambda i: (-rems[i], keys[i]))
    for i in order:
        if left <= 0:
            break
        if floors[i] < weights[i]:
            floors[i] += 1
            left -= 1
    return floors


# -- rate limiting -------------------------------------------------------------------------
def limit_offsets(
    start: Mapping[TP, int], latest: Mapping[TP, int], max_records: int
) -> dict[TP, int]:
    """End offsets that admit at most ``max_records`` records in total.

    The budget is split across partitions in proportion to their backlog
    (``latest - start``). When the budget allows, every partition with a backlog gets at
    least one record, so a small partition is not starved by a large one. Partitions of
    ``latest`` missing from ``start`` count from offset 0. Pure and deterministic.
    """
    if max_records < 0:
        raise ValueError("max_records must be >= 0")
    tps = sorted(latest)
    backlog = [max(0, latest[tp] - start.get(tp, 0)) for tp in tps]
    total = sum(backlog)
    if total <= max_records:
        return {tp: latest[tp] for tp in tps}
    share = _apportion(max_records, backlog, tps)
    out: dict[TP, int] = {}
    for i, tp in enumerate(tps):
        s = start.get(tp, 0)
        out[tp] = s + share[i] if backlog[i] > 0 else latest[tp]
    return out


def clamp_offsets(end: Mapping[TP, int], ceiling: Mapping[TP, int]) -> dict[TP, int]:
    """``end`` capped by ``ceiling`` (Trigger.AvailableNow's target); drops TPs not in it."""
    return {tp: min(off, ceiling[tp]) for tp, off in end.items() if tp in ceiling}


def total_records(start: Mapping[TP, int], end: Mapping[TP, int]) -> int:
    """Offsets between ``start`` and ``end`` (an upper bound on the records between them)."""
    return sum(max(0, e - start.get(tp, 0)) for tp, e in end.items())


def records_for_bytes(max_bytes: int, avg_record_bytes: float) -> int:
    """How many records fit in ``max_bytes``, given an observed average record size."""
    return max(1, int(max_bytes // max(1.0, avg_record_bytes)))


# -- data loss -----------------------------------------------------------------------------
def report_data_loss(fail: bool, message: str) -> None:
    """``failOnDataLoss=true``: raise; ``false``: log a warning and go on."""
    if fail:
        raise KafkaSourceError(
            f"eo_kafka: data loss: {message}. Set failOnDataLoss=false to skip lost offsets "
            "with a warning instead."
        )
    log.warning("eo_kafka: data loss (skipped, failOnDataLoss=false): %s", message)


def _tp_name(tp: TP) -> str:
    cluster, topic, partition = tp
    return f"{cluster + '/' if cluster else ''}{topic}-{partition}"


tp_name = _tp_name


# -- a read that found no records where it expected them (range_reader) ---------------------
def stalled(
    consumer: Any, r: OffsetRange, position: int, fail_on_data_loss: bool, timeout: float
) -> int | None:
    """No records came: the new position if ``position`` is outside the log, else None.

    A leader moving (a broker restart, a rolling upgrade) answers the watermark request with
    NOT_LEADER_FOR_PARTITION, a timeout or a dropped connection, or librdkafka's metadata
    cache misses the partition for a moment (``_UNKNOWN_PARTITION``; the range was planned
    from it, so it exists): that is no news about the log, so the read goes on (librdkafka
    finds the new leader) and the stall deadline stays the bound."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(r.topic, r.partition), timeout=timeout, cached=False
        )
    except KafkaException as e:
        if not (is_transient(e) or _unknown_for_now(e)):
            raise
        log.info("eo_kafka: %s: watermarks not known while stalled (%s); reading on",
                 r.describe(), e)
        return None
    if position < low or position > high:
        return out_of_range(consumer, r, position, "no records at this offset",
                             fail_on_data_loss, timeout)
    return None


def out_of_range(
    consumer: Any,
    r: OffsetRange,
    position: int,
    err: Any,
    fail_on_data_loss: bool,
    timeout: float,
) -> int:
    """``position`` is outside the log: decide whether that is data loss; return where to go.
    The watermarks are asked again while the partition's leader moves (until ``timeout``)."""
    from confluent_kafka import TopicPartition

    low, high = retrying(
        lambda: consumer.get_watermark_offsets(
            TopicPartition(r.topic, r.partition), timeout=max(1.0, min(timeout, 10.0)),
            cached=False),
        what=f"eo_kafka: ListOffsets of {r.describe()}", error=KafkaSourceError,
        timeout=timeout)
    if position < low:
        if not r.new_partition:
            report_data_loss(
                fail_on_data_loss,
                f"{r.describe()}: offsets [{position}, {min(low, r.end)}) were deleted "
                f"(log now starts at {low}; retention or compaction removed them)",
            )
        return low
    report_data_loss(
        fail_on_data_loss,
        f"{r.describe()}: offset {position} is beyond the end of the log ({high}); "
        f"offsets [{position}, {r.end}) are not available ({err})",
    )
    return r.end


def _unknown_for_now(exc: BaseException) -> bool:
    """librdkafka's own cache does not know the partition (seen once under node kills, after
    an election: ``Failed to get watermark offsets: Local: Unknown partition``)."""
    err = kafka_error(exc)
    return err is not None and str(err.name()) in ("_UNKNOWN_PARTITION", "UNKNOWN_TOPIC_OR_PART")
