"""The ``eo-rk`` recovery-key header and the started markers (no network, no Spark)."""

from __future__ import annotations

import json
import struct

import pytest

from connectors.core.errors import KafkaSinkError
from connectors.core.storage import LocalStorage
from connectors.kafka.sink import recovery
from connectors.kafka.sink.recovery import RecoveryKey, RecoveryKeyError

KEYS = [
    ("orders", 0, 0, 0),
    ("s", 7, 3, 123456),
    ("säule-😀", 2**63, 2**32 - 1, 2**64 - 1),
    ("x" * 255, 1, 1, 1),
]


@pytest.mark.parametrize("fields", KEYS)
def test_round_trip_version_1(fields):
    key = RecoveryKey(*fields, version=1)
    value = recovery.encode(key)
    assert recovery.decode(value) == key
    assert recovery.find_key([("other", b"x"), (recovery.HEADER, value)]) == key


@pytest.mark.parametrize("fields", KEYS)
def test_round_trip_version_2_tags_the_sink(fields):
    sink_id, batch, writer, seq = fields
    value = recovery.encode(RecoveryKey(*fields))
    back = recovery.decode(value)
    assert (back.batch_id, back.writer, back.seq, back.version) == (batch, writer, seq, 2)
    assert back.of_sink(sink_id) and not back.of_sink(sink_id + "-other")
    assert recovery.find_key([("other", b"x"), (recovery.HEADER, value)]) == back


def test_layout_version_1_is_version_length_sink_batch_writer_seq():
    value = recovery.encode(RecoveryKey("ab", 5, 2, 9, version=1))
    assert value == bytes([1, 2]) + b"ab" + struct.pack(">QIQ", 5, 2, 9)
    assert len(value) == 2 + 2 + 20
    # the per-record part is only the trailing seq: prefix + 8 bytes
    assert value == recovery.key_prefix("ab", 5, 2, 1) + struct.pack(">Q", 9)


def test_layout_version_2_is_version_tag_varints_seq():
    import hashlib

    value = recovery.encode(RecoveryKey("ab", 300, 2, 9))
    tag = hashlib.blake2b(b"ab", digest_size=8).digest()
    assert value == bytes([2]) + tag + bytes([0xAC, 0x02, 0x02]) + struct.pack(">Q", 9)
    assert value == recovery.key_prefix("ab", 300, 2) + struct.pack(">Q", 9)
    # 20 bytes for small batch ids and writers, whatever the sink id's length
    assert len(recovery.encode(RecoveryKey("x" * 200, 100, 5, 1))) == 1 + 8 + 1 + 1 + 8


def test_header_values_built_by_numpy_are_the_encoded_keys():
    import numpy as np

    seqs = np.array([0, 255, 256, 2**40 + 7, 9, 2**63], dtype=np.uint64)
    prefix = recovery.key_prefix("säule", 3, 1)
    assert recovery.header_values(prefix, seqs) == [
        recovery.encode(RecoveryKey("säule", 3, 1, int(s))) for s in seqs.tolist()]
    assert recovery.header_values(prefix, np.array([], dtype=np.int64)) == []


def test_version_byte_is_checked():
    value = bytearray(recovery.encode(RecoveryKey("ab", 5, 2, 9)))
    assert value[0] == recovery.VERSION == 2
    value[0] = 3
    with pytest.raises(RecoveryKeyError, match="version 3 is not supported"):
        recovery.decode(bytes(value))


@pytest.mark.parametrize(
    "foreign",
    [
        b"",
        b"\x01",
        b"hello world",  # 'h' is not a version we know
        bytes([1, 2]) + b"ab" + b"\x00" * 19,  # one byte short
        bytes([1, 2]) + b"ab" + b"\x00" * 21,  # one byte long
        bytes([1, 0]) + b"\x00" * 20,  # empty sink id
        bytes([1, 2]) + b"\xff\xfe" + b"\x00" * 20,  # sink id not UTF-8
        bytes([2]) + b"\x00" * 8 + b"\x01\x01" + b"\x00" * 7,  # version 2, seq short
        bytes([2]) + b"\x00" * 8 + b"\x01\x01" + b"\x00" * 9,  # version 2, seq long
        bytes([2]) + b"\x00" * 8 + b"\xff" * 20,  # version 2, a varint that never ends
    ],
)
def test_foreign_values_are_rejected(foreign):
    with pytest.raises(RecoveryKeyError):
        recovery.decode(foreign)
    assert recovery.find_key([(recovery.HEADER, foreign)]) is None


def test_find_key_ignores_other_headers_and_absent_ones():
    assert recovery.find_key(None) is None
    assert recovery.find_key([]) is None
    assert recovery.find_key([("eo-rk-not", recovery.encode(RecoveryKey("a", 1, 1, 1)))]) is None
    assert recovery.find_key([(recovery.HEADER, None)]) is None


def test_sink_id_must_fit_the_length_byte():
    with pytest.raises(KafkaSinkError, match="1..255 bytes"):
        recovery.key_prefix("x" * 256, 0, 0)
    with pytest.raises(KafkaSinkError):
        recovery.key_prefix("", 0, 0)


def test_marker_keeps_the_null_key_budget_and_older_markers_mean_their_rows():
    from connectors.kafka.sink.partitioner import (
        LEGACY_NULL_KEY_RUN,
        NULL_KEY_RUN_BYTES,
        ByteRuns,
        RowRuns,
    )

    marker = recovery.StartedMarker("s", 3, 1, {"b": 4}, {"b": {"0": 1}},
                                    null_key_run_bytes=1234)
    record = json.loads(marker.to_json())
    assert record["null_key_run_bytes"] == 1234 and "null_key_run" not in record
    back = recovery.StartedMarker.from_record(record)
    assert (back.null_key_run_bytes, back.null_key_run) == (1234, None)
    runs = back.null_key_runs(5)
    assert isinstance(runs, ByteRuns) and (runs.start, runs.budget) == (5, 1234)
    default = recovery.StartedMarker("s", 3, 1, {}, {})
    assert default.null_key_run_bytes == NULL_KEY_RUN_BYTES
    # The release before byte runs recorded its run in rows ...
    del record["null_key_run_bytes"]
    rows = recovery.StartedMarker.from_record({**record, "null_key_run": 100_000})
    assert (rows.null_key_run_bytes, rows.null_key_run) == (None, 100_000)
    runs = rows.null_key_runs(5)
    assert isinstance(runs, RowRuns) and (runs.start, runs.rows) == (5, 100_000)
    assert json.loads(rows.to_json())["null_key_run"] == 100_000  # kept as it was
    # ... and the one before that not at all: runs of 1,000 rows.
    old = recovery.StartedMarker.from_record(record)
    assert old.null_key_run == LEGACY_NULL_KEY_RUN == 1000
    assert isinstance(old.null_key_runs(0), RowRuns)


def test_marker_round_trip_and_purge(tmp_path):
    store = recovery.MarkerStore(LocalStorage(), str(tmp_path))
    assert store.get(3, 1) is None
    marker = recovery.StartedMarker(
        sink_id="s", batch_id=3, writer=1, partition_counts={"b": 4},
        watermarks={"b": {"0": 10, "3": 0}},
    )
    store.put(marker)
    back = store.get(3, 1)
    assert back == marker
    assert back.start_offsets() == {("b", 0): 10, ("b", 3): 0}
    for b in (1, 2, 4):
        store.put(recovery.StartedMarker("s", b, 0, {"b": 4}, {"b": {"0": b}}))
    assert store.batches() == [1, 2, 3, 4]
    assert store.purge(3) == 3
    assert store.batches() == [4]
    assert store.get(3, 1) is None and store.get(4, 0) is not None
