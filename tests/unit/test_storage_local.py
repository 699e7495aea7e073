"""Local storage: create-if-absent, atomic write, rename over existing, listing hides temp
files; the capability probe; URL mapping of every store and the refusal of bad URLs."""

from __future__ import annotations

import os
import pickle

import pytest

from connectors.core.errors import OptionError, StorageError
from connectors.core.options import OptionReader
from connectors.core.storage import (
    LocalStorage,
    ObjectStoreStorage,
    WebHdfsStorage,
    forget_probes,
    parse_storage_options,
    storage_for,
    storage_options_from,
)
from tests.helpers import OverwritingStorage


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


def test_create_is_create_if_absent_and_leaves_no_temp(tmp_path):
    s = LocalStorage()
    p = str(tmp_path / "log" / "00007.commit")
    s.create(p, b"first")
    with pytest.raises(FileExistsError):
        s.create(p, b"second")
    assert s.read(p) == b"first"
    assert os.listdir(tmp_path / "log") == ["00007.commit"]


def test_the_probe_passes_on_a_local_disk_and_leaves_nothing(tmp_path):
    forget_probes()
    LocalStorage().check_create_if_absent(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_the_probe_refuses_a_store_whose_create_overwrites(tmp_path):
    forget_probes()
    with pytest.raises(StorageError, match="does not enforce create-if-absent") as e:
        OverwritingStorage().check_create_if_absent(str(tmp_path))
    assert "local disk" in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(StorageError):  # the verdict is kept for the process
        OverwritingStorage().check_create_if_absent(str(tmp_path))
    forget_probes()


@pytest.mark.parametrize(
    "url, provider, bucket, path, shown",
    [("s3://bucket/p/q/", "s3", "bucket", "/p/q", "s3://bucket/p/q"),
     ("s3a://b/p", "s3", "b", "/p", "s3a://b/p"),
     ("gs://gb/x", "gcs", "gb", "/x", "gs://gb/x"),
     ("az://cont/x", "azure", "cont", "/x", "az://cont/x"),
     ("abfss://cont@acct.dfs.core.windows.net/x/y", "azure", "cont", "/x/y",
      "abfss://cont@acct.dfs.core.windows.net/x/y")],
)
def test_object_store_urls_map_to_a_bucket_and_a_key(url, provider, bucket, path, shown):
    s, p = storage_for(url)
    assert isinstance(s, ObjectStoreStorage) and not s.atomic_rename
    assert (s.provider, s.bucket, p, s.url(p)) == (provider, bucket, path, shown)
    assert pickle.loads(pickle.dumps(s)) == s


@pytest.mark.parametrize("url, match", [
    ("oss://b/p", "Alibaba OSS"), ("https://h/p", "HTTPS"), ("s3://key:secret@b/p", "never in"),
    ("abfss://nocontainer/p", "<container>@<account>"), ("s3:///p", "names no bucket"),
])
def test_unsupported_stores_and_bad_object_store_urls_are_refused(url, match):
    with pytest.raises(StorageError, match=match) as e:
        storage_for(url)
    assert "secret" not in str(e.value).replace("never in", "")


def test_storage_options_are_checked_and_secrets_hidden(tmp_path):
    r = OptionReader({"storage.endpoint": "http://127.0.0.1:1", "storage.secretAccessKey": "S3CR3T",
                      "storage.accessKeyId": "AK"}, family="eo_files")
    opts = parse_storage_options(r)
    assert "S3CR3T" not in repr(opts) and "S3CR3T" not in str(opts)
    s, _ = storage_for("s3://b/p", options=opts)
    config, client, retry = opts.resolve("s3")
    assert config["secret_access_key"] == "S3CR3T" and client["allow_http"] is True
    assert "S3CR3T" not in repr(s)
    with pytest.raises(OptionError, match="applies to Azure Blob only"):
        storage_options_from({"accountKey": "k"}, "eo_files").resolve("s3")
    with pytest.raises(OptionError, match="object store paths only"):
        storage_for(str(tmp_path), options=opts)
    with pytest.raises(OptionError, match="did you mean 'storage.endpoint'"):
        s, _ = storage_for("s3://b/p", options=storage_options_from({"endpiont": "x"}, "f"))
        s.check_options()


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
