"""Null-key runs counted in bytes (connectors/kafka/sink/partitioner.py, ``ByteRuns``): the
same rows route alike however Spark chunks them, a run holds about the budget's bytes, a
retry under a started marker from before byte runs routes in that marker's runs of rows, and
``nullKeyRunBytes`` is checked like every other option."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from connectors.core.errors import OptionError
from connectors.core.sink import TaskInfo
from connectors.kafka.sink import KafkaSink, partitioner, recovery
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.partitioner import ByteRuns, RowRuns
from connectors.kafka.sink.rows import route, shape
from connectors.kafka.sink.sink import writer_for

HDR = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
PARTITIONS = 7


def _table(n: int, seed: int = 5) -> pa.Table:
    """Null, empty and set keys and values, some explicit partitions, headers of every shape,
    sliced so the offsets do not start at 0."""
    rnd = random.Random(seed)
    m = n + 13
    keys = [None if rnd.random() < 0.6 else rnd.randbytes(rnd.randrange(0, 6)) for _ in range(m)]
    values = [None if rnd.random() < 0.05 else rnd.randbytes(rnd.randrange(0, 300))
              for _ in range(m)]
    parts = [rnd.randrange(PARTITIONS) if rnd.random() < 0.1 else None for _ in range(m)]
    headers = [None if rnd.random() < 0.5 else
               [{"key": None if rnd.random() < 0.1 else "h" * rnd.randrange(0, 4),
                 "value": None if rnd.random() < 0.2 else rnd.randbytes(rnd.randrange(0, 50))}
                for _ in range(rnd.randrange(0, 3))] for _ in range(m)]
    return pa.table({"key": pa.array(keys, pa.binary()),
                     "value": pa.array(values, pa.large_binary()),
                     "partition": pa.array(parts, pa.int32()),
                     "headers": pa.array(headers, HDR)}).slice(13)


def _expected(table: pa.Table, start: int, budget: int) -> list[int]:
    """The rule, row by row: a null-key row without a partition goes to run
    ``(bytes of such rows before it) // budget``; a row's bytes are its value's and its
    headers' names' and values'."""
    out, before = [], 0
    for row in table.to_pylist():
        if row["partition"] is not None:
            out.append(row["partition"])
        elif row["key"] is not None:
            out.append(partitioner.key_partition(row["key"], PARTITIONS))
        else:
            out.append((start + before // budget) % PARTITIONS)
            before += len(row["value"] or b"") + sum(
                len((h["key"] or "").encode()) + len(h["value"] or b"")
                for h in row["headers"] or ())
    return out


def _route_chunks(chunks: list[pa.Table], runs: partitioner.NullKeyRuns) -> list[int]:
    parts: list[int] = []
    for chunk in chunks:
        if chunk.num_rows:
            parts += route(shape(chunk, "t", "s"), {"t": PARTITIONS}, "s", runs).parts.tolist()
    return parts


def test_a_row_goes_where_the_bytes_before_it_say():
    table = _table(3000)
    start = partitioner.null_key_start(3, 2)
    parts = _route_chunks([table], ByteRuns(start, 4000))
    assert parts == _expected(table, start, 4000)
    assert len(set(parts)) == PARTITIONS  # many runs: the rule is exercised across them


def test_the_same_rows_route_alike_in_any_chunking():
    """Spark hands a task's rows over in Arrow batches of any size, and the transactional
    paths route batch by batch: the runs carry their bytes from one to the next."""
    table = _table(3000)
    start = partitioner.null_key_start(8, 0)
    whole = _route_chunks([table], ByteRuns(start, 2500))
    rnd = random.Random(11)
    for _ in range(6):
        cuts = sorted(rnd.sample(range(1, table.num_rows), rnd.randrange(1, 40)))
        bounds = [0, *cuts, cuts[-1], table.num_rows]  # an empty chunk, too
        chunks = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
        assert _route_chunks(chunks, ByteRuns(start, 2500)) == whole
    batches = [pa.Table.from_batches([b]) for b in table.to_batches(max_chunksize=1)]
    assert _route_chunks(batches, ByteRuns(start, 2500)) == whole


def test_the_old_runs_of_rows_carry_across_chunks_too():
    table = _table(2500)
    whole = _route_chunks([table], RowRuns(4, 300))
    chunks = [table.slice(i, 170) for i in range(0, table.num_rows, 170)]
    assert _route_chunks(chunks, RowRuns(4, 300)) == whole
    sticky = [i for i, row in enumerate(table.to_pylist())
              if row["key"] is None and row["partition"] is None]
    assert all(whole[i] == (4 + i // 300) % PARTITIONS for i in sticky)  # by seq, as before


def test_10_kb_records_make_runs_of_a_thousandth_of_the_rows_of_100_byte_ones():
    """The issue's case: in rows, 10 KB records made runs of 1 GB; in bytes, the default
    budget is 1,000 of them, and still 100,000 records of 100 bytes (the runs measured)."""
    budget = KafkaSinkOptions.create(sink_id="s", wal_path="/tmp/w",
                                     bootstrap_servers="h:1").null_key_run_bytes
    assert budget == partitioner.NULL_KEY_RUN_BYTES == 100 * partitioner.NULL_KEY_RUN
    big = pa.table({"value": pa.array([b"x" * 10_000] * 2_500, pa.binary())})
    parts = _route_chunks([big.slice(0, 1_234), big.slice(1_234)], ByteRuns(0, budget))
    assert Counter(parts) == {0: 1_000, 1: 1_000, 2: 500}
    assert parts == sorted(parts)  # consecutive runs, in seq order
    runs = ByteRuns(0, budget).next_runs(np.ones(250_000, bool), lambda: np.full(250_000, 100))
    assert Counter(runs.tolist()) == {0: 100_000, 1: 100_000, 2: 50_000}


def test_a_record_larger_than_the_budget_is_a_run_of_its_own():
    sizes = np.array([10, 35, 10, 10])
    runs = ByteRuns(0, 10).next_runs(np.ones(4, bool), lambda: sizes)
    assert runs.tolist() == [0, 1, 4, 5]


def test_keyed_rows_count_no_bytes_and_a_chunk_without_null_keys_moves_nothing():
    runs = ByteRuns(0, 100)
    sticky = np.array([True, False, True, False])
    assert runs.next_runs(sticky, lambda: np.array([60, 1000, 60, 1000])).tolist() == \
        [0, 0, 0, 1]  # the keyed rows' figures are not theirs to count
    assert runs.before == 120
    assert runs.next_runs(np.zeros(3, bool), lambda: pytest.fail("no sizes needed")).tolist() \
        == [1, 1, 1]
    assert runs.before == 120


def test_header_bytes_are_counted_from_the_arrow_column():
    table = _table(500)
    column = table.column("headers").combine_chunks()
    want = [sum(len((h["key"] or "").encode()) + len(h["value"] or b"") for h in row or ())
            for row in column.to_pylist()]
    assert partitioner.headers_bytes(column).tolist() == want
    assert partitioner.headers_bytes(pa.array([None, []], HDR)).tolist() == [0, 0]
    rows = shape(table, "t", "s")
    values = [len(v or b"") for v in table.column("value").to_pylist()]
    assert rows.record_bytes().tolist() == [a + b for a, b in zip(values, want, strict=True)]


def _write_raw_marker(sink: KafkaSink, batch: int, **run: int) -> None:
    """A started marker as the release before byte runs wrote it: ``null_key_run`` (its run
    in rows), or, before that, no run at all."""
    state = sink._state()
    markers = recovery.MarkerStore(state.storage, state.root, state)
    record = json.loads(recovery.StartedMarker("s", batch, 0, {"t": 4}, {"t": {"0": 0}})
                        .to_json())
    del record["null_key_run_bytes"]
    record.update(run)
    state.storage.write_atomic(markers.path(batch, 0), json.dumps(record).encode())


@pytest.mark.parametrize(("marker", "rows_per_run"),
                         [({"null_key_run": 700}, 700), ({}, partitioner.LEGACY_NULL_KEY_RUN)])
def test_a_retry_under_a_marker_from_before_byte_runs_routes_by_rows(tmp_path, marker,
                                                                     rows_per_run):
    sink = KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", topic="t",
                     null_key_run_bytes=1_000)
    _write_raw_marker(sink, 4, **marker)
    writer = writer_for(sink.options, sink._state(), TaskInfo(4, 0, attempt=1))
    writer.row_order()  # reads the marker
    runs = writer.null_key_runs()
    assert isinstance(runs, RowRuns) and runs.rows == rows_per_run
    table = pa.table({"value": pa.array([b"v" * 100] * 3_000, pa.binary())})
    parts = route(shape(table, "t", "s"), {"t": 4}, "s", runs).parts.tolist()
    start = partitioner.null_key_start(4, 0)
    assert parts == [(start + seq // rows_per_run) % 4 for seq in range(3_000)]


def test_a_first_attempt_routes_by_the_option_and_its_retry_by_its_marker(tmp_path):
    sink = KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", topic="t",
                     null_key_run_bytes=1_000)
    first = writer_for(sink.options, sink._state(), TaskInfo(5, 0))
    first.row_order()
    runs = first.null_key_runs()
    assert isinstance(runs, ByteRuns) and runs.budget == 1_000
    # The option changed before the retry: the retry routes as its first attempt did.
    state = sink._state()
    recovery.MarkerStore(state.storage, state.root, state).put(recovery.StartedMarker(
        "s", 5, 0, {"t": 4}, {"t": {"0": 0}}, null_key_run_bytes=1_000))
    changed = KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", topic="t",
                        null_key_run_bytes=50_000)
    retry = writer_for(changed.options, changed._state(), TaskInfo(5, 0, attempt=1))
    retry.row_order()
    again = retry.null_key_runs()
    assert isinstance(again, ByteRuns) and (again.start, again.budget) == (runs.start, 1_000)


BASE = {"sink_id": "s1", "walPath": "/tmp/eo-wal", "kafka.bootstrap.servers": "h:9092",
        "topic": "b"}


def test_the_option_through_spark_and_python():
    spark = {k.lower(): v for k, v in {**BASE, "nullKeyRunBytes": "1000000"}.items()}
    assert KafkaSinkOptions.from_options(spark).null_key_run_bytes == 1_000_000
    assert KafkaSinkOptions.create(sink_id="s", wal_path="/tmp/w", bootstrap_servers="h:1",
                                   null_key_run_bytes="2000").null_key_run_bytes == 2000


@pytest.mark.parametrize("value", ["0", "-5", "10MB", "1.5", ""])
def test_a_bad_spark_value_is_refused_naming_the_option(value):
    spark = {k.lower(): v for k, v in {**BASE, "nullKeyRunBytes": value}.items()}
    if value == "":  # an empty option is an option not set
        assert KafkaSinkOptions.from_options(spark).null_key_run_bytes == \
            partitioner.NULL_KEY_RUN_BYTES
        return
    with pytest.raises(OptionError, match="'nullKeyRunBytes'") as e:
        KafkaSinkOptions.from_options(spark)
    assert "integer" in str(e.value) or ">= 1" in str(e.value)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "ten", [1]])
def test_a_bad_python_value_is_refused_naming_the_argument(tmp_path, value):
    with pytest.raises(OptionError, match="'null_key_run_bytes'"):
        KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", topic="t",
                  null_key_run_bytes=value)
