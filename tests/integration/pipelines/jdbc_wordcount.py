"""The seeds' headline pipeline: lines -> word count per micro-batch -> ``eo_jdbc`` accumulate.

``count = count + new`` is not idempotent, so a batch applied twice is visible in the table:
the recovery test kills this process at each JDBC failpoint and compares the final table
with the true word counts.

Source: ``eo_kafka`` on ``--topic`` (values are the lines ``line(i)``, written by the test
with produce_records), ``maxOffsetsPerTrigger=--per-batch``.

Writers (``--writer``):
- ``foreachbatch``: ``df.groupBy("word").count()`` per batch, written by ``JdbcSink.write``;
- ``datasource``: ``writeStream.format("eo_jdbc")`` with rows ``(word, 1)``; the sink's
  accumulate mode sums them per key inside the commit (``INSERT ... SELECT ... GROUP BY``);
- ``datasource-task``: the same with ``commitScope=task``: each task adds its rows to the
  table in its own transaction, with its claim.

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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--sink-id", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--source", choices=["kafka"], default="kafka")
    p.add_argument("--writer", choices=["foreachbatch", "datasource", "datasource-task",
                                        "datasource-append"],
                   default="foreachbatch")
    p.add_argument("--per-batch", type=int, default=60)
    p.add_argument("--small-batch-rows", type=int, default=10_000)
    p.add_argument("--topic")
    p.add_argument("--bootstrap")
    args = p.parse_args(argv)

    from pyspark.sql import functions as F

    from connectors.jdbc.sink import JdbcSink
    from tests.integration.pipelines.common import kafka_stream, pipeline_spark

    spark = pipeline_spark("jdbc-wordcount", "local[2]", "WARN")
    lines = kafka_stream(spark, args.bootstrap, args.topic, args.per_batch).selectExpr(
        "cast(value as string) as value")
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
            .option("sink_id", args.sink_id).option("createTable", "true")
        )
        if args.writer in ("datasource", "datasource-task"):
            writer = (writer.option("mode", "accumulate").option("keys", "word")
                      .option("accumulate", "n"))
            if args.writer == "datasource-task":
                writer = writer.option("commitScope", "task")
        else:  # one (word, 1) row per word: PostgreSQL stages binary COPY blocks
            writer = writer.option("mode", "append")
    query = (writer.option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print("PIPELINE DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
