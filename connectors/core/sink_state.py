"""The durable state of one sink in a directory: commit log, owner, task markers, retention.

The Kafka sink keeps it under ``walPath`` and the file sink under its output ``path``; this
class is the one implementation of what the two share::

    <root>/<log>/00000000000000000007.commit   batch 7 is committed (its commit info inside)
    <root>/<log>/00000000000000000007.json     a record the sink keeps per batch (file sink:
                                                the rename plan)
    <root>/sink.json                            owner record {"sink_id": ...} (Kafka sink)
    <root>/started/<batch:020d>/<writer:05d>.json   task markers (Kafka sink: started markers)

- **Commits.** A batch is committed once its commit marker exists; the marker holds the
  commit info (:meth:`record_commit`): ``sink_id``, ``rows``, ``committed_ms`` and the
  sink's own figures.
- **Ownership.** One directory belongs to one sink id, or a second sink would take the
  first one's batches for its own and skip them. The owner is the owner record where the
  sink keeps one (written by :meth:`claim`), else the sink id of the newest commit.
- **Admission.** :meth:`admit` is the one rule every task and every commit runs before it
  decides anything: ownership first, then the batch order (``core.sink.check_batch_order``).
- **Reset.** :meth:`reset` (``eo-connectors sink reset``) records a restart in
  ``<root>/<reset file>``: the batch offset that maps a new query's batch ids (from 0)
  above every id already committed, so names, recovery keys and commit markers never
  collide with the old ones.
- **Retention.** After a commit, :meth:`retain` deletes the task markers of that batch and
  older ones, and applies the log's retention rule (:meth:`WriteAheadLog.retain`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from connectors.core.sink import check_batch_order, ownership_error
from connectors.core.storage import Storage, storage_for
from connectors.core.wal import RETAIN_EVERY, WriteAheadLog, read_record

log = logging.getLogger(__name__)

OWNER_FILE = "sink.json"


class _Unset:
    pass


_UNSET = _Unset()
#: Facts that are written once and never change, read once per process: owner records
#: (by path).
_FACTS: dict[Any, str | None] = {}
#: The sink id of the newest commit marker of each log, read once per process and batch:
#: (store, log directory) -> (batch, sink id). One entry per log, replaced when a newer
#: commit comes, so a query that runs for months keeps one, not one per batch.
_NEWEST: dict[Any, tuple[int, str | None]] = {}


@dataclass(frozen=True)
class Owner:
    """The sink id a state directory belongs to, and the commit that says so (None when an
    owner record says so)."""

    sink_id: str | None
    batch_id: int | None = None


class SinkState:
    """The commit log, owner and task markers of one sink under ``root`` (any backend)."""

    def __init__(
        self,
        storage: Storage,
        root: str,
        *,
        log_kind: str,
        keep: int,
        owner_record: bool = False,
        markers: str | None = None,
        reset_file: str = "reset.json",
        what: str = "walPath",
        family: str = "sink",
        reset_flag: str = "--wal-path",
    ) -> None:
        self.storage = storage
        self.root = root
        self.log = WriteAheadLog(storage, root, log_kind)
        self.keep = keep
        self._owner_path = storage.join(root, OWNER_FILE) if owner_record else None
        self._markers = storage.join(root, markers) if markers else None
        self._reset_path = storage.join(root, reset_file)
        self.what = what
        self.family = family
        self.reset_flag = reset_flag
        #: the newest committed batch the last :meth:`admit` saw (spares a second listing)
        self.last_listed: int | None = None

    @classmethod
    def open(cls, url: str, **kwargs: Any) -> SinkState:
        storage, root = storage_for(url)
        return cls(storage, root, **kwargs)

    def url(self) -> str:
        return self.storage.url(self.root)

    # -- commits ---------------------------------------------------------------------------
    def last_committed(self) -> int | None:
        return self.log.last_committed()

    def is_committed(self, batch_id: int) -> bool:
        if self.log.is_committed(batch_id):
            return True
        last = self.log.last_committed()
        return last is not None and last >= batch_id

    def record_commit(self, batch_id: int, sink_id: str | None, rows: int,
                      **figures: Any) -> dict[str, Any]:
        """Mark ``batch_id`` committed: the commit point, a create-if-absent of the marker
        holding the commit info. If the marker exists already, an earlier attempt of this
        sink committed the batch (its info is returned), or another sink raced this one
        for the directory (:class:`SinkOwnershipError`)."""
        info = {"sink_id": sink_id, "rows": rows, **figures,
                "committed_ms": int(time.time() * 1000)}
        existing = self.log.commit(batch_id, info)
        if existing is None:
            return info
        if existing.get("sink_id") != sink_id:
            raise ownership_error(self.family, self.what, self.url(), existing.get("sink_id"),
                                  sink_id)
        log.info("%s: batch %d was committed already (by an earlier attempt)", self.url(),
                 batch_id)
        return existing

    def check_storage(self) -> None:
        """The store enforces create-if-absent (the commit points): probed once per store
        and process, before anything is written (``check_create_if_absent``)."""
        self.storage.check_create_if_absent(self.root)

    def commit_info(self, batch_id: int) -> dict[str, Any] | None:
        return self.log.commit_info(batch_id)

    def retain(self, batch_id: int, writers: Iterable[int] | None = None) -> None:
        """After ``batch_id`` committed: drop its task markers and apply the log's retention
        rule, keeping the newest ``keep`` batches. With ``writers`` (the committed tasks),
        their markers are deleted by name (one bulk request, no listing) and the markers of
        older batches, which a failed batch may have left, at every ``RETAIN_EVERY``-th
        batch; without, every marker of ``batch_id`` and older ones now."""
        if self._markers is not None:
            if writers is not None and batch_id % RETAIN_EVERY:
                paths = [self.marker_path(batch_id, w) for w in writers]
                if paths:
                    self.storage.delete_many(paths)
            else:
                self.purge_markers(batch_id)
        self.log.retain(batch_id, self.keep)

    # -- ownership -------------------------------------------------------------------------
    def owner(self, last: int | None | _Unset = _UNSET) -> Owner | None:
        """Who the directory belongs to: the owner record, where the sink keeps one (the
        Kafka sink), else the newest commit's sink id (``last``: the newest committed batch,
        when the caller has just listed the log). Both facts are written once and never
        change, so each is read once per process."""
        if self._owner_path is not None:
            key = (self.storage.identity(), self._owner_path)
            sink_id = _FACTS.get(key)
            if sink_id is None:
                record = read_record(self.storage, self._owner_path, "owner record")
                if record is not None:
                    sink_id = _FACTS[key] = str(record.get("sink_id"))
            if sink_id is not None:
                return Owner(sink_id)
            # No owner record (a WAL from before owner records): the newest commit says.
        if isinstance(last, _Unset):
            last = self.log.last_committed()
        if last is None:
            return None
        log_key = (self.storage.identity(), self.log.dir)
        known = _NEWEST.get(log_key)
        if known is not None and known[0] == last:
            committed_by = known[1]
        else:
            committed_by = (self.log.commit_info(last) or {}).get("sink_id")
            if known is None or known[0] < last:
                _NEWEST[log_key] = (last, committed_by)
        return Owner(committed_by if committed_by is None else str(committed_by), last)

    def check_owner(self, family: str, sink_id: str | None,
                    last: int | None | _Unset = _UNSET) -> None:
        """The one ownership rule: the directory is unowned or owned by ``sink_id``.
        A path written by a sink without an id is not any named sink's, and the reverse."""
        owner = self.owner(last)
        if owner is not None and owner.sink_id != sink_id:
            raise ownership_error(family, self.what, self.url(), owner.sink_id, sink_id)

    def claim(self, family: str, sink_id: str) -> None:
        """Record ``sink_id`` as the owner (create-if-absent of the owner record) unless
        another sink owns the directory; a concurrent claim that won is checked too."""
        self.check_owner(family, sink_id)
        if self._owner_path is not None and self.owner() is None:
            try:
                self.storage.create(self._owner_path, json.dumps({"sink_id": sink_id}).encode())
            except FileExistsError:
                self.check_owner(family, sink_id)  # ours already, or a concurrent claim won

    def admit(self, family: str, sink_id: str | None, batch_id: int) -> bool:
        """Ownership, then the batch order: True to write ``batch_id`` (the sink's
        numbering), False for a replay of the last committed batch; raises otherwise.
        One listing of the log (and, once per process, the owner's record)."""
        last = self.last_listed = self.last_committed()
        self.check_owner(family, sink_id, last)
        reset = self.reset_command(sink_id)
        if last is not None and batch_id < last:
            return check_batch_order(family, sink_id, batch_id, last, self.url(), reset,
                                     self.batch_offset())
        return check_batch_order(family, sink_id, batch_id, last, self.url(), reset)

    def reset_command(self, sink_id: str | None) -> str:
        """The command that records a restart of this sink (named in errors)."""
        return f"eo-connectors sink reset {self.reset_flag} {self.url()}" + (
            f" --sink-id {sink_id}" if sink_id else "")

    # -- reset -----------------------------------------------------------------------------
    def reset_record(self) -> dict[str, Any] | None:
        return read_record(self.storage, self._reset_path, "reset record")

    def batch_offset(self) -> int:
        record = self.reset_record()
        return int(record.get("batch_offset", 0)) if record else 0

    def reset(self, family: str, sink_id: str | None) -> dict[str, Any]:
        """Record a restart: the next query's batch ids (from 0) map above every committed
        one. Run it with the query stopped. Returns the reset record."""
        self.check_owner(family, sink_id)
        record = self.reset_record() or {"batch_offset": 0, "resets": []}
        last = self.last_committed()
        if last is not None:
            record["batch_offset"] = last + 1
        record.setdefault("resets", []).append({
            "sink_id": sink_id, "last_committed": last,
            "batch_offset": record["batch_offset"], "at_ms": int(time.time() * 1000)})
        self.storage.write_atomic(self._reset_path, json.dumps(record).encode())
        return record

    # -- task markers ----------------------------------------------------------------------
    def _marker_dir(self, batch_id: int) -> str:
        if self._markers is None:
            raise ValueError("this sink state keeps no task markers")
        return self.storage.join(self._markers, f"{batch_id:020d}")

    def marker_path(self, batch_id: int, writer: int) -> str:
        return self.storage.join(self._marker_dir(batch_id), f"{writer:05d}.json")

    def get_marker(self, batch_id: int, writer: int) -> dict[str, Any] | None:
        path = self.marker_path(batch_id, writer)
        return read_record(self.storage, path, f"task marker {batch_id}/{writer}")

    def put_marker(self, batch_id: int, writer: int, data: bytes) -> None:
        """Create the task marker; ``FileExistsError`` if another attempt created it."""
        self.storage.create(self.marker_path(batch_id, writer), data)

    def marker_batches(self) -> list[int]:
        if self._markers is None:
            return []
        return sorted(int(n) for n in self.storage.list(self._markers) if n.isdigit())

    def purge_markers(self, up_to_batch: int) -> int:
        """Delete the markers of every batch <= ``up_to_batch``; returns the batches purged."""
        deleted = 0
        for b in self.marker_batches():
            if b <= up_to_batch and self.storage.delete(self._marker_dir(b), recursive=True):
                deleted += 1
        return deleted
