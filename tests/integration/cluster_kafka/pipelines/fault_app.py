"""The fault tier's long-running application: one ``eo_kafka`` source topic copied by four
streaming queries, one per Kafka sink variant (recovery keys or transactions, librdkafka or
the wire), each through a shuffle (``repartition(2, key)``) so every batch has two writers.

``local[2,4]``: Spark retries a failed task up to 4 times, as on a cluster. The app runs
until ``--stop`` exists, then stops the queries and exits 0. A query that terminates with an
error ends the app at once with ``QUERY FAILED <name>: <error>`` and exit code 3: the test
asserts that no node kill or rolling restart ever does that.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tests.integration.pipelines.common import kafka_stream, pipeline_spark


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--source-topic", required=True)
    p.add_argument("--sink", action="append", required=True,
                   help="name:topic:transactional:wire")
    p.add_argument("--work", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--per-batch", type=int, default=3000)
    args = p.parse_args(argv)

    spark = pipeline_spark("kafka-cluster-faults", "local[2,4]", "WARN")
    queries = {}
    for spec in args.sink:
        name, topic, transactional, wire = spec.split(":")
        stream = kafka_stream(spark, args.bootstrap, args.source_topic, args.per_batch,
                              walPath=os.path.join(args.work, name, "source-wal"))
        out = stream.selectExpr("key", "value").repartition(2, "key")
        queries[name] = (
            out.writeStream.format("eo_kafka")
            .queryName(name)
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("topic", topic)
            .option("sink_id", f"{name}-{os.path.basename(args.work)}")
            .option("walPath", os.path.join(args.work, name, "sink-wal"))
            .option("transactional", transactional)
            .option("wireProduce", wire)
            .option("checkpointLocation", os.path.join(args.work, name, "checkpoint"))
            .trigger(processingTime="1 second")
            .start()
        )
    print("QUERIES STARTED", flush=True)
    while not os.path.exists(args.stop):
        for name, q in queries.items():
            if not q.isActive:
                print(f"QUERY FAILED {name}: {q.exception()}", flush=True)
                os._exit(3)  # noqa: SLF001 - end at once, whatever Spark is doing
        time.sleep(0.5)
    for q in queries.values():
        q.stop()
    print("PIPELINE DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
