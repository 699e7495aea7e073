"""The source's window WAL: ``<walPath>/source`` (DESIGN.md section 5, "Window WAL").

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
    """The windows of one source's WAL, on any storage backend (opened on first use)."""

    def __init__(self, url: str, multi_cluster: bool,
                 storage: StorageOptions | None = None) -> None:
        self.url = url
        self.multi_cluster = multi_cluster
        self.storage = storage or StorageOptions()
        self._wal: WriteAheadLog | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_wal"] = None
        return state

    def __repr__(self) -> str:
        return repr(self.wal)

    @property
    def wal(self) -> WriteAheadLog:
        if self._wal is None:
            self._wal = WriteAheadLog.open(self.url, WAL_KIND, options=self.storage,
                                           family="eo_kafka")
        return self._wal

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

    def get(self, window: int) -> Window | None:
        record = self.wal.get(window)
        return None if record is None else self._decode(window, record)

    def last(self) -> Window | None:
        """The newest window, or None for an empty log."""
        last = self.wal.last()
        return None if last is None else self._decode(last[0], last[1])

    def find(self, end: Offsets, search: int = 20) -> int | None:
        """The id of the (recent) window that ends at ``end``."""
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
        seqs, committed = self.wal.listing()  # one directory listing (a WebHDFS call on HDFS)
        done = set(committed)
        for older in seqs:
            if older < window and older not in done:
                record = self.wal.get(older)
                if record is not None:
                    self.wal.commit(older, {"end": record["end"]})

    def is_committed(self, window: int) -> bool:
        return self.wal.is_committed(window)

    def last_committed(self) -> int | None:
        return self.wal.last_committed()

    def retain(self, window: int, keep: int) -> None:
        self.wal.retain(window, keep)
