"""Deterministic routing for the exactly-once Kafka sink (docs/design.md, "Kafka sink:
recovery keys", the paragraph on routing).

The sink computes every record's target partition itself and passes it to ``produce()``,
so a retried row lands in the same partition as its first attempt. That is what makes the
recovery rule "max seq seen in partition p" meaningful:

- an explicit ``partition`` column is used as given;
- a key is hashed with murmur2 exactly like the Java client's default partitioner
  (``Utils.toPositive(Utils.murmur2(key)) % numPartitions``), so keyed records land where
  Spark's own Kafka sink (and any Java producer) would put them;
- null keys go in runs of about :data:`NULL_KEY_RUN_BYTES` bytes (the sink option
  ``nullKeyRunBytes``) to one partition, the task's runs to consecutive partitions from a
  start that depends on (batch, writer): a null-key row goes to run
  ``(start + before // budget) % numPartitions``, where ``before`` is the bytes of the task's
  null-key rows ahead of it in seq order (:class:`ByteRuns`, which says what a row's bytes
  are). Sticky like the Java client's partitioner for null keys (KIP-480, by bytes since
  KIP-794), so a task touches few partitions and sends few, full produce requests
  (librdkafka sends one request per partition: a task spreading 10,000 rows over 1,000
  partitions one row at a time sent 1,000 requests of 10 rows), and reproducible on a
  retry, which librdkafka's random choice is not. Started markers written before the runs
  were counted in bytes keep their runs of rows (:class:`RowRuns`).

murmur2 runs vectorised over an Arrow binary column with numpy (keys grouped by length,
4-byte blocks mixed column-wise), because a per-row Python hash would cost more than the
``produce()`` call itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The default byte budget of a null-key run (the sink option ``nullKeyRunBytes``): about
#: 10 MB, the run of 100,000 rows of 100-byte records that was measured, in rows, before the
#: runs were counted in bytes. Every partition a write touches costs the brokers more than
#: its records do (a transaction's commit marker, a producer state entry, replica fetch work
#: per partition): runs of 1,000 rows into a 1,000-partition topic on one broker made
#: 1.06-1.13x Spark's sink, runs of 10,000 (librdkafka's largest batch by count) 1.56x; on
#: the 3-node cluster (replication 3), runs of 10,000 left a 1,000,000-row write at 2.2
#: broker CPU-seconds and 460-600k rows/s, runs of 100,000 at 1.4 CPU-seconds and 780-970k
#: rows/s against Spark's sink's 446-460k (docs/kafka-sink.md, "Into 1,000 partitions"). A
#: run is ten full record batches (librdkafka's ``batch.size``, 1,000,000 bytes), sent
#: pipelined. In bytes, 10 KB records make runs of about 1,000 rows, not 1 GB. Over many
#: batches the runs still spread evenly (each batch and writer starts elsewhere); within one
#: they are coarser than the Java client's sticky partitioner.
NULL_KEY_RUN_BYTES = 10_000_000
#: The run, in rows, of the release before the runs were counted in bytes (its started
#: markers record it as ``null_key_run``).
NULL_KEY_RUN = 100_000
#: The run, in rows, of started markers written before the run was recorded in them: a
#: retry routes its rows as its first attempt did.
LEGACY_NULL_KEY_RUN = 1000

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int (the reference implementation)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_partition(key: bytes, num_partitions: int) -> int:
    """The Java default partitioner's choice for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


def binary_buffers(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of a binary/large_binary array, honouring the array's slice offset."""
    offset_type = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    bufs = keys.buffers()
    offsets = np.frombuffer(bufs[1], dtype=offset_type)[keys.offset : keys.offset + len(keys) + 1]
    data = (
        np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    )
    return offsets.astype(np.int64), data


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """Unsigned 32-bit murmur2 of every value of a binary array (nulls hash as empty)."""
    if pa.types.is_string(keys.type):
        keys = keys.cast(pa.binary())
    elif pa.types.is_large_string(keys.type):
        keys = keys.cast(pa.large_binary())
    n = len(keys)
    out = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return out
    offsets, data = binary_buffers(keys)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    m = np.uint32(_M)
    with np.errstate(over="ignore"):
        for length in np.unique(lengths):
            rows = np.nonzero(lengths == length)[0]
            base = starts[rows]
            h = np.full(len(rows), (_SEED ^ int(length)) & _MASK32, dtype=np.uint32)
            for block in range(int(length) // 4):
                at = base + 4 * block
                k = (
                    data[at].astype(np.uint32)
                    | (data[at + 1].astype(np.uint32) << 8)
                    | (data[at + 2].astype(np.uint32) << 16)
                    | (data[at + 3].astype(np.uint32) << 24)
                )
                k *= m
                k ^= k >> np.uint32(24)
                k *= m
                h *= m
                h ^= k
            tail = base + (int(length) & ~3)
            rest = int(length) % 4
            if rest == 3:
                h ^= data[tail + 2].astype(np.uint32) << 16
            if rest >= 2:
                h ^= data[tail + 1].astype(np.uint32) << 8
            if rest >= 1:
                h ^= data[tail].astype(np.uint32)
                h *= m
            h ^= h >> np.uint32(13)
            h *= m
            h ^= h >> np.uint32(15)
            out[rows] = h
    return out


def null_key_start(batch_id: int, writer: int) -> int:
    """Where a task's null-key runs begin (before ``% numPartitions``): spread over
    partitions by batch and writer, the same on every attempt."""
    return (batch_id * 7_919 + writer * 104_729) & 0x7FFFFFFF


class NullKeyRuns(Protocol):
    """How one task attempt cuts its null-key rows into runs. An instance is stateful: it
    is given the task's rows chunk after chunk, in seq order, and carries what it needs from
    one chunk to the next, so any chunking of the same rows routes them the same way."""

    def next_runs(self, sticky: np.ndarray, sizes: Callable[[], np.ndarray]) -> np.ndarray:
        """The run (``start`` + its index, before ``% numPartitions``) of every row of the
        task's next chunk; ``sticky`` marks the rows routed by runs (null key, no explicit
        partition), ``sizes()`` gives every row's bytes (:meth:`ByteRuns.next_runs`)."""
        ...


class ByteRuns:
    """Runs of about ``budget`` bytes: a null-key row goes to run ``before // budget``, where
    ``before`` counts the bytes of the task's null-key rows ahead of it in seq order. A
    row's bytes are its value's and its headers' (every header's name in UTF-8 and its
    value; null: 0), as ``sizes`` gives them; its key is null; the recovery-key header the
    sink adds does not count, so both delivery modes route alike. Rows with a key or an
    explicit partition count nothing. A run so holds about ``budget`` bytes (up to one record
    more); a record bigger than the budget is a run of its own, and the runs it spans are
    skipped (their partitions get nothing from it)."""

    def __init__(self, start: int, budget: int) -> None:
        if budget < 1:
            raise ValueError(f"a null-key run's budget must be positive, got {budget}")
        self.start = start
        self.budget = budget
        #: bytes of the task's null-key rows routed so far (from its first row)
        self.before = 0

    def next_runs(self, sticky: np.ndarray, sizes: Callable[[], np.ndarray]) -> np.ndarray:
        if not sticky.any():
            return np.full(len(sticky), self.start + self.before // self.budget, np.int64)
        every = sizes()
        counted = every if sticky.all() else np.where(sticky, every, 0)
        through = np.cumsum(counted, dtype=np.int64)  # bytes up to and including each row
        through += self.before
        self.before = int(through[-1])
        runs = through - counted  # bytes before each row (in place below: no more copies)
        runs //= self.budget
        runs += self.start
        return runs

    def __repr__(self) -> str:
        return f"ByteRuns(start={self.start}, budget={self.budget}, before={self.before})"


class RowRuns:
    """Runs of ``rows`` consecutive seqs (every row counts, keyed or not): the routing of
    started markers written before the runs were counted in bytes (``null_key_run``, or
    :data:`LEGACY_NULL_KEY_RUN` when the marker has none)."""

    def __init__(self, start: int, rows: int) -> None:
        if rows < 1:
            raise ValueError(f"a null-key run's row count must be positive, got {rows}")
        self.start = start
        self.rows = rows
        #: the seq of the next chunk's first row
        self.before = 0

    def next_runs(self, sticky: np.ndarray, sizes: Callable[[], np.ndarray]) -> np.ndarray:
        seqs = self.before + np.arange(len(sticky), dtype=np.int64)
        self.before += len(sticky)
        return self.start + seqs // self.rows

    def __repr__(self) -> str:
        return f"RowRuns(start={self.start}, rows={self.rows}, before={self.before})"


def route(
    keys: pa.Array | None,
    explicit: pa.Array | None,
    num_partitions: np.ndarray,
    runs: NullKeyRuns,
    sizes: Callable[[], np.ndarray],
) -> np.ndarray:
    """Target partition of every row (int32) of the task's next chunk, in seq order.

    ``num_partitions`` holds, per row, the partition count of that row's topic. Explicit
    partitions win, then murmur2 of the key, then ``runs`` for null keys (``sizes()``: every
    row's bytes, asked for only when ``runs`` counts bytes and a row has a null key).
    """
    n = len(num_partitions)
    counts = num_partitions.astype(np.int64)
    sticky = np.ones(n, dtype=bool)
    hashed = given = None
    if keys is not None and keys.null_count < n:
        has_key = valid_mask(keys)
        hashed = (murmur2_array(keys).astype(np.int64) & 0x7FFFFFFF) % counts
        sticky &= ~has_key
    if explicit is not None and explicit.null_count < n:
        has_given = valid_mask(explicit)
        given = explicit.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        sticky &= ~has_given
    # Null keys: sticky runs, reproducible on a retry (the rows and their order are).
    target = runs.next_runs(sticky, sizes) % counts
    if hashed is not None:
        target = np.where(has_key, hashed, target)
    if given is not None:
        target = np.where(has_given, given, target)
    return target.astype(np.int32)


def record_bytes(values: pa.Array, header_bytes: np.ndarray | None) -> np.ndarray:
    """Every row's bytes as :class:`ByteRuns` counts them: its value's (null: 0) plus its
    headers' (``header_bytes``, from :func:`headers_bytes`)."""
    sizes = pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False)
    sizes = sizes.astype(np.int64)
    return sizes if header_bytes is None else sizes + header_bytes


def headers_bytes(headers: pa.Array) -> np.ndarray:
    """Per row of a ``list<struct<key: string, value: binary>>`` column: the bytes of its
    headers' names and values (null: 0), vectorised over the list's children."""
    n = len(headers)
    flat = pc.list_flatten(headers)
    if not len(flat):
        return np.zeros(n, dtype=np.int64)
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    size = np.zeros(len(flat), dtype=np.int64)
    for name in ("key", "value"):
        field = pc.struct_field(flat, name)
        size += pc.binary_length(field).fill_null(0).to_numpy(zero_copy_only=False)
    return np.bincount(parents, weights=size, minlength=n).astype(np.int64)


def valid_mask(arr: Any) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool)
