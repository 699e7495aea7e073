"""How a sink's commit counts reach the driver process that serves the metrics.

A sink's driver-side ``commit`` runs where Spark runs it: in the user's driver process for
``foreachBatch`` and ``sink.write``, but for ``writeStream.format("eo_jdbc")`` in a Python
worker that Spark's JVM starts on the driver host (pyspark's
``python_streaming_sink_runner``), a separate process whose counters the endpoint would never
see. So a commit event goes:

- straight into the metrics when this process serves them (:func:`serving` is set);
- else, as one JSON line appended to a spool file of the driver JVM that started this
  process: ``serve`` creates ``<spool root>/<JVM pid>/`` and each writing process appends to
  its own ``<pid>.jsonl`` there; the endpoint reads what is new on every scrape and progress
  event (:class:`Spool`). A process finds its JVM by walking its parents (Linux ``/proc``);
  where there is no ``/proc``, or no ancestor serves metrics, the event is dropped. A file
  past :data:`ROTATE_BYTES` is renamed by its writer (``<pid>.jsonl.<ns>``, written no more)
  and removed by the reader once read to its end, so a long-running query's spool stays small.

Events are built from the COMMITTED messages only, so a retried or zombie task counts once.
The exceptions are counted where they happen, in the process that saw them: a batch the
driver aborted (:func:`abort_event`), a transaction a failing attempt aborted
(:func:`count_event` from the executor), a source's window commit (:func:`source_event`).

A spooled event also carries its process's storage counts (:mod:`connectors.core.storage.stats`,
totals so far, with a token naming the process); the endpoint keeps the newest totals of
each process, so a lost or repeated line changes nothing. :func:`storage_totals` sends them
alone (after a task's stage).

Nothing here raises into a batch: a failure is logged and counted
(``eo_metrics_errors_total``), never fatal.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from connectors.core.storage import stats

log = logging.getLogger(__name__)

#: Where drivers serving metrics keep their spool directories (one per JVM pid).
SPOOL_ROOT_ENV = "EO_METRICS_SPOOL"
#: How many parents a worker walks looking for a serving driver (worker, daemon, JVM, ...).
MAX_ANCESTORS = 8
#: A spool file this large is closed for writing (renamed) and removed once read.
ROTATE_BYTES = 1 << 20

_write_lock = threading.Lock()

_serving: Callable[[Mapping[str, Any]], None] | None = None
_ancestors: list[int] | None = None
_process: tuple[int, str] | None = None


def spool_root() -> Path:
    root = os.environ.get(SPOOL_ROOT_ENV)
    if root:
        return Path(root)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"eo-connectors-metrics-{uid}"


def serving(apply: Callable[[Mapping[str, Any]], None] | None) -> None:
    """Set (or clear) the in-process consumer: this process serves the metrics."""
    global _serving
    _serving = apply


def commit_event(family: str, sink_id: str | None, batch_id: int, *, rows: int = 0,
                 steps: Mapping[str, float] | None = None, **counts: float) -> None:
    """A committed batch: ``rows`` and the other ``counts`` (``bytes``, ``produced``,
    ``skipped_rows``, ``retried_tasks``, ``scans``, ``scan_records``, ``scan_seconds``)
    summed over the batch's winning attempts, ``steps`` the step durations in seconds."""
    emit({"kind": "commit", "family": family, "sink_id": sink_id or "", "batch_id": batch_id,
          "rows": rows, "steps": dict(steps or {}), **counts, "ts": time.time()})


def count_event(family: str, sink_id: str | None, batch_id: int, **counts: float) -> None:
    """Counts outside a commit (``failed_attempts``, ``transactions_aborted``), summed into
    the sink's counters; the batch's last-commit gauges are left alone."""
    emit({"kind": "count", "family": family, "sink_id": sink_id or "", "batch_id": batch_id,
          **counts, "ts": time.time()})


def abort_event(family: str, sink_id: str | None, batch_id: int) -> None:
    """The driver aborted the batch's write job (a task failed for good, or the commit)."""
    emit({"kind": "abort", "family": family, "sink_id": sink_id or "", "batch_id": batch_id,
          "ts": time.time()})


def source_event(wal_path: str | None, window: int | None, commit_seconds: float,
                 wal_files: int | None) -> None:
    """An ``eo_kafka`` source committed a window: the commit's time (WAL marker, group
    commit, retention) and, when its retention just listed the WAL, the files left."""
    emit({"kind": "source", "wal_path": wal_path or "", "window": window,
          "commit_seconds": commit_seconds, "wal_files": wal_files, "ts": time.time()})


def storage_totals() -> None:
    """Send this process's storage counts alone (a spooled process only: the serving one
    reads its own)."""
    if _serving is None and stats.snapshot():
        emit({"kind": "storage", "ts": time.time()})


def process_token() -> str:
    """This process, unique across pid reuse: pid and a random part, new after a fork."""
    global _process
    pid = os.getpid()
    if _process is None or _process[0] != pid:
        _process = (pid, f"{pid}-{uuid.uuid4().hex[:12]}")
    return _process[1]


def replay_event(family: str, sink_id: str | None, batch_id: int) -> None:
    """A commit of a batch that was already committed: a no-op replay."""
    emit({"kind": "replay", "family": family, "sink_id": sink_id or "", "batch_id": batch_id,
          "ts": time.time()})


def emit(event: Mapping[str, Any]) -> None:
    """Hand one event on (see the module docstring). Never raises."""
    try:
        if _serving is not None:
            _serving(event)
            return
        directory = _spool()
        if directory is None:
            return
        totals = stats.snapshot()
        if totals:
            event = {**event, "process": process_token(),
                     "storage": [[*key, n] for key, n in totals.items()]}
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        _append(directory / f"{os.getpid()}.jsonl", line)
    except Exception:  # noqa: BLE001 - metrics must never fail a batch
        log.warning("metrics: could not record %s event", event.get("kind"), exc_info=True)


def _append(path: Path, line: bytes) -> None:
    """One write of one line with O_APPEND: the reader never sees half of a line interleaved
    with another's (one file per process besides). Past :data:`ROTATE_BYTES` the file is
    renamed after the write, under the lock, so no line of this process lands in it later:
    the reader may remove it once it has read it to the end."""
    with _write_lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
            full = os.fstat(fd).st_size >= ROTATE_BYTES
        finally:
            os.close(fd)
        if full:
            os.replace(path, path.with_name(f"{path.name}.{time.time_ns()}"))


def _spool() -> Path | None:
    """The spool directory of the nearest ancestor that serves metrics, or None. Looked up
    on every event (a few ``stat`` calls per committed batch), so a driver that starts
    serving after this worker started is found."""
    global _ancestors
    root = spool_root()
    if not root.is_dir():
        return None
    if _ancestors is None:
        _ancestors = ancestors(os.getpid())
    for pid in _ancestors:
        candidate = root / str(pid)
        if candidate.is_dir():
            return candidate
    return None


def ancestors(pid: int) -> list[int]:
    """``pid`` and its parents, nearest first (Linux ``/proc``; just ``pid`` elsewhere)."""
    out = [pid]
    for _ in range(MAX_ANCESTORS):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        # "pid (comm) state ppid ...": comm may hold spaces or parentheses
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid <= 1:
            break
        out.append(ppid)
        pid = ppid
    return out


class Spool:
    """The reading side in the serving driver: ``<root>/<jvm pid>/*.jsonl``, read on."""

    def __init__(self, directory: Path, apply: Callable[[Mapping[str, Any]], None]) -> None:
        self.directory = directory
        self.apply = apply
        #: How far each file is read, by inode: a writer's rename keeps it.
        self._offsets: dict[int, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def create(cls, jvm_pid: int, apply: Callable[[Mapping[str, Any]], None]) -> Spool:
        """A fresh spool for this driver JVM: what a former process with the same pid left
        is removed first, so it is never counted; so are the spools of driver JVMs that are
        gone (a driver killed, or stopped without ``server.stop()``, leaves its directory,
        and one restarted after each crash for months would leave one per crash)."""
        root = spool_root()
        directory = root / str(jvm_pid)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in directory.glob("*.jsonl*"):
            stale.unlink(missing_ok=True)
        for other in root.iterdir():
            if other.name.isdigit() and other != directory and not alive(int(other.name)):
                cls(other, apply).remove()
        return cls(directory, apply)

    def drain(self) -> int:
        """Apply every complete line written since the last drain; returns how many. A
        process's renamed files are read before its live one (oldest first) and removed
        once read to their end."""
        applied = 0
        with self._lock:
            for path in sorted(self.directory.glob("*.jsonl*"), key=_spool_order):
                try:
                    with path.open("rb") as f:
                        inode = os.fstat(f.fileno()).st_ino
                        start = self._offsets.get(inode, 0)
                        f.seek(start)
                        data = f.read()
                except OSError:
                    continue
                end = data.rfind(b"\n") + 1  # a line still being written waits
                self._offsets[inode] = start + end
                for line in data[:end].splitlines():
                    try:
                        self.apply(json.loads(line))
                        applied += 1
                    except Exception:  # noqa: BLE001 - one bad line must not stop the rest
                        log.warning("metrics: bad spool line in %s", path, exc_info=True)
                if end == len(data) and _finished(path):
                    path.unlink(missing_ok=True)
                    self._offsets.pop(inode, None)
        return applied

    def remove(self) -> None:
        for path in self.directory.glob("*.jsonl*"):
            path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass


def _spool_order(path: Path) -> tuple[str, int, int]:
    """A process's renamed files by the time of their rename, then its live file."""
    pid, _, rest = path.name.partition(".jsonl")
    return (pid, 1, 0) if not rest else (pid, 0, int(rest[1:]) if rest[1:].isdigit() else 0)


def _finished(path: Path, quiet: float = 60.0) -> bool:
    """Nothing more will be written to ``path``: renamed by its writer, or the live file of a
    process that is gone (its workers come and go over a long run) and was not written for
    ``quiet`` seconds (a new process given the same pid would have written since)."""
    if not path.name.endswith(".jsonl"):
        return True
    pid = path.name[:-len(".jsonl")]
    if not pid.isdigit() or alive(int(pid)):
        return False
    try:
        return time.time() - path.stat().st_mtime > quiet
    except OSError:
        return False


def alive(pid: int) -> bool:
    """A process ``pid`` exists (this user's or another's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # alive, another user's
    return True
