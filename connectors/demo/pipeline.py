"""The demo's pipeline process: ``eo_kafka`` -> word count per micro-batch -> three sinks.

Run by ``connectors.demo`` as ``python -m connectors.demo.pipeline '<json config>'``; it is
SIGKILLed and restarted from its checkpoint, and must still deliver every count once.
The ``read_*_counts`` functions are the demo's independent verification readers.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any


def build_sinks(cfg: dict[str, Any]) -> tuple[Any, Any, Any]:
    from connectors.files.sink import FileSink
    from connectors.jdbc.sink import JdbcSink
    from connectors.kafka.sink import KafkaSink

    jdbc = JdbcSink(
        url=cfg["db_url"],
        table=cfg["table"],
        sink_id=cfg["sink_id"],
        mode="accumulate",
        keys=["word"],
        accumulate=["count"],
        create_table=True,
    )
    avro: dict[str, Any] = {}
    if cfg.get("format") == "avro":
        # each count an Avro record (word, count) in the Confluent wire format; the schema
        # of the column's type registered under <out_topic>-value on the first batch
        avro = {"value_format": "avro", "auto_register": True,
                "schema_registry": {"url": cfg["registry_url"]}}
    kafka = KafkaSink(
        bootstrap_servers=cfg["bootstrap"],
        topic=cfg["out_topic"],
        sink_id=cfg["sink_id"],
        wal_path=cfg["wal"] + "/kafka-sink",
        **avro,
    )
    files = FileSink(path=cfg["files"], format="parquet", sink_id=cfg["sink_id"])
    return jdbc, kafka, files


def naive_accumulate(cfg: dict[str, Any], rows: list[tuple[str, int]], batch_id: int) -> None:
    """Test-only: ``count = count + new`` with NO exactly-once protection (no batch record).

    Used by ``--naive-jdbc`` to prove the demo's verification detects double counting.
    """
    import sqlalchemy as sa

    from connectors.core import failpoints

    engine = sa.create_engine(cfg["db_url"])
    md = sa.MetaData()
    table = sa.Table(cfg["table"], md, sa.Column("word", sa.String(64), primary_key=True),
                     sa.Column("count", sa.BigInteger, nullable=False))
    md.create_all(engine)
    with engine.begin() as conn:
        for word, n in rows:
            updated = conn.execute(
                sa.update(table).where(table.c.word == word).values(count=table.c["count"] + n)
            ).rowcount
            if not updated:
                conn.execute(sa.insert(table).values(word=word, count=n))
    engine.dispose()
    failpoints.hit("jdbc.after_commit", batch_id)


def serve_metrics(spark: Any, port: int | None) -> None:
    """The metrics endpoint the demo announced (docs/monitoring.md). A port another process
    holds costs the demo its metrics, never its run."""
    if not port:
        return
    from connectors import monitoring

    try:
        server = monitoring.serve(spark, port=port)
        print(f"metrics: {server.url}", flush=True)
    except OSError as e:
        print(f"metrics: could not serve on port {port}: {e}", flush=True)


def main(cfg: dict[str, Any]) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812

    import connectors

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("eo-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if cfg.get("scratch"):
        # Spark's scratch (spark-*, blockmgr-*, artifacts-*) and the JVM's temporary files
        # (lz4-java's liblz4-java-*.so) under the demo's work directory: a SIGKILLed run
        # leaves them there, and the demo removes them at its end; no JVM perf data in
        # /tmp/hsperfdata_<user> (connectors.demo.runs.scratch_env)
        scratch = os.path.abspath(cfg["scratch"])
        os.makedirs(os.path.join(scratch, "jvm"), exist_ok=True)
        builder = (builder.config("spark.local.dir", os.path.join(scratch, "spark"))
                   .config("spark.driver.extraJavaOptions",
                           f"-Djava.io.tmpdir={os.path.join(scratch, 'jvm')} "
                           "-XX:-UsePerfData"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    connectors.register(spark)
    serve_metrics(spark, cfg.get("metrics_port"))
    jdbc, kafka, files = build_sinks(cfg)

    reader = (
        spark.readStream.format("eo_kafka")
        .option("kafka.bootstrap.servers", cfg["bootstrap"])
        .option("subscribe", cfg["in_topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(cfg["batch_size"]))
        .option("walPath", cfg["wal"] + "/source")
        .option("kafka.group.id", cfg["sink_id"])
    )
    avro = cfg.get("format") == "avro"
    if avro:  # value: struct<line: string>, decoded with the registry's schema
        reader = (reader.option("valueFormat", "avro")
                  .option("schemaRegistry.url", cfg["registry_url"]))
    lines = reader.load()
    text = F.col("value.line") if avro else F.col("value").cast("string")
    words = lines.select(F.explode(F.split(text, " ")).alias("word"))

    def per_batch(df: Any, batch_id: int) -> None:
        counts = df.groupBy("word").agg(F.count(F.lit(1)).alias("count")).persist()
        try:
            if cfg.get("naive_jdbc"):
                naive_accumulate(cfg, [(r.word, r["count"]) for r in counts.collect()], batch_id)
            else:
                jdbc.write(counts, batch_id)
            value = F.struct("word", "count") if avro else F.to_json(
                F.struct("word", "count")).cast("binary")
            kafka.write(
                counts.select(F.col("word").cast("binary").alias("key"), value.alias("value")),
                batch_id,
            )
            files.write(counts.withColumn("batch_id", F.lit(batch_id)), batch_id)
        finally:
            counts.unpersist()

    query = (
        words.writeStream.foreachBatch(per_batch)
        .option("checkpointLocation", cfg["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


# -- verification readers (independent of the sinks' own bookkeeping) --------------------------
def read_jdbc_counts(cfg: dict[str, Any]) -> tuple[Counter[str], int]:
    import sqlalchemy as sa

    engine = sa.create_engine(cfg["db_url"])
    try:
        table = sa.table(cfg["table"], sa.column("word"), sa.column("count"))
        with engine.connect() as conn:
            rows = conn.execute(sa.select(table.c.word, table.c["count"])).all()
    finally:
        engine.dispose()
    return Counter({w: int(n) for w, n in rows}), len(rows)


def read_kafka_counts(cfg: dict[str, Any]) -> tuple[Counter[str], int]:
    """Sum per-batch counts from the output topic, read to partition EOF, read_committed."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from connectors.kafka.common import LIBRDKAFKA_LOG

    consumer = Consumer({
        "bootstrap.servers": cfg["bootstrap"], "group.id": f"demo-verify-{cfg['sink_id']}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "logger": LIBRDKAFKA_LOG,  # librdkafka's lines stay out of the demo's console
    })

    topic = cfg["out_topic"]
    decode = _avro_deserializer(cfg["registry_url"], topic) if cfg.get("format") == "avro" \
        else (lambda raw: json.loads(raw or b"{}"))
    parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    total: Counter[str] = Counter()
    rows, done = 0, set[int]()
    try:
        while len(done) < len(parts):
            for m in consumer.consume(1000, 1.0):
                err = m.error()
                if err is None:
                    doc = decode(m.value())
                    total[doc["word"]] += int(doc["count"])
                    rows += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    done.add(m.partition() or 0)
                else:
                    raise RuntimeError(str(err))
    finally:
        consumer.close()
    return total, rows


def _avro_deserializer(registry_url: str, topic: str) -> Any:
    """confluent-kafka's own ``AvroDeserializer``: a client we did not write reads what the
    sink wrote."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)
    return lambda raw: deserializer(raw, context)


def read_files_counts(cfg: dict[str, Any]) -> tuple[Counter[str], int]:
    import os

    import pyarrow.dataset as ds

    if not os.path.isdir(cfg["files"]):
        return Counter(), 0
    table = ds.dataset(cfg["files"], format="parquet").to_table(columns=["word", "count"])
    total: Counter[str] = Counter()
    for w, n in zip(table.column("word").to_pylist(), table.column("count").to_pylist(),
                    strict=True):
        total[w] += int(n)
    return total, table.num_rows


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
