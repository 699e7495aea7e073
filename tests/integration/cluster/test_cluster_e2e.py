"""End to end on a standalone cluster (master + 2 one-core workers, executors in JVMs of
their own): every pipeline keeps its checkpoint, its WALs and its file output with the
staging on the session's real HDFS, and each output equals the ground truth as an exact
multiset.

One application runs all five jobs (one application start, not five, for CI time):
``eo_kafka`` -> word count -> ``eo_jdbc`` accumulate; ``eo_kafka`` -> ``eo_kafka`` sink in
both modes; ``eo_kafka`` -> ``eo_files``; ``KafkaWindows`` -> ``JdbcSink`` as a scheduled
batch job run twice.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import announce, assert_exact
from tests.integration.cluster.conftest import (
    ClusterRun,
    _cluster_run,
    expected_counts,
    expected_lines,
)

pytestmark = pytest.mark.cluster

JOBS = ["wordcount", "kafka_rk", "kafka_txn", "files", "windows"]


@pytest.fixture(scope="module")
def e2e(request: pytest.FixtureRequest, spark_cluster: Any, kafka_bootstrap: str,
        hdfs_url: str, webhdfs_url: str, postgres_url: str,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterRun, str]]:
    spark_cluster.wait_workers(spark_cluster.workers)
    tmp = tmp_path_factory.mktemp("cluster-e2e")
    for run in _cluster_run(request, spark_cluster, kafka_bootstrap, hdfs_url, webhdfs_url,
                            postgres_url, tmp):
        began = time.monotonic()
        output = run.finish(run.start(JOBS), timeout=600)
        announce(request, f"cluster e2e: {len(JOBS)} jobs in {time.monotonic() - began:.0f}s")
        yield run, output


def test_executors_ran_on_both_workers_and_state_is_on_hdfs(request, e2e) -> None:
    run, output = e2e
    app = re.search(r"^APP (\S+) (\S+)", output, re.M)
    assert app, output[-3000:]
    assert app.group(2) == run.cluster.url
    dirs = run.cluster.executor_dirs(app.group(1))
    # one executor JVM per worker, each launched by its worker (its work dir has the logs)
    assert sorted(dirs) == [0, 1], dirs
    # and never lost: a relaunched executor would add an id (a worker dropped by the master)
    assert all(len(ids) == 1 for ids in dirs.values()), dirs
    hdfs = sorted(set(re.findall(r"^HDFS .*? (\S+)$", output, re.M)))
    assert all(u.startswith((run.hdfs_url, "webhdfs://")) for u in hdfs), hdfs
    assert any(u.startswith(run.hdfs_url + run.base + "/chk/") for u in hdfs)
    announce(request, f"cluster e2e: app {app.group(1)} executors by worker {dirs} "
              f"(work dirs {[w.work_dir for w in run.cluster.nodes]}); HDFS: {hdfs}")


def test_wordcount_into_jdbc_accumulate_is_exact(e2e) -> None:
    run, _ = e2e
    assert run.jdbc_counts("wordcount") == expected_counts()


@pytest.mark.parametrize("job", ["kafka_rk", "kafka_txn"])
def test_kafka_to_kafka_sink_is_exact(e2e, job: str) -> None:
    run, _ = e2e
    assert_exact(run.kafka_values(job), ["B:" + t for t in expected_lines()], what=job)


def test_kafka_to_files_on_hdfs_is_exact(e2e) -> None:
    run, _ = e2e
    assert_exact(run.file_lines("files"), expected_lines(), what="eo_files on HDFS")


def test_kafka_windows_into_jdbc_sink_as_a_scheduled_job(e2e) -> None:
    run, output = e2e
    windows = re.findall(r"^WINDOW (\d) (\d+)$", output, re.M)
    # run 0 took windows 0 and 1 and left 1 uncommitted; run 1 replayed 1, then 2 and 3
    assert [(int(r), int(w)) for r, w in windows] == [(0, 0), (0, 1), (1, 1), (1, 2), (1, 3)]
    assert run.jdbc_counts("windows") == expected_counts()
