"""Write-ahead log: small JSON records, one file each, atomic on every backend.

Layout (every record and marker a create: docs/design.md, "Storage: the commit point is a
create")::

    <walPath>/<kind>/00000000000000000007.json     record of window/batch 7
    <walPath>/<kind>/00000000000000000007.commit   marker: window 7 is committed

Every record and marker is written once, with :meth:`Storage.create` (create-if-absent: a
hard link or RENAME of a complete temp file, or a conditional PUT on object stores), so
after a crash at any instant a record is either fully there or not there, and of two
writers racing for one ``seq`` exactly one wins. ``seq`` is the window id (Spark's
``batchId`` or a ``KafkaWindows`` window id).

This is Apex's WindowDataManager: ``append`` before the window's data moves, ``commit``
once it is durable downstream, ``purge`` what no replay can need any more.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from connectors.core.errors import WalError
from connectors.core.storage import Storage, storage_for

log = logging.getLogger(__name__)

RECORD_EXT = ".json"
COMMIT_EXT = ".commit"
SEQ_WIDTH = 20
#: Retention (``WriteAheadLog.retain``) runs when a committed seq is a multiple of this.
RETAIN_EVERY = 10


def _name(seq: int, ext: str) -> str:
    if seq < 0:
        raise WalError(f"WAL sequence numbers are >= 0, got {seq}")
    return f"{seq:0{SEQ_WIDTH}d}{ext}"


def _seqs(names: list[str], ext: str) -> list[int]:
    """The sequence numbers of the ``ext`` files among ``names``, ascending."""
    return sorted(s for n in names if (s := _seq(n, ext)) is not None)


def _seq(name: str, ext: str) -> int | None:
    if not name.endswith(ext):
        return None
    stem = name[: -len(ext)]
    return int(stem) if stem.isdigit() else None


def encode(record: dict[str, Any]) -> bytes:
    """Canonical JSON (sorted keys), so a replayed append can be compared byte for byte."""
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def read_record(storage: Storage, path: str, what: str) -> dict[str, Any] | None:
    """The JSON record at ``path``, or None when there is none. ``what`` names it in errors.

    Every small state file (WAL records and commit markers, sink owner records, task
    markers) is read here, so "missing" and "unreadable" mean the same everywhere.
    """
    try:
        data = storage.read(path)
    except FileNotFoundError:
        return None
    except Exception as e:
        if not storage.exists(path):
            return None
        raise WalError(f"{what}: cannot read {storage.url(path)}: {e}") from e
    return _decode(data, what)


def create_or_same(storage: Storage, path: str, data: bytes, what: str = "record") -> bool:
    """Create ``path`` with ``data``; True if this call created it, False if identical
    bytes were already there (a replay, or this writer's own create retried after its
    answer was lost); raises :class:`WalError` if different bytes were (another writer's
    decision stands)."""
    existing = _create_or_existing(storage, path, data)
    if existing is None:
        return True
    if existing == data:
        return False
    raise WalError(
        f"{storage.url(path)}: {what} already exists with different content (existing "
        f"{existing[:200]!r}, new {data[:200]!r}); refusing to overwrite it"
    )


def _create_or_existing(storage: Storage, path: str, data: bytes) -> bytes | None:
    """Create ``path`` with ``data``: None when this call created it, else the bytes there.

    The create is the commit point on every store, and its answer can be lost: a
    conditional PUT that succeeded and whose response never arrived is sent again by the
    client and answered 412; a RENAME on HDFS run again finds its target there. The
    writer's own object then reads back byte for byte as ``data``, so callers that compare
    (``create_or_same``, :meth:`WriteAheadLog.create`, :meth:`WriteAheadLog.commit`) tell
    their own create from another writer's: every record carries what makes it one
    writer's (a window's offsets, a plan's time and files, a commit's time and sink id)."""
    try:
        storage.create(path, data)
        return None
    except FileExistsError:
        try:
            return storage.read(path)
        except FileNotFoundError:
            raise WalError(f"{storage.url(path)}: existed, but was gone before it could be "
                           "read; something else deletes in this directory") from None


def _own(storage: Storage, path: str, data: bytes, existing: bytes) -> bool:
    """The existing bytes are this call's own (its create retried after a lost answer)."""
    if existing != data:
        return False
    log.info("%s: already there with this writer's bytes (its create was retried after "
             "the answer was lost, or replayed): taken as its own", storage.url(path))
    return True


def _decode(data: bytes, what: str) -> dict[str, Any]:
    try:
        # A commit marker may be an empty file: it holds no info.
        value: dict[str, Any] = json.loads(data) if data.strip() else {}
    except ValueError as e:
        raise WalError(f"{what} is not valid JSON: {e}") from e
    return value


class WriteAheadLog:
    """An append-only log of JSON records under ``<root>/<kind>`` on any :class:`Storage`."""

    def __init__(self, storage: Storage, root: str, kind: str) -> None:
        self.storage = storage
        self.root = root
        self.kind = kind
        self.dir = storage.join(root, kind)
        #: files (records and markers) in the log as its last listing here saw them, less
        #: what the purge after it deleted; None before any (the source's metrics read it)
        self.files: int | None = None

    @classmethod
    def open(cls, url: str, kind: str, **storage_kwargs: Any) -> WriteAheadLog:
        storage, path = storage_for(url, **storage_kwargs)
        return cls(storage, path, kind)

    def __repr__(self) -> str:
        return f"WriteAheadLog({self.storage.url(self.dir)!r})"

    # -- records ------------------------------------------------------------------------
    def append(self, seq: int, record: dict[str, Any]) -> bool:
        """Write record ``seq``. Returns False if an identical record is already there (a
        replay, or this call's own create whose answer was lost: it cannot tell the two
        apart, and neither is an error).

        Write-once: a different record under an existing ``seq`` raises :class:`WalError`,
        because it means two planners disagree about what window ``seq`` holds.
        """
        path = self.storage.join(self.dir, _name(seq, RECORD_EXT))
        data = encode(record)
        if create_or_same(self.storage, path, data):
            return True
        return False

    def create(self, seq: int, record: dict[str, Any]) -> dict[str, Any] | None:
        """Create record ``seq`` unless one exists; returns the existing record (None when
        this call created it, or when the existing one holds this call's very bytes: its
        own create, retried after the answer was lost). For records whose content
        legitimately differs between two writers (the file sink's plan, which carries the
        time it was made): the caller decides what another writer's record means."""
        path = self.storage.join(self.dir, _name(seq, RECORD_EXT))
        data = encode(record)
        existing = _create_or_existing(self.storage, path, data)
        if existing is None or _own(self.storage, path, data, existing):
            return None
        return _decode(existing, f"{self!r}: record {seq}")

    def get(self, seq: int) -> dict[str, Any] | None:
        path = self.storage.join(self.dir, _name(seq, RECORD_EXT))
        return read_record(self.storage, path, f"{self!r}: record {seq}")

    def _names(self) -> list[str]:
        return self.storage.list(self.dir)

    def seqs(self) -> list[int]:
        """Sequence numbers of all records, ascending."""
        return _seqs(self._names(), RECORD_EXT)

    def committed_seqs(self) -> list[int]:
        return _seqs(self._names(), COMMIT_EXT)

    def listing(self) -> tuple[list[int], list[int]]:
        """``(seqs, committed_seqs)`` from one listing of the directory."""
        names = self._names()
        self.files = len(names)
        return _seqs(names, RECORD_EXT), _seqs(names, COMMIT_EXT)

    def last(self) -> tuple[int, dict[str, Any]] | None:
        """The record with the highest seq, or None for an empty log."""
        for seq in reversed(self.seqs()):
            record = self.get(seq)
            if record is not None:
                return seq, record
        return None

    # -- commit markers -----------------------------------------------------------------
    def commit(self, seq: int, info: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Mark ``seq`` committed, once: the marker (holding ``info``) is created if absent.
        Returns None when this call committed it (or the marker holds this call's very
        bytes: its create retried after a lost answer, or a replay of the same info), else
        the info of the existing marker (an earlier attempt's commit, or a racing
        writer's)."""
        path = self.storage.join(self.dir, _name(seq, COMMIT_EXT))
        data = encode(info or {})
        existing = _create_or_existing(self.storage, path, data)
        if existing is None or _own(self.storage, path, data, existing):
            return None
        return _decode(existing, f"{self!r}: commit marker {seq}") or {}

    def is_committed(self, seq: int) -> bool:
        return self.storage.exists(self.storage.join(self.dir, _name(seq, COMMIT_EXT)))

    def commit_info(self, seq: int) -> dict[str, Any] | None:
        path = self.storage.join(self.dir, _name(seq, COMMIT_EXT))
        return read_record(self.storage, path, f"{self!r}: commit marker {seq}")

    def last_committed(self) -> int | None:
        seqs = self.committed_seqs()
        return seqs[-1] if seqs else None

    # -- retention ----------------------------------------------------------------------
    def retain(self, newest: int, keep: int) -> int:
        """The retention rule of every log in this package (the source's windows, the sinks'
        commit logs): after seq ``newest`` committed, keep the ``keep`` newest seqs (and any
        newer ones) and delete older records and markers. It runs at every
        ``RETAIN_EVERY``-th seq, so a log on HDFS is not listed at every commit; between two
        runs up to ``keep + RETAIN_EVERY - 1`` entries stay. Returns the files deleted."""
        if keep < 1:
            raise WalError(f"{self!r}: retention must keep at least the newest entry")
        if newest % RETAIN_EVERY:
            return 0
        return self.purge(newest - keep + 1, keep_last=0)

    def purge(self, before_seq: int, keep_last: int = 10) -> int:
        """Delete records and markers with seq < ``before_seq``, but keep the newest
        ``keep_last`` records for inspection. Returns how many files were deleted."""
        names = self._names()
        seqs = _seqs(names, RECORD_EXT)
        keep = set(seqs[-keep_last:]) if keep_last > 0 else set()
        doomed = []
        for name in names:
            seq = _seq(name, RECORD_EXT)
            if seq is None:
                seq = _seq(name, COMMIT_EXT)
            if seq is None or seq >= before_seq or seq in keep:
                continue
            doomed.append(self.storage.join(self.dir, name))
        deleted = self.storage.delete_many(doomed) if doomed else 0
        self.files = len(names) - deleted
        if deleted:
            log.debug("%r: purged %d files before %d", self, deleted, before_seq)
        return deleted
