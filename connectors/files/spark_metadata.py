"""Spark's file-sink log (``<path>/_spark_metadata``), written by the ``eo_files`` sink.

When ``<path>/_spark_metadata`` exists, ``spark.read.parquet(path)`` (and every Spark file
source) lists only the files named in this log instead of listing the directory, exactly as
for Spark's own streaming file sink. Keeping the log therefore makes Spark readers see the
committed files only, even if someone drops a stray file into the output directory.

Format (Spark's ``FileStreamSinkLog`` / ``CompactibleFileStreamLog``, version 1):

- one file per batch, named by the batch id (``7``); every ``compactInterval``-th batch
  (``(id + 1) % 10 == 0``) is a *compaction* file ``9.compact`` that holds every live
  entry of all batches up to and including it;
- each file is ``v1`` followed by one JSON line per file::

      {"path":"file:///out/part-...parquet","size":N,"isDir":false,
       "modificationTime":ms,"blockReplication":1,"blockSize":N,"action":"add"}

- a reader takes the highest batch id, then reads the latest compaction at or below it plus
  every delta after it; a missing delta is an error, so batch ids must have no gaps. Gaps in
  our batch ids (e.g. window ids that jump) are filled with empty entries.

Spark derives the compaction interval from the ``.compact`` files present (the distance
between the two newest). We always write with Spark's default, 10; do not change
``spark.sql.streaming.fileSink.log.compactInterval`` for readers of this directory.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from connectors.core.errors import FileSinkError
from connectors.core.storage import LocalStorage, Storage
from connectors.core.wal import create_or_same

log = logging.getLogger(__name__)

METADATA_DIR = "_spark_metadata"
VERSION = "v1"
COMPACT_SUFFIX = ".compact"
COMPACT_INTERVAL = 10  # spark.sql.streaming.fileSink.log.compactInterval's default
MIN_BATCHES_TO_RETAIN = 100  # spark.sql.streaming.minBatchesToRetain's default
_LOCAL_BLOCK_SIZE = 32 * 1024 * 1024  # what Hadoop's local filesystem reports
_HDFS_BLOCK_SIZE = 128 * 1024 * 1024

#: (absolute path in the storage, size in bytes, modification time in ms)
Entry = tuple[str, int, int]

#: Log files are written once and never change: what this process wrote or read, by
#: (store, log directory, batch id), so a compaction need not read its deltas back. Only the
#: newest compaction and the deltas after it are ever needed again: writing a compaction
#: forgets the log's older batches (:func:`_forget_before`), or a query running for months
#: would keep every batch, and every compaction's list of all the files before it.
_READ: dict[tuple[object, str, int], list[dict[str, Any]]] = {}


def _forget_before(identity: object, directory: str, batch_id: int) -> None:
    """Drop what :data:`_READ` holds of the log ``directory`` below ``batch_id``."""
    for key in [k for k in _READ if k[0] == identity and k[1] == directory
                and k[2] < batch_id]:
        del _READ[key]


def is_compaction(batch_id: int, interval: int = COMPACT_INTERVAL) -> bool:
    return (batch_id + 1) % interval == 0


def batch_file_name(batch_id: int, interval: int = COMPACT_INTERVAL) -> str:
    return f"{batch_id}{COMPACT_SUFFIX}" if is_compaction(batch_id, interval) else str(batch_id)


def parse_batch_id(name: str) -> int | None:
    stem = name[: -len(COMPACT_SUFFIX)] if name.endswith(COMPACT_SUFFIX) else name
    return int(stem) if stem.isdigit() else None


class SparkMetadataLog:
    """Reads and appends Spark's ``_spark_metadata`` log on any :class:`Storage`."""

    def __init__(self, storage: Storage, base: str, interval: int = COMPACT_INTERVAL) -> None:
        self.storage = storage
        self.base = base
        self.dir = storage.join(base, METADATA_DIR)
        self.interval = interval

    # -- reading --------------------------------------------------------------------------
    def batch_ids(self) -> list[int]:
        ids = (parse_batch_id(n) for n in self.storage.list(self.dir))
        return sorted(i for i in ids if i is not None)

    def _path(self, batch_id: int) -> str:
        return self.storage.join(self.dir, batch_file_name(batch_id, self.interval))

    def read(self, batch_id: int) -> list[dict[str, Any]]:
        key = (self.storage.identity(), self.dir, batch_id)
        if key not in _READ:
            _READ[key] = self._read(batch_id)
        return _READ[key]

    def _read(self, batch_id: int) -> list[dict[str, Any]]:
        path = self._path(batch_id)
        try:
            text = self.storage.read(path).decode("utf-8")
        except FileNotFoundError:
            raise FileSinkError(
                f"eo_files: {self.storage.url(path)!r} is missing: the Spark metadata log has "
                "a gap"
            ) from None
        lines = text.split("\n")
        if not lines or lines[0].strip() != VERSION:
            raise FileSinkError(
                f"eo_files: {self.storage.url(path)!r} does not start with {VERSION!r}: not a "
                "Spark file-sink log this sink can extend"
            )
        return [json.loads(line) for line in lines[1:] if line.strip()]

    def all_entries(self, upto: int | None = None) -> list[dict[str, Any]]:
        """Live entries of every batch ``<= upto`` (all batches if None), Spark's way."""
        ids = [i for i in self.batch_ids() if upto is None or i <= upto]
        if not ids:
            return []
        latest = ids[-1]
        start = max(0, (latest + 1) // self.interval * self.interval - 1)
        present = set(ids)
        merged: dict[str, dict[str, Any]] = {}
        for b in range(start, latest + 1):
            if b not in present:
                if b == start and not is_compaction(b, self.interval):
                    continue
                raise FileSinkError(
                    f"eo_files: Spark metadata log {self.storage.url(self.dir)!r} lacks batch "
                    f"{b} (needed to read batch {latest})"
                )
            for e in self.read(b):
                if e.get("action") == "delete":
                    merged.pop(e["path"], None)
                else:
                    merged[e["path"]] = e
        return list(merged.values())

    # -- writing --------------------------------------------------------------------------
    def entry(self, path: str, size: int, mtime_ms: int) -> dict[str, Any]:
        local = isinstance(self.storage, LocalStorage)
        return {
            "path": self.file_url(path),
            "size": int(size),
            "isDir": False,
            "modificationTime": int(mtime_ms),
            "blockReplication": 1,
            "blockSize": _LOCAL_BLOCK_SIZE if local else _HDFS_BLOCK_SIZE,
            "action": "add",
        }

    def file_url(self, path: str) -> str:
        """The URI Spark stores (Hadoop ``Path.toUri``): ``%`` and spaces percent-encoded."""
        quoted = quote(path, safe="/=:@!$&'()*+,;-._~")
        if isinstance(self.storage, LocalStorage):
            return "file://" + quoted
        return self.storage.url("").rstrip("/") + quoted

    def add(self, batch_id: int, files: Sequence[Entry], previous: int | None = None) -> None:
        """Record ``files`` as batch ``batch_id`` (idempotent: a replay finds the same
        bytes). ``previous``: the batch the caller knows is the log's newest (its own last
        commit), which spares listing the log."""
        entries = [self.entry(p, size, mtime) for p, size, mtime in files]
        if previous is not None and previous == batch_id - 1 and \
                (self.storage.identity(), self.dir, previous) in _READ:
            self._write(batch_id, entries)  # the common case: no gap, nothing later
            if is_compaction(batch_id, self.interval):
                self._expire(batch_id)
            return
        ids = self.batch_ids()
        later = [i for i in ids if i > batch_id]
        if later:
            raise FileSinkError(
                f"eo_files: Spark metadata log {self.storage.url(self.dir)!r} already has batch "
                f"{later[-1]} > {batch_id}: another writer used this directory; use a new path"
            )
        before = [i for i in ids if i < batch_id]
        first_needed = max(0, (batch_id + 1) // self.interval * self.interval - 1)
        if not before:
            gap_start = first_needed
        elif batch_id - before[-1] > 2 * self.interval:
            gap_start = self._jump(before[-1], first_needed)
        else:
            gap_start = before[-1] + 1
        for b in range(gap_start, batch_id):
            self._write(b, [])
        self._write(batch_id, entries)
        if is_compaction(batch_id, self.interval):
            self._expire(batch_id)

    def _jump(self, last: int, compaction: int) -> int:
        """A large gap in batch ids: carry the state into one compaction file just before
        the new batch and drop older files, so readers need not read thousands of empty
        deltas. Returns the next id to fill."""
        if not is_compaction(compaction, self.interval):
            return last + 1
        carried = self.all_entries(last)
        self._write_file(compaction, carried)
        for b in self.batch_ids():
            if b < compaction:
                self.storage.delete(self._path_any(b))
        return compaction + 1

    def _path_any(self, batch_id: int) -> str:
        for name in (str(batch_id), f"{batch_id}{COMPACT_SUFFIX}"):
            path = self.storage.join(self.dir, name)
            if self.storage.exists(path):
                return path
        return self._path(batch_id)

    def _write(self, batch_id: int, entries: list[dict[str, Any]]) -> None:
        if is_compaction(batch_id, self.interval):
            merged = {e["path"]: e for e in self.all_entries(batch_id - 1)}
            for e in entries:
                merged[e["path"]] = e
            entries = list(merged.values())
        self._write_file(batch_id, entries)

    def _write_file(self, batch_id: int, entries: list[dict[str, Any]]) -> None:
        lines = [VERSION] + [json.dumps(e, separators=(",", ":")) for e in entries]
        # Created once: a replay of the batch builds the same bytes; different bytes mean
        # another writer's log, which must not be overwritten.
        create_or_same(self.storage, self._path(batch_id), "\n".join(lines).encode("utf-8"),
                       "Spark metadata log entry")
        identity = self.storage.identity()
        _READ[(identity, self.dir, batch_id)] = entries
        if is_compaction(batch_id, self.interval):
            _forget_before(identity, self.dir, batch_id)

    def _expire(self, compaction_id: int) -> None:
        """Delete files older than needed, as Spark does after a compaction."""
        min_batch = compaction_id + 1 - MIN_BATCHES_TO_RETAIN
        if min_batch < self.interval:
            return
        min_compaction = min_batch - (min_batch % self.interval) - 1
        old = [b for b in self.batch_ids() if b < min_compaction]
        if old:
            self.storage.delete_many([self._path(b) for b in old])
