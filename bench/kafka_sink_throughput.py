"""Throughput of the exactly-once ``eo_kafka`` sink against a raw confluent-kafka produce loop.

    python bench/kafka_sink_throughput.py --rows 1000000      # the issue's figure
    python bench/kafka_sink_throughput.py --rows 100000       # quick run

Against the same broker, in the same run:

- ours: Spark (``local[2]``) writing a cached DataFrame of ``--rows`` records of
  ``--value-bytes`` bytes (null keys) with ``df.write.format("eo_kafka")`` into a topic of
  ``--partitions`` partitions (after one untimed full-size warm-up write). This
  includes the Arrow hand-over, the deterministic sort, routing, recovery-key headers, the
  started marker, flush and the driver commit;
- baseline: one Python process with a confluent-kafka ``Producer`` with the *same producer
  settings* (``enable.idempotence=true``, ``acks=all``, failed-delivery callbacks only),
  calling ``produce(topic, value)`` for pre-built values in a loop and ``flush()``
  (``ratio_raw_producer``). An extra figure, ``ratio_raw_producer_with_header``, repeats the
  loop with a 30-byte header per record, the size of the recovery key.

Each side runs ``--repeat`` times and the best run counts (the machine may be shared).

It also measures the recovery scan: one task of ``--scan-rows`` rows (200,000) is failed
after writing half of them (failpoint ``kafka_sink.mid_produce``), then retried; the retry's
scan time, records read and total time are reported next to a clean task of the same size.
``commit_overhead_ms`` is the driver's commit step (WAL commit marker + marker purge).

The last line is ``RESULT {json}`` (DESIGN.md section 11). The broker is
``KAFKA_BOOTSTRAP_SERVERS`` or an embedded tansu broker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import bench_broker, bench_spark  # noqa: E402

from connectors.demo.services.kafka import create_topic  # noqa: E402


def raw_produce(
    bootstrap: str, topic: str, rows: int, value_bytes: int, with_header: bool = False
) -> float:
    """Seconds for a plain produce loop with the sink's producer settings.

    ``with_header`` adds a header of the recovery key's size to every record (an extra
    figure: how much of the gap is the header itself, which librdkafka makes costly)."""
    from confluent_kafka import Producer

    from connectors.kafka.sink import PRODUCER_DEFAULTS

    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    conf: dict[str, Any] = dict(PRODUCER_DEFAULTS)
    conf["delivery.report.only.error"] = True
    conf.update({"bootstrap.servers": bootstrap, "on_delivery": on_delivery})
    producer = Producer(conf)
    pad = b"x" * value_bytes
    values = [(str(i).encode() + pad)[:value_bytes] for i in range(rows)]
    produce, poll = producer.produce, producer.poll
    # Warm up like the sink's cached producer: connection, metadata and producer id.
    produce(topic, values[0])
    producer.flush(60)
    header = b"\x01\x08" + b"bench-id" + bytes(12)
    started = time.perf_counter()
    if with_header:
        for i, v in enumerate(values):
            while True:
                try:
                    produce(topic, v, None, -1, None, None, 0,
                            [("eo-rk", header + i.to_bytes(8, "big"))])
                    break
                except BufferError:
                    poll(0.05)
    else:
        for v in values:
            while True:
                try:
                    produce(topic, v)
                    break
                except BufferError:
                    poll(0.05)
    left = producer.flush(300)
    elapsed = time.perf_counter() - started
    if left or errors:
        raise SystemExit(f"raw producer: {left} undelivered, errors {errors[:3]}")
    return elapsed


def sink_write(df: Any, bootstrap: str, topic: str, wal: str, sink_id: str, batch_id: int) -> float:
    started = time.perf_counter()
    (df.write.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).option("sink_id", sink_id).option("walPath", wal)
     .option("batchId", batch_id).mode("append").save())
    return time.perf_counter() - started


def scan_cost(bootstrap: str, rows: int, value_bytes: int, partitions: int) -> dict[str, float]:
    """A task of ``rows`` rows fails after writing half; its retry scans and finishes."""
    import pyarrow as pa

    from connectors.core import failpoints
    from connectors.core.errors import FailpointError
    from connectors.core.sink import TaskInfo
    from connectors.kafka.sink import KafkaSink

    pad = b"x" * value_bytes
    table = pa.table({"value": [(str(i).encode() + pad)[:value_bytes] for i in range(rows)]})
    wal = tempfile.mkdtemp(prefix="eo-bench-scan-")

    def new_sink() -> KafkaSink:
        topic = f"bench-scan-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, partitions)
        return KafkaSink(f"scan-{uuid.uuid4().hex[:6]}", os.path.join(wal, topic),
                         bootstrap_servers=bootstrap, topic=topic)

    clean = new_sink().stage(TaskInfo(0, 0), iter(table.to_batches()))
    sink = new_sink()
    os.environ["CONNECTORS_FAILPOINTS"] = f"kafka_sink.mid_produce@0#{rows // 2}!raise"
    failpoints.reload()
    try:
        sink.stage(TaskInfo(0, 0), iter(table.to_batches()))
        raise SystemExit("the mid_produce failpoint did not fire")
    except FailpointError:
        pass
    finally:
        os.environ.pop("CONNECTORS_FAILPOINTS", None)
        failpoints.reload()
    retry = sink.stage(TaskInfo(0, 0, attempt=1), iter(table.to_batches()))
    if retry.skipped < rows // 2 or retry.skipped + retry.produced != rows:
        raise SystemExit(f"retry skipped {retry.skipped}, produced {retry.produced}")
    commits = []
    for b in range(5):
        started = time.perf_counter()
        sink.commit(b, [retry])
        commits.append((time.perf_counter() - started) * 1000)
    return {
        "scan_rows": rows,
        "recovery_scan_s": round(retry.scan_seconds, 3),
        "recovery_scan_records": retry.scan_records,
        "recovery_scan_records_per_s": round(retry.scan_records / max(retry.scan_seconds, 1e-9)),
        "retry_task_s": round(retry.seconds, 3),
        "clean_task_s": round(clean.seconds, 3),
        "retry_skipped": retry.skipped,
        "commit_overhead_ms": round(statistics.median(commits), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--scan-rows", type=int, default=200_000)
    args = ap.parse_args()

    bootstrap, broker = bench_broker()
    try:
        spark = bench_spark("bench-kafka-sink")
        df = spark.range(0, args.rows, numPartitions=2).selectExpr(
            f"cast(rpad(cast(id as string), {args.value_bytes}, 'x') as binary) as value"
        ).cache()
        if df.count() != args.rows:
            raise SystemExit("DataFrame size mismatch")
        wal = tempfile.mkdtemp(prefix="eo-bench-sink-")
        warm = f"bench-warm-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, warm, args.partitions)
        # Warm-up, not timed: one full-size write, so the JVM's JIT has compiled the Arrow
        # export and the Python workers hold their imports and cached producer before
        # anything is measured (the raw loop's producer is warmed up the same way).
        sink_write(df, bootstrap, warm, os.path.join(wal, "warm"), "warm", 0)

        ours: list[float] = []
        raw: list[float] = []
        raw_hdr: list[float] = []
        for i in range(args.repeat):
            topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, args.partitions)
            raw.append(args.rows / raw_produce(bootstrap, topic, args.rows, args.value_bytes))
            print(f"raw producer run {i}: {raw[-1]:,.0f} rows/s", flush=True)
            topic = f"bench-rawh-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, args.partitions)
            raw_hdr.append(args.rows / raw_produce(bootstrap, topic, args.rows, args.value_bytes,
                                                   with_header=True))
            print(f"raw producer + 30-byte header run {i}: {raw_hdr[-1]:,.0f} rows/s", flush=True)
            topic = f"bench-sink-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, args.partitions)
            sink_id = f"bench-{uuid.uuid4().hex[:6]}"
            seconds = sink_write(df, bootstrap, topic, os.path.join(wal, sink_id), sink_id, 0)
            ours.append(args.rows / seconds)
            print(f"spark eo_kafka sink run {i}: {ours[-1]:,.0f} rows/s", flush=True)
        spark.stop()

        scan = scan_cost(bootstrap, args.scan_rows, args.value_bytes, args.partitions)
        print(f"recovery scan: {scan['recovery_scan_records']} records in "
              f"{scan['recovery_scan_s']}s; retry task {scan['retry_task_s']}s vs clean task "
              f"{scan['clean_task_s']}s; commit {scan['commit_overhead_ms']} ms", flush=True)
        best_ours, best_raw = max(ours), max(raw)
        result = {
            "bench": "kafka_sink",
            "rows": args.rows,
            "eo_kafka_sink_rows_per_s": round(best_ours),
            "raw_producer_rows_per_s": round(best_raw),
            "ratio_raw_producer": round(best_ours / best_raw, 3),
            "raw_producer_with_header_rows_per_s": round(max(raw_hdr)),
            "ratio_raw_producer_with_header": round(best_ours / max(raw_hdr), 3),
            "value_bytes": args.value_bytes,
            "partitions": args.partitions,
            "broker": "env" if broker is None else "embedded tansu",
            **scan,
        }
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
