"""Spark's _spark_metadata file-sink log as written by eo_files (format checked against
Spark's FileStreamSinkLog/CompactibleFileStreamLog; Spark itself reads it in the
integration tests)."""

from __future__ import annotations

import json
import os

import pytest

from connectors.core.errors import FileSinkError
from connectors.core.storage import LocalStorage
from connectors.files.spark_metadata import SparkMetadataLog, batch_file_name, is_compaction


def paths(entries):
    return sorted(e["path"] for e in entries)


def test_batch_file_names_follow_spark():
    assert [batch_file_name(b) for b in (0, 8, 9, 10, 19)] == ["0", "8", "9.compact", "10",
                                                                "19.compact"]
    assert is_compaction(29) and not is_compaction(30)


def test_entry_format_and_url_encoding(tmp_path):
    log = SparkMetadataLog(LocalStorage(), str(tmp_path))
    log.add(0, [(str(tmp_path / "p=a%3Ab c" / "part-0.parquet"), 12, 1000)])
    text = (tmp_path / "_spark_metadata" / "0").read_text()
    first, line = text.split("\n")
    assert first == "v1"
    entry = json.loads(line)
    assert entry == {
        "path": f"file://{tmp_path}/p=a%253Ab%20c/part-0.parquet", "size": 12, "isDir": False,
        "modificationTime": 1000, "blockReplication": 1, "blockSize": 33554432, "action": "add",
    }


def test_compaction_every_ten_batches_holds_everything(tmp_path):
    log = SparkMetadataLog(LocalStorage(), str(tmp_path))
    for b in range(25):
        log.add(b, [(f"/out/f{b}", 1, 1)])
    names = set(os.listdir(tmp_path / "_spark_metadata"))
    assert {"9.compact", "19.compact", "20", "24"} <= names
    compact = (tmp_path / "_spark_metadata" / "19.compact").read_text().splitlines()
    assert len(compact) == 1 + 20
    assert paths(log.all_entries()) == sorted(f"file:///out/f{b}" for b in range(25))
    assert paths(log.all_entries(upto=12)) == sorted(f"file:///out/f{b}" for b in range(13))


def test_replay_of_a_batch_rewrites_the_same_entry(tmp_path):
    log = SparkMetadataLog(LocalStorage(), str(tmp_path))
    for b in range(10):
        log.add(b, [(f"/out/f{b}", 1, 1)])
    before = (tmp_path / "_spark_metadata" / "9.compact").read_bytes()
    log.add(9, [(f"/out/f{9}", 1, 1)])  # replay of a compaction batch
    assert (tmp_path / "_spark_metadata" / "9.compact").read_bytes() == before


def test_gaps_are_filled_so_spark_can_read(tmp_path):
    log = SparkMetadataLog(LocalStorage(), str(tmp_path))
    log.add(3, [("/out/a", 1, 1)])  # first batch id 3: batches 0..2 must exist (empty)
    log.add(12, [("/out/b", 1, 1)])  # gap 4..11 with a compaction at 9
    names = set(os.listdir(tmp_path / "_spark_metadata"))
    assert {"0", "1", "2", "3", "9.compact", "10", "11", "12"} <= names
    assert paths(log.all_entries()) == ["file:///out/a", "file:///out/b"]


def test_large_gap_jumps_with_one_compaction(tmp_path):
    log = SparkMetadataLog(LocalStorage(), str(tmp_path))
    log.add(0, [("/out/a", 1, 1)])
    log.add(1005, [("/out/b", 1, 1)])
    names = sorted(os.listdir(tmp_path / "_spark_metadata"))
    assert names[0] == "1000" and "999.compact" in names and len(names) < 12
    assert paths(log.all_entries()) == ["file:///out/a", "file:///out/b"]


def test_a_later_batch_from_another_writer_is_refused(tmp_path):
    log = SparkMetadataLog(LocalStorage(), str(tmp_path))
    log.add(5, [])
    with pytest.raises(FileSinkError, match="already has batch 5"):
        log.add(2, [])


def test_old_files_expire_after_compaction(tmp_path):
    log = SparkMetadataLog(LocalStorage(), str(tmp_path))
    for b in range(130):
        log.add(b, [(f"/out/f{b}", 1, 1)])
    ids = log.batch_ids()
    assert ids[0] >= 19 and ids[-1] == 129
    assert len(log.all_entries()) == 130
