"""The WebHDFS backend against a WebHDFS endpoint: ``WEBHDFS_URL`` (a real NameNode) when
set, otherwise the in-process **protocol double** of tests/webhdfs_double.py, which speaks
the documented REST operations (CREATE with its two-step redirect, OPEN, RENAME, DELETE,
MKDIRS, LISTSTATUS, GETFILESTATUS)."""

from __future__ import annotations

import pickle
import uuid
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.core.storage import WebHdfsStorage, storage_for
from connectors.core.wal import WriteAheadLog


@pytest.fixture
def hdfs(webhdfs_url):
    netloc = urlsplit(webhdfs_url).netloc
    storage, root = storage_for(f"webhdfs://{netloc}/eo-test-{uuid.uuid4().hex[:8]}")
    assert isinstance(storage, WebHdfsStorage)
    storage.mkdirs(root)
    yield storage, root
    storage.delete(root, recursive=True)


def test_atomic_write_read_list_hides_temp(hdfs):
    storage, root = hdfs
    path = storage.join(root, "a", "x.json")
    storage.write_atomic(path, b"hello")
    assert storage.read(path) == b"hello"
    storage.write_atomic(path, b"again")  # replace
    assert storage.read(path) == b"again"
    with storage.open_write(storage.join(root, "a", ".x.json.123.tmp")) as f:
        f.write(b"half")
    assert storage.list(storage.join(root, "a")) == ["x.json"]
    assert storage.size(path) == 5
    assert storage.list(storage.join(root, "missing")) == []


def test_rename_refuses_existing_target_and_missing_source(hdfs):
    storage, root = hdfs
    a, b = storage.join(root, "a"), storage.join(root, "sub", "b")
    storage.write_atomic(a, b"1")
    storage.rename(a, b)  # creates the parent like a local rename target dir would
    assert not storage.exists(a) and storage.read(b) == b"1"
    storage.write_atomic(a, b"2")
    with pytest.raises(FileExistsError):
        storage.rename(a, b)
    storage.rename(a, b, replace=True)
    assert storage.read(b) == b"2"
    with pytest.raises(FileNotFoundError):
        storage.rename(storage.join(root, "nope"), storage.join(root, "c"))


def test_streaming_parquet_write_and_delete(hdfs):
    storage, root = hdfs
    path = storage.join(root, "t.parquet")
    table = pa.table({"x": list(range(1000))})
    with storage.open_write(path) as f:
        pq.write_table(table, f)
    assert pq.read_table(pa.BufferReader(storage.read(path))).equals(table)
    assert storage.delete(path) is True
    assert storage.delete(path) is False
    assert storage.is_dir(root) and not storage.is_dir(path)


def test_wal_on_hdfs_and_backend_pickles(hdfs):
    storage, root = hdfs
    wal = WriteAheadLog(pickle.loads(pickle.dumps(storage)), root, "source")
    for i in range(5):
        wal.append(i, {"window": i})
    wal.commit(3)
    assert wal.last() == (4, {"window": 4})
    assert wal.last_committed() == 3
    assert wal.purge(before_seq=3, keep_last=1) == 3  # records 0, 1, 2
    assert wal.seqs() == [3, 4]


def test_double_speaks_the_two_step_create(webhdfs_url):
    import os

    if os.environ.get("WEBHDFS_URL"):
        pytest.skip("protocol check of the double only")
    from tests.webhdfs_double import WebHdfsDouble

    with WebHdfsDouble() as double:
        storage, root = storage_for(f"webhdfs://127.0.0.1:{double.port}/p")
        storage.write_atomic(storage.join(root, "f"), b"x")
        creates = [op for op in double.namespace.ops if " CREATE " in op]
        assert len(creates) == 2  # NameNode step (307) then DataNode step (201)
