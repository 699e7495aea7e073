"""How the Kafka sink hands records to librdkafka, measured in one run (issue 34, item 7:
one produce path per need).

    python bench/librdkafka_handoff.py --rows 1000000

When the wire path does not apply (compression, a GSSAPI or OAUTHBEARER login, a setting it
does not honour, a broker older than 3.6 for transactions) the sink produces through
librdkafka. Each way of handing it records is timed here on the same broker, the same
pre-built Arrow column of ``--rows`` values of ``--value-bytes`` bytes (null keys) into
``--partitions`` partitions, with the sink's own producer settings
(``producers.PRODUCER_DEFAULTS``: idempotence, ``acks=all``), enqueue plus ``flush()``:

- ``produce_loop``: confluent-kafka's ``produce()`` per record from Python, the path
  without a C compiler (and for a ``headers`` column); ``produce_loop_header``: the same
  with the recovery key's header on each record;
- ``c_loop``: the ``_keyed_produce`` extension, one C loop over the Arrow buffers calling
  ``rd_kafka_produceva`` per record, no header (the transactional mode);
  ``c_loop_header``: with the recovery-key header (the recovery-key mode);
- ``produce_batch``: ``rd_kafka_produce_batch`` through ctypes, the message array built by
  numpy from the Arrow buffers (the transactional mode; it takes no headers).

Each runs ``--repeat`` times, best counts; ratios are against ``produce_loop`` in the same
run. The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from bench._common import bench_broker, stop_broker  # noqa: E402
from connectors.demo.services.kafka import create_topic  # noqa: E402
from connectors.kafka.sink import batch_produce, producers, recovery  # noqa: E402


def _producer(bootstrap: str, failed: list[Any]) -> Any:
    from confluent_kafka import Producer

    def on_error(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    conf: dict[str, Any] = {**producers.PRODUCER_DEFAULTS, "bootstrap.servers": bootstrap,
                            "on_delivery": on_error}
    conf["delivery.report.only.error"] = True  # confluent-kafka's own key takes a bool
    return Producer(conf)


def _run(bootstrap: str, partitions: int, values: pa.Array,
         send: Callable[[Any, str, np.ndarray, list[Any]], None]) -> float:
    topic = f"handoff-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    parts = (np.arange(len(values), dtype=np.int32) // 1000 % partitions).astype(np.int32)
    failed: list[Any] = []
    producer = _producer(bootstrap, failed)
    producer.produce(topic, b"warm", partition=0)  # connections and producer id first
    producer.flush(30)
    began = time.perf_counter()
    send(producer, topic, parts, failed)
    left = producer.flush(300)
    took = time.perf_counter() - began
    if left or failed:
        raise RuntimeError(f"{left} records undelivered, {len(failed)} failed: {failed[:3]}")
    return len(values) / took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    values = pa.array([(f"{i:012d}" * (args.value_bytes // 12 + 1))[:args.value_bytes].encode()
                       for i in range(args.rows)], pa.binary())
    pylist = values.to_pylist()
    prefix = recovery.key_prefix("bench-sink", 0, 0)
    order = np.arange(args.rows, dtype=np.int64)

    def wait_for(producer: Any) -> Callable[[], None]:
        return lambda: producer.poll(0.001)

    def produce_loop(producer: Any, topic: str, parts: np.ndarray, _f: list[Any]) -> None:
        produce, poll = producer.produce, producer.poll
        for v, p in zip(pylist, parts.tolist(), strict=True):
            while True:
                try:
                    produce(topic, v, None, p)
                    break
                except BufferError:
                    poll(0.05)

    def produce_loop_header(producer: Any, topic: str, parts: np.ndarray,
                            _f: list[Any]) -> None:
        produce, poll, header = producer.produce, producer.poll, recovery.HEADER
        for v, p, h in zip(pylist, parts.tolist(), recovery.header_values(prefix, order),
                           strict=True):
            while True:
                try:
                    produce(topic, v, None, p, None, None, 0, [(header, h)])
                    break
                except BufferError:
                    poll(0.05)

    def c_loop(header: bool) -> Callable[[Any, str, np.ndarray, list[Any]], None]:
        def send(producer: Any, topic: str, parts: np.ndarray, failed: list[Any]) -> None:
            rk = batch_produce.handle(producer)
            assert rk is not None, "no librdkafka handle here"
            batch_produce.produce_keyed(
                producer, lambda err, _m: failed.append(err) if err else None, rk, topic,
                values, None, parts, order, recovery.HEADER if header else "",
                prefix if header else b"", wait_for(producer))
        return send

    def produce_batch(producer: Any, topic: str, parts: np.ndarray, _f: list[Any]) -> None:
        rk = batch_produce.handle(producer)
        assert rk is not None, "no librdkafka handle here"
        batch_produce.produce(rk, topic, values, None, parts, order, wait_for(producer))

    ways: dict[str, Callable[[Any, str, np.ndarray, list[Any]], None]] = {
        "produce_loop": produce_loop, "produce_loop_header": produce_loop_header,
        "c_loop": c_loop(False), "c_loop_header": c_loop(True)}
    ways["produce_batch"] = produce_batch

    bootstrap, broker = bench_broker()
    try:
        best: dict[str, float] = {}
        for name, send in ways.items():
            _run(bootstrap, args.partitions, values, send)  # warm-up, untimed
            rates = [_run(bootstrap, args.partitions, values, send)
                     for _ in range(args.repeat)]
            best[name] = max(rates)
            print(f"{name:22s} {best[name]:>12,.0f} records/s  "
                  f"({', '.join(f'{r:,.0f}' for r in rates)})", flush=True)
    finally:
        stop_broker(broker)
    result: dict[str, Any] = {f"{k}_rows_per_s": round(v) for k, v in best.items()}
    result.update({f"{k}_ratio_produce_loop": round(v / best["produce_loop"], 2)
                   for k, v in best.items() if k != "produce_loop"})
    result.update(rows=args.rows, value_bytes=args.value_bytes, partitions=args.partitions,
                  repeat=args.repeat)
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
