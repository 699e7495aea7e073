"""Recovery pipeline for the ``eo_kafka`` source: eo_kafka -> Spark's parquet file sink.

Spark's own file sink is exactly-once (its ``_spark_metadata`` log), so anything lost or
doubled in the output comes from the source. Runs ``trigger(availableNow=True)`` with
``maxOffsetsPerTrigger=--per-batch`` (several micro-batches) and exits 0 when the backlog is
read. Tests kill it through failpoints and restart it with the same checkpoint and WAL.
"""

from __future__ import annotations

import argparse

from tests.integration.pipelines.common import kafka_stream, pipeline_spark


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--wal", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--per-batch", type=int, default=1000)
    args = ap.parse_args()

    spark = pipeline_spark("kafka-source-recovery", "local[2]", "WARN")
    df = kafka_stream(
        spark, args.bootstrap, args.topic, args.per_batch,
        **{"walPath": args.wal, "kafka.group.id": args.group},
    ).selectExpr("topic", "partition", "offset", "cast(value as string) as value")
    q = (
        df.writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
