"""A Spark job on Spark's own JVM Kafka connector, for the cross-client tests.

Runs in the JVM-side interpreter that ``tests/services/spark_jvm.py`` chooses (possibly a
virtualenv with a different pyspark), so it imports nothing from this repository. Its one
argument names a JSON spec file:

- ``{"action": "read", "bootstrap", "topic", "options": {...}}``: a batch
  ``spark.read.format("kafka")`` of the whole topic (``startingOffsets=earliest``,
  ``endingOffsets=latest``, ``includeHeaders=true``; ``options`` adds or overrides, e.g.
  ``kafka.isolation.level``); result ``rows``: ``[key, value, partition, offset, headers]``;
- ``{"action": "write", "bootstrap", "topic", "rows": [[key, value, headers, partition]]}``:
  ``df.write.format("kafka")`` of those rows; result ``written``;
- ``{"action": "bench_write", "bootstrap", "topics": [...], "rows", "value_bytes"}``: the
  Kafka sink benchmark's baseline (bench/kafka_sink_throughput.py). A cached DataFrame of
  ``rows`` values shaped like the benchmark's, written once per entry of ``topics`` (a
  topic may repeat), the first ``warmup`` writes (default 1) untimed; result ``rows_per_s``
  per timed write.
- ``{"action": "bench_read", "bootstrap", "topic", "rows", "repeat"}``: the source benchmark's
  JVM baseline (bench/source_throughput.py): one full-size warm-up, then ``repeat`` timed
  ``spark.read.format("kafka")`` reads of the whole topic into the ``noop`` sink; result
  ``rows_per_s`` (one per timed run) and ``count`` (rows Spark read, checked once).
- ``{"action": "bench_avro_read", "bootstrap", "topic", "rows", "repeat", "schema"}``: the
  Schema Registry benchmark's read baseline (bench/avro_throughput.py): Spark's Kafka source,
  the 5-byte Confluent header cut off with ``substring`` and ``from_avro`` with the fixed
  ``schema``, every field into the ``noop`` sink; ``rows_per_s`` per timed run;
- ``{"action": "bench_avro_write", "bootstrap", "topics", "rows", "schema", "schema_id"}``:
  its write baseline: the same 10-field struct made by Spark, ``to_avro`` with ``schema``
  behind the 5-byte header of ``schema_id``, into Spark's Kafka sink, one topic per run;
- ``{"action": "read_avro", "bootstrap", "topic", "schema"}``: the whole topic through
  Spark's Kafka source, the 5-byte header cut off with ``substring``, ``from_avro`` with
  ``schema``; result ``rows``: each value as JSON (``to_json``), and the header bytes;
- ``{"action": "latency_copy", "bootstrap", "source", "sink", "checkpoint", "started_file",
  "stop_file", "max_seconds"}``: bench/latency.py's baseline, a streaming Kafka -> Kafka
  copy of ``value`` until ``stop_file`` appears; result ``progress`` (every batch's JSON).
- ``{"action": "fault_copy", "bootstrap", "source", "sink", "checkpoint", "stop_file",
  "per_batch", "master"}``: the fault tier's yardstick, a streaming Kafka -> Kafka copy
  restarted from its checkpoint whenever it terminates; result ``terminations``.

Binary values travel as base64 (null stays null); headers as ``[[key, value], ...]`` or
null. Common keys: ``jars`` (``spark.jars``), ``out`` (where the JSON result goes),
``expect_spark``. The result always carries ``spark_version`` (the JVM's) and
``pyspark_version``.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any


def _b64(data: bytes | bytearray | None) -> str | None:
    return None if data is None else base64.b64encode(bytes(data)).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def read(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", spec["bootstrap"])
        .option("subscribe", spec["topic"])
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
    )
    for key, value in spec.get("options", {}).items():
        reader = reader.option(key, value)
    rows = []
    for r in reader.load().select("key", "value", "partition", "offset", "headers").collect():
        headers = None if r.headers is None else [[h.key, _b64(h.value)] for h in r.headers]
        rows.append([_b64(r.key), _b64(r.value), r.partition, r.offset, headers])
    return {"rows": rows}


def write(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    data = [
        (_unb64(key), _unb64(value),
         None if headers is None else [(k, _unb64(v)) for k, v in headers], partition)
        for key, value, headers, partition in spec["rows"]
    ]
    df = spark.createDataFrame(
        data,
        "key binary, value binary, headers array<struct<key:string,value:binary>>, "
        "partition int",
        verifySchema=False,
    )
    (df.write.format("kafka")
     .option("kafka.bootstrap.servers", spec["bootstrap"])
     .option("topic", spec["topic"])
     .mode("append").save())
    return {"written": len(data)}


def bench_write(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    import time

    rows, width = int(spec["rows"]), int(spec["value_bytes"])
    df = spark.range(0, rows, numPartitions=2).selectExpr(
        f"cast(rpad(cast(id as string), {width}, 'x') as binary) as value").cache()
    if df.count() != rows:
        raise SystemExit("DataFrame size mismatch")
    rates = []
    warmup = int(spec.get("warmup", 1))
    for i, topic in enumerate(spec["topics"]):
        started = time.perf_counter()
        (df.write.format("kafka").option("kafka.bootstrap.servers", spec["bootstrap"])
         .option("topic", topic).mode("append").save())
        if i >= warmup:
            rates.append(rows / (time.perf_counter() - started))
    return {"rows_per_s": rates}


def bench_read(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    import time

    def load() -> Any:
        return (spark.read.format("kafka")
                .option("kafka.bootstrap.servers", spec["bootstrap"])
                .option("subscribe", spec["topic"])
                .option("startingOffsets", "earliest")
                .option("endingOffsets", "latest")
                .load())

    count = load().count()
    load().write.format("noop").mode("overwrite").save()  # the full-size warm-up
    rates = []
    for _ in range(int(spec.get("repeat", 3))):
        started = time.perf_counter()
        load().write.format("noop").mode("overwrite").save()
        rates.append(spec["rows"] / (time.perf_counter() - started))
        print(f"spark_kafka_job bench_read: {rates[-1]:,.0f} rows/s", flush=True)
    return {"rows_per_s": rates, "count": count}


AVRO_STRUCT = (
    "named_struct('id', id, 'qty', cast(id % 1000 as int), 'name', concat('name-', id), "
    "'price', id * 0.5d, 'active', id % 2 = 0, 'note', if(id % 3 = 0, concat('n', id), null), "
    "'ts', timestamp_millis(1700000000000 + id), 'score', cast(id % 7 as float), "
    "'tag', repeat('t', cast(id % 10 as int)), 'amount', if(id % 5 = 0, null, id))")


def read_avro(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import expr, to_json

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", spec["bootstrap"])
           .option("subscribe", spec["topic"]).option("startingOffsets", "earliest")
           .option("endingOffsets", "latest").load())
    rows = raw.select(
        to_json(from_avro(expr("substring(value, 6, length(value) - 5)"), spec["schema"],
                          {"mode": "FAILFAST"})).alias("json"),
        expr("hex(substring(value, 1, 5))").alias("header")).collect()
    return {"rows": [[r["json"], r["header"]] for r in rows]}


def bench_avro_read(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    import time

    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import expr

    def load() -> Any:
        raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", spec["bootstrap"])
               .option("subscribe", spec["topic"]).option("startingOffsets", "earliest")
               .option("endingOffsets", "latest").load())
        return raw.select(from_avro(expr("substring(value, 6, length(value) - 5)"),
                                    spec["schema"]).alias("value")).select("value.*")

    count = load().count()
    load().write.format("noop").mode("overwrite").save()  # the full-size warm-up
    rates = []
    for _ in range(int(spec.get("repeat", 3))):
        started = time.perf_counter()
        load().write.format("noop").mode("overwrite").save()
        rates.append(spec["rows"] / (time.perf_counter() - started))
    return {"rows_per_s": rates, "count": count}


def bench_avro_write(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    import time

    from pyspark.sql.avro.functions import to_avro
    from pyspark.sql.functions import concat, expr, lit

    header = bytes([0]) + int(spec["schema_id"]).to_bytes(4, "big")
    rates = []
    for topic in spec["topics"]:
        df = (spark.range(0, spec["rows"], numPartitions=2).selectExpr(AVRO_STRUCT + " as v")
              .select(concat(lit(header), to_avro(expr("v"), spec["schema"])).alias("value")))
        started = time.perf_counter()
        (df.write.format("kafka").option("kafka.bootstrap.servers", spec["bootstrap"])
         .option("topic", topic).save())
        rates.append(spec["rows"] / (time.perf_counter() - started))
    return {"rows_per_s": rates}


def latency_copy(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """bench/latency.py's baseline: Kafka ``source`` -> ``value`` -> Kafka ``sink`` with
    Spark's own connector, ``Trigger.ProcessingTime(0)``, until ``stop_file`` appears;
    ``started_file`` is written once the first batch ran. Result: every progress (JSON)."""
    import os
    import time

    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2000")
    query = (spark.readStream.format("kafka")
             .option("kafka.bootstrap.servers", spec["bootstrap"])
             .option("subscribe", spec["source"]).option("startingOffsets", "earliest").load()
             .select("value").writeStream.format("kafka")
             .option("kafka.bootstrap.servers", spec["bootstrap"]).option("topic", spec["sink"])
             .option("checkpointLocation", spec["checkpoint"])
             .trigger(processingTime="0 seconds").start())
    deadline = time.monotonic() + float(spec["max_seconds"])
    try:
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.2)
        with open(spec["started_file"], "w"):
            pass
        while not os.path.exists(spec["stop_file"]) and time.monotonic() < deadline:
            if query.exception() is not None:
                raise SystemExit(f"latency_copy failed: {query.exception()}")
            time.sleep(0.2)
        progress = [json.loads(p.json) for p in query.recentProgress]
    finally:
        query.stop()
    return {"progress": progress}


def fault_copy(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The fault tier's yardstick (tests/integration/cluster_kafka/test_streaming_faults.py):
    Spark's own pipeline, Kafka ``source`` -> ``key``, ``value`` -> Kafka ``sink``, each
    batch through a shuffle as ours, ``processingTime=1s``, ``maxOffsetsPerTrigger`` as ours,
    until ``stop_file`` appears. A query that terminates is counted (``QUERY TERMINATED``,
    flushed at once: the test may SIGKILL this process) and started again from its
    checkpoint, as a restart policy would. Result: ``terminations`` (their errors)."""
    import os
    import time

    terminations: list[str] = []

    def start() -> Any:
        return (spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", spec["bootstrap"])
                .option("subscribe", spec["source"]).option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", int(spec.get("per_batch", 3000))).load()
                .selectExpr("key", "value").repartition(2, "key")
                .writeStream.format("kafka")
                .option("kafka.bootstrap.servers", spec["bootstrap"])
                .option("topic", spec["sink"])
                .option("checkpointLocation", spec["checkpoint"])
                .trigger(processingTime="1 second").start())

    query = start()
    print("QUERIES STARTED", flush=True)
    while not os.path.exists(spec["stop_file"]):
        if not query.isActive:
            error = str(query.exception())
            terminations.append(error)
            print(f"QUERY TERMINATED {len(terminations)}: {error[:2000]}", flush=True)
            query = start()
        time.sleep(0.5)
    query.stop()
    return {"terminations": terminations}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    import pyspark
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(spec.get("master", "local[2]"))
        .appName(f"spark-kafka-{spec['action']}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", ",".join(spec["jars"]))
        # the benchmarks' settings (bench/_common.py bench_spark)
        .config("spark.driver.memory", spec.get("driver_memory", "1g"))
    )
    if spec.get("java_options"):
        # the tests' JVM flags where a test passes them (tests/helpers.py TEST_JVM_FLAGS);
        # the benchmarks and the fault test's yardstick run the JDK's defaults
        builder = builder.config("spark.driver.extraJavaOptions", spec["java_options"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        if spec.get("expect_spark") and spark.version != spec["expect_spark"]:
            raise SystemExit(f"this JVM runs Spark {spark.version}, the connector is for "
                             f"{spec['expect_spark']}: refusing to mix versions")
        actions = {"read": read, "write": write, "bench_write": bench_write,
                   "bench_read": bench_read, "latency_copy": latency_copy,
                   "bench_avro_read": bench_avro_read, "bench_avro_write": bench_avro_write,
                   "read_avro": read_avro, "fault_copy": fault_copy}
        result = actions[spec["action"]](spark, spec)
        result.update(spark_version=spark.version, pyspark_version=pyspark.__version__)
    finally:
        spark.stop()
    with open(spec["out"], "w") as f:
        json.dump(result, f)
    print(f"spark_kafka_job {spec['action']}: Spark {result['spark_version']}, "
          f"pyspark {result['pyspark_version']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
