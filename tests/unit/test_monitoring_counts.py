"""The counts issue 44 adds beyond committed output (docs/monitoring.md): failed and aborted
attempts, the source's window commits and WAL size, and the storage layer's operations,
retries and conditional-create conflicts, each counted by the real code path on a local
disk (no network) and read back from the metrics registry."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import generate_latest

from connectors.core.storage import LocalStorage
from connectors.core.storage.disk import is_retried
from connectors.core.storage.retry import RetryBudget
from connectors.core.wal import RETAIN_EVERY, WriteAheadLog
from connectors.kafka.source.options import KafkaSourceOptions
from connectors.kafka.source.planner import KafkaPlanner
from connectors.monitoring import channel, metrics
from tests.helpers import FakeClusters, RecordingSink


def value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def serving() -> Any:
    """This process serves the metrics: events apply straight to the registry."""
    channel.serving(metrics.apply_event)
    try:
        yield
    finally:
        channel.serving(None)


def storage(what: str, store: str, op: str) -> float:
    return value(f"eo_storage_{what}_total", store=store, op=op)


def test_a_conditional_create_that_finds_its_name_taken_counts_as_a_conflict(
        tmp_path: Path) -> None:
    disk = LocalStorage()
    before = (storage("operations", "file", "create"),
              storage("create_conflicts", "file", "create"))
    disk.create(str(tmp_path / "a"), b"1")
    with pytest.raises(FileExistsError):
        disk.create(str(tmp_path / "a"), b"2")
    assert storage("operations", "file", "create") == before[0] + 2
    assert storage("create_conflicts", "file", "create") == before[1] + 1


def test_each_retry_of_a_transient_error_counts_and_the_operation_once() -> None:
    tries: list[int] = []

    def full_twice() -> str:
        tries.append(1)
        if len(tries) <= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return "written"

    store = f"test-{uuid.uuid4().hex[:6]}"
    budget = RetryBudget(timeout=5, max_retries=10, backoff=0.001, backoff_max=0.001)
    assert budget.run(full_twice, transient=is_retried, what=lambda: "x", store=store,
                      op="write") == "written"
    assert storage("operations", store, "write") == 1
    assert storage("retries", store, "write") == 2
    text = generate_latest(metrics.REGISTRY).decode()
    assert f'eo_storage_retries_total{{op="write",store="{store}"}} 2.0' in text


def test_a_worker_processes_storage_totals_reach_the_endpoint_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child process (a Python worker of the driver's JVM; the test process stands in
    for the JVM) creates on disk and spools its totals twice: the endpoint adds its newest
    totals to its own, not the sum of both lines."""
    monkeypatch.setenv(channel.SPOOL_ROOT_ENV, str(tmp_path / "spool"))
    spool = channel.Spool.create(os.getpid(), metrics.apply_event)
    before = storage("create_conflicts", "file", "create")
    code = ("import sys\n"
            "from connectors.core.storage import LocalStorage\n"
            "from connectors.monitoring import channel\n"
            "disk = LocalStorage()\n"
            "disk.create(sys.argv[1], b'1')\n"
            "try:\n"
            "    disk.create(sys.argv[1], b'2')\n"
            "except FileExistsError:\n"
            "    pass\n"
            "channel.storage_totals()\n"
            "channel.replay_event('eo_jdbc', 's', 1)\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "f")], check=True,
                   env=dict(os.environ))
    try:
        assert spool.drain() == 2
        assert storage("create_conflicts", "file", "create") == before + 1
    finally:
        spool.remove()


def _gone_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_the_totals_of_workers_that_ended_stay_counted_in_one_entry() -> None:
    """Python workers come and go over a long run: the endpoint folds the totals of one that
    ended (and sent nothing for RETIRE_AFTER_S) into one sum, so it keeps an entry per live
    worker, and the counters never go down."""
    store = f"test-{uuid.uuid4().hex[:6]}"
    live = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    gone = [f"{_gone_pid()}-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    for token in [live, *gone]:
        metrics.apply_event({"kind": "storage", "process": token,
                             "storage": [["operations", store, "create", 5]]})
    assert storage("operations", store, "create") == 20
    later = metrics._PEER_SEEN[live] + metrics.RETIRE_AFTER_S + 1
    assert metrics.retire_gone_peers(now=later) >= 3  # (and any an earlier test left)
    assert [t for t in [live, *gone] if t in metrics._PEER_STORAGE] == [live]
    assert storage("operations", store, "create") == 20
    # a live process's newest totals still replace its older ones
    metrics.apply_event({"kind": "storage", "process": live,
                         "storage": [["operations", store, "create", 7]]})
    assert storage("operations", store, "create") == 22


def test_a_new_spool_removes_the_spools_of_driver_jvms_that_are_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver killed mid-run leaves its JVM's spool; the next one removes it (a driver
    restarted after each crash for months would otherwise leave one per crash), and keeps
    the spool of a driver that still runs."""
    monkeypatch.setenv(channel.SPOOL_ROOT_ENV, str(tmp_path))
    dead, running = tmp_path / str(_gone_pid()), tmp_path / str(os.getppid())
    for d in (dead, running):
        d.mkdir()
        (d / "123.jsonl").write_text("{}\n")
        (d / "123.jsonl.5").write_text("{}\n")
    spool = channel.Spool.create(os.getpid(), metrics.apply_event)
    try:
        assert not dead.exists()
        assert sorted(p.name for p in running.iterdir()) == ["123.jsonl", "123.jsonl.5"]
    finally:
        spool.remove()


def _staged(writer: int, attempt: int, payload: Any) -> Any:
    from connectors.spark.sink_adapter import StagedMessage

    return StagedMessage(writer, attempt, payload)


def test_failed_attempts_count_from_the_winning_attempts_never_as_output(
        tmp_path: Path, serving: None) -> None:
    """Writer 0 won at attempt 0, writer 1 at attempt 2 (two attempts failed), writer 2 at
    attempt 1: three failed attempts, and the rows are the winners' only."""
    from connectors.spark.sink_adapter import _commit

    sink = RecordingSink(str(tmp_path))
    sink_id = ""  # the recording sink has no sink_id
    labels = {"family": "recording", "sink_id": sink_id}
    before = value("eo_sink_failed_attempts_total", **labels)
    staged = [_staged(w, a, sink.stage(_task(7, w, a), iter([pa.record_batch(
        {"v": [w]})]))) for w, a in ((0, 0), (1, 2), (2, 1))]
    _commit(sink, 7, staged)
    assert value("eo_sink_failed_attempts_total", **labels) == before + 3
    assert sorted(r["v"] for r in sink.committed_rows()) == [0, 1, 2]
    # a batch whose every task won at its first attempt adds none
    _commit(sink, 8, [_staged(0, 0, sink.stage(_task(8, 0, 0), iter([])))])
    assert value("eo_sink_failed_attempts_total", **labels) == before + 3


def test_an_aborted_batch_counts_once(tmp_path: Path, serving: None) -> None:
    from connectors.spark.sink_adapter import _abort

    sink = RecordingSink(str(tmp_path))
    labels = {"family": "recording", "sink_id": ""}
    before = value("eo_sink_batches_aborted_total", **labels)
    _abort(sink, 3, [None])
    assert value("eo_sink_batches_aborted_total", **labels) == before + 1


@pytest.mark.parametrize("family", ["eo_jdbc", "eo_files"])
def test_failed_and_aborted_counts_carry_the_family_of_every_other_series(
        family: str, tmp_path: Path, serving: None) -> None:
    """The real sinks, not a recording one: a failed attempt and an aborted batch count under
    the same ``family`` label as the sink's commits and docs/monitoring.md's (issue 50: the
    JDBC and file sinks counted them as ``jdbc`` and ``files``)."""
    from connectors.files.sink import FileSink
    from connectors.jdbc.sink import JdbcSink
    from connectors.kafka.sink import KafkaSink
    from connectors.spark.sink_adapter import _abort, _commit

    assert {JdbcSink.family, FileSink.family, KafkaSink.family} == {
        "eo_jdbc", "eo_files", "eo_kafka"}
    sink_id = f"f{uuid.uuid4().hex[:8]}"
    sink: Any
    if family == "eo_jdbc":
        sink = JdbcSink(f"sqlite:///{tmp_path / 'd.db'}", "t", sink_id, create_table=True)
        sink.check_schema(pa.schema([("v", pa.int64())]))
    else:
        sink = FileSink(str(tmp_path / "out"), sink_id=sink_id)
    rows = iter([pa.record_batch({"v": pa.array([1], pa.int64())})])
    _commit(sink, 0, [_staged(0, 1, sink.stage(_task(0, 0, 1), rows))])  # attempt 0 failed
    _abort(sink, 1, [None])
    labelled = {s.labels["family"] for f in metrics.REGISTRY.collect() for s in f.samples
                if s.labels.get("sink_id") == sink_id}
    assert labelled == {family}
    for name in ("eo_sink_failed_attempts_total", "eo_sink_batches_aborted_total",
                 "eo_sink_batches_committed_total"):
        assert value(name, family=family, sink_id=sink_id) == 1, name


def _task(batch_id: int, writer: int, attempt: int) -> Any:
    from connectors.core.sink import TaskInfo

    return TaskInfo(batch_id, writer, attempt=attempt)


def test_fenced_and_aborted_transaction_counts_are_sink_counters(serving: None) -> None:
    sink = f"s-{uuid.uuid4().hex[:8]}"
    labels = {"family": "eo_kafka", "sink_id": sink}
    channel.commit_event("eo_kafka", sink, 4, rows=10, fenced=1, retried_tasks=1)
    channel.count_event("eo_kafka", sink, 4, transactions_aborted=1)
    assert value("eo_sink_fenced_attempts_total", **labels) == 1
    assert value("eo_sink_transactions_aborted_total", **labels) == 1
    assert value("eo_sink_rows_committed_total", **labels) == 10  # the count added no rows
    assert value("eo_sink_batches_committed_total", **labels) == 1


def test_a_source_window_commit_reports_its_time_and_the_wal_files(tmp_path: Path,
                                                                  serving: None) -> None:
    """The planner's real commit on a local WAL: one event per window, the time it took,
    and the files its listing saw (a record and a marker per window, less what retention
    deleted)."""
    opts = KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "walpath": str(tmp_path)},
        batch=True)
    planner = KafkaPlanner(opts)
    ends = {("", "t", 0): 0}
    planner.clusters = FakeClusters(ends)  # type: ignore[assignment]
    wal = str(tmp_path)
    before = value("eo_source_windows_committed_total", wal_path=wal)
    windows = RETAIN_EVERY + 2
    for i in range(windows):
        planner.clusters.ends[("", "t", 0)] = i + 1  # type: ignore[attr-defined]
        w = planner.next_window()
        assert w is not None and w.window == i
        planner.commit(w.end)
    assert value("eo_source_windows_committed_total", wal_path=wal) == before + windows
    assert value("eo_source_window_commit_seconds_count", wal_path=wal) >= windows
    # the last listing ran at window RETAIN_EVERY's retention; what it left is on disk now
    # less the two windows since
    on_disk = len(WriteAheadLog(LocalStorage(), wal, "source").storage.list(
        os.path.join(wal, "source")))
    assert value("eo_source_wal_files", wal_path=wal) == on_disk - 2 * (windows - 1 -
                                                                         RETAIN_EVERY)
