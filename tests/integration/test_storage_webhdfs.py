"""The WebHDFS storage backend and the WAL on a real HDFS: the session's NameNode and DataNode
(``WEBHDFS_URL``, or the daemons tests/services/hdfs.py starts from the Hadoop jars).

Every write goes the way it goes on a cluster: CREATE at the NameNode, 307 to the DataNode,
bytes to the DataNode, RENAME at the NameNode.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import uuid
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests

from connectors.core.errors import StorageError
from connectors.core.storage import LocalStorage, Storage, WebHdfsStorage, storage_for
from connectors.core.wal import WriteAheadLog
from tests.helpers import REPO, run_pipeline
from tests.integration.pipelines.wal_appender import record

WAL_APPENDER = os.path.join(os.path.dirname(__file__), "pipelines", "wal_appender.py")


@pytest.fixture
def hdfs(webhdfs_url):
    netloc = urlsplit(webhdfs_url).netloc
    storage, root = storage_for(f"webhdfs://{netloc}/eo-test-{uuid.uuid4().hex[:8]}")
    assert isinstance(storage, WebHdfsStorage)
    storage.mkdirs(root)
    yield storage, root
    storage.delete(root, recursive=True)


@pytest.fixture(params=["local", "hdfs"])
def any_storage(request, tmp_path):
    """The same contract on both backends."""
    if request.param == "local":
        root = str(tmp_path / "root")
        os.makedirs(root)
        return LocalStorage(), root
    return request.getfixturevalue("hdfs")


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
    storage.mkdirs(storage.join(root, "dir"))
    storage.write_atomic(a, b"3")
    with pytest.raises(FileExistsError):  # HDFS would move it *into* the directory
        storage.rename(a, storage.join(root, "dir"), replace=True)
    assert storage.list(storage.join(root, "dir")) == []


def test_streaming_parquet_write_and_delete(hdfs):
    storage, root = hdfs
    path = storage.join(root, "t.parquet")
    table = pa.table({"x": list(range(200_000)), "s": [f"row-{i}" for i in range(200_000)]})
    with storage.open_write(path) as f:  # a chunked PUT to the DataNode, several MB
        pq.write_table(table, f, row_group_size=50_000)
    assert pq.read_table(pa.BufferReader(storage.read(path))).equals(table)
    assert storage.delete(path) is True
    assert storage.delete(path) is False
    assert storage.is_dir(root) and not storage.is_dir(path)


def test_missing_and_existing_files_raise_what_local_disks_raise(any_storage):
    """Callers catch FileNotFoundError / FileExistsError, not a backend's own errors."""
    storage, root = any_storage
    missing = storage.join(root, "nope.json")
    with pytest.raises(FileNotFoundError):
        storage.read(missing)
    path = storage.join(root, "f.bin")
    with storage.open_write(path) as f:
        f.write(b"abc")
    with pytest.raises(FileExistsError), storage.open_write(path):
        pass
    assert storage.read(path) == b"abc"
    wal = WriteAheadLog(storage, root, "sink")
    wal.append(0, {"x": 0})
    wal.commit(0, {"rows": 1})
    assert wal.commit_info(0) == {"rows": 1}
    assert wal.commit_info(1) is None and wal.get(1) is None


def test_errors_name_the_operation_and_the_url(hdfs):
    storage, root = hdfs
    storage.write_atomic(storage.join(root, "d", "f"), b"z")
    with pytest.raises(StorageError, match=r"HDFS delete failed for webhdfs://.*/d: .*empty"):
        storage.delete(storage.join(root, "d"))
    with pytest.raises(StorageError, match=r"HDFS mkdirs failed for .*/d/f/sub"):
        storage.mkdirs(storage.join(root, "d", "f", "sub"))


@pytest.mark.parametrize("name", ["grp=a b", "grp=50%", "grp=g%3A0", "grp=ü", "grp=a+b",
                                  "grp=a#b", "grp=a?b", "grp=a;b&c"])
def test_names_that_need_quoting_round_trip(hdfs, name):
    """Partition directories carry user values; WebHDFS URLs must quote them both ways."""
    storage, root = hdfs
    path = storage.join(root, name, "part-0.json")
    storage.write_atomic(path, b"ok")
    assert storage.list(root) == [name]
    assert storage.list(storage.join(root, name)) == ["part-0.json"]
    assert storage.read(path) == b"ok"


def test_hdfs_url_form_and_webhdfs_form_are_one_namespace(hdfs_url, webhdfs_url):
    base = f"/eo-test-{uuid.uuid4().hex[:8]}"
    via_rpc_name, path = storage_for(f"{hdfs_url}{base}/x", webhdfs_url=webhdfs_url)
    via_http, same = storage_for(f"webhdfs://{urlsplit(webhdfs_url).netloc}{base}/x")
    assert path == same and via_rpc_name == via_http  # one backend value, one cache key
    assert via_rpc_name.url(path) == f"{hdfs_url}{base}/x"  # what users and logs see
    try:
        via_rpc_name.write_atomic(path, b"1")
        assert via_http.read(same) == b"1"
    finally:
        via_http.delete(base, recursive=True)


def test_local_hdfs_redirects_writes_to_its_datanode_on_loopback(hdfs_service):
    """The launcher's contract with WebHDFS clients: the NameNode stores nothing on CREATE,
    it redirects to a DataNode address this host can reach."""
    if hdfs_service.local is None:
        pytest.skip("checks the daemons this session started")
    fs = hdfs_service.local
    path = f"/eo-test-{uuid.uuid4().hex[:8]}"
    step1 = requests.put(f"{fs.webhdfs_url}/webhdfs/v1{path}?op=CREATE",
                         allow_redirects=False, timeout=10)
    assert step1.status_code == 307
    location = urlsplit(step1.headers["Location"])
    assert (location.hostname, location.port) == ("127.0.0.1", fs.dn_http_port)
    assert requests.get(f"{fs.webhdfs_url}/webhdfs/v1{path}?op=GETFILESTATUS",
                        timeout=10).status_code == 404
    step2 = requests.put(step1.headers["Location"], data=b"x", timeout=10)
    assert step2.status_code == 201
    requests.delete(f"{fs.webhdfs_url}/webhdfs/v1{path}?op=DELETE", timeout=10)


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


def _raw_names(storage: Storage, directory: str) -> list[str]:
    """Every name in ``directory``, temp names included (the backend's list hides them)."""
    assert isinstance(storage, WebHdfsStorage)
    return sorted(storage.client.list(directory))


def test_wal_crash_between_temp_write_and_rename_on_hdfs(hdfs):
    """SIGKILL a WAL writer after its record's temp file is complete on HDFS (CREATE done,
    DataNode closed the file) and before the RENAME that would publish it (the NameNode's
    RENAME is the create-if-absent of a record on HDFS)."""
    storage, root = hdfs
    url = storage.url(root)
    script = textwrap.dedent(
        f"""
        import os, signal
        import hdfs.client
        from connectors.core.wal import WriteAheadLog

        wal = WriteAheadLog.open({url!r}, "source")
        wal.append(0, {{"w": 0}})
        wal.commit(0)
        def crash(self, src, dst):
            os.kill(os.getpid(), signal.SIGKILL)
        hdfs.client.Client.rename = crash  # die between the durable temp file and RENAME
        wal.append(1, {{"w": 1, "big": "x" * 300000}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    wal_dir = storage.join(root, "source")
    temps = [n for n in _raw_names(storage, wal_dir) if n.endswith(".tmp")]
    assert len(temps) == 1 and storage.size(storage.join(wal_dir, temps[0])) > 300000
    wal = WriteAheadLog(storage, root, "source")
    assert wal.seqs() == [0] and wal.last() == (0, {"w": 0}) and wal.last_committed() == 0
    # the log keeps working, and the retry publishes the record the crash lost
    assert wal.append(1, {"w": 1, "big": "x" * 300000}) is True
    wal.commit(1)
    assert wal.last()[0] == 1 and wal.last_committed() == 1


def test_wal_survives_random_kills_on_hdfs(hdfs):
    """A process appends and commits padded WAL records on HDFS and is SIGKILLed at random
    moments (inside a CREATE, between CREATE and RENAME, between record and marker...).
    After every kill the log a reader sees is a prefix of the intended one, every record
    parses and is the intended record; restarted, the writer finishes the log."""
    storage, root = hdfs
    count = 30
    url = storage.url(root)
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)


    def check() -> int:
        wal = WriteAheadLog(storage, root, "source")
        seqs, committed = wal.seqs(), wal.committed_seqs()
        assert seqs == list(range(len(seqs))), f"seed {seed}: records not a prefix: {seqs}"
        assert committed == list(range(len(committed))) and len(committed) <= len(seqs)
        assert len(seqs) - len(committed) <= 1  # at most the record being committed
        for s in seqs:
            assert wal.get(s) == record(s), f"seed {seed}: record {s} differs"
        return len(committed)

    kills = 0
    for _ in range(8):
        result = run_pipeline([WAL_APPENDER, "--wal", url, "--count", str(count)],
                              kill_after=rng.uniform(1.0, 3.0), timeout=120)
        check()
        if not result.killed:
            assert result.returncode == 0 and "WAL DONE" in result.output, result.output[-2000:]
            break
        kills += 1
    assert kills >= 2, f"seed {seed}: the writer finished before it could be killed twice"
    result = run_pipeline([WAL_APPENDER, "--wal", url, "--count", str(count)], timeout=120)
    assert result.returncode == 0 and "WAL DONE" in result.output, result.output[-2000:]
    assert check() == count


def test_create_if_absent_has_one_winner_among_racing_writers(any_storage):
    """The commit point of every protocol on a rename store: a complete temp file, then a
    hard link (local) or a RENAME the NameNode refuses onto an existing file (HDFS)."""
    from concurrent.futures import ThreadPoolExecutor

    storage, root = any_storage
    path = storage.join(root, "log", "00000000000000000003.commit")

    def create(i: int) -> bytes | None:
        try:
            storage.create(path, f"writer {i}".encode() * 1000)
            return f"writer {i}".encode() * 1000
        except FileExistsError:
            return None

    with ThreadPoolExecutor(6) as pool:
        winners = [w for w in pool.map(create, range(6)) if w is not None]
    assert len(winners) == 1 and storage.read(path) == winners[0]
    assert storage.list(storage.join(root, "log")) == ["00000000000000000003.commit"]
    storage.check_create_if_absent(root)
