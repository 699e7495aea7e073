"""The status commands on state directories, without services (issue 36, items 3 and 5):

- ``wal show`` on a directory that holds no log of the kind asked for is an error naming what
  is there (the parent of a few walPaths, another log, other files), never "(empty)";
- a source log whose newest window is pending says why, in one line;
- after ``sink reset`` every status command shows the recorded restart point: ``wal show``
  and ``files status`` (text and JSON) and JDBC's ``sink status``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pytest

from connectors import cli
from connectors.core.sink import TaskInfo
from connectors.core.wal import WriteAheadLog
from connectors.files.sink import FileSink
from connectors.jdbc.sink import JdbcSink
from connectors.kafka.sink import KafkaSink

VALUE = pa.schema([("value", pa.binary())])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def source_wal(path: str, windows: int, committed: int) -> None:
    wal = WriteAheadLog.open(path, "source")
    for w in range(windows):
        wal.append(w, {"window": w, "start": {"t": {"0": w * 10}},
                       "end": {"t": {"0": w * 10 + 10}}})
        if w < committed:
            wal.commit(w)


def kafka_sink_wal(path: str, sink_id: str, batches: int) -> KafkaSink:
    sink = KafkaSink(sink_id, path, bootstrap_servers="127.0.0.1:1", topic="t")
    sink.check_schema(VALUE)
    for b in range(batches):
        sink.commit(b, [])
    return sink


def files_write(sink: FileSink, batch_id: int) -> None:
    off = sink.batch_offset()  # what the Spark adapter adds
    rows = pa.record_batch({"id": list(range(batch_id * 10, batch_id * 10 + 10))})
    sink.commit(batch_id + off, [sink.stage(TaskInfo(batch_id + off, 0), iter([rows]))])


# -- item 3: a directory without the log asked for ------------------------------------------------
def test_wal_show_on_the_parent_of_walpaths_names_them(tmp_path: Any, capsys: Any) -> None:
    parent = str(tmp_path / "wal")
    source_wal(os.path.join(parent, "source"), 3, 3)
    kafka_sink_wal(os.path.join(parent, "kafka-sink"), "k", 2)
    code, out, err = run(capsys, "wal", "show", parent)
    assert code == 2 and out == ""
    assert "holds no write-ahead log itself; it is the parent of 2 walPath(s)" in err
    assert f"{parent}/kafka-sink (commits)" in err and f"{parent}/source (source)" in err
    assert "eo-connectors wal show" in err
    code, _, err = run(capsys, "wal", "show", parent, "--json")
    assert code == 2 and "parent of 2 walPath(s)" in err


def test_wal_show_of_a_kind_that_is_not_there_names_the_logs_that_are(
        tmp_path: Any, capsys: Any) -> None:
    source = str(tmp_path / "source-wal")
    source_wal(source, 2, 2)
    for kind in ("sink", "commits", "_eo_log"):  # any other --kind: an argparse error
        code, out, err = run(capsys, "wal", "show", source, "--kind", kind)
        assert code == 2 and out == ""
        assert f"holds no {kind!r} log; it holds source/ (eo_kafka source windows)" in err
    sink = str(tmp_path / "sink-wal")
    kafka_sink_wal(sink, "k", 2)
    code, out, err = run(capsys, "wal", "show", sink, "--kind", "sink")
    assert code == 0, err
    assert "[commits] last committed: 1 (eo_kafka sink commits)" in out
    code, out, err = run(capsys, "wal", "show", sink, "--kind", "source", "--json")
    assert code == 2 and "holds no 'source' log; it holds commits/" in err


def test_wal_show_on_a_directory_of_something_else_lists_what_it_holds(
        tmp_path: Any, capsys: Any) -> None:
    other = tmp_path / "other"
    (other / "data").mkdir(parents=True)
    (other / "notes.txt").write_text("x")
    code, out, err = run(capsys, "wal", "show", str(other))
    assert code == 2 and out == ""
    assert "holds no write-ahead log" in err and "data/" in err and "notes.txt" in err


def test_an_empty_log_directory_is_shown_as_an_empty_log(tmp_path: Any, capsys: Any) -> None:
    (tmp_path / "wal" / "source").mkdir(parents=True)
    code, out, err = run(capsys, "wal", "show", str(tmp_path / "wal"))
    assert code == 0, err
    assert "[source] last committed: None" in out and "nothing written to this log yet" in out


def test_the_newest_pending_window_says_why(tmp_path: Any, capsys: Any) -> None:
    wal = str(tmp_path / "wal")
    source_wal(wal, 3, 2)
    code, out, err = run(capsys, "wal", "show", wal)
    assert code == 0, err
    assert "PENDING" in out and "after a finished AvailableNow/Once run it stays PENDING" in out
    code, out, _ = run(capsys, "wal", "show", wal, "--json")
    log = json.loads(out)["logs"]["source"]
    assert log["last_committed"] == 1 and "AvailableNow" in log["pending_note"]
    source_wal(str(tmp_path / "done"), 3, 3)
    code, out, _ = run(capsys, "wal", "show", str(tmp_path / "done"), "--json")
    assert json.loads(out)["logs"]["source"]["pending_note"] is None


# -- item 5: a reset shows in every status command ------------------------------------------------
def test_kafka_sink_reset_shows_in_wal_show(tmp_path: Any, capsys: Any) -> None:
    wal = str(tmp_path / "wal")
    sink = kafka_sink_wal(wal, "k", 3)
    code, out, _ = run(capsys, "wal", "show", wal, "--json")
    assert json.loads(out)["reset"] is None and "reset recorded" not in out
    assert run(capsys, "sink", "reset", "--wal-path", wal, "--sink-id", "k")[0] == 0
    code, out, err = run(capsys, "wal", "show", wal)
    assert code == 0, err
    assert ("reset recorded at " in out and "for sink 'k' after batch 2: the restarted query's "
            "batch B is stored as batch B + 3 (its batch 0 is 3)" in out)
    sink.commit(0 + sink.batch_offset(), [])  # the restarted query's batch 0
    code, out, _ = run(capsys, "wal", "show", wal, "--json")
    doc = json.loads(out)
    assert doc["reset"]["batch_offset"] == 3 and doc["reset"]["last_committed"] == 2
    assert doc["reset"]["sink_id"] == "k" and doc["reset"]["resets"] == 1
    assert doc["reset"]["at"].endswith("+00:00")
    assert doc["logs"]["commits"]["last_committed"] == 3


def test_files_sink_reset_shows_in_files_status_and_wal_show(tmp_path: Any, capsys: Any) -> None:
    out_path = str(tmp_path / "out")
    sink = FileSink(out_path, sink_id="f")
    for b in range(2):
        files_write(sink, b)
    code, out, _ = run(capsys, "files", "status", out_path, "--json")
    assert json.loads(out)["reset"] is None
    assert run(capsys, "sink", "reset", "--path", out_path, "--sink-id", "f")[0] == 0
    files_write(sink, 0)  # the restarted query's batch 0, stored as 2
    code, out, err = run(capsys, "files", "status", out_path)
    assert code == 0, err
    assert "3 committed batches" in out
    assert "for sink 'f' after batch 1: the restarted query's batch B is stored as batch B + 2" \
        in out
    code, out, _ = run(capsys, "files", "status", out_path, "--json")
    doc = json.loads(out)
    assert doc["reset"]["batch_offset"] == 2 and doc["reset"]["last_committed"] == 1
    assert [b["batch_id"] for b in doc["batches"]] == [0, 1, 2]
    code, out, _ = run(capsys, "wal", "show", out_path, "--json")
    doc = json.loads(out)
    assert doc["reset"]["batch_offset"] == 2 and doc["logs"]["_eo_log"]["last_committed"] == 2


def test_jdbc_reset_shows_in_sink_status(tmp_path: Any, capsys: Any) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    schema = pa.schema([("id", pa.int64())])
    sink = JdbcSink(url, "t", "j", create_table=True)
    sink.check_schema(schema)
    JdbcSink(url, "t2", "never", create_table=True).check_schema(schema)

    def commit(b: int) -> None:
        rows = pa.record_batch({"id": [b]})
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter([rows]))])

    for b in range(4):
        commit(b)
    assert run(capsys, "sink", "reset", "--url", url, "--sink-id", "j")[0] == 0
    assert run(capsys, "sink", "reset", "--url", url, "--sink-id", "never")[0] == 0
    code, out, err = run(capsys, "sink", "status", "--url", url)
    assert code == 0, err
    assert "j: reset recorded at " in out and "after batch 3; nothing committed since" in out
    assert "never: nothing committed yet" in out
    code, out, _ = run(capsys, "sink", "status", "--url", url, "--json")
    sinks = {s["sink_id"]: s for s in json.loads(out)["sinks"]}
    assert (sinks["j"]["batch_id"], sinks["j"]["reset_after"]) == (-1, 3)
    assert (sinks["never"]["batch_id"], sinks["never"]["reset_after"]) == (-1, None)
    # A second reset before the restarted query commits keeps the batch it followed.
    code, out, _ = run(capsys, "sink", "reset", "--url", url, "--sink-id", "j")
    assert code == 0 and "the last committed batch was 3" in out
    assert sink.last_committed() is None and sink.admit(0) is True
    commit(0)  # the restarted query's batch 0
    code, out, _ = run(capsys, "sink", "status", "--url", url, "--sink-id", "j")
    assert "j: last committed batch 0 (1 rows" in out
