"""One small filesystem interface with an atomic rename, on local disks and on HDFS.

The WAL and the file sink need exactly these operations, with these guarantees:

- ``write_atomic(path, data)``: after a crash at any instant, ``path`` either holds all of
  ``data`` or does not exist. Local: temp file in the same directory, fsync, ``os.replace``,
  fsync of the directory. HDFS: write a hidden temp file, then RENAME (atomic in the
  NameNode).
- ``rename(src, dst)``: atomic; refuses to replace an existing ``dst`` unless asked, so that
  "the target already exists" can be told apart from "the rename happened" after a crash.
- ``list(dir)`` hides temp names (``.``-prefixed or ``.tmp`` suffixed), so a reader never
  sees a half-written file.

Object stores (S3, GCS, Azure Blob, ...) have no atomic rename: a "rename" there is a copy
then a delete, and a reader can see both or neither. :func:`storage_for` refuses them with
an error instead of being silently non-atomic.

Backends are small picklable values (the file sink ships them to executors); the WebHDFS
client is created lazily on first use in each process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

from connectors.core.errors import StorageError

TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"

# Schemes of stores that cannot rename atomically. Named so the error can say which.
_OBJECT_STORES = {
    "s3": "Amazon S3",
    "s3a": "Amazon S3 (s3a)",
    "s3n": "Amazon S3 (s3n)",
    "gs": "Google Cloud Storage",
    "gcs": "Google Cloud Storage",
    "abfs": "Azure Data Lake Gen2 (abfs)",
    "abfss": "Azure Data Lake Gen2 (abfss)",
    "wasb": "Azure Blob Storage",
    "wasbs": "Azure Blob Storage",
    "az": "Azure Blob Storage",
    "adl": "Azure Data Lake Gen1",
    "oss": "Alibaba OSS",
    "cos": "Tencent COS",
    "r2": "Cloudflare R2",
    "minio": "MinIO",
    "http": "plain HTTP",
    "https": "plain HTTPS",
}

DEFAULT_WEBHDFS_PORT = 9870


def is_hidden(name: str) -> bool:
    """Temp files of an atomic write, invisible to listings and readers."""
    return name.startswith(TEMP_PREFIX) or name.endswith(TEMP_SUFFIX)


def temp_name(final_name: str) -> str:
    return f"{TEMP_PREFIX}{final_name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"


class Storage(ABC):
    """Filesystem operations on absolute paths of one backend (see module docstring)."""

    scheme: str = ""

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None: ...

    @abstractmethod
    def open_write(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A binary stream to a *new* file at ``path``; durable once the block exits.

        Not atomic by itself: callers stage under a unique name and rename later.
        """

    @abstractmethod
    def read(self, path: str) -> bytes:
        """All bytes of ``path``; FileNotFoundError if it is missing (on every backend)."""

    @abstractmethod
    def list(self, path: str) -> list[str]:
        """Names (not paths) in directory ``path``, temp names hidden; [] if it is missing."""

    @abstractmethod
    def rename(self, src: str, dst: str, *, replace: bool = False) -> None:
        """Atomically move ``src`` to ``dst``. Raises FileExistsError if ``dst`` exists and
        ``replace`` is false, FileNotFoundError if ``src`` is missing."""

    @abstractmethod
    def delete(self, path: str, *, recursive: bool = False) -> bool:
        """Remove a file or directory; False if nothing was there."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def is_dir(self, path: str) -> bool: ...

    @abstractmethod
    def size(self, path: str) -> int: ...

    @abstractmethod
    def mkdirs(self, path: str) -> None: ...

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def url(self, path: str) -> str:
        """The user-facing URL of ``path`` (for messages and the file sink's logs)."""
        return path

    def walk_files(self, path: str) -> Iterator[str]:
        """Every visible file below ``path``, recursively (paths, not names)."""
        for name in self.list(path):
            full = self.join(path, name)
            if self.is_dir(full):
                yield from self.walk_files(full)
            else:
                yield full


class LocalStorage(Storage):
    """POSIX filesystem: temp file + fsync + ``os.replace`` + directory fsync."""

    scheme = "file"

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def url(self, path: str) -> str:
        return "file://" + os.path.abspath(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, temp_name(os.path.basename(path)))
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(directory)

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        with open(path, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(directory)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def list(self, path: str) -> list[str]:
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if not is_hidden(n))

    def rename(self, src: str, dst: str, *, replace: bool = False) -> None:
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        if replace:
            os.replace(src, dst)
        elif os.path.isdir(src):
            if os.path.exists(dst):
                raise FileExistsError(errno.EEXIST, "target exists", dst)
            os.rename(src, dst)
        else:
            # link() fails atomically when dst exists: a no-replace rename for files.
            os.link(src, dst)
            os.unlink(src)
        _fsync_dir(os.path.dirname(dst) or ".")
        if os.path.dirname(src) != os.path.dirname(dst):
            _fsync_dir(os.path.dirname(src) or ".")

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        import shutil

        if os.path.isdir(path) and not os.path.islink(path):
            if recursive:
                shutil.rmtree(path, ignore_errors=False)
            else:
                os.rmdir(path)
            return True
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def mkdirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStorage)

    def __hash__(self) -> int:
        return hash("local")


def _fsync_dir(directory: str) -> None:
    """Make a rename or create durable: POSIX stores directory entries in the directory."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems (tmpfs on old kernels) refuse: best effort
        if e.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


class WebHdfsStorage(Storage):
    """HDFS through the WebHDFS REST API (the ``hdfs`` package). RENAME is atomic in HDFS.

    ``base_url`` is the NameNode's HTTP address, e.g. ``http://namenode:9870``.
    """

    scheme = "hdfs"

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

    def write_atomic(self, path: str, data: bytes) -> None:
        directory, name = posixpath.split(path)
        tmp = posixpath.join(directory, temp_name(name))
        with self._errors("write", path):
            self.client.write(tmp, data=data, overwrite=False)
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


class CountingStream:
    """A write-only binary stream over another: counts bytes for ``tell()`` (pyarrow's
    writers need it; the hdfs client's writer answers 0) and ignores ``close()``, because
    the backend's context manager closes, and on local disks fsyncs, the real stream."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.position = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.raw.write(view)  # type: ignore[arg-type]
        self.position += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


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


def storage_for(
    url: str, *, webhdfs_url: str | None = None, hdfs_user: str | None = None
) -> tuple[Storage, str]:
    """Map a user path or URL to ``(backend, absolute path inside the backend)``.

    - ``/data/out``, ``data/out``, ``file:///data/out``: local disk.
    - ``webhdfs://host:port/path`` (``swebhdfs://`` for HTTPS): WebHDFS at ``host:port``.
    - ``hdfs://host[:rpcport]/path``: WebHDFS at ``webhdfs_url`` if given, else at
      ``http://host:9870`` (the NameNode's default HTTP port since Hadoop 3).
    - Object stores are refused: they cannot rename atomically.
    """
    if not url or not url.strip():
        raise StorageError("path is empty; give a local path, file://, hdfs:// or webhdfs:// URL")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        local = parts.path if scheme == "file" else url
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise StorageError(
                f"{url!r}: file:// URLs must not name a host ({parts.netloc!r}); "
                "use file:///absolute/path"
            )
        return LocalStorage(), os.path.abspath(local)
    if scheme in ("hdfs", "webhdfs", "swebhdfs"):
        path = parts.path or "/"
        if not parts.hostname:
            raise StorageError(f"{url!r}: an {scheme}:// URL needs a host, e.g. {scheme}://nn:9870/p")
        if scheme == "hdfs":
            base = webhdfs_url or f"http://{parts.hostname}:{DEFAULT_WEBHDFS_PORT}"
        else:
            http = "https" if scheme == "swebhdfs" else "http"
            base = urlunsplit((http, parts.netloc, "", "", ""))
        user = hdfs_user or parts.username or os.environ.get("HADOOP_USER_NAME")
        display = urlunsplit((scheme, parts.hostname + (f":{parts.port}" if parts.port else ""),
                              "", "", ""))
        return WebHdfsStorage(base, user=user, display=display), path
    if scheme in _OBJECT_STORES:
        raise StorageError(
            f"{url!r}: {_OBJECT_STORES[scheme]} ({scheme}://) is an object store without an "
            "atomic rename, so a crash could expose partial or duplicate output. Use a local "
            "path, file://, hdfs:// or webhdfs://, and copy committed output to the object "
            "store afterwards if needed"
        )
    raise StorageError(
        f"{url!r}: unsupported URL scheme {scheme!r}; valid: a local path, file://, hdfs://, "
        "webhdfs:// or swebhdfs://"
    )


def require_directory(url: str, family: str, option: str) -> None:
    """A state directory option (``walPath``, ``path``) must not name an existing file:
    every later read would fail with a bare ``NotADirectoryError`` deep in a task."""
    from connectors.core.errors import OptionError

    storage, path = storage_for(url)
    if storage.exists(path) and not storage.is_dir(path):
        raise OptionError(
            f"{family}: option '{option}' {storage.url(path)!r} is an existing file; give a "
            "directory (it is created if missing)",
            option=option,
        )

