"""The seeds' headline pipeline: lines -> word count per micro-batch -> ``eo_jdbc`` accumulate.

``count = count + new`` is not idempotent, so a batch applied twice is visible in the table:
the recovery test kills this process at each JDBC failpoint and compares the final table
with the true word counts.

Sources:
- ``--source kafka``: ``eo_kafka`` on ``--topic`` (values are the lines, written by the test
  with produce_exact), ``maxOffsetsPerTrigger=--per-batch``.
- ``--source lines``: a deterministic test-only Python DataSource emitting ``line(i)`` for
  ``i = 0..total-1``, ``--per-batch`` lines per micro-batch.

Writers (``--writer``):
- ``foreachbatch``: ``df.groupBy("word").count()`` per batch, written by ``JdbcSink.write``;
- ``datasource``: ``writeStream.format("eo_jdbc")`` with rows ``(word, 1)``; the sink's
  accumulate mode sums them per key inside the commit (``INSERT ... SELECT ... GROUP BY``).

Runs with ``trigger(availableNow=True)`` and prints ``PIPELINE DONE`` at the end.
"""

from __future__ import annotations

import argparse
import sys

WORDS = ["apex", "spark", "kafka", "jdbc", "exactly", "once", "window", "batch", "sink",
         "offset", "commit", "replay", "stage", "copy"]


def line(i: int) -> str:
    """Line ``i`` of the input: 1..5 words, deterministic."""
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(1 + i % 5))


def true_counts(total: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in range(total):
        for w in line(i).split(" "):
            counts[w] = counts.get(w, 0) + 1
    return counts


def _lines_source() -> type:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    class _Range(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            self.start = start
            self.end = end

    class LinesReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options: dict[str, str]) -> None:
            self.total = int(options["total"])
            self.per_batch = int(options["perbatch"])

        def initialOffset(self) -> dict:  # noqa: N802
            return {"next": 0}

        def getDefaultReadLimit(self):  # noqa: N802
            return ReadMaxRows(self.per_batch)

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
            pass

        def latestOffset(self, start: dict, limit) -> dict:  # noqa: N802
            begin = start["next"] if start else 0
            if isinstance(limit, ReadAllAvailable):
                return {"next": self.total}
            return {"next": min(self.total, begin + limit.max_rows)}

        def partitions(self, start: dict, end: dict):
            s, e = start["next"], end["next"]
            mid = (s + e) // 2
            return [p for p in (_Range(s, mid), _Range(mid, e)) if p.end > p.start]

        def read(self, partition):
            for i in range(partition.start, partition.end):
                yield (line(i),)

        def commit(self, end: dict) -> None:
            pass

    class LinesSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "eo_test_lines"

        def schema(self) -> str:
            return "value string"

        def streamReader(self, schema):  # noqa: N802
            return LinesReader(self.options)

    return LinesSource


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--sink-id", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--source", choices=["lines", "kafka"], default="lines")
    p.add_argument("--writer", choices=["foreachbatch", "datasource"], default="foreachbatch")
    p.add_argument("--total", type=int, default=300)
    p.add_argument("--per-batch", type=int, default=60)
    p.add_argument("--small-batch-rows", type=int, default=10_000)
    p.add_argument("--topic")
    p.add_argument("--bootstrap")
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import connectors
    from connectors.jdbc.sink import JdbcSink

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("jdbc-wordcount")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)
    if args.source == "lines":
        spark.dataSource.register(_lines_source())
        lines = (spark.readStream.format("eo_test_lines").option("total", args.total)
                 .option("perBatch", args.per_batch).load())
    else:
        lines = (
            spark.readStream.format("eo_kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("subscribe", args.topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", args.per_batch)
            .load()
            .selectExpr("cast(value as string) as value")
        )
    words = lines.select(F.explode(F.split("value", " ")).alias("word"))

    if args.writer == "foreachbatch":
        sink = JdbcSink(args.url, args.table, args.sink_id, mode="accumulate", keys=["word"],
                        accumulate=["n"], create_table=True,
                        small_batch_rows=args.small_batch_rows)

        def per_batch(df, batch_id: int) -> None:
            sink.write(df.groupBy("word").agg(F.count("*").alias("n")), batch_id)

        writer = words.writeStream.foreachBatch(per_batch)
    else:
        writer = (
            words.select("word", F.lit(1).cast("long").alias("n"))
            .repartition(2)  # two writer partitions stage in parallel
            .writeStream.format("eo_jdbc")
            .option("url", args.url).option("table", args.table)
            .option("sink_id", args.sink_id).option("mode", "accumulate")
            .option("keys", "word").option("accumulate", "n").option("createTable", "true")
        )
    query = (writer.option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print("PIPELINE DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
