"""Throughput of the ``eo_files`` sink (parquet) against Spark's built-in streaming parquet sink.

    python bench/file_sink_throughput.py --rows 2000000

Both queries read the same input from the same JVM source, Spark's ``rate-micro-batch``
(exactly ``--batch-rows`` rows per micro-batch, deterministic values, no wall-clock pacing),
apply the same projection (a long, an int, a string, a timestamp), run in the same
SparkSession (``local[2]``, 2 partitions per batch) and write snappy parquet to a local
directory:

- ours: ``writeStream.format("eo_files")`` (stage through pyarrow in the Python worker,
  atomic-rename commit, ``_eo_log`` and ``_spark_metadata``);
- baseline: ``writeStream.format("parquet")``, Spark's own file sink with its
  ``_spark_metadata`` log.

Each is measured from ``start()`` until the query has committed ``--rows`` rows, after a
short warm-up run of both. ``commit_overhead_ms`` is the median driver-side commit time of
one ``eo_files`` batch of 2 files (plan, renames, logs, cleanup), measured without Spark.

Ends with one line: ``RESULT {json}`` (DESIGN.md section 11).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from _common import bench_spark  # noqa: E402


def build_spark():  # noqa: ANN201
    return bench_spark("bench-file-sink")


def input_stream(spark, batch_rows: int):  # noqa: ANN001, ANN201
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", batch_rows)
        .option("numPartitions", 2)
        .load()
        .selectExpr(
            "value as id",
            "cast(value % 1000 as int) as k",
            "concat('payload-', value) as payload",
            "timestamp as ts",
        )
    )


def run_query(spark, sink: str, rows: int, batch_rows: int, workdir: str) -> float:  # noqa: ANN001
    """Seconds from start() until ``rows`` rows were committed by ``sink``."""
    out = os.path.join(workdir, f"{sink}-out")
    chk = os.path.join(workdir, f"{sink}-chk")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(chk, ignore_errors=True)
    writer = input_stream(spark, batch_rows).writeStream.format(sink).option("path", out)
    writer = writer.option("checkpointLocation", chk)
    started = time.perf_counter()
    query = writer.trigger(processingTime="0 seconds").start()
    done = 0
    try:
        while done < rows:
            if query.exception() is not None:
                raise RuntimeError(f"{sink} query failed: {query.exception()}")
            done = sum(p["numInputRows"] for p in query.recentProgress)
            if done < rows:
                time.sleep(0.02)
        elapsed = time.perf_counter() - started
    finally:
        # Stopping interrupts the batch already started after the target; Spark logs that
        # interruption as ERROR, which is noise here.
        spark.sparkContext.setLogLevel("OFF")
        query.stop()
        spark.sparkContext.setLogLevel("WARN")
    written = spark.read.parquet(out).count()
    if written < rows:
        raise RuntimeError(f"{sink}: only {written} rows readable after {rows} were reported")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(chk, ignore_errors=True)
    return elapsed


def commit_overhead_ms(workdir: str, batches: int = 30) -> float:
    import pyarrow as pa

    from connectors.core.sink import TaskInfo
    from connectors.files.sink import FileSink

    out = os.path.join(workdir, "overhead")
    sink = FileSink(out)
    batch = pa.record_batch({"id": pa.array(range(100), pa.int64())})
    times = []
    for b in range(batches):
        messages = [sink.stage(TaskInfo(b, w), iter([batch])) for w in (0, 1)]
        started = time.perf_counter()
        sink.commit(b, messages)
        times.append((time.perf_counter() - started) * 1000)
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--batch-rows", type=int, default=None,
                   help="rows per micro-batch (default: rows/10, at most 200,000)")
    p.add_argument("--workdir", default=None)
    args = p.parse_args(argv)
    batch_rows = args.batch_rows or max(1000, min(200_000, args.rows // 10))
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-files-")
    spark = build_spark()
    try:
        warm = max(batch_rows, args.rows // 10)
        for sink in ("eo_files", "parquet"):
            run_query(spark, sink, warm, batch_rows, workdir)
        spark_s = run_query(spark, "parquet", args.rows, batch_rows, workdir)
        ours_s = run_query(spark, "eo_files", args.rows, batch_rows, workdir)
        overhead = commit_overhead_ms(workdir)
    finally:
        spark.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    ours = args.rows / ours_s
    theirs = args.rows / spark_s
    print(f"eo_files (parquet):         {ours:12,.0f} rows/s  ({ours_s:.1f} s)")
    print(f"Spark parquet file sink:    {theirs:12,.0f} rows/s  ({spark_s:.1f} s)")
    print(f"ratio:                      {ours / theirs:.2f}  (target >= 0.9)")
    print(f"eo_files commit overhead:   {overhead:.1f} ms per batch (2 files, local disk)")
    result = {
        "bench": "file_sink_throughput",
        "rows": args.rows,
        "batch_rows": batch_rows,
        "eo_files_rows_per_s": round(ours, 1),
        "spark_file_sink_rows_per_s": round(theirs, 1),
        "ratio_spark_file_sink": round(ours / theirs, 3),
        "commit_overhead_ms": round(overhead, 2),
        "input": "rate-micro-batch (same JVM source for both), 2 partitions per batch",
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
