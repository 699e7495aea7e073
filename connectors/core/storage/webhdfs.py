"""HDFS through WebHDFS (the ``hdfs`` package): temp file + RENAME, atomic in the NameNode."""

from __future__ import annotations

import contextlib
import errno
import posixpath
from collections.abc import Hashable, Iterator
from typing import IO, Any

from connectors.core.errors import StorageError
from connectors.core.storage.base import CountingStream, Storage, is_hidden, temp_name

DEFAULT_WEBHDFS_PORT = 9870


class WebHdfsStorage(Storage):
    """HDFS through the WebHDFS REST API (the ``hdfs`` package). RENAME is atomic in HDFS.

    ``base_url`` is the NameNode's HTTP address, e.g. ``http://namenode:9870``.
    """

    scheme = "hdfs"
    kind = "HDFS"

    def __init__(self, base_url: str, user: str | None = None, display: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.display = display or base_url
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # a requests session does not pickle; rebuilt per process
        return state

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, WebHdfsStorage)
            and other.base_url == self.base_url
            and other.user == self.user
        )

    def __hash__(self) -> int:
        return hash((self.base_url, self.user))

    def identity(self) -> Hashable:
        return ("hdfs", self.base_url)

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import hdfs
            except ImportError as e:  # pragma: no cover - hdfs is a core dependency
                raise StorageError(
                    "HDFS paths need the 'hdfs' package: pip install pyspark-exactly-once"
                ) from e
            self._client = hdfs.InsecureClient(self.base_url, user=self.user)
        return self._client

    def url(self, path: str) -> str:
        return self.display.rstrip("/") + path

    def _errors(self, op: str, path: str) -> contextlib.AbstractContextManager[None]:
        return _hdfs_errors(op, self.url(path))

    def _write_temp(self, path: str, data: bytes) -> str:
        directory, name = posixpath.split(path)
        tmp = posixpath.join(directory, temp_name(name))
        with self._errors("write", path):
            self.client.write(tmp, data=data, overwrite=False)
        return tmp

    def create(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            # The NameNode refuses a RENAME onto an existing file (WebHDFS answers false),
            # atomically: create-if-absent with the content already complete.
            try:
                with self._errors("rename", tmp):
                    self.client.rename(tmp, path)
            except StorageError:
                if self._status(path) is not None:
                    raise FileExistsError(errno.EEXIST, "exists", self.url(path)) from None
                raise
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.delete(tmp)
            raise

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            self.rename(tmp, path, replace=True)
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.delete(tmp)
            raise

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        # The hdfs client streams a chunked PUT from a background thread; its writer's
        # tell() always answers 0, which would corrupt a parquet footer.
        with self._errors("write", path), self.client.write(path, overwrite=False) as writer:
            yield CountingStream(writer)  # type: ignore[misc]

    def read(self, path: str) -> bytes:
        with self._errors("read", path), self.client.read(path) as reader:
            data: bytes = reader.read()
            return data

    def _status(self, path: str) -> dict[str, Any] | None:
        with self._errors("stat", path):
            status: dict[str, Any] | None = self.client.status(path, strict=False)
            return status

    def list(self, path: str) -> list[str]:
        status = self._status(path)
        if status is None or status.get("type") != "DIRECTORY":
            return []
        with self._errors("list", path):
            names = self.client.list(path)
        return sorted(n for n in names if not is_hidden(n))

    def rename(self, src: str, dst: str, *, replace: bool = False) -> None:
        if self._status(src) is None:
            raise FileNotFoundError(errno.ENOENT, "rename source missing", self.url(src))
        dst_status = self._status(dst)
        if dst_status is not None:
            if not replace or dst_status.get("type") == "DIRECTORY":
                raise FileExistsError(errno.EEXIST, "target exists", self.url(dst))
            # WebHDFS RENAME never overwrites (no OVERWRITE option over REST). Only the WAL
            # replaces, and it writes every name once, so the gap here is not reachable.
            self.delete(dst)
        parent = posixpath.dirname(dst)
        if parent:
            self.mkdirs(parent)
        with self._errors("rename", src):
            self.client.rename(src, dst)

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        with self._errors("delete", path):
            return bool(self.client.delete(path, recursive=recursive))

    def exists(self, path: str) -> bool:
        return self._status(path) is not None

    def is_dir(self, path: str) -> bool:
        status = self._status(path)
        return status is not None and status.get("type") == "DIRECTORY"

    def size(self, path: str) -> int:
        status = self._status(path)
        if status is None:
            raise FileNotFoundError(errno.ENOENT, "missing", self.url(path))
        return int(status.get("length", 0))

    def mkdirs(self, path: str) -> None:
        with self._errors("mkdirs", path):
            self.client.makedirs(path)




@contextlib.contextmanager
def _hdfs_errors(op: str, where: str) -> Iterator[None]:
    try:
        yield
    except (FileNotFoundError, FileExistsError, StorageError):
        raise
    except Exception as e:
        name = type(e).__name__
        if name == "HdfsError" or e.__class__.__module__.startswith(("hdfs", "requests")):
            # The NameNode's exception class, where it answered with one. Callers (the WAL,
            # the sinks) tell "not there" and "already there" apart as on local disks.
            remote = getattr(e, "exception", None)
            if remote == "FileNotFoundException":
                raise FileNotFoundError(errno.ENOENT, f"HDFS {op}: {e}", where) from e
            if remote == "FileAlreadyExistsException":
                raise FileExistsError(errno.EEXIST, f"HDFS {op}: {e}", where) from e
            raise StorageError(f"HDFS {op} failed for {where}: {e}") from e
        raise


