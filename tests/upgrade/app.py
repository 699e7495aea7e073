"""The upgrade test's application (tests/integration/test_upgrade.py): one Spark application,
one ``eo_kafka`` source topic (each query with its own ``walPath``) read by four streaming
queries, each into one sink through a shuffle (``repartition(2, key)``, two writers):

- ``rk``: the Kafka sink with recovery keys, every key null and every value padded by
  ``--pad`` bytes, so each batch goes to one writer whose null-key rows make one run of the
  previous release's routing but more than one of a run in bytes;
- ``txn``: the Kafka sink, transactional, copying ``key`` and ``value``;
- ``jdbc``: the JDBC sink on ``--jdbc-url``, accumulating ``n = n + 1`` per key (not
  idempotent: a batch applied twice shows); with ``--jdbc-commit-scope`` (the run on this
  checkout's code only: the previous release refuses an option it does not know), that
  ``commitScope``;
- ``files``: the file sink, ``key`` and ``value`` as Parquet.

It imports only the standard library, pyspark and ``connectors``, and uses only options the
previous release has, because the test runs it under that release's ``connectors`` first
and under this checkout's after: started again on the same ``--work`` directory, every
query resumes from its checkpoint. It prints which ``connectors`` the driver and a Python
worker imported (``CONNECTORS driver=<path> worker=<path>``), runs until ``--stop`` exists,
then stops the queries and exits 0. A query that terminates with an error ends the app at
once with ``QUERY FAILED <name>: <error>`` and exit code 3.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession

import connectors


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
    p.add_argument("--stop", required=True)
    p.add_argument("--run-id", required=True, help="names the sinks (sink_id)")
    p.add_argument("--per-batch", type=int, default=3000)
    p.add_argument("--pad", type=int, default=4000,
                   help="bytes added to every value the rk query writes")
    p.add_argument("--java-options", default="", help="the driver JVM's options")
    p.add_argument("--jdbc-commit-scope", help="the jdbc query's commitScope")
    args = p.parse_args(argv)

    # The tests' local session (tests/helpers.py spark_builder), written out here so that
    # the script imports nothing of this checkout but what it tests.
    spark = (SparkSession.builder.master("local[2,4]").appName("eo-upgrade")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.driver.memory", "2g")
             .config("spark.sql.streaming.stopTimeout", "30s")
             .config("spark.driver.extraJavaOptions", args.java_options)
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)
    worker = (spark.sparkContext.parallelize([0], 1)
              .map(lambda _: __import__("connectors").__file__).collect()[0])
    print(f"CONNECTORS driver={connectors.__file__} worker={worker}", flush=True)

    def source(name: str) -> DataFrame:
        return (spark.readStream.format("eo_kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .option("subscribe", args.source_topic)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", args.per_batch)
                .option("walPath", os.path.join(args.work, name, "source-wal"))
                .load())

    def kafka(name: str, topic: str, transactional: bool, *columns: str) -> Any:
        return (source(name).selectExpr(*columns).repartition(2, "key")
                .writeStream.format("eo_kafka")
                .option("kafka.bootstrap.servers", args.bootstrap)
                .option("topic", topic)
                .option("walPath", os.path.join(args.work, name, "sink-wal"))
                .option("transactional", str(transactional).lower()))

    writers: dict[str, Any] = {
        "rk": kafka("rk", args.rk_topic, False, "cast(null as binary) as key",
                    f"concat(value, cast(repeat('.', {args.pad}) as binary)) as value"),
        "txn": kafka("txn", args.txn_topic, True, "key", "value"),
        "jdbc": (source("jdbc").selectExpr("cast(key as string) as key", "1L as n")
                 .repartition(2, "key")
                 .writeStream.format("eo_jdbc")
                 .option("url", args.jdbc_url).option("table", args.table)
                 .option("mode", "accumulate").option("keys", "key")
                 .option("accumulate", "n").option("createTable", "true")
                 .options(**({"commitScope": args.jdbc_commit_scope}
                             if args.jdbc_commit_scope else {}))),
        "files": (source("files").selectExpr("cast(key as string) as key",
                                              "cast(value as string) as value")
                  .repartition(2, "key")
                  .writeStream.format("eo_files")
                  .option("path", args.files).option("format", "parquet")),
    }
    queries = {}
    for name, writer in writers.items():
        queries[name] = (writer.queryName(name)
                         .option("sink_id", f"{name}-{args.run_id}")
                         .option("checkpointLocation",
                                 os.path.join(args.work, name, "checkpoint"))
                         .trigger(processingTime="1 second").start())
        # One query starts at a time (as the fault tier's application does): each start
        # launches Spark's Python runners, and on two cores several at once can outlast
        # Spark's wait for a new Python worker to connect back.
        began = time.monotonic()
        while (queries[name].isActive and queries[name].lastProgress is None
               and time.monotonic() - began < 120):
            time.sleep(0.2)
    print("QUERIES STARTED", flush=True)
    while not os.path.exists(args.stop):
        for name, q in queries.items():
            if not q.isActive:
                print(f"QUERY FAILED {name}: {q.exception()}", flush=True)
                os._exit(3)  # end at once, whatever Spark is doing
        time.sleep(0.5)
    for q in queries.values():
        q.stop()
    print("PIPELINE DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
