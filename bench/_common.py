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


#: Replicas of every benchmark topic: 1 on one broker, 3 with ``--cluster``.
REPLICAS = {"n": 1}


def bench_broker(cluster: bool = False) -> tuple[str, Any]:
    """``(bootstrap, broker)``: ``KAFKA_BOOTSTRAP_SERVERS`` (broker None) or a local Apache
    Kafka from the Maven-resolved jars (tansu only without Java or Maven) that the caller
    stops. Its version is ``broker.version``. ``cluster``: three KRaft nodes instead
    (replication 3, ``min.insync.replicas=2``, ``acks=all`` as every client here uses), as
    production runs; topics then get 3 replicas (:data:`REPLICAS`)."""
    from connectors.demo.services.kafka import start_local_kafka

    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        return bootstrap, None
    if cluster:
        from connectors.demo.services.kafka_cluster import KafkaCluster

        nodes = KafkaCluster(heap="1g", workdir=None, extra_properties={
            "log.segment.delete.delay.ms": "1000", "log.initial.task.delay.ms": "1000",
            "num.network.threads": "3", "num.io.threads": "4"}).start()
        REPLICAS["n"] = 3
        return nodes.bootstrap, nodes
    # Dropped topics release their files within a second or two, not a minute (the delay and
    # the first run of the broker's delete task): the 1,000-partition runs make and drop a
    # topic every few seconds, 1,000 open files each, and the machine caps a process at
    # 20,000 files ("Too many open files", then NOT_LEADER for every new topic).
    broker = start_local_kafka(scratch_root=broker_data_root(), extra_properties={
        "log.segment.delete.delay.ms": "1000", "log.initial.task.delay.ms": "1000"})
    return broker.bootstrap, broker


def stop_broker(broker: Any) -> None:
    """Stop what :func:`bench_broker` started (nothing for an external one): a cluster's
    ``close`` (its ``stop`` stops one node), a broker's ``stop``."""
    if broker is None:
        return
    close = getattr(broker, "close", None)
    (close if callable(close) else broker.stop)()


#: Free memory the broker's data may take in /dev/shm (a 1,000-partition sink run writes
#: a few hundred MB; topics are dropped after each run).
_SHM_NEEDED = 4 << 30


def broker_data_root() -> str | None:
    """Where the benchmark broker keeps its log: ``EO_BENCH_BROKER_DIR``, else memory
    (/dev/shm) when it has room, else the temp directory.

    This machine's disk, not the connectors, set the pace on disk: a producer appending to
    partitions another producer has just written waits 4 ms per request at the median and
    39 ms at p90 in the broker's own request log (localTimeMs), against 0.1 ms for the first
    writer and for both on tmpfs. Every Spark task of a sink run is such a second writer,
    Spark's JVM sink as much as ours. Production brokers have their own disks; the ratios
    against Spark's connectors come from the same broker either way."""
    chosen = os.environ.get("EO_BENCH_BROKER_DIR")
    if chosen:
        return chosen
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if st.f_bavail * st.f_frsize >= _SHM_NEEDED else None


def register_noop(spark: Any) -> None:
    """``bench_noop``: a Python DataSource writer that only counts the Arrow rows it gets.
    Its time is the floor any Python writer pays before writing anything: the Spark job
    and the JVM -> Python Arrow transfer."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class Counted(WriterCommitMessage):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class NoopWriter(DataSourceArrowWriter):
        def write(self, iterator: Any) -> Counted:
            return Counted(sum(batch.num_rows for batch in iterator))

    class NoopSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_noop"

        def writer(self, schema: Any, overwrite: bool) -> NoopWriter:
            return NoopWriter()

    spark.dataSource.register(NoopSource)


def run_noop(df: Any) -> float:
    """Seconds of one ``df.write`` into ``bench_noop`` (:func:`register_noop`)."""
    import time

    started = time.perf_counter()
    df.write.format("bench_noop").mode("append").save()
    return time.perf_counter() - started
