"""eo_jdbc on PostgreSQL: binary COPY stores exactly what the CSV path stores, for every
type pair it handles, both as staged blocks (append) and as staged rows (the other modes),
and anything else still goes through CSV. Staged blocks commit only the winning attempts,
exactly once (no Spark needed: the sink's stage/commit steps are driven directly)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from connectors.core.errors import JdbcSinkError, OptionError
from connectors.core.sink import TaskInfo
from connectors.jdbc import dialects, pgbinary
from connectors.jdbc.sink import JdbcSink
from connectors.jdbc.staging import StagedBlocks, StagedRows

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
    binary, rows, text = pg_table("bin"), pg_table("rows"), pg_table("csv")
    for t in (binary, rows, text):
        create(postgres_dsn, t, DDL)
    batch = pa.RecordBatch.from_pylist(ROWS, schema=SCHEMA)

    sink = JdbcSink(postgres_url, binary, f"s_{binary}")
    sink.check_schema(batch.schema)
    layout = sink._layout
    assert layout is not None and layout.stage_types is not None and layout.blocks
    assert pgbinary.kinds_for(batch.schema, layout.names, layout.stage_types) is not None
    write(sink, 0, batch)

    # Binary rows in the staging table (how upsert/accumulate/sql stage): no blocks.
    rows_sink = JdbcSink(postgres_url, rows, f"s_{rows}")
    rows_sink.check_schema(batch.schema)
    assert rows_sink._layout is not None
    rows_sink._layout = dataclasses.replace(rows_sink._layout, blocks=False)
    write(rows_sink, 0, batch)

    # The same rows through the CSV path: the layout without type ids.
    csv_sink = JdbcSink(postgres_url, text, f"s_{text}")
    csv_sink.check_schema(batch.schema)
    assert csv_sink._layout is not None
    csv_sink._layout = type(csv_sink._layout)(csv_sink._layout.columns)
    write(csv_sink, 0, batch)

    got, expected = read(postgres_dsn, binary), read(postgres_dsn, text)
    assert got == expected
    assert read(postgres_dsn, rows) == expected
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


def test_staged_blocks_commit_the_winning_attempts_once(
    postgres_dsn: str, postgres_url: str, pg_table: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Append stages binary COPY blocks. With tiny blocks every cut falls inside a row, and
    the commit still rebuilds each attempt's rows in order; a losing attempt's blocks and a
    replay add nothing; a lost block fails the commit and leaves the target untouched."""
    monkeypatch.setattr(dialects, "BLOCK_BYTES", 37)
    t = pg_table("blocks")
    create(postgres_dsn, t, "id bigint, s text, x double precision")
    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("x", pa.float64())])

    def batch(lo: int, hi: int) -> pa.RecordBatch:
        ids = list(range(lo, hi))
        return pa.record_batch({"id": ids, "s": [None if i % 7 == 0 else f"s{i}" for i in ids],
                                "x": [i * 0.5 for i in ids]}, schema=schema)

    sink = JdbcSink(postgres_url, t, f"s_{t}")
    sink.check_schema(schema)
    assert sink._layout is not None and sink._layout.blocks
    loser = sink.stage(TaskInfo(0, 0), iter([batch(0, 40)]))  # a failed first attempt
    w0 = sink.stage(TaskInfo(0, 0, attempt=1), iter([batch(0, 40), batch(40, 100)]))
    w1 = sink.stage(TaskInfo(0, 1), iter([batch(100, 250)]))
    assert isinstance(w0, StagedBlocks) and (w0.rows, w1.rows) == (100, 150)
    assert isinstance(loser, StagedBlocks) and loser.rows == 40
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        blocks = sql.Identifier(sink.options.blocks_table)
        n_blocks = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(blocks)).fetchone()
        assert n_blocks is not None and n_blocks[0] > 250  # many blocks, cut inside rows
    sink.commit(0, [w0, w1])
    expected = [(i, None if i % 7 == 0 else f"s{i}", i * 0.5) for i in range(250)]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT id, s, x FROM {} ORDER BY id").format(sql.Identifier(t))
        assert conn.execute(query).fetchall() == expected
        left = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(blocks)).fetchone()
        assert left == (0,)  # the commit cleared every block, the loser's too
    sink.commit(0, [w0, w1])  # a replay is a no-op
    assert sink.last_committed() == 0

    # Batch 1: a block goes missing between stage and commit -> nothing is committed.
    w0 = sink.stage(TaskInfo(1, 0), iter([batch(1000, 1100)]))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {} WHERE eo_seq = 1").format(blocks))
    with pytest.raises(JdbcSinkError, match="does not hold the rows"):
        sink.commit(1, [w0])
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t)))
        assert count.fetchone() == (250,)
    assert sink.last_committed() == 0


def test_stage_blocks_false_stages_rows(postgres_dsn: str, postgres_url: str,
                                        pg_table: Callable[[str], str]) -> None:
    t = pg_table("noblocks")
    create(postgres_dsn, t, "id bigint")
    schema = pa.schema([("id", pa.int64())])
    sink = JdbcSink.from_options({"url": postgres_url, "table": t, "sink_id": f"s_{t}",
                                  "stageblocks": "false"})
    sink.check_schema(schema)
    assert sink._layout is not None and not sink._layout.blocks
    msg = sink.stage(TaskInfo(0, 0), iter([pa.record_batch({"id": [1, 2, 3]}, schema=schema)]))
    assert isinstance(msg, StagedRows)
    sink.commit(0, [msg])
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        got = conn.execute(sql.SQL("SELECT sum(id) FROM {}").format(sql.Identifier(t)))
        assert got.fetchone() == (6,)
    with pytest.raises(OptionError, match="stage_blocks"):  # the Python keyword given
        JdbcSink(postgres_url, t, f"s_{t}", stage_blocks="sometimes")  # type: ignore[arg-type]


def test_append_of_a_type_without_binary_form_stages_rows(
    postgres_dsn: str, postgres_url: str, pg_table: Callable[[str], str]
) -> None:
    t = pg_table("numrows")
    create(postgres_dsn, t, "id bigint, n numeric(10, 2)")
    schema = pa.schema([("id", pa.int64()), ("n", pa.decimal128(10, 2))])
    sink = JdbcSink(postgres_url, t, f"s_{t}")
    sink.check_schema(schema)
    assert sink._layout is not None and not sink._layout.blocks
    msg = sink.stage(TaskInfo(0, 0), iter([pa.record_batch(
        {"id": [1, 2], "n": [decimal.Decimal("1.50"), None]}, schema=schema)]))
    assert isinstance(msg, StagedRows)
    sink.commit(0, [msg])
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        got = conn.execute(sql.SQL("SELECT id, n FROM {} ORDER BY id").format(sql.Identifier(t)))
        assert got.fetchall() == [(1, decimal.Decimal("1.50")), (2, None)]
