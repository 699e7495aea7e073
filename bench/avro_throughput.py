"""Avro in the Confluent wire format, read and written by ``eo_kafka`` against Spark's own
JVM path, in the same run on the same broker and registry (docs/schema-registry.md).

    python bench/avro_throughput.py --rows 1000000     # the issue's figure
    python bench/avro_throughput.py --rows 100000      # quick run

One 10-field record of mixed types (long, int, strings, double, boolean, a nullable string,
a timestamp, float, a nullable long), registered once in a real registry (Apicurio, from
``connectors/demo/services/registry.py``, or ``SCHEMA_REGISTRY_URL``):

- **read**: ``--rows`` framed records over ``--partitions`` partitions, read whole into the
  ``noop`` sink with every field selected. Ours: ``spark.read.format("eo_kafka")`` with
  ``valueFormat=avro``. Spark's: its JVM Kafka source, the 5-byte header cut off with
  ``substring`` and ``from_avro`` with the fixed schema (what users do today; no registry);
- **write**: the same struct made by Spark from ``spark.range``. Ours: the ``eo_kafka`` sink
  (recovery keys, its default) with ``valueFormat=avro``; Spark's: ``to_avro`` behind the
  header, into its Kafka sink.

Spark's JVM side runs through ``tests/services/spark_jvm.py`` (its Kafka connector and
``spark-avro`` at the newest version Maven Central serves, in a virtualenv with that
pyspark when ours differs); both Spark versions are printed. Each side gets one full-size
warm-up, then ``--repeat`` timed runs; the best counts. Last line: ``RESULT {json}`` with
``read_ratio_spark_avro_read`` and ``write_ratio_spark_avro_write`` (targets >= 1.5).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import bench_broker, bench_spark  # noqa: E402

from connectors.demo.services.kafka import create_topic, produce_records  # noqa: E402
from connectors.kafka.registry.avro import _avro_decode  # noqa: E402

STRUCT = (
    "named_struct('id', id, 'qty', cast(id % 1000 as int), 'name', concat('name-', id), "
    "'price', id * 0.5d, 'active', id % 2 = 0, 'note', if(id % 3 = 0, concat('n', id), null), "
    "'ts', timestamp_millis(1700000000000 + id), 'score', cast(id % 7 as float), "
    "'tag', repeat('t', cast(id % 10 as int)), 'amount', if(id % 5 = 0, null, id))")


def registry() -> tuple[str, Any]:
    url = os.environ.get("SCHEMA_REGISTRY_URL")
    if url:
        return url, None
    from connectors.demo.services.registry import LocalRegistry

    reg = LocalRegistry().start()
    return reg.url, reg


def schema_of_struct(spark: Any) -> dict[str, Any]:
    """The Avro schema our sink derives from the struct (the one both sides use)."""
    from connectors.kafka.registry.avro_schema import avro_schema
    from connectors.spark.sink_adapter import arrow_schema

    df = spark.range(1).selectExpr(STRUCT + " as value")
    schema: dict[str, Any] = avro_schema(arrow_schema(df.schema).field("value").type,
                                         "topLevelRecord")
    return schema


def register(url: str, subject: str, schema: dict[str, Any]) -> int:
    from connectors.kafka.registry.client import RegistryClient, RegistrySpec

    doc = RegistryClient(RegistrySpec.parse("bench", {"url": url})).request(
        "POST", f"/subjects/{subject}/versions", {"schema": json.dumps(schema)})
    return int(doc["id"])


def produce(bootstrap: str, topic: str, rows: int, partitions: int, schema: dict[str, Any],
            schema_id: int) -> None:
    import datetime as dt

    from fastavro import parse_schema, schemaless_writer

    parsed = parse_schema(schema)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

    def records() -> Any:
        for i in range(rows):
            buf = io.BytesIO()
            buf.write(header)
            schemaless_writer(buf, parsed, {
                "id": i, "qty": i % 1000, "name": f"name-{i}", "price": i * 0.5,
                "active": i % 2 == 0, "note": f"n{i}" if i % 3 == 0 else None,
                "ts": epoch + dt.timedelta(milliseconds=1700000000000 + i),
                "score": float(i % 7), "tag": "t" * (i % 10),
                "amount": None if i % 5 == 0 else i})
            yield None, buf.getvalue(), i % partitions

    produce_records(bootstrap, topic, records())


def jvm_with_avro() -> Any:
    """Spark's JVM connector with ``spark-avro`` of its version on the same classpath."""
    from tests.services.spark_jvm import jvm_spark, with_avro

    return with_avro(jvm_spark())


def ours_read(spark: Any, bootstrap: str, topic: str, url: str, rows: int) -> float:
    df = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("valueFormat", "avro").option("schemaRegistry.url", url).load()
          .select("value.*"))
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return rows / (time.perf_counter() - started)


def ours_write(spark: Any, bootstrap: str, topic: str, url: str, rows: int,
               wal: str) -> float:
    df = spark.range(0, rows, numPartitions=2).selectExpr(STRUCT + " as value")
    started = time.perf_counter()
    (df.write.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).option("sink_id", f"bench{uuid.uuid4().hex[:8]}")
     .option("walPath", wal).option("batchId", 0).option("valueFormat", "avro")
     .option("schemaRegistry.url", url).mode("append").save())
    return rows / (time.perf_counter() - started)


def _summary(name: str, rates: list[float]) -> str:
    return (f"{name}: best {max(rates):,.0f} rows/s, lowest {min(rates):,.0f} "
            f"({', '.join(f'{r:,.0f}' for r in rates)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from tests.services.spark_jvm import run_job

    bootstrap, broker = bench_broker()
    url, reg = registry()
    scratch = tempfile.mkdtemp(prefix="eo-bench-avro-")
    try:
        spark = bench_spark("bench-avro")
        schema = schema_of_struct(spark)
        topic = f"bench-avro-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        schema_id = register(url, f"{topic}-value", schema)
        began = time.perf_counter()
        produce(bootstrap, topic, args.rows, args.partitions, schema, schema_id)
        print(f"produced {args.rows:,} framed Avro records (schema id {schema_id}) in "
              f"{time.perf_counter() - began:.1f}s; registry {url}", flush=True)

        jvm = jvm_with_avro()
        print(f"JVM baseline: {jvm.describe()} + spark-avro; our pyspark {jvm.ours}", flush=True)
        out = run_job(jvm, {"action": "bench_avro_read", "bootstrap": bootstrap, "topic": topic,
                            "rows": args.rows, "repeat": args.repeat, "schema": json.dumps(schema),
                            "driver_memory": "2g"}, timeout=1800)
        if out["count"] != args.rows:
            raise SystemExit(f"Spark's JVM source read {out['count']} rows, not {args.rows}")
        jvm_read = list(out["rows_per_s"])
        print(_summary("spark kafka source + from_avro", jvm_read), flush=True)

        count = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", topic).option("valueFormat", "avro")
                 .option("schemaRegistry.url", url).load().count())
        if count != args.rows:
            raise SystemExit(f"eo_kafka read {count} rows, not {args.rows}")
        ours_read(spark, bootstrap, topic, url, args.rows)  # the full-size warm-up
        read = [ours_read(spark, bootstrap, topic, url, args.rows) for _ in range(args.repeat)]
        print(_summary("eo_kafka valueFormat=avro", read), flush=True)

        write_topics = [f"bench-avro-w-{uuid.uuid4().hex[:8]}" for _ in range(args.repeat + 1)]
        for t in write_topics:
            create_topic(bootstrap, t, args.partitions)
        # Spark's writes carry the id the registry gives the struct's schema under its subject
        jvm_id = register(url, f"{write_topics[0]}-value", schema)
        out = run_job(jvm, {"action": "bench_avro_write", "bootstrap": bootstrap,
                            "topics": write_topics, "rows": args.rows,
                            "schema": json.dumps(schema), "schema_id": jvm_id,
                            "driver_memory": "2g"}, timeout=1800)
        jvm_write = list(out["rows_per_s"])[1:]  # the first is the warm-up
        print(_summary("spark to_avro + kafka sink", jvm_write), flush=True)

        ours_topics = [f"bench-avro-o-{uuid.uuid4().hex[:8]}" for _ in range(args.repeat + 1)]
        write = []
        for i, t in enumerate(ours_topics):
            create_topic(bootstrap, t, args.partitions)
            register(url, f"{t}-value", schema)
            rate = ours_write(spark, bootstrap, t, url, args.rows, os.path.join(scratch, t))
            if i:
                write.append(rate)
        print(_summary("eo_kafka sink valueFormat=avro", write), flush=True)
        result = {
            "bench": "avro_throughput", "rows": args.rows, "partitions": args.partitions,
            "read_rows_per_s": round(max(read)),
            "spark_avro_read_rows_per_s": round(max(jvm_read)),
            "read_ratio_spark_avro_read": round(max(read) / max(jvm_read), 3),
            "write_rows_per_s": round(max(write)),
            "spark_avro_write_rows_per_s": round(max(jvm_write)),
            "write_ratio_spark_avro_write": round(max(write) / max(jvm_write), 3),
            "lowest_rows_per_s": {"read": round(min(read)), "spark_avro_read": round(min(jvm_read)),
                                  "write": round(min(write)),
                                  "spark_avro_write": round(min(jvm_write))},
            "spark_jvm": jvm.describe(),
            "codec": "C (flat records)" if _avro_decode is not None else "fastavro per record",
        }
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if reg is not None:
            reg.stop()
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
