"""The WAL: append/read/commit/purge, and crash safety: a process SIGKILLed between
writing a record's temp file and linking it into place leaves a readable log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from connectors.core.errors import WalError
from connectors.core.wal import WriteAheadLog


def test_append_get_last_and_write_once(tmp_path):
    wal = WriteAheadLog.open(str(tmp_path), "source")
    assert wal.last() is None and wal.last_committed() is None
    assert wal.append(0, {"start": {"t": {"0": 0}}, "end": {"t": {"0": 5}}}) is True
    assert wal.append(0, {"end": {"t": {"0": 5}}, "start": {"t": {"0": 0}}}) is False  # replay
    with pytest.raises(WalError, match="already exists with different content"):
        wal.append(0, {"start": {}, "end": {}})
    wal.append(1, {"n": 1})
    assert wal.last() == (1, {"n": 1})
    assert wal.get(0)["end"] == {"t": {"0": 5}}
    assert wal.get(7) is None
    assert wal.create(1, {"n": 2}) == {"n": 1}  # the existing record stands
    assert wal.create(2, {"n": 2}) is None and wal.get(2) == {"n": 2}


def test_commit_markers(tmp_path):
    wal = WriteAheadLog.open(str(tmp_path), "sink")
    wal.append(3, {"x": 1})
    assert not wal.is_committed(3)
    assert wal.commit(3, {"rows": 10}) is None
    assert wal.commit(3, {"rows": 11}) == {"rows": 10}  # committed once; the first stands
    assert wal.is_committed(3) and wal.last_committed() == 3
    assert wal.commit_info(3) == {"rows": 10}
    assert wal.commit_info(4) is None


def test_purge_keeps_recent_and_uncommitted(tmp_path):
    wal = WriteAheadLog.open(str(tmp_path), "source")
    for i in range(20):
        wal.append(i, {"w": i})
        if i < 18:
            wal.commit(i)
    wal.purge(before_seq=18, keep_last=5)
    assert wal.seqs() == [15, 16, 17, 18, 19]
    assert wal.committed_seqs() == [15, 16, 17]
    assert wal.last() == (19, {"w": 19})
    wal.purge(before_seq=100, keep_last=0)
    assert wal.seqs() == []


def test_negative_seq_refused(tmp_path):
    with pytest.raises(WalError):
        WriteAheadLog.open(str(tmp_path), "x").append(-1, {})


def test_crash_between_write_and_rename_leaves_a_readable_log(tmp_path):
    """SIGKILL a writer after its temp file is fsynced but before the link into place."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from connectors.core import storage
        from connectors.core.wal import WriteAheadLog

        wal = WriteAheadLog.open({str(tmp_path)!r}, "source")
        wal.append(0, {{"w": 0}})
        wal.commit(0)
        def crash(src, dst):
            os.kill(os.getpid(), signal.SIGKILL)
        os.link = crash  # die exactly between the fsynced temp file and the link
        wal.append(1, {{"w": 1, "big": "x" * 100000}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    d = tmp_path / "source"
    assert any(n.endswith(".tmp") for n in os.listdir(d)), "the temp file should remain"
    wal = WriteAheadLog.open(str(tmp_path), "source")
    assert wal.seqs() == [0]  # record 1 is simply not there
    assert wal.last() == (0, {"w": 0})
    assert wal.last_committed() == 0
    # and the log keeps working after the crash
    wal.append(1, {"w": 1})
    assert wal.last() == (1, {"w": 1})
