"""Local storage: atomic write, rename over existing, listing hides temp files, and the
refusal of object stores and bad URLs."""

from __future__ import annotations

import os

import pytest

from connectors.core.errors import StorageError
from connectors.core.storage import LocalStorage, WebHdfsStorage, storage_for


def test_atomic_write_replaces_whole_file(tmp_path):
    s = LocalStorage()
    p = str(tmp_path / "d" / "f.json")
    s.write_atomic(p, b"one")
    s.write_atomic(p, b"two-two")
    assert s.read(p) == b"two-two"
    assert os.listdir(tmp_path / "d") == ["f.json"]  # no temp file left behind


def test_listing_hides_temp_files(tmp_path):
    s = LocalStorage()
    (tmp_path / "a.json").write_bytes(b"x")
    (tmp_path / ".a.json.123.tmp").write_bytes(b"half")
    (tmp_path / "b.tmp").write_bytes(b"half")
    assert s.list(str(tmp_path)) == ["a.json"]
    assert s.list(str(tmp_path / "missing")) == []


def test_rename_refuses_existing_target_unless_replace(tmp_path):
    s = LocalStorage()
    a, b = str(tmp_path / "a"), str(tmp_path / "sub" / "b")
    s.write_atomic(a, b"1")
    s.rename(a, b)
    assert not s.exists(a) and s.read(b) == b"1"
    s.write_atomic(a, b"2")
    with pytest.raises(FileExistsError):
        s.rename(a, b)
    assert s.read(b) == b"1" and s.exists(a)  # nothing moved
    s.rename(a, b, replace=True)
    assert s.read(b) == b"2"
    with pytest.raises(FileNotFoundError):
        s.rename(a, str(tmp_path / "c"))


def test_open_write_refuses_to_clobber_and_walk(tmp_path):
    s = LocalStorage()
    p = str(tmp_path / "x" / "f.bin")
    with s.open_write(p) as f:
        f.write(b"abc")
    with pytest.raises(FileExistsError), s.open_write(p):
        pass
    assert s.size(p) == 3
    assert list(s.walk_files(str(tmp_path))) == [p]
    assert s.delete(str(tmp_path / "x"), recursive=True) and not s.exists(p)


@pytest.mark.parametrize(
    "url, store",
    [("s3://bucket/p", "Amazon S3"), ("s3a://b/p", "s3a"), ("gs://b/p", "Google Cloud Storage"),
     ("abfss://c@acct.dfs.core.windows.net/p", "Azure"), ("wasb://c@a/p", "Azure Blob")],
)
def test_object_stores_are_refused_with_the_reason(url, store):
    with pytest.raises(StorageError, match="atomic rename") as e:
        storage_for(url)
    assert store in str(e.value)


def test_url_mapping(tmp_path):
    s, p = storage_for(str(tmp_path / "rel"))
    assert isinstance(s, LocalStorage) and p == str(tmp_path / "rel")
    s, p = storage_for(f"file://{tmp_path}/x")
    assert isinstance(s, LocalStorage) and p == f"{tmp_path}/x"
    s, p = storage_for("webhdfs://nn:9870/data/out")
    assert isinstance(s, WebHdfsStorage) and s.base_url == "http://nn:9870" and p == "/data/out"
    s, p = storage_for("hdfs://nn:8020/data")
    assert isinstance(s, WebHdfsStorage) and s.base_url == "http://nn:9870"
    s, _ = storage_for("hdfs://nn:8020/data", webhdfs_url="http://web:50070")
    assert s.base_url == "http://web:50070"
    s, _ = storage_for("swebhdfs://nn:9871/d")
    assert s.base_url == "https://nn:9871"
    for bad in ("", "ftp://h/p", "file://otherhost/p", "hdfs:///nohost"):
        with pytest.raises(StorageError):
            storage_for(bad)
