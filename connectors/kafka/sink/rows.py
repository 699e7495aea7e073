"""Row shaping and routing for the exactly-once Kafka sink (docs/design.md, "Kafka
sink: recovery keys").

One task's Arrow batches become :class:`Rows` (columns ready for ``produce()``), numbered by
their position after ``deterministic_order``; :func:`route` gives every row its target
partition (``connectors.kafka.sink.partitioner``) and a small id per target topic-partition for
the vectorised dedupe decision (``connectors.kafka.sink.recovery.decide``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.core.errors import KafkaSinkError
from connectors.kafka.common import FAMILY
from connectors.kafka.sink import partitioner


@dataclass
class Rows:
    """The rows of one task, ready to produce; row ``i`` has seq ``i``."""

    n: int
    value_array: pa.Array  # binary or large_binary
    keys: pa.Array | None
    topics: list[str]  # distinct topic names
    topic_idx: np.ndarray  # per row, index into topics
    explicit: pa.Array | None  # per row partition column (nullable) or None
    headers: list[Any] | None  # per row list of (str, bytes) or None
    #: per row, the bytes of its headers' names and values (None: no headers column)
    header_bytes: np.ndarray | None = None

    @property
    def seqs(self) -> np.ndarray:
        return np.arange(self.n, dtype=np.int64)

    @cached_property
    def values(self) -> list[bytes | None]:
        """The values as Python objects, for ``produce()`` (batch produce reads the Arrow
        buffers instead)."""
        return self.value_array.to_pylist()

    @cached_property
    def key_list(self) -> list[bytes | None]:
        """The keys as Python objects, for ``produce()``."""
        return self.keys.to_pylist() if self.keys is not None else [None] * self.n

    def record_bytes(self) -> np.ndarray:
        """Every row's bytes as null-key runs count them (``partitioner.ByteRuns``)."""
        return partitioner.record_bytes(self.value_array, self.header_bytes)


def shape(table: pa.Table, topic: str | None, sink_id: str) -> Rows:
    """``table``'s columns (``value``, ``key``, ``topic``, ``partition``, ``headers``) as
    ``produce()`` takes them; the ``topic`` option, when set, wins over a column."""
    n = table.num_rows
    names = table.column_names
    values = as_binary(table.column("value"))
    keys = as_binary(table.column("key")) if "key" in names else None
    if keys is not None and keys.null_count == n:
        keys = None
    if topic is not None:
        topics = [topic]
        topic_idx = np.zeros(n, dtype=np.int64)
    else:
        col = table.column("topic")
        if col.null_count:
            raise KafkaSinkError(
                f"{FAMILY} {sink_id}: {col.null_count} rows have a null 'topic' and no "
                "'topic' option is set; give every row a topic or set the option"
            )
        enc = pc.dictionary_encode(col).combine_chunks()
        topics = [str(t) for t in enc.dictionary.to_pylist()]
        topic_idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    explicit = None
    if "partition" in names:
        col = table.column("partition").combine_chunks()
        explicit = col if col.null_count < n else None
    headers = header_bytes = None
    if "headers" in names and table.column("headers").null_count < n:
        column = table.column("headers").combine_chunks()
        headers = [
            [(h["key"], h["value"]) for h in row] if row else None
            for row in column.to_pylist()
        ]
        header_bytes = partitioner.headers_bytes(column)
    return Rows(n, values, keys, topics, topic_idx, explicit, headers, header_bytes)


def picker(order: Sequence[int]) -> Callable[[Sequence[Any]], list[Any]]:
    """``pick(items) -> [items[i] for i in order]``, in C (``operator.itemgetter``)."""
    if len(order) <= 1:
        return lambda items: [items[i] for i in order]
    get = operator.itemgetter(*order)
    return lambda items: list(get(items))


def as_binary(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        # combine_chunks() copies even a single chunk (9 ms per 50 MB)
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.binary() if pa.types.is_string(arr.type) else pa.large_binary())
    if pa.types.is_null(arr.type):
        arr = pa.nulls(len(arr), pa.binary())
    return arr


def check_columns(schema: pa.Schema, topic: str | None) -> None:
    """Driver, before any task: the columns Spark's Kafka sink reads, with their types."""
    names = schema.names
    if "value" not in names:
        raise KafkaSinkError(
            f"{FAMILY}: the DataFrame has no 'value' column (columns: {names}); select "
            "the record payload as 'value' (binary or string), optionally with 'key', "
            "'headers', 'topic' and 'partition'"
        )
    for name in ("key", "value"):
        if name in names:
            t = schema.field(name).type
            if not (
                pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
                or pa.types.is_large_string(t) or pa.types.is_null(t)
            ):
                raise KafkaSinkError(
                    f"{FAMILY}: column '{name}' has type {t}; it must be binary or string "
                    f"(cast it, e.g. to_json(...) or cast({name} as string))"
                )
    if "topic" in names:
        t = schema.field("topic").type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
            raise KafkaSinkError(f"{FAMILY}: column 'topic' has type {t}; it must be string")
    elif topic is None:
        raise KafkaSinkError(
            f"{FAMILY}: no target topic: set option 'topic' or add a 'topic' column"
        )
    if "partition" in names and not pa.types.is_integer(schema.field("partition").type):
        raise KafkaSinkError(
            f"{FAMILY}: column 'partition' has type {schema.field('partition').type}; it "
            "must be an integer"
        )
    if "headers" in names:
        t = schema.field("headers").type
        ok = pa.types.is_list(t) and pa.types.is_struct(t.value_type)
        item = t.value_type if ok else None
        fields = {item.field(i).name for i in range(item.num_fields)} if item else set()
        if not ok or not {"key", "value"} <= fields:
            raise KafkaSinkError(
                f"{FAMILY}: column 'headers' has type {t}; it must be "
                "array<struct<key:string,value:binary>>"
            )


@dataclass
class Routing:
    """Where the rows go: ``parts[i]`` is row i's partition, ``target_ids[i]`` a small id of
    its (topic, partition), ``tp_of`` maps the ids in use back; ``counts`` are the topics'
    partition counts the routing used."""

    counts: dict[str, int]
    parts: np.ndarray
    target_ids: np.ndarray
    tp_of: dict[int, tuple[str, int]]

    @property
    def names(self) -> dict[int, str]:
        return {i: f"{t}[{p}]" for i, (t, p) in self.tp_of.items()}

    def ids(self) -> dict[tuple[str, int], int]:
        return {tp: i for i, tp in self.tp_of.items()}

    def partition_counts(self) -> dict[str, dict[str, int]]:
        """Rows per target ``{topic: {partition: n}}`` (the task report's figure)."""
        per_target = np.bincount(self.target_ids)  # ids are small: no sort
        out: dict[str, dict[str, int]] = {}
        for i in np.flatnonzero(per_target).tolist():
            t, p = self.tp_of[i]
            out.setdefault(t, {})[str(p)] = int(per_target[i])
        return out


def route(rows: Rows, counts: Mapping[str, int], sink_id: str,
          runs: partitioner.NullKeyRuns) -> Routing:
    """Route every row with the topics' partition ``counts`` (``partitioner.route``); null
    keys by ``runs``, which carries the task's earlier chunks: give it the task's tables in
    seq order."""
    per_row_count = np.asarray([counts[t] for t in rows.topics], dtype=np.int64)[rows.topic_idx]
    parts = partitioner.route(rows.keys, rows.explicit, per_row_count, runs, rows.record_bytes)
    _check_explicit(rows, parts, per_row_count, sink_id)
    base = np.concatenate([[0], np.cumsum([counts[t] for t in rows.topics])]).astype(np.int64)
    target_ids = base[rows.topic_idx] + parts
    used = np.flatnonzero(np.bincount(target_ids))  # target ids are small: no sort
    tp_of = {int(i): _tp_of(int(i), rows.topics, base) for i in used}
    return Routing({t: counts[t] for t in rows.topics}, parts, target_ids, tp_of)


def _check_explicit(rows: Rows, parts: np.ndarray, counts: np.ndarray, sink_id: str) -> None:
    bad = (parts < 0) | (parts >= counts)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        raise KafkaSinkError(
            f"{FAMILY} {sink_id}: {int(bad.sum())} rows name a partition that does not "
            f"exist, e.g. partition {int(parts[i])} of topic "
            f"{rows.topics[int(rows.topic_idx[i])]!r}, which has {int(counts[i])} "
            f"partitions (valid: 0..{int(counts[i]) - 1})"
        )


def _tp_of(target_id: int, topics: list[str], base: np.ndarray) -> tuple[str, int]:
    t = int(np.searchsorted(base, target_id, side="right") - 1)
    return topics[t], target_id - int(base[t])
