"""Proves the service fixtures are real: a broker, PostgreSQL and Spark, not skipped."""

from __future__ import annotations

import psycopg
from psycopg import sql

from connectors.demo.services.kafka import produce_records
from tests.helpers import assert_exact, read_topic


def test_kafka_roundtrip(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=2)
    records = [(str(i).encode(), f"v{i}".encode(), i % 2) for i in range(1000)]
    counts = produce_records(kafka_bootstrap, topic, records)
    assert counts == {0: 500, 1: 500}
    got = read_topic(kafka_bootstrap, topic)
    assert_exact([m.value() for m in got], [v for _, v, _ in records], "topic values")

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "smoke"})
    try:
        assert [c.get_watermark_offsets(TopicPartition(topic, p))[1] for p in (0, 1)] == [500, 500]
    finally:
        c.close()


def test_postgres_roundtrip(postgres_dsn, pg_table):
    table = pg_table("smoke")
    with psycopg.connect(postgres_dsn) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int primary key, v text)").format(
            sql.Identifier(table)))
        with conn.cursor().copy(sql.SQL("COPY {} (id, v) FROM STDIN").format(
                sql.Identifier(table))) as copy:
            for i in range(100):
                copy.write_row((i, f"v{i}"))
        conn.commit()
        rows = conn.execute(sql.SQL("SELECT count(*), sum(id) FROM {}").format(
            sql.Identifier(table))).fetchone()
    assert rows == (100, sum(range(100)))


def test_spark_streams_a_python_datasource(spark, tmp_path):
    """A trivial streaming query over a Python DataSource runs to completion."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class Counter(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def prepareForTriggerAvailableNow(self):
            pass

        def initialOffset(self):
            return {"n": 0}

        def latestOffset(self, start, limit):
            return {"n": min(start["n"] + 10, 30)}

        def partitions(self, start, end):
            return [InputPartition((start["n"], end["n"]))]

        def read(self, partition):
            lo, hi = partition.value
            for i in range(lo, hi):
                yield (i,)

    class CounterSource(DataSource):
        @classmethod
        def name(cls):
            return "smoke_counter"

        def schema(self):
            return "n int"

        def streamReader(self, schema):
            return Counter()

    spark.dataSource.register(CounterSource)
    q = (
        spark.readStream.format("smoke_counter").load()
        .writeStream.format("memory").queryName("smoke_counter_out")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    got = [r.n for r in spark.sql("select n from smoke_counter_out").collect()]
    assert sorted(got) == list(range(30))


def test_register_settles_each_data_source_environment_map(spark):
    """``connectors.register`` puts the keys Spark's streaming source runner adds at query
    start into each data source's shared environment map, while one thread registers them
    (docs/deploying.md, "Starting many queries at once"): a query's start then only replaces
    values and never restructures the map another query's tasks are serialized from."""
    import connectors
    from connectors.spark.datasources import _RUNNER_ENVIRONMENT

    connectors.register(spark)
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    for name in ("eo_kafka", "eo_jdbc", "eo_files"):
        env = manager.lookupDataSource(name).dataSourceCls().envVars()
        assert all(env.containsKey(k) for k in _RUNNER_ENVIRONMENT), (name, dict(env))
