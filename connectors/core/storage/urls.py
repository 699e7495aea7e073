"""From a user's path or URL to ``(backend, absolute path inside the backend)``."""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlsplit, urlunsplit

from connectors.core.errors import OptionError, StorageError
from connectors.core.options import redact_url
from connectors.core.storage.base import Storage
from connectors.core.storage.local import LocalStorage
from connectors.core.storage.object_store import PROVIDERS, ObjectStoreStorage
from connectors.core.storage.options import StorageOptions
from connectors.core.storage.webhdfs import DEFAULT_WEBHDFS_PORT, WebHdfsStorage

VALID = ("a local path, file://, hdfs://, webhdfs://, s3:// (s3a://), gs:// or "
         "abfss:// (abfs://, az://, wasbs://) URL")

# Schemes of stores this package cannot reach, named so the error can say which.
_UNSUPPORTED = {
    "s3n": "Amazon S3 (s3n, retired by Hadoop: use s3://)",
    "oss": "Alibaba OSS", "cos": "Tencent COS",
    "r2": "Cloudflare R2 (use s3:// with storage.endpoint)",
    "minio": "MinIO (use s3:// with storage.endpoint)",
    "http": "plain HTTP", "https": "plain HTTPS",
}


def storage_for(
    url: str, *, webhdfs_url: str | None = None, hdfs_user: str | None = None,
    options: StorageOptions | None = None, family: str = "storage",
) -> tuple[Storage, str]:
    """Map a user path or URL to ``(backend, absolute path inside the backend)``.

    - ``/data/out``, ``data/out``, ``file:///data/out``: local disk.
    - ``webhdfs://host:port/path`` (``swebhdfs://`` for HTTPS): WebHDFS at ``host:port``.
    - ``hdfs://host[:rpcport]/path``: WebHDFS at ``webhdfs_url`` if given, else at
      ``http://host:9870`` (the NameNode's default HTTP port since Hadoop 3).
    - ``s3://bucket/path`` (``s3a://``), ``gs://bucket/path``, ``az://container/path``,
      ``abfss://container@account.dfs.core.windows.net/path`` (``abfs``, ``wasb(s)``):
      an object store, configured by ``options`` (``storage.*``) and the provider's own
      environment and credential chain.
    """
    if not url or not url.strip():
        raise StorageError(f"path is empty; give {VALID}")
    shown = redact_url(url)  # every message names the path, never a password in it
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    options = options or StorageOptions()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        local = parts.path if scheme == "file" else url
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise StorageError(
                f"{shown!r}: file:// URLs must not name a host ({parts.netloc!r}); "
                "use file:///absolute/path"
            )
        options.check_applies("local", family, shown)
        return LocalStorage(options), os.path.abspath(local)
    if scheme in ("hdfs", "webhdfs", "swebhdfs"):
        path = parts.path or "/"
        if not parts.hostname:
            raise StorageError(f"{shown!r}: an {scheme}:// URL needs a host, e.g. {scheme}://nn:9870/p")
        if scheme == "hdfs":
            base = webhdfs_url or f"http://{parts.hostname}:{DEFAULT_WEBHDFS_PORT}"
        else:
            http = "https" if scheme == "swebhdfs" else "http"
            base = urlunsplit((http, parts.netloc, "", "", ""))
        user = hdfs_user or parts.username or os.environ.get("HADOOP_USER_NAME")
        display = urlunsplit((scheme, parts.hostname + (f":{parts.port}" if parts.port else ""),
                              "", "", ""))
        options.check_applies("hdfs", family, shown)
        return WebHdfsStorage(base, user=user, display=display, options=options), path
    if scheme in PROVIDERS:
        return _object_store(shown, scheme, parts.netloc, parts.path, options, family)
    if scheme in _UNSUPPORTED:
        raise StorageError(f"{shown!r}: {_UNSUPPORTED[scheme]} ({scheme}://) is not supported; "
                           f"give {VALID}")
    raise StorageError(f"{shown!r}: unsupported URL scheme {scheme!r}; give {VALID}")


def _object_store(shown: str, scheme: str, netloc: str, path: str,
                  options: StorageOptions | None, family: str) -> tuple[Storage, str]:
    account = None
    bucket = netloc
    if "@" in netloc:
        if PROVIDERS[scheme] != "azure":
            raise StorageError(
                f"{shown!r}: put credentials in storage.* options or the environment, never in "
                "the URL")
        bucket, host = netloc.split("@", 1)
        account = host.split(".", 1)[0]
    elif scheme in ("abfs", "abfss", "wasb", "wasbs"):
        raise StorageError(
            f"{shown!r}: an {scheme}:// URL names its container and account as "
            f"{scheme}://<container>@<account>.{'dfs' if 'abfs' in scheme else 'blob'}"
            ".core.windows.net/<path>")
    if not bucket:
        raise StorageError(f"{shown!r}: the URL names no bucket; use {scheme}://<bucket>/<path>")
    clean = posixpath.normpath("/" + path.strip("/")) if path.strip("/") else "/"
    storage = ObjectStoreStorage(scheme, bucket, account, options or StorageOptions(), family)
    return storage, clean


def is_object_store(url: str) -> bool:
    return urlsplit(url).scheme.lower() in PROVIDERS


def require_directory(url: str, family: str, option: str,
                      options: StorageOptions | None = None) -> None:
    """A state directory option (``walPath``, ``path``) must not name an existing file:
    every later read would fail with a bare ``NotADirectoryError`` deep in a task."""
    storage, path = storage_for(url, options=options, family=family)
    if storage.is_file(path):
        raise OptionError(
            f"{family}: option '{option}' {storage.url(path)!r} is an existing file; give a "
            "directory (it is created if missing)",
            option=option,
        )


def check_state_path(url: str, options: StorageOptions, family: str, option: str) -> None:
    """What can be checked of a state directory option when options are parsed, without a
    network call: the URL maps to a store, an object store's client accepts the
    ``storage.*`` options, a local path is not an existing file."""
    try:
        storage, path = storage_for(url, options=options, family=family)
    except StorageError as e:
        raise OptionError(f"{family}: option '{option}' is not usable: {e}",
                          option=option) from e
    check = getattr(storage, "check_options", None)
    if check is not None:
        check()
    if isinstance(storage, LocalStorage):
        require_directory(url, family, option)
