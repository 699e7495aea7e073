"""What the benchmarks share: the SparkSession they measure in and the broker they use.

Every benchmark runs Spark the same way (``local[2]``, UI off, 2 shuffle partitions, 2 GiB
driver) so that ratios between benchmarks are comparable.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench_spark(app: str, **conf: str) -> Any:
    """The benchmark SparkSession, our DataSources registered; ``conf`` adds settings
    (e.g. ``**{"spark.jars": jar}``) that apply to ours and the baseline alike."""
    from pyspark.sql import SparkSession

    import connectors

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    connectors.register(spark)
    return spark


def bench_broker() -> tuple[str, Any]:
    """``(bootstrap, broker)``: ``KAFKA_BOOTSTRAP_SERVERS`` (broker None) or a local Apache
    Kafka from the Maven-resolved jars (tansu only without Java or Maven) that the caller
    stops. Its version is ``broker.version``."""
    from connectors.demo.services.kafka import start_local_kafka

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        return bootstrap, None
    broker = start_local_kafka()
    return broker.bootstrap, broker
