"""Local disks: temp file + fsync + link/rename + directory fsync."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Hashable, Iterator
from typing import IO

from connectors.core.errors import StorageError
from connectors.core.storage.base import Storage, is_hidden, temp_name


class LocalStorage(Storage):
    """POSIX filesystem: temp file + fsync + ``link``/``os.replace`` + directory fsync."""

    scheme = "file"
    kind = "local disk"

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def url(self, path: str) -> str:
        return "file://" + os.path.abspath(path)

    def identity(self) -> Hashable:
        return ("file",)

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
        tmp = self._write_temp(path, data)
        try:
            # link() fails with EEXIST, atomically, when the name exists: create-if-absent
            # with the content already durable (O_EXCL alone would expose a partial file).
            os.link(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(os.path.dirname(path) or ".")

    def write_atomic(self, path: str, data: bytes) -> None:
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
        except NotADirectoryError:
            raise StorageError(
                f"{self.url(path)} is expected to be a directory, but a file of that name "
                "is in the way; give a path that is a directory or does not exist yet"
            ) from None
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
