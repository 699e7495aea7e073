"""The recovery-key mode's row order (connectors/kafka/sink/ordering.py): the hash in C and
in numpy agree bit for bit, equal hashes fall back to the columns, and a retry numbers rows
in the order its started marker names."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from connectors.core.errors import KafkaSinkError
from connectors.core.sink import TaskInfo
from connectors.kafka.sink import KafkaSink, ordering, recovery
from connectors.kafka.sink.sink import writer_for

HDR = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _values(n: int, seed: int = 3) -> list[bytes | None]:
    rnd = random.Random(seed)
    return [None if rnd.random() < 0.1 else rnd.randbytes(rnd.randrange(0, 40))
            for _ in range(n)]


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary()])
def test_the_c_hash_and_its_numpy_twin_agree(kind):
    arr = pa.array(_values(3000), kind).slice(7)  # a slice: offsets start mid-buffer
    seed = np.arange(len(arr), dtype=np.uint64) * np.uint64(0x1234567)
    c, py = seed.copy(), seed.copy()
    ordering.hash_column(arr, c)
    ordering.hash_column_numpy(arr, py)
    assert (c == py).all()


def test_a_null_and_an_empty_value_hash_apart():
    h = np.zeros(2, dtype=np.uint64)
    ordering.hash_column(pa.array([None, b""], pa.binary()), h)
    assert h[0] != h[1]


def test_row_hashes_mix_every_sort_column():
    table = pa.table({"key": [b"k", b"k", b"k", b"k"], "value": [b"v", b"v", b"w", b"v"],
                      "topic": ["t", "t", "t", "u"], "partition": pa.array([0, 1, 0, 0],
                                                                           pa.int32())})
    h = ordering.row_hashes(table, ["key", "value", "topic", "partition"])
    assert len(set(h.tolist())) == 4


def _table(rows: list[dict]) -> pa.Table:
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("headers", HDR)])
    return pa.Table.from_pylist(rows, schema=schema)


def _rows(n: int = 400) -> list[dict]:
    rnd = random.Random(5)
    out = []
    for _ in range(n):
        header = rnd.choice([None, b"a", b"b"])
        out.append({"key": rnd.choice([None, b"k1", b"k2"]), "value": rnd.choice([b"x", b"y"]),
                    "topic": rnd.choice(["t1", "t2"]), "partition": rnd.choice([None, 0, 1]),
                    "headers": None if header is None else [{"key": "h", "value": header}]})
    return out


def test_equal_hashes_fall_back_to_the_columns(monkeypatch):
    """Rows whose hashes collide are ordered by their columns, so the order still depends
    on the rows alone (forced here: a hash with 3 values for 400 rows)."""
    rows = _rows()
    real = ordering.row_hashes
    monkeypatch.setattr(ordering, "row_hashes",
                        lambda table, cols: real(table, cols) % np.uint64(3))
    first = ordering.deterministic_order(_table(rows), ordering.HASHED).to_pylist()
    for seed in range(3):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        again = ordering.deterministic_order(_table(shuffled), ordering.HASHED).to_pylist()
        assert again == first
    assert sorted(map(json.dumps, map(_plain, first))) == sorted(map(json.dumps, map(_plain, rows)))


def _plain(row: dict) -> dict:
    return {k: (v.hex() if isinstance(v, bytes) else
                [(h["key"], h["value"].hex()) for h in v] if isinstance(v, list) else v)
            for k, v in row.items()}


def test_headers_take_part_in_the_order():
    rows = _rows()
    a = ordering.deterministic_order(_table(rows), ordering.HASHED).to_pylist()
    b = ordering.deterministic_order(_table(rows[::-1]), ordering.HASHED).to_pylist()
    assert a == b


def test_an_unknown_order_is_refused():
    with pytest.raises(ValueError, match="unknown row order 'fancy'"):
        ordering.deterministic_order(_table(_rows(3)), "fancy")


def test_the_marker_records_order_and_key_version_and_an_old_marker_means_sorted_v1():
    marker = recovery.StartedMarker("s", 3, 1, {"b": 4}, {"b": {"0": 1}}, order=ordering.HASHED,
                                    key_version=2)
    back = recovery.StartedMarker.from_record(json.loads(marker.to_json()))
    assert (back.order, back.key_version) == (ordering.HASHED, 2)
    old = json.loads(marker.to_json())
    del old["order"], old["key_version"]
    back = recovery.StartedMarker.from_record(old)
    assert (back.order, back.key_version) == (ordering.SORTED, 1)


@pytest.mark.c_extensions
def test_a_retry_numbers_and_keys_rows_as_its_first_attempt_did(tmp_path):
    """The started marker names the row order and the recovery-key version: a retry after
    an upgrade finishes its task in those (the scan must find its first attempt's keys)."""
    sink = KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", topic="t")
    state = sink._state()
    markers = recovery.MarkerStore(state.storage, state.root, state)

    def attempt(batch: int) -> tuple[str | None, int]:
        writer = writer_for(sink.options, state, TaskInfo(batch, 0))
        order = writer.row_order()
        return order, recovery.decode(writer.header_prefix() + bytes(8)).version

    assert attempt(1) == (ordering.default(), recovery.VERSION) == (ordering.HASHED, 2)
    for batch, order, version in ((2, ordering.SORTED, 1), (3, ordering.HASHED, 2)):
        markers.put(recovery.StartedMarker("s", batch, 0, {"t": 4}, {"t": {"0": 0}},
                                           order=order, key_version=version))
        assert attempt(batch) == (order, version)
    markers.put(recovery.StartedMarker("s", 4, 0, {"t": 4}, {"t": {"0": 0}}, order="fancy"))
    with pytest.raises(KafkaSinkError, match="names row order .fancy., which this version"):
        attempt(4)
    markers.put(recovery.StartedMarker("s", 5, 0, {"t": 4}, {"t": {"0": 0}}, key_version=9))
    with pytest.raises(KafkaSinkError, match="names recovery-key version 9"):
        attempt(5)
