"""Fixtures of the cluster tests: the standalone cluster (once per session), an HDFS
directory per test, input lines in Kafka, the driver application as a child process, and
readers of what every sink committed (PostgreSQL, Kafka, parquet files on HDFS)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, announce, read_topic, unavailable
from tests.integration.pipelines.jdbc_wordcount import line
from tests.services.spark_cluster import StandaloneCluster, cluster_conf

LINES = 2000
PER_BATCH = 500  # 4 micro-batches / windows
APP = "tests.integration.cluster.pipelines.cluster_app"


@pytest.fixture(scope="session")
def spark_cluster(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two 1-core workers from pyspark's ``bin/spark-class``, for the session."""
    workdir = str(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster = StandaloneCluster(workdir=workdir).start()
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        unavailable("Spark standalone cluster", str(e))
    announce(request, f"spark-cluster: master {cluster.url} + {cluster.workers} workers x "
              f"{cluster.cores} core (pids {[w.pid for w in cluster.nodes]}) up in "
              f"{cluster.started_in:.1f}s, logs {cluster.logs()}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(spark_cluster: StandaloneCluster) -> StandaloneCluster:
    """The session's cluster with all its workers alive (a fault test may have lost one)."""
    for w in list(spark_cluster.nodes):
        if not w.running():
            spark_cluster.restart_worker(w)
    spark_cluster.wait_workers(spark_cluster.workers)
    return spark_cluster


def expected_lines(n: int = LINES) -> list[str]:
    return [line(i) for i in range(n)]


def expected_counts(n: int = LINES) -> Counter[str]:
    c: Counter[str] = Counter()
    for text in expected_lines(n):
        c.update(text.split(" "))
    return c


@dataclass
class ClusterRun:
    """One test's inputs and outputs: names, HDFS base, the app config."""

    cluster: StandaloneCluster
    bootstrap: str
    hdfs_url: str
    webhdfs_url: str
    pg_url: str
    tmp: Path
    prefix: str = field(default_factory=lambda: f"cl{uuid.uuid4().hex[:10]}")
    topic: str = ""
    hold_dir: str = ""
    s3: Any = None  # an S3Service: our state and output on S3 instead of HDFS
    s3_bucket: str = ""

    def __post_init__(self) -> None:
        self.base = f"/eo-cluster/{self.prefix}"
        self.hold_dir = str(self.tmp / "hold")
        os.makedirs(self.hold_dir, exist_ok=True)

    def config(self, jobs: list[str], hold: str | None = None) -> dict[str, Any]:
        conf = cluster_conf(self.cluster)
        if hold:
            conf["spark.executorEnv.EO_TEST_HOLD"] = hold
            conf["spark.executorEnv.EO_TEST_HOLD_DIR"] = self.hold_dir
        s3 = None if self.s3 is None else {"bucket": self.s3_bucket,
                                           "options": self.s3.python_options()}
        return {"conf": conf, "bootstrap": self.bootstrap, "topic": self.topic,
                "per_batch": PER_BATCH, "hdfs": self.hdfs_url, "webhdfs": self.webhdfs_url,
                "base": self.base, "pg_url": self.pg_url, "prefix": self.prefix,
                "jobs": jobs, "app": f"eo-cluster-{'-'.join(jobs)}", "s3": s3}

    def start(self, jobs: list[str], hold: str | None = None,
              log_name: str = "app.log") -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": REPO, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
        env.pop("CONNECTORS_FAILPOINTS", None)
        out = open(self.tmp / log_name, "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen([sys.executable, "-m", APP, json.dumps(self.config(jobs, hold))],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)

    def log(self, log_name: str = "app.log") -> str:
        return (self.tmp / log_name).read_text(errors="replace")

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = 420,
               log_name: str = "app.log") -> str:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            reap(proc)
            raise AssertionError(f"app did not finish in {timeout}s:\n"
                                 f"{self.log(log_name)[-4000:]}") from None
        reap(proc)
        text = self.log(log_name)
        assert code == 0, f"app exited {code}:\n{text[-4000:]}"
        return text

    def held(self, proc: subprocess.Popen[bytes], timeout: float = 300) -> int:
        """Wait until the holding sink holds its task; the pid of that Python worker."""
        path = Path(self.hold_dir) / "held"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if proc.poll() is not None:
                raise AssertionError(f"app ended before the hold:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no hold after {timeout}s:\n{self.log()[-4000:]}")
            time.sleep(0.2)
        return int(path.read_text().split()[0])

    def names(self, job: str) -> dict[str, str]:
        return {"table": f"{self.prefix}_{job}", "topic": f"{self.prefix}-{job}",
                "sink_id": f"{self.prefix}-{job}"}

    def webhdfs(self, job: str, what: str) -> str:
        host = self.webhdfs_url.split("://", 1)[1].rstrip("/")
        return f"webhdfs://{host}{self.base}/wal/{job}/{what}"

    # -- readers of what the sinks committed ------------------------------------------------
    def jdbc_counts(self, job: str) -> Counter[str]:
        import sqlalchemy as sa

        engine = sa.create_engine(self.pg_url)
        try:
            t = sa.table(self.names(job)["table"], sa.column("word"), sa.column("n"))
            with engine.connect() as c:
                return Counter({w: int(n) for w, n in c.execute(sa.select(t.c.word, t.c.n))})
        finally:
            engine.dispose()

    def kafka_values(self, job: str, isolation: str = "read_committed") -> list[str]:
        msgs = read_topic(self.bootstrap, self.names(job)["topic"], isolation=isolation)
        return [(m.value() or b"").decode() for m in msgs]

    def file_lines(self, job: str) -> list[str]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from connectors.files.sink import FileSink

        if self.s3 is not None:
            sink = FileSink(f"s3://{self.s3_bucket}{self.base}/files/{job}",
                            storage_options=self.s3.python_options())
        else:
            sink = FileSink(f"{self.hdfs_url}{self.base}/files/{job}",
                            webhdfs_url=self.webhdfs_url)
        out: list[str] = []
        for f in sink.committed_files():
            out.extend(pq.read_table(pa.BufferReader(sink.storage.read(f)))
                       .column("line").to_pylist())
        return out

    def cleanup(self) -> None:
        import psycopg
        from confluent_kafka.admin import AdminClient
        from psycopg import sql

        topics = [self.topic, *(self.names(j)["topic"] for j in ("kafka_rk", "kafka_txn",
                                                                  "faults"))]
        with contextlib.suppress(Exception):
            AdminClient({"bootstrap.servers": self.bootstrap}).delete_topics(
                topics, operation_timeout=5)

        dsn = "postgresql://" + self.pg_url.split("://", 1)[1]
        with contextlib.suppress(Exception), psycopg.connect(dsn, autocommit=True) as conn:
            for job in ("wordcount", "windows", "faults"):
                t = self.names(job)["table"]
                for name in (t, f"eo_stage_{self.names(job)['sink_id']}"):
                    conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE")
                                 .format(sql.Identifier(name)))


def reap(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
def cluster_run(request: pytest.FixtureRequest, cluster: StandaloneCluster,
                kafka_bootstrap: str, hdfs_url: str, webhdfs_url: str, postgres_url: str,
                tmp_path: Path) -> Iterator[ClusterRun]:
    yield from _cluster_run(request, cluster, kafka_bootstrap, hdfs_url, webhdfs_url,
                            postgres_url, tmp_path)


def _cluster_run(request: pytest.FixtureRequest, cluster: StandaloneCluster, bootstrap: str,
                 hdfs_url: str, webhdfs_url: str, pg_url: str,
                 tmp: Path) -> Iterator[ClusterRun]:
    from connectors.demo.services.kafka import create_topic, produce_records

    run = ClusterRun(cluster, bootstrap, hdfs_url, webhdfs_url, pg_url, tmp)
    run.topic = f"{run.prefix}-in"
    create_topic(bootstrap, run.topic, 2)
    produce_records(bootstrap, run.topic,
                    [(f"k{i}".encode(), line(i).encode(), i % 2) for i in range(LINES)])
    for job in ("kafka_rk", "kafka_txn", "faults"):
        create_topic(bootstrap, run.names(job)["topic"], 2)
    announce(request, f"cluster test {request.node.name}: HDFS {hdfs_url}{run.base} "
              f"(WebHDFS {webhdfs_url}), app log {tmp / 'app.log'}")
    try:
        yield run
    finally:
        run.cleanup()
