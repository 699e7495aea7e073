"""Throughput of the ``eo_jdbc`` sink into PostgreSQL, against Spark's JDBC writer and raw COPY.

    python bench/jdbc_throughput.py --rows 1000000

The rows are ``(id bigint, s text, x double precision)`` with ``s`` a 20-character string.
Three writers, in one run, on the same PostgreSQL (``POSTGRES_DSN`` or the test tier's
``postgresql://eo:eo@127.0.0.1:5432/eo_test`` that scripts/run-tests sets up), each into a
fresh table:

- ours: ``df.write.format("eo_jdbc")`` (append, batch id 0): 2 Spark tasks COPY into the
  staging table (WAL-logged: ``durableStaging`` defaults to true), then the driver's one
  commit transaction (``FOR UPDATE`` check, ``INSERT ... SELECT``, commit row, cleanup);
- ``spark_jdbc``: ``df.write.jdbc`` with the PostgreSQL JDBC driver (``org.postgresql``
  from Maven Central, the ``postgresql-jdbc`` profile of connectors/demo/services/pom.xml,
  passed with ``spark.jars``), default options;
- ``raw_copy``: one psycopg ``COPY ... FROM STDIN`` of the same rows, already in memory as
  Python tuples, with ``copy.write_row`` (psycopg's documented COPY idiom), no Spark. Also
  reported: ``raw_copy_csv``, the same COPY fed with a CSV block rendered beforehand (not
  timed): the wire-speed ceiling of COPY on this machine.

All three write rows that already exist: the DataFrame (``spark.range`` -> 3 columns, 2
partitions) is cached and counted before the Spark writers are timed, as the raw COPY's
Python tuples are built before it is timed. Each figure is thus a writer's rate, not a
generator's. ``commit_overhead_ms`` is the median time of the driver's commit
step of one small batch (2 writers x 50 rows, already staged), over 100 batches: what
exactly-once costs per micro-batch on top of writing the rows. ``arrow_noop_s`` is the time
of a Python DataSource writer that only counts its rows: the Spark job plus the JVM ->
Python Arrow transfer, the floor under any Python writer (``eo_jdbc`` included). Each
throughput figure is the best of ``--repeat`` interleaved runs (default 3), after one
untimed full-size warm-up run of each Spark writer (JIT), because the machine may be shared.

Ends with one line: ``RESULT {json}`` (bench/README.md, "The RESULT line").
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from _common import bench_spark, register_noop, run_noop  # noqa: E402

DEFAULT_DSN = "postgresql://eo:eo@127.0.0.1:5432/eo_test"


def jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver: ``POSTGRES_JDBC_JAR``, else resolved from Maven Central
    (cached), else a Debian ``libpostgresql-jdbc-java``."""
    if os.environ.get("POSTGRES_JDBC_JAR"):
        return os.environ["POSTGRES_JDBC_JAR"]
    from connectors.core.errors import ConnectorError
    from connectors.demo.services import maven

    try:
        found = sorted(glob.glob(str(maven.resolve("postgresql-jdbc") / "postgresql-*.jar")))
    except ConnectorError as e:
        print(f"no PostgreSQL JDBC driver from Maven Central: {e}", file=sys.stderr)
        found = []
    for pattern in ("/usr/share/java/postgresql.jar", "/usr/share/java/postgresql-*.jar"):
        found += sorted(glob.glob(pattern))
    return found[0] if found else None


def build_spark(jar: str | None) -> Any:
    # The JDBC driver jar is for Spark's baseline writer; it costs ours nothing.
    return bench_spark("bench-jdbc", **({"spark.jars": jar} if jar else {}))


def frame(spark: Any, rows: int) -> Any:
    return spark.range(0, rows, numPartitions=2).selectExpr(
        "id", "substr(sha2(cast(id as string), 256), 1, 20) as s", "cast(id as double) * 1.5 as x"
    )


def python_rows(rows: int) -> list[tuple[int, str, float]]:
    return [(i, hashlib.sha256(str(i).encode()).hexdigest()[:20], i * 1.5) for i in range(rows)]


def sa_url(dsn: str) -> str:
    return "postgresql+psycopg://" + dsn.split("://", 1)[1]


def jdbc_url(dsn: str) -> tuple[str, dict[str, str]]:
    import sqlalchemy as sa

    u = sa.engine.make_url(sa_url(dsn))
    props = {"driver": "org.postgresql.Driver", "user": u.username or "postgres"}
    if u.password:
        props["password"] = u.password
    return f"jdbc:postgresql://{u.host or '127.0.0.1'}:{u.port or 5432}/{u.database}", props


def create(conn: Any, table: str) -> None:
    from psycopg import sql

    conn.execute(sql.SQL("CREATE TABLE {} (id bigint, s text, x double precision)")
                 .format(sql.Identifier(table)))


def count(conn: Any, table: str) -> int:
    from psycopg import sql

    return int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
               .fetchone()[0])


def drop(conn: Any, *tables: str) -> None:
    from psycopg import sql

    for t in tables:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(t)))


def run_eo_jdbc(df: Any, dsn: str, table: str, sink_id: str, batch_id: int = 0) -> float:
    started = time.perf_counter()
    (df.write.format("eo_jdbc").mode("append").option("url", sa_url(dsn))
     .option("table", table).option("sink_id", sink_id).option("batchId", batch_id).save())
    return time.perf_counter() - started


def run_spark_jdbc(df: Any, dsn: str, table: str) -> float:
    url, props = jdbc_url(dsn)
    started = time.perf_counter()
    df.write.jdbc(url, table, mode="append", properties=props)
    return time.perf_counter() - started


def run_raw_copy(conn: Any, data: list[tuple[int, str, float]], table: str) -> float:
    from psycopg import sql

    stmt = sql.SQL("COPY {} (id, s, x) FROM STDIN").format(sql.Identifier(table))
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur, cur.copy(stmt) as copy:
        for row in data:
            copy.write_row(row)
    return time.perf_counter() - started


def run_raw_copy_csv(conn: Any, data: list[tuple[int, str, float]], table: str) -> float:
    import csv

    from psycopg import sql

    buf = io.StringIO()
    csv.writer(buf).writerows(data)
    block = buf.getvalue().encode()
    stmt = sql.SQL("COPY {} (id, s, x) FROM STDIN (FORMAT csv)").format(sql.Identifier(table))
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur, cur.copy(stmt) as copy:
        for i in range(0, len(block), 1 << 20):
            copy.write(block[i:i + (1 << 20)])
    return time.perf_counter() - started


def measure(df: Any, dsn: str, conn: Any, data: list[tuple[int, str, float]], rows: int,
            repeat: int, tables: tuple[str, str, str, str], sink_id: str) -> dict[str, float]:
    """Each writer's best time of ``repeat`` interleaved runs (the machine may be shared)."""
    t_ours, t_spark, t_raw, t_csv = tables
    best: dict[str, float] = {}
    for rep in range(repeat):
        runs = {
            "eo_jdbc": lambda rep=rep: run_eo_jdbc(df, dsn, t_ours, sink_id, rep),
            "spark_jdbc": lambda rep=rep: run_spark_jdbc(df, dsn, t_spark),
            "raw_copy": lambda rep=rep: run_raw_copy(conn, data, t_raw),
            "raw_copy_csv": lambda rep=rep: run_raw_copy_csv(conn, data, t_csv),
            "arrow_noop": lambda rep=rep: run_noop(df),
        }
        for name, run in runs.items():
            secs = run()
            print(f"run {rep + 1}: {name:<13} {secs:.2f}s", flush=True)
            best[name] = min(best.get(name, secs), secs)
        for t in tables:
            n = count(conn, t)
            if n != rows:
                raise RuntimeError(f"{t}: {n} rows written, expected {rows}")
            conn.execute("TRUNCATE " + t)  # noqa: S608 - our own generated names
    return best


def commit_overhead_ms(dsn: str, batches: int, table: str, sink_id: str) -> tuple[float, float]:
    import pyarrow as pa

    from connectors.core.sink import TaskInfo
    from connectors.jdbc.sink import JdbcSink

    schema = pa.schema([("id", pa.int64()), ("s", pa.string()), ("x", pa.float64())])
    sink = JdbcSink(sa_url(dsn), table, sink_id, create_table=True)
    sink.check_schema(schema)
    times = []
    for b in range(batches):
        msgs = []
        for w in (0, 1):
            ids = list(range((b * 2 + w) * 50, (b * 2 + w + 1) * 50))
            batch = pa.record_batch({"id": ids, "s": [f"{i:020d}" for i in ids],
                                     "x": [i * 1.5 for i in ids]}, schema=schema)
            msgs.append(sink.stage(TaskInfo(b, w), iter([batch])))
        started = time.perf_counter()
        sink.commit(b, msgs)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--overhead-batches", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3, help="best of N runs per writer")
    args = p.parse_args(argv)

    import psycopg

    dsn = os.environ.get("POSTGRES_DSN", DEFAULT_DSN)
    jar = jdbc_jar()
    if jar is None:
        print("PostgreSQL JDBC driver jar not found: apt-get install libpostgresql-jdbc-java "
              "(or set POSTGRES_JDBC_JAR)", file=sys.stderr)
        return 2
    tag = uuid.uuid4().hex[:8]
    t_ours, t_spark, t_raw, t_csv, t_over = (f"bench_{n}_{tag}" for n in
                                             ("eo", "spark", "raw", "csv", "over"))
    sink_id = f"bench_{tag}"
    spark = build_spark(jar)
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        for t in (t_ours, t_spark, t_raw, t_csv):
            create(conn, t)
        register_noop(spark)
        df = frame(spark, args.rows).cache()
        df.count()
        # Warm-up, not timed: one full-size run of each Spark writer, so the JVM's JIT has
        # compiled both paths (Arrow export for ours, JDBC batching for Spark's) before
        # anything is measured; a 10k-row warm-up left the first timed runs of both writers
        # 30-60% slower. Also loads the JDBC driver and the Python workers' imports.
        run_eo_jdbc(df, dsn, t_ours, sink_id + "_warm")
        run_spark_jdbc(df, dsn, t_spark)
        run_noop(df)
        conn.execute("TRUNCATE " + t_ours + ", " + t_spark)  # noqa: S608 - our own names
        print(f"writing {args.rows} rows with each writer ...", flush=True)

        best = measure(df, dsn, conn, python_rows(args.rows), args.rows, args.repeat,
                       (t_ours, t_spark, t_raw, t_csv), sink_id)
        df.unpersist()
        secs_ours, secs_spark = best["eo_jdbc"], best["spark_jdbc"]
        secs_raw, secs_csv = best["raw_copy"], best["raw_copy_csv"]
        median_ms, p95_ms = commit_overhead_ms(dsn, args.overhead_batches, t_over,
                                               sink_id + "_over")
        print(f"commit overhead: median {median_ms:.1f} ms, p95 {p95_ms:.1f} ms per batch",
              flush=True)
    finally:
        stages = [f"eo_stage_{sink_id}{s}" for s in ("", "_warm", "_over")]
        drop(conn, t_ours, t_spark, t_raw, t_csv, t_over, *stages,
             *[f"{t}_blocks" for t in stages])
        conn.execute("DELETE FROM eo_sink_commits WHERE sink_id LIKE 'bench_%'")
        conn.close()
        spark.stop()

    ours = args.rows / secs_ours
    spark_rate = args.rows / secs_spark
    raw = args.rows / secs_raw
    csv_rate = args.rows / secs_csv
    result = {
        "bench": "jdbc_throughput",
        "rows": args.rows,
        "eo_jdbc_rows_per_s": round(ours),
        "spark_jdbc_rows_per_s": round(spark_rate),
        "raw_copy_rows_per_s": round(raw),
        "ratio_spark_jdbc": round(ours / spark_rate, 3),
        "ratio_raw_copy": round(ours / raw, 3),
        "raw_copy_csv_rows_per_s": round(csv_rate),
        "ratio_raw_copy_csv": round(ours / csv_rate, 3),
        "arrow_noop_s": round(best["arrow_noop"], 3),
        "commit_overhead_ms": round(median_ms, 2),
        "commit_overhead_p95_ms": round(p95_ms, 2),
        "overhead_batches": args.overhead_batches,
        "repeat": args.repeat,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
