"""eo_files commit protocol without Spark: stage, plan, rename, log; crashes at each step."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from connectors.core import failpoints
from connectors.core.errors import (
    FailpointError,
    FileSinkError,
    OptionError,
    SinkOwnershipError,
)
from connectors.core.sink import TaskInfo
from connectors.files.sink import FileSink, committed_batches
from tests.helpers import assert_exact

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("payload", pa.string())])


def rows(start: int, end: int) -> pa.RecordBatch:
    ids = list(range(start, end))
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([f"g{i % 3}" for i in ids]),
         pa.array([f"v{i}" for i in ids])],
        schema=SCHEMA,
    )


def stage_all(sink: FileSink, batch_id: int, splits: list[list[pa.RecordBatch]], attempt: int = 0):
    return [
        sink.stage(TaskInfo(batch_id, w, attempt), iter(batches))
        for w, batches in enumerate(splits)
    ]


def read_ids(path: str, partitioning: str | None = None) -> list[int]:
    if not os.path.isdir(path):
        return []
    table = ds.dataset(path, format="parquet", partitioning=partitioning).to_table()
    return table.column("id").to_pylist() if "id" in table.schema.names else []


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    def arm(spec: str) -> None:
        monkeypatch.setenv(failpoints.ENV, spec)
        failpoints.reload()

    yield arm
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.reload()


# -- options ---------------------------------------------------------------------------------
def test_options_parse_spark_spelling(tmp_path):
    sink = FileSink.from_options(
        {"path": str(tmp_path), "format": "jsonl", "compression": "gzip",
         "partitionby": "grp", "maxrecordsperfile": "10", "maxbytesperfile": "0",
         "sink_id": "s1", "sparkmetadata": "false"},
        SCHEMA,
    )
    assert sink.format.name == "jsonl" and sink.format.extension == ".jsonl.gz"
    assert sink.partition_by == ("grp",)
    assert sink.max_records_per_file == 10 and sink.max_bytes_per_file is None
    assert sink.sink_id == "s1" and sink.spark_metadata is False


def test_python_arguments_and_spark_options_give_the_same_spec(tmp_path):
    a = FileSink(str(tmp_path), format="csv", compression="gzip", partition_by=["grp"],
                 max_records_per_file=10, sink_id="s1", csv_header=False)
    b = FileSink.from_options({"path": str(tmp_path), "format": "csv", "compression": "gzip",
                               "partitionby": "grp", "maxrecordsperfile": "10",
                               "sinkid": "s1", "header": "false"})
    assert a.options == b.options
    with pytest.raises(OptionError, match="option 'max_records_per_file' is out of range "
                       r"\(-1\); it must be >= 0"):
        FileSink(str(tmp_path), max_records_per_file=-1)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"format": "orc"}, r"option 'format' has unsupported value 'orc'.*parquet"),
        ({"format": "csv", "compression": "snappy"}, r"'compression'.*csv.*gzip"),
        ({"path": "s3a://bucket/out", "sparkMetadata": "false"}, r"'sparkMetadata' cannot"),
        ({"path": "s3://b/out", "storage.endpiont": "x"}, r"did you mean 'storage.endpoint'"),
        ({"path": "gs://b/out", "storage.accessKeyId": "x"}, r"applies to Amazon S3 only"),
        ({"storage.region": "eu"}, r"'storage.region' applies to object store paths only"),
        ({"path": "oss://bucket/out"}, r"Alibaba OSS"),
        ({"path": "ftp://host/out"}, r"unsupported URL scheme 'ftp'"),
        ({"path": ""}, r"option 'path' is required"),
        ({"partitionBy": "nope"}, r"'partitionBy' names column 'nope'"),
        ({"maxRecordsPerFile": "-1"}, r"maxRecordsPerFile"),
    ],
)
def test_bad_options_fail_before_any_write(tmp_path, options, match):
    out = tmp_path / "out"
    opts = {"path": str(out), **options}
    with pytest.raises(OptionError, match=match):
        FileSink.from_options(opts, SCHEMA)
    assert not out.exists()


def test_path_that_is_a_file_fails_where_it_is_set(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    for make in (lambda: FileSink(str(f)), lambda: FileSink.from_options({"path": str(f)})):
        with pytest.raises(OptionError, match="option 'path' .* is an existing file; give a "
                                              "directory") as e:
            make()
        assert e.value.option == "path"
    sink = FileSink(str(f / "below"))
    with pytest.raises(OptionError, match="is a file, not a directory"):
        sink.check_schema(SCHEMA)


def test_csv_refuses_binary_columns(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("raw", pa.binary())])
    with pytest.raises(FileSinkError, match="column 'raw'.*CSV"):
        FileSink(str(tmp_path), format="csv").check_schema(schema)


# -- the protocol --------------------------------------------------------------------------
def test_commit_renames_to_deterministic_names_and_logs_last(tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    msgs = stage_all(sink, 7, [[rows(0, 50)], [rows(50, 80), rows(80, 100)]])
    assert os.listdir(os.path.join(out, "_eo_staging", "7"))
    assert read_ids(out) == []  # staged files are invisible to readers
    sink.commit(7, msgs)
    names = sorted(n for n in os.listdir(out) if not n.startswith("_"))
    assert names == ["part-000000000007-00000-000.snappy.parquet",
                     "part-000000000007-00001-000.snappy.parquet"]
    assert_exact(read_ids(out), range(100))
    assert sink.last_committed() == 7 and sink.is_committed(7) and sink.is_committed(3)
    assert not os.listdir(os.path.join(out, "_eo_staging"))
    assert committed_batches(out)[0]["rows"] == 100


def test_replay_of_a_batch_gives_the_same_files_not_duplicates(tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    sink.commit(0, stage_all(sink, 0, [[rows(0, 40)], [rows(40, 60)]]))
    before = sorted(sink.committed_files())
    # A replay (Spark re-runs the batch after a crash before its own commit log).
    sink.commit(0, stage_all(sink, 0, [[rows(0, 40)], [rows(40, 60)]], attempt=1))
    assert sorted(sink.committed_files()) == before
    assert_exact(read_ids(out), range(60))
    assert not os.listdir(os.path.join(out, "_eo_staging"))


@pytest.mark.parametrize(
    "point", ["files.after_stage", "files.after_plan", "files.mid_rename",
              "files.after_rename", "files.before_log", "files.after_log"],
)
def test_crash_at_each_step_then_replay_is_exact(tmp_path, armed, point):
    """A crash at each step, then a replay whose new attempt splits rows differently."""
    out = str(tmp_path / "out")
    sink = FileSink(out, max_records_per_file=7)
    sink.commit(0, stage_all(sink, 0, [[rows(0, 30)]]))
    armed(f"{point}@1!raise")
    first = stage_all(sink, 1, [[rows(30, 60)], [rows(60, 100)]])
    with pytest.raises(FailpointError):
        sink.commit(1, first)
    sink.abort(1, first)  # Spark calls abort when commit raised
    armed("")
    visible = read_ids(out)
    assert len(visible) == len(set(visible))  # whatever is visible is never doubled
    # The replay re-stages with a different split across writers and files.
    second = stage_all(sink, 1, [[rows(30, 45)], [rows(45, 70)], [rows(70, 100)]], attempt=1)
    sink.commit(1, second)
    assert_exact(read_ids(out), range(100))
    for f in sink.committed_files():
        pq.read_table(f)  # every listed file opens and parses
    assert sink.last_committed() == 1
    assert not os.listdir(os.path.join(out, "_eo_staging"))


def test_mid_rename_replay_finishes_the_original_plan(tmp_path, armed):
    out = str(tmp_path / "out")
    sink = FileSink(out, max_records_per_file=10)
    first = stage_all(sink, 0, [[rows(0, 35)]])
    armed("files.mid_rename@0#2!raise")
    with pytest.raises(FailpointError):
        sink.commit(0, first)
    sink.abort(0, first)
    armed("")
    assert len(read_ids(out)) == 20  # two files of 10 renamed before the crash
    planned = {f.name for f in first[0].files}
    left = set(os.listdir(os.path.join(out, "_eo_staging", "0")))
    assert left == planned - {f.name for f in first[0].files[:2]}  # abort kept what the plan needs
    # New attempt: different row grouping (one big file); it must be ignored.
    second = stage_all(sink, 0, [[rows(0, 35)]], attempt=1)
    sink.max_records_per_file = None
    sink.commit(0, second)
    assert_exact(read_ids(out), range(35))
    assert len(sink.committed_files()) == 4  # the original plan's 10+10+10+5


def test_rename_where_both_source_and_target_exist_counts_as_done(tmp_path, armed):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    msgs = stage_all(sink, 0, [[rows(0, 10)]])
    armed("files.after_plan@0!raise")
    with pytest.raises(FailpointError):
        sink.commit(0, msgs)
    armed("")
    # Simulate a crash between link() and unlink() of the no-replace rename.
    staged = os.path.join(out, "_eo_staging", "0", msgs[0].files[0].name)
    os.link(staged, os.path.join(out, "part-000000000000-00000-000.snappy.parquet"))
    sink.commit(0, msgs)
    assert_exact(read_ids(out), range(10))


def test_missing_staged_file_is_an_error_not_data_loss(tmp_path, armed):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    msgs = stage_all(sink, 0, [[rows(0, 10)]])
    armed("files.after_plan@0!raise")
    with pytest.raises(FailpointError):
        sink.commit(0, msgs)
    armed("")
    os.unlink(os.path.join(out, "_eo_staging", "0", msgs[0].files[0].name))
    with pytest.raises(FileSinkError, match="both missing"):
        sink.commit(0, msgs)


def test_abort_without_plan_removes_staging(tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    msgs = stage_all(sink, 4, [[rows(0, 10)]])
    sink.abort(4, msgs)
    assert not os.path.exists(os.path.join(out, "_eo_staging", "4"))
    assert sink.last_committed() is None


def test_empty_batch_commits_without_files(tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    sink.commit(0, stage_all(sink, 0, [[], [rows(0, 0)]]))
    assert sink.last_committed() == 0 and sink.committed_files() == []


def test_sink_id_guards_the_path(tmp_path):
    out = str(tmp_path / "out")
    a = FileSink(out, sink_id="a")
    a.commit(0, stage_all(a, 0, [[rows(0, 5)]]))
    b = FileSink(out, sink_id="b")
    with pytest.raises(SinkOwnershipError, match="belongs to sink_id 'a', not 'b'"):
        b.commit(1, stage_all(b, 1, [[rows(5, 10)]]))


def test_orphans_of_older_batches_are_removed(tmp_path):
    out = str(tmp_path / "out")
    sink = FileSink(out)
    stage_all(sink, 2, [[rows(0, 5)]])  # a batch whose driver died before commit/abort
    sink.commit(3, stage_all(sink, 3, [[rows(5, 10)]]))
    assert not os.listdir(os.path.join(out, "_eo_staging"))
    assert_exact(read_ids(out), range(5, 10))


def test_what_a_process_caches_stays_bounded_over_many_batches(tmp_path):
    """A query runs for months in the same Python workers: the per-process caches of the
    commit (the Spark log's batches, the winners of each batch, the newest commit's sink id)
    keep the last few batches, not every batch (bench/endurance.py measures the same over
    thousands of batches in Spark)."""
    from connectors.core import sink_state
    from connectors.files import placement, spark_metadata

    out = str(tmp_path / "out")
    sink = FileSink(out)

    def held() -> tuple[int, int, int]:
        return (sum(1 for k in spark_metadata._READ if k[1].startswith(out)),
                sum(1 for k in placement._WINNERS if k[1] == out),
                sum(1 for k in [*sink_state._FACTS, *sink_state._NEWEST]
                    if any(isinstance(p, str) and p.startswith(out) for p in k)))

    for b in range(120):
        sink.commit(b, stage_all(sink, b, [[rows(b, b + 1)]]))
        sink.last_committed()
        sink.admit(b + 1)
    meta, winners, facts = held()
    assert meta <= spark_metadata.COMPACT_INTERVAL + 1, meta
    assert winners <= 10, winners
    assert facts <= 1, facts
    assert_exact(read_ids(out), range(120))
