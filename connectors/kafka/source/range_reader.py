"""Executor side of the ``eo_kafka`` source: the range reader and the worker's consumers.

:func:`read_ranges` reads one Spark partition: a group of offset ranges ``[start, end)``
(one range, or many small ones; ``offsets.group_ranges``), with one consumer assigned to
all of them, and yields Arrow record batches in Spark's Kafka schema. Every range stops on
*position*, not on a message count: compaction and transaction markers leave gaps in the
offsets, so "end - start messages" would wait forever (or read into the next window).

The rows come out in a fixed order, whatever order the broker's fetches arrive in: the
group's ranges one after the other, each in offset order. A replayed batch therefore
yields the same rows in the same order (the Kafka sink's ``deterministicOrder=true``
relies on it). Records of a later range that arrive early are kept as Arrow batches (a
copy, so librdkafka's fetch buffers are freed) until their turn; past ``BUFFER_BYTES`` the
later ranges are paused, and the head range reads on alone.

Consumers are cached per Python worker, keyed by their configuration, in a bounded
:class:`~connectors.kafka.common.ClientCache`, so a micro-batch does not pay consumer
start-up (and a metadata round trip) for every task.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import operator
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.core.errors import KafkaSourceError
from connectors.kafka import access
from connectors.kafka.common import LIBRDKAFKA_LOG, ClientCache
from connectors.kafka.source.offsets import OffsetRange, out_of_range, stalled
from connectors.kafka.source.records import (  # noqa: F401 - arrow_schema, spark_schema_ddl: public here too
    arrow_schema,
    concat,
    spark_schema_ddl,
    to_batch,
)

log = logging.getLogger(__name__)

#: Consumers a Python worker keeps (one per configuration it read with; a task uses one).
MAX_CONSUMERS = 4
#: Bytes of early records (of ranges after the head) a grouped read holds before it
#: pauses those ranges.
BUFFER_BYTES = 64 * 1024 * 1024


def _close_quietly(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception:  # noqa: BLE001, S110 - closing a consumer we are discarding
        pass


# Per Python worker: config -> Consumer. Spark reuses Python workers across tasks
# (spark.python.worker.reuse, on by default), so consumers outlive one task.
_CONSUMERS: ClientCache[Any] = ClientCache("consumer", MAX_CONSUMERS, _close_quietly)


def conf_key(conf: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(conf.items()))


def _new_consumer(conf: Mapping[str, str]) -> Any:
    from confluent_kafka import Consumer

    return Consumer({**conf, "logger": LIBRDKAFKA_LOG})


def close_cached_consumers() -> None:
    """Close every consumer this process cached (see ``connectors.kafka.close_cached_clients``)."""
    _CONSUMERS.clear()


def read_ranges(
    ranges: Iterable[OffsetRange],
    conf: Mapping[str, str],
    *,
    include_headers: bool = False,
    cluster: str | None = None,
    fail_on_data_loss: bool = True,
    poll_timeout_s: float = 120.0,
    batch_records: int = 20000,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of every range, range after range, each in offset order.

    A range is done when a record at offset >= ``end - 1`` arrived, or its partition's EOF
    is at or past ``end`` (the last offsets were transaction markers or compacted away).
    Offsets before the log start are data loss (``fail_on_data_loss``), except for a new
    partition, which starts at its earliest offset. The ranges are of one cluster and of
    distinct Kafka partitions (as ``group_ranges`` plans them).
    """
    todo = [r for r in ranges if r.size > 0]
    if not todo:
        return
    if len({r.tp for r in todo}) != len(todo):
        raise KafkaSourceError(
            f"eo_kafka: one Spark partition holds two ranges of one Kafka partition: "
            f"{[r.describe() for r in todo]} (internal planning error)")
    key = conf_key(conf)
    with _CONSUMERS.lease(key, lambda: _new_consumer(conf)) as consumer:
        try:
            yield from _read(_GroupReader(consumer, todo, include_headers, cluster,
                                          fail_on_data_loss, poll_timeout_s, batch_records,
                                          conf))
        except GeneratorExit:
            # Spark stopped reading early (a limit); the consumer is still fine.
            raise
        except BaseException:
            _CONSUMERS.discard(key)  # an error left it in an unknown state
            raise


def read_range(r: OffsetRange, conf: Mapping[str, str], **kw: Any) -> Iterator[pa.RecordBatch]:
    """:func:`read_ranges` of one range."""
    return read_ranges([r], conf, **kw)


def _read(reader: _GroupReader) -> Iterator[pa.RecordBatch]:
    consumer = reader.consumer
    consumer.assign(reader.topic_partitions())
    try:
        while not reader.finished:
            # The cyclic GC off while one consume() list is turned into batches: every
            # Message is a GC-tracked object, so tens of thousands of them per call would
            # run generation-0 collections (and promote into full ones) that find nothing
            # to free. It is on again before a batch leaves, so Spark's code and ours
            # between batches collect as usual.
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                batches = reader.step()
            finally:
                if gc_was_on:
                    gc.enable()
            yield from batches
    finally:
        # Stop fetching these partitions: the next task may read others. A pause outlives
        # unassign/assign in librdkafka, so what is held back is resumed first (resuming
        # after the next assign instead would discard that read's first fetch and delay it
        # by ~1 s).
        try:
            if reader.held_back:
                consumer.resume([reader._tp(i) for i in reader.held_back])
            consumer.unassign()
        except Exception:  # noqa: BLE001, S110 - the consumer is dropped on error anyway
            pass
        release_free_memory()


def release_free_memory() -> None:
    """Give the C heap's free pages back to the OS after a read (glibc ``malloc_trim``).

    librdkafka's fetch buffers come from its broker threads' malloc arenas; once freed, glibc
    keeps them, so a reused Python worker's RSS climbs with every query it serves (257 MB
    after one 1M-record read, ~430 MB after seven reads in one session) although what it
    holds is bounded. A no-op where the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Any:
    global _TRIM
    if _TRIM is None:
        try:
            import ctypes
            import ctypes.util

            _TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _TRIM = False
    return _TRIM or None


_TRIM: Any = None


class _Part:
    """One range of a group: where it is, whether it is done, what waits for its turn."""

    __slots__ = ("r", "position", "done", "early", "early_bytes")

    def __init__(self, r: OffsetRange) -> None:
        self.r = r
        self.position = r.start
        self.done = False
        self.early: list[pa.RecordBatch] = []
        self.early_bytes = 0


class _GroupReader:
    """The state of one grouped read: every range's position, the head range (the one
    whose rows go out now), the deadline.

    :meth:`step` makes one ``consume()`` call and returns the batches ready to go out; the
    caller loops until :attr:`finished`."""

    def __init__(
        self,
        consumer: Any,
        ranges: list[OffsetRange],
        include_headers: bool,
        cluster: str | None,
        fail_on_data_loss: bool,
        poll_timeout_s: float,
        batch_records: int,
        conf: Mapping[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import KafkaError

        self.consumer, self.cluster = consumer, cluster
        self.conf = conf or {}  # names the principal in an authorization error
        self.parts = [_Part(r) for r in ranges]
        self.index = {(r.topic, r.partition): i for i, r in enumerate(ranges)}
        self.one_topic = len({r.topic for r in ranges}) == 1
        # run keys -> range index: the partition (one topic), else the index itself
        self.run_index = ({r.partition: i for i, r in enumerate(ranges)} if self.one_topic
                          else {i: i for i in range(len(ranges))})
        self.fail_on_data_loss, self.poll_timeout_s = fail_on_data_loss, poll_timeout_s
        self.batch_records = batch_records
        self.schema = arrow_schema(include_headers, cluster is not None)
        self.head = 0
        self.out: list[pa.RecordBatch] = []
        self.early_bytes = 0
        self.held_back: set[int] = set()  # ranges paused while early records pile up
        self.deadline = time.monotonic() + poll_timeout_s
        self.eof_code = KafkaError._PARTITION_EOF
        self.reset_codes = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)

    @property
    def finished(self) -> bool:
        return self.head >= len(self.parts) and not self.out

    def topic_partitions(self) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(p.r.topic, p.r.partition, p.position) for p in self.parts]

    def _tp(self, i: int) -> Any:
        from confluent_kafka import TopicPartition

        return TopicPartition(self.parts[i].r.topic, self.parts[i].r.partition)

    # -- one step -----------------------------------------------------------------------------
    def step(self) -> list[pa.RecordBatch]:
        from confluent_kafka import Message

        # Ask for no more than the ranges still hold: records past ``end`` are the next
        # window's, and a smaller ask returns as soon as the ranges are complete. (Gaps from
        # markers or compaction make the ask too large by a little; the cut drops what lies
        # past ``end``, and the partition EOF ends a range that ends in a gap.)
        left = sum(p.r.end - p.position for p in self.parts[self.head:] if not p.done)
        msgs = self.consumer.consume(max(1, min(self.batch_records, left)), 1.0) if left else []
        if msgs:
            errors = list(map(Message.error, msgs))
            # Identity, not ``errors.count(None)``: KafkaError's == raises on None.
            if any(map(operator.is_not, errors, itertools.repeat(None, len(errors)))):
                msgs = self._errors(msgs, errors)
        elif left:
            self._no_records()
        if msgs:
            # Records (no error) always carry an offset; the stubs allow None for events.
            offsets: list[int] = list(map(Message.offset, msgs))  # type: ignore[arg-type]
            for i, a, b in self._runs(msgs):
                self._take(i, msgs[a:b], offsets[a:b])
        self._advance()
        if not self.out:
            return []
        out, self.out = self.out, []
        return concat(out, self.schema, self.batch_records)

    def _runs(self, msgs: list[Any]) -> list[tuple[int, int, int]]:
        """``(range index, first, end)`` of every run of one partition's records in a
        consume() list (librdkafka hands out one fetch response's records together).
        Records of a partition this read does not hold (none are expected: librdkafka drops
        what an earlier assignment fetched) are left out."""
        from confluent_kafka import Message

        if len(self.parts) == 1:
            return [(0, 0, len(msgs))]
        topic = self.parts[0].r.topic
        if self.one_topic:
            keys = np.fromiter(map(Message.partition, msgs), np.int64, len(msgs))
        else:
            pairs: Iterator[Any] = zip(map(Message.topic, msgs), map(Message.partition, msgs),
                                       strict=True)
            keys = np.fromiter(map(self._index_of, pairs), np.int64, len(msgs))
        starts = [0, *(np.flatnonzero(np.diff(keys)) + 1).tolist()]
        ends = [*starts[1:], len(msgs)]
        runs = []
        for a, b in zip(starts, ends, strict=True):
            i = self.run_index.get(int(keys[a]))
            if i is None:
                log.debug("eo_kafka: %d records of %s-%s, which this read does not hold, "
                          "left out", b - a, topic if self.one_topic else "?", int(keys[a]))
                continue
            runs.append((i, a, b))
        return runs

    def _index_of(self, pair: tuple[str, int]) -> int:
        return self.index.get(pair, -1)

    def _take(self, i: int, msgs: list[Any], offsets: list[int]) -> None:
        """The records of range ``i`` from one run: cut to ``[position, end)``, made a batch,
        sent out (the head range) or kept for its turn."""
        p = self.parts[i]
        if offsets[0] >= p.r.end:
            return  # past the end: fetched before the range was paused
        if offsets[0] < p.position:  # fetched again after a pause or a seek
            cut = bisect.bisect_left(offsets, p.position)
            msgs, offsets = msgs[cut:], offsets[cut:]
            if not msgs:
                return
        end = p.r.end
        if offsets[-1] >= end - 1:
            if offsets[-1] >= end:
                cut = bisect.bisect_left(offsets, end)
                msgs, offsets = msgs[:cut], offsets[:cut]
            self._done(i)
            if not msgs:
                return
        p.position = offsets[-1] + 1
        self.deadline = time.monotonic() + self.poll_timeout_s
        batch = to_batch(msgs, offsets, p.r.topic, p.r.partition, self.cluster, self.schema)
        if i == self.head:
            self.out.append(batch)
            return
        p.early.append(batch)
        p.early_bytes += batch.nbytes
        self.early_bytes += batch.nbytes
        if self.early_bytes > BUFFER_BYTES:
            self._hold_back()

    def _done(self, i: int) -> None:
        p = self.parts[i]
        if p.done:
            return
        p.done = True
        if len(self.parts) > 1:
            # Stop fetching past its end. Unassigned, not paused: a pause would outlive
            # this read in the consumer.
            if i in self.held_back:
                self.consumer.resume([self._tp(i)])
                self.held_back.discard(i)
            self.consumer.incremental_unassign([self._tp(i)])

    def _advance(self) -> None:
        """Move the head past finished ranges; what the new head fetched early goes out."""
        moved = False
        while self.head < len(self.parts):
            p = self.parts[self.head]
            if p.early:
                self.out.extend(p.early)
                self.early_bytes -= p.early_bytes
                p.early, p.early_bytes = [], 0
            if not p.done:
                break
            self.head += 1
            moved = True
        if moved and self.held_back:
            resume = ([i for i in self.held_back] if self.early_bytes <= BUFFER_BYTES // 2
                      else [i for i in self.held_back if i == self.head])
            if resume:
                self.consumer.resume([self._tp(i) for i in resume])
                self.held_back.difference_update(resume)

    def _hold_back(self) -> None:
        """Early records passed ``BUFFER_BYTES``: pause every range but the head."""
        hold = [i for i in range(self.head + 1, len(self.parts))
                if not self.parts[i].done and i not in self.held_back]
        if hold:
            self.consumer.pause([self._tp(i) for i in hold])
            self.held_back.update(hold)

    # -- the slow paths -------------------------------------------------------------------------
    def _no_records(self) -> None:
        # Brokers differ on a fetch outside the log: Kafka answers OFFSET_OUT_OF_RANGE
        # (handled in _errors), others just return nothing. So a stall checks the
        # watermarks itself, for every range still fetching.
        for i, p in enumerate(self.parts):
            if p.done or i < self.head or i in self.held_back:
                continue
            jump = stalled(self.consumer, p.r, p.position, self.fail_on_data_loss,
                            self.poll_timeout_s)
            if jump is not None:
                self._seek(i, jump)
        if time.monotonic() > self.deadline:
            waiting = [f"{p.r.describe()} at offset {p.position}"
                       for p in self.parts if not p.done]
            raise KafkaSourceError(
                f"eo_kafka: reading {', '.join(waiting[:5])}"
                f"{' ...' if len(waiting) > 5 else ''} made no progress for "
                f"{self.poll_timeout_s:.0f}s; the broker is unreachable or an open "
                "transaction holds the last stable offset (kafkaConsumer.pollTimeoutMs sets "
                "this limit)"
            )

    def _seek(self, i: int, position: int) -> None:
        from confluent_kafka import TopicPartition

        p = self.parts[i]
        p.position = position
        self.deadline = time.monotonic() + self.poll_timeout_s
        if position >= p.r.end:
            self._done(i)
            return
        if len(self.parts) == 1:
            self.consumer.assign([TopicPartition(p.r.topic, p.r.partition, position)])
            return
        # A partition in an offset error cannot seek; it is assigned again at ``position``.
        self.consumer.incremental_unassign([self._tp(i)])
        self.consumer.incremental_assign([TopicPartition(p.r.topic, p.r.partition, position)])

    def _errors(self, msgs: list[Any], errors: list[Any]) -> list[Any]:
        """The slow path of a consume() list with error events: EOF, out of range, or a
        failure; returns the records to keep."""
        good = []
        for m, err in zip(msgs, errors, strict=True):
            if err is None:
                good.append(m)
                continue
            code = err.code()
            i = self.index.get((m.topic(), m.partition()))
            if i is None:  # an event of a partition an earlier read had assigned
                continue
            p = self.parts[i]
            if code == self.eof_code:
                if m.offset() >= p.r.end:
                    self._done(i)
            elif code in self.reset_codes:
                if not p.done:
                    self._seek(i, out_of_range(self.consumer, p.r, p.position, err,
                                                self.fail_on_data_loss, self.poll_timeout_s))
            elif err.fatal() or not err.retriable() or access.is_access_error(err):
                read = access.Acl("TOPIC", p.r.topic, "LITERAL", "READ", "Fetch")
                denied = access.denied(err, who="eo_kafka", conf=self.conf, needs=[read],
                                       request=f"reading {p.r.describe()}")
                raise KafkaSourceError(denied or (
                    f"eo_kafka: reading {p.r.describe()} at offset {p.position}: {err}"
                ))
            else:
                log.debug("eo_kafka: transient error on %s: %s", p.r.describe(), err)
        return good
