"""End-to-end latency of Kafka -> ``eo_kafka`` -> ``eo_kafka`` against Spark's own JVM
Kafka -> Kafka pipeline, on one broker under the same steady load.

    python bench/latency.py                        # 1,000 and 10,000 records/s
    python bench/latency.py --rates 1000 --window 30 --warmup 15   # quick

For each rate and pipeline, in one run and on one broker: a producer thread in this process
sends ``--rate`` records/s to a fresh 4-partition input topic, each value the send time
(ns, ``time.time_ns``); the pipeline (``local[2]``, ``Trigger.ProcessingTime(0)``, a fresh
checkpoint) copies ``value`` to a fresh output topic; a ``read_committed`` consumer thread
in this process takes latency = receive time - send time. Only records *sent* after
``--warmup`` seconds and before ``--warmup + --window`` count. Pipelines:

- ``spark``: Spark's JVM Kafka source and sink (at-least-once), in the virtualenv of the
  pyspark whose connector Maven Central serves (tests/services/spark_jvm.py), the baseline;
- ``txn``: ``eo_kafka`` source -> ``eo_kafka`` sink, ``transactional=true``;
- ``rk``: ``eo_kafka`` source -> ``eo_kafka`` sink, recovery keys (the default);
- ``jdbc``: ``eo_kafka`` source -> ``eo_jdbc`` into PostgreSQL (``POSTGRES_DSN`` or the
  test tier's database); latency until a reader polling the table (every 5 ms, by a
  ``bigserial`` column) sees the row;
- ``files``: ``eo_kafka`` source -> ``eo_files`` parquet on local disk; latency until the
  file is among ``committed_files()`` (polled every 10 ms);
- ``noop``: ``eo_kafka`` source -> ``noop``: our source's share of a batch (no latency,
  batch durations only);
- ``floor``: a Python DataSource source that emits one row per batch -> a Python
  DataSource sink that does nothing, neither touching Kafka: what Spark itself spends per
  micro-batch on a Python DataSource pipeline (batch durations only);
- ``srcfloor``: ``eo_kafka`` source -> the floor's sink, and ``sinkfloor``: the floor's
  source -> ``eo_kafka`` sink (``transactional=true``): each side's share above the floor
  (batch durations only).

Reported per pipeline and rate: ``p50``/``p95``/``p99``/``max`` ms, batches per second, and
the median of each part of Spark's ``durationMs`` (``latestOffset``, ``queryPlanning``,
``addBatch``, ``walCommit``, ``commitOffsets``, ``triggerExecution``) over the window's
batches. Ratio keys ``<pipeline>_<rate>_ratio_p50_spark_kafka`` /
``..._ratio_p99_spark_kafka`` are ours / Spark's: lower is better.

The last line is ``RESULT {json}`` (bench/README.md, "The RESULT line"), with
``table_md``: the latency table that bench/run_all.py puts into BENCHMARKS.md.
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
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import bench_broker, bench_spark  # noqa: E402

from connectors.demo.services.kafka import create_topic  # noqa: E402

PARTITIONS = 4
PARTS = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
         "triggerExecution")


class Load:
    """A producer thread at a steady rate (in 10 ms slots) and a ``read_committed``
    consumer thread measuring each record's latency."""

    def __init__(self, bootstrap: str, source: str, sink: str | None, rate: int,
                 watch: Any = None) -> None:
        """``watch(load)``, when given, replaces the consumer of ``sink``: it records each
        output row's latency with :meth:`seen` until ``load.stop`` is set."""
        self.bootstrap, self.source, self.sink, self.rate = bootstrap, source, sink, rate
        self.stop = threading.Event()
        self.latencies: list[tuple[int, float]] = []  # (sent ns, latency ms)
        self.sent = 0
        self.threads = [threading.Thread(target=self._produce, daemon=True)]
        if watch is not None:
            self.threads.append(threading.Thread(target=watch, args=(self,), daemon=True))
        elif sink is not None:
            self.threads.append(threading.Thread(target=self._consume, daemon=True))

    def seen(self, sent_ns: int, now_ns: int) -> None:
        self.latencies.append((sent_ns, (now_ns - sent_ns) / 1e6))

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 1,
                             "enable.idempotence": True})
        slot, per_slot = 0.01, self.rate / 100.0
        began, owed = time.monotonic(), 0.0
        n = 0
        while not self.stop.is_set():
            owed += per_slot
            while owed >= 1:
                producer.produce(self.source, str(time.time_ns()).encode(), None,
                                 n % PARTITIONS)
                n += 1
                owed -= 1
            producer.poll(0)
            wake = began + (n / self.rate if self.rate else 0) + slot
            time.sleep(max(0.0, min(slot, wake - time.monotonic())))
        producer.flush(30)
        self.sent = n

    def _consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": self.bootstrap,
                             "group.id": f"latency-{uuid.uuid4().hex[:8]}",
                             "isolation.level": "read_committed",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 5})
        consumer.subscribe([self.sink])
        try:
            while not self.stop.is_set():
                for m in consumer.consume(1000, 0.05):
                    if m.error() is not None:
                        continue
                    now = time.time_ns()
                    try:
                        sent = int(m.value())
                    except (TypeError, ValueError):
                        continue
                    self.latencies.append((sent, (now - sent) / 1e6))
        finally:
            consumer.close()

    def window(self, began_ns: int, warmup: float, window: float) -> list[float]:
        lo, hi = began_ns + int(warmup * 1e9), began_ns + int((warmup + window) * 1e9)
        return sorted(lat for sent, lat in self.latencies if lo <= sent < hi)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 1)

    return {"p50_ms": at(0.50), "p95_ms": at(0.95), "p99_ms": at(0.99),
            "max_ms": round(values[-1], 1)}


def batch_parts(progress: list[dict[str, Any]], began_ns: int, warmup: float,
                window: float) -> dict[str, Any]:
    """Median of each ``durationMs`` part over the batches that started in the window."""
    from datetime import datetime

    lo, hi = began_ns / 1e9 + warmup, began_ns / 1e9 + warmup + window
    chosen = []
    for p in progress:
        ts = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        if lo <= ts < hi and p.get("numInputRows", 0) > 0:
            chosen.append(p)
    out: dict[str, Any] = {"batches_per_s": round(len(chosen) / window, 2),
                           "batch_ids": [p["batchId"] for p in chosen]}
    for part in PARTS:
        vals = [p["durationMs"][part] for p in chosen if part in p.get("durationMs", {})]
        out[f"{part}_ms"] = round(statistics.median(vals), 1) if vals else None
    return out


class CommitRecords:
    """The ``eo_kafka`` sink's commit records, read as they are written (the sink keeps only
    its newest few): where its time goes inside ``addBatch``."""

    def __init__(self, wal: str) -> None:
        self.dir = os.path.join(wal, "commits")
        self.infos: dict[int, dict[str, Any]] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._collect, daemon=True)
        self.thread.start()

    def _collect(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                names = os.listdir(self.dir)
            except OSError:
                continue  # not made yet
            for name in names:
                stem, _, ext = name.partition(".")
                if ext != "commit" or not stem.isdigit():
                    continue  # a record being written under a temporary name
                b = int(stem)
                if b not in self.infos:
                    try:
                        with open(os.path.join(self.dir, name)) as f:
                            self.infos[b] = json.load(f)
                    except (OSError, ValueError):
                        pass  # being written or dropped: the next pass

    def parts(self, batch_ids: list[int]) -> dict[str, Any]:
        """The median of the batch's slowest task, and of the longest wait for its input
        (the source's read, upstream in the same Spark task), set-up (producer,
        routing and the mode's step 2: the transactional fence and fact read, or the
        recovery-key marker), flush and transaction commit among its tasks."""
        self.stopped.set()
        self.thread.join()
        infos = [self.infos[b] for b in batch_ids if b in self.infos]
        out: dict[str, Any] = {}
        for key, name in (("slowest_task_s", "task_ms"), ("input_s", "task_input_ms"),
                          ("setup_s", "task_setup_ms"),
                          ("flush_s", "task_flush_ms"), ("txn_commit_s", "task_commit_ms")):
            vals = [i[key] * 1000 for i in infos if key in i]
            out[name] = round(statistics.median(vals), 1) if vals else None
        return out


def ours(spark: Any, bootstrap: str, mode: str, rate: int, warmup: float,
         window: float) -> dict[str, Any]:
    if mode == "floor":
        return floor(spark, warmup, window)
    if mode == "sinkfloor":
        return sink_floor(spark, bootstrap, warmup, window)
    source = f"lat-in-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, source, PARTITIONS)
    sink = f"lat-out-{uuid.uuid4().hex[:8]}" if mode in ("txn", "rk") else None
    if sink is not None:
        create_topic(bootstrap, sink, PARTITIONS)
    work = tempfile.mkdtemp(prefix=f"eo-latency-{mode}-")
    df = (spark.readStream.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", source).option("startingOffsets", "earliest")
          .option("walPath", os.path.join(work, "source-wal")).load().select("value"))
    watch = None
    if mode == "noop":
        writer = df.writeStream.format("noop")
    elif mode == "srcfloor":
        register_floor(spark)
        writer = df.writeStream.format("bench_floor")
    elif mode == "jdbc":
        table = f"lat_{uuid.uuid4().hex[:8]}"
        watch = jdbc_watcher(table)
        writer = (df.selectExpr("cast(cast(value as string) as bigint) as sent")
                  .writeStream.format("eo_jdbc").option("url", _sa_url(_dsn()))
                  .option("table", table).option("sink_id", f"lat-jdbc-{uuid.uuid4().hex[:6]}"))
    elif mode == "files":
        out = os.path.join(work, "out")
        watch = files_watcher(out)
        writer = (df.selectExpr("cast(cast(value as string) as bigint) as sent")
                  .writeStream.format("eo_files").option("path", out))
    else:
        writer = (df.writeStream.format("eo_kafka")
                  .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
                  .option("sink_id", f"lat-{mode}-{uuid.uuid4().hex[:6]}")
                  .option("walPath", os.path.join(work, "sink-wal"))
                  .option("transactional", str(mode == "txn").lower()))
    query = (writer.option("checkpointLocation", os.path.join(work, "chk"))
             .trigger(processingTime="0 seconds").start())
    commits = CommitRecords(os.path.join(work, "sink-wal")) if mode in ("txn", "rk") else None
    deadline = time.monotonic() + 240
    while query.lastProgress is None:  # its first (empty) batch has run: started
        if query.exception() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{mode} pipeline did not start: {query.exception()}")
        time.sleep(0.2)
    load = Load(bootstrap, source, sink, rate, watch)
    began = time.time_ns()
    load.start()
    try:
        time.sleep(warmup + window + 5)  # + the window's last records' way through
    finally:
        load.close()
        progress = [json.loads(p.json) for p in query.recentProgress]
        query.stop()
        if hasattr(watch, "drop"):
            watch.drop()
    result = {**percentiles(load.window(began, warmup, window)),
              **batch_parts(progress, began, warmup, window), "sent": load.sent}
    if query.exception() is not None:
        raise SystemExit(f"{mode} pipeline failed: {query.exception()}")
    if commits is not None:
        result.update(commits.parts(result["batch_ids"]))
    del result["batch_ids"]
    return result


def _dsn() -> str:
    return os.environ.get("POSTGRES_DSN", "postgresql://eo:eo@127.0.0.1:5432/eo_test")


def _sa_url(dsn: str) -> str:
    return "postgresql+psycopg://" + dsn.split("://", 1)[1]


def jdbc_watcher(table: str) -> Any:
    """Creates ``table`` (``seq bigserial``, ``sent bigint``); the watcher polls it every
    5 ms for rows past the last ``seq`` seen (one transaction per batch commits them, so
    ``seq`` order is commit order). ``watch.drop()`` drops the table once the query has
    stopped (dropped before, the batch that stop interrupts fails on a missing table)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (seq bigserial PRIMARY KEY, sent bigint)")
                     .format(sql.Identifier(table)))

    def watch(load: Load) -> None:
        last = 0
        query = sql.SQL("SELECT seq, sent FROM {} WHERE seq > %s ORDER BY seq").format(
            sql.Identifier(table))
        with psycopg.connect(_dsn(), autocommit=True) as conn:
            while not load.stop.is_set():
                rows = conn.execute(query, (last,)).fetchall()
                now = time.time_ns()
                for seq, sent in rows:
                    load.seen(sent, now)
                    last = seq
                time.sleep(0.005)

    def drop() -> None:
        with psycopg.connect(_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))

    watch.drop = drop  # type: ignore[attr-defined]
    return watch


def files_watcher(path: str) -> Any:
    """Polls ``committed_files(path)`` every 10 ms; a row's latency ends when its file is
    first listed as committed."""
    import pyarrow.parquet as pq

    from connectors.files.sink import committed_files

    def watch(load: Load) -> None:
        known: set[str] = set()
        while not load.stop.is_set():
            try:
                files = committed_files(path)
            except Exception:  # noqa: BLE001 - nothing committed yet
                files = []
            now = time.time_ns()
            for f in files:
                if f not in known:
                    known.add(f)
                    for sent in pq.read_table(f.removeprefix("file://"),
                                              columns=["sent"]).column("sent").to_pylist():
                        load.seen(sent, now)
            time.sleep(0.01)

    return watch


def register_floor(spark: Any) -> None:
    """``bench_floor``: a Python DataSource source that emits one row per batch and a
    Python DataSource sink that does nothing (neither touches Kafka)."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )

    class FloorReader(DataSourceStreamReader):
        def __init__(self) -> None:
            self.n = 0

        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self) -> dict:
            self.n += 1  # always one more row: a batch every trigger
            return {"n": self.n}

        def partitions(self, start: dict, end: dict) -> list:
            return [InputPartition(end["n"])]

        def read(self, partition: Any) -> Any:
            yield (time.time_ns(),)

        def commit(self, end: dict) -> None:
            pass

    class FloorWriter(DataSourceStreamWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: Any, batchId: int) -> None:  # noqa: N803 - Spark's name
            pass

        def abort(self, messages: Any, batchId: int) -> None:  # noqa: N803
            pass

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_floor"

        def schema(self) -> str:
            return "sent long"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return FloorReader()

        def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
            return FloorWriter()

    spark.dataSource.register(FloorSource)


def _run_unloaded(query: Any, name: str, warmup: float,
                  window: float) -> tuple[list[dict[str, Any]], int]:
    """Waits for ``query``'s first batch, lets it run ``warmup + window`` seconds with no
    input load, stops it; returns its progress reports and when the timing began (ns)."""
    deadline = time.monotonic() + 240
    while query.lastProgress is None:
        if query.exception() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{name} pipeline did not start: {query.exception()}")
        time.sleep(0.2)
    began = time.time_ns()
    try:
        time.sleep(warmup + window + 1)
    finally:
        progress = [json.loads(p.json) for p in query.recentProgress]
        query.stop()
    return progress, began


def floor(spark: Any, warmup: float, window: float) -> dict[str, Any]:
    """The ``floor`` pipeline: Spark's own per-batch cost for a Python DataSource source and
    sink that do nothing (batch durations over the same window; no latency)."""
    register_floor(spark)
    work = tempfile.mkdtemp(prefix="eo-latency-floor-")
    query = (spark.readStream.format("bench_floor").load().writeStream.format("bench_floor")
             .option("checkpointLocation", os.path.join(work, "chk"))
             .trigger(processingTime="0 seconds").start())
    progress, began = _run_unloaded(query, "floor", warmup, window)
    parts = batch_parts(progress, began, warmup, window)
    del parts["batch_ids"]
    return {**percentiles([]), **parts}


def sink_floor(spark: Any, bootstrap: str, warmup: float, window: float) -> dict[str, Any]:
    """The ``sinkfloor`` pipeline: the floor's source (one row per batch) into ``eo_kafka``,
    ``transactional=true``: our sink's share of a batch, with no Kafka source in it (batch
    durations only)."""
    register_floor(spark)
    sink = f"lat-out-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, sink, PARTITIONS)
    work = tempfile.mkdtemp(prefix="eo-latency-sinkfloor-")
    query = (spark.readStream.format("bench_floor").load()
             .selectExpr("cast(cast(sent as string) as binary) as value")
             .writeStream.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", sink).option("sink_id", f"lat-sf-{uuid.uuid4().hex[:6]}")
             .option("walPath", os.path.join(work, "sink-wal")).option("transactional", "true")
             .option("checkpointLocation", os.path.join(work, "chk"))
             .trigger(processingTime="0 seconds").start())
    commits = CommitRecords(os.path.join(work, "sink-wal"))
    progress, began = _run_unloaded(query, "sinkfloor", warmup, window)
    parts = batch_parts(progress, began, warmup, window)
    parts.update(commits.parts(parts.pop("batch_ids")))
    return {**percentiles([]), **parts}


def spark_jvm(bootstrap: str, rate: int, warmup: float, window: float) -> dict[str, Any]:
    from tests.services.spark_jvm import jvm_spark, run_job

    source, sink = (f"lat-jvm-{k}-{uuid.uuid4().hex[:8]}" for k in ("in", "out"))
    for t in (source, sink):
        create_topic(bootstrap, t, PARTITIONS)
    jvm = jvm_spark()
    work = tempfile.mkdtemp(prefix="eo-latency-jvm-")
    started, stop = os.path.join(work, "started"), os.path.join(work, "stop")
    seconds = warmup + window + 5
    holder: dict[str, Any] = {}

    def job() -> None:
        try:
            holder["result"] = run_job(jvm, {
                "action": "latency_copy", "bootstrap": bootstrap, "source": source,
                "sink": sink, "checkpoint": os.path.join(work, "chk"),
                "started_file": started, "stop_file": stop, "max_seconds": seconds + 240,
                "driver_memory": "2g"}, timeout=seconds + 400)
        except Exception as e:  # noqa: BLE001 - reported below
            holder["error"] = e

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    # The load begins once the JVM query has run its first batch, as for ours: start-up
    # (the JVM, the query's first, empty batch) is not what is measured.
    deadline = time.monotonic() + 240
    while not os.path.exists(started):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise SystemExit(f"the JVM latency job did not start: {holder.get('error')}")
        time.sleep(0.2)
    load = Load(bootstrap, source, sink, rate)
    began = time.time_ns()
    load.start()
    time.sleep(seconds)
    load.close()
    with open(stop, "w"):
        pass
    thread.join(300)
    if "error" in holder:
        raise holder["error"]
    result = holder["result"]
    return {**percentiles(load.window(began, warmup, window)),
            **batch_parts(result["progress"], began, warmup, window), "sent": load.sent,
            "spark_version": result["spark_version"]}


def table(results: dict[str, dict[str, Any]], rates: list[int]) -> str:
    lines = ["| pipeline | records/s | p50 ms | p95 ms | p99 ms | max ms | batches/s | "
             "addBatch ms | our slowest task ms (input / set-up / flush / txn commit) | "
             "commitOffsets ms | latestOffset ms | p50 / Spark | p99 / Spark |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rate in rates:
        base = results.get(f"spark_{rate}", {})
        for name in ("spark", *MODES):
            r = results.get(f"{name}_{rate}")
            if r is None:
                continue
            r50 = _ratio(r.get("p50_ms"), base.get("p50_ms")) if name != "spark" else "-"
            r99 = _ratio(r.get("p99_ms"), base.get("p99_ms")) if name != "spark" else "-"
            lines.append(
                f"| {LABELS[name]} | {rate:,} | {r.get('p50_ms', '-')} | {r.get('p95_ms', '-')} "
                f"| {r.get('p99_ms', '-')} | {r.get('max_ms', '-')} | {r.get('batches_per_s')} "
                f"| {r.get('addBatch_ms')} | {_task(r)} | {r.get('commitOffsets_ms')} "
                f"| {r.get('latestOffset_ms')} | {r50} | {r99} |")
    return "\n".join(lines)


LABELS = {"spark": "Spark JVM Kafka -> Kafka (at-least-once)",
          "txn": "eo_kafka -> eo_kafka transactional", "rk": "eo_kafka -> eo_kafka recovery keys",
          "jdbc": "eo_kafka -> eo_jdbc (PostgreSQL)", "files": "eo_kafka -> eo_files (parquet)",
          "noop": "eo_kafka -> noop (source alone)",
          "floor": "Python DataSource -> Python DataSource, both doing nothing (Spark's floor)",
          "srcfloor": "eo_kafka -> Python sink doing nothing (our source's share)",
          "sinkfloor": "Python source, one row per batch -> eo_kafka transactional (our "
                       "sink's share)"}
#: Our pipelines, in the order they run and are shown.
MODES = ("txn", "rk", "jdbc", "files", "noop", "floor", "srcfloor", "sinkfloor")


def _task(r: dict[str, Any]) -> str:
    if r.get("task_ms") is None:
        return "-"
    commit = r.get("task_commit_ms") or "-"
    return (f"{r['task_ms']} ({r.get('task_input_ms')} / {r.get('task_setup_ms')} / "
            f"{r.get('task_flush_ms')} / {commit})")


def _ratio(a: Any, b: Any) -> Any:
    return round(a / b, 2) if isinstance(a, (int, float)) and b else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="1000,10000", help="records/s, comma-separated")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"our pipelines, comma-separated (of {', '.join(MODES)})")
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--rows", type=int, default=None,
                    help="run_all's size knob: a --window of rows/1,000 seconds (min 20)")
    args = ap.parse_args()
    if args.rows is not None:
        args.window = max(20.0, args.rows / 1000.0)
        args.warmup = min(args.warmup, args.window / 2)
    rates = [int(r) for r in args.rates.split(",") if r]
    bootstrap, broker = bench_broker()
    results: dict[str, dict[str, Any]] = {}
    try:
        for rate in rates:
            results[f"spark_{rate}"] = spark_jvm(bootstrap, rate, args.warmup, args.window)
            results[f"spark_{rate}"].pop("batch_ids", None)
            print(f"spark {rate}/s: {results[f'spark_{rate}']}", flush=True)
        spark = bench_spark("bench-latency",
                            **{"spark.sql.streaming.numRecentProgressUpdates": "2000"})
        for rate in rates:
            for mode in args.modes.split(","):
                if mode in ("floor", "sinkfloor") and rate != rates[0]:
                    continue  # no input: the same pipeline at every rate
                results[f"{mode}_{rate}"] = ours(spark, bootstrap, mode, rate, args.warmup,
                                                 args.window)
                print(f"{mode} {rate}/s: {results[f'{mode}_{rate}']}", flush=True)
        spark.stop()
    finally:
        if broker is not None:
            broker.stop()
    flat: dict[str, Any] = {"bench": "latency", "rows": 0, "rates": rates,
                            "warmup_s": args.warmup, "window_s": args.window,
                            "partitions": PARTITIONS,
                            "broker": f"Apache Kafka {getattr(broker, 'version', 'external')}"}
    for key, r in results.items():
        for k in ("p50_ms", "p99_ms", "batches_per_s", "task_ms", "task_setup_ms"):
            if k in r:
                flat[f"{key}_{k}"] = r.get(k)
        if not key.startswith(("spark", "noop", "floor", "srcfloor", "sinkfloor")):
            rate = key.split("_")[1]
            base = results[f"spark_{rate}"]
            flat[f"{key}_ratio_p50_spark_kafka"] = _ratio(r.get("p50_ms"), base.get("p50_ms"))
            flat[f"{key}_ratio_p99_spark_kafka"] = _ratio(r.get("p99_ms"), base.get("p99_ms"))
    flat["table_md"] = table(results, rates)
    print(flat["table_md"], flush=True)
    print("RESULT " + json.dumps(flat), flush=True)


if __name__ == "__main__":
    main()
