"""``eo-connectors metrics``: the last committed batch per sink and its age, read from the
sinks' own state (an eo_jdbc commit table on SQLite, an eo_kafka sink's walPath, an eo_files
output path), printed or exposed in Prometheus' text format, and nothing written."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client import generate_latest

from connectors import cli, cli_metrics
from connectors.core.sink import TaskInfo
from connectors.files.sink import FileSink
from connectors.jdbc.sink import JdbcSink
from connectors.kafka.sink import KafkaSink


def state(tmp_path: Path) -> tuple[str, str, str]:
    url = f"sqlite:///{tmp_path / 't.db'}"
    jdbc = JdbcSink(url, "t", "j", create_table=True)
    jdbc.check_schema(pa.schema([("id", pa.int64())]))
    for b in range(3):
        jdbc.commit(b, [jdbc.stage(TaskInfo(b, 0), iter([pa.record_batch({"id": [b]})]))])
    wal = str(tmp_path / "wal")
    kafka = KafkaSink("k", wal, bootstrap_servers="127.0.0.1:1", topic="t")
    kafka.check_schema(pa.schema([("value", pa.binary())]))
    for b in range(2):
        kafka.commit(b, [])
    out = str(tmp_path / "out")
    files = FileSink(out, sink_id="f")
    files.commit(0, [files.stage(TaskInfo(0, 0), iter([pa.record_batch({"id": [1, 2]})]))])
    return url, wal, out


def listing(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_metrics_prints_each_sinks_last_commit_and_its_age_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, wal, out = state(tmp_path)
    before = listing(tmp_path)
    code = cli.main(["metrics", "--jdbc-url", url, "--wal-path", wal, "--wal-path", out,
                     "--json"])
    printed, err = capsys.readouterr()
    assert code == 0, err
    sinks = {s["family"]: s for s in json.loads(printed)["sinks"]}
    assert (sinks["eo_jdbc"]["sink_id"], sinks["eo_jdbc"]["last_batch"]) == ("j", 2)
    assert (sinks["eo_kafka"]["sink_id"], sinks["eo_kafka"]["last_batch"]) == ("k", 1)
    assert (sinks["eo_files"]["sink_id"], sinks["eo_files"]["last_batch"]) == ("f", 0)
    for s in sinks.values():
        assert 0 <= s["age_seconds"] < 120, s
    assert listing(tmp_path) == before
    code = cli.main(["metrics", "--jdbc-url", url])
    text, _ = capsys.readouterr()
    assert "eo_jdbc j at sqlite:" in text and "last committed batch 2" in text


def test_serve_exposes_the_same_in_prometheus_text(tmp_path: Path) -> None:
    url, wal, _ = state(tmp_path)
    parser = argparse.ArgumentParser()
    cli_metrics.add_arguments(parser)
    args = parser.parse_args(["--jdbc-url", url, "--wal-path", wal])
    collector = cli_metrics._Collector(
        lambda: cli_metrics.collect(args, cli._storage, now=None))
    text = generate_latest(collector).decode()  # type: ignore[arg-type]
    assert 'eo_sink_last_committed_batch_id{family="eo_jdbc",sink_id="j"} 2.0' in text
    assert 'eo_sink_last_committed_batch_id{family="eo_kafka",sink_id="k"} 1.0' in text
    assert 'eo_sink_last_commit_timestamp_seconds{family="eo_kafka",sink_id="k"}' in text


def test_metrics_without_anything_to_read_says_what_to_give(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["metrics"]) == 2
    assert "--jdbc-url" in capsys.readouterr().err
    os.makedirs(tmp_path / "empty")
    assert cli.main(["metrics", "--wal-path", str(tmp_path / "empty")]) == 2
    assert "holds no sink commit log" in capsys.readouterr().err
