"""Run the benchmarks, keep each one's latest figures, and write BENCHMARKS.md from them.

    python bench/run_all.py                 # full sizes (the issues' figures)
    python bench/run_all.py --quick         # small --rows for a smoke run
    python bench/run_all.py --only jdbc     # one benchmark
    python bench/run_all.py --only avro --from-log avro=avro.log   # a run made by hand

Each benchmark prints a final ``RESULT {json}`` line (bench/README.md, "The RESULT line");
this script parses those lines only, so a benchmark's own logs never confuse the report.
A benchmark that ran (or whose log was merged) gets its file in bench/results/ replaced;
BENCHMARKS.md and its chart are then rendered whole from all those files (bench/_report.py),
and the run is added on top of bench/HISTORY.md. A benchmark that failed keeps its figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

from _report import (
    Outcome,
    Record,
    add_history_entry,
    bars,
    chart,
    history_entry,
    load_records,
    render,
    save_record,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
HISTORY = os.path.join(HERE, "HISTORY.md")

# name -> (script and its arguments, full rows, quick rows, [(ratio key, target or None)])
BENCHES: dict[str, tuple[str, int, int, list[tuple[str, float | None]]]] = {
    "source": ("source_throughput.py", 1_000_000, 100_000,
               [("ratio_spark_kafka_source", 1.5), ("ratio_raw_consumer", 0.8)]),
    # Many partitions (issue 25): the same reads over 100 and 1,000 partitions.
    "source_p100": ("source_throughput.py --partitions 100", 1_000_000, 100_000,
                    [("ratio_spark_kafka_source", 1.0), ("ratio_raw_consumer", 0.8)]),
    "source_p1000": ("source_throughput.py --partitions 1000", 1_000_000, 100_000,
                     [("ratio_spark_kafka_source", 2.0), ("ratio_raw_consumer", 0.8)]),
    # Every commit scope (issue 53): append on PostgreSQL, upsert and accumulate against
    # raw INSERT ... ON CONFLICT, append on MariaDB.
    "jdbc": ("jdbc_throughput.py", 1_000_000, 100_000,
             [("ratio_spark_jdbc", 2.0), ("ratio_raw_copy", 0.5),
              ("task_ratio_spark_jdbc", 3.0), ("task_ratio_raw_copy", 0.8),
              ("prepared_ratio_spark_jdbc", 3.0), ("prepared_ratio_raw_copy", 0.8),
              ("upsert_batch_ratio_raw_upsert", None), ("upsert_task_ratio_raw_upsert", None),
              ("upsert_task_ratio_raw_upsert_copy", None),
              ("accumulate_batch_ratio_raw_accumulate", None),
              ("accumulate_task_ratio_raw_accumulate", None),
              ("accumulate_task_ratio_raw_accumulate_copy", None),
              ("mariadb_batch_ratio_mariadb_spark_jdbc", None),
              ("mariadb_task_ratio_mariadb_spark_jdbc", 2.0),
              ("mariadb_task_ratio_mariadb_raw_load", None)]),
    "kafka_sink": ("kafka_sink_throughput.py", 1_000_000, 100_000,
                   [("txn_ratio_raw_producer", 0.8), ("txn_ratio_spark_kafka_sink", 1.5),
                    ("rk_ratio_spark_kafka_sink", 1.0),
                    ("txn_librdkafka_ratio_spark_kafka_sink", None),
                    ("floor_ratio_spark_kafka_sink", None)]),
    "kafka_sink_p1000": ("kafka_sink_throughput.py --partitions 1000", 1_000_000, 100_000,
                         [("txn_ratio_spark_kafka_sink", 1.5),
                          ("rk_ratio_spark_kafka_sink", 1.0),
                          ("txn_librdkafka_ratio_spark_kafka_sink", None),
                          ("floor_ratio_spark_kafka_sink", None)]),
    # The production setting (issue 34): three KRaft nodes, replication 3, min ISR 2,
    # acks=all; each mode on both produce paths (wire and librdkafka).
    "kafka_sink_cluster": ("kafka_sink_throughput.py --cluster --repeat 3 --warmup 2",
                           1_000_000, 100_000,
                           [("txn_ratio_spark_kafka_sink", 1.5),
                            ("rk_ratio_spark_kafka_sink", 1.0),
                            ("txn_librdkafka_ratio_spark_kafka_sink", 1.5),
                            ("rk_librdkafka_ratio_spark_kafka_sink", 1.0)]),
    "kafka_sink_cluster_p1000": ("kafka_sink_throughput.py --cluster --partitions 1000 "
                                 "--repeat 2 --warmup 2", 1_000_000, 100_000,
                                 [("txn_ratio_spark_kafka_sink", 1.5),
                                  ("rk_ratio_spark_kafka_sink", 1.0),
                                  ("txn_librdkafka_ratio_spark_kafka_sink", 1.5),
                                  ("rk_librdkafka_ratio_spark_kafka_sink", 1.0)]),
    "files": ("file_sink_throughput.py --s3", 2_000_000, 200_000,
              [("ratio_spark_file_sink", 0.9), ("s3_ratio_spark_s3_file_sink", None),
               ("s3_ratio_local_eo_files", None)]),
    # Schema Registry formats (issue 35): Avro read and write against Spark's from_avro /
    # to_avro with its JVM Kafka source and sink, a real registry
    "avro": ("avro_throughput.py", 1_000_000, 100_000,
             [("read_ratio_spark_avro_read", 1.5), ("write_ratio_spark_avro_write", 1.5)]),
    # what the metrics cost (issue 44): one streaming pipeline with connectors.monitoring
    # on (scraped every second) and off, alternating in one run
    "metrics_overhead": ("metrics_overhead.py", 1_000_000, 200_000,
                         [("ratio_metrics_off", 0.98)]),
    # requests and ms per batch of each connector's state on S3 (figures, no ratio target)
    "object_store": ("object_store_commit.py", 40, 20, []),
    # end-to-end latency against Spark's JVM Kafka -> Kafka (its own table; lower is
    # better): "rows" sets the measured window, 60,000 -> 60 s per pipeline and rate
    "latency": ("latency.py", 60_000, 20_000, []),
    # a week in an hour (issue 52): the four sinks in one driver with a driver and a broker
    # restart, every resource's growth per 1,000 batches (its own table and chart, no
    # ratio): "rows" is the micro-batches per query to reach, the run ending at --minutes
    "endurance": ("endurance.py --minutes 60", 10_000, 1_000, []),
}

#: Targets between two benchmarks of one run: (label, numerator (bench, key), denominator
#: (bench, key), highest allowed ratio).
CROSS: list[tuple[str, tuple[str, str], tuple[str, str], float]] = [
    ("peak Python worker RSS, 1,000 partitions / 4 partitions",
     ("source_p1000", "peak_worker_rss_mb"), ("source", "peak_worker_rss_mb"), 1.5),
]
TARGETS = {name: spec[3] for name, spec in BENCHES.items()}


def command(name: str, rows: int) -> str:
    """The command that measures benchmark ``name`` at ``rows``, as a reader types it at the
    repository's root."""
    script, *extra = BENCHES[name][0].split()
    return " ".join(["python", f"bench/{script}", *extra, "--rows", str(rows)])


def parse_result(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        if line.startswith("RESULT "):
            doc: dict[str, Any] = json.loads(line[len("RESULT "):])
            return doc
    return None


def run_one(name: str, rows: int, timeout: float) -> dict[str, Any]:
    script, _, _, _ = BENCHES[name]
    script, *extra = script.split()
    cmd = [sys.executable, os.path.join(HERE, script), *extra, "--rows", str(rows)]
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"bench": name, "error": f"timed out after {timeout}s"}
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        tail = (proc.stdout + proc.stderr)[-2000:]
        print(f"   {name} failed (exit {proc.returncode}):\n{tail}", flush=True)
        return {"bench": name, "error": f"exit {proc.returncode}, no RESULT line"}
    result["wall_s"] = round(time.monotonic() - started, 1)
    print("   " + json.dumps(result), flush=True)
    return result


def machine() -> str:
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except OSError:
        pass
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores{mem}, "
            f"Python {platform.python_version()}")


def read_log(path: str) -> tuple[dict[str, Any], str]:
    """The RESULT line of a benchmark's output saved in ``path``, and the day it was
    measured (the day the log was last written)."""
    with open(path) as f:
        result = parse_result(f.read())
    if result is None:
        raise SystemExit(f"{path}: no RESULT line (bench/README.md, \"The RESULT line\")")
    return result, dt.date.fromtimestamp(os.path.getmtime(path)).isoformat()


def measure(name: str, args: argparse.Namespace, logs: dict[str, str]) -> Outcome:
    """Run benchmark ``name``, or take its figures from its log in ``logs``."""
    rows = BENCHES[name][2] if args.quick else BENCHES[name][1]
    if name in logs:
        result, day = read_log(logs[name])
        how = f"merged from its log {os.path.basename(logs[name])}"
    else:
        result, day, how = run_one(name, rows, args.timeout), dt.date.today().isoformat(), "ran"
        if "error" in result:
            return Outcome(name, None, f"failed ({result['error']}); its figures are older")
    # latency and object_store report rows=0: their --rows sets a window or a batch count
    if isinstance(result.get("rows"), int) and result["rows"] > 0:
        rows = result["rows"]
    return Outcome(name, Record(name, command(name, rows), day, machine(), result), how)


def write_benchmarks(store: str, out: str, chart_path: str) -> None:
    """BENCHMARKS.md and its chart, whole, from every benchmark's file in ``store``."""
    records = load_records(store)
    rel = os.path.relpath(chart_path, os.path.dirname(os.path.abspath(out)))
    with open(out, "w") as f:
        f.write(render(records, TARGETS, CROSS, rel))
    if found := bars(records, TARGETS):
        os.makedirs(os.path.dirname(os.path.abspath(chart_path)), exist_ok=True)
        chart(found, chart_path)


def invocation(args: argparse.Namespace, logs: dict[str, str]) -> str:
    """The run's command for the history (a log by its file name: a path is the machine's)."""
    words = ["python bench/run_all.py", *(["--quick"] if args.quick else []),
             *(f"--only {name}" for name in args.only or []),
             *(f"--from-log {name}={os.path.basename(p)}" for name, p in logs.items())]
    return " ".join(words)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small --rows for a smoke run")
    p.add_argument("--only", action="append", choices=sorted(BENCHES), help="run only these")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per benchmark")
    p.add_argument("--from-log", action="append", default=[], metavar="NAME=FILE",
                   help="take benchmark NAME's RESULT line from FILE (the output of its "
                   "command run by hand, e.g. under flock) instead of running it")
    p.add_argument("--results", default=RESULTS, help="the figures' store, a JSON per benchmark")
    p.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    p.add_argument("--chart", default=os.path.join(ROOT, "docs", "benchmarks.png"))
    p.add_argument("--history", default=HISTORY, help="the run log, newest first")
    return p


def logs_of(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """``--from-log`` as {benchmark: log file}, each a benchmark this run measures."""
    logs = {name: path for name, _, path in (item.partition("=") for item in args.from_log)}
    for name, path in logs.items():
        if name not in (args.only or BENCHES) or not path:
            p.error(f"--from-log {name}={path}: give NAME=FILE with NAME a benchmark of this "
                    f"run: {', '.join(args.only or sorted(BENCHES))}")
    return logs


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    logs = logs_of(p, args)
    outcomes = [measure(name, args, logs) for name in args.only or list(BENCHES)]
    for outcome in outcomes:
        if outcome.record is not None:
            save_record(args.results, outcome.record)
    write_benchmarks(args.results, args.out, args.chart)
    add_history_entry(args.history, history_entry(
        dt.date.today().isoformat(), invocation(args, logs), machine(), outcomes, TARGETS))
    print(f"wrote {args.out}, {args.chart} and {args.history}; figures in {args.results}")
    return 0 if all(o.record is not None for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
