"""PostgreSQL binary COPY rendering (connectors.jdbc.pgbinary), checked against an
independent decoder of the format written from PostgreSQL's documentation."""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any

import pyarrow as pa
import pytest

from connectors.jdbc import pgbinary as pb

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
STRUCT = {">i2": ">h", ">i4": ">i", ">i8": ">q", ">f4": ">f", ">f8": ">d"}


def decode(data: bytes, kinds: list[str]) -> list[tuple[Any, ...]]:
    """Tuples of a binary COPY body (no header/trailer); values decoded per kind."""
    rows, pos = [], 0
    while pos < len(data):
        (count,) = struct.unpack_from(">h", data, pos)
        pos += 2
        assert count == len(kinds)
        row: list[Any] = []
        for kind in kinds:
            (length,) = struct.unpack_from(">i", data, pos)
            pos += 4
            if length == -1:
                row.append(None)
                continue
            raw = data[pos:pos + length]
            pos += length
            if kind in STRUCT:
                assert length == struct.calcsize(STRUCT[kind])
                row.append(struct.unpack(STRUCT[kind], raw)[0])
            elif kind == "bool":
                assert length == 1
                row.append(raw == b"\x01")
            elif kind == "text":
                row.append(raw.decode())
            elif kind == "bytes":
                row.append(raw)
            elif kind == "date":
                row.append(dt.date(2000, 1, 1) + dt.timedelta(days=struct.unpack(">i", raw)[0]))
            elif kind == "ts":
                row.append(PG_EPOCH + dt.timedelta(microseconds=struct.unpack(">q", raw)[0]))
            else:
                raise AssertionError(kind)
        rows.append(tuple(row))
    return rows


def render(columns: list[pa.Array], kinds: list[str], tags: Any = ()) -> bytes:
    return b"".join(bytes(b) for b in pb.encode(columns, kinds, tags))


def test_all_kinds_with_nulls_round_trip() -> None:
    ts = [dt.datetime(2024, 2, 29, 12, 30, 1, 123456, tzinfo=dt.timezone.utc), None,
          dt.datetime(1969, 7, 20, 20, 17, tzinfo=dt.timezone.utc)]
    cols = [
        pa.array([1, None, -(2 ** 63)], pa.int64()),
        pa.array([7, 8, None], pa.int32()),
        pa.array([1.5, float("inf"), None], pa.float64()),
        pa.array([0.25, None, -2.0], pa.float32()),
        pa.array([True, False, None]),
        pa.array(["a", "", None]),
        pa.array([b"\x00\xff", None, b""], pa.binary()),
        pa.array([dt.date(2000, 1, 1), dt.date(1999, 12, 31), None], pa.date32()),
        pa.array(ts, pa.timestamp("us", tz="UTC")),
        pa.nulls(3),
    ]
    kinds = [">i8", ">i4", ">f8", ">f4", "bool", "text", "bytes", "date", "ts", "null"]
    rows = decode(render(cols, kinds), kinds)
    assert rows == [
        (1, 7, 1.5, 0.25, True, "a", b"\x00\xff", dt.date(2000, 1, 1), ts[0], None),
        (None, 8, float("inf"), None, False, "", None, dt.date(1999, 12, 31), None, None),
        (-(2 ** 63), None, None, -2.0, None, None, b"", None, ts[2], None),
    ]


def test_tags_lead_each_row_and_widen_integers() -> None:
    cols = [pa.array([1, 2], pa.int8()), pa.array(["x", "yz"], pa.large_string())]
    kinds = [">i8", "text"]
    tags = [(">i8", 5), (">i4", 1), (">i8", 2 ** 61)]
    rows = decode(render(cols, kinds, tags), [">i8", ">i4", ">i8", *kinds])
    assert rows == [(5, 1, 2 ** 61, 1, "x"), (5, 1, 2 ** 61, 2, "yz")]


def test_sliced_arrays_use_their_offsets() -> None:
    batch = pa.record_batch({"i": pa.array(range(10), pa.int64()),
                             "s": pa.array([f"v{i}" if i % 3 else None for i in range(10)]),
                             "d": pa.array([i / 2 if i % 4 else None for i in range(10)])})
    part = batch.slice(3, 5)
    kinds = [">i8", "text", ">f8"]
    rows = decode(render(part.columns, kinds), kinds)
    assert rows == [tuple(r.values()) for r in part.to_pylist()]


def test_integer_overflow_raises_instead_of_wrapping() -> None:
    with pytest.raises(pa.ArrowInvalid):
        pb.encode([pa.array([2 ** 40], pa.int64())], [">i4"])
    with pytest.raises(pa.ArrowInvalid):
        pb.encode([pa.array([2 ** 63], pa.uint64())], [">i8"])


def test_booleans_into_integer_columns() -> None:
    kinds = [">i2"]
    assert decode(render([pa.array([True, None, False])], kinds), kinds) == [(1,), (None,), (0,)]


def test_large_batches_are_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pb, "_MAX_ROWS", 4)
    cols = [pa.array(range(10), pa.int64()), pa.array([str(i) for i in range(10)])]
    parts = pb.encode(cols, [">i8", "text"])
    assert len(parts) > 1
    rows = decode(b"".join(bytes(p) for p in parts), [">i8", "text"])
    assert rows == [(i, str(i)) for i in range(10)]


@pytest.mark.parametrize(("arrow_type", "oid", "kind"), [
    (pa.int32(), pb.INT8, ">i8"),
    (pa.bool_(), pb.INT4, ">i4"),
    (pa.float64(), pb.FLOAT8, ">f8"),
    (pa.string(), pb.VARCHAR, "text"),
    (pa.timestamp("us", tz="UTC"), pb.TIMESTAMPTZ, "ts"),
    (pa.timestamp("us"), pb.TIMESTAMP, "ts"),
    (pa.date32(), pb.DATE, "date"),
    (pa.null(), 1700, "null"),
])
def test_supported_pairs(arrow_type: pa.DataType, oid: int, kind: str) -> None:
    assert pb.field_kind(arrow_type, oid) == kind


@pytest.mark.parametrize(("arrow_type", "oid"), [
    (pa.float32(), pb.FLOAT8),  # text path stores the shortest decimal, not the float32 value
    (pa.float64(), pb.FLOAT4),
    (pa.int64(), pb.TEXT),
    (pa.float64(), pb.INT8),
    (pa.timestamp("us"), pb.TIMESTAMPTZ),  # zone-less: the session TimeZone would apply
    (pa.timestamp("ns", tz="UTC"), pb.TIMESTAMPTZ),
    (pa.decimal128(10, 2), 1700),  # numeric
    (pa.string(), 114),  # json
])
def test_unsupported_pairs_fall_back_to_text(arrow_type: pa.DataType, oid: int) -> None:
    assert pb.field_kind(arrow_type, oid) is None
    schema = pa.schema([("a", arrow_type)])
    assert pb.kinds_for(schema, ["a"], [oid]) is None
