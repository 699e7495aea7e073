"""Recovery pipeline for ``eo_files``: source -> shuffle -> ``eo_files``, crashable anywhere.

Source: ``eo_kafka`` on ``--topic`` (written by the test with produce_records),
``maxOffsetsPerTrigger=--per-batch``, so there are several batches.

Runs with ``trigger(availableNow=True)`` and exits 0 when everything available is written.
The test kills it through failpoints (``CONNECTORS_FAILPOINTS``) and restarts it with the
same checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from tests.integration.pipelines.common import kafka_stream, pipeline_spark


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--source", choices=["kafka"], default="kafka")
    p.add_argument("--per-batch", type=int, default=100)
    p.add_argument("--topic")
    p.add_argument("--bootstrap")
    p.add_argument("--format", default="parquet")
    p.add_argument("--partition-by", default="")
    p.add_argument("--max-records", type=int, default=0)
    p.add_argument("--webhdfs-url", default=None)
    p.add_argument("--storage", action="append", default=[],
                   help="a storage.* option as KEY=VALUE (object-store paths)")
    args = p.parse_args(argv)

    spark = pipeline_spark("files-pipeline", "local[2]", "WARN")
    raw = kafka_stream(spark, args.bootstrap, args.topic, args.per_batch)
    stream = raw.selectExpr(
        "cast(cast(key as string) as bigint) as id",
        "cast(cast(key as string) as bigint) % 3 as grp",
        "cast(value as string) as payload",
    ).selectExpr("id", "cast(grp as int) as grp", "payload")
    # A shuffle, so that a replayed batch can split its rows across files differently.
    out = stream.repartition(2, "payload")
    writer = (
        out.writeStream.format("eo_files")
        .option("path", args.out)
        .option("format", args.format)
        .option("checkpointLocation", args.checkpoint)
        .option("sink_id", "files-recovery")
    )
    if args.partition_by:
        writer = writer.option("partitionBy", args.partition_by)
    if args.max_records:
        writer = writer.option("maxRecordsPerFile", args.max_records)
    if args.webhdfs_url:
        writer = writer.option("webhdfsUrl", args.webhdfs_url)
    for kv in args.storage:
        key, value = kv.split("=", 1)
        writer = writer.option(f"storage.{key}", value)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    print("PIPELINE DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
