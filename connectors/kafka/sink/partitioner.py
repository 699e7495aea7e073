"""Deterministic routing for the exactly-once Kafka sink (docs/design.md, "Kafka sink:
recovery keys", the paragraph on routing).

The sink computes every record's target partition itself and passes it to ``produce()``,
so a retried row lands in the same partition as its first attempt. That is what makes the
recovery rule "max seq seen in partition p" meaningful:

- an explicit ``partition`` column is used as given;
- a key is hashed with murmur2 exactly like the Java client's default partitioner
  (``Utils.toPositive(Utils.murmur2(key)) % numPartitions``), so keyed records land where
  Spark's own Kafka sink (and any Java producer) would put them;
- null keys go in runs of :data:`NULL_KEY_RUN` consecutive seqs to one partition, the
  task's runs to consecutive partitions from a start that depends on (batch, writer):
  ``(start + seq // NULL_KEY_RUN) % numPartitions``. Sticky like the Java client's default
  for null keys (KIP-480), so a task touches few partitions and sends few, full produce
  requests (librdkafka sends one request per partition: a task spreading 10,000 rows over
  1,000 partitions one row at a time sent 1,000 requests of 10 rows), and reproducible on
  a retry, which librdkafka's random choice is not.

murmur2 runs vectorised over an Arrow binary column with numpy (keys grouped by length,
4-byte blocks mixed column-wise), because a per-row Python hash would cost more than the
``produce()`` call itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Consecutive null-key rows that go to one partition. Every partition a write touches
#: costs the brokers more than its records do (a transaction's commit marker, a producer
#: state entry, replica fetch work per partition): runs of 1,000 rows into a 1,000-partition
#: topic on one broker made 1.06-1.13x Spark's sink, runs of 10,000 (librdkafka's largest
#: batch by count) 1.56x; on the 3-node cluster (replication 3), runs of 10,000 left a
#: 1,000,000-row write at 2.2 broker CPU-seconds and 460-600k rows/s, runs of 100,000 at 1.4
#: CPU-seconds and 780-970k rows/s against Spark's sink's 446-460k (docs/kafka-sink.md, "Into
#: 1,000 partitions"). A run is about 10 MB of 100-byte records: ten full record batches,
#: sent pipelined. Over many batches the runs still spread evenly (each batch and writer
#: starts elsewhere); within one they are coarser than the Java client's sticky partitioner.
NULL_KEY_RUN = 100_000
#: The run of started markers written before the run was recorded in them: a retry routes
#: its rows as its first attempt did.
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


def route(
    keys: pa.Array | None,
    explicit: pa.Array | None,
    seqs: np.ndarray,
    num_partitions: np.ndarray,
    start: int = 0,
    run: int = NULL_KEY_RUN,
) -> np.ndarray:
    """Target partition of every row (int32), in the row order of ``seqs``.

    ``num_partitions`` holds, per row, the partition count of that row's topic. Explicit
    partitions win, then murmur2 of the key, then runs of ``run`` seqs (default
    :data:`NULL_KEY_RUN`) from ``start`` (:func:`null_key_start`) for null keys.
    """
    n = len(seqs)
    counts = num_partitions.astype(np.int64)
    # Null keys: sticky runs by seq, reproducible on a retry (seq is deterministic).
    target = (start + seqs.astype(np.int64) // run) % counts
    if keys is not None and keys.null_count < n:
        hashed = (murmur2_array(keys).astype(np.int64) & 0x7FFFFFFF) % counts
        has_key = valid_mask(keys)
        target = np.where(has_key, hashed, target)
    if explicit is not None and explicit.null_count < n:
        given = explicit.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        target = np.where(valid_mask(explicit), given, target)
    return target.astype(np.int32)


def valid_mask(arr: Any) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool)
