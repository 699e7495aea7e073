"""Run every benchmark, then write BENCHMARKS.md and a bar chart of the ratios.

    python bench/run_all.py                 # full sizes (the issues' figures)
    python bench/run_all.py --quick         # small --rows for a smoke run
    python bench/run_all.py --only jdbc     # one benchmark

Each benchmark prints a final ``RESULT {json}`` line (bench/README.md, "The RESULT line");
this script parses those lines only, so a benchmark's own logs never confuse the report.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name -> (script and its arguments, full rows, quick rows, [(ratio key, target or None)])
BENCHES: dict[str, tuple[str, int, int, list[tuple[str, float | None]]]] = {
    "source": ("source_throughput.py", 1_000_000, 100_000,
               [("ratio_spark_kafka_source", 1.5), ("ratio_raw_consumer", 0.8)]),
    # Many partitions (issue 25): the same reads over 100 and 1,000 partitions.
    "source_p100": ("source_throughput.py --partitions 100", 1_000_000, 100_000,
                    [("ratio_spark_kafka_source", 1.0), ("ratio_raw_consumer", 0.8)]),
    "source_p1000": ("source_throughput.py --partitions 1000", 1_000_000, 100_000,
                     [("ratio_spark_kafka_source", 2.0), ("ratio_raw_consumer", 0.8)]),
    "jdbc": ("jdbc_throughput.py", 1_000_000, 100_000,
             [("ratio_spark_jdbc", 2.0), ("ratio_raw_copy", 0.5)]),
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
}

#: Targets between two benchmarks of one run: (label, numerator (bench, key), denominator
#: (bench, key), highest allowed ratio).
CROSS: list[tuple[str, tuple[str, str], tuple[str, str], float]] = [
    ("peak Python worker RSS, 1,000 partitions / 4 partitions",
     ("source_p1000", "peak_worker_rss_mb"), ("source", "peak_worker_rss_mb"), 1.5),
]


def rate_keys(result: dict[str, Any], ratio_key: str) -> tuple[str | None, str]:
    """``(ours, baseline)`` rows/s keys of a ratio key: ``ratio_raw_copy`` -> (the first
    ``*_rows_per_s`` key, ``raw_copy_rows_per_s``); ``txn_ratio_raw_producer`` ->
    (``txn_rows_per_s``, ``raw_producer_rows_per_s``)."""
    mode, _, base = ratio_key.partition("ratio_")
    if mode:
        return f"{mode}rows_per_s", f"{base}_rows_per_s"
    ours = next((k for k in result if k.endswith("_rows_per_s")), None)
    return ours, f"{base}_rows_per_s"


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
        return {"bench": name, "suite_key": name, "error": f"timed out after {timeout}s"}
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        tail = (proc.stdout + proc.stderr)[-2000:]
        print(f"   {name} failed (exit {proc.returncode}):\n{tail}", flush=True)
        return {"bench": name, "suite_key": name, "tail": tail,
                "error": f"exit {proc.returncode}, no RESULT line"}
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["suite_key"] = name
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


def write_report(results: list[dict[str, Any]], path_md: str, path_png: str, quick: bool) -> None:
    rows = []
    bars: list[tuple[str, float, float]] = []
    for r in results:
        name = r.get("bench", "?")
        name = r.get("suite_key", name)
        targets = BENCHES.get(name, ("", 0, 0, []))[3]
        if "error" in r:
            rows.append(f"| {name} | - | - | error: {r['error']} | - | - |")
            continue
        for key, target in targets:
            ratio = r.get(key)
            ours_key, base_key = rate_keys(r, key)
            ours = r.get(ours_key) if ours_key else None
            base = r.get(base_key)
            label = key.replace("ratio_", "")
            if target is None:  # reported, no target set
                rows.append(f"| {name} | {r.get('rows')} | {_fmt(ours)} | {label}: "
                            f"{_fmt(base)} | {_fmt(ratio, 2)} | - |")
                continue
            ok = "yes" if isinstance(ratio, (int, float)) and ratio >= target else "no"
            rows.append(f"| {name} | {r.get('rows')} | {_fmt(ours)} | {label}: {_fmt(base)} "
                        f"| {_fmt(ratio, 2)} (target >= {target}) | {ok} |")
            if isinstance(ratio, (int, float)):
                bars.append((f"{name}\n{key.replace('ratio_', '')}", float(ratio), target))
    by_key = {r.get("suite_key"): r for r in results if "error" not in r}
    for label, (a, ka), (b, kb), most in CROSS:
        x, y = by_key.get(a, {}).get(ka), by_key.get(b, {}).get(kb)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
            ok = "yes" if x / y <= most else "no"
            rows.append(f"| {label} | - | {_fmt(x, 1)} | {_fmt(y, 1)} | {_fmt(x / y, 2)} "
                        f"(target <= {most}) | {ok} |")
    extras = []
    for r in results:
        keep = {k: v for k, v in r.items() if not k.endswith("_rows_per_s")
                and "ratio_" not in k
                and k not in ("bench", "rows", "tail", "suite_key", "table_md")}
        if keep:
            figures = ", ".join(f"{k}={v}" for k, v in keep.items())
            extras.append(f"- **{r.get('suite_key', r.get('bench'))}**: {figures}")
    # Benchmarks that are not rows/s (latency: lower is better) bring their own table.
    tables = [f"### {r['suite_key']}\n\n{r['table_md']}\n" for r in results
              if r.get("table_md")]
    today = dt.date.today().isoformat()
    md = [
        "# Benchmarks",
        "",
        f"Generated by `python bench/run_all.py{' --quick' if quick else ''}` on {today}.",
        f"Machine: {machine()}.",
        "",
        "Each ratio compares our connector with a baseline measured in the same run on the "
        "same machine (bench/README.md). Absolute rows/s vary between machines; ratios "
        "are the figures to compare.",
        "",
        "| benchmark | rows | ours rows/s | baseline rows/s | ratio | meets target |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        *tables,
        "Other figures:",
        "",
        *extras,
        "",
        f"![ratios]({os.path.relpath(path_png, os.path.dirname(os.path.abspath(path_md)))})",
        "",
    ]
    with open(path_md, "w") as f:
        f.write("\n".join(md))
    if bars:
        chart(bars, path_png)


def _parts(md: str) -> tuple[list[str], dict[str, list[str]], dict[str, str], dict[str, str]]:
    """A report's pieces: the lines before the ratio table's rows, its rows by benchmark
    (in order), each benchmark's own table section, and each one's "Other figures" line."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|---")) + 1
    rows: dict[str, list[str]] = {}
    i = start
    while i < len(lines) and lines[i].startswith("|"):
        rows.setdefault(lines[i].split("|")[1].strip(), []).append(lines[i])
        i += 1
    tables = {m.group(1): m.group(0) for m in re.finditer(
        r"^### (\S+)\n\n(?:\|.*\n)+", md, re.M)}
    extras = {m.group(1): m.group(0) for m in re.finditer(r"^- \*\*(\S+)\*\*: .*$", md, re.M)}
    return lines[:start], rows, tables, extras


def merge_report(old_md: str, new_md: str, names: list[str], today: str) -> str:
    """``old_md`` with the benchmarks in ``names`` replaced by ``new_md``'s (``--only``
    re-runs some benchmarks and keeps the others' figures, saying which ran when)."""
    head, rows, tables, extras = _parts(old_md)
    _, new_rows, new_tables, new_extras = _parts(new_md)
    for name in names:
        rows[name] = new_rows.get(name, [])
        for mine, theirs in ((tables, new_tables), (extras, new_extras)):
            if name in theirs:
                mine[name] = theirs[name]
            else:
                mine.pop(name, None)
    note = f"Re-run on {today} with `--only`: {', '.join(names)}; the other figures are older."
    head = [line for line in head if not line.startswith("Re-run on ")]
    after = next((i for i, line in enumerate(head) if line.startswith("Machine:")), 0)
    head[after + 1:after + 1] = ["", note]
    md = [*head, *(r for rs in rows.values() for r in rs), "", *tables.values(),
          "Other figures:", "", *extras.values(), ""]
    chart_line = next((line for line in old_md.splitlines() if line.startswith("![ratios]")),
                      None)
    if chart_line:
        md += [chart_line, ""]
    return "\n".join(md)


def chart(bars: list[tuple[str, float, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.8 * len(bars) + 2, 4))
    names = [b[0] for b in bars]
    values = [b[1] for b in bars]
    colors = ["#2a9d8f" if b[1] >= b[2] else "#e76f51" for b in bars]
    ax.bar(names, values, color=colors)
    for i, (_, value, target) in enumerate(bars):
        ax.hlines(target, i - 0.4, i + 0.4, colors="black", linestyles="dashed")
        ax.text(i, value, f"{value:.2f}", ha="center", va="bottom")
    ax.set_ylabel("ratio vs baseline (higher is better)")
    ax.set_title("exactly-once connectors vs baselines (dashed: target)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v: Any, digits: int = 0) -> str:
    if isinstance(v, (int, float)):
        return f"{v:,.{digits}f}"
    return "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small --rows for a smoke run")
    p.add_argument("--only", action="append", choices=sorted(BENCHES), help="run only these")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per benchmark")
    p.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    p.add_argument("--chart", default=os.path.join(ROOT, "docs", "benchmarks.png"))
    p.add_argument("--from-log", action="append", default=[], metavar="NAME=FILE",
                   help="take benchmark NAME's RESULT line from FILE (the output of the same "
                   "command run by hand, e.g. under flock) instead of running it")
    args = p.parse_args()
    logged = dict(item.split("=", 1) for item in args.from_log)
    results = []
    for name in args.only or list(BENCHES):
        rows = BENCHES[name][2] if args.quick else BENCHES[name][1]
        if name in logged:
            with open(logged[name]) as f:
                result = parse_result(f.read())
            if result is None:
                raise SystemExit(f"{logged[name]}: no RESULT line")
            results.append({**result, "suite_key": name})
            continue
        results.append(run_one(name, rows, args.timeout))
    os.makedirs(os.path.dirname(args.chart), exist_ok=True)
    if args.only and os.path.exists(args.out):
        # Keep the other benchmarks' figures: merge the new ones into the report.
        with open(args.out) as f:
            old_md = f.read()
        write_report(results, args.out, args.chart + ".new.png", args.quick)
        with open(args.out) as f:
            new_md = f.read()
        with open(args.out, "w") as f:
            f.write(merge_report(old_md, new_md, args.only, dt.date.today().isoformat()))
        with contextlib.suppress(FileNotFoundError):
            os.remove(args.chart + ".new.png")
    else:
        write_report(results, args.out, args.chart, args.quick)
    print(f"wrote {args.out} and {args.chart}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
