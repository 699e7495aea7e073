"""Where a file sink task's files go, and how the commit makes them visible: one strategy per
kind of store, chosen once from the storage (``Storage.atomic_rename``).

- :class:`StagedPlacement` (local disks, HDFS): tasks write under ``_eo_staging/<B>/``;
  the commit renames the planned files to their deterministic final names
  (``part-<B:012d>-<writer:05d>-<n:03d>.<ext>``); cleanup removes the staging directory.
- :class:`InPlacePlacement` (object stores: no atomic rename): tasks write straight to
  final, unique names (``part-<B:012d>-<writer:05d>-a<attempt>-<token>-<n:03d>.<ext>``)
  and, before any of its files becomes visible, each attempt records them in
  ``_eo_staging/<B>/<writer>-a<attempt>-<token>.json``. Publishing is nothing: the
  commit's create of ``_spark_metadata/<B>`` and of the commit record is what makes the
  planned files *the* batch. Cleanup deletes what the other attempts recorded (failed
  tasks, zombies, the attempts of a run that crashed), so those files are never listed
  by the commit log and do not stay behind.

Both keep the same commit steps (``FileSink``); only steps 2 (publish) and 5 (cleanup),
and where ``stage`` writes, differ.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import IO, Any

from connectors.core.errors import FileSinkError, StorageError
from connectors.core.sink import TaskInfo
from connectors.core.storage import Storage
from connectors.core.wal import RETAIN_EVERY

log = logging.getLogger(__name__)

STAGING_DIR = "_eo_staging"
ATTEMPT_EXT = ".json"
#: winning attempts and planned files per (store, output path, batch): plans never change.
#: A sweep (every ``RETAIN_EVERY``-th batch) forgets the batches it swept, so this holds the
#: batches since the last sweep, not every batch of a query that runs for months.
_WINNERS: dict[tuple[Any, str, int], tuple[set[str], set[str]]] = {}


class Placement(ABC):
    """How one store holds a task's files until, and after, the commit."""

    def __init__(self, storage: Storage, path: str, extension: str) -> None:
        self.storage = storage
        self.path = path
        self.extension = extension

    #: plan entries' ``staged`` names are final paths (nothing to rename)
    in_place = False

    def staging_root(self) -> str:
        return self.storage.join(self.path, STAGING_DIR)

    def staging_dir(self, batch_id: int) -> str:
        return self.storage.join(self.staging_root(), str(batch_id))

    # -- task side ------------------------------------------------------------------------
    @abstractmethod
    def task(self, task: TaskInfo) -> TaskFiles:
        """The file placement of one task attempt."""

    # -- driver side ------------------------------------------------------------------------
    def final_path(self, entry: dict[str, Any]) -> str:
        return self.storage.join(self.path, entry["final"])

    @abstractmethod
    def publish(self, batch_id: int, plan: dict[str, Any],
                after_each: Callable[[int], None]) -> None:
        """2. Make the planned files appear under their final names."""

    @abstractmethod
    def cleanup(self, batch_id: int, plan: dict[str, Any] | None,
                plans: Callable[[int], dict[str, Any] | None]) -> int:
        """5. After the commit of ``batch_id`` (or a replay of it): remove what attempts of
        it, and of older batches, left that no plan names. ``plans(b)`` reads the plan of
        batch ``b``. Returns the files deleted."""

    @abstractmethod
    def abort(self, batch_id: int, plan: dict[str, Any] | None) -> None:
        """Remove batch ``batch_id``'s files, keeping those ``plan`` (pending) names."""

    @abstractmethod
    def pending(self) -> list[str]:
        """What attempts left in ``_eo_staging`` (for ``files status``)."""


class TaskFiles(ABC):
    """One task attempt's file placement: names, streams, and what a commit plan records."""

    def __init__(self, placement: Placement, task: TaskInfo) -> None:
        self.placement = placement
        self.storage = placement.storage
        self.task = task
        self.token = uuid.uuid4().hex[:8]
        self._seq = iter(range(1 << 30))

    @abstractmethod
    def open(self, part: str) -> tuple[str, AbstractContextManager[IO[bytes]]]:
        """A new file for partition directory ``part``: ``(name, stream context)``."""

    def announce(self, files: list[tuple[str, str]]) -> None:  # noqa: B027 - optional
        """Hear of files about to become durable (see ``RollingWriter``)."""

    @abstractmethod
    def full_path(self, name: str) -> str:
        """Where the file ``name`` (as ``open`` named it) is now."""

    def discard(self, names: list[str]) -> None:
        """Delete files of this attempt after it failed."""
        for name in names:
            with contextlib.suppress(Exception):
                self.storage.delete(self.full_path(name))


# -- rename stores ---------------------------------------------------------------------------
class StagedPlacement(Placement):
    """Local disks and HDFS: staging directory, then a rename plan (see module docstring)."""

    def task(self, task: TaskInfo) -> TaskFiles:
        return _StagedTask(self, task)

    def publish(self, batch_id: int, plan: dict[str, Any],
                after_each: Callable[[int], None]) -> None:
        staging = self.staging_dir(batch_id)
        for i, entry in enumerate(plan["files"], start=1):
            self._rename(self.storage.join(staging, entry["staged"]), self.final_path(entry),
                         batch_id)
            after_each(i)

    def _rename(self, src: str, dst: str, batch_id: int) -> None:
        try:
            self.storage.rename(src, dst)
            return
        except FileExistsError:
            # A crash between link and unlink (local) leaves both: the target is the file.
            with contextlib.suppress(FileNotFoundError):
                self.storage.delete(src)
            return
        except FileNotFoundError:
            if self.storage.exists(dst):
                return  # renamed before a crash
            raise FileSinkError(
                f"eo_files: batch {batch_id}: staged file {self.storage.url(src)!r} and its "
                f"target {self.storage.url(dst)!r} are both missing; the staging directory "
                "was modified outside the sink"
            ) from None
        except StorageError as e:
            raise FileSinkError(
                f"eo_files: batch {batch_id}: rename {self.storage.url(src)!r} -> "
                f"{self.storage.url(dst)!r} failed: {e}"
            ) from e

    def cleanup(self, batch_id: int, plan: dict[str, Any] | None,
                plans: Callable[[int], dict[str, Any] | None]) -> int:
        """Remove the staging directory of ``batch_id`` and of every older batch."""
        root = self.staging_root()
        removed = 0
        for name in self.storage.list(root):
            if name.isdigit() and int(name) <= batch_id:
                with contextlib.suppress(FileNotFoundError):
                    self.storage.delete(self.storage.join(root, name), recursive=True)
                    removed += 1
        return removed

    def abort(self, batch_id: int, plan: dict[str, Any] | None) -> None:
        staging = self.staging_dir(batch_id)
        if plan is None:
            with contextlib.suppress(FileNotFoundError):
                self.storage.delete(staging, recursive=True)
            return
        keep = {e["staged"] for e in plan["files"]}
        for name in self.storage.list(staging):
            if name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    self.storage.delete(self.storage.join(staging, name))

    def pending(self) -> list[str]:
        return list(self.storage.walk_files(self.staging_root()))


class _StagedTask(TaskFiles):
    def open(self, part: str) -> tuple[str, AbstractContextManager[IO[bytes]]]:
        name = (f"{self.task.writer_id:05d}-a{self.task.attempt}-{self.token}-"
                f"{next(self._seq):03d}{self.placement.extension}")
        return name, self.storage.open_write(self.full_path(name))

    def full_path(self, name: str) -> str:
        return self.storage.join(self.placement.staging_dir(self.task.batch_id), name)


# -- object stores ---------------------------------------------------------------------------
class InPlacePlacement(Placement):
    """Object stores: final, unique names and attempt records (see module docstring)."""

    in_place = True

    def task(self, task: TaskInfo) -> TaskFiles:
        return _InPlaceTask(self, task)

    def publish(self, batch_id: int, plan: dict[str, Any],
                after_each: Callable[[int], None]) -> None:
        """Nothing to move: the files are at their final names since their tasks ended."""

    def _records(self) -> list[tuple[int, str]]:
        """``(batch, path)`` of every attempt record in ``_eo_staging`` (one listing)."""
        out = []
        for p in self.storage.walk_files(self.staging_root()):
            *_, batch, name = p.rsplit("/", 2)
            if batch.isdigit() and name.endswith(ATTEMPT_EXT):
                out.append((int(batch), p))
        return out

    def _attempt_files(self, record_path: str) -> list[str]:
        try:
            record = json.loads(self.storage.read(record_path))
        except FileNotFoundError:
            return []
        except ValueError:
            log.warning("eo_files: unreadable attempt record %s; its files stay",
                        self.storage.url(record_path))
            return []
        return [str(f) for f in record.get("files", [])]

    @staticmethod
    def _attempt_of(record_path: str) -> str:
        return record_path.rsplit("/", 1)[-1][: -len(ATTEMPT_EXT)]

    def cleanup(self, batch_id: int, plan: dict[str, Any] | None,
                plans: Callable[[int], dict[str, Any] | None]) -> int:
        """Delete what the losing attempts of ``batch_id`` recorded (one listing of
        ``_eo_staging/B/``). Every ``RETAIN_EVERY``-th batch, sweep all of ``_eo_staging``:
        the winners' records of earlier batches, and what zombies of older batches wrote
        after their batch's cleanup."""
        sweep = batch_id % RETAIN_EVERY == 0
        if sweep:
            records = [(b, p) for b, p in self._records() if b <= batch_id]
        else:
            staging = self.staging_dir(batch_id)
            records = [(batch_id, self.storage.join(staging, n))
                       for n in self.storage.list(staging) if n.endswith(ATTEMPT_EXT)]
        doomed: list[str] = []
        for b, record in records:
            winners = self._winners(b, plan if b == batch_id else None, plans)
            if winners is None:
                log.warning("eo_files: attempt record %s of batch %d has no plan left to "
                            "check its files against; they stay (files status lists them)",
                            self.storage.url(record), b)
                continue
            attempts, planned = winners
            if self._attempt_of(record) in attempts:
                if sweep:
                    doomed.append(record)  # a winner: its files are the batch's
                continue
            doomed += [self.storage.join(self.path, f) for f in self._attempt_files(record)
                       if f not in planned]
            doomed.append(record)
        if doomed:
            self.storage.delete_many(doomed)
        if sweep:
            # Swept: a record of these batches comes back only from a zombie, whose check
            # reads the plan again (from _eo_log, which keeps LOG_RETENTION batches).
            identity = self.storage.identity()
            for key in [k for k in _WINNERS if k[0] == identity and k[1] == self.path
                        and k[2] <= batch_id]:
                del _WINNERS[key]
        return len(doomed)

    def _winners(self, batch_id: int, plan: dict[str, Any] | None,
                 plans: Callable[[int], dict[str, Any] | None]
                 ) -> tuple[set[str], set[str]] | None:
        """``(winning attempt ids, planned files)`` of a batch; plans never change once
        created, so each is read once per process."""
        key = (self.storage.identity(), self.path, batch_id)
        if key not in _WINNERS:
            found = plan if plan is not None else plans(batch_id)
            if found is None:
                return None
            files = {e["final"] for e in found["files"]}
            _WINNERS[key] = ({_attempt_id(f) for f in files}, files)
        return _WINNERS[key]

    def abort(self, batch_id: int, plan: dict[str, Any] | None) -> None:
        planned = set() if plan is None else {_attempt_id(e["final"]) for e in plan["files"]}
        doomed: list[str] = []
        staging = self.staging_dir(batch_id)
        for name in self.storage.list(staging):
            record = self.storage.join(staging, name)
            if name.endswith(ATTEMPT_EXT) and self._attempt_of(record) not in planned:
                doomed += [self.storage.join(self.path, f)
                           for f in self._attempt_files(record)]
                doomed.append(record)
        if doomed:
            self.storage.delete_many(doomed)

    def pending(self) -> list[str]:
        return [p for _, p in self._records()]


def _attempt_id(final: str) -> str:
    """The attempt (``<writer>-a<N>-<token>``) that wrote the in-place file ``final``
    (``[dir/]part-<B>-<writer>-a<N>-<token>-<n>.<ext>``)."""
    return "-".join(final.rsplit("/", 1)[-1].split("-")[2:5])


class _InPlaceTask(TaskFiles):
    def __init__(self, placement: Placement, task: TaskInfo) -> None:
        super().__init__(placement, task)
        self.attempt = f"{task.writer_id:05d}-a{task.attempt}-{self.token}"
        self.record = self.storage.join(placement.staging_dir(task.batch_id),
                                        self.attempt + ATTEMPT_EXT)
        self.announced: list[str] = []

    def open(self, part: str) -> tuple[str, AbstractContextManager[IO[bytes]]]:
        base = (f"part-{self.task.batch_id:012d}-{self.attempt}-{next(self._seq):03d}"
                f"{self.placement.extension}")
        name = f"{part}/{base}" if part else base
        return name, self.storage.open_write(self.full_path(name))

    def announce(self, files: list[tuple[str, str]]) -> None:
        """Record the files before they become visible: if this attempt dies after, the
        commit's cleanup finds them here (one PUT per announcement, usually one per task)."""
        self.announced += [name for _, name in files]
        body = json.dumps({"files": self.announced}).encode()
        self.storage.write_atomic(self.record, body)

    def full_path(self, name: str) -> str:
        return self.storage.join(self.placement.path, name)


def placement_for(storage: Storage, path: str, extension: str) -> Placement:
    """The placement a store needs: rename where it is atomic, in place where it is not."""
    cls = StagedPlacement if storage.atomic_rename else InPlacePlacement
    return cls(storage, path, extension)
