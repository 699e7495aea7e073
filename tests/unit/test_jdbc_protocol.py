"""eo_jdbc commit protocol on an SQLite file, driven directly (no Spark, no network).

Each test plays the roles Spark plays: tasks call ``stage``, the driver calls ``commit`` with
the winning attempts' messages, or ``abort``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from connectors.core import failpoints
from connectors.core.errors import FailpointError, JdbcSinkError
from connectors.core.sink import TaskInfo
from connectors.jdbc.sink import JdbcSink
from connectors.jdbc.staging import InlineRows, StagedRows

SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])


def batches(rows: list[tuple[str, int]]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"word": [r[0] for r in rows], "n": [r[1] for r in rows]},
                          schema=SCHEMA)


@pytest.fixture
def db(tmp_path: Any) -> str:
    return str(tmp_path / "t.db")


def table(db: str, name: str = "wc") -> dict[str, int]:
    with sqlite3.connect(db) as c:
        return dict(c.execute(f"select word, n from {name}").fetchall())  # noqa: S608


def committed(db: str, sink_id: str = "wc") -> int:
    with sqlite3.connect(db) as c:
        return c.execute("select batch_id from eo_sink_commits where sink_id = ?",
                         (sink_id,)).fetchone()[0]


def staged(db: str) -> list[tuple[int, int, str]]:
    with sqlite3.connect(db) as c:
        return c.execute("select eo_batch, eo_writer, eo_attempt from eo_stage_wc").fetchall()


def make(db: str, **kw: Any) -> JdbcSink:
    sink = JdbcSink(f"sqlite:///{db}", "wc", "wc", mode="accumulate", keys="word",
                    accumulate="n", create_table=True, **kw)
    sink.check_schema(SCHEMA)
    return sink


def test_accumulate_commit_is_once_per_batch_id(db: str) -> None:
    sink = make(db)
    m0 = sink.stage(TaskInfo(0, 0), batches([("a", 1), ("b", 2)]))
    m1 = sink.stage(TaskInfo(0, 1), batches([("a", 3)]))
    sink.commit(0, [m0, m1])
    assert table(db) == {"a": 4, "b": 2}
    # A replay of batch 0 (restaged by the retried job) changes nothing and cleans up.
    again = sink.stage(TaskInfo(0, 0), batches([("a", 1), ("b", 2)]))
    sink.commit(0, [again])
    assert table(db) == {"a": 4, "b": 2} and committed(db) == 0 and staged(db) == []
    assert sink.last_committed() == 0 and sink.is_committed(0) and not sink.is_committed(1)


def test_only_the_winning_attempt_is_applied_and_losers_are_removed(db: str) -> None:
    sink = make(db)
    loser = sink.stage(TaskInfo(5, 0, attempt=0), batches([("a", 100)]))
    winner = sink.stage(TaskInfo(5, 0, attempt=1), batches([("a", 1)]))
    orphan = sink.stage(TaskInfo(3, 1), batches([("z", 7)]))  # an older batch's leftovers
    assert isinstance(loser, StagedRows) and loser.token != winner.token
    assert len(staged(db)) == 3
    sink.commit(5, [winner])
    assert table(db) == {"a": 1}
    assert staged(db) == [] and orphan is not None


def test_abort_removes_staged_rows_and_commits_nothing(db: str) -> None:
    sink = make(db)
    m = sink.stage(TaskInfo(0, 0), batches([("a", 1)]))
    sink.abort(0, [m, None])
    assert staged(db) == [] and table(db) == {} and sink.last_committed() is None


def test_missing_staged_rows_fail_the_commit(db: str) -> None:
    sink = make(db)
    m = sink.stage(TaskInfo(0, 0), batches([("a", 1), ("b", 1)]))
    with sqlite3.connect(db) as c:
        c.execute("delete from eo_stage_wc where rowid = (select min(rowid) from eo_stage_wc)")
    with pytest.raises(JdbcSinkError, match="does not hold the rows the tasks reported"):
        sink.commit(0, [m])
    assert table(db) == {} and committed(db) == -1


def test_inline_rows_commit_in_the_driver_transaction(db: str) -> None:
    sink = make(db)
    sink._inline_limit = 10
    m = sink.stage(TaskInfo(0, 0), batches([("a", 1), ("a", 2)]))
    assert isinstance(m, InlineRows) and m.rows == 2
    assert staged(db) == []  # nothing touched the database yet
    sink.commit(0, [m])
    assert table(db) == {"a": 3}
    sink._inline_limit = 1  # a partition above the limit is staged by its task
    big = sink.stage(TaskInfo(1, 0), batches([("b", 1), ("b", 1)]))
    assert isinstance(big, StagedRows)
    sink.commit(1, [big])
    assert table(db) == {"a": 3, "b": 2}


def test_failpoint_before_commit_rolls_everything_back(db: str, monkeypatch: Any) -> None:
    sink = make(db)
    m = sink.stage(TaskInfo(0, 0), batches([("a", 1)]))
    monkeypatch.setenv("CONNECTORS_FAILPOINTS", "jdbc.before_commit@0!raise")
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            sink.commit(0, [m])
    finally:
        monkeypatch.delenv("CONNECTORS_FAILPOINTS")
        failpoints.reload()
    assert table(db) == {} and committed(db) == -1
    assert len(staged(db)) == 1  # still staged: the retry can commit it
    sink.commit(0, [m])
    assert table(db) == {"a": 1}


def test_value_errors_fail_before_anything_is_staged(db: str) -> None:
    with sqlite3.connect(db) as c:
        c.execute("create table small (k integer primary key, v smallint)")
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    sink = JdbcSink(f"sqlite:///{db}", "small", "small", mode="upsert", keys="k")
    sink.check_schema(schema)
    # SQLite itself would store 70000 in a SMALLINT column without complaint.
    with pytest.raises(JdbcSinkError, match=r"'small', column 'v' \(SMALLINT\).*70000"):
        sink.stage(TaskInfo(0, 0), iter([pa.record_batch({"k": [1], "v": [70000]},
                                                          schema=schema)]))
    with sqlite3.connect(db) as c:
        assert c.execute("select count(*) from eo_stage_small").fetchone()[0] == 0


def test_schema_change_recreates_the_staging_table(db: str) -> None:
    make(db)
    with sqlite3.connect(db) as c:
        c.execute("alter table wc add column extra text")
    wider = pa.schema([("word", pa.string()), ("n", pa.int64()), ("extra", pa.string())])
    sink = JdbcSink(f"sqlite:///{db}", "wc", "wc", mode="accumulate", keys="word",
                    accumulate="n")
    sink.check_schema(wider)
    m = sink.stage(TaskInfo(0, 0), iter([pa.record_batch(
        {"word": ["a"], "n": [1], "extra": ["x"]}, schema=wider)]))
    sink.commit(0, [m])
    with sqlite3.connect(db) as c:
        assert c.execute("select word, n, extra from wc").fetchall() == [("a", 1, "x")]


def test_append_checks_the_applied_row_count(db: str) -> None:
    sink = JdbcSink(f"sqlite:///{db}", "app", "app", create_table=True)
    sink.check_schema(SCHEMA)
    m = sink.stage(TaskInfo(0, 0), batches([("a", 1), ("b", 2)]))
    with sqlite3.connect(db) as c:
        c.execute("delete from eo_stage_app where word = 'a'")
    with pytest.raises(JdbcSinkError, match=r"\(reported, found\) = \{\d+: \(2, 1\)\}"):
        sink.commit(0, [m])
    assert table(db, "app") == {}


def test_transient_errors_are_retried_within_the_deadline(db: str) -> None:
    sink = make(db, retry_timeout=5)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    assert sink._retrying("flaky step", flaky) == "done" and len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise sqlite3.OperationalError("no such column: nope")

    calls.clear()
    with pytest.raises(JdbcSinkError, match="flaky step failed.*no such column") as e:
        sink._retrying("flaky step", broken)
    assert len(calls) == 1 and "gave up" not in str(e.value)  # fails fast

    def always_locked() -> None:
        raise sqlite3.OperationalError("database is locked")

    short = make(db, retry_timeout=0.3)
    with pytest.raises(JdbcSinkError, match="gave up after .* retryTimeout=0.3s"):
        short._retrying("locked step", always_locked)


def test_a_new_sink_per_batch_compiles_no_statement_again(db: str) -> None:
    """Spark makes the sink anew for every batch, in Python workers that live for months.
    SQLAlchemy's statement cache keys on table objects: with new ones per batch every
    statement was compiled again and the engine's cache grew to its 500 entries (about 50 MB
    on PostgreSQL, bench/endurance.py). The same tables are the same objects, so batches
    after the first ones add nothing to it."""
    from connectors.jdbc import dialects

    def batch(b: int) -> None:
        sink = make(db)
        message = sink.stage(TaskInfo(b, 0), batches([(f"w{b % 7}", 1)]))
        sink = make(db)
        sink.admit(b)
        sink.commit(b, [message])

    for b in range(5):
        batch(b)
    engine = dialects._ENGINES[f"sqlite:///{db}"]
    before = len(engine._compiled_cache)
    for b in range(5, 40):
        batch(b)
    assert len(engine._compiled_cache) == before
    assert sum(table(db).values()) == 40
