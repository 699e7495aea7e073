"""Every DataSource and every foreachBatch callable through a Spark Connect session, in
batch and in streaming, with exact results; ``KafkaWindows`` too.

The server is pyspark's own ``SparkConnectServer`` (``tests/services/spark_cluster.py``),
started once per session with ``local[2]``; the client is
``SparkSession.builder.remote(...)`` in this process, so every driver-side call of the
connectors (schema checks, the inline budget, commits, the windows' planner) runs against a
Connect session, which has no ``sparkContext``, ``_jvm``, ``_jdf`` or ``rdd``: a code path
touching one fails here with ``JVM_ATTRIBUTE_NOT_SUPPORTED``. Streaming ``foreachBatch``
functions run in the server's Python process, with a Connect session of their own.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import announce, assert_exact, read_topic, unavailable
from tests.integration.cluster.conftest import expected_counts, expected_lines
from tests.integration.pipelines.jdbc_wordcount import line
from tests.services.spark_cluster import ConnectServer, pyspark_version

pytestmark = pytest.mark.cluster

LINES = 1000
PER_BATCH = 400  # 3 micro-batches


@pytest.fixture(scope="session")
def connect_server(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    workdir = str(tmp_path_factory.mktemp("spark-connect"))
    try:
        server = ConnectServer(workdir=workdir).start()
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        unavailable("Spark Connect server", str(e))
    announce(request, f"spark-connect: SparkConnectServer (pyspark {pyspark_version()}, "
              f"local[2]) on {server.url} up in {server.started_in:.1f}s, log {server.log_path}")
    try:
        yield server
    finally:
        server.stop()


# pyspark's builder.remote() sets these in os.environ, which switches every later
# SparkSession.builder (the classic ``spark`` fixture, and the pipelines' child processes)
# into Connect mode; they are restored when this module's tests end.
_CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


@pytest.fixture(scope="module")
def connect(connect_server: ConnectServer) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    import connectors

    saved = {k: os.environ.get(k) for k in _CONNECT_ENV}
    session = SparkSession.builder.remote(connect_server.url).getOrCreate()
    try:
        assert type(session).__module__.startswith("pyspark.sql.connect")
        connectors.register(session)
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def lines_topic(kafka_bootstrap: str, new_topic: Any) -> str:
    from connectors.demo.services.kafka import produce_records

    topic = new_topic(partitions=2)
    produce_records(kafka_bootstrap, topic,
                    [(f"k{i}".encode(), line(i).encode(), i % 2) for i in range(LINES)])
    return topic


def table_rows(url: str, table: str, cols: str) -> list[tuple[Any, ...]]:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        t = sa.table(table, *(sa.column(c) for c in cols.split(",")))
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.select(*t.c))]
    finally:
        engine.dispose()


def file_lines(path: str) -> list[str]:
    import pyarrow.parquet as pq

    from connectors.files.sink import FileSink

    out: list[str] = []
    for f in FileSink(path).committed_files():
        out.extend(pq.read_table(f).column("line").to_pylist())
    return out


def kafka_values(bootstrap: str, topic: str) -> list[str]:
    return [(m.value() or b"").decode() for m in read_topic(bootstrap, topic)]


def words(df: Any) -> Any:
    from pyspark.sql import functions as F  # noqa: N812

    return df.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))


def counts(df: Any) -> Any:
    from pyspark.sql import functions as F  # noqa: N812

    return words(df).groupBy("word").agg(F.count("*").alias("n"))


class Outputs:
    """Fresh names of one test's outputs: a PostgreSQL table, a topic, a directory."""

    def __init__(self, bootstrap: str, pg_url: str, pg_table: Any, new_topic: Any,
                 tmp: Path) -> None:
        self.bootstrap, self.pg_url, self.tmp = bootstrap, pg_url, tmp
        self._table, self._topic = pg_table, new_topic

    def table(self) -> str:
        return str(self._table("cx"))

    def topic(self) -> str:
        return str(self._topic(partitions=2, prefix="cx"))

    def path(self, name: str) -> str:
        return str(self.tmp / f"{name}-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def outputs(kafka_bootstrap: str, postgres_url: str, pg_table: Any, new_topic: Any,
            tmp_path: Path) -> Outputs:
    return Outputs(kafka_bootstrap, postgres_url, pg_table, new_topic, tmp_path)


def source(connect: Any, bootstrap: str, topic: str, stream: bool, **extra: Any) -> Any:
    reader = connect.readStream if stream else connect.read
    reader = (reader.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    if stream:
        reader = reader.option("maxOffsetsPerTrigger", str(PER_BATCH))
    for k, v in extra.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_and_every_datasource_batch_write(connect, lines_topic, outputs) -> None:
    began = time.monotonic()
    df = source(connect, outputs.bootstrap, lines_topic, stream=False)
    assert_exact([r.value.decode() for r in df.select("value").collect()], expected_lines(LINES))

    table = outputs.table()
    (words(df).selectExpr("word", "cast(1 as bigint) as n").write.format("eo_jdbc")
     .option("url", outputs.pg_url).option("table", table).option("sink_id", f"s_{table}")
     .option("createTable", "true").option("mode", "accumulate").option("keys", "word")
     .option("accumulate", "n").option("batchId", "0").mode("append").save())
    topic, path = outputs.topic(), outputs.path("files")
    (df.select("key", "value").write.format("eo_kafka")
     .option("kafka.bootstrap.servers", outputs.bootstrap).option("topic", topic)
     .option("sink_id", f"s-{topic}").option("walPath", outputs.path("wal"))
     .option("batchId", "0").mode("append").save())
    (df.selectExpr("cast(value as string) as line").write.format("eo_files")
     .option("path", path).option("batchId", "0").mode("append").save())

    assert Counter(dict(table_rows(outputs.pg_url, table, "word,n"))) == expected_counts(LINES)
    assert_exact(kafka_values(outputs.bootstrap, topic), expected_lines(LINES), what="eo_kafka")
    assert_exact(file_lines(path), expected_lines(LINES), what="eo_files")
    _announce_time("batch DataSources over Connect", began)


def test_foreachbatch_callables_on_a_batch_dataframe(connect, lines_topic, outputs) -> None:
    from connectors import FileSink, JdbcSink, KafkaSink

    began = time.monotonic()
    df = source(connect, outputs.bootstrap, lines_topic, stream=False)
    table, topic, path = outputs.table(), outputs.topic(), outputs.path("files")
    jdbc = JdbcSink(outputs.pg_url, table, f"s_{table}", mode="accumulate", keys=["word"],
                    accumulate=["n"], create_table=True)
    kafka = KafkaSink(bootstrap_servers=outputs.bootstrap, topic=topic, sink_id=f"s-{topic}",
                      wal_path=outputs.path("wal"))
    files = FileSink(path)
    for _ in range(2):  # the second write of batch 7 is a replay: a no-op for every sink
        jdbc.write(counts(df), 7)
        kafka.write(df.select("key", "value"), 7)
        files.write(df.selectExpr("cast(value as string) as line"), 7)

    assert Counter(dict(table_rows(outputs.pg_url, table, "word,n"))) == expected_counts(LINES)
    assert_exact(kafka_values(outputs.bootstrap, topic), expected_lines(LINES), what="KafkaSink")
    assert_exact(file_lines(path), expected_lines(LINES), what="FileSink")
    _announce_time("foreachBatch callables on a Connect DataFrame", began)


def run_stream(writer: Any, checkpoint: str) -> None:
    query = (writer.option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    exc = query.exception()
    assert exc is None, exc
    assert not query.isActive


def test_streaming_into_every_datasource(connect, lines_topic, outputs) -> None:
    began = time.monotonic()
    table, topic, path = outputs.table(), outputs.topic(), outputs.path("files")

    def stream() -> Any:
        return source(connect, outputs.bootstrap, lines_topic, stream=True,
                      walPath=outputs.path("source-wal"))

    run_stream(words(stream()).selectExpr("word", "cast(1 as bigint) as n")
               .writeStream.format("eo_jdbc").option("url", outputs.pg_url)
               .option("table", table).option("sink_id", f"s_{table}")
               .option("createTable", "true").option("mode", "accumulate")
               .option("keys", "word").option("accumulate", "n"), outputs.path("chk"))
    run_stream(stream().select("key", "value").writeStream.format("eo_kafka")
               .option("kafka.bootstrap.servers", outputs.bootstrap).option("topic", topic)
               .option("sink_id", f"s-{topic}").option("walPath", outputs.path("wal"))
               .option("deterministicOrder", "true"), outputs.path("chk"))
    run_stream(stream().selectExpr("cast(value as string) as line").writeStream
               .format("eo_files").option("path", path), outputs.path("chk"))

    assert Counter(dict(table_rows(outputs.pg_url, table, "word,n"))) == expected_counts(LINES)
    assert_exact(kafka_values(outputs.bootstrap, topic), expected_lines(LINES), what="eo_kafka")
    assert_exact(file_lines(path), expected_lines(LINES), what="eo_files")
    _announce_time("streaming DataSources over Connect", began)


def test_streaming_foreachbatch_with_every_callable(connect, lines_topic, outputs) -> None:
    from connectors import FileSink, JdbcSink, KafkaSink

    began = time.monotonic()
    table, topic, path = outputs.table(), outputs.topic(), outputs.path("files")

    def stream() -> Any:
        return source(connect, outputs.bootstrap, lines_topic, stream=True)

    # The sinks themselves are the foreachBatch functions: (df, batch_id) -> None.
    run_stream(stream().selectExpr("cast(key as string) as k", "cast(value as string) as line")
               .writeStream.foreachBatch(JdbcSink(outputs.pg_url, table, f"s_{table}",
                                                  create_table=True)), outputs.path("chk"))
    run_stream(stream().select("key", "value").writeStream.foreachBatch(
        KafkaSink(bootstrap_servers=outputs.bootstrap, topic=topic, sink_id=f"s-{topic}",
                  wal_path=outputs.path("wal"))), outputs.path("chk"))
    run_stream(stream().selectExpr("cast(value as string) as line").writeStream
               .foreachBatch(FileSink(path)), outputs.path("chk"))

    rows = table_rows(outputs.pg_url, table, "k,line")
    assert_exact(rows, [(f"k{i}", line(i)) for i in range(LINES)], what="JdbcSink")
    assert_exact(kafka_values(outputs.bootstrap, topic), expected_lines(LINES), what="KafkaSink")
    assert_exact(file_lines(path), expected_lines(LINES), what="FileSink")
    _announce_time("streaming foreachBatch callables over Connect", began)


def test_kafka_windows_over_connect(connect, lines_topic, outputs) -> None:
    from connectors import JdbcSink, KafkaWindows

    began = time.monotonic()
    table = outputs.table()
    sink = JdbcSink(outputs.pg_url, table, f"s_{table}", mode="accumulate", keys=["word"],
                    accumulate=["n"], create_table=True)
    wal = outputs.path("windows-wal")
    options = {"kafka.bootstrap.servers": outputs.bootstrap, "subscribe": lines_topic,
               "maxOffsetsPerTrigger": PER_BATCH}
    seen = []
    for w in KafkaWindows(connect, walPath=wal, **options):
        sink.write(counts(w.df), w.window_id)
        seen.append(w.window_id)
    assert seen == [0, 1, 2]
    assert KafkaWindows(connect, walPath=wal, **options).next() is None
    assert Counter(dict(table_rows(outputs.pg_url, table, "word,n"))) == expected_counts(LINES)
    _announce_time("KafkaWindows over Connect", began)


def _announce_time(what: str, began: float) -> None:
    import logging

    logging.getLogger("tests.services").info("%s: exact in %.1fs", what,
                                             time.monotonic() - began)
