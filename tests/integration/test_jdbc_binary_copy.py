"""eo_jdbc on PostgreSQL: binary COPY stores exactly what the CSV path stores, for every
type pair it handles, and anything else still goes through CSV (no Spark needed: the
sink's stage/commit steps are driven directly)."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from connectors.core.sink import TaskInfo
from connectors.jdbc import pgbinary
from connectors.jdbc.sink import JdbcSink

UTC = dt.timezone.utc
DDL = ("c_i2 smallint, c_i4 integer, c_i8 bigint, c_f4 real, c_f8 double precision, "
       "c_b boolean, c_t text, c_v varchar(5), c_by bytea, c_d date, c_ts timestamp, "
       "c_tz timestamptz")
SCHEMA = pa.schema([
    ("c_i2", pa.int16()), ("c_i4", pa.int64()), ("c_i8", pa.int64()), ("c_f4", pa.float32()),
    ("c_f8", pa.float64()), ("c_b", pa.bool_()), ("c_t", pa.string()), ("c_v", pa.string()),
    ("c_by", pa.binary()), ("c_d", pa.date32()), ("c_ts", pa.timestamp("us", tz="UTC")),
    ("c_tz", pa.timestamp("us", tz="UTC")),
])
ROWS: list[dict[str, Any]] = [
    {"c_i2": -32768, "c_i4": 2 ** 31 - 1, "c_i8": -(2 ** 63), "c_f4": 0.5, "c_f8": -1e300,
     "c_b": True, "c_t": "quote \" comma , newline \n tab \t backslash \\ ünï", "c_v": "abcde",
     "c_by": b"\x00\\x\xff", "c_d": dt.date(1, 1, 1),
     "c_ts": dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
     "c_tz": dt.datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=UTC)},
    {k: None for k in SCHEMA.names},
    {"c_i2": 0, "c_i4": 0, "c_i8": 0, "c_f4": float("-inf"), "c_f8": float("inf"), "c_b": False,
     "c_t": "", "c_v": "", "c_by": b"", "c_d": dt.date(9999, 12, 31),
     "c_ts": dt.datetime(1970, 1, 1, tzinfo=UTC), "c_tz": dt.datetime(9999, 12, 31, tzinfo=UTC)},
]


def write(sink: JdbcSink, batch_id: int, batch: pa.RecordBatch) -> None:
    sink.check_schema(batch.schema)
    msgs = [sink.stage(TaskInfo(batch_id, 0), iter([batch.slice(0, 1)])),
            sink.stage(TaskInfo(batch_id, 1), iter([batch.slice(1)]))]
    sink.commit(batch_id, msgs)


def read(dsn: str, table: str, columns: str = "*") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        return conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY c_i8 NULLS LAST, c_b").format(
            sql.SQL(columns), sql.Identifier(table))).fetchall()


def create(dsn: str, table: str, ddl: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (" + ddl + ")").format(sql.Identifier(table)))


def test_binary_copy_stores_what_csv_stores(postgres_dsn: str, postgres_url: str,
                                            pg_table: Callable[[str], str]) -> None:
    binary, text = pg_table("bin"), pg_table("csv")
    for t in (binary, text):
        create(postgres_dsn, t, DDL)
    batch = pa.RecordBatch.from_pylist(ROWS, schema=SCHEMA)

    sink = JdbcSink(postgres_url, binary, f"s_{binary}")
    sink.check_schema(batch.schema)
    layout = sink._layout
    assert layout is not None and layout.stage_types is not None
    assert pgbinary.kinds_for(batch.schema, layout.names, layout.stage_types) is not None
    write(sink, 0, batch)

    # The same rows through the CSV path: the layout without type ids.
    csv_sink = JdbcSink(postgres_url, text, f"s_{text}")
    csv_sink.check_schema(batch.schema)
    assert csv_sink._layout is not None
    csv_sink._layout = type(csv_sink._layout)(csv_sink._layout.columns)
    write(csv_sink, 0, batch)

    got, expected = read(postgres_dsn, binary), read(postgres_dsn, text)
    assert got == expected
    assert len(got) == 3
    first = next(r for r in got if r[0] == -32768)
    assert first[6] == ROWS[0]["c_t"] and first[8] == ROWS[0]["c_by"]
    assert first[10] == dt.datetime(2024, 2, 29, 23, 59, 59, 999999)  # UTC wall time
    assert first[11] == ROWS[0]["c_tz"]


def test_unsupported_column_type_falls_back_to_csv(postgres_dsn: str, postgres_url: str,
                                                   pg_table: Callable[[str], str]) -> None:
    t = pg_table("num")
    create(postgres_dsn, t, "c_i8 bigint, c_n numeric(12, 3), c_b boolean")
    schema = pa.schema([("c_i8", pa.int64()), ("c_n", pa.decimal128(12, 3)),
                        ("c_b", pa.bool_())])
    batch = pa.RecordBatch.from_pylist(
        [{"c_i8": 1, "c_n": decimal.Decimal("1.250"), "c_b": True},
         {"c_i8": 2, "c_n": None, "c_b": False}], schema=schema)
    sink = JdbcSink(postgres_url, t, f"s_{t}")
    sink.check_schema(schema)
    assert sink._layout is not None and sink._layout.stage_types is not None
    assert pgbinary.kinds_for(schema, sink._layout.names, sink._layout.stage_types) is None
    write(sink, 0, batch)
    assert read(postgres_dsn, t) == [(1, decimal.Decimal("1.250"), True), (2, None, False)]
