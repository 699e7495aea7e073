"""Throughput of the ``eo_jdbc`` sink, each commit scope, against Spark's JDBC writer and raw
writes from Python, into PostgreSQL and MariaDB.

    python bench/jdbc_throughput.py --rows 1000000

The rows are ``(id bigint, s text, x double precision)`` with ``s`` a 20-character string,
in a DataFrame of 2 partitions (2 Spark tasks), cached and counted before anything is timed,
as the raw writers' Python rows are built before they are timed: each figure is a writer's
rate, not a generator's. Each throughput figure is the best of ``--repeat`` interleaved runs
(default 3), after one untimed full-size warm-up run of each Spark writer (JIT).

PostgreSQL, append (``POSTGRES_DSN`` or the test tier's
``postgresql://eo:eo@127.0.0.1:5432/eo_test``; when that server has
``max_prepared_transactions = 0``, PostgreSQL's default, every PostgreSQL figure is taken on
a throwaway server from ``initdb`` on the same disk with ``max_prepared_transactions = 8``
instead, so that all of them come from one server):

- ``eo_jdbc`` (``commitScope=batch``, the default): 2 tasks stage binary COPY blocks, the
  driver's one transaction COPYs them into the table;
- ``task`` (``commitScope=task``): each task COPYs its rows into the table and commits them
  with its claim; the driver's commit checks the claims;
- ``prepared`` (``commitScope=prepared``): each task COPYs and PREPAREs; the driver records
  the batch, then COMMIT PREPARED;
- ``spark_jdbc``: ``df.write.jdbc`` with the PostgreSQL JDBC driver (``org.postgresql``,
  the ``postgresql-jdbc`` profile of connectors/demo/services/pom.xml), default options;
- ``raw_copy``: one psycopg ``COPY ... FROM STDIN`` of the rows as Python tuples with
  ``copy.write_row`` (psycopg's COPY idiom), no Spark; ``raw_copy_csv``: the same COPY fed a
  CSV block rendered beforehand (not timed): the wire-speed ceiling of COPY here.

PostgreSQL, upsert and accumulate, into a table with a primary key on ``id``:

- upsert: every run writes ids 0..N-1 into a table holding the even ids (filled before the
  run, not timed): half the rows update, half insert. ``upsert_batch`` and ``upsert_task``
  (``mode=upsert``, ``keys=id``); ``raw_upsert``: psycopg ``executemany`` of ``INSERT ... ON
  CONFLICT (id) DO UPDATE`` (pipeline mode), on ``--raw-rows`` rows; ``raw_upsert_copy``:
  a COPY of all rows into a temporary table, then one ``INSERT ... SELECT ... ON CONFLICT``:
  the fastest way from Python, what the sink does inside.
- accumulate: rows ``(id % (N/10), s, x)``, ten per key, into a table holding every key;
  ``x = x + new``. ``accumulate_batch``/``accumulate_task``; ``raw_accumulate``:
  ``executemany`` of ``INSERT ... ON CONFLICT (id) DO UPDATE SET x = t.x + excluded.x``;
  ``raw_accumulate_copy``: COPY into a temporary table, then one ``INSERT ... SELECT id,
  max(s), sum(x) ... GROUP BY id ON CONFLICT ...``.

Spark's JDBC writer cannot upsert: its append (above) is the reference for these too.

MariaDB, append (``MYSQL_URL`` or ``mysql+pymysql://eo:eo@127.0.0.1:3306/eo_test``):
``mariadb_batch``, ``mariadb_task``; ``mariadb_spark_jdbc``: ``df.write.jdbc`` with MariaDB
Connector/J (the ``mariadb-jdbc`` profile), on a ``jdbc:mysql:`` URL with
``permitMysqlScheme`` so that Spark picks its MySQL dialect (backquoted names; on
``jdbc:mariadb:`` Spark quotes with ``"``, which MariaDB refuses), default options (inserts
go out as Connector/J's bulk batches); ``mariadb_raw_load``: ``LOAD DATA LOCAL INFILE`` of a
CSV file written beforehand (not timed), the server's fastest load.

Also: ``arrow_noop_s``, a Python DataSource writer that only counts its rows (the Spark job
and the JVM -> Python Arrow transfer: the floor under any Python writer); per scope the
median time of one small batch (2 writers x 50 rows, PostgreSQL) over
``--overhead-batches`` batches: ``*_commit_overhead_ms`` the driver's commit step alone,
``*_small_batch_ms`` both tasks' writes and the commit, one after the other.

Ends with one line: ``RESULT {json}`` (bench/README.md, "The RESULT line").
"""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from _common import bench_spark, register_noop, run_noop  # noqa: E402

DEFAULT_DSN = "postgresql://eo:eo@127.0.0.1:5432/eo_test"
DEFAULT_MYSQL = "mysql+pymysql://eo:eo@127.0.0.1:3306/eo_test"
SCOPES = ("batch", "task", "prepared")
Rows = list[tuple[int, str, float]]


# -- the JDBC drivers of Spark's baseline -------------------------------------------------------
def maven_jar(profile: str, pattern: str, debian: tuple[str, ...] = ()) -> str | None:
    """A JDBC driver jar resolved from Maven Central (cached), else a Debian package's."""
    from connectors.core.errors import ConnectorError
    from connectors.demo.services import maven

    try:
        found = sorted(glob.glob(str(maven.resolve(profile) / pattern)))
    except ConnectorError as e:
        print(f"no {profile} jar from Maven Central: {e}", file=sys.stderr)
        found = []
    for p in debian:
        found += sorted(glob.glob(p))
    return found[0] if found else None


def jdbc_jars() -> list[str]:
    pg = os.environ.get("POSTGRES_JDBC_JAR") or maven_jar(
        "postgresql-jdbc", "postgresql-*.jar",
        ("/usr/share/java/postgresql.jar", "/usr/share/java/postgresql-*.jar"))
    maria = os.environ.get("MARIADB_JDBC_JAR") or maven_jar(
        "mariadb-jdbc", "mariadb-java-client-*.jar")
    missing = [n for n, j in (("PostgreSQL JDBC driver", pg), ("MariaDB Connector/J", maria))
               if j is None]
    if missing:
        raise SystemExit(f"not found: {missing} (POSTGRES_JDBC_JAR, MARIADB_JDBC_JAR)")
    return [pg, maria]  # type: ignore[list-item]


def frame(spark: Any, rows: int, keys: int | None = None) -> Any:
    key = "id" if keys is None else f"id % {keys}"
    return spark.range(0, rows, numPartitions=2).selectExpr(
        f"{key} as id", "substr(sha2(cast(id as string), 256), 1, 20) as s",
        "cast(id as double) * 1.5 as x")


def python_rows(rows: int, keys: int | None = None) -> Rows:
    return [(i if keys is None else i % keys, hashlib.sha256(str(i).encode()).hexdigest()[:20],
             i * 1.5) for i in range(rows)]


# -- PostgreSQL ----------------------------------------------------------------------------
def sa_url(dsn: str) -> str:
    return "postgresql+psycopg://" + dsn.split("://", 1)[1]


def pg_jdbc(dsn: str) -> tuple[str, dict[str, str]]:
    import sqlalchemy as sa

    u = sa.engine.make_url(sa_url(dsn))
    props = {"driver": "org.postgresql.Driver", "user": u.username or "postgres"}
    if u.password:
        props["password"] = u.password
    return f"jdbc:postgresql://{u.host or '127.0.0.1'}:{u.port or 5432}/{u.database}", props


def pg_server(dsn: str) -> tuple[str, Any, str]:
    """``(dsn, throwaway server or None, what it is)``: the DSN's server when it allows
    prepared transactions, else a throwaway one that does."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        limit = int(c.execute("SHOW max_prepared_transactions").fetchone()[0])  # type: ignore[index]
    if limit > 0:
        return dsn, None, f"the DSN's server (max_prepared_transactions={limit})"
    from tests.services.postgres import TempPostgres

    pg = TempPostgres({"max_prepared_transactions": "8"}).start()
    return (pg.dsn, pg, "a throwaway server from initdb (max_prepared_transactions=8; the "
            "DSN's has 0)")


class Pg:
    def __init__(self, dsn: str) -> None:
        import psycopg

        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.made: list[str] = []

    def create(self, table: str, pk: bool = False) -> str:
        from psycopg import sql

        key = " primary key" if pk else ""
        self.conn.execute(sql.SQL(f"CREATE TABLE {{}} (id bigint{key}, s text, "  # noqa: S608
                                  "x double precision)").format(sql.Identifier(table)))
        self.made.append(table)
        return table

    def count(self, table: str) -> int:
        from psycopg import sql

        return int(self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(table))).fetchone()[0])  # type: ignore[index]

    def total_x(self, table: str) -> float:
        from psycopg import sql

        return float(self.conn.execute(sql.SQL("SELECT coalesce(sum(x), 0) FROM {}").format(
            sql.Identifier(table))).fetchone()[0])  # type: ignore[index]

    def truncate(self, table: str) -> None:
        from psycopg import sql

        self.conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))

    def copy(self, table: str, data: Rows, conn: Any = None) -> float:
        from psycopg import sql

        conn = conn or self.conn
        stmt = sql.SQL("COPY {} (id, s, x) FROM STDIN").format(sql.Identifier(table))
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur, cur.copy(stmt) as copy:
            for row in data:
                copy.write_row(row)
        return time.perf_counter() - started

    def copy_csv(self, table: str, data: Rows) -> float:
        from psycopg import sql

        buf = io.StringIO()
        csv.writer(buf).writerows(data)
        block = buf.getvalue().encode()
        stmt = sql.SQL("COPY {} (id, s, x) FROM STDIN (FORMAT csv)").format(
            sql.Identifier(table))
        started = time.perf_counter()
        with self.conn.transaction(), self.conn.cursor() as cur, cur.copy(stmt) as copy:
            for i in range(0, len(block), 1 << 20):
                copy.write(block[i:i + (1 << 20)])
        return time.perf_counter() - started

    def upsert_many(self, table: str, data: Rows, add: bool) -> float:
        """``executemany`` of ``INSERT ... ON CONFLICT``: what Python code writes by hand."""
        from psycopg import sql

        update = sql.SQL("x = t.x + excluded.x" if add else "s = excluded.s, x = excluded.x")
        stmt = sql.SQL("INSERT INTO {} AS t (id, s, x) VALUES (%s, %s, %s) ON CONFLICT (id) "
                       "DO UPDATE SET {}").format(sql.Identifier(table), update)
        started = time.perf_counter()
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(stmt, data)
        return time.perf_counter() - started

    def upsert_copy(self, table: str, data: Rows, add: bool) -> float:
        """COPY into a temporary table, then one ``INSERT ... SELECT ... ON CONFLICT``."""
        from psycopg import sql

        t = sql.Identifier(table)
        if add:
            stmt = sql.SQL("INSERT INTO {} AS t (id, s, x) SELECT id, max(s), sum(x) FROM "
                           "eo_bench_tmp GROUP BY id ON CONFLICT (id) DO UPDATE SET x = t.x + "
                           "excluded.x, s = excluded.s").format(t)
        else:
            stmt = sql.SQL("INSERT INTO {} AS t (id, s, x) SELECT id, s, x FROM eo_bench_tmp "
                           "ON CONFLICT (id) DO UPDATE SET s = excluded.s, x = excluded.x"
                           ).format(t)
        started = time.perf_counter()
        with self.conn.transaction():
            self.conn.execute("CREATE TEMP TABLE eo_bench_tmp (id bigint, s text, x double "
                              "precision) ON COMMIT DROP")
            with self.conn.cursor() as cur, cur.copy(
                    "COPY eo_bench_tmp (id, s, x) FROM STDIN") as copy:
                for row in data:
                    copy.write_row(row)
            self.conn.execute(stmt)
        return time.perf_counter() - started

    def drop_all(self, sink_prefix: str) -> None:
        from psycopg import sql

        for t in self.made:
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(t)))
        for (name,) in self.conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE %s",
                (f"eo_stage_{sink_prefix}%",)).fetchall():
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
        for t in ("eo_sink_commits", "eo_sink_commits_tasks"):
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE sink_id LIKE %s").format(
                sql.Identifier(t)), (f"{sink_prefix}%",))
        self.conn.close()


# -- MariaDB -------------------------------------------------------------------------------
class Maria:
    def __init__(self, url: str) -> None:
        import pymysql
        import sqlalchemy as sa

        u = sa.engine.make_url(url)
        self.url = url
        self.args = {"host": u.host or "127.0.0.1", "port": u.port or 3306,
                     "user": u.username or "root", "password": u.password or "",
                     "database": u.database}
        self.conn = pymysql.connect(**self.args, autocommit=True, local_infile=True)
        self.made: list[str] = []

    def jdbc(self) -> tuple[str, dict[str, str]]:
        a = self.args
        return (f"jdbc:mysql://{a['host']}:{a['port']}/{a['database']}?permitMysqlScheme",
                {"driver": "org.mariadb.jdbc.Driver", "user": str(a["user"]),
                 "password": str(a["password"])})

    def run(self, statement: str) -> Any:
        with self.conn.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall()

    def create(self, table: str) -> str:
        self.run(f"CREATE TABLE `{table}` (id bigint, s varchar(20), x double)")
        self.made.append(table)
        return table

    def count(self, table: str) -> int:
        return int(self.run(f"SELECT count(*) FROM `{table}`")[0][0])  # noqa: S608

    def truncate(self, table: str) -> None:
        self.run(f"TRUNCATE TABLE `{table}`")

    def load(self, table: str, path: str) -> float:
        started = time.perf_counter()
        self.conn.begin()
        with self.conn.cursor() as cur:
            cur.execute(f"LOAD DATA LOCAL INFILE '{path}' INTO TABLE `{table}` CHARACTER SET "
                        "utf8mb4 FIELDS TERMINATED BY ',' OPTIONALLY ENCLOSED BY '\"' "
                        "ESCAPED BY '' LINES TERMINATED BY '\\n' (id, s, x)")
        self.conn.commit()
        return time.perf_counter() - started

    def drop_all(self, sink_prefix: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema "
                        "= DATABASE() AND table_name LIKE %s", (f"eo_stage_{sink_prefix}%",))
            self.made += [name for (name,) in cur.fetchall()]
        for t in self.made:
            self.run(f"DROP TABLE IF EXISTS `{t}`")
        for t in ("eo_sink_commits", "eo_sink_commits_tasks"):
            try:
                self.run(f"DELETE FROM `{t}` WHERE sink_id LIKE '{sink_prefix}%'")  # noqa: S608
            except Exception:  # noqa: BLE001, S110 - the table may not exist
                pass
        self.conn.close()


# -- the writers ---------------------------------------------------------------------------
def run_eo(df: Any, url: str, table: str, sink_id: str, batch_id: int, **options: str) -> float:
    writer = (df.write.format("eo_jdbc").mode("append").option("url", url)
              .option("table", table).option("sink_id", sink_id).option("batchId", batch_id))
    for k, v in options.items():
        writer = writer.option(k, v)
    started = time.perf_counter()
    writer.save()
    return time.perf_counter() - started


def run_spark_jdbc(df: Any, jdbc: tuple[str, dict[str, str]], table: str) -> float:
    started = time.perf_counter()
    df.write.jdbc(jdbc[0], table, mode="append", properties=jdbc[1])
    return time.perf_counter() - started


def best_of(repeat: int, runs: dict[str, Callable[[int], float]],
            after: Callable[[], None], label: str) -> dict[str, float]:
    """Each writer's best time of ``repeat`` interleaved runs (the machine may be shared);
    ``after`` checks and resets the tables after each round."""
    best: dict[str, float] = {}
    for rep in range(repeat):
        for name, run in runs.items():
            secs = run(rep)
            print(f"{label} run {rep + 1}: {name:<24} {secs:.2f}s", flush=True)
            best[name] = min(best.get(name, secs), secs)
        after()
    return best


def counted(db: Pg | Maria, tables: Iterable[str], rows: int) -> None:
    """After a round: every table holds ``rows`` rows; then empty it for the next."""
    for t in tables:
        n = db.count(t)
        if n != rows:
            raise RuntimeError(f"{t}: {n} rows written, expected {rows}")
        db.truncate(t)


def small_batches(dsn: str, batches: int, table: str, sink_id: str,
                  scope: str) -> tuple[float, float]:
    """``(commit step, whole batch)`` medians in ms of small batches (2 x 50 rows)."""
    import pyarrow as pa

    from connectors.core.sink import TaskInfo
    from connectors.jdbc.sink import JdbcSink

    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("x", pa.float64())])
    sink = JdbcSink(sa_url(dsn), table, sink_id, create_table=True, commit_scope=scope)
    sink.check_schema(schema)
    commits, wholes = [], []
    for b in range(batches):
        began = time.perf_counter()
        msgs = []
        for w in (0, 1):
            ids = list(range((b * 2 + w) * 50, (b * 2 + w + 1) * 50))
            batch = pa.record_batch({"id": ids, "s": [f"{i:020d}" for i in ids],
                                     "x": [i * 1.5 for i in ids]}, schema=schema)
            msgs.append(sink.stage(TaskInfo(b, w), iter([batch])))
        started = time.perf_counter()
        sink.commit(b, msgs)
        done = time.perf_counter()
        commits.append((done - started) * 1000)
        wholes.append((done - began) * 1000)
    return statistics.median(commits), statistics.median(wholes)


# -- the sections --------------------------------------------------------------------------
def append_pg(spark: Any, pg: Pg, args: Any, tag: str, sink: str) -> dict[str, float]:
    url, jdbc = sa_url(pg.dsn), pg_jdbc(pg.dsn)
    tables = {n: pg.create(f"bench_{n}_{tag}") for n in
              ("eo_jdbc", "task", "prepared", "spark_jdbc", "raw_copy", "raw_copy_csv")}
    df = frame(spark, args.rows).cache()
    df.count()
    # Warm-up, not timed: one full-size run of each Spark writer, so the JVM's JIT has
    # compiled both paths (Arrow export for ours, JDBC batching for Spark's) before
    # anything is measured; a 10k-row warm-up left the first timed runs of both writers
    # 30-60% slower. Also loads the JDBC driver and the Python workers' imports.
    for scope in SCOPES:
        run_eo(df, url, tables["eo_jdbc" if scope == "batch" else scope],
               f"{sink}_warm_{scope}", 0, commitScope=scope)
    run_spark_jdbc(df, jdbc, tables["spark_jdbc"])
    run_noop(df)
    for t in tables.values():
        pg.truncate(t)
    data = python_rows(args.rows)
    print(f"PostgreSQL append: {args.rows} rows with each writer ...", flush=True)
    runs: dict[str, Callable[[int], float]] = {
        f"{'eo_jdbc' if s == 'batch' else s}": (
            lambda rep, s=s: run_eo(df, url, tables["eo_jdbc" if s == "batch" else s],
                                    f"{sink}_{s}", rep, commitScope=s)) for s in SCOPES}
    runs["spark_jdbc"] = lambda rep: run_spark_jdbc(df, jdbc, tables["spark_jdbc"])
    runs["raw_copy"] = lambda rep: pg.copy(tables["raw_copy"], data)
    runs["raw_copy_csv"] = lambda rep: pg.copy_csv(tables["raw_copy_csv"], data)
    runs["arrow_noop"] = lambda rep: run_noop(df)

    best = best_of(args.repeat, runs, lambda: counted(pg, tables.values(), args.rows),
                   "append")
    df.unpersist()
    return best


def merge_pg(spark: Any, pg: Pg, args: Any, tag: str, sink: str, add: bool) -> dict[str, float]:
    """Upsert (``add=False``) or accumulate into tables with a primary key on ``id``."""
    mode = "accumulate" if add else "upsert"
    keys = args.rows // 10 if add else None
    url = sa_url(pg.dsn)
    names = [f"{mode}_batch", f"{mode}_task", f"raw_{mode}", f"raw_{mode}_copy"]
    tables = {n: pg.create(f"bench_{n}_{tag}", pk=True) for n in names}
    df = frame(spark, args.rows, keys).cache()
    df.count()
    data = python_rows(args.rows, keys)
    raw_data = data[:args.raw_rows] if args.raw_rows else data
    # What every table holds before a run: the even ids (upsert: half the rows update,
    # half insert), or every key (accumulate: every row adds to an existing one).
    before = ([(i, "", 0.0) for i in range(0, args.rows, 2)] if not add
              else [(k, "", 0.0) for k in range(keys or 0)])
    opts = {"mode": mode, "keys": "id", **({"accumulate": "x"} if add else {})}

    def reset() -> None:
        for t in tables.values():
            pg.truncate(t)
            pg.copy(t, before)

    reset()
    for scope in ("batch", "task"):  # warm-up: the Python workers' imports, the JIT
        run_eo(df, url, tables[f"{mode}_{scope}"], f"{sink}_{mode}_warm_{scope}", 0,
               commitScope=scope, **opts)
    reset()
    print(f"PostgreSQL {mode}: {args.rows} rows with each writer ...", flush=True)
    runs: dict[str, Callable[[int], float]] = {
        f"{mode}_{s}": (lambda rep, s=s: run_eo(df, url, tables[f"{mode}_{s}"],
                                                f"{sink}_{mode}_{s}", rep, commitScope=s,
                                                **opts)) for s in ("batch", "task")}
    runs[f"raw_{mode}"] = lambda rep: pg.upsert_many(tables[f"raw_{mode}"], raw_data, add)
    runs[f"raw_{mode}_copy"] = lambda rep: pg.upsert_copy(tables[f"raw_{mode}_copy"], data, add)

    def check() -> None:
        expect_rows = args.rows if not add else keys
        for name, t in tables.items():
            n = pg.count(t)
            part = name == f"raw_{mode}" and args.raw_rows
            if not part and n != expect_rows:
                raise RuntimeError(f"{t}: {n} rows after {mode}, expected {expect_rows}")
            if add and not part and abs(pg.total_x(t) - sum(r[2] for r in data)) > 1e-3 * n:
                raise RuntimeError(f"{t}: the sum of x is not the rows' sum")
        reset()

    best = best_of(args.repeat, runs, check, mode)
    best[f"raw_{mode}"] *= args.rows / len(raw_data)  # as if it wrote all rows
    df.unpersist()
    return best


def append_mariadb(spark: Any, my: Maria, args: Any, tag: str, sink: str) -> dict[str, float]:
    names = ["mariadb_batch", "mariadb_task", "mariadb_spark_jdbc", "mariadb_raw_load"]
    tables = {n: my.create(f"bench_{n}_{tag}") for n in names}
    df = frame(spark, args.rows).cache()
    df.count()
    jdbc = my.jdbc()
    for scope in ("batch", "task"):
        run_eo(df, my.url, tables[f"mariadb_{scope}"], f"{sink}_maria_warm_{scope}", 0,
               commitScope=scope)
    run_spark_jdbc(df, jdbc, tables["mariadb_spark_jdbc"])
    for t in tables.values():
        my.truncate(t)
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        csv.writer(f, lineterminator="\n").writerows(python_rows(args.rows))
        path = f.name
    print(f"MariaDB append: {args.rows} rows with each writer ...", flush=True)
    runs: dict[str, Callable[[int], float]] = {
        f"mariadb_{s}": (lambda rep, s=s: run_eo(df, my.url, tables[f"mariadb_{s}"],
                                                 f"{sink}_maria_{s}", rep, commitScope=s))
        for s in ("batch", "task")}
    runs["mariadb_spark_jdbc"] = lambda rep: run_spark_jdbc(df, jdbc,
                                                            tables["mariadb_spark_jdbc"])
    runs["mariadb_raw_load"] = lambda rep: my.load(tables["mariadb_raw_load"], path)

    try:
        best = best_of(args.repeat, runs, lambda: counted(my, tables.values(), args.rows),
                       "mariadb")
    finally:
        os.unlink(path)
    df.unpersist()
    return best


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--raw-rows", type=int, default=200_000,
                   help="rows of the executemany upserts (the slowest writers); their rate "
                   "is reported as if they wrote --rows. 0: all")
    p.add_argument("--overhead-batches", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3, help="best of N runs per writer")
    p.add_argument("--skip", action="append", default=[],
                   choices=["upsert", "accumulate", "mariadb"], help="leave a section out")
    args = p.parse_args(argv)
    args.raw_rows = min(args.raw_rows or args.rows, args.rows)

    dsn, server, which = pg_server(os.environ.get("POSTGRES_DSN", DEFAULT_DSN))
    print(f"PostgreSQL: {which}", flush=True)
    tag = uuid.uuid4().hex[:8]
    sink = f"bench_{tag}"
    spark = bench_spark("bench-jdbc", **{"spark.jars": ",".join(jdbc_jars())})
    register_noop(spark)
    pg = Pg(dsn)
    my = None if "mariadb" in args.skip else Maria(os.environ.get("MYSQL_URL", DEFAULT_MYSQL))
    best: dict[str, float] = {}
    overhead: dict[str, tuple[float, float]] = {}
    try:
        best.update(append_pg(spark, pg, args, tag, sink))
        for add in (False, True):
            if ("accumulate" if add else "upsert") not in args.skip:
                best.update(merge_pg(spark, pg, args, tag, sink, add))
        if my is not None:
            best.update(append_mariadb(spark, my, args, tag, sink))
        for scope in SCOPES:
            overhead[scope] = small_batches(dsn, args.overhead_batches,
                                            pg.create(f"bench_over_{scope}_{tag}"),
                                            f"{sink}_over_{scope}", scope)
            print(f"small batches, commitScope={scope}: commit step {overhead[scope][0]:.1f} "
                  f"ms, whole batch {overhead[scope][1]:.1f} ms (median)", flush=True)
    finally:
        pg.drop_all(sink)
        if my is not None:
            my.drop_all(sink)
        spark.stop()
        if server is not None:
            server.destroy()

    n = args.rows
    rate = {k: n / v for k, v in best.items() if k != "arrow_noop"}
    result: dict[str, Any] = {"bench": "jdbc_throughput", "rows": n,
                              "eo_jdbc_rows_per_s": round(rate["eo_jdbc"])}
    for k in sorted(rate):
        result.setdefault(f"{k}_rows_per_s", round(rate[k]))

    def ratio(key: str, ours: str, base: str) -> None:
        if ours in rate and base in rate:
            result[key] = round(rate[ours] / rate[base], 3)

    ratio("ratio_spark_jdbc", "eo_jdbc", "spark_jdbc")
    ratio("ratio_raw_copy", "eo_jdbc", "raw_copy")
    ratio("ratio_raw_copy_csv", "eo_jdbc", "raw_copy_csv")
    for s in ("task", "prepared"):
        ratio(f"{s}_ratio_spark_jdbc", s, "spark_jdbc")
        ratio(f"{s}_ratio_raw_copy", s, "raw_copy")
        ratio(f"{s}_ratio_raw_copy_csv", s, "raw_copy_csv")
    for mode in ("upsert", "accumulate"):
        for s in ("batch", "task"):
            ratio(f"{mode}_{s}_ratio_raw_{mode}", f"{mode}_{s}", f"raw_{mode}")
            ratio(f"{mode}_{s}_ratio_raw_{mode}_copy", f"{mode}_{s}", f"raw_{mode}_copy")
            ratio(f"{mode}_{s}_ratio_spark_jdbc", f"{mode}_{s}", "spark_jdbc")
    for s in ("batch", "task"):
        ratio(f"mariadb_{s}_ratio_mariadb_spark_jdbc", f"mariadb_{s}", "mariadb_spark_jdbc")
        ratio(f"mariadb_{s}_ratio_mariadb_raw_load", f"mariadb_{s}", "mariadb_raw_load")
    result["arrow_noop_s"] = round(best["arrow_noop"], 3)
    for scope, (commit_ms, whole_ms) in overhead.items():
        prefix = "" if scope == "batch" else f"{scope}_"
        result[f"{prefix}commit_overhead_ms"] = round(commit_ms, 2)
        result[f"{scope}_small_batch_ms"] = round(whole_ms, 2)
    result.update({"overhead_batches": args.overhead_batches, "repeat": args.repeat,
                   "raw_rows": args.raw_rows, "postgres_server": which})
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
