"""Recovery: a Kafka -> eo_files pipeline killed at each failpoint, restarted from its
checkpoint; the committed output must hold each input record exactly once.

One pipeline per configuration, killed at each failpoint in turn (a SIGKILL of the whole
process group: driver, JVM and Python workers), then a last run without failpoints. After
every run, every file a reader can list must open and parse, and nothing may be doubled.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import uuid
from collections.abc import Callable

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from connectors import cli
from connectors.files.sink import FileSink, committed_files
from tests.helpers import assert_exact, run_pipeline

PIPELINE = os.path.join(os.path.dirname(__file__), "pipelines", "files_pipeline.py")
READ_S3A = os.path.join(os.path.dirname(__file__), "pipelines", "spark_read_s3a.py")
TOTAL = 600
PER_BATCH = 100  # 6 micro-batches


def expected_rows() -> list[tuple[int, int, str]]:
    return [(i, i % 3, f"value-{i}") for i in range(TOTAL)]


def committed_rows(sink: FileSink) -> list[tuple[int, int, str]]:
    """Read through pyarrow.dataset, after opening every listed file on its own."""
    if not sink.storage.atomic_rename:
        return s3_rows(sink)
    files = sink.committed_files()
    for f in files:
        if sink.storage.scheme == "file":
            pq.read_table(f)  # a partial file would fail here
        else:
            import io

            pq.read_table(io.BytesIO(sink.storage.read(f)))
    if not files:
        return []
    if sink.storage.scheme == "file":
        table = ds.dataset(sink.path, format="parquet", partitioning="hive").to_table()
    else:
        import pyarrow as pa

        tables = []
        for f in files:
            t = pq.read_table(pa.BufferReader(sink.storage.read(f)))
            grp = int(f.rsplit("/grp=", 1)[1].split("/", 1)[0])
            tables.append(t.append_column("grp", pa.array([grp] * t.num_rows, pa.int32())))
        table = pa.concat_tables(tables)
    cols = [table.column(c).to_pylist() for c in ("id", "grp", "payload")]
    return [(int(i), int(g), p) for i, g, p in zip(*cols, strict=True)]


def s3_rows(sink: FileSink) -> list[tuple[int, int, str]]:
    """What the documented pyarrow recipe reads on S3: the files ``committed_files`` names
    (Spark's ``_spark_metadata``), through pyarrow's own S3 filesystem, hive partitions."""
    import pyarrow.fs as pafs

    opts = sink.options.storage_options
    files = committed_files(sink.options.url, storage_options={
        k: (v.get() if hasattr(v, "get") else v) for k, v in opts.values})
    if not files:
        return []
    endpoint = opts.get("endpoint")
    fs = pafs.S3FileSystem(
        access_key=opts.get("accessKeyId"), secret_key=opts.get("secretAccessKey").get(),
        endpoint_override=endpoint, scheme=endpoint.split("://")[0], region="us-east-1")
    keys = [f.split("://", 1)[1] for f in files]
    base = sink.options.url.split("://", 1)[1]
    table = ds.dataset(keys, filesystem=fs, format="parquet",
                       partitioning=ds.partitioning(flavor="hive"),
                       partition_base_dir=base).to_table()
    cols = [table.column(c).to_pylist() for c in ("id", "grp", "payload")]
    return [(int(i), int(g), p) for i, g, p in zip(*cols, strict=True)]


def spark_read_s3a(s3_service, out: str) -> list[tuple[int, int, str]]:
    """Spark's own parquet reader over s3a:// (hadoop-aws), in its own process."""
    conf = [a for k, v in s3_service.spark_conf().items() for a in ("--conf", f"{k}={v}")]
    result = run_pipeline([READ_S3A, "--path", out, *conf], timeout=240)
    assert result.returncode == 0, result.output[-3000:]
    line = next(x for x in result.output.splitlines() if x.startswith("ROWS "))
    return [(int(i), int(g), p) for i, g, p in json.loads(line[5:])]


def crash_and_recover(argv: list[str], sink: FileSink, failpoints: list[str],
                      env: dict[str, str] | None = None,
                      after_kill: Callable[[str], None] | None = None) -> None:
    expected = expected_rows()
    for point in failpoints:
        result = run_pipeline(argv, failpoint=point, timeout=240, env=env)
        assert result.killed, f"failpoint {point} never fired:\n{result.output[-3000:]}"
        seen = committed_rows(sink)
        assert len(seen) == len(set(seen)), f"duplicates visible after a crash at {point}"
        assert set(seen) <= set(expected)
        if after_kill is not None:
            after_kill(point)
    result = run_pipeline(argv, timeout=240, env=env)
    assert result.returncode == 0 and "PIPELINE DONE" in result.output, result.output[-3000:]
    assert_exact(committed_rows(sink), expected, what="committed output")


@pytest.fixture
def kafka_topic(filled_topic):
    return filled_topic([(str(i).encode(), f"value-{i}".encode(), i % 2) for i in range(TOTAL)],
                        partitions=2)


def test_kafka_to_files_survives_a_kill_at_each_failpoint(kafka_bootstrap, kafka_topic, tmp_path):
    out = str(tmp_path / "out")
    argv = [
        PIPELINE, "--out", out, "--checkpoint", str(tmp_path / "chk"),
        "--source", "kafka", "--bootstrap", kafka_bootstrap, "--topic", kafka_topic,
        "--per-batch", str(PER_BATCH // 2),  # maxOffsetsPerTrigger counts across partitions
        "--partition-by", "grp", "--max-records", "7",
    ]
    sink = FileSink(out)
    crash_and_recover(argv, sink, [
        "files.after_stage@1",
        "files.mid_rename@2",  # the replay finishes the plan of the first attempt
        "files.before_log@3",
        # between the sink's commit and Spark's commit log: the restart replays batch 4,
        # which must write nothing (the last committed batch again is a replay)
        "files.after_log@4",
    ])
    assert sink.last_committed() is not None


def test_hdfs_url_form_survives_kills_and_spark_reads_only_committed_files(
        spark, hdfs_url, webhdfs_url, kafka_bootstrap, kafka_topic, tmp_path):
    """The ``hdfs://namenode:rpcport/path`` form users copy from their cluster, with
    ``webhdfsUrl`` naming the NameNode's HTTP address (the session's real NameNode and
    DataNode). Killed with staged files on HDFS (possibly one still being written by the
    other task), after the rename plan, and between two RENAMEs of one batch: the steps
    whose restart reads what HDFS holds in a state only a rename store has (the commit
    record's kills read the same log as on a local disk: the first test's). Then Spark's
    own Hadoop client reads the output over RPC, through ``_spark_metadata``, and must see
    every input record once. (The ``webhdfs://`` form is the same client;
    tests/integration/test_storage_webhdfs.py runs it.)"""
    out = f"{hdfs_url}/eo-files-{uuid.uuid4().hex[:8]}/out"
    argv = [
        PIPELINE, "--out", out, "--webhdfs-url", webhdfs_url,
        "--checkpoint", str(tmp_path / "chk"),
        "--source", "kafka", "--bootstrap", kafka_bootstrap, "--topic", kafka_topic,
        "--per-batch", str(PER_BATCH), "--partition-by", "grp", "--max-records", "40",
    ]
    sink = FileSink(out, webhdfs_url=webhdfs_url)
    crash_and_recover(argv, sink, [
        "files.task_staged@0",
        "files.after_plan@1",
        "files.mid_rename@2#2",  # the replay finishes the plan of the first attempt
    ])
    assert all(f.startswith(f"{hdfs_url}/") for f in map(sink.storage.url, sink.committed_files()))
    got = spark.read.parquet(out).select("id", "grp", "payload").collect()
    assert_exact([(r.id, r.grp, r.payload) for r in got], expected_rows(),
                 what="Spark's own read of the HDFS output")
    # the replays removed what the killed attempts staged, half-written files included
    assert sink.storage.list(sink.storage.join(sink.path, "_eo_staging")) == []


def test_s3_output_survives_a_kill_at_each_failpoint_and_readers_see_committed_rows(
        s3_service, s3_bucket, kafka_bootstrap, kafka_topic, tmp_path):
    """Output and log on S3 (the session's real S3 server), written in place: tasks write
    final names, the commit creates ``_spark_metadata/B`` and ``_eo_log/B.commit``. Killed
    where an object store differs (there is no rename, so no ``files.mid_rename``): after a
    task's files are written and before the driver's commit, and before the commit record
    (the plan, the empty publish step and the replay after the record run on the local
    store). After each kill pyarrow, reading the committed files as docs/file-sink.md
    shows, sees no duplicate, and after the second Spark's own s3a reader sees exactly the
    committed rows while the bucket holds the killed attempt's files; the last run
    completes the output exactly. A reader that lists the bucket instead would have seen
    the killed attempts' files until the replay's cleanup deleted them, which the end
    state checks."""
    out = f"s3a://{s3_bucket}/out"  # s3a: what Spark's own reader (hadoop-aws) opens
    storage_args = [a for k, v in s3_service.python_options().items()
                    for a in ("--storage", f"{k}={v}")]
    argv = [
        PIPELINE, "--out", out, "--checkpoint", str(tmp_path / "chk"),
        "--source", "kafka", "--bootstrap", kafka_bootstrap, "--topic", kafka_topic,
        "--per-batch", str(PER_BATCH // 2), "--partition-by", "grp", "--max-records", "7",
        *storage_args,
    ]
    sink = FileSink(out, storage_options=s3_service.python_options())
    cli_storage = [a for k, v in s3_service.python_options().items()
                   for a in ("--storage", f"{k}={v}")]

    def status(point: str) -> None:
        """``files status`` shows what a kill before the commit left: data files in no
        committed batch, and the attempt records naming them."""
        out_text = io.StringIO()
        with contextlib.redirect_stdout(out_text):
            assert cli.main(["files", "status", out, "--json", *cli_storage]) == 0
        doc = json.loads(out_text.getvalue())
        if point in ("files.task_staged@0", "files.after_stage@1"):
            assert doc["uncommitted"] and doc["staging"], doc
        assert set(doc["uncommitted"]).isdisjoint(committed_files(
            out, storage_options=s3_service.python_options()))
        if point == "files.after_stage@1":
            # Spark's own reader, through _spark_metadata, while the bucket holds the
            # killed attempt's files: exactly the committed rows (batch 0's).
            spark_rows = spark_read_s3a(s3_service, out)
            assert_exact(spark_rows, committed_rows(sink), "Spark's s3a read mid-crash")

    # Every failpoint runs on the local store (the first test); here the ones whose restart
    # reads what an object store holds differently: files in place with the batch not
    # committed (no after_plan, and no after_rename: publishing in place does nothing there),
    # and the commit record not yet created. (A replay of a committed batch, after_log, reads
    # the same log through the same store calls as any restart: local store only.)
    crash_and_recover(argv, sink, [
        "files.task_staged@0",  # one task's files are in place, the batch is not committed
        "files.after_stage@1",  # every task's files are in place, the driver has not begun
        "files.before_log@4",
    ], after_kill=status)
    storage = sink.storage
    committed = set(committed_files(out, storage_options=s3_service.python_options()))
    listed = {storage.url(f) for f in storage.walk_files(sink.path) if "/_" not in f}
    assert listed == committed, f"left behind: {sorted(listed - committed)[:5]}"
    # what stays in _eo_staging are the winners' attempt records since the last sweep
    for record in sink.placement.pending():
        names = json.loads(storage.read(record))["files"]
        assert {storage.url(storage.join(sink.path, n)) for n in names} <= committed
