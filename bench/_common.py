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
    """``(bootstrap, broker)``: ``KAFKA_BOOTSTRAP_SERVERS`` (broker None) or an embedded
    broker the caller stops."""
    from connectors.embedded import EmbeddedBroker

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        return bootstrap, None
    broker = EmbeddedBroker().start()
    return broker.bootstrap, broker
