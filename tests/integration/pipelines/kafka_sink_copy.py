"""Recovery pipeline for the ``eo_kafka`` sink: topic A -> transform -> ``eo_kafka`` -> topic B.

- Source: ``eo_kafka`` on topic A (written by the test with ``produce_records``) with
  ``maxOffsetsPerTrigger=--per-batch``, so there are several micro-batches.
- Transform: ``value = 'B:' || value``, key kept.
- ``--shuffle``: ``repartition(2, key)`` before the sink, so the order of rows inside a writer
  partition is not stable across replays (the sink sorts before numbering). Without it the
  sink runs with ``deterministicOrder=true`` on the source's own partitions.
- ``--transactional``: the sink's per-task Kafka transactions.

Runs ``trigger(availableNow=True)`` and exits 0 when all of topic A is copied. The test kills
it through failpoints (``CONNECTORS_FAILPOINTS``, scope ``group``) and restarts it from the
same checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from tests.integration.pipelines.common import kafka_stream, pipeline_spark


def record(i: int) -> tuple[bytes | None, bytes]:
    """Record i of topic A. The last 200 repeat earlier records exactly (ties for the sort)."""
    j = i - 19800 if i >= 19800 else i
    key = None if j % 10 == 0 else f"k{j % 97}".encode()
    return key, f"v{j}".encode()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--source-topic")
    p.add_argument("--sink-topic", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--wal", required=True)
    p.add_argument("--sink-id", required=True)
    p.add_argument("--per-batch", type=int, default=4000)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--transactional", action="store_true")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)

    spark = pipeline_spark("kafka-sink-copy", args.master, "WARN")
    stream = kafka_stream(spark, args.bootstrap, args.source_topic, args.per_batch)
    out = stream.selectExpr("key", "concat(cast('B:' as binary), value) as value")
    if args.shuffle:
        # Rows reach a writer partition in shuffle-fetch order, which a replay may change.
        out = out.repartition(2, "key")
    query = (
        out.writeStream.format("eo_kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.sink_topic)
        .option("sink_id", args.sink_id)
        .option("walPath", args.wal)
        .option("transactional", str(args.transactional).lower())
        .option("deterministicOrder", str(not args.shuffle).lower())
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    for progress in query.recentProgress:
        print("BATCH", progress.batchId, progress.numInputRows, progress.durationMs, flush=True)
    print("PIPELINE DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
