"""The fault tier's long-running application: one ``eo_kafka`` source topic read by several
streaming queries, each into one sink, each through a shuffle (``repartition(2, key)``) so
every batch has two writers:

- ``name:kafka:topic:transactional:wire``: the Kafka sink (a delivery mode on a produce
  path), copying ``key`` and ``value``;
- ``name:jdbc:table``: the JDBC sink on ``--jdbc-url``, accumulating ``n = n + 1`` per key
  (not idempotent: a batch applied twice shows);
- ``name:files:path``: the file sink, ``key`` and ``value`` as Parquet.

``local[2,4]``: Spark retries a failed task up to 4 times, as on a cluster. The app runs
until ``--stop`` exists, then stops the queries and exits 0. A query that terminates with an
error ends the app at once with ``QUERY FAILED <name>: <error>`` and exit code 3: the tests
assert that no node kill, network partition or rolling restart ever does that. Started
again on the same ``--work`` directory (after a SIGKILL), every query resumes from its
checkpoint. A driver killed while Spark wrote a query's first offsets leaves a temporary file
that Spark 4.1+ refuses to start on; the app clears it first, as docs/deploying.md tells an
operator to (``connectors.spark.checkpoint``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from connectors.spark.checkpoint import clear_unfinished_first_batch
from tests.integration.pipelines.common import (
    kafka_stream,
    pipeline_spark,
    run_until,
    start_one_at_a_time,
)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--source-topic", required=True)
    p.add_argument("--sink", action="append", required=True,
                   help="name:kafka:topic:transactional:wire | name:jdbc:table | "
                        "name:files:path")
    p.add_argument("--jdbc-url")
    p.add_argument("--work", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--per-batch", type=int, default=3000)
    p.add_argument("--run-id", default=None,
                   help="names the sinks (the JDBC sink's commit row is per sink_id in a "
                        "table every run shares); default: the --work directory's name")
    args = p.parse_args(argv)
    args.run_id = args.run_id or os.path.basename(args.work)

    spark = pipeline_spark("kafka-cluster-faults", "local[2,4]", "WARN")
    writers: dict[str, Any] = {}
    for spec in args.sink:
        name, kind, target, *flags = spec.split(":")
        work = os.path.join(args.work, name)
        stream = kafka_stream(spark, args.bootstrap, args.source_topic, args.per_batch,
                              walPath=os.path.join(work, "source-wal"))
        if kind == "kafka":
            transactional, wire = flags
            writer = (stream.selectExpr("key", "value").repartition(2, "key")
                      .writeStream.format("eo_kafka")
                      .option("kafka.bootstrap.servers", args.bootstrap)
                      .option("topic", target)
                      .option("walPath", os.path.join(work, "sink-wal"))
                      .option("transactional", transactional)
                      .option("wireProduce", wire))
        elif kind == "jdbc":
            writer = (stream.selectExpr("cast(key as string) as key", "1L as n")
                      .repartition(2, "key")
                      .writeStream.format("eo_jdbc")
                      .option("url", args.jdbc_url).option("table", target)
                      .option("mode", "accumulate").option("keys", "key")
                      .option("accumulate", "n").option("createTable", "true"))
        elif kind == "files":
            writer = (stream.selectExpr("cast(key as string) as key",
                                        "cast(value as string) as value")
                      .repartition(2, "key")
                      .writeStream.format("eo_files")
                      .option("path", target).option("format", "parquet"))
        else:
            raise SystemExit(f"unknown sink kind {kind!r} in {spec!r}")
        writers[name] = writer

    def start(name: str, writer: Any) -> Any:
        checkpoint = os.path.join(args.work, name, "checkpoint")
        for leftover in clear_unfinished_first_batch(checkpoint):
            print(f"removed {leftover}: its driver was killed while Spark wrote batch 0",
                  flush=True)
        return (writer.queryName(name).option("sink_id", f"{name}-{args.run_id}")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="1 second").start())

    run_until(start_one_at_a_time(writers, start), args.stop)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
