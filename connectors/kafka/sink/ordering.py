"""The deterministic order of a task's rows, which the recovery-key mode numbers
(docs/design.md, "Row order").

Spark does not promise the order of rows inside a partition after a shuffle, so a replay
could number the same rows differently. The order must be a function of the rows alone;
rows that are equal in every column may come in any order among themselves.

Two orders exist; the started marker records which one a task's first attempt used, and a
retry uses the same (``StartedMarker.order``):

- :data:`HASHED` (the default): by a 64-bit hash of each row's columns, rows whose hashes are
  equal then by their columns (as :data:`SORTED`). A hash and an integer sort cost about
  half a sort of the binary columns: 500,000 rows of 100 bytes in 30-45 ms against 60-115.
  The hash is ``_record_batch.hash64`` (C) or, without the extension, the same function in
  numpy (:func:`hash_column_numpy`): a retry on another worker numbers rows the same way
  either way.
- :data:`SORTED`: by (key, value, topic, partition, headers), nulls first; the order of
  markers written before the hashed order existed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.kafka.sink.partitioner import binary_buffers, valid_mask
from connectors.kafka.wire import record_batch

HASHED = "hash64"
SORTED = "sorted"
ORDERS = (HASHED, SORTED)


def default() -> str:
    """The order a first attempt numbers its rows in: :data:`HASHED` where the C extension
    is built (its numpy twin is for retries: about 3 s per million rows of 100 bytes)."""
    return HASHED if record_batch.encoder_built() else SORTED


_K = np.uint64(0x9E3779B97F4A7C15)
_HEADERS_KEY = "__eo_headers_key"


def deterministic_order(table: pa.Table, order: str = HASHED) -> pa.Table:
    """``table``'s rows in the deterministic ``order`` (one chunk)."""
    # One chunk first: take() with scattered indices over a chunked table resolves the
    # chunk of every index (measured: 225 ms for 500,000 rows in Spark's 50 Arrow batches,
    # against 5 ms to combine and take).
    table = table.combine_chunks()
    return table.take(permutation(table, order))


def permutation(table: pa.Table, order: str = HASHED) -> np.ndarray:
    """The rows of a one-chunk ``table`` in the deterministic ``order``."""
    if order not in ORDERS:
        raise ValueError(f"unknown row order {order!r} (known: {ORDERS})")
    work, cols = sort_columns(table)
    if table.num_rows <= 1 or not cols:
        return np.arange(table.num_rows)
    return hashed(work, cols) if order == HASHED else sort_indices(work, cols)


def sort_columns(table: pa.Table) -> tuple[pa.Table, list[str]]:
    """The columns that order rows, in tie-break order, and the table with a binary
    column for the headers (when any row has headers)."""
    cols = [name for name in ("key", "value", "topic", "partition")
            if name in table.column_names and not pa.types.is_null(table.schema.field(name).type)]
    if "headers" in table.column_names and table.column("headers").null_count < table.num_rows:
        table = table.append_column(_HEADERS_KEY, headers_sort_key(table.column("headers")))
        cols.append(_HEADERS_KEY)
    return table, cols


def sort_indices(table: pa.Table, cols: list[str]) -> np.ndarray:
    """The :data:`SORTED` order: ascending by ``cols``, nulls first."""
    try:  # pyarrow >= 25 takes the null placement per key
        order = pc.sort_indices(table, sort_keys=[(c, "ascending", "at_start") for c in cols])
    except (TypeError, ValueError):
        order = pc.sort_indices(
            table, sort_keys=[(c, "ascending") for c in cols], null_placement="at_start"
        )
    return order.to_numpy()


def hashed(table: pa.Table, cols: list[str]) -> np.ndarray:
    """The :data:`HASHED` order of a one-chunk table: by row hash, equal hashes by ``cols``."""
    h = row_hashes(table, cols)
    perm = np.argsort(h)
    ordered = h[perm]
    tied = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(tied):
        # Rows of equal hash are neighbours in perm; sorting just them by (hash, columns)
        # puts each run in its place (runs keep their hash order).
        at = np.union1d(tied, tied + 1)
        rows = perm[at]
        sub = table.select(cols).take(rows).append_column("__eo_hash", pa.array(ordered[at]))
        perm[at] = rows[sort_indices(sub, ["__eo_hash", *cols])]
    return perm


def row_hashes(table: pa.Table, cols: list[str]) -> np.ndarray:
    """A uint64 per row of a one-chunk table (at least one row), mixed from ``cols`` in
    that order."""
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for name in cols:
        arr = table.column(name).chunk(0)
        t = arr.type
        if pa.types.is_integer(t):
            values = np.where(valid_mask(arr), arr.fill_null(0).to_numpy(zero_copy_only=False), -1)
            with np.errstate(over="ignore"):
                h = _finalise((_rotl(h) ^ values.astype(np.int64).view(np.uint64)) * _K)
            continue
        if pa.types.is_string(t):
            arr = arr.cast(pa.binary())
        elif pa.types.is_large_string(t):
            arr = arr.cast(pa.large_binary())
        hash_column(arr, h)
    return h


def hash_column(arr: pa.Array, out: np.ndarray) -> None:
    """Mix every row of a binary array into ``out`` (``_record_batch.hash64``, or its numpy
    twin where the C part is not built)."""
    if not record_batch.hash_column(arr, out):
        hash_column_numpy(arr, out)


def hash_column_numpy(arr: pa.Array, out: np.ndarray) -> None:
    """``_record_batch.hash64`` in numpy (no C extension here): the same bits."""
    offsets, data = binary_buffers(arr)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    valid = valid_mask(arr)
    size = np.where(valid, lengths, -1)
    with np.errstate(over="ignore"):
        h = out ^ ((size + 1).astype(np.uint64) * _K)
        padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
        longest = int(size.max()) if len(size) else 0
        for word in range(0, longest, 8):
            rows = np.flatnonzero(size > word)
            at = starts[rows] + word
            left = size[rows] - word
            w = np.zeros(len(rows), dtype=np.uint64)
            for b in range(8):
                byte = padded[at + b].astype(np.uint64)
                w |= np.where(left > b, byte, 0).astype(np.uint64) << np.uint64(8 * b)
            h[rows] = (_rotl(h[rows]) ^ w) * _K
        out[:] = _finalise(h)


def _rotl(h: np.ndarray) -> np.ndarray:
    return (h << np.uint64(27)) | (h >> np.uint64(37))


def _finalise(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def headers_sort_key(headers: pa.ChunkedArray) -> pa.Array:
    """A binary column that orders rows by their headers (tie-break after key and value)."""
    out: list[bytes | None] = []
    for h in headers.to_pylist():
        if h is None:
            out.append(None)
            continue
        parts = []
        for item in h:
            k = (item.get("key") or "").encode()
            v = item.get("value") or b""
            parts.append(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
        out.append(b"".join(parts))
    return pa.array(out, pa.binary())
