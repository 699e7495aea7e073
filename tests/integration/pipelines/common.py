"""What every recovery pipeline script shares: the SparkSession it runs in, the
``eo_kafka`` stream most of them read, and how a long-running application starts its
queries and runs them until told to stop.

``local[2]`` (or ``local[N,maxFailures]`` where a test needs Spark's task retries), UI off,
2 shuffle partitions, our DataSources registered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from tests.helpers import spark_builder


def pipeline_spark(app: str, master: str = "local[2]", log_level: str = "WARN") -> SparkSession:
    import connectors

    spark = spark_builder(app, master).getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    connectors.register(spark)
    return spark


def kafka_stream(spark: SparkSession, bootstrap: str, topic: str, per_batch: int,
                 **options: Any) -> DataFrame:
    """``eo_kafka`` on ``topic`` from the earliest offsets, at most ``per_batch`` records per
    micro-batch (so the pipeline has several batches to be killed in); ``options`` adds
    source options, e.g. ``walPath``."""
    reader = (
        spark.readStream.format("eo_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def start_one_at_a_time(writers: Mapping[str, Any],
                        start: Callable[[str, Any], Any]) -> dict[str, Any]:
    """``start(name, writer)`` for each writer in turn, each once the query before it made
    its first progress (or 120 s passed), as an operator's script would: each start launches
    Spark's Python runners, and on two cores several at once can outlast Spark's wait for a
    new Python worker to connect back. Prints ``QUERIES STARTED``."""
    queries: dict[str, Any] = {}
    for name, writer in writers.items():
        query = queries[name] = start(name, writer)
        began = time.monotonic()
        while query.isActive and query.lastProgress is None and time.monotonic() - began < 120:
            time.sleep(0.2)
    print("QUERIES STARTED", flush=True)
    return queries


def run_until(queries: Mapping[str, Any], stop: str, progress_every: float | None = None) -> None:
    """Run until the file ``stop`` exists, then stop every query (``PIPELINE DONE``). A query
    that terminates ends the process at once with ``QUERY FAILED <name>: <error>`` and exit
    code 3 (the tests fail on it). ``progress_every``: a ``PROGRESS`` line per query that
    often (seconds), what a batch costs now."""
    shown = time.monotonic()
    while not os.path.exists(stop):
        for name, q in queries.items():
            if not q.isActive:
                print(f"QUERY FAILED {name}: {q.exception()}", flush=True)
                os._exit(3)  # end at once, whatever Spark is doing
        if progress_every is not None and time.monotonic() - shown > progress_every:
            shown = time.monotonic()
            for name, q in queries.items():
                last = q.lastProgress or {}
                print(f"PROGRESS {name} batch {last.get('batchId')} rows "
                      f"{last.get('numInputRows')} ms {last.get('durationMs')}", flush=True)
        time.sleep(0.5)
    for q in queries.values():
        q.stop()
    print("PIPELINE DONE", flush=True)
