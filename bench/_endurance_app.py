"""The driver that bench/endurance.py measures: one Spark application, one ``eo_kafka`` source
topic read by four streaming queries (each with its own ``walPath`` and consumer group), each
into one sink, at ``trigger(processingTime="0 seconds")`` with at most ``--per-batch``
records per micro-batch:

- ``rk``: the Kafka sink with recovery keys, copying ``key`` and ``value``;
- ``txn``: the Kafka sink, ``transactional=true``, copying ``key`` and ``value``;
- ``jdbc``: the JDBC sink on ``--jdbc-url``, accumulating ``n = n + 1`` per key (not
  idempotent: a batch applied twice shows), after a shuffle (``repartition(2, key)``, as a
  word count would), so Spark's shuffle files are part of what is measured;
- ``files``: the file sink, ``key`` and ``value`` as Parquet.

Every temporary file of the application goes under ``--tmp``: ``TMPDIR`` for the Python
processes (the metrics spool among them), ``java.io.tmpdir`` and ``spark.local.dir`` for the
JVM, so the benchmark can count what its processes leave there. ``connectors.monitoring``
serves the metrics (its URL is written to ``--metrics-file``), so the sink workers' commit
events go through the spool as in a production driver.

The app runs until ``--stop`` exists, then stops the queries and exits 0. A query that
terminates ends the app at once with ``QUERY FAILED <name>: <error>`` and exit code 3.
Started again on the same ``--work`` directory (after a SIGKILL), every query resumes from
its checkpoint. Nothing here is timed: bench/endurance.py samples this process tree.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

#: The queries, in the order they start.
QUERIES = ("rk", "txn", "jdbc", "files")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--source-topic", required=True)
    p.add_argument("--rk-topic", required=True)
    p.add_argument("--txn-topic", required=True)
    p.add_argument("--jdbc-url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--files", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tmp", required=True, help="every temporary file of the app goes here")
    p.add_argument("--stop", required=True)
    p.add_argument("--metrics-file", required=True)
    p.add_argument("--run-id", required=True, help="names the sinks and consumer groups")
    p.add_argument("--per-batch", type=int, default=40)
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="another Spark setting")
    p.add_argument("--java-options", default="", help="more options of the driver JVM")
    args = p.parse_args(argv)

    os.makedirs(args.tmp, exist_ok=True)
    os.environ["TMPDIR"] = args.tmp  # this process, the JVM it starts and its Python workers
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again
    from pyspark.sql import SparkSession

    import connectors
    from connectors import monitoring
    from tests.integration.pipelines.common import run_until, start_one_at_a_time

    builder = (SparkSession.builder.master("local[2,4]").appName("eo-endurance")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .config("spark.local.dir", args.tmp)
               .config("spark.driver.extraJavaOptions",
                       f"-Djava.io.tmpdir={args.tmp} {args.java_options}".strip()))
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)
    server = monitoring.serve(spark, port=0)
    with open(args.metrics_file + ".tmp", "w") as f:
        f.write(server.url)
    os.replace(args.metrics_file + ".tmp", args.metrics_file)

    def source(name: str) -> Any:
        return (spark.readStream.format("eo_kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .option("subscribe", args.source_topic)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", args.per_batch)
                .option("kafka.group.id", f"endurance-{args.run_id}-{name}")
                .option("walPath", os.path.join(args.work, name, "source-wal"))
                .load())

    def kafka(name: str, topic: str, transactional: bool) -> Any:
        return (source(name).selectExpr("key", "value")
                .writeStream.format("eo_kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .option("topic", topic)
                .option("walPath", os.path.join(args.work, name, "sink-wal"))
                .option("transactional", str(transactional).lower()))

    writers: dict[str, Any] = {
        "rk": kafka("rk", args.rk_topic, False),
        "txn": kafka("txn", args.txn_topic, True),
        "jdbc": (source("jdbc").selectExpr("cast(key as string) as key", "1L as n")
                 .repartition(2, "key")
                 .writeStream.format("eo_jdbc")
                 .option("url", args.jdbc_url).option("table", args.table)
                 .option("mode", "accumulate").option("keys", "key")
                 .option("accumulate", "n").option("createTable", "true")),
        "files": (source("files").selectExpr("cast(key as string) as key",
                                              "cast(value as string) as value")
                  .writeStream.format("eo_files")
                  .option("path", args.files).option("format", "parquet")),
    }
    def start(name: str, writer: Any) -> Any:
        return (writer.queryName(name).option("sink_id", f"endurance-{args.run_id}-{name}")
                .option("checkpointLocation", os.path.join(args.work, name, "checkpoint"))
                .trigger(processingTime="0 seconds").start())

    run_until(start_one_at_a_time({name: writers[name] for name in QUERIES}, start), args.stop,
              progress_every=60)
    server.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
