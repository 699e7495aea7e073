"""eo_jdbc against real databases: every mode, replays, errors, atomic parallel commits.

PostgreSQL and SQLite always; MariaDB/MySQL when one is reachable (``mysql_url`` skips with
the reason otherwise). Every mode is written through the three paths a user has:
``foreachBatch`` with a small batch (one driver transaction), ``foreachBatch`` with staging
(``smallBatchRows=0``: tasks stage, the driver commits), and the DataSource batch writer
(``df.write.format("eo_jdbc")``, staging).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from connectors.core.errors import BatchOrderError, ConnectorError, JdbcSinkError, OptionError
from connectors.jdbc.sink import JdbcSink
from tests.helpers import assert_exact


class Db:
    """A test database: fresh table names, reads through SQLAlchemy, cleanup."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self.engine = sa.create_engine(url)
        self.made: list[str] = []

    def name(self, prefix: str = "t") -> str:
        n = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.made.append(n)
        self.made.append(f"eo_stage_s_{n}")
        return n

    def table(self, name: str, schema: str | None = None) -> sa.Table:
        with self.engine.connect() as c:
            return sa.Table(name, sa.MetaData(), autoload_with=c, schema=schema)

    def rows(self, name: str, schema: str | None = None) -> list[tuple[Any, ...]]:
        t = self.table(name, schema)
        with self.engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.select(t))]

    def exec(self, statement: str) -> None:
        with self.engine.begin() as c:
            c.exec_driver_sql(statement)

    def committed(self, sink_id: str, meta: str = "eo_sink_commits",
                  schema: str | None = None) -> int | None:
        t = self.table(meta, schema)
        with self.engine.connect() as c:
            row = c.execute(sa.select(t.c.batch_id).where(t.c.sink_id == sink_id)).first()
        return None if row is None else row[0]

    def drop_all(self) -> None:
        with self.engine.begin() as c:
            for n in self.made:
                c.execute(sa.text("DROP TABLE IF EXISTS " + self.quote(n)))
        self.engine.dispose()

    def quote(self, name: str) -> str:
        return self.engine.dialect.identifier_preparer.quote(name)


@pytest.fixture(params=["postgres", "sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def db(request: Any, tmp_path: Any) -> Iterator[Db]:
    if request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'eo.db'}"
    else:
        url = request.getfixturevalue("mysql_url")
    database = Db(request.param, url)
    yield database
    database.drop_all()


WriteFn = Callable[[JdbcSink, Any, int], None]


def via_driver(sink: JdbcSink, df: Any, batch_id: int) -> None:
    sink(df, batch_id)  # foreachBatch: small batch -> one driver transaction


def via_staging(sink: JdbcSink, df: Any, batch_id: int) -> None:
    JdbcSink.from_options({**_spark_options(sink), "smallBatchRows": "0"}).write(df, batch_id)


def via_datasource(sink: JdbcSink, df: Any, batch_id: int) -> None:
    writer = df.write.format("eo_jdbc").mode("append").option("batchId", batch_id)
    for k, v in _spark_options(sink).items():
        writer = writer.option(k, v)
    writer.save()


def _spark_options(sink: JdbcSink) -> dict[str, str]:
    o = sink.options
    out = {"url": o.url, "sink_id": o.sink_id, "mode": o.mode}
    if o.table:
        quoted = '"' + o.table.replace('"', '""') + '"'
        if o.table_schema:
            quoted = '"' + o.table_schema.replace('"', '""') + '".' + quoted
        out["table"] = quoted
    if o.metadata_schema or o.metadata_table != "eo_sink_commits":
        meta = '"' + o.metadata_table.replace('"', '""') + '"'
        if o.metadata_schema:
            meta = '"' + o.metadata_schema.replace('"', '""') + '".' + meta
        out["metadataTable"] = meta
    if o.keys:
        out["keys"] = ",".join(o.keys)
    if o.accumulate:
        out["accumulate"] = ",".join(o.accumulate)
    if o.statement:
        out["statement"] = o.statement
    if o.create_table:
        out["createTable"] = "true"
    if o.isolation_level:
        out["isolationLevel"] = o.isolation_level.replace(" ", "_")
    return out


def frame(spark: Any, rows: list[tuple[Any, ...]], schema: str, parts: int = 2) -> Any:
    return spark.createDataFrame(rows, schema).repartition(parts)


def run_three_batches(spark: Any, sink: JdbcSink, schema: str,
                      b0: list[Any], b1: list[Any], b2: list[Any]) -> None:
    """batch 0 via the driver, batch 1 staged, batch 1 again through the DataSource (a
    replay: must be a no-op), batch 0 again via the driver (below the last committed batch:
    a new checkpoint or a second writer, refused and nothing written), batch 2 through the
    DataSource."""
    via_driver(sink, frame(spark, b0, schema), 0)
    via_staging(sink, frame(spark, b1, schema), 1)
    via_datasource(sink, frame(spark, b1, schema), 1)
    with pytest.raises(BatchOrderError, match="batch 0 is below the sink's last committed"):
        via_driver(sink, frame(spark, b0, schema), 0)
    via_datasource(sink, frame(spark, b2, schema), 2)


def test_append(spark: Any, db: Db) -> None:
    t = db.name("app")
    sink = JdbcSink(db.url, t, f"s_{t}", create_table=True)
    schema = "id long, name string, score double"
    run_three_batches(spark, sink, schema, [(1, "a", 1.5), (2, "", None)], [(3, "c", 3.5)],
                      [(4, "d'q\"x,y", -1.0), (5, None, 0.25)])
    assert_exact(db.rows(t), [(1, "a", 1.5), (2, "", None), (3, "c", 3.5),
                              (4, "d'q\"x,y", -1.0), (5, None, 0.25)])
    assert db.committed(f"s_{t}") == 2


def test_upsert(spark: Any, db: Db) -> None:
    t = db.name("ups")
    key = "VARCHAR(20)" if db.kind == "mysql" else "TEXT"
    db.exec(f"CREATE TABLE {db.quote(t)} (k {key} PRIMARY KEY, v BIGINT, note TEXT)")
    sink = JdbcSink(db.url, t, f"s_{t}", mode="upsert", keys="k")
    schema = "k string, v long, note string"
    run_three_batches(spark, sink, schema, [("a", 1, "x"), ("b", 2, "y")],
                      [("b", 20, "y2"), ("c", 3, None)], [("a", 10, "x2")])
    assert_exact(db.rows(t), [("a", 10, "x2"), ("b", 20, "y2"), ("c", 3, None)])


def test_accumulate_replay_is_not_double_counted(spark: Any, db: Db) -> None:
    t = db.name("acc")
    sink = JdbcSink(db.url, t, f"s_{t}", mode="accumulate", keys=["word"], accumulate=["n"],
                    create_table=True)
    schema = "word string, n long"
    # Batch 0 holds the key "a" twice: the commit sums per key before ON CONFLICT.
    run_three_batches(spark, sink, schema, [("a", 1), ("b", 2), ("a", 1)],
                      [("a", 3), ("c", 1)], [("b", 5)])
    assert_exact(db.rows(t), [("a", 5), ("b", 7), ("c", 1)])
    assert db.committed(f"s_{t}") == 2


def test_sql_statement_mode(spark: Any, db: Db) -> None:
    t = db.name("sql")
    key = "VARCHAR(20)" if db.kind == "mysql" else "TEXT"
    db.exec(f"CREATE TABLE {db.quote(t)} (word {key} PRIMARY KEY, n BIGINT)")
    q = db.quote(t)
    if db.kind == "mysql":
        statement = (f"INSERT INTO {q} (word, n) VALUES (:word, :n) "  # noqa: S608 - user SQL
                     "ON DUPLICATE KEY UPDATE n = n + VALUES(n)")
    else:
        # The seeds' statement: an increment, so a second application would show.
        statement = (f"INSERT INTO {q} AS t (word, n) VALUES (:word, :n) "  # noqa: S608
                     "ON CONFLICT (word) DO UPDATE SET n = t.n + excluded.n")
        if db.kind == "sqlite":
            statement = statement.replace(" AS t ", " ").replace("t.n +", f"{q}.n +")
    sink = JdbcSink(db.url, None, f"s_{t}", mode="sql", statement=statement)
    run_three_batches(spark, sink, "word string, n long", [("a", 1), ("b", 2)],
                      [("a", 3)], [("c", 4)])
    assert_exact(db.rows(t), [("a", 4), ("b", 2), ("c", 4)])


def test_sql_mode_with_merge_on_postgres(spark: Any, postgres_url: str, pg_table: Any) -> None:
    db = Db("postgres", postgres_url)
    t = pg_table("merge")
    db.exec(f"CREATE TABLE {db.quote(t)} (word TEXT PRIMARY KEY, n BIGINT)")
    statement = (
        f"MERGE INTO {db.quote(t)} AS t USING (SELECT CAST(:word AS text) AS word, "  # noqa: S608
        "CAST(:n AS bigint) AS n) AS s ON t.word = s.word "
        "WHEN MATCHED THEN UPDATE SET n = t.n + s.n "
        "WHEN NOT MATCHED THEN INSERT (word, n) VALUES (s.word, s.n)"
    )
    sink = JdbcSink(postgres_url, None, f"s_{t}", mode="sql", statement=statement)
    run_three_batches(spark, sink, "word string, n long", [("a", 1), ("b", 2)], [("a", 3)],
                      [("b", 1)])
    assert_exact(db.rows(t), [("a", 4), ("b", 3)])
    db.exec(f"DROP TABLE IF EXISTS {db.quote('eo_stage_s_' + t)}")


def test_schema_qualified_tables_and_custom_metadata_table(spark: Any, postgres_url: str,
                                                           pg_table: Any) -> None:
    db = Db("postgres", postgres_url)
    schema = pg_table("Eo Schema")  # a name that needs quoting
    db.exec(f"CREATE SCHEMA {db.quote(schema)}")
    try:
        target = f'"{schema}"."Word Counts"'
        sink = JdbcSink(postgres_url, target, "qualified", mode="accumulate", keys="word",
                        accumulate="n", create_table=True,
                        metadata_table=f'"{schema}".my_commits')
        df = frame(spark, [("a", 1), ("b", 1)], "word string, n long")
        sink(df, 0)
        via_staging(sink, df, 1)
        assert_exact(db.rows("Word Counts", schema), [("a", 2), ("b", 2)])
        assert db.committed("qualified", "my_commits", schema) == 1
        insp = sa.inspect(db.engine)
        assert "eo_stage_qualified" in insp.get_table_names(schema=schema)
    finally:
        db.exec(f"DROP SCHEMA {db.quote(schema)} CASCADE")


def test_serializable_isolation_level(spark: Any, postgres_url: str, pg_table: Any) -> None:
    t = pg_table("iso")
    sink = JdbcSink(postgres_url, t, f"s_{t}", create_table=True,
                    isolation_level="SERIALIZABLE")
    via_staging(sink, frame(spark, [(1,), (2,)], "id long"), 0)
    assert sorted(Db("postgres", postgres_url).rows(t)) == [(1,), (2,)]


# -- errors: named precisely, nothing committed ----------------------------------------------
def _state(db: Db, table: str, sink_id: str) -> tuple[list[Any], int | None]:
    return sorted(db.rows(table)), db.committed(sink_id)


def test_missing_column_fails_before_commit(spark: Any, db: Db) -> None:
    t = db.name("miss")
    sink = JdbcSink(db.url, t, f"s_{t}", mode="append", create_table=True)
    sink(frame(spark, [(1,)], "id long"), 0)
    before = _state(db, t, f"s_{t}")
    bad = frame(spark, [(2, "x")], "id long, extra string")
    for write in (via_driver, via_staging, via_datasource):
        with pytest.raises(Exception) as e:
            write(sink, bad, 1)
        assert t in str(e.value) and "'extra'" in str(e.value) and "string" in str(e.value)
    assert _state(db, t, f"s_{t}") == before


def test_uncoercible_type_fails_before_commit(spark: Any, db: Db) -> None:
    t = db.name("typ")
    db.exec(f"CREATE TABLE {db.quote(t)} (id INTEGER, amount INTEGER)")
    sink = JdbcSink(db.url, t, f"s_{t}")
    with pytest.raises(JdbcSinkError) as e:
        sink(frame(spark, [(1, 1.5)], "id int, amount double"), 0)
    assert "'amount'" in str(e.value) and "INTEGER" in str(e.value) and "double" in str(e.value)
    assert db.rows(t) == [] and db.committed(f"s_{t}") is None or db.committed(f"s_{t}") == -1


def test_unconvertible_value_fails_before_commit(spark: Any, db: Db) -> None:
    t = db.name("val")
    db.exec(f"CREATE TABLE {db.quote(t)} (id BIGINT, small SMALLINT)")
    sink = JdbcSink(db.url, t, f"s_{t}")
    df = frame(spark, [(1, 1), (2, 70000)], "id long, small long")
    for write in (via_driver, via_staging):
        with pytest.raises(Exception) as e:
            write(sink, df, 0)
        text = str(e.value)
        assert t in text and "'small'" in text and "SMALLINT" in text and "70000" in text
    assert db.rows(t) == [] and db.committed(f"s_{t}") == -1


def test_postgres_parse_error_names_the_column(spark: Any, postgres_url: str,
                                               pg_table: Any) -> None:
    db = Db("postgres", postgres_url)
    t = pg_table("uuid")
    db.exec(f"CREATE TABLE {db.quote(t)} (id BIGINT, ref UUID)")
    sink = JdbcSink(postgres_url, t, f"s_{t}")
    df = frame(spark, [(1, str(uuid.uuid4())), (2, "not-a-uuid")], "id long, ref string")
    for write in (via_driver, via_staging):
        with pytest.raises(Exception) as e:
            write(sink, df, 0)
        text = str(e.value)
        assert t in text and "'ref'" in text and "UUID" in text and "not-a-uuid" in text
    assert db.rows(t) == [] and db.committed(f"s_{t}") == -1
    db.exec(f"DROP TABLE IF EXISTS {db.quote('eo_stage_s_' + t)}")


def test_option_errors_through_spark(spark: Any, postgres_url: str, pg_table: Any) -> None:
    t = pg_table("opt")
    df = frame(spark, [(1,)], "id long")

    def save(**options: Any) -> str:
        w = df.write.format("eo_jdbc").mode("append").option("batchId", 0)
        for k, v in options.items():
            w = w.option(k, v)
        with pytest.raises(Exception) as e:
            w.save()
        return str(e.value)

    assert "'sink_id' is required" in save(url=postgres_url, table=t, createTable="true")
    msg = save(url=postgres_url, table=t, sink_id="s", mode="merge")
    assert "'mode'" in msg and "accumulate" in msg
    assert "'url' is not a database URL" in save(url="::nope::", table=t, sink_id="s")
    msg = save(url="postgresql+psycopg://postgres:sekrit@127.0.0.1:1/test", table=t,
               sink_id="s", retryTimeout="0.3s")
    assert "127.0.0.1:1" in msg and "sekrit" not in msg and "***" in msg
    assert not sa.inspect(sa.create_engine(postgres_url)).has_table(t)


def test_python_api_errors_are_typed() -> None:
    with pytest.raises(OptionError, match="sink_id"):
        JdbcSink("sqlite:////tmp/x.db", "t")
    with pytest.raises(OptionError, match="mode"):
        JdbcSink("sqlite:////tmp/x.db", "t", "s", mode="overwrite")
    sink = JdbcSink("postgresql+psycopg://u:pw@127.0.0.1:1/db", "t", "s", retry_timeout=0.2)
    with pytest.raises(ConnectorError) as e:
        sink.last_committed()
    assert "127.0.0.1:1" in str(e.value) and ":pw@" not in str(e.value)


# -- atomicity of parallel staged writes -------------------------------------------------------
@pytest.mark.parametrize("mode", ["accumulate", "append"])
def test_parallel_staged_batches_become_visible_atomically(spark: Any, postgres_url: str,
                                                          pg_table: Any, mode: str) -> None:
    """4 tasks stage each batch in parallel (rows for accumulate, binary blocks for append);
    a reader polling the target meanwhile must only ever see whole batches (sums at batch
    boundaries), never a part of one."""
    db = Db("postgres", postgres_url)
    t = pg_table("atomic")
    keyed = {"keys": "k", "accumulate": "n"} if mode == "accumulate" else {}
    sink = JdbcSink(postgres_url, t, f"s_{t}", mode=mode, create_table=True,
                    small_batch_rows=0, **keyed)
    rows_per_batch, batches = 20_000, 5
    boundaries = {0}
    for b in range(batches):
        boundaries.add((b + 1) * rows_per_batch)
    seen: list[int] = []
    stop = threading.Event()
    engine = sa.create_engine(postgres_url)

    def reader() -> None:
        table = None
        while not stop.is_set():
            with engine.connect() as c:
                if table is None:
                    if not sa.inspect(c).has_table(t):
                        continue
                    table = sa.Table(t, sa.MetaData(), autoload_with=c)
                total = c.execute(sa.select(sa.func.coalesce(sa.func.sum(table.c.n), 0)))
                seen.append(int(total.scalar_one()))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for b in range(batches):
            df = spark.range(0, rows_per_batch, numPartitions=4).selectExpr(
                "cast(id % 1000 as string) as k", "cast(1 as long) as n")
            sink.write(df, b)
    finally:
        stop.set()
        thread.join(30)
        engine.dispose()
    partial = sorted(set(seen) - boundaries)
    assert not partial, f"reader saw partial batches: {partial[:5]}"
    assert max(seen) > 0, "the reader never observed a committed batch"
    assert sum(n for _, n in db.rows(t)) == batches * rows_per_batch
    assert db.committed(f"s_{t}") == batches - 1
    db.exec(f"DROP TABLE IF EXISTS {db.quote('eo_stage_s_' + t)}")
    db.exec(f"DROP TABLE IF EXISTS {db.quote('eo_stage_s_' + t + '_blocks')}")


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    from connectors.core import failpoints

    old = os.environ.get(name)
    os.environ[name] = value
    failpoints.reload()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
        failpoints.reload()


def test_failed_commit_leaves_target_untouched_then_replay_commits(
        spark: Any, postgres_url: str, pg_table: Any) -> None:
    """The driver's commit transaction fails at ``jdbc.before_commit`` (after applying the
    rows, before COMMIT): the target shows nothing of the batch; the replay commits it."""
    db = Db("postgres", postgres_url)
    t = pg_table("fail")
    sink = JdbcSink(postgres_url, t, f"s_{t}", mode="accumulate", keys="k", accumulate="n",
                    create_table=True, small_batch_rows=0)
    df = spark.range(0, 1000, numPartitions=3).selectExpr("cast(id % 10 as string) as k",
                                                          "cast(1 as long) as n")
    sink.write(df, 0)
    with _env("CONNECTORS_FAILPOINTS", "jdbc.before_commit@1!raise"), \
            pytest.raises(ConnectorError, match="before_commit"):
        sink.write(df, 1)
    assert sum(n for _, n in db.rows(t)) == 1000 and db.committed(f"s_{t}") == 0
    sink.write(df, 1)
    assert sum(n for _, n in db.rows(t)) == 2000 and db.committed(f"s_{t}") == 1
    db.exec(f"DROP TABLE IF EXISTS {db.quote('eo_stage_s_' + t)}")


# -- MariaDB's rendered INSERTs (connectors/jdbc/mysqlbulk.py) ---------------------------------
@pytest.mark.mysql
@pytest.mark.parametrize("sql_mode", ["", "NO_BACKSLASH_ESCAPES"])
def test_mariadb_rendered_inserts_keep_every_value(mysql_url: str, sql_mode: str) -> None:
    """Strings with quotes, backslashes, NUL, line ends and non-ASCII, empty strings, nulls,
    numbers, booleans and times go through the Arrow-rendered multi-row INSERTs and come
    back equal, with and without ``NO_BACKSLASH_ESCAPES``; task scope writes straight into
    the table, batch scope through the staging table."""
    import datetime as dt

    import pyarrow as pa

    from connectors.core.sink import TaskInfo

    strings = ["plain", "it's", "a\\b", "nul\x00x", "two\nlines\r\n", "", None, "é ü ß 🚀",
               "\\'", "'\\"]
    n = len(strings)
    batch = pa.record_batch({
        "i": pa.array(range(n), pa.int64()),
        "s": pa.array(strings, pa.string()),
        "f": pa.array([1.5, -0.25, 1e20, 3.0, None, 0.0, 2.5, 7.0, 8.0, 9.0]),
        "b": pa.array([True, False, None] * 3 + [True]),
        "t": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)] * (n - 1) + [None],
                      pa.timestamp("us")),
    })
    db = Db("mysql", mysql_url)
    sep = "&" if "?" in mysql_url else "?"
    url = mysql_url + f"{sep}init_command=SET%20sql_mode%3D%27{sql_mode}%27"
    try:
        for scope in ("task", "batch"):
            t = db.name(f"mb_{scope}")
            sink = JdbcSink(url, t, f"s_{t}", create_table=True, commit_scope=scope)
            sink.check_schema(batch.schema)
            sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([batch]))])
            got = sorted(db.rows(t), key=lambda r: r[0])
            assert [r[1] for r in got] == strings, scope
            assert [r[2] for r in got] == batch.column("f").to_pylist()
            assert [None if r[3] is None else bool(r[3]) for r in got] == \
                batch.column("b").to_pylist()
            assert [r[4] for r in got] == batch.column("t").to_pylist()
    finally:
        db.drop_all()


def test_prepared_scope_on_a_server_without_prepared_transactions_says_what_to_set() -> None:
    """``commitScope=prepared`` on PostgreSQL's default, ``max_prepared_transactions = 0``: the
    driver refuses before any task, naming the setting and the other two scopes, and never
    the password (a throwaway server, so the test holds whatever the tier's server allows)."""
    import pyarrow as pa

    from tests.services.postgres import TempPostgres

    pg = TempPostgres({"max_prepared_transactions": "0"}).start()
    try:
        with sa.create_engine(pg.url).connect() as conn:
            conn.execute(sa.text("ALTER ROLE postgres PASSWORD 'pr3pared-s3cret'"))
            conn.commit()
        url = pg.url.replace("postgres@", "postgres:pr3pared-s3cret@")
        sink = JdbcSink.from_options({"url": url, "table": "t", "sink_id": "prep-0",
                                      "commitScope": "prepared", "createTable": "true"})
        with pytest.raises(JdbcSinkError) as refused:
            sink.check_schema(pa.schema([("id", pa.int64())]))
        message = str(refused.value)
        for said in ("commitScope=prepared", "max_prepared_transactions = 0",
                     "commitScope=task", "'prep-0'"):
            assert said in message, message
        assert "pr3pared-s3cret" not in message, message
        with sa.create_engine(pg.url).connect() as conn:  # nothing was prepared or created
            assert conn.execute(sa.text("SELECT count(*) FROM pg_prepared_xacts")).scalar() == 0
            assert conn.execute(sa.text("SELECT to_regclass('public.t')")).scalar() is None
    finally:
        pg.destroy()
