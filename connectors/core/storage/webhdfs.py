"""HDFS through WebHDFS (the ``hdfs`` package): temp file + RENAME, atomic in the NameNode.

A NameNode or a DataNode that restarts is ridden through within the retry budget
(``storage.retryTimeout``, ``retry.py``): every call is run again on a refused or dropped
connection, a timeout (``storage.connectTimeout``, ``storage.requestTimeout``), a NameNode in
safe mode (``SafeModeException``, or ``RetriableException`` wrapping it), a standby NameNode
(``StandbyException``), or a DataNode's 5xx; from a point where that is safe:

- :meth:`WebHdfsStorage.create` writes a new temp file on every try (a write whose answer
  was lost leaves a hidden orphan, never a half-written name), then RENAMEs; a RENAME run
  again after its answer was lost finds its target there and reports "exists", which every
  caller reads back and compares (its own bytes: its own create).
- :meth:`WebHdfsStorage.open_write` spools the file locally (in memory up to 16 MiB, then in
  a temp file) and uploads it whole when the block ends, so a DataNode lost in the middle
  costs an upload again, not the task.

A NameNode this process has not reached yet is first asked one GETFILESTATUS through a
client whose timeouts are ``storage.connectTimeout`` (:meth:`WebHdfsStorage._reach`,
:func:`connectors.core.contact.first_contact`): any answer counts (safe mode, standby, an
error page), and silence until then fails naming the NameNode's address.
"""

from __future__ import annotations

import contextlib
import errno
import posixpath
import tempfile
from collections.abc import Callable, Hashable, Iterator
from typing import IO, Any, TypeVar

from connectors.core import contact
from connectors.core.errors import StorageError
from connectors.core.storage import stats
from connectors.core.storage.base import CountingStream, Storage, is_hidden, temp_name
from connectors.core.storage.options import StorageOptions
from connectors.core.storage.retry import Retried, RetryBudget

DEFAULT_WEBHDFS_PORT = 9870
#: a file of ``open_write`` stays in memory up to this size, then in a local temp file
SPOOL_BYTES = 16 * 1024 * 1024
_UPLOAD_CHUNK = 1024 * 1024
#: the NameNode's answers that a retry outlasts
_TRANSIENT_REMOTE = ("SafeModeException", "RetriableException", "StandbyException",
                     "ObserverRetryOnActiveException")
#: what a DataNode answers when the NameNode behind it is down or restarting (Hadoop's RPC
#: client names the network error it met in its exception class, and in the text)
_NAMENODE_UNREACHABLE = ("EOFException", "ConnectException", "SocketTimeoutException",
                         "NoRouteToHostException", "SocketException")
#: what a NameNode says while no DataNode has registered with it yet (just restarted, or
#: the DataNodes restarting): a plain IOException, told by its text
_NO_DATANODE = ("Failed to find datanode", "could only be written to 0 of the")
#: the HTTP client's errors (requests, urllib3) that a retry outlasts, by class name (and
#: Python's own ConnectionError): refused, reset, dropped, timed out, a body cut short
_TRANSIENT_CLIENT = frozenset({"ConnectionError", "Timeout", "ChunkedEncodingError",
                               "ProtocolError", "ReadTimeoutError", "IncompleteRead"})

T = TypeVar("T")


class WebHdfsStorage(Storage):
    """HDFS through the WebHDFS REST API (the ``hdfs`` package). RENAME is atomic in HDFS.

    ``base_url`` is the NameNode's HTTP address, e.g. ``http://namenode:9870``; ``options``
    the ``storage.*`` options that apply to HDFS (timeouts, the retry budget).
    """

    scheme = "hdfs"
    kind = "HDFS"

    def __init__(self, base_url: str, user: str | None = None, display: str | None = None,
                 options: StorageOptions | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.display = display or base_url
        self.options = options or StorageOptions()
        self.budget = RetryBudget.of(self.options)
        self._client: Any = None
        self._first_client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # a requests session does not pickle; rebuilt per process
        state["_client"] = state["_first_client"] = None
        return state

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, WebHdfsStorage)
            and other.base_url == self.base_url
            and other.user == self.user
            and other.options == self.options
        )

    def __hash__(self) -> int:
        return hash((self.base_url, self.user))

    def identity(self) -> Hashable:
        return ("hdfs", self.base_url)

    @property
    def client(self) -> Any:
        """The client of a NameNode that answered this process before."""
        if self._client is None:
            self._client = self._new_client(float(self.options.get("connectTimeout")),
                                            float(self.options.get("requestTimeout")))
        return self._client

    def _new_client(self, connect: float, request: float) -> Any:
        try:
            import hdfs
        except ImportError as e:  # pragma: no cover - hdfs is a core dependency
            raise StorageError(
                "HDFS paths need the 'hdfs' package: pip install pyspark-exactly-once"
            ) from e
        return hdfs.InsecureClient(self.base_url, user=self.user, timeout=(connect, request))

    def _reach(self, path: str) -> None:
        """A first contact, unless the NameNode answered this process before (module
        docstring)."""
        if contact.reached(self.identity()):
            return
        seconds = min(float(self.options.get("connectTimeout")),
                      float(self.options.get("retryTimeout")) or 0.1)
        if self._first_client is None:
            self._first_client = self._new_client(seconds, seconds)
        first = self._first_client

        def fail(e: Exception, attempts: int, took: float) -> StorageError:
            return StorageError(
                f"HDFS at {self.display}: nothing answered at the NameNode's address "
                f"{self.base_url} within storage.connectTimeout="
                f"{float(self.options.get('connectTimeout')):g}s ({attempts} attempts over "
                f"{took:.1f}s; {type(e).__name__}: {e}). Check the host and port of the URL "
                "(webhdfs:// names the NameNode's HTTP address; hdfs:// reaches it on port "
                f"{DEFAULT_WEBHDFS_PORT} unless webhdfsUrl says otherwise) and that the "
                "NameNode runs. A NameNode that never answered is not waited for; once it has "
                "answered, a restart is ridden through for storage.retryTimeout="
                f"{float(self.options.get('retryTimeout')):g}s")

        contact.first_contact(self.identity(), lambda left: first.status(path, strict=False),
                              timeout=seconds, fail=fail, answered=lambda e: not silent(e))

    def url(self, path: str) -> str:
        return self.display.rstrip("/") + path

    def _call(self, op: str, path: str, call: Callable[[], T]) -> T:
        """``call()`` within the retry budget, its errors in this package's terms."""
        where = self.url(path)

        def give_up(e: Exception, retried: Retried | None) -> BaseException | None:
            return _hdfs_error(op, where, e, retried)

        self._reach(path)
        return self.budget.run(call, transient=is_transient, give_up=give_up,
                               what=lambda: f"HDFS {op} {where}", store="hdfs", op=op)

    # -- writes -------------------------------------------------------------------------------
    def _write_temp(self, path: str, data: bytes) -> str:
        directory, name = posixpath.split(path)

        def write() -> str:
            tmp = posixpath.join(directory, temp_name(name))  # a new name on every try
            self.client.write(tmp, data=data, overwrite=False)
            return tmp

        return self._call("write", path, write)

    def create(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            self._call("rename", path, lambda: self._rename_onto_absent(tmp, path))
        except FileExistsError:
            stats.add(stats.CONFLICTS, "hdfs", "create")
            raise
        finally:
            with contextlib.suppress(Exception):
                self.client.delete(tmp)

    def _rename_onto_absent(self, tmp: str, path: str) -> None:
        """RENAME, which the NameNode refuses onto an existing file (WebHDFS answers
        false), atomically: create-if-absent with the content already complete."""
        import hdfs

        try:
            self.client.rename(tmp, path)
        except hdfs.HdfsError as e:
            if e.exception is None and self.client.status(path, strict=False) is not None:
                # Ours (a RENAME run again after its answer was lost) or another writer's:
                # the caller reads it back and compares.
                raise FileExistsError(errno.EEXIST, "exists", self.url(path)) from None
            raise

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            self.rename(tmp, path, replace=True)
        finally:
            with contextlib.suppress(Exception):
                self.client.delete(tmp)

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        # Spooled, then uploaded whole: the hdfs client's streaming writer cannot be run
        # again once a DataNode dropped it half-way (and its tell() answers 0).
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            yield CountingStream(spool)  # type: ignore[misc]
            tries = 0

            def upload() -> None:
                nonlocal tries
                tries += 1
                if tries > 1:
                    # A try that failed may have left the file open under a lease of the
                    # DataNode it wrote through: delete it (a new name is not ours to pick).
                    self.client.delete(path)
                spool.seek(0)
                self.client.write(path, data=iter(lambda: spool.read(_UPLOAD_CHUNK), b""),
                                  overwrite=False)

            self._call("write", path, upload)

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
        self._call("rename", src, lambda: self._rename_once(src, dst))

    def _rename_once(self, src: str, dst: str) -> None:
        import hdfs

        try:
            self.client.rename(src, dst)
        except hdfs.HdfsError as e:
            # Run again after a lost answer: the source is gone and the target there.
            if e.exception is None and self.client.status(src, strict=False) is None \
                    and self.client.status(dst, strict=False) is not None:
                return
            raise

    def delete(self, path: str, *, recursive: bool = False) -> bool:
        return bool(self._call("delete", path,
                               lambda: self.client.delete(path, recursive=recursive)))

    def mkdirs(self, path: str) -> None:
        self._call("mkdirs", path, lambda: self.client.makedirs(path))

    # -- reads --------------------------------------------------------------------------------
    def read(self, path: str) -> bytes:
        def read() -> bytes:
            with self.client.read(path) as reader:
                data: bytes = reader.read()
                return data

        return self._call("read", path, read)

    def _status(self, path: str) -> dict[str, Any] | None:
        status: dict[str, Any] | None = self._call(
            "stat", path, lambda: self.client.status(path, strict=False))
        return status

    def list(self, path: str) -> list[str]:
        status = self._status(path)
        if status is None or status.get("type") != "DIRECTORY":
            return []
        names = self._call("list", path, lambda: self.client.list(path))
        return sorted(n for n in names if not is_hidden(n))

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


def silent(e: BaseException) -> bool:
    """Nothing answered: refused, reset, dropped or timed out before an HTTP answer."""
    return bool({c.__name__ for c in type(e).__mro__} & _TRANSIENT_CLIENT)


def is_transient(e: BaseException) -> bool:
    """A NameNode or DataNode that is restarting, in safe mode, standby or unreachable."""
    if silent(e):
        # refused, reset, dropped, timed out, a body cut short: the call can run again
        return True
    if type(e).__name__ != "HdfsError":
        return False
    remote = getattr(e, "exception", None)
    if remote in _TRANSIENT_REMOTE or remote in _NAMENODE_UNREACHABLE:
        return True
    text = str(e)
    if "safe mode" in text.lower() or "StandbyException" in text:
        return True
    if any(words in text for words in _NO_DATANODE) or any(
            f"java.io.{name}" in text or f"java.net.{name}" in text
            for name in _NAMENODE_UNREACHABLE):
        return True
    # An answer that is not a NameNode exception: a DataNode's or a gateway's 5xx page.
    return remote is None and any(f" {code}" in text or text.startswith(str(code))
                                  for code in (500, 502, 503, 504))


def _hdfs_error(op: str, where: str, e: Exception, retried: Retried | None
                ) -> BaseException | None:
    """The error to raise for the WebHDFS call's ``e`` (None: ``e`` itself)."""
    if isinstance(e, (FileNotFoundError, FileExistsError, StorageError)):
        return None
    name = type(e).__name__
    if name == "HdfsError" or type(e).__module__.startswith(("hdfs", "requests", "urllib3")):
        # The NameNode's exception class, where it answered with one. Callers (the WAL,
        # the sinks) tell "not there" and "already there" apart as on local disks.
        remote = getattr(e, "exception", None)
        if remote == "FileNotFoundException":
            return FileNotFoundError(errno.ENOENT, f"HDFS {op}: {e}", where)
        if remote == "FileAlreadyExistsException":
            return FileExistsError(errno.EEXIST, f"HDFS {op}: {e}", where)
        tail = "" if retried is None else (
            f" ({retried}; the NameNode or DataNode did not come back in time: check them, "
            "then run it again)")
        return StorageError(f"HDFS {op} failed for {where}: {e}{tail}")
    return None
