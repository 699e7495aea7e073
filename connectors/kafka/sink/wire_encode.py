"""The record-batch encoder's Python side (``_record_batch``, C): Kafka record batches built
straight from Arrow buffers, for the sink's wire path (:mod:`connectors.kafka.sink.wire`),
and the CRC-32C record batches carry. The requests that send them are the wire client's
(:mod:`connectors.kafka.wire`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.kafka.common import FAMILY

try:  # built at install time where a C compiler is (setup.py)
    from connectors.kafka.sink import _record_batch  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _record_batch = None

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
        raise KafkaSinkError(f"{FAMILY}: the _record_batch extension is not built (internal)")
    return int(_record_batch.crc32c(data))


def encoder_built() -> bool:
    """Whether the record-batch encoder (the C extension) is built here."""
    return _record_batch is not None



def column(arr: pa.Array | None) -> tuple[Any, ...] | None:
    """An Arrow binary column as ``_record_batch.encode`` and ``hash64`` take it."""
    if arr is None:
        return None
    validity, offsets, data = arr.buffers()[:3]
    large = pa.types.is_large_binary(arr.type)
    return (offsets, data, validity if arr.null_count else None, arr.offset, large)


def encode(values: pa.Array, keys: pa.Array | None, order: np.ndarray, parts: np.ndarray,
           seqs: np.ndarray, producer_id: int, epoch: int, max_batch_bytes: int, *,
           transactional: bool = True, header: tuple[str, bytes] | None = None,
           seq_base: int = 0) -> tuple[bytearray, np.ndarray, np.ndarray]:
    """The rows ``order`` (grouped by partition, ``parts[order]`` ascending) as record
    batches: ``(data, batches, partitions)``, ``batches`` an ``(n, 4)`` array of (group,
    start, end, records), ``partitions`` each group's partition. ``seqs`` holds each
    partition's next sequence and is advanced. ``header``: (name, value prefix) of a header
    on every record whose value ends in ``seq_base`` + the row index (8 bytes)."""
    if _record_batch is None:
        raise KafkaSinkError(f"{FAMILY}: the _record_batch extension is not built (internal)")
    target = parts[order]
    cut = np.flatnonzero(np.diff(target)) + 1
    starts = np.concatenate(([0], cut, [len(order)])).astype(np.int64)
    partitions = target[starts[:-1]].astype(np.int64)
    first = (seqs[partitions] % (1 << 31)).astype(np.int32)
    name, prefix = header if header is not None else (None, b"")
    data, meta = _record_batch.encode(
        column(values), column(keys), len(values), np.ascontiguousarray(order, np.int64),
        starts, first, int(time.time() * 1000), producer_id, epoch, int(transactional),
        max_batch_bytes, name, prefix, seq_base)
    batches = np.frombuffer(meta, dtype=np.int64).reshape(-1, 4)
    np.add.at(seqs, partitions[batches[:, 0]], batches[:, 3])
    return data, batches, partitions
