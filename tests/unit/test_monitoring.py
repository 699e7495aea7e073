"""connectors.monitoring without Spark: the metrics a progress and a commit event set, the
spool that carries a worker process's commit counts to the serving driver, and that a
metrics failure never reaches a batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from connectors.monitoring import channel, metrics
from connectors.monitoring.server import _DrainingRegistry


def value(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


def test_offsets_behind_reads_spark_offset_json_single_and_multi_cluster() -> None:
    assert metrics.offsets_behind('{"t": {"0": 5, "1": 7}}', '{"t": {"0": 9, "1": 7}}') == {
        ("t", "0"): 4, ("t", "1"): 0}
    assert metrics.offsets_behind({"c": {"t": {"0": 1}}}, {"c": {"t": {"0": 3}}}) == {
        ("c/t", "0"): 2}
    # a partition only in latest (new) is not guessed; other sources' offsets give nothing
    assert metrics.offsets_behind('{"t": {"0": 1}}', '{"t": {"0": 1, "1": 5}}') == {
        ("t", "0"): 0}
    assert metrics.offsets_behind("12", "15") == {}
    assert metrics.offsets_behind(None, '{"t": {"0": 1}}') == {}
    assert metrics.offsets_behind("not json", "{}") == {}


def test_progress_sets_query_and_source_metrics() -> None:
    qid = str(uuid.uuid4())
    progress = {
        "id": qid, "name": "q", "batchId": 3, "numInputRows": 10,
        "durationMs": {"triggerExecution": 250},
        "sources": [{"description": "eo_kafka", "numInputRows": 10,
                     "endOffset": '{"t": {"0": 10, "1": 4}}',
                     "latestOffset": '{"t": {"0": 16, "1": 4}}'}],
    }
    metrics.apply_progress(progress, now=1000.0)
    metrics.apply_progress({**progress, "batchId": 4, "numInputRows": 5}, now=1001.0)
    q = {"query_id": qid, "query_name": "q"}
    assert value("eo_query_batches_total", **q) == 2
    assert value("eo_query_input_rows_total", **q) == 15
    assert value("eo_query_last_batch_id", **q) == 4
    assert value("eo_query_last_progress_timestamp_seconds", **q) == 1001.0
    assert value("eo_query_batch_duration_seconds_count", **q) == 2
    assert value("eo_query_batch_duration_seconds_sum", **q) == pytest.approx(0.5)
    s = {**q, "source": "eo_kafka"}
    assert value("eo_source_input_rows_total", **s) == 20
    assert value("eo_source_offsets_behind_latest", **s, topic="t", partition="0") == 6
    assert value("eo_source_offsets_behind_latest_max", **s) == 6
    assert value("eo_source_offsets_behind_latest_min", **s) == 0
    assert value("eo_source_offsets_behind_latest_avg", **s) == 3
    metrics.query_ended(qid, "q", failed=True)
    assert value("eo_query_active", **q) == 0
    assert value("eo_query_failures_total", **q) == 1


def test_commit_and_replay_events_count_per_sink() -> None:
    sink = f"s-{uuid.uuid4().hex[:8]}"
    labels = {"family": "eo_kafka", "sink_id": sink}
    metrics.apply_event({"kind": "commit", "family": "eo_kafka", "sink_id": sink, "batch_id": 0,
                         "rows": 7, "produced": 5, "skipped_rows": 2, "retried_tasks": 1,
                         "scans": 1, "scan_records": 9, "scan_seconds": 0.5,
                         "steps": {"stage": 0.2, "commit": 0.01}, "ts": 50.0})
    metrics.apply_event({"kind": "replay", "family": "eo_kafka", "sink_id": sink,
                         "batch_id": 0, "ts": 51.0})
    assert value("eo_sink_batches_committed_total", **labels) == 1
    assert value("eo_sink_rows_committed_total", **labels) == 7
    assert value("eo_sink_records_produced_total", **labels) == 5
    assert value("eo_sink_rows_skipped_total", **labels) == 2
    assert value("eo_sink_retried_tasks_total", **labels) == 1
    assert value("eo_sink_recovery_scan_records_total", **labels) == 9
    assert value("eo_sink_replays_skipped_total", **labels) == 1
    assert value("eo_sink_last_committed_batch_id", **labels) == 0
    assert value("eo_sink_last_commit_timestamp_seconds", **labels) == 50.0
    assert value("eo_sink_step_seconds_count", **labels, step="stage") == 1


def test_a_worker_process_spools_to_the_serving_ancestor(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The path of ``writeStream.format(...)``: the commit runs in a child process of the
    driver's JVM; here the test process stands in for the JVM (the child's parent)."""
    monkeypatch.setenv(channel.SPOOL_ROOT_ENV, str(tmp_path))
    (tmp_path / str(os.getpid())).mkdir()
    (tmp_path / str(os.getpid()) / "stale.jsonl").write_text('{"kind": "replay"}\n')
    got: list[dict] = []
    spool = channel.Spool.create(os.getpid(), got.append)  # a former run's lines go
    code = ("from connectors.monitoring import channel\n"
            "channel.commit_event('eo_jdbc', 's1', 4, rows=3, steps={'commit': 0.1})\n"
            "channel.replay_event('eo_jdbc', 's1', 4)\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    assert spool.drain() == 2
    assert [(e["kind"], e["batch_id"]) for e in got] == [("commit", 4), ("replay", 4)]
    assert got[0]["rows"] == 3
    assert spool.drain() == 0  # read on, never twice
    spool.remove()
    assert not (tmp_path / str(os.getpid())).exists()


def test_without_a_serving_ancestor_an_event_is_dropped(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(channel.SPOOL_ROOT_ENV, str(tmp_path / "absent"))
    channel.commit_event("eo_jdbc", "s1", 1, rows=1)  # nothing to write to, no error
    assert not (tmp_path / "absent").exists()


def test_a_failing_metric_update_never_raises_into_the_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(event: object) -> None:
        raise RuntimeError("boom")

    channel.serving(broken)
    try:
        channel.commit_event("eo_files", "s", 1, rows=1)
        channel.replay_event("eo_files", "s", 1)
    finally:
        channel.serving(None)


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    got: list[dict] = []
    spool = channel.Spool(tmp_path, got.append)
    path = tmp_path / "1.jsonl"
    path.write_bytes(b'{"kind": "replay", "n": 1}\n{"kind": "rep')
    assert spool.drain() == 1
    with path.open("ab") as f:
        f.write(b'lay", "n": 2}\n')
    assert spool.drain() == 1
    assert [e["n"] for e in got] == [1, 2]


def test_the_spool_stays_small_and_every_line_is_read_once(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running query's worker writes on: past ROTATE_BYTES its file is renamed and the
    reader removes it once read, reading each line once across the renames."""
    monkeypatch.setattr(channel, "ROTATE_BYTES", 200)
    got: list[dict] = []
    spool = channel.Spool(tmp_path, got.append)
    live = tmp_path / f"{os.getpid()}.jsonl"
    for n in range(40):
        channel._append(live, (json.dumps({"kind": "replay", "n": n}) + "\n").encode())
        if n % 7 == 3:
            spool.drain()
    spool.drain()
    assert [e["n"] for e in got] == list(range(40))
    assert [p.name for p in tmp_path.iterdir()] in ([], [live.name])  # no renamed file left
    assert max((p.stat().st_size for p in tmp_path.iterdir()), default=0) < 200 + 40


def test_the_file_of_a_process_that_is_gone_is_removed_once_read(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    path = tmp_path / f"{gone.stdout.strip()}.jsonl"
    path.write_text('{"kind": "replay", "n": 1}\n')
    mine = tmp_path / f"{os.getpid()}.jsonl"
    mine.write_text('{"kind": "replay", "n": 2}\n')
    got: list[dict] = []
    spool = channel.Spool(tmp_path, got.append)
    assert spool.drain() == 2 and path.exists()  # written just now: a new owner may write on
    os.utime(path, (time.time() - 120, time.time() - 120))
    os.utime(mine, (time.time() - 120, time.time() - 120))
    assert spool.drain() == 0
    assert not path.exists() and mine.exists()  # this process is alive: its file stays


def test_a_scrape_applies_the_spool_first(tmp_path: Path) -> None:
    sink = f"s-{uuid.uuid4().hex[:8]}"
    spool = channel.Spool(tmp_path, metrics.apply_event)
    event = {"kind": "commit", "family": "eo_jdbc", "sink_id": sink, "batch_id": 2, "rows": 4,
             "steps": {}, "ts": 1.0}
    (tmp_path / "9.jsonl").write_text(json.dumps(event) + "\n")
    text = generate_latest(_DrainingRegistry(spool)).decode()  # type: ignore[arg-type]
    assert f'eo_sink_rows_committed_total{{family="eo_jdbc",sink_id="{sink}"}} 4.0' in text


def test_ancestors_walks_up_to_the_parent() -> None:
    chain = channel.ancestors(os.getpid())
    assert chain[0] == os.getpid()
    if Path("/proc").is_dir():
        assert os.getppid() in chain
