"""Throughput of the ``eo_kafka`` source against Spark's own JVM Kafka source and a tuned
raw confluent-kafka consume loop.

    python bench/source_throughput.py --rows 1000000      # the issue's figure
    python bench/source_throughput.py --rows 100000 --skip-jvm   # quick run

Produces ``--rows`` records of ``--value-bytes`` bytes over ``--partitions`` partitions, then
measures, against the same broker and topic in the same run:

- Spark's JVM Kafka source: ``spark.read.format("kafka")`` into the ``noop`` sink, with the
  same Spark settings as ours (``local[2]``, 2 shuffle partitions, 2 GiB driver). Maven
  Central serves no ``spark-sql-kafka`` for every pyspark, so it runs through
  ``tests/services/spark_jvm.py`` (the ``bench_read`` action of
  ``tests/integration/pipelines/spark_kafka_job.py``), in a virtualenv with the connector's
  pyspark when ours has none; both Spark versions are printed.
- ours: Spark (``local[2]``) reading the topic with ``spark.read.format("eo_kafka")`` into
  the ``noop`` sink.
- raw: one Python thread with one confluent-kafka ``Consumer`` assigned to every partition,
  tuned (``consume(50000)``, ``fetch.max.bytes`` 50 MB, ``max.partition.fetch.bytes``
  10 MB), building Arrow arrays of key, value, partition, offset and timestamp, until
  partition EOF everywhere: the per-record Python floor.

Every reader gets one full-size warm-up run, then ``--repeat`` timed runs; the best run
counts (the machine may be shared) and the lowest is reported beside it. It also prints the
peak RSS of Spark's Python workers (``VmHWM`` from /proc, reset before each measurement)
and their peak thread count for ``--rows`` and for ``--rss-rows`` records (default 4x): they
must grow neither with the backlog nor with the partition count, since the reader yields
bounded Arrow batches, librdkafka's prefetch is capped, and a worker keeps a bounded number
of consumers. Last, the driver's cost of one micro-batch and of one ``KafkaWindows`` window
over the same topic (``planning_cost``: milliseconds and Kafka requests). The last line is
``RESULT {json}`` (bench/README.md, "The RESULT line").

The broker is ``KAFKA_BOOTSTRAP_SERVERS`` or a local Apache Kafka (bench/_common.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import operator
import os
import sys
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import bench_broker, bench_spark  # noqa: E402

from connectors.demo.services.kafka import create_topic, produce_records  # noqa: E402

RAW_CONF = {
    "fetch.max.bytes": 50 * 1024 * 1024,
    "max.partition.fetch.bytes": 10 * 1024 * 1024,
}


def produce(bootstrap: str, topic: str, rows: int, partitions: int, value_bytes: int) -> None:
    pad = b"x" * value_bytes

    def records() -> Any:
        for i in range(rows):
            tag = str(i).encode()
            yield None, tag + pad[len(tag):], i % partitions

    produce_records(bootstrap, topic, records(),
                    extra_conf={"linger.ms": 50, "batch.num.messages": 10000,
                                "queue.buffering.max.messages": 1_000_000})


def raw_consume(bootstrap: str, topic: str, partitions: int) -> tuple[int, float]:
    """The tuned single-thread loop: ``(records, seconds)``."""
    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        **RAW_CONF,
    })
    started = time.perf_counter()
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    eof: set[int] = set()
    n = 0
    while len(eof) < partitions:
        msgs = c.consume(50000, 1.0)
        errors = list(map(Message.error, msgs))
        if any(map(operator.is_not, errors, itertools.repeat(None, len(errors)))):
            for m, e in zip(msgs, errors, strict=True):
                if e is not None and e.code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition() or 0)
            msgs = [m for m, e in zip(msgs, errors, strict=True) if e is None]
        if not msgs:
            continue
        stamps = list(map(Message.timestamp, msgs))
        arrays = [
            pa.array(list(map(Message.key, msgs)), pa.binary()),
            pa.array(list(map(Message.value, msgs)), pa.binary()),
            pa.array(list(map(Message.partition, msgs)), pa.int32()),
            pa.array(list(map(Message.offset, msgs)), pa.int64()),
            pa.array([s[1] for s in stamps], pa.int64()),
        ]
        n += len(arrays[1])
    elapsed = time.perf_counter() - started
    c.close()
    return n, elapsed


class WorkerMemory:
    """Peak RSS (VmHWM) and peak thread count of the Python processes under Spark's JVM,
    sampled from /proc (threads every 0.2 s).

    :meth:`reset` clears the high-water marks (``/proc/<pid>/clear_refs``), so that one
    measurement's peak does not carry into the next (Spark reuses its Python workers)."""

    def __init__(self, root_pid: int) -> None:
        self.root = root_pid
        self.peak_kb = 0
        self.peak_threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def reset(self) -> None:
        for pid in self.workers():
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                continue
        self.peak_kb = 0
        self.peak_threads = 0

    def workers(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
        todo, seen, out = list(children.get(self.root, [])), set(), []
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo.extend(children.get(pid, []))
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"python" in f.read():
                        out.append(pid)
            except OSError:
                continue
        return out

    def sample(self) -> None:
        for pid in self.workers():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak_kb = max(self.peak_kb, int(line.split()[1]))
                        elif line.startswith("Threads:"):
                            self.peak_threads = max(self.peak_threads, int(line.split()[1]))
            except OSError:
                continue


def spark_read(spark: Any, bootstrap: str, topic: str, ending: dict[str, Any] | None) -> float:
    reader = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    if ending is not None:
        reader = reader.option("endingOffsets", json.dumps(ending))
    started = time.perf_counter()
    reader.load().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def jvm_source(bootstrap: str, topic: str, rows: int, repeat: int) -> tuple[list[float], str]:
    """Spark's own Kafka source -> noop: ``(rows/s per timed run, description)``."""
    from tests.services.spark_jvm import jvm_spark, run_job

    jvm = jvm_spark()
    print(f"JVM baseline: {jvm.describe()}; our pyspark {jvm.ours}", flush=True)
    out = run_job(jvm, {"action": "bench_read", "bootstrap": bootstrap, "topic": topic,
                        "rows": rows, "repeat": repeat, "driver_memory": "2g"},
                  timeout=1800.0)
    if out["count"] != rows:
        raise SystemExit(f"Spark's Kafka source read {out['count']} records, expected {rows}")
    return list(out["rows_per_s"]), (f"Spark {out['spark_version']} (pyspark "
                                     f"{out['pyspark_version']}), ours pyspark {jvm.ours}")


def profile_read(spark: Any, mem: WorkerMemory, bootstrap: str, topic: str,
                 out: str) -> dict[str, float]:
    """One more eo_kafka read with py-spy (``pip install py-spy``) sampling every Python
    worker, idle time included; returns the share of worker samples per stage."""
    import subprocess

    import connectors.kafka.source.range_reader as range_reader
    import connectors.kafka.source.records as records

    lines: dict[str, set[str]] = {"consume_call": set(), "message_attributes": set()}
    for module in (range_reader, records):
        name = os.path.basename(module.__file__ or "")
        with open(module.__file__ or "") as f:
            for i, text in enumerate(f, 1):
                if ".consume(" in text and "def " not in text:
                    lines["consume_call"].add(f"{name}:{i}")
                if "map(Message." in text or "for m in " in text:
                    lines["message_attributes"].add(f"{name}:{i}")
    spies = [subprocess.Popen(["py-spy", "record", "--idle", "--format", "raw", "-r", "200",
                               "-o", f"{out}.{pid}", "-p", str(pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for pid in mem.workers()]
    time.sleep(2.0)  # py-spy attached
    spark_read(spark, bootstrap, topic, None)
    for spy in spies:
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(60)
    stages: dict[str, float] = {}
    for pid in mem.workers():
        try:
            with open(f"{out}.{pid}") as f:
                samples = f.read().splitlines()
        except OSError:
            continue
        for line in samples:
            stack, _, count = line.rpartition(" ")
            stage = _stage(stack, lines)
            if stage is not None:
                stages[stage] = stages.get(stage, 0) + int(count)
    total = sum(stages.values()) or 1
    return {k: round(100 * v / total, 1) for k, v in sorted(stages.items())}


def _stage(stack: str, lines: dict[str, set[str]]) -> str | None:
    """The stage of one sampled stack (None: the worker was not reading a range).

    py-spy shows Python frames (``func (file:line)``, root first); time in a C call (the
    consume call, ``pa.array``) is the calling line's."""
    frames = stack.split(";")
    if not any("read_ranges" in f for f in frames):
        return "handoff_to_spark" if any("dump_stream" in f for f in frames) else None
    leaf = frames[-1]
    where = leaf.rsplit("/", 1)[-1].rstrip(")")
    for stage, places in lines.items():
        if where in places:
            return stage
    if leaf.startswith("<listcomp>"):
        return "message_attributes"
    if any(f.startswith("to_batch") for f in frames):
        return "arrow_building"
    return "other_read"


def planning_cost(bootstrap: str, topic: str, rows: int, batches: int = 10) -> dict[str, Any]:
    """The driver's cost of one micro-batch over ``topic`` (no Spark session: the stream
    reader's own calls, as Spark makes them), and of one ``KafkaWindows`` window.

    Micro-batch: ``latestOffset`` (metadata, ListOffsets of every partition, admission
    control), ``partitions`` (the plan and the window WAL record) and ``commit`` (the WAL
    commit marker, the consumer-group commit, retention), ``batches`` of them under a
    ``maxOffsetsPerTrigger`` that spreads the topic over ``batches`` + 1 windows. Window:
    ``next_window`` + ``ranges`` + ``commit`` of the planner ``KafkaWindows`` drives. Median
    milliseconds of the steady batches (the first, which connects, is left out), and the
    Kafka requests of one batch: librdkafka's, counted from its protocol debug log, and the
    wire client's, counted where it sends (``Connection.send``; the same count on a checkout
    before the cluster object existed, so two checkouts compare)."""
    import collections
    import logging
    import re
    import shutil
    import statistics
    import tempfile

    from pyspark.sql.streaming.datasource import ReadMaxRows

    from connectors.kafka.common import LIBRDKAFKA_LOG
    from connectors.kafka.source.options import KafkaSourceOptions
    from connectors.kafka.source.planner import KafkaPlanner
    from connectors.kafka.wire import protocol
    from connectors.spark.kafka_source import stream_reader

    sent: collections.Counter[str] = collections.Counter()

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = re.search(r"Sent (\w+)Request", record.getMessage())
            if found:
                sent[found.group(1)] += 1

    send = protocol.Connection.send

    def counted(self: Any, api: int, *args: Any, **kwargs: Any) -> int:
        sent[f"{protocol.API_NAMES.get(api, api)} (wire)"] += 1
        return send(self, api, *args, **kwargs)

    def drain(clusters: Any) -> dict[str, int]:
        # librdkafka hands its log lines to Python when a client is polled
        for client in [*getattr(clusters, "_admins", {}).values(),
                       *clusters._committers.values()]:
            client.poll(0.2)
        counts = dict(sent)
        sent.clear()
        return counts

    handler, level = Count(), LIBRDKAFKA_LOG.level
    protocol.Connection.send = counted  # type: ignore[method-assign]
    LIBRDKAFKA_LOG.addHandler(handler)
    LIBRDKAFKA_LOG.setLevel(logging.DEBUG)
    per = str(max(1, rows // (batches + 1)))
    base = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
            "startingOffsets": "earliest", "maxOffsetsPerTrigger": per,
            "kafka.debug": "protocol"}
    steps: dict[str, list[float]] = collections.defaultdict(list)
    requests: dict[str, dict[str, int]] = {}
    scratch = tempfile.mkdtemp(prefix="eo-plan-")  # both WALs; removed at the end
    try:
        reader = stream_reader({**base, "walPath": os.path.join(scratch, "stream"),
                                "kafka.group.id": f"bench-plan-{uuid.uuid4().hex[:8]}"},
                               None)  # type: ignore[arg-type]
        start = reader.initialOffset()
        drain(reader.planner.clusters)
        for i in range(batches):
            t0 = time.perf_counter()
            end = reader.latestOffset(start, ReadMaxRows(int(per)))
            t1 = time.perf_counter()
            reader.partitions(start, end)
            t2 = time.perf_counter()
            reader.commit(end)
            t3 = time.perf_counter()
            counts = drain(reader.planner.clusters)
            if i:
                steps["latest_offset"].append(t1 - t0)
                steps["partitions"].append(t2 - t1)
                steps["commit"].append(t3 - t2)
                requests["batch"] = counts
            start = end
        reader.stop()
        opts = KafkaSourceOptions.from_options(
            {**base, "walPath": os.path.join(scratch, "windows"),
             "kafka.group.id": f"bench-plan-w-{uuid.uuid4().hex[:8]}"}, batch=True)
        planner = KafkaPlanner(opts)
        for i in range(batches):
            t0 = time.perf_counter()
            w = planner.next_window()
            if w is None:
                break
            planner.ranges(w.start, w.end)
            t1 = time.perf_counter()
            planner.commit(w.end, window=w.window)
            t2 = time.perf_counter()
            counts = drain(planner.clusters)
            if i:
                steps["window_next"].append(t1 - t0)
                steps["window_commit"].append(t2 - t1)
                requests["window"] = counts
        planner.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        protocol.Connection.send = send  # type: ignore[method-assign]
        LIBRDKAFKA_LOG.removeHandler(handler)
        LIBRDKAFKA_LOG.setLevel(level)
    out: dict[str, Any] = {f"plan_{k}_ms": round(1000 * statistics.median(v), 2)
                           for k, v in steps.items()}
    out["plan_batch_total_ms"] = round(sum(out[f"plan_{k}_ms"] for k in
                                           ("latest_offset", "partitions", "commit")), 2)
    out["plan_requests_per_batch"] = requests.get("batch", {})
    out["plan_requests_per_window"] = requests.get("window", {})
    return out


def _summary(name: str, rates: list[float]) -> str:
    return f"{name}: best {max(rates):,.0f} rows/s, lowest {min(rates):,.0f} rows/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rss-rows", type=int, default=None,
                    help="records of the second memory measurement (default 4x --rows; 0: skip)")
    ap.add_argument("--skip-jvm", action="store_true", help="no Spark JVM Kafka source run")
    ap.add_argument("--plan-only", action="store_true",
                    help="only the driver's cost per micro-batch (no Spark read): its plan_* "
                         "figures and requests, for comparing two checkouts quickly")
    ap.add_argument("--profile", metavar="PREFIX",
                    help="also profile one eo_kafka read with py-spy; raw stacks to PREFIX.<pid>")
    args = ap.parse_args()
    rss_rows = 4 * args.rows if args.rss_rows is None else args.rss_rows

    bootstrap, broker = bench_broker()
    try:
        topic = f"bench-source-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        t0 = time.perf_counter()
        produce(bootstrap, topic, args.rows, args.partitions, args.value_bytes)
        print(f"produced {args.rows} records in {time.perf_counter() - t0:.1f}s", flush=True)

        if args.plan_only:
            plan = planning_cost(bootstrap, topic, args.rows)
            print("RESULT " + json.dumps({"bench": "source_throughput_plan", "rows": args.rows,
                                          "partitions": args.partitions, **plan}), flush=True)
            return
        # The JVM baseline first, in its own process, so the two Spark JVMs never overlap.
        jvm: list[float] = []
        versions = "skipped"
        if not args.skip_jvm:
            jvm, versions = jvm_source(bootstrap, topic, args.rows, args.repeat)
            print(_summary("spark kafka source", jvm), flush=True)

        raw: list[float] = []
        raw_consume(bootstrap, topic, args.partitions)  # warm-up
        for i in range(args.repeat):
            n, seconds = raw_consume(bootstrap, topic, args.partitions)
            if n != args.rows:
                raise SystemExit(f"raw consumer read {n} records, expected {args.rows}")
            raw.append(args.rows / seconds)
            print(f"raw consumer run {i}: {raw[-1]:,.0f} rows/s", flush=True)

        spark = bench_spark("bench-source")
        jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
        ours: list[float] = []
        with WorkerMemory(jvm_pid) as mem:
            spark_read(spark, bootstrap, topic, None)  # full-size warm-up
            mem.sample()
            mem.reset()
            for i in range(args.repeat):
                seconds = spark_read(spark, bootstrap, topic, None)
                ours.append(args.rows / seconds)
                print(f"spark eo_kafka run {i}: {ours[-1]:,.0f} rows/s", flush=True)
            mem.sample()
            rss_mb = mem.peak_kb / 1024
            threads = mem.peak_threads
            rss_big_mb = None
            threads_big = None
            if rss_rows:
                big = f"bench-source-rss-{uuid.uuid4().hex[:8]}"
                create_topic(bootstrap, big, args.partitions)
                produce(bootstrap, big, rss_rows, args.partitions, args.value_bytes)
                mem.reset()
                seconds = spark_read(spark, bootstrap, big, None)
                mem.sample()
                rss_big_mb = mem.peak_kb / 1024
                threads_big = mem.peak_threads
                print(f"spark eo_kafka {rss_rows} records: {rss_rows / seconds:,.0f} rows/s, "
                      f"peak worker RSS {rss_big_mb:.1f} MB, {threads_big} threads", flush=True)
            profile = None
            if args.profile:
                profile = profile_read(spark, mem, bootstrap, topic, args.profile)
                print(f"profile (% of Python worker samples while reading): {profile}",
                      flush=True)
        count = spark.read.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap) \
            .option("subscribe", topic).load().count()
        if count != args.rows:
            raise SystemExit(f"eo_kafka read {count} records, expected {args.rows}")
        spark.stop()
        plan = planning_cost(bootstrap, topic, args.rows)
        print(f"driver cost per micro-batch: {plan}", flush=True)
        best_ours, best_raw = max(ours), max(raw)
        result: dict[str, Any] = {
            "bench": "source_throughput",
            "rows": args.rows,
            "eo_kafka_rows_per_s": round(best_ours),
            "eo_kafka_lowest_rows_per_s": round(min(ours)),
            "raw_consumer_rows_per_s": round(best_raw),
            "raw_consumer_lowest_rows_per_s": round(min(raw)),
            "ratio_raw_consumer": round(best_ours / best_raw, 3),
        }
        if jvm:
            result.update({
                "spark_kafka_source_rows_per_s": round(max(jvm)),
                "spark_kafka_source_lowest_rows_per_s": round(min(jvm)),
                "ratio_spark_kafka_source": round(best_ours / max(jvm), 3),
                "ratio_spark_kafka_source_lowest": round(min(ours) / max(jvm), 3),
                "spark_versions": versions,
            })
        result.update({
            "peak_worker_rss_mb": round(rss_mb, 1),
            "rss_rows": rss_rows,
            "peak_worker_rss_mb_rss_rows": None if rss_big_mb is None else round(rss_big_mb, 1),
            "peak_worker_threads": threads,
            "peak_worker_threads_rss_rows": threads_big,
            **plan,
            "broker": "env" if broker is None else f"Apache Kafka {broker.version}",
            "partitions": args.partitions,
            "value_bytes": args.value_bytes,
            "spark_cores": 2,
            "runs": args.repeat,
        })
        if profile is not None:
            result["profile_pct"] = profile
        print(_summary("eo_kafka", ours))
        print(_summary("raw consumer", raw))
        print(f"Python worker peak RSS: {rss_mb:.1f} MB ({args.rows} records), "
              f"{result['peak_worker_rss_mb_rss_rows']} MB ({rss_rows} records); peak "
              f"threads {threads}, {threads_big}")
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
