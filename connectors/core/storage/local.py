"""Local disks: temp file + fsync + link/rename + directory fsync, riding through a full disk.

Every write that can meet a full disk (``ENOSPC``, ``EDQUOT``) or a failing one (``EIO``)
is retried within the retry budget (``storage.retryTimeout``, ``retry.py``), and tells the
disk's condition from "cannot create a file atomically" (``disk.py``):

- :meth:`LocalStorage.create` and :meth:`LocalStorage.write_atomic` run whole again: a new
  temp file, written, fsynced, then linked (or renamed) into place. A temp file the disk
  filled up halfway is deleted, and is hidden (``.``-prefixed) while it exists; the final
  name only ever appears for complete, durable content.
- :meth:`LocalStorage.open_write` streams through :class:`DiskStream`, which writes with
  ``os.write`` and, on ``ENOSPC``/``EDQUOT``, writes the same bytes again from the same
  offset once there is space: a file sink task rides through a full disk mid-file. An
  ``EIO`` or a failed fsync fails the stream (what reached the file can no longer be
  trusted); the caller deletes the partial file and its task is retried by Spark.
- :meth:`LocalStorage.rename` and :meth:`LocalStorage.mkdirs` retry a directory entry the
  full disk had no room for.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable, Hashable, Iterator
from typing import IO, Any, TypeVar

from connectors.core.errors import StorageError
from connectors.core.storage import stats
from connectors.core.storage.base import Storage, WriteOnlyStream, is_hidden, temp_name
from connectors.core.storage.disk import NO_LINK, NoHardLinks, NotRetried, disk_error, is_retried
from connectors.core.storage.options import StorageOptions
from connectors.core.storage.retry import Retried, RetryBudget

log = logging.getLogger(__name__)

T = TypeVar("T")


class LocalStorage(Storage):
    """POSIX filesystem: temp file + fsync + ``link``/``os.replace`` + directory fsync.
    ``options``: the ``storage.*`` options that apply to local disks (the retry budget)."""

    scheme = "file"
    kind = "local disk"

    def __init__(self, options: StorageOptions | None = None) -> None:
        self.options = options or StorageOptions()
        self.budget = RetryBudget.of(self.options)

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def url(self, path: str) -> str:
        return "file://" + os.path.abspath(path)

    def identity(self) -> Hashable:
        return ("file",)

    # -- the retry budget ---------------------------------------------------------------------
    def retrying(self, op: str, path: str, call: Callable[[], T]) -> T:
        """``call()`` within the retry budget: a full or failing disk is waited out; when
        the budget is spent (or the filesystem is read-only) the error names the disk's
        condition, the path and its free space."""

        def give_up(e: Exception, retried: Retried | None) -> BaseException | None:
            if isinstance(e, OSError):
                return disk_error(e, self.url(path), path, retried)
            return None

        return self.budget.run(call, transient=is_retried, give_up=give_up,
                               what=lambda: f"local disk: {op} {self.url(path)}",
                               store="file", op=op)

    # -- writes -------------------------------------------------------------------------------
    def _write_temp(self, path: str, data: bytes) -> str:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, temp_name(os.path.basename(path)))
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return tmp

    def create(self, path: str, data: bytes) -> None:
        try:
            self.retrying("create", path, lambda: self._create(path, data))
        except FileExistsError:
            stats.add(stats.CONFLICTS, "file", "create")
            raise

    def _create(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            # link() fails with EEXIST, atomically, when the name exists: create-if-absent
            # with the content already durable (O_EXCL alone would expose a partial file).
            os.link(tmp, path)
        except OSError as e:
            if e.errno in NO_LINK:
                raise NoHardLinks(e.errno, f"link() is not supported here: {e.strerror}",
                                  path) from e
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(os.path.dirname(path) or ".")

    def write_atomic(self, path: str, data: bytes) -> None:
        self.retrying("write", path, lambda: self._write_atomic(path, data))

    def _write_atomic(self, path: str, data: bytes) -> None:
        tmp = self._write_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(os.path.dirname(path) or ".")

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[IO[bytes]]:
        directory = os.path.dirname(path) or "."
        self.mkdirs(directory)
        fd = self.retrying("create", path, lambda: os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
        stream = DiskStream(self, fd, path)
        try:
            yield stream  # type: ignore[misc]
            try:
                os.fsync(fd)
            except OSError as e:
                # Not retried: after a failed fsync the kernel may have dropped dirty pages.
                error = disk_error(e, self.url(path), path, None)
                if error is None:
                    raise
                raise error from e
        finally:
            os.close(fd)
        _fsync_dir(directory)

    def rename(self, src: str, dst: str, *, replace: bool = False) -> None:
        self.retrying("rename", dst, lambda: self._rename(src, dst, replace))

    def _rename(self, src: str, dst: str, replace: bool) -> None:
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

    def mkdirs(self, path: str) -> None:
        self.retrying("mkdirs", path, lambda: os.makedirs(path, exist_ok=True))

    # -- reads and deletes (they need no space) ----------------------------------------------
    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def list(self, path: str) -> list[str]:
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            raise StorageError(
                f"{self.url(path)} is expected to be a directory, but a file of that name "
                "is in the way; give a path that is a directory or does not exist yet"
            ) from None
        return sorted(n for n in names if not is_hidden(n))

    def delete(self, path: str, *, recursive: bool = False) -> bool:
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

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStorage) and other.options == self.options

    def __hash__(self) -> int:
        return hash("local")


class DiskStream(WriteOnlyStream):
    """A write-only stream on a file descriptor that rides through a full disk: each
    ``write`` goes out with ``os.write`` (which writes some bytes or fails having written
    none), and a write that fails with ``ENOSPC``/``EDQUOT`` is made again from the same
    offset within the retry budget. Unbuffered: the formats' writers buffer (pyarrow)."""

    def __init__(self, storage: LocalStorage, fd: int, path: str) -> None:
        self.storage = storage
        self.fd = fd
        self.path = path

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += self._write_some(view[done:])
        return done

    def _write_some(self, view: memoryview) -> int:
        def once() -> int:
            try:
                return os.write(self.fd, view)
            except OSError as e:
                if e.errno == errno.EIO:  # the file's earlier pages are suspect: not retried
                    raise NotRetried(e.errno, e.strerror, self.path) from e
                raise

        return self.storage.retrying("write", self.path, once)

    def flush(self) -> None:
        """Nothing is buffered here."""

    def tell(self) -> int:
        return os.lseek(self.fd, 0, os.SEEK_CUR)


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
