"""The storage retry budget and what each store's errors mean (no network, no root). The
same faults on the real services: tests/integration/test_storage_faults_*.py. Here what
those cannot produce on this machine: a quota (tmpfs has none here), a failing device
(``EIO``), a standby NameNode (no HA), and the budget's own arithmetic."""

from __future__ import annotations

import errno
import os
import time
from typing import Any

import pytest

from connectors.core.errors import OptionError, StorageError
from connectors.core.storage import LocalStorage, storage_for, storage_options_from
from connectors.core.storage.disk import NoHardLinks, NotRetried, disk_error, is_retried
from connectors.core.storage.object_store_errors import is_transient as object_store_transient
from connectors.core.storage.retry import RetryBudget
from connectors.core.storage.webhdfs import is_transient as hdfs_transient


def test_the_budget_is_declared_once_with_defaults_and_applies_to_every_store(
        tmp_path: Any) -> None:
    assert RetryBudget.of(storage_options_from({}, "t")) == RetryBudget(120.0, 100, 0.1, 2.0)
    options = storage_options_from({"retryTimeout": "5s", "maxRetries": "3",
                                    "retryBackoff": "10ms", "retryBackoffMax": "1s"}, "t")
    for url in (str(tmp_path), "webhdfs://nn:9870/p", "s3://b/p"):
        storage, _ = storage_for(url, options=options)
        assert storage.budget == RetryBudget(5.0, 3, 0.01, 1.0), url  # type: ignore[attr-defined]
    # HDFS takes the timeouts too; local disks only the budget
    storage_for("webhdfs://nn:9870/p", options=storage_options_from({"requestTimeout": "9s"},
                                                                    "t"))
    with pytest.raises(OptionError, match="'storage.requestTimeout' applies to object store "
                       "and HDFS paths only.*storage.retryTimeout"):
        storage_for(str(tmp_path), options=storage_options_from({"requestTimeout": "9s"}, "t"))
    with pytest.raises(OptionError, match="'storage.endpoint' applies to object store paths"):
        storage_for("webhdfs://nn:9870/p",
                    options=storage_options_from({"endpoint": "http://x"}, "t"))


def test_retries_stop_at_the_time_or_count_budget_and_other_errors_pass_unchanged() -> None:
    calls: list[float] = []

    def failing() -> None:
        calls.append(time.monotonic())
        raise OSError(errno.ENOSPC, "No space left on device")

    budget = RetryBudget(timeout=0.3, max_retries=100, backoff=0.01, backoff_max=0.05)
    with pytest.raises(OSError):
        budget.run(failing, transient=is_retried, what=lambda: "x")
    assert 0.25 <= calls[-1] - calls[0] < 1.0 and len(calls) > 3
    calls.clear()
    with pytest.raises(OSError):
        RetryBudget(30, 2, 0.001, 0.001).run(failing, transient=is_retried, what=lambda: "x")
    assert len(calls) == 3  # the first try and two retries
    calls.clear()

    def exists() -> None:
        calls.append(0)
        raise FileExistsError(errno.EEXIST, "exists")

    with pytest.raises(FileExistsError):
        budget.run(exists, transient=is_retried, what=lambda: "x")
    assert len(calls) == 1  # an answer of the protocol, never retried


@pytest.mark.parametrize(("code", "words", "retried"), [
    (errno.ENOSPC, "the disk is full (ENOSPC", True),
    (errno.EDQUOT, "the disk quota of this user is used up (EDQUOT", True),
    (errno.EIO, "the disk failed an I/O (EIO", True),
    (errno.EROFS, "the filesystem is read-only (EROFS", False),
])
def test_each_disk_condition_is_named_with_the_path_and_free_space(
        tmp_path: Any, code: int, words: str, retried: bool) -> None:
    e = OSError(code, os.strerror(code))
    assert is_retried(e) is retried
    error = disk_error(e, f"file://{tmp_path}/x", str(tmp_path / "x"), None)
    assert error is not None
    message = str(error)
    assert message.startswith(f"local disk at file://{tmp_path}/x: {words}"), message
    assert " free of " in message and "on the filesystem mounted at /" in message
    assert "atomically" not in message
    # a failing link() is the one thing that means "no hard links here"
    assert disk_error(NoHardLinks(errno.EPERM, "no"), "u", "p", None) is None
    assert not is_retried(NoHardLinks(errno.EPERM, "no"))
    assert not is_retried(NotRetried(errno.EIO, "mid-stream"))


def test_a_stream_waits_out_enospc_and_writes_each_byte_once(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.write`` that fails with ENOSPC writes nothing; the stream writes the same bytes
    again from the same offset (a short write goes on from where it stopped)."""
    real_write = os.write
    answers = iter(["enospc", "short", "enospc", "enospc"])

    def write(fd: int, data: Any) -> int:
        answer = next(answers, "all")
        if answer == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        if answer == "short":
            return real_write(fd, bytes(data)[:3])
        return real_write(fd, data)

    storage = LocalStorage(storage_options_from({"retryBackoff": "10ms"}, "t"))
    path = str(tmp_path / "f")
    monkeypatch.setattr(os, "write", write)
    with storage.open_write(path) as stream:
        stream.write(b"0123456789")
        stream.write(b"abc")
    monkeypatch.undo()
    assert open(path, "rb").read() == b"0123456789abc"

    def eio(fd: int, data: Any) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "write", eio)
    with pytest.raises(StorageError, match=r"the disk failed an I/O \(EIO.*not retried"), \
            storage.open_write(str(tmp_path / "g")) as stream:
        stream.write(b"x")


@pytest.mark.parametrize(("error", "transient"), [
    ("connection", True), ("timeout", True), ("safemode", True), ("retriable", True),
    ("standby", True), ("datanode-503", True), ("no-datanode", True),
    ("namenode-gone", True), ("not-found", False), ("exists", False),
    ("access", False), ("rename-false", False),
])
def test_hdfs_errors_a_retry_outlasts(error: str, transient: bool) -> None:
    import requests
    from hdfs.util import HdfsError

    made = {
        "connection": requests.exceptions.ConnectionError("refused"),
        "timeout": requests.exceptions.ReadTimeout("slow"),
        "safemode": HdfsError("Cannot create file/x. Name node is in safe mode.",
                              exception="SafeModeException"),
        "retriable": HdfsError("org.apache.hadoop.hdfs.server.namenode.SafeModeException: "
                               "Cannot rename /a. Name node is in safe mode.",
                               exception="RetriableException"),
        "standby": HdfsError("Operation category WRITE is not supported in state standby",
                             exception="StandbyException"),
        "datanode-503": HdfsError(b"503 Service Unavailable".decode()),
        "no-datanode": HdfsError("Failed to find datanode, suggest to check cluster health. "
                                 "excludeDatanodes=null", exception="IOException"),
        "namenode-gone": HdfsError('End of File Exception between local host is: "vm/"; '
                                   'destination host is: "localhost":34433; : '
                                   "java.io.EOFException", exception="EOFException"),
        "not-found": HdfsError("File does not exist: /x", exception="FileNotFoundException"),
        "exists": HdfsError("/x already exists", exception="FileAlreadyExistsException"),
        "access": HdfsError("Permission denied", exception="AccessControlException"),
        "rename-false": HdfsError("Unable to rename '/a' to '/b'."),
    }[error]
    assert hdfs_transient(made) is transient


@pytest.mark.parametrize(("text", "transient"), [
    # a conditional PUT reset mid-request: obstore does not retry it (not idempotent)
    ("Generic S3 error: Error performing PUT http://h/b/k in 3ms - HTTP error: error sending "
     "request\n\nDebug source:\n... Os { code: 104, kind: ConnectionReset, ... }", True),
    ("Generic S3 error: Error performing POST http://h/b?delete in 15s - HTTP error: "
     "operation timed out", True),
    # obstore retried it until its budget ran out: not again
    ("Generic S3 error: Error performing PUT http://h/b/k in 30s, after 41 retries, "
     "max_retries: 100, retry_timeout: 30s - HTTP error: error sending request ... "
     "ConnectionReset", False),
    # obstore retried 500s and refusals, then stopped at a conditional PUT reset
    # mid-request (seen while SeaweedFS restarted): its budget was not spent, so again
    ("Generic S3 error: Error performing PUT http://h/b/k in 15.778866335s, after 31 "
     "retries, max_retries: 100, retry_timeout: 90s  - HTTP error: error sending request"
     "\n\nDebug source:\n... Os { code: 104, kind: ConnectionReset, ... }", True),
    # no credentials: the identity endpoint is not a fault that passes
    ("Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token in 1s "
     "- HTTP error: operation timed out", False),
    # a refused connection obstore already retries itself
    ("Generic S3 error: Error performing PUT http://h/b/k in 5s - HTTP error: error sending "
     "request", False),
])
def test_object_store_errors_the_storage_layer_runs_again(text: str, transient: bool) -> None:
    from obstore.exceptions import GenericError

    assert object_store_transient(GenericError(text)) is transient
