"""The cluster tests' driver: one Spark application on the standalone cluster that runs the
jobs named in its JSON config, one after the other, with every piece of shared state on HDFS.

``python -m tests.integration.cluster.pipelines.cluster_app '<json>'``; the config holds
``conf`` (the application's Spark settings: the cluster's master URL, executor env),
``bootstrap``, ``topic`` (lines ``line(i)``, 2 partitions), ``per_batch``, ``hdfs``
(``hdfs://127.0.0.1:<rpc>``), ``webhdfs`` (``http://127.0.0.1:<http>``), ``base`` (this
test's HDFS directory), ``pg_url``, ``prefix`` (of tables, topics and sink ids) and
``jobs``:

- ``wordcount``: ``eo_kafka`` -> words -> ``eo_jdbc`` accumulate (PostgreSQL);
- ``kafka_rk`` / ``kafka_txn``: ``eo_kafka`` -> ``eo_kafka`` sink, recovery keys /
  transactional, into topic ``<prefix>-<job>``;
- ``files``: ``eo_kafka`` -> ``eo_files`` (parquet on HDFS);
- ``windows``: ``KafkaWindows`` -> ``JdbcSink`` as a scheduled batch job, run twice (the
  first run stops after two windows, leaving the second uncommitted, to be replayed);
- ``faults``: ``eo_kafka`` -> ``foreachBatch``: word counts to ``JdbcSink`` (accumulate),
  the lines to ``KafkaSink`` and ``FileSink``, through the holding sinks of
  :mod:`holding` (which hold one task open when ``EO_TEST_HOLD`` says so).

Checkpoints at ``<hdfs><base>/chk/<job>``, WALs at ``webhdfs://.../<base>/wal/<job>/...``,
files at ``<hdfs><base>/files/<job>``. Prints ``APP <application id>``, ``HDFS <url>`` for
each location, and ``JOB DONE <job>``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812


def paths(cfg: dict[str, Any], job: str) -> dict[str, str]:
    webhdfs = "webhdfs://" + cfg["webhdfs"].split("://", 1)[1].rstrip("/")
    base = cfg["base"]
    if cfg.get("s3"):  # our state and output on S3; Spark's checkpoint stays on HDFS
        s3 = f"s3://{cfg['s3']['bucket']}{base}"
        return {"checkpoint": f"{cfg['hdfs']}{base}/chk/{job}",
                "source_wal": f"{s3}/wal/{job}/source", "sink_wal": f"{s3}/wal/{job}/sink",
                "files": f"{s3}/files/{job}"}
    return {
        "checkpoint": f"{cfg['hdfs']}{base}/chk/{job}",
        "source_wal": f"{webhdfs}{base}/wal/{job}/source",
        "sink_wal": f"{webhdfs}{base}/wal/{job}/sink",
        "files": f"{cfg['hdfs']}{base}/files/{job}",
    }


def storage_options(cfg: dict[str, Any]) -> dict[str, str] | None:
    """The ``storage.*`` options of an S3 run (they travel to the executors with the sinks
    and the source options; no credentials in the cluster's environment)."""
    return dict(cfg["s3"]["options"]) if cfg.get("s3") else None


def names(cfg: dict[str, Any], job: str) -> dict[str, str]:
    p = cfg["prefix"]
    return {"table": f"{p}_{job}", "topic": f"{p}-{job}", "sink_id": f"{p}-{job}"}


def lines_stream(spark: SparkSession, cfg: dict[str, Any], job: str) -> DataFrame:
    reader = (
        spark.readStream.format("eo_kafka")
        .option("kafka.bootstrap.servers", cfg["bootstrap"])
        .option("subscribe", cfg["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(cfg["per_batch"]))
        .option("walPath", paths(cfg, job)["source_wal"])
    )
    for key, value in (storage_options(cfg) or {}).items():
        reader = reader.option(f"storage.{key}", value)
    return reader.load()


def words_of(lines: DataFrame) -> DataFrame:
    return lines.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))


def run_query(writer: Any, cfg: dict[str, Any], job: str) -> None:
    where = paths(cfg, job)
    print("HDFS checkpoint", where["checkpoint"], flush=True)
    query = (writer.option("checkpointLocation", where["checkpoint"])
             .trigger(availableNow=True).start())
    query.awaitTermination()
    for progress in query.recentProgress:
        print("BATCH", job, progress.batchId, progress.numInputRows, flush=True)


def wordcount(spark: SparkSession, cfg: dict[str, Any], job: str) -> None:
    n = names(cfg, job)
    words = words_of(lines_stream(spark, cfg, job))
    writer = (
        words.select("word", F.lit(1).cast("long").alias("n")).repartition(2)
        .writeStream.format("eo_jdbc")
        .option("url", cfg["pg_url"]).option("table", n["table"])
        .option("sink_id", n["sink_id"]).option("createTable", "true")
        .option("mode", "accumulate").option("keys", "word").option("accumulate", "n")
    )
    run_query(writer, cfg, job)


def kafka_copy(spark: SparkSession, cfg: dict[str, Any], job: str) -> None:
    n, where = names(cfg, job), paths(cfg, job)
    print("HDFS sink walPath", where["sink_wal"], flush=True)
    out = lines_stream(spark, cfg, job).selectExpr(
        "key", "concat(cast('B:' as binary), value) as value")
    writer = (
        out.writeStream.format("eo_kafka")
        .option("kafka.bootstrap.servers", cfg["bootstrap"])
        .option("topic", n["topic"]).option("sink_id", n["sink_id"])
        .option("walPath", where["sink_wal"])
        .option("transactional", str(job == "kafka_txn").lower())
        .option("deterministicOrder", "true")
    )
    run_query(writer, cfg, job)


def files(spark: SparkSession, cfg: dict[str, Any], job: str) -> None:
    n, where = names(cfg, job), paths(cfg, job)
    print("HDFS files", where["files"], flush=True)
    out = lines_stream(spark, cfg, job).selectExpr(
        "cast(partition as int) as part", "offset", "cast(value as string) as line")
    writer = (
        out.writeStream.format("eo_files")
        .option("path", where["files"]).option("webhdfsUrl", cfg["webhdfs"])
        .option("format", "parquet").option("sink_id", n["sink_id"])
    )
    run_query(writer, cfg, job)


def windows(spark: SparkSession, cfg: dict[str, Any], job: str) -> None:
    from connectors import JdbcSink, KafkaWindows

    n, where = names(cfg, job), paths(cfg, job)
    print("HDFS source walPath", where["source_wal"], flush=True)
    sink = JdbcSink(cfg["pg_url"], n["table"], n["sink_id"], mode="accumulate",
                    keys=["word"], accumulate=["n"], create_table=True)
    options = {"kafka.bootstrap.servers": cfg["bootstrap"], "subscribe": cfg["topic"],
               "maxOffsetsPerTrigger": cfg["per_batch"]}
    for run, limit in enumerate((2, None)):  # two scheduled runs of the same job
        done = 0
        for w in KafkaWindows(spark, walPath=where["source_wal"], **options):
            counts = words_of(w.df).groupBy("word").agg(F.count("*").alias("n"))
            sink.write(counts, w.window_id)
            print("WINDOW", run, w.window_id, flush=True)
            done += 1
            if limit is not None and done >= limit:
                break  # the job "ends" here: this window stays uncommitted
    print("WINDOWS DONE", flush=True)


def faults(spark: SparkSession, cfg: dict[str, Any], job: str) -> None:
    from tests.integration.cluster.pipelines.holding import (
        HoldingFileSink,
        HoldingJdbcSink,
        HoldingKafkaSink,
    )

    n, where = names(cfg, job), paths(cfg, job)
    jdbc = HoldingJdbcSink(cfg["pg_url"], n["table"], n["sink_id"], mode="accumulate",
                           keys=["word"], accumulate=["n"], create_table=True,
                           small_batch_rows=0)
    kafka = HoldingKafkaSink(bootstrap_servers=cfg["bootstrap"], topic=n["topic"],
                             sink_id=n["sink_id"], wal_path=where["sink_wal"],
                             storage_options=storage_options(cfg))
    out = HoldingFileSink(where["files"], webhdfs_url=cfg["webhdfs"], sink_id=n["sink_id"],
                          storage_options=storage_options(cfg))
    print("sink walPath", where["sink_wal"], flush=True)
    print("files", where["files"], flush=True)

    def per_batch(df: DataFrame, batch_id: int) -> None:
        jdbc.write(words_of(df).groupBy("word").agg(F.count("*").alias("n")), batch_id)
        kafka.write(df.select("key", "value"), batch_id)
        out.write(df.selectExpr("cast(partition as int) as part", "offset",
                                "cast(value as string) as line"), batch_id)
        print("FOREACHBATCH", batch_id, flush=True)

    run_query(lines_stream(spark, cfg, job).writeStream.foreachBatch(per_batch), cfg, job)


JOBS = {"wordcount": wordcount, "kafka_rk": kafka_copy, "kafka_txn": kafka_copy,
        "files": files, "windows": windows, "faults": faults}


def main(cfg: dict[str, Any]) -> int:
    import connectors

    builder = SparkSession.builder.appName(cfg.get("app", "eo-cluster"))
    for key, value in cfg["conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    print("APP", spark.sparkContext.applicationId, spark.sparkContext.master, flush=True)
    connectors.register(spark)
    for job in cfg["jobs"]:
        JOBS[job](spark, cfg, job)
        print("JOB DONE", job, flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
