"""Kafka record batches built straight from Arrow buffers (``_record_batch``, C), the CRC-32C
they carry, and the same C part's 64-bit row hash, which the Kafka sink's recovery-key mode
orders rows by (:func:`hash_column`). The producer (:mod:`connectors.kafka.wire.producer`)
gives each batch its sequence; :mod:`connectors.kafka.wire.sender` sends them.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.kafka.wire.protocol import WireError

try:  # built at install time where a C compiler is (setup.py)
    from connectors.kafka.wire import _record_batch  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _record_batch = None

NOT_BUILT = "the _record_batch extension is not built (no C compiler at install time)"

#: The largest Produce request, summed over its batches (the broker takes up to
#: ``socket.request.max.bytes``, 100 MiB by default).
MAX_REQUEST_BYTES = 16 << 20
#: Rows are encoded and sent in chunks of about this many bytes of keys and values: big
#: enough that each of 1,000 partitions gets a batch of a hundred records or more, small
#: enough that a task holds two chunks at most.
CHUNK_BYTES = 32 << 20


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as record batches carry it."""
    if _record_batch is None:
        raise WireError(f"{NOT_BUILT} (internal)", -1)
    return int(_record_batch.crc32c(data))


def encoder_built() -> bool:
    """Whether the record-batch encoder (the C extension) is built here."""
    return _record_batch is not None


def hash_column(arr: pa.Array, out: np.ndarray) -> bool:
    """Mix every row of the binary array ``arr`` into ``out`` (uint64, one per row) with the
    C part's 64-bit hash; False, touching nothing, where it is not built (the caller then
    runs the same function in numpy)."""
    if _record_batch is None:
        return False
    _record_batch.hash64(column(arr), len(arr), out)
    return True


def column(arr: pa.Array | None) -> tuple[Any, ...] | None:
    """An Arrow binary column as ``_record_batch.encode`` and ``hash64`` take it."""
    if arr is None:
        return None
    validity, offsets, data = arr.buffers()[:3]
    large = pa.types.is_large_binary(arr.type)
    return (offsets, data, validity if arr.null_count else None, arr.offset, large)


#: Where a record batch's header holds its base sequence (v2 record batch: base offset 8,
#: length 4, leader epoch 4, magic 1, CRC 4, attributes 2, last offset delta 4, two
#: timestamps 16, producer id 8, epoch 2).
BASE_SEQUENCE_AT = 53


def base_sequence(data: bytes | bytearray | memoryview, start: int = 0) -> int:
    """The base sequence written in the record batch at ``start``."""
    return int(struct.unpack_from(">i", data, start + BASE_SEQUENCE_AT)[0])


def encode(values: pa.Array, keys: pa.Array | None, order: np.ndarray, parts: np.ndarray,
           first: np.ndarray, producer_id: int, epoch: int, max_batch_bytes: int, *,
           transactional: bool = True, header: tuple[str, bytes] | None = None,
           seq_base: int = 0) -> tuple[bytearray, np.ndarray, np.ndarray]:
    """The rows ``order`` (grouped by partition, ``parts[order]`` ascending) as record
    batches: ``(data, batches, partitions)``, ``batches`` an ``(n, 4)`` array of (group,
    start, end, records) in order, ``partitions`` each group's partition; a partition's rows
    over ``max_batch_bytes`` are split into several batches, in order. ``first[p]``:
    partition ``p``'s next sequence, its first batch's base sequence; its later batches go
    on from it (nothing is advanced here: the producer spends the sequences). ``header``:
    (name, value prefix) of a header on every record whose value ends in ``seq_base`` + the
    row index (8 bytes)."""
    if _record_batch is None:
        raise WireError(f"{NOT_BUILT} (internal)", -1)
    target = parts[order]
    cut = np.flatnonzero(np.diff(target)) + 1
    starts = np.concatenate(([0], cut, [len(order)])).astype(np.int64)
    partitions = target[starts[:-1]].astype(np.int64)
    name, prefix = header if header is not None else (None, b"")
    data, meta = _record_batch.encode(
        column(values), column(keys), len(values), np.ascontiguousarray(order, np.int64),
        starts, (np.asarray(first, np.int64)[partitions] % (1 << 31)).astype(np.int32),
        int(time.time() * 1000), producer_id, epoch, int(transactional), max_batch_bytes,
        name, prefix, seq_base)
    return data, np.frombuffer(meta, dtype=np.int64).reshape(-1, 4), partitions
