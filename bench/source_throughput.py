"""Throughput of the ``eo_kafka`` source against a raw confluent-kafka consume loop.

    python bench/source_throughput.py --rows 1000000      # the issue's figure
    python bench/source_throughput.py --rows 100000       # quick run

Produces ``--rows`` records of ``--value-bytes`` bytes over ``--partitions`` partitions, then
measures, against the same broker in the same run:

- ours: Spark (``local[2]``) reading the topic with ``spark.read.format("eo_kafka")`` into the
  ``noop`` sink (Python workers already started by a small warm-up read);
- baseline: one Python process with a confluent-kafka ``Consumer`` assigned to every
  partition, ``consume(10000)`` in a loop, touching key, value, partition, offset and
  timestamp of every message, until partition EOF everywhere.

Each side runs twice and the better run counts (the machine may be shared). It also prints
the peak RSS of Spark's Python workers (``VmHWM`` from /proc), which should not grow with
``--rows``: the range reader yields bounded Arrow batches and librdkafka's prefetch is
capped. The last line is ``RESULT {json}`` (DESIGN.md section 11).

The broker is ``KAFKA_BOOTSTRAP_SERVERS`` or a local Apache Kafka from the Maven-resolved jars.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import bench_broker, bench_spark  # noqa: E402

from connectors.demo.services.kafka import create_topic, produce_records  # noqa: E402


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
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    })
    started = time.perf_counter()
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    eof: set[int] = set()
    n = 0
    checksum = 0
    while len(eof) < partitions:
        for m in c.consume(10000, 1.0):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:  # type: ignore[union-attr]
                    eof.add(m.partition() or 0)
                continue
            m.key()
            v = m.value()
            m.partition()
            checksum += m.offset() or 0
            m.timestamp()
            n += 1 if v is not None else 0
    elapsed = time.perf_counter() - started
    c.close()
    return n, elapsed


class WorkerMemory:
    """Peak RSS (VmHWM) of the Python processes under Spark's JVM, sampled from /proc."""

    def __init__(self, root_pid: int) -> None:
        self.root = root_pid
        self.peak_kb = 0
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

    def sample(self) -> None:
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
        todo, seen = list(children.get(self.root, [])), set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            todo.extend(children.get(pid, []))
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"python" not in f.read():
                        continue
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak_kb = max(self.peak_kb, int(line.split()[1]))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    bootstrap, broker = bench_broker()
    try:
        topic = f"bench-source-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        t0 = time.perf_counter()
        produce(bootstrap, topic, args.rows, args.partitions, args.value_bytes)
        print(f"produced {args.rows} records in {time.perf_counter() - t0:.1f}s", flush=True)

        spark = bench_spark("bench-source")
        warm = {topic: {str(p): 10 for p in range(args.partitions)}}
        spark_read(spark, bootstrap, topic, warm)  # starts the Python workers

        jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
        ours: list[float] = []
        raw: list[float] = []
        with WorkerMemory(jvm_pid) as mem:
            for i in range(args.repeat):
                n, seconds = raw_consume(bootstrap, topic, args.partitions)
                if n != args.rows:
                    raise SystemExit(f"raw consumer read {n} records, expected {args.rows}")
                raw.append(args.rows / seconds)
                print(f"raw consumer run {i}: {raw[-1]:,.0f} rows/s", flush=True)
                seconds = spark_read(spark, bootstrap, topic, None)
                ours.append(args.rows / seconds)
                print(f"spark eo_kafka run {i}: {ours[-1]:,.0f} rows/s", flush=True)
        count = spark.read.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap) \
            .option("subscribe", topic).load().count()
        if count != args.rows:
            raise SystemExit(f"eo_kafka read {count} records, expected {args.rows}")
        spark.stop()
        best_ours, best_raw = max(ours), max(raw)
        result = {
            "bench": "source_throughput",
            "rows": args.rows,
            "eo_kafka_rows_per_s": round(best_ours),
            "raw_consumer_rows_per_s": round(best_raw),
            "ratio_raw_consumer": round(best_ours / best_raw, 3),
            "peak_worker_rss_mb": round(mem.peak_kb / 1024, 1),
            "partitions": args.partitions,
            "value_bytes": args.value_bytes,
            "spark_cores": 2,
            "runs": args.repeat,
        }
        print(f"Python worker peak RSS: {result['peak_worker_rss_mb']} MB")
        print(f"ratio eo_kafka / raw consumer: {result['ratio_raw_consumer']}")
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
