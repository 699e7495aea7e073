"""What the metrics cost (issue 44, item 7): the same streaming pipeline with
``connectors.monitoring.serve`` on and off, alternating, in one run.

The pipeline: ``eo_kafka`` source (with a ``walPath``) -> ``eo_kafka`` sink
(``transactional=true``), ``Trigger.AvailableNow`` over a topic filled once with ``--rows``
records, ``--per-batch`` records a micro-batch, a fresh checkpoint, source WAL and
``sink_id`` each run. With metrics on, the endpoint also answers a scrape every second (a
thread here, as a Prometheus with ``scrape_interval: 1s`` would), so its cost is in the
figure too; the run then checks that the endpoint counted every row once
(``eo_sink_rows_committed_total``), so the "on" side measured metrics that worked.

After a warm-up run of each side, ``--pairs`` pairs run as off, on (then on, off in the
next pair, so a drift of the machine over the run falls on both sides). Each side's figure
is the median of its runs' rows/s; the ratio is on / off (1.0: no cost).

    python bench/metrics_overhead.py --rows 1000000 --per-batch 100000 --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_broker, bench_spark, stop_broker  # noqa: E402
from kafka_sink_throughput import create_topic, drop  # noqa: E402
from source_throughput import produce  # noqa: E402


def run_once(spark: Any, bootstrap: str, source: str, sink: str, work: str, per_batch: int
             ) -> tuple[float, str]:
    """One pipeline run from the earliest offsets to the end; returns its seconds and its
    sink_id."""
    run = uuid.uuid4().hex[:8]
    sink_id = f"mo-{run}"
    df = (spark.readStream.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", source).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", per_batch)
          .option("walPath", os.path.join(work, run, "source-wal")).load().select("value"))
    began = time.perf_counter()
    query = (df.writeStream.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", sink).option("sink_id", sink_id)
             .option("walPath", os.path.join(work, run, "sink-wal"))
             .option("transactional", "true")
             .option("checkpointLocation", os.path.join(work, run, "chk"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return time.perf_counter() - began, sink_id


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - our own endpoint
        return str(r.read().decode())


def committed_rows(text: str, sink_id: str) -> float:
    needle = f'eo_sink_rows_committed_total{{family="eo_kafka",sink_id="{sink_id}"}} '
    for line in text.splitlines():
        if line.startswith(needle):
            return float(line[len(needle):])
    return 0.0


def timed(spark: Any, bootstrap: str, source: str, sink: str, work: str, per_batch: int,
          rows: int, metrics_on: bool) -> float:
    """rows/s of one run, with or without the metrics endpoint (and its scraper)."""
    if not metrics_on:
        seconds, _ = run_once(spark, bootstrap, source, sink, work, per_batch)
        return rows / seconds
    from connectors import monitoring

    server = monitoring.serve(spark, port=0)
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        while not stop.wait(1.0):
            scrape(server.url)
            scrapes[0] += 1

    thread = threading.Thread(target=scraper, name="bench-scraper", daemon=True)
    thread.start()
    try:
        seconds, sink_id = run_once(spark, bootstrap, source, sink, work, per_batch)
    finally:
        stop.set()
        thread.join(10)
    try:
        counted = committed_rows(scrape(server.url), sink_id)
    finally:
        server.stop()
    if counted != rows:
        raise SystemExit(f"metrics on: the endpoint counted {counted} rows of {rows}")
    print(f"  (on: {scrapes[0]} scrapes during the run, {counted:.0f} rows counted)", flush=True)
    return rows / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--per-batch", type=int, default=100_000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()

    bootstrap, broker = bench_broker()
    source, sink = f"mo-in-{uuid.uuid4().hex[:6]}", f"mo-out-{uuid.uuid4().hex[:6]}"
    spark = None
    try:
        create_topic(bootstrap, source, args.partitions, prime=False)
        create_topic(bootstrap, sink, args.partitions)
        produce(bootstrap, source, args.rows, args.partitions, args.value_bytes)
        spark = bench_spark("bench-metrics-overhead")
        with tempfile.TemporaryDirectory(prefix="eo-bench-mo-") as work:
            def one(on: bool) -> float:
                rate = timed(spark, bootstrap, source, sink, work, args.per_batch, args.rows,
                             on)
                print(f"metrics {'on ' if on else 'off'}: {rate:,.0f} rows/s", flush=True)
                return rate

            # Warm-up, a run of each: the JVM, the Python workers, the producers' first
            # transactions, and Py4J's callback server, which the first listener starts.
            one(False)
            one(True)
            rates: dict[bool, list[float]] = {True: [], False: []}
            for pair in range(args.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                for on in order:
                    rates[on].append(one(on))
    finally:
        if spark is not None:
            spark.stop()
        drop(bootstrap, source, sink)
        stop_broker(broker)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    result = {"bench": "metrics_overhead", "rows": args.rows, "per_batch": args.per_batch,
              "pairs": args.pairs, "metrics_on_rows_per_s": round(on),
              "metrics_off_rows_per_s": round(off), "ratio_metrics_off": round(on / off, 4),
              "on_runs": [round(r) for r in rates[True]],
              "off_runs": [round(r) for r in rates[False]]}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
