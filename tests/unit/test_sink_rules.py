"""The rules every sink runs before it decides anything (issue 14), without Spark or a broker:

- ownership before "batch already committed": a second sink pointed at another's walPath or
  output path is refused, at a low batch id (the old silent skip) and at a high one;
- the batch order: the last committed batch again is a replay (nothing written), a lower one
  is a new checkpoint or a second writer and is refused;
- ``eo-connectors sink reset`` records a restart, after which batch ids from 0 are accepted.
"""

from __future__ import annotations

import os
import sqlite3

import pyarrow as pa
import pytest

from connectors import cli
from connectors.core.errors import BatchOrderError, SinkOwnershipError
from connectors.core.sink import TaskInfo, check_batch_order
from connectors.core.storage import storage_for
from connectors.files.sink import FileSink
from connectors.jdbc.sink import JdbcSink
from connectors.kafka.sink import KafkaSink, recovery
from connectors.kafka.sink.sink import writer_for
from connectors.kafka.sink.writer import TaskReport
from tests.helpers import assert_exact


def ids(start: int, end: int) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(start, end))})


def files_write(sink: FileSink, batch_id: int, start: int, end: int) -> None:
    off = sink.batch_offset()  # what the Spark adapter adds
    msgs = [sink.stage(TaskInfo(batch_id + off, 0), iter([ids(start, end)]))]
    sink.commit(batch_id + off, msgs)


def read_ids(path: str) -> list[int]:
    import pyarrow.dataset as ds

    return sorted(ds.dataset(path, format="parquet").to_table().column("id").to_pylist())


# -- the rule itself ----------------------------------------------------------------------------
def test_batch_order_rule():
    assert check_batch_order("f", "s", 0, None, "w", "reset") is True
    assert check_batch_order("f", "s", 4, 3, "w", "reset") is True
    assert check_batch_order("f", "s", 3, 3, "w", "reset") is False
    with pytest.raises(BatchOrderError) as e:
        check_batch_order("f", "s", 0, 3, "/x", "eo-connectors sink reset --path /x")
    msg = str(e.value)
    for part in ("'s'", "/x", "batch 0", "last committed batch 3", "new checkpoint",
                 "second", "new sink_id", "eo-connectors sink reset --path /x"):
        assert part in msg


# -- files --------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_id", [0, 5])
def test_files_second_sink_on_a_path_is_refused_before_the_replay_rule(tmp_path, batch_id):
    out = str(tmp_path / "out")
    a = FileSink(out, sink_id="a")
    files_write(a, 0, 0, 5)
    b = FileSink(out, sink_id="b")
    with pytest.raises(SinkOwnershipError) as e:  # executor side: before any file is staged
        b.stage(TaskInfo(batch_id, 0), iter([ids(100, 105)]))
    assert "'a'" in str(e.value) and "'b'" in str(e.value) and out in str(e.value)
    with pytest.raises(SinkOwnershipError):  # driver side
        b.commit(batch_id, [])
    with pytest.raises(SinkOwnershipError):  # driver, before tasks
        b.check_schema(pa.schema([("id", pa.int64())]))
    assert not os.path.exists(os.path.join(out, "_eo_staging", str(batch_id)))
    assert_exact(read_ids(out), range(5))


def test_files_a_sink_without_id_does_not_pass_for_a_named_one(tmp_path):
    out = str(tmp_path / "out")
    files_write(FileSink(out, sink_id="a"), 0, 0, 5)
    with pytest.raises(SinkOwnershipError, match="belongs to sink_id 'a', not None"):
        FileSink(out).commit(0, [])


def test_files_new_checkpoint_is_refused_until_reset(tmp_path, capsys):
    out = str(tmp_path / "out")
    sink = FileSink(out, sink_id="f")
    for b in range(4):
        files_write(sink, b, b * 10, b * 10 + 10)
    # A true replay of the last batch writes nothing.
    files_write(sink, 3, 900, 910)
    assert_exact(read_ids(out), range(40))
    # A new checkpoint: batch 0 again, with new rows.
    with pytest.raises(BatchOrderError, match="batch 0 is below the sink's last committed "
                       "batch 3"):
        files_write(sink, 0, 40, 50)
    assert_exact(read_ids(out), range(40))
    assert cli.main(["sink", "reset", "--path", out, "--sink-id", "f"]) == 0
    assert "reset recorded" in capsys.readouterr().out
    for b in range(3):
        files_write(sink, b, 40 + b * 10, 50 + b * 10)
    files_write(sink, 2, 900, 910)  # replay after the reset: still nothing
    assert_exact(read_ids(out), range(70))
    assert sink.last_committed() == 6 and sink.batch_offset() == 4


# -- Kafka sink (its WAL; the executor's step 1 and the driver's commit) -------------------------
def kafka(sink_id: str, wal: str) -> KafkaSink:
    return KafkaSink(sink_id, wal, bootstrap_servers="127.0.0.1:1", topic="t")


def test_kafka_second_sink_on_a_wal_is_refused_on_executor_and_driver(tmp_path):
    wal = str(tmp_path / "wal")
    a = kafka("a", wal)
    a.check_schema(pa.schema([("value", pa.binary())]))
    a.commit(0, [TaskReport(writer=0, attempt=0, rows=3, produced=3)])
    b = kafka("b", wal)
    for batch_id in (0, 7):
        # The executor's step 1 runs before any producer or broker is touched.
        task = writer_for(b.options, recovery.sink_state(*storage_for(wal)), TaskInfo(batch_id, 0))
        with pytest.raises(SinkOwnershipError) as e:
            task.write(iter([pa.record_batch({"value": [b"x"]})]))
        assert "'a'" in str(e.value) and "'b'" in str(e.value) and wal in str(e.value)
        with pytest.raises(SinkOwnershipError):
            b.commit(batch_id, [])
        with pytest.raises(SinkOwnershipError):
            b.admit(batch_id)
    assert a.last_committed() == 0 and (a.commit_info(0) or {})["sink_id"] == "a"


def test_kafka_new_checkpoint_is_refused_until_reset(tmp_path, capsys):
    wal = str(tmp_path / "wal")
    sink = kafka("k", wal)
    sink.check_schema(pa.schema([("value", pa.binary())]))
    for b in range(3):
        sink.commit(b, [])
    assert sink.admit(2) is False  # the replay of the last batch: write nothing
    state = recovery.sink_state(*storage_for(wal))
    task = writer_for(sink.options, state, TaskInfo(2, 0))
    assert task.write(iter([pa.record_batch({"value": [b"x"]})])).already_committed
    with pytest.raises(BatchOrderError, match="batch 1 is below"):
        writer_for(sink.options, state, TaskInfo(1, 0)).write(iter([]))
    with pytest.raises(BatchOrderError, match="--wal-path"):
        sink.commit(0, [])
    assert cli.main(["sink", "reset", "--wal-path", wal, "--sink-id", "other"]) == 2
    assert "belongs to sink_id 'k'" in capsys.readouterr().err
    assert cli.main(["sink", "reset", "--wal-path", wal, "--sink-id", "k"]) == 0
    assert sink.batch_offset() == 3 and sink.admit(0 + 3) is True


# -- JDBC (eo_sink_commits) ---------------------------------------------------------------------
def test_jdbc_new_checkpoint_is_refused_until_reset(tmp_path, capsys):
    db = str(tmp_path / "t.db")
    schema = pa.schema([("id", pa.int64())])
    sink = JdbcSink(f"sqlite:///{db}", "t", "j", create_table=True)
    sink.check_schema(schema)
    for b in range(4):
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter([ids(b * 10, b * 10 + 10)]))])
    sink.commit(3, [sink.stage(TaskInfo(3, 0), iter([ids(900, 910)]))])  # replay: nothing

    def rows() -> list[int]:
        with sqlite3.connect(db) as c:
            return sorted(r[0] for r in c.execute("select id from t"))

    assert_exact(rows(), range(40))
    with pytest.raises(BatchOrderError) as e:
        sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([ids(40, 50)]))])
    assert "eo_sink_commits" in str(e.value) and "sink reset --url" in str(e.value)
    with pytest.raises(BatchOrderError):
        sink.admit(1)
    assert_exact(rows(), range(40))
    assert cli.main(["sink", "reset", "--url", f"sqlite:///{db}", "--sink-id", "nope"]) == 2
    assert "no row for sink 'nope'" in capsys.readouterr().err
    assert cli.main(["sink", "reset", "--url", f"sqlite:///{db}", "--sink-id", "j"]) == 0
    for b in range(3):
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter([ids(40 + b * 10, 50 + b * 10)]))])
    assert_exact(rows(), range(70))


def test_kafka_wal_without_owner_record_is_owned_by_its_newest_commit(tmp_path):
    wal = str(tmp_path / "wal")
    state = recovery.sink_state(*storage_for(wal))
    state.record_commit(0, "a", 1)  # a WAL written before owner records existed
    with pytest.raises(SinkOwnershipError, match="belongs to sink_id 'a', not 'b'"):
        kafka("b", wal).admit(0)
    assert kafka("a", wal).admit(0) is False


def test_source_warns_once_about_a_subscribed_topic_that_does_not_exist(caplog):
    from types import SimpleNamespace

    from connectors.kafka.clients import TopicInfo
    from connectors.kafka.source.clusters import Clusters
    from connectors.kafka.source.options import KafkaSourceOptions

    opts = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h:1",
                                            "subscribe": "here,gone"})
    found = {"here": TopicInfo(0, 1, {0: 1}), "gone": TopicInfo(3, 0, {})}
    clusters = Clusters(opts)
    # The process's cluster object, as its metadata answers (no broker here).
    clusters.kafka = lambda c: SimpleNamespace(  # type: ignore[method-assign]
        topics=lambda names, **kw: {n: found[n] for n in names})
    # The first contact (connection and ACL check) needs a broker: the secured tests' part.
    clusters._reached.add(opts.clusters[0].name)
    with caplog.at_level("WARNING"):
        assert list(clusters.partitions()) == [(opts.clusters[0].name, "here", 0)]
        clusters.partitions()
    assert caplog.text.count("topic 'gone' does not exist") == 1


def test_jdbc_task_of_a_lower_batch_fails_before_staging(tmp_path):
    db = str(tmp_path / "t.db")
    sink = JdbcSink(f"sqlite:///{db}", "t", "j", create_table=True)
    sink.check_schema(pa.schema([("id", pa.int64())]))
    for b in range(3):
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter([ids(b, b + 1)]))])
    with pytest.raises(BatchOrderError, match="batch 1 is below"):
        sink.stage(TaskInfo(1, 0), iter([ids(50, 60)]))
    with sqlite3.connect(db) as c:
        assert c.execute("select count(*) from eo_stage_j").fetchone()[0] == 0


def test_demo_progress_line_reads_every_sink_state(tmp_path):
    """The demo's 5 s line names all three sinks (issue 50: eo_jdbc was missing), each read
    from its own state, before anything is committed (no table, no log) and after."""
    from connectors.demo.runs import sink_progress

    db = f"sqlite:///{tmp_path / 'demo.db'}"
    cfg = {"files": str(tmp_path / "files"), "wal": str(tmp_path / "wal"),
           "checkpoint": str(tmp_path / "chk"), "db_url": db, "sink_id": "d"}
    assert sink_progress(cfg) == ("eo_jdbc last batch -, eo_kafka last batch -, "
                                  "eo_files 0 batches/0 rows, Spark committed batch -")
    jdbc = JdbcSink(db, "t", "d", create_table=True)
    jdbc.check_schema(pa.schema([("id", pa.int64())]))
    jdbc.commit(1, [jdbc.stage(TaskInfo(1, 0), iter([ids(0, 4)]))])
    sink = FileSink(cfg["files"])
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([ids(0, 4)]))])
    kafka("k", cfg["wal"] + "/kafka-sink").commit(2, [])
    os.makedirs(os.path.join(cfg["checkpoint"], "commits"))
    open(os.path.join(cfg["checkpoint"], "commits", "2"), "w").close()
    assert sink_progress(cfg) == ("eo_jdbc last batch 1, eo_kafka last batch 2, "
                                  "eo_files 1 batches/4 rows, Spark committed batch 2")
