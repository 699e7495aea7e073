"""The object-store backend on real servers: S3 (the session's SeaweedFS, or MinIO/an
external endpoint) and Azure Blob (Azurite): the storage contract every protocol relies
on, the WAL and sink state on it, races for one commit point, and a writer killed at random
moments with its credentials taken from the standard AWS environment."""

from __future__ import annotations

import os
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.core.errors import SinkOwnershipError, StorageError, WalError
from connectors.core.sink_state import SinkState
from connectors.core.storage import (
    ObjectStoreStorage,
    Storage,
    check_create_if_absent,
    forget_probes,
    storage_for,
    storage_options_from,
)
from connectors.core.wal import WriteAheadLog
from tests.helpers import run_pipeline
from tests.integration.pipelines.wal_appender import record

WAL_APPENDER = os.path.join(os.path.dirname(__file__), "pipelines", "wal_appender.py")


@pytest.fixture(params=["s3", "azure"])
def store(request) -> tuple[Storage, str]:
    """A fresh prefix on each real object store, as (backend, root)."""
    if request.param == "s3":
        svc, bucket = request.getfixturevalue("s3_service"), request.getfixturevalue("s3_bucket")
        url = f"s3://{bucket}/root"
    else:
        svc = request.getfixturevalue("azure_service")
        url = svc.url(request.getfixturevalue("azure_container"), "root")
    storage, root = storage_for(url, options=storage_options_from(svc.python_options(), "t"))
    assert isinstance(storage, ObjectStoreStorage) and not storage.atomic_rename
    return storage, root


def test_create_if_absent_has_one_winner_among_racing_writers(store):
    storage, root = store
    path = storage.join(root, "log", "00000000000000000007.commit")

    def create(i: int) -> bytes | None:
        try:
            storage.create(path, f"writer {i}".encode())
            return f"writer {i}".encode()
        except FileExistsError:
            return None

    with ThreadPoolExecutor(8) as pool:
        winners = [w for w in pool.map(create, range(8)) if w is not None]
    assert len(winners) == 1
    assert storage.read(path) == winners[0]  # the winner's bytes, whole
    check_create_if_absent(storage, root)


def test_reads_lists_and_deletes_behave_as_on_a_filesystem(store):
    storage, root = store
    a = storage.join(root, "d", "a.json")
    storage.write_atomic(a, b"1")
    storage.write_atomic(a, b"22")  # replace
    storage.create(storage.join(root, "d", "sub", "b.json"), b"x")
    storage.create(storage.join(root, "d", ".a.json.123.tmp"), b"half")
    assert storage.read(a) == b"22" and storage.size(a) == 2
    assert storage.list(storage.join(root, "d")) == ["a.json", "sub"]
    assert storage.list(storage.join(root, "missing")) == []
    assert storage.exists(a) and storage.exists(storage.join(root, "d"))
    assert storage.is_dir(storage.join(root, "d")) and not storage.is_dir(a)
    assert storage.is_file(a) and not storage.is_file(storage.join(root, "d"))
    assert not storage.is_file(storage.join(root, "nope"))
    assert not storage.exists(storage.join(root, "nope"))
    assert sorted(storage.walk_files(root)) == [a, storage.join(root, "d", "sub", "b.json")]
    with pytest.raises(FileNotFoundError):
        storage.read(storage.join(root, "nope"))
    with pytest.raises(StorageError, match="no atomic rename"):
        storage.rename(a, storage.join(root, "e"))
    assert storage.delete_many([a, storage.join(root, "never-there")]) == 2
    storage.delete(storage.join(root, "d"), recursive=True)
    assert list(storage.walk_files(root)) == []


def test_a_streamed_file_is_visible_only_once_complete(store):
    storage, root = store
    path = storage.join(root, "t.parquet")
    table = pa.table({"x": list(range(300_000)), "s": [f"row-{i}" for i in range(300_000)]})
    with pytest.raises(RuntimeError), storage.open_write(path) as f:
        pq.write_table(table, f, row_group_size=50_000)
        assert not storage.exists(path)  # not before the block ends
        raise RuntimeError("the task dies mid-file")
    assert not storage.exists(path)  # aborted: nothing visible
    with storage.open_write(path) as f:  # several MiB: a multipart upload
        pq.write_table(table, f, row_group_size=50_000)
    assert pq.read_table(pa.BufferReader(storage.read(path))).equals(table)


def test_two_wal_writers_racing_for_one_seq_one_wins(store):
    storage, root = store
    barrier = threading.Barrier(4)

    def plan(i: int) -> str:
        wal = WriteAheadLog(storage, root, "source")
        barrier.wait()
        try:
            wal.append(0, {"planner": i})
            return "won"
        except WalError as e:
            assert "already exists with different content" in str(e)
            return "lost"

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(plan, range(4)))
    assert sorted(outcomes) == ["lost", "lost", "lost", "won"]
    wal = WriteAheadLog(storage, root, "source")
    assert wal.seqs() == [0] and wal.append(0, wal.get(0)) is False  # a replay of the winner


def test_two_sinks_racing_for_one_state_directory_one_owns_it(store):
    storage, root = store
    barrier = threading.Barrier(2)

    def claim(sink_id: str) -> str:
        state = SinkState(storage, root, log_kind="commits", keep=10, owner_record=True,
                          family="eo_kafka")
        barrier.wait()
        try:
            state.claim("eo_kafka", sink_id)
            return sink_id
        except SinkOwnershipError:
            return "refused"

    with ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(claim, ["a", "b"]))
    assert outcomes in (["a", "refused"], ["b", "refused"])
    winner = outcomes[0]
    state = SinkState(storage, root, log_kind="commits", keep=10, owner_record=True,
                      family="eo_kafka")
    state.record_commit(0, winner, 5)
    with pytest.raises(SinkOwnershipError):
        state.record_commit(0, "a" if winner == "b" else "b", 5)


def test_wal_retention_deletes_old_objects(store):
    storage, root = store
    wal = WriteAheadLog(storage, root, "source")
    for seq in range(21):
        wal.append(seq, {"seq": seq})
        wal.commit(seq)
        wal.retain(seq, keep=5)
    assert wal.seqs() == list(range(16, 21)) == wal.committed_seqs()


def test_the_probe_refuses_a_store_that_ignores_conditional_writes(no_conditional_s3):
    forget_probes()
    storage, root = storage_for(f"s3://{no_conditional_s3.bucket}/wal",
                                options=storage_options_from(no_conditional_s3.python_options(),
                                                             "t"))
    with pytest.raises(StorageError, match="does not enforce create-if-absent") as e:
        check_create_if_absent(storage, root)
    assert "no-conditional-writes" in str(e.value) and "S3RVER" not in str(e.value)
    assert list(storage.walk_files(root)) == []  # the probe object is gone
    forget_probes()


def test_wal_survives_random_kills_on_s3_with_credentials_from_the_environment(
        s3_service, s3_bucket):
    """A process appends and commits padded WAL records on S3, its credentials and endpoint
    from AWS_* variables only, and is SIGKILLed at random moments. After every kill the log
    is a prefix of the intended one and every record parses; restarted, it finishes."""
    url = f"s3://{s3_bucket}/wal-{uuid.uuid4().hex[:6]}"
    storage, root = storage_for(url, options=storage_options_from(s3_service.python_options(),
                                                                  "t"))
    count, seed = 400, int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)

    def check() -> int:
        wal = WriteAheadLog(storage, root, "source")
        seqs, committed = wal.seqs(), wal.committed_seqs()
        assert seqs == list(range(len(seqs))), f"seed {seed}: records not a prefix: {seqs}"
        assert committed == list(range(len(committed))) and len(committed) <= len(seqs)
        assert len(seqs) - len(committed) <= 1
        for s in seqs:
            assert wal.get(s) == record(s), f"seed {seed}: record {s} differs"
        return len(committed)

    kills = 0
    for _ in range(8):
        result = run_pipeline([WAL_APPENDER, "--wal", url, "--count", str(count)],
                              kill_after=rng.uniform(0.3, 1.2), timeout=120,
                              env=s3_service.env())
        check()
        if not result.killed:
            assert result.returncode == 0 and "WAL DONE" in result.output, result.output[-2000:]
            break
        kills += 1
    assert kills >= 2, f"seed {seed}: the writer finished before it could be killed twice"
    result = run_pipeline([WAL_APPENDER, "--wal", url, "--count", str(count)], timeout=120,
                          env=s3_service.env())
    assert result.returncode == 0 and "WAL DONE" in result.output, result.output[-2000:]
    assert check() == count
