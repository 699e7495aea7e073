"""A full local disk under the WAL and the file sink (issue 43, part 2), on a real tmpfs the
test mounts (root: ``mount -t tmpfs -o size=16m``, unmounted at the end), filled to the last
byte by ``tests/nemesis.py``'s :class:`DiskNemesis`.

1. The error says what happened: a full disk (``ENOSPC``) and a read-only one (``EROFS``) are
   named, with the path and the free space, by every write and by the capability probe,
   never as "cannot create a file atomically"; the probe's verdict is not cached, so the
   next check, with space again, passes.
2. Nothing half-written is ever read back: a WAL record and a data file whose writes run out
   of space half-way leave no visible name; with space freed inside the retry budget the
   same calls finish, and read back whole (pyarrow for the data).
3. A streaming query (``eo_kafka`` with its ``walPath`` and ``eo_files`` with its ``path``
   both on the tmpfs; the checkpoint elsewhere) rides through a full disk shorter than its
   retry budget without terminating; a full disk longer than the budget ends it with the
   error above, and the query restarted from its checkpoint once space is freed is exact:
   pyarrow reads every input row once, and the WAL reads back whole.

Every test needs root (to mount the tmpfs): without it they skip, or fail under ``CI=true``.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from connectors.core.errors import StorageError
from connectors.core.sink import TaskInfo
from connectors.core.storage import (
    check_create_if_absent,
    forget_probes,
    storage_for,
    storage_options_from,
)
from connectors.core.wal import WriteAheadLog, encode
from connectors.files.sink import FileSink
from tests.helpers import assert_exact, unavailable, wait_for
from tests.nemesis import DiskNemesis
from tests.storage_faults import (
    FaultQuery,
    assert_output_exact,
    assert_wal_reaches_the_end,
    rows,
    topic_records,
)

pytestmark = pytest.mark.xdist_group("storage-faults-disk")

SIZE_MB = 16


@pytest.fixture
def disk(tmp_path: Any) -> Iterator[DiskNemesis]:
    """A 16 MiB tmpfs of this test's own, unmounted at the end whatever happened."""
    if os.geteuid() != 0:
        unavailable("root (to mount a tmpfs)", f"running as uid {os.geteuid()}")
    nemesis = DiskNemesis(str(tmp_path / "vol"), SIZE_MB)
    try:
        nemesis.__enter__()
    except Exception as e:  # noqa: BLE001 - a container without CAP_SYS_ADMIN, no mount(8)
        unavailable("a tmpfs of the test's own", f"mount -t tmpfs failed: {e}")
    try:
        yield nemesis
    finally:
        nemesis.__exit__()


def _local(path: str, **options: str) -> Any:
    return storage_for(path, options=storage_options_from(options, "tests"), family="tests")


def _freed_after(disk: DiskNemesis, seconds: float) -> threading.Thread:
    """Free the disk ``seconds`` from now, on a thread (the fault's length)."""
    def free() -> None:
        deadline = time.monotonic() + seconds
        wait_for(lambda: time.monotonic() >= deadline, seconds + 5, 0.05, "the fault's end")
        disk.free()

    thread = threading.Thread(target=free, daemon=True)
    thread.start()
    return thread


# -- 1. the error says so ----------------------------------------------------------------------
def test_a_full_or_read_only_disk_is_named_never_taken_for_missing_hard_links(
        disk: DiskNemesis) -> None:
    storage, root = _local(disk.directory + "/wal", retryTimeout="500ms")
    wal = WriteAheadLog(storage, root, "source")
    wal.append(0, {"window": 0})
    disk.fill()
    began = time.monotonic()
    with pytest.raises(StorageError) as raised:
        wal.append(1, {"window": 1})
    message = str(raised.value)
    assert 0.5 <= time.monotonic() - began < 10
    assert "the disk is full (ENOSPC" in message, message
    assert f"file://{root}/source/" in message
    # what was free when the error was made (the writer's own temp file had just gone)
    assert re.search(rf"\d+(\.\d)? (bytes|KiB) free of {SIZE_MB}\.0 MiB on the filesystem "
                     rf"mounted at {re.escape(disk.directory)}", message), message
    assert "storage.retryTimeout=0.5s" in message and "free space" in message
    assert "atomically" not in message and "another filesystem" not in message

    # The capability probe says the same, and does not remember it: a full disk passes.
    forget_probes()
    with pytest.raises(StorageError, match="the disk is full") as probed:
        check_create_if_absent(storage, root)
    assert "atomically" not in str(probed.value)
    disk.free()
    check_create_if_absent(storage, root)
    forget_probes()

    # Read-only: named, and not retried (it does not pass by itself), with the default
    # budget (120 s).
    storage, root = _local(disk.directory + "/wal")
    disk.read_only()
    try:
        began = time.monotonic()
        with pytest.raises(StorageError) as raised:
            WriteAheadLog(storage, root, "source").append(1, {"window": 1})
        assert time.monotonic() - began < 5
        message = str(raised.value)
        assert "the filesystem is read-only (EROFS" in message and "not retried" in message
        assert "remount it read-write" in message and "atomically" not in message
        with pytest.raises(StorageError, match="read-only"):
            check_create_if_absent(storage, root)
    finally:
        disk.read_only(False)
        forget_probes()
    assert WriteAheadLog(storage, root, "source").seqs() == [0]


# -- 2. nothing half-written is read back ------------------------------------------------------
def test_a_wal_record_cut_short_by_a_full_disk_is_never_visible(disk: DiskNemesis) -> None:
    storage, root = _local(disk.directory + "/wal", retryTimeout="500ms")
    wal = WriteAheadLog(storage, root, "source")
    wal.append(0, {"window": 0})
    big = {"window": 1, "pad": "x" * 200_000}  # 200 kB: more than the space left
    disk.fill(leave=64 * 1024)
    with pytest.raises(StorageError, match="the disk is full"):
        wal.append(1, big)
    # No record 1, no temp file left: the directory holds record 0 only.
    assert os.listdir(wal.dir) == ["00000000000000000000.json"]
    assert wal.seqs() == [0] and wal.get(1) is None and wal.last() == (0, {"window": 0})

    # The same write, with the space back within its budget (the default, 120 s): it waits,
    # then writes the record whole.
    storage, root = _local(disk.directory + "/wal")
    wal = WriteAheadLog(storage, root, "source")
    disk.free()
    disk.fill()
    freeing = _freed_after(disk, 2.0)
    began = time.monotonic()
    assert wal.append(1, big) is True
    assert time.monotonic() - began >= 1.5
    freeing.join()
    assert wal.get(1) == big
    assert open(os.path.join(wal.dir, "00000000000000000001.json"), "rb").read() == encode(big)


def _payload(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()  # incompressible: a real file's size


def test_a_data_file_cut_short_by_a_full_disk_rides_through_or_is_never_visible(
        disk: DiskNemesis) -> None:
    """A task's parquet file (about 2 MB) meets a disk with 256 KiB left: with the space
    back after 2 s it waits in place and finishes the file; past a 1 s budget the task
    fails naming the disk, and its partial file is gone."""
    out = disk.directory + "/out"
    sink = FileSink(out, sink_id="full-disk")
    sink.check_schema(rows(0, 1, _payload).schema)

    def batches(start: int) -> Iterator[pa.RecordBatch]:
        return iter([rows(start + i * 5000, 5000, _payload) for i in range(6)])

    disk.fill(leave=256 * 1024)
    freeing = _freed_after(disk, 2.0)
    began = time.monotonic()
    staged = sink.stage(TaskInfo(0, 0), batches(0))
    assert time.monotonic() - began >= 1.5, "the write never met the full disk"
    freeing.join()
    sink.commit(0, [staged])

    short = FileSink(out, sink_id="full-disk", storage_options={"retryTimeout": "1s"})
    disk.fill(leave=256 * 1024)
    with pytest.raises(StorageError, match="the disk is full") as raised:
        short.stage(TaskInfo(1, 0), batches(30_000))
    assert f"free of {SIZE_MB}.0 MiB" in str(raised.value)
    disk.free()
    assert os.listdir(os.path.join(out, "_eo_staging", "1")) == []

    table = ds.dataset(out, format="parquet").to_table()
    assert_exact(zip(table.column("id").to_pylist(), table.column("payload").to_pylist(),
                     strict=True), [(i, _payload(i)) for i in range(30_000)],
                 what="committed rows")


# -- 3. a streaming query ----------------------------------------------------------------------
@pytest.fixture
def topic(filled_topic: Any) -> str:
    name: str = filled_topic(topic_records(), partitions=2)
    return name


def test_a_streaming_query_rides_through_a_full_disk_and_a_longer_one_ends_it_clearly(
        spark: Any, kafka_bootstrap: str, topic: str, disk: DiskNemesis,
        tmp_path: Any) -> None:
    """Budget 8 s (``storage.retryTimeout``, source and sink): the disk full for 3 s is
    ridden through (no commit while it is full, the query up all along); full until the
    query ends, it ends with the disk's error; freed and restarted, the query is exact."""
    q = FaultQuery(spark, kafka_bootstrap, topic, disk.directory, str(tmp_path / "chk"),
                   "disk-faults", {"retryTimeout": "8s"}).start()
    try:
        q.progresses(2)
        disk.fill()
        stalled = q.committed()
        began = time.monotonic()
        wait_for(lambda: q.assert_up() or time.monotonic() - began >= 3.0, 10, 0.1,
                 "3 s of a full disk")
        assert q.committed() <= stalled + 1  # at most the commit that was in flight
        disk.free()
        q.progresses(2)

        disk.fill()  # and it stays full: past the budget
        wait_for(lambda: not q.query.isActive, 120, what="the query to end")
        error = str(q.query.exception())
        assert "the disk is full (ENOSPC" in error, error[-3000:]
        assert disk.directory in error and f"free of {SIZE_MB}.0 MiB" in error
        assert "storage.retryTimeout=8s" in error and "atomically" not in error
    finally:
        disk.free()
        q.stop()

    q.start()  # the same checkpoint, the space back
    try:
        q.query.processAllAvailable()
        q.assert_up()
    finally:
        q.query.stop()
    assert_output_exact(ds.dataset(q.out, format="parquet").to_table())
    # The source's WAL reads back whole: every window record and commit marker parses,
    # the windows follow each other, and the last one ends at the topic's end.
    wal = WriteAheadLog(*_local(q.wal), "source")
    records = assert_wal_reaches_the_end(wal)
    seqs, committed = wal.listing()
    assert set(committed) <= set(seqs)
    assert all(wal.commit_info(seq) is not None for seq in committed)
    for before, after in zip(records, records[1:], strict=False):
        assert before["end"] == after["start"], (before, after)  # type: ignore[index]
    assert not [n for n in os.listdir(wal.dir) if n.startswith(".")], "a temp file stayed"
