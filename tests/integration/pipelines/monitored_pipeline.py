"""The monitored pipeline of tests/integration/test_monitoring.py: ``eo_kafka`` ->
``writeStream.format("eo_jdbc")`` (append), with ``connectors.monitoring.serve`` on
``--port`` in the driver.

The DataSource writer's commit runs in a Python worker of Spark's JVM, not in this process,
so its counts reach the endpoint through the spool (connectors/monitoring/channel.py): the
path a user's ``writeStream`` takes. ``trigger(availableNow=True)`` with
``maxOffsetsPerTrigger=--per-batch``; when the backlog is written it prints
``PIPELINE DONE`` and keeps serving until the file ``--hold`` exists (the test has read the
last values through Prometheus), at most 120 s. Spark runs each task up to twice
(``local[2,2]``), so a task attempt failed by a ``raise`` failpoint is retried.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--sink-id", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hold", required=True)
    p.add_argument("--per-batch", type=int, default=20)
    p.add_argument("--wal", required=True)
    args = p.parse_args(argv)

    from connectors import monitoring
    from tests.integration.pipelines.common import kafka_stream, pipeline_spark

    # two attempts per task, as on a cluster: a task attempt failed once is retried
    spark = pipeline_spark("monitored", "local[2,2]", "WARN")
    server = monitoring.serve(spark, port=args.port)
    print(f"METRICS {server.url}", flush=True)
    df = kafka_stream(spark, args.bootstrap, args.topic, args.per_batch,
                      walPath=args.wal).selectExpr(
        "partition", "offset", "cast(value as string) as value")
    query = (
        df.writeStream.format("eo_jdbc")
        .option("url", args.url).option("table", args.table)
        .option("sink_id", args.sink_id).option("createTable", "true")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("PIPELINE DONE", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(args.hold) and time.monotonic() < deadline:
        time.sleep(0.2)  # serving until the test has read the last scrape
    server.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
