"""core/replay.py: a task's rows read again from the first, in memory or spilled to disk."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa

from connectors.core.replay import ReplayableBatches


def source(n: int, pulled: list[int]) -> Iterator[pa.RecordBatch]:
    """``n`` one-column batches of 100 rows; ``pulled`` counts what Spark handed over."""
    for i in range(n):
        pulled.append(i)
        yield pa.record_batch({"v": pa.array(range(i * 100, (i + 1) * 100), pa.int64())})


def values(batches: object) -> list[int]:
    return [v for b in batches for v in b.column("v").to_pylist()]  # type: ignore[attr-defined]


def test_every_pass_reads_from_the_first_row_and_spark_is_read_once() -> None:
    pulled: list[int] = []
    with ReplayableBatches(source(5, pulled)) as rows:
        first = iter(rows)
        partial = [next(first), next(first)]  # an attempt that failed after two batches
        assert values(partial) == list(range(200))
        assert values(rows) == list(range(500))  # the retry: recorded, then the rest
        assert values(rows) == list(range(500))  # and again
        assert pulled == [0, 1, 2, 3, 4] and not rows.spilled


def test_batches_past_the_memory_limit_spill_to_disk_and_read_back_exactly() -> None:
    pulled: list[int] = []
    rows = ReplayableBatches(source(6, pulled), memory_limit=2000)  # two batches of 800 B
    first = iter(rows)
    assert values([next(first) for _ in range(4)]) == list(range(400))
    assert rows.spilled
    spill_dir = rows._dir
    assert spill_dir is not None and os.listdir(spill_dir)
    assert values(rows) == list(range(600))
    assert values(rows) == list(range(600))
    assert pulled == list(range(6))
    rows.close()
    assert not os.path.exists(spill_dir)


def test_an_empty_source_replays_as_empty() -> None:
    with ReplayableBatches(iter([])) as rows:
        assert list(rows) == [] and list(rows) == []
