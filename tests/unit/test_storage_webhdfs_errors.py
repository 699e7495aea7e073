"""WebHDFS backend error paths that need no HDFS: nothing listening at the NameNode's
address. (Errors a NameNode answers with are tested on a real one, in
tests/integration/test_storage_webhdfs.py.)"""

from __future__ import annotations

import socket
import time

import pytest

from connectors.core import contact
from connectors.core.errors import StorageError
from connectors.core.storage import storage_for, storage_options_from
from connectors.core.wal import WriteAheadLog


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block exits


def test_unreachable_namenode_is_a_storage_error_naming_op_and_url():
    """A refused connection from a NameNode that answered before is what a restart looks
    like: retried within the budget (storage.retryTimeout, here 300 ms), then the error
    names the budget and what to raise. (One that never answered: a first contact,
    tests/unit/test_retry_budgets.py.)"""
    port = closed_port()
    storage, root = storage_for(f"webhdfs://127.0.0.1:{port}/wal",
                                options=storage_options_from({"retryTimeout": "300ms"}, "t"))
    contact.forget()
    contact.mark(storage.identity())
    began = time.monotonic()
    with pytest.raises(StorageError, match=rf"HDFS stat failed for webhdfs://127.0.0.1:{port}/wal"
                       r".*storage.retryTimeout=0.3s and storage.maxRetries=100: raise them"):
        storage.exists(root)
    assert 0.3 <= time.monotonic() - began < 10
    with pytest.raises(StorageError, match=r"HDFS write failed for .*/wal/x"):
        storage.write_atomic(storage.join(root, "x"), b"1")
    with pytest.raises(StorageError, match="HDFS stat failed"):
        WriteAheadLog(storage, root, "source").last_committed()
    contact.forget()
