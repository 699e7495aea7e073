"""The one sink-state helper (core/sink_state.py) and the one WAL retention rule."""

from __future__ import annotations

import pytest

from connectors.core.errors import SinkOwnershipError
from connectors.core.sink_state import Owner, SinkState
from connectors.core.storage import LocalStorage
from connectors.core.wal import RETAIN_EVERY, WriteAheadLog


def test_retention_keeps_the_newest_entries_and_runs_every_tenth_seq(tmp_path):
    wal = WriteAheadLog(LocalStorage(), str(tmp_path), "log")
    for seq in range(35):
        wal.append(seq, {"seq": seq})
        wal.commit(seq)
        wal.retain(seq, keep=5)
    # The last run was at seq 30: it kept 26..30; 31..34 came after.
    assert wal.seqs() == list(range(26, 35)) == wal.committed_seqs()
    assert wal.retain(34, keep=5) == 0  # not a multiple of RETAIN_EVERY
    assert RETAIN_EVERY == 10


def test_owner_record_is_claimed_once(tmp_path):
    state = SinkState(LocalStorage(), str(tmp_path), log_kind="commits", keep=10,
                      owner_record=True)
    state.claim("eo_kafka", "a")
    state.claim("eo_kafka", "a")
    with pytest.raises(SinkOwnershipError, match="belongs to sink_id 'a', not 'b'"):
        state.claim("eo_kafka", "b")
    assert state.owner() == Owner("a")


def test_without_an_owner_record_the_newest_commit_names_the_owner(tmp_path):
    state = SinkState(LocalStorage(), str(tmp_path), log_kind="_log", keep=10)
    state.check_owner("eo_files", "b")
    info = state.record_commit(3, "a", 7, files=1)
    assert info["sink_id"] == "a" and info["rows"] == 7 and info["files"] == 1
    assert state.commit_info(3) == info
    assert state.owner() == Owner("a", 3)
    state.check_owner("eo_files", "a")
    for other in ("b", None):
        with pytest.raises(SinkOwnershipError):
            state.check_owner("eo_files", other)
    assert state.record_commit(3, "a", 8)["rows"] == 7  # committed once: the first stands
    with pytest.raises(SinkOwnershipError):
        state.record_commit(3, "b", 8)
    assert state.is_committed(2) and state.is_committed(3) and not state.is_committed(4)


def test_markers_are_dropped_with_their_committed_batch(tmp_path):
    state = SinkState(LocalStorage(), str(tmp_path), log_kind="commits", keep=10,
                      markers="started")
    for b in (1, 2, 3):
        state.put_marker(b, 0, b'{"batch": %d}' % b)
    assert state.get_marker(2, 0) == {"batch": 2} and state.get_marker(2, 1) is None
    state.record_commit(2, "s", 0)
    state.retain(2)
    assert state.marker_batches() == [3]
