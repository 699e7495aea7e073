"""Recovery pipeline for ``KafkaWindows``: every window of ``--topic`` into its own parquet
directory ``<out>/window=<id>``, written with Spark's ``mode("overwrite")``, so a replayed
window replaces what an interrupted attempt left (idempotent per window id, as a sink keyed
by ``batch_id = window_id`` is). Exits 0 when the backlog is read. Tests kill it through
failpoints and run it again on the same WAL.
"""

from __future__ import annotations

import argparse

from tests.integration.pipelines.common import pipeline_spark


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wal", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--per-window", type=int, default=1000)
    args = ap.parse_args()

    from connectors import KafkaWindows

    spark = pipeline_spark("kafka-windows-recovery", "local[2]", "WARN")
    windows = KafkaWindows(spark, walPath=args.wal, **{
        "kafka.bootstrap.servers": args.bootstrap, "subscribe": args.topic,
        "kafka.group.id": args.group, "maxOffsetsPerTrigger": args.per_window})
    for w in windows:
        (w.df.selectExpr("topic", "partition", "offset", "cast(value as string) as value")
         .write.mode("overwrite").parquet(f"{args.out}/window={w.window_id}"))
    windows.close()
    spark.stop()


if __name__ == "__main__":
    main()
