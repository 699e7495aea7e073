"""Faults that a cluster has and local mode does not, each followed by exact output.

The pipeline (``cluster_app`` job ``faults``): ``eo_kafka`` -> ``foreachBatch``: word
counts -> ``JdbcSink`` accumulate (staged on the executors), the lines -> ``KafkaSink``
(recovery keys) and -> ``FileSink`` (parquet on HDFS); checkpoint and WALs on HDFS.

A holding sink (``pipelines/holding.py``) keeps the first attempt of writer 0 of one batch
open right *after* its stage step: its Kafka records are produced and flushed, or its files
are staged on HDFS. The test then kills, at that point:

- the executor JVM running that task, found through its worker (a child of the worker's
  JVM whose process tree holds the task's Python worker): Spark reschedules the task on
  the other executor;
- the whole worker (its JVM and its executors, one process group), then starts a new one;
- the driver (its Python and its JVM), then starts the application again from its
  checkpoint on HDFS.

``test_executor_kill_without_protection_duplicates`` shows the executor-kill test can
fail: it removes the Kafka sink's started marker of the held task (the state its retry
checks) before the kill, and the output then holds duplicates.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from connectors.core.storage import storage_for
from tests.helpers import announce, assert_exact
from tests.integration.cluster.conftest import (
    ClusterRun,
    expected_counts,
    expected_lines,
    reap,
)
from tests.services.spark_cluster import alive, cmdline

pytestmark = pytest.mark.cluster

BATCH = 1  # the held batch: batch 0 is committed by every sink before the fault


def assert_all_exact(run: ClusterRun) -> None:
    assert run.jdbc_counts("faults") == expected_counts()
    assert_exact(run.kafka_values("faults", "read_uncommitted"), expected_lines(),
                 what="KafkaSink output")
    assert_exact(run.file_lines("faults"), expected_lines(), what="FileSink output on HDFS")


def kill_held_executor(request, run: ClusterRun, held_pid: int) -> None:
    found = run.cluster.executor_of(held_pid)
    assert found, f"no executor JVM of the workers holds Python worker {held_pid}"
    worker, executor = found
    assert "CoarseGrainedExecutorBackend" in cmdline(executor)
    announce(request, f"SIGKILL executor JVM {executor} of worker {worker.index} "
              f"(pid {worker.pid}) mid-batch {BATCH}: {cmdline(executor)[-160:]}")
    os.kill(executor, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while alive(executor) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(executor)


def run_killing_the_held_executor(request, cluster_run: ClusterRun, hold: str) -> None:
    """The ``faults`` job, its executor JVM killed where ``hold`` holds a task; then every
    output exact."""
    proc = cluster_run.start(["faults"], hold=hold)
    try:
        kill_held_executor(request, cluster_run, cluster_run.held(proc))
        output = cluster_run.finish(proc)
    finally:
        reap(proc)
    assert "JOB DONE faults" in output and "Lost executor" in output
    assert_all_exact(cluster_run)


def test_executor_jvm_killed_mid_batch(request, cluster_run: ClusterRun) -> None:
    began = time.monotonic()
    run_killing_the_held_executor(request, cluster_run, f"kafka@{BATCH}")
    announce(request, f"executor kill: exact in {time.monotonic() - began:.0f}s")


def test_worker_killed_mid_batch(request, cluster_run: ClusterRun) -> None:
    began = time.monotonic()
    cluster = cluster_run.cluster
    proc = cluster_run.start(["faults"], hold=f"files@{BATCH}")
    try:
        held = cluster_run.held(proc)
        found = cluster.executor_of(held)
        assert found, f"no executor JVM of the workers holds Python worker {held}"
        worker, executor = found
        announce(request, f"SIGKILL worker {worker.index} (JVM {worker.pid} and executor "
                  f"{executor}) with files of batch {BATCH} staged on HDFS")
        cluster.kill_worker(worker)
        output = cluster_run.finish(proc)
    finally:
        reap(proc)
    assert "JOB DONE faults" in output and "worker lost" in output
    assert_all_exact(cluster_run)
    cluster.restart_worker(worker)
    announce(request, f"worker kill: exact in {time.monotonic() - began:.0f}s")


def test_driver_killed_then_restarted_from_checkpoint(request, cluster_run: ClusterRun) -> None:
    began = time.monotonic()
    proc = cluster_run.start(["faults"], hold=f"kafka@{BATCH + 1}")
    try:
        cluster_run.held(proc)
        announce(request, f"SIGKILL driver {proc.pid} (Python and JVM) mid-batch {BATCH + 1}")
        reap(proc)
    finally:
        reap(proc)
    assert "JOB DONE" not in cluster_run.log()
    proc = cluster_run.start(["faults"], log_name="restart.log")
    try:
        output = cluster_run.finish(proc, log_name="restart.log")
    finally:
        reap(proc)
    assert "JOB DONE faults" in output
    assert_all_exact(cluster_run)
    announce(request, f"driver kill + restart: exact in {time.monotonic() - began:.0f}s")


def test_executor_kill_without_protection_duplicates(request, cluster_run: ClusterRun) -> None:
    """Protection disabled: the held task's started marker is deleted before its executor
    dies, so the retry believes it is a first attempt and produces every row again."""
    proc = cluster_run.start(["faults"], hold=f"kafka@{BATCH}")
    try:
        held = cluster_run.held(proc)
        storage, root = storage_for(cluster_run.webhdfs("faults", "sink"))
        marker = storage.join(root, "started", f"{BATCH:020d}", f"{0:05d}.json")
        assert storage.exists(marker), "the first attempt wrote no started marker"
        storage.delete(marker)
        kill_held_executor(request, cluster_run, held)
        cluster_run.finish(proc)
    finally:
        reap(proc)
    values = cluster_run.kafka_values("faults", "read_uncommitted")
    doubled = Counter(values) - Counter(expected_lines())
    duplicates = sum(doubled.values())
    announce(request, f"WITHOUT PROTECTION: {duplicates} duplicate records in the Kafka "
              f"output ({len(values)} read, {len(expected_lines())} expected)")
    assert duplicates > 0, "the kill should have doubled the held task's records"
    # the sinks that kept their protection stay exact
    assert cluster_run.jdbc_counts("faults") == expected_counts()
    assert_exact(cluster_run.file_lines("faults"), expected_lines(), what="FileSink output")



def test_executor_jvm_killed_mid_batch_with_state_and_files_on_s3(
        request, cluster_run: ClusterRun, s3_service, s3_bucket) -> None:
    """The same pipeline with every piece of our state and output on the real S3 server
    (the source's and the Kafka sink's walPath, the file sink's output, log and attempt
    records; the credentials travel as storage.* options); Spark's checkpoint stays on
    HDFS. The executor JVM holding the file sink's first attempt of writer 0 dies after
    that attempt wrote its files in place: Spark reruns the task elsewhere, the commit
    names the rerun's files, and the cleanup deletes the dead attempt's."""
    from connectors.files.sink import FileSink

    cluster_run.s3, cluster_run.s3_bucket = s3_service, s3_bucket
    began = time.monotonic()
    run_killing_the_held_executor(request, cluster_run, f"files@{BATCH}")
    sink = FileSink(f"s3://{s3_bucket}{cluster_run.base}/files/faults",
                    storage_options=s3_service.python_options())
    listed = {f for f in sink.storage.walk_files(sink.path) if "/_" not in f}
    assert listed == set(sink.committed_files()), "files of the killed attempt were left"
    announce(request, f"executor kill, state on S3: exact in {time.monotonic() - began:.0f}s")
