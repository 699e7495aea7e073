"""A reset shows in every status command, on real state (issue 36, item 5): an ``eo_kafka``
sink that wrote to the test broker, an ``eo_jdbc`` sink on PostgreSQL and an ``eo_files``
sink each commit a few batches, ``sink reset`` records a restart, and ``wal show``,
``files status`` and ``sink status`` (text and JSON) show it until, and after, the
restarted query's first batch."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
import pytest

from connectors import cli
from connectors.core.sink import TaskInfo
from connectors.files.sink import FileSink
from connectors.jdbc.sink import JdbcSink
from connectors.kafka.sink import KafkaSink
from tests.helpers import read_topic


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(sink: Any, batch_id: int, rows: pa.RecordBatch) -> None:
    """One task and the commit of a batch, as the Spark adapter runs them (the query's batch
    id mapped by the sink's batch offset)."""
    stored = batch_id + sink.batch_offset()
    sink.commit(stored, [sink.stage(TaskInfo(stored, 0), iter([rows]))])


def test_kafka_sink_reset_shows_in_wal_show(kafka_bootstrap: str, new_topic: Any, tmp_path: Any,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    topic, wal = new_topic(partitions=2), str(tmp_path / "wal")
    sink_id = f"k-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(sink_id, wal, bootstrap_servers=kafka_bootstrap, topic=topic)
    sink.check_schema(pa.schema([("value", pa.binary())]))
    for b in range(3):
        write(sink, b, pa.record_batch({"value": [b"b%d-%d" % (b, i) for i in range(5)]}))
    code, out, _ = run(capsys, "sink", "reset", "--wal-path", wal, "--sink-id", sink_id)
    assert code == 0 and "the last committed batch was 2" in out
    code, out, err = run(capsys, "wal", "show", wal)
    assert code == 0, err
    assert (f"for sink {sink_id!r} after batch 2: the restarted query's batch B is stored as "
            "batch B + 3 (its batch 0 is 3)") in out
    write(sink, 0, pa.record_batch({"value": [b"new-%d" % i for i in range(5)]}))
    code, out, _ = run(capsys, "wal", "show", wal, "--json")
    doc = json.loads(out)
    assert (doc["reset"]["batch_offset"], doc["reset"]["last_committed"]) == (3, 2)
    assert doc["logs"]["commits"]["last_committed"] == 3
    assert len(read_topic(kafka_bootstrap, topic)) == 20  # the new batch 0 was written


def test_jdbc_reset_shows_in_sink_status(postgres_url: str, pg_table: Any,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    table = pg_table("reset")
    sink_id = f"j_{table}"
    sink = JdbcSink(postgres_url, table, sink_id, create_table=True)
    sink.check_schema(pa.schema([("id", pa.int64())]))
    for b in range(3):
        write(sink, b, pa.record_batch({"id": [b]}))
    assert run(capsys, "sink", "reset", "--url", postgres_url, "--sink-id", sink_id)[0] == 0
    code, out, err = run(capsys, "sink", "status", "--url", postgres_url, "--sink-id", sink_id)
    assert code == 0, err
    assert f"{sink_id}: reset recorded at " in out and "after batch 2; nothing committed" in out
    code, out, _ = run(capsys, "sink", "status", "--url", postgres_url, "--sink-id", sink_id,
                       "--json")
    row = json.loads(out)["sinks"][0]
    assert (row["batch_id"], row["reset_after"]) == (-1, 2)
    write(sink, 0, pa.record_batch({"id": [100]}))
    code, out, _ = run(capsys, "sink", "status", "--url", postgres_url, "--sink-id", sink_id,
                       "--json")
    row = json.loads(out)["sinks"][0]
    assert (row["batch_id"], row["reset_after"], row["rows"]) == (0, None, 1)


def test_files_reset_shows_in_files_status(tmp_path: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out_path = str(tmp_path / "out")
    sink = FileSink(out_path, sink_id="f")
    for b in range(2):
        write(sink, b, pa.record_batch({"id": [b]}))
    assert run(capsys, "sink", "reset", "--path", out_path)[0] == 0
    for argv in (["files", "status", out_path, "--json"], ["wal", "show", out_path, "--json"]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        reset = json.loads(out)["reset"]
        assert (reset["batch_offset"], reset["last_committed"], reset["sink_id"]) == (2, 1, "f")
