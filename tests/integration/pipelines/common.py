"""What every recovery pipeline script shares: the SparkSession it runs in, and the
``eo_kafka`` stream most of them read.

``local[2]`` (or ``local[N,maxFailures]`` where a test needs Spark's task retries), UI off,
2 shuffle partitions, our DataSources registered.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from tests.helpers import spark_builder


def pipeline_spark(app: str, master: str = "local[2]", log_level: str = "WARN") -> SparkSession:
    import connectors

    spark = spark_builder(app, master).getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    connectors.register(spark)
    return spark


def kafka_stream(spark: SparkSession, bootstrap: str, topic: str, per_batch: int,
                 **options: Any) -> DataFrame:
    """``eo_kafka`` on ``topic`` from the earliest offsets, at most ``per_batch`` records per
    micro-batch (so the pipeline has several batches to be killed in); ``options`` adds
    source options, e.g. ``walPath``."""
    reader = (
        spark.readStream.format("eo_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()
