"""The source's window WAL: ``<walPath>/source`` (docs/design.md,
"Kafka source: window WAL and commits").

One record per planned window, ``{"window": 7, "start": {...}, "end": {...}}`` with the
offsets in Spark's offset JSON (what ``python -m connectors wal show`` prints), and a commit
marker per committed window. The planner hands windows in and out as typed offsets; the
JSON form exists only on disk.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from connectors.core.storage import StorageOptions
from connectors.core.wal import WriteAheadLog
from connectors.kafka.source.offsets import Offsets, decode_offsets, encode_offsets

log = logging.getLogger(__name__)

WAL_KIND = "source"


@dataclass(frozen=True)
class Window:
    """One planned window: ``[start, end)`` per partition (next offsets to read)."""

    window: int
    start: Offsets
    end: Offsets


class WindowLog:
    """The windows of one source's WAL, on any storage backend (opened on first use).

    The newest window this object wrote or read, and whether it committed it, are kept in
    memory (Spark keeps one planner per streaming query alive across micro-batches), so a
    steady micro-batch costs two creates: its window record and its commit marker, and no
    listing. Records are created once (a second planner racing for one window id gets
    :class:`WalError`), so the memory cannot go stale without an error.
    """

    def __init__(self, url: str, multi_cluster: bool,
                 storage: StorageOptions | None = None) -> None:
        self.url = url
        self.multi_cluster = multi_cluster
        self.storage = storage or StorageOptions()
        self._wal: WriteAheadLog | None = None
        self._newest: Window | None = None  # the newest window record, as last seen
        #: every window <= this one is known committed (this object marked them)
        self._committed_through: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_wal"] = None
        state["_newest"], state["_committed_through"] = None, None
        return state

    def __repr__(self) -> str:
        return repr(self.wal)

    @property
    def wal(self) -> WriteAheadLog:
        if self._wal is None:
            self._wal = WriteAheadLog.open(self.url, WAL_KIND, options=self.storage,
                                           family="eo_kafka")
        return self._wal

    def check(self) -> None:
        """The capability probe of the WAL's store (``check_create_if_absent``)."""
        wal = self.wal
        wal.storage.check_create_if_absent(wal.dir)

    def _decode(self, window: int, record: dict[str, Any]) -> Window:
        return Window(window, decode_offsets(record["start"], self.multi_cluster),
                      decode_offsets(record["end"], self.multi_cluster))

    # -- records ---------------------------------------------------------------------------
    def append(self, window: Window) -> None:
        """Write the window's record (write-once: a different one under its id fails)."""
        self.wal.append(window.window, {
            "window": window.window,
            "start": encode_offsets(window.start, self.multi_cluster),
            "end": encode_offsets(window.end, self.multi_cluster),
        })
        if self._newest is None or window.window > self._newest.window:
            self._newest = window

    def get(self, window: int) -> Window | None:
        record = self.wal.get(window)
        return None if record is None else self._decode(window, record)

    def last(self) -> Window | None:
        """The newest window, or None for an empty log."""
        if self._newest is not None:
            return self._newest
        last = self.wal.last()
        if last is None:
            return None
        self._newest = self._decode(last[0], last[1])
        return self._newest

    def find(self, end: Offsets, search: int = 20) -> int | None:
        """The id of the (recent) window that ends at ``end``."""
        if self._newest is not None and self._newest.end == end:
            return self._newest.window
        for seq in list(reversed(self.wal.seqs()))[:search]:
            found = self.get(seq)
            if found is not None and found.end == end:
                return seq
        return None

    # -- commits ---------------------------------------------------------------------------
    def commit(self, window: int, end: Offsets) -> None:
        """Mark ``window`` committed, and every older window still unmarked: batches finish
        in order, and Spark does not call ``commit`` again for a batch whose commit a crash
        interrupted (after a restart it commits the next batch's end instead)."""
        self.wal.commit(window, {"end": encode_offsets(end, self.multi_cluster)})
        if self._committed_through is not None and self._committed_through >= window - 1:
            self._committed_through = max(self._committed_through, window)
            return  # this object marked every older window: none is left unmarked
        seqs, committed = self.wal.listing()  # one directory listing (a WebHDFS call on HDFS)
        done = set(committed)
        for older in seqs:
            if older < window and older not in done:
                record = self.wal.get(older)
                if record is not None:
                    self.wal.commit(older, {"end": record["end"]})
        self._committed_through = window

    def is_committed(self, window: int) -> bool:
        if self._committed_through is not None and window <= self._committed_through:
            return True
        return self.wal.is_committed(window)

    def last_committed(self) -> int | None:
        return self.wal.last_committed()

    def retain(self, window: int, keep: int) -> None:
        self.wal.retain(window, keep)
