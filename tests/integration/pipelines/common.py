"""What every recovery pipeline script shares: the SparkSession it runs in.

``local[2]`` (or ``local[N,maxFailures]`` where a test needs Spark's task retries), UI off,
2 shuffle partitions, our DataSources registered.
"""

from __future__ import annotations

from pyspark.sql import SparkSession


def pipeline_spark(app: str, master: str = "local[2]", log_level: str = "WARN") -> SparkSession:
    import connectors

    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(log_level)
    connectors.register(spark)
    return spark
