"""Recovery pipeline for ``eo_files``: source -> shuffle -> ``eo_files``, crashable anywhere.

Sources:
- ``--source seq``: a deterministic test-only Python DataSource (``eo_test_seq``) emitting rows
  ``id = 0..total-1`` at ``--per-batch`` rows per micro-batch, so there are several batches.
- ``--source kafka``: ``eo_kafka`` on ``--topic`` (written by the test with produce_exact),
  ``maxOffsetsPerTrigger=--per-batch``.

Runs with ``trigger(availableNow=True)`` and exits 0 when everything available is written.
The test kills it through failpoints (``CONNECTORS_FAILPOINTS``) and restarts it with the
same checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

SEQ_SCHEMA = "id bigint, grp int, payload string"


def row(i: int) -> tuple[int, int, str]:
    return (i, i % 3, f"value-{i}")


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end


class SeqReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.total = int(options["total"])
        self.per_batch = int(options["perbatch"])
        self.target = self.total

    def initialOffset(self) -> dict:  # noqa: N802
        return {"next": 0}

    def getDefaultReadLimit(self):  # noqa: N802
        return ReadMaxRows(self.per_batch)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.target = self.total

    def latestOffset(self, start: dict, limit) -> dict:  # noqa: N802
        begin = start["next"] if start else 0
        if isinstance(limit, ReadAllAvailable):
            return {"next": self.target}
        return {"next": min(self.target, begin + limit.max_rows)}

    def partitions(self, start: dict, end: dict):
        s, e = start["next"], end["next"]
        mid = (s + e) // 2
        return [p for p in (_Range(s, mid), _Range(mid, e)) if p.end > p.start]

    def read(self, partition: _Range):
        for i in range(partition.start, partition.end):
            yield row(i)

    def commit(self, end: dict) -> None:
        pass


class SeqSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "eo_test_seq"

    def schema(self) -> str:
        return SEQ_SCHEMA

    def streamReader(self, schema):  # noqa: N802
        return SeqReader(self.options)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--source", choices=["seq", "kafka"], default="seq")
    p.add_argument("--total", type=int, default=600)
    p.add_argument("--per-batch", type=int, default=100)
    p.add_argument("--topic")
    p.add_argument("--bootstrap")
    p.add_argument("--format", default="parquet")
    p.add_argument("--partition-by", default="")
    p.add_argument("--max-records", type=int, default=0)
    p.add_argument("--webhdfs-url", default=None)
    args = p.parse_args(argv)

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("files-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    import connectors

    connectors.register(spark)
    if args.source == "seq":
        spark.dataSource.register(SeqSource)
        stream = (
            spark.readStream.format("eo_test_seq")
            .option("total", args.total)
            .option("perBatch", args.per_batch)
            .load()
        )
    else:
        raw = (
            spark.readStream.format("eo_kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("subscribe", args.topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", args.per_batch)
            .load()
        )
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
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    print("PIPELINE DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
