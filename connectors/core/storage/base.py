"""The storage interface every backend implements, and the commit-point capability probe.

Two kinds of stores serve the same protocols:

- **rename stores** (local disks, HDFS): a file is written under a temp or staging name and
  made visible by an atomic rename;
- **object stores** (S3, GCS, Azure Blob): no atomic rename, but a whole-object PUT is
  visible whole or not at all, and a conditional PUT (``If-None-Match: *``,
  ``ifGenerationMatch=0``) creates an object only if it is absent.

What every protocol of this package needs is the common ground of both:

- :meth:`Storage.create`: **create-if-absent**, the commit point of every protocol. After a
  crash at any instant the object either holds all of ``data`` or does not exist, and of
  two writers creating one name exactly one succeeds; the other gets ``FileExistsError``.
  Local: temp file, fsync, ``link()`` (fails atomically when the name exists). HDFS: temp
  file, then RENAME, which the NameNode refuses onto an existing file. Object stores:
  conditional PUT.
- :meth:`Storage.write_atomic`: replace, for the few records that legitimately change (a
  sink's reset record). Never a commit point.
- :meth:`Storage.rename` only where :attr:`Storage.atomic_rename` is true; the file sink
  writes straight to final names on object stores instead.

:func:`check_create_if_absent` proves the commit point once per store and process: two
creates of one probe object, the second must fail. A store that lets both succeed (an S3
look-alike that ignores ``If-None-Match``) is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Iterator
from typing import IO, Any

from connectors.core.errors import StorageError
from connectors.core.storage.disk import NoHardLinks

log = logging.getLogger(__name__)

TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"
PROBE_PREFIX = ".eo-probe-"


def is_hidden(name: str) -> bool:
    """Temp files of an atomic write (and probe objects), invisible to listings."""
    return name.startswith(TEMP_PREFIX) or name.endswith(TEMP_SUFFIX)


def temp_name(final_name: str) -> str:
    return f"{TEMP_PREFIX}{final_name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"


class Storage(ABC):
    """Filesystem operations on absolute paths of one backend (see the module docstring)."""

    scheme: str = ""
    #: True where :meth:`rename` is atomic (local, HDFS); False on object stores.
    atomic_rename: bool = True
    #: How the store is named in messages ("local disk", "HDFS", "Amazon S3 bucket 'b'").
    kind: str = "storage"

    @abstractmethod
    def create(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data`` if nothing is there, atomically: the commit point.

        Raises ``FileExistsError`` when ``path`` exists (whatever it holds): the caller reads
        it and decides (a retry of its own write, or another writer won).
        """

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Write or replace ``path``; a reader sees the old or the new content, whole."""

    @abstractmethod
    def open_write(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A binary stream to a *new* file at ``path``, durable (and, on object stores,
        visible) once the block exits normally; an exception in the block leaves nothing
        visible on object stores (callers delete partial files on the others)."""

    @abstractmethod
    def read(self, path: str) -> bytes:
        """All bytes of ``path``; FileNotFoundError if it is missing (on every backend)."""

    @abstractmethod
    def list(self, path: str) -> list[str]:
        """Names (not paths) in directory ``path``, temp names hidden; [] if it is missing."""

    @abstractmethod
    def rename(self, src: str, dst: str, *, replace: bool = False) -> None:
        """Atomically move ``src`` to ``dst``. Raises FileExistsError if ``dst`` exists and
        ``replace`` is false, FileNotFoundError if ``src`` is missing. Object stores raise
        :class:`StorageError`: they cannot (see :attr:`atomic_rename`)."""

    @abstractmethod
    def delete(self, path: str, *, recursive: bool = False) -> bool:
        """Remove a file or directory; False if nothing was there (object stores cannot
        tell without one more request, and answer True)."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def is_dir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool:
        """A file (not a directory) is at ``path``."""
        return self.exists(path) and not self.is_dir(path)

    @abstractmethod
    def size(self, path: str) -> int: ...

    @abstractmethod
    def mkdirs(self, path: str) -> None: ...

    @abstractmethod
    def identity(self) -> Hashable:
        """What one capability probe covers: a filesystem, a NameNode, a bucket."""

    def delete_many(self, paths: Iterable[str]) -> int:
        """Delete files (not directories); missing ones are skipped. Returns how many were
        asked for. Object stores do it in bulk requests."""
        n = 0
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                self.delete(p)
            n += 1
        return n

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

    def check_create_if_absent(self, directory: str) -> None:
        """The capability probe (:func:`check_create_if_absent`) for this store."""
        check_create_if_absent(self, directory)


class WriteOnlyStream:
    """What the formats' writers ask of a stream beside ``write``/``tell``/``flush``: it
    writes, neither reads nor seeks, and ``close()`` only marks it closed, because the
    backend's context manager closes (and on local disks fsyncs) what is underneath."""

    closed = False

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


class CountingStream(WriteOnlyStream):
    """A write-only binary stream over another: counts bytes for ``tell()`` (pyarrow's
    writers need it; the hdfs client's writer answers 0)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.position = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.raw.write(view)  # type: ignore[arg-type]
        self.position += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        self.raw.flush()


# -- the capability probe ----------------------------------------------------------------------
_PROBED: dict[Hashable, str | None] = {}  # identity -> None (proved) or the refusal
_PROBE_LOCK = threading.Lock()


def check_create_if_absent(storage: Storage, directory: str) -> None:
    """Prove once per store and process that ``storage.create`` refuses a second create of
    one name; raise :class:`StorageError` naming the store if it does not.

    The probe object is a hidden name in ``directory`` (the state directory the caller is
    about to use), deleted afterwards. The verdict is cached per :meth:`Storage.identity`:
    a bucket or filesystem either enforces conditional creates or does not.
    """
    key = storage.identity()
    with _PROBE_LOCK:
        if key in _PROBED:
            refusal = _PROBED[key]
            if refusal is not None:
                raise StorageError(refusal)
            return
        refusal = _probe(storage, directory)
        _PROBED[key] = refusal
    if refusal is not None:
        raise StorageError(refusal)


def _probe(storage: Storage, directory: str) -> str | None:
    """The refusal, or None when the store enforces create-if-absent. Errors that say
    nothing about that (a full disk, an unreachable store, a missing bucket) are raised,
    and not cached: the next check probes again."""
    path = storage.join(directory, f"{PROBE_PREFIX}{uuid.uuid4().hex}")
    where = storage.url(directory)
    # A token, not a constant: a create whose answer was lost is retried by the client and
    # finds the object there; reading back our own token tells that from another writer.
    token = uuid.uuid4().hex.encode()
    try:
        storage.create(path, token)
    except StorageError:
        raise  # a full disk, unreachable, missing bucket, no permission: the backend's words
    except FileExistsError:
        if _read_back(storage, path) != token:
            return (f"{storage.kind} at {where}: a create-if-absent of a fresh probe name "
                    "found it already there; the store does not behave as a filesystem or "
                    "bucket")
        log.info("%s at %s: the probe's create was retried after its answer was lost, and "
                 "found its own object", storage.kind, where)
    except NoHardLinks as e:
        return (f"{storage.kind} at {where} cannot create a file atomically ({e}); the "
                "exactly-once commit points need a create-if-absent (a hard link on local "
                "disks); use a directory on another filesystem, HDFS or an object store")
    except OSError as e:
        raise StorageError(f"{storage.kind} at {where}: cannot write the probe object of "
                           f"the capability check ({e})") from e
    try:
        storage.create(path, uuid.uuid4().hex.encode())
    except FileExistsError:
        log.debug("%s at %s enforces create-if-absent", storage.kind, where)
        return None
    except StorageError as e:
        return (f"{storage.kind} at {where}: the second create of one probe object failed "
                f"with {e} instead of refusing it as existing; conditional creates are not "
                "supported, so the commit points cannot be made safe")
    finally:
        with contextlib.suppress(Exception):
            storage.delete(path)
    return (f"{storage.kind} at {where} does not enforce create-if-absent: two creates of "
            "one probe object both succeeded (a conditional PUT with If-None-Match: * was "
            "ignored). Two writers of one commit record could then both win, so nothing was "
            "written; use a store that enforces conditional writes (AWS S3, GCS, Azure "
            "Blob, MinIO, SeaweedFS >= 4, Cloudflare R2), HDFS or a local path")


def _read_back(storage: Storage, path: str) -> bytes | None:
    try:
        return storage.read(path)
    except FileNotFoundError:
        return None


def forget_probes() -> None:
    """Drop the cached probe verdicts, and which stores answered this process (tests: the
    next call to a store is a first contact again)."""
    from connectors.core import contact

    with _PROBE_LOCK:
        _PROBED.clear()
    contact.forget()
