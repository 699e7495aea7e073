"""``eo_files``: the exactly-once file sink (docs/design.md, "File sink").

Apex's FileOutputOperator idea on Spark micro-batches: tasks write files, and the driver
makes exactly one attempt's files *the* batch once it commits. Each batch appears once.

Layout under ``path`` (local disk or HDFS; object stores differ in the names marked *)::

    part-000000000007-00001-000.parquet        committed output (or under col=value/ dirs)
                                               * part-000000000007-00001-a0-1f2e3d4c-000.parquet
    _eo_staging/7/00001-a0-1f2e3d4c-000.parquet  staged by writer 1, attempt 0, of batch 7
                                               * _eo_staging/7/00001-a0-1f2e3d4c.json: the
                                                 files that attempt wrote in place
    _eo_log/00000000000000000007.json          the plan of batch 7 (its files: the manifest)
    _eo_log/00000000000000000007.commit        batch 7 is committed (created last)
    _spark_metadata/7                          Spark's file-sink log: the committed files

On local disks and HDFS a file appears under its final name only once its batch commits
(rename), so readers that list files (``pyarrow.dataset``, pandas) see committed files only;
they skip ``_``- and ``.``-prefixed names. On object stores (no atomic rename) tasks write
final names directly: Spark (through ``_spark_metadata``) and readers of the plans or
:func:`committed_files` see committed files only; a reader that lists the directory also
sees the batch in flight and, until its commit's cleanup, files of failed attempts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from connectors.core import failpoints
from connectors.core.declared import checked_arguments, given
from connectors.core.errors import FileSinkError, StorageError
from connectors.core.sink import BatchSink, TaskInfo
from connectors.core.sink_state import SinkState
from connectors.core.storage import LocalStorage, Storage, storage_for
from connectors.core.wal import WriteAheadLog
from connectors.files.formats import RollingWriter, WrittenFile, check_partition_columns
from connectors.files.options import FAMILY, FILE_SINK_OPTIONS, FileSinkOptions
from connectors.files.placement import STAGING_DIR, Placement, placement_for
from connectors.monitoring import channel

log = logging.getLogger(__name__)

LOG_DIR = "_eo_log"
#: commit records kept in ``_eo_log`` (older ones are purged; only the newest is needed)
LOG_RETENTION = 100
#: the restart record ``eo-connectors sink reset`` writes (hidden from readers: ``_``)
RESET_FILE = "_eo_reset.json"


#: (store, path, sink_id) whose path and ownership this process checked
_CHECKED: set[tuple[Any, ...]] = set()


@dataclass(frozen=True)
class StagedFiles:
    """The stage message of one task: the files it wrote under ``_eo_staging/<batch>/``."""

    batch_id: int
    writer_id: int
    attempt: int
    files: tuple[WrittenFile, ...]


class FileSink(BatchSink):
    """Writes DataFrame rows as parquet, JSON-lines or CSV files under a local, HDFS or
    object-store (S3, GCS, Azure) path.

    Guarantee: exactly-once per batch id. Every committed batch's rows appear in the output
    exactly once, and a file named by the commit log is always complete. Conditions: the
    batch id is stable on replay (Spark's ``batchId`` or a ``KafkaWindows`` window id), one
    query writes to ``path``, and the store enforces create-if-absent (probed at start;
    stores that do not are refused). A path holds the output of one ``sink_id``: another
    sink's batches are refused. A new checkpoint against an old ``path`` restarts batch ids
    at 0: unlike Spark's own file sink (which skips them), those batches are refused with an
    error until ``eo-connectors sink reset --path ...`` records the restart. Readers: on
    local disks and HDFS anything that lists files sees committed files only; on object
    stores read through ``_spark_metadata`` (Spark) or :func:`committed_files`.

    Unit of parallelism: one Spark task (writer partition) per file set; each task writes
    one file per ``partitionBy`` directory, rolling after ``maxRecordsPerFile`` rows or about
    ``maxBytesPerFile`` bytes. The driver commits the whole batch once.

    Commit protocol, driver side, for batch ``B`` (``commit``); where the files are and what
    "publish" does is the placement's (``connectors.files.placement``: rename on local disks
    and HDFS, in place on object stores):

    0. Ownership and batch order (``SinkState.admit``): a path another sink_id committed to,
       or a ``B`` below the last committed batch, is refused. If ``B`` is the last committed
       batch (a replay), clean up (step 5) and return. Failpoint ``files.after_stage``
       fires before.
    1. Plan: create ``_eo_log/B.json`` if absent, naming the winning tasks' files and their
       final names (staged name -> ``part-<B:012d>-<writer:05d>-<n:03d>.<ext>`` under its
       partition directory; in place, the name the task wrote). If a plan exists, this is
       a replay after a crash in steps 2-4: finish *that* plan and ignore the new attempt's
       files (step 5 deletes them), because a new attempt may split the same rows
       differently across files. Failpoint ``files.after_plan``.
    2. Publish: rename each planned file into place (nothing to do in place). A target
       that exists while its source is gone (or both exist, after a crash inside a
       no-replace rename) counts as done. Failpoint ``files.mid_rename`` after each rename
       (``#n`` = after the n-th; without ``#``, after the first). Failpoint
       ``files.after_rename`` after the last.
    3. Spark's ``_spark_metadata`` log entry for B, created if absent (a replay finds the
       same bytes). Failpoint ``files.before_log``.
    4. The commit record ``_eo_log/B.commit``, created if absent, last: the commit point.
       Failpoint ``files.after_log``.
    5. Clean up: remove what attempts of B and older batches left in ``_eo_staging`` that
       no plan names (in place: the files those attempts recorded), and purge old log
       records.

    ``abort(B)`` removes B's files, except those a pending plan still needs (Spark also
    calls ``abort`` when ``commit`` raised part-way through step 2).

    Task side (``stage``): stream the partition's Arrow batches through pyarrow into new
    files (staged, or in place with the attempt recorded before any file becomes visible);
    never collect the partition; return the list of files. Failpoint ``files.task_staged``
    after the files are durable.
    """

    family = FAMILY

    @checked_arguments(FILE_SINK_OPTIONS)
    def __init__(
        self,
        path: str,
        *,
        format: str = "parquet",  # noqa: A002 - Spark's option name
        compression: str | None = None,
        partition_by: Sequence[str] | str = (),
        max_records_per_file: int | None = None,
        max_bytes_per_file: int | None = None,
        sink_id: str | None = None,
        spark_metadata: bool = True,
        csv_header: bool = True,
        webhdfs_url: str | None = None,
        hdfs_user: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """The arguments are the DataSource's options in snake_case (``FILE_SINK_OPTIONS``,
        the table in docs/file-sink.md); ``partition_by`` may be a list, ``csv_header`` is
        the option ``header``, ``storage_options`` the ``storage.*`` options without the
        prefix."""
        self._init(FileSinkOptions.create(**given(locals())))

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: pa.Schema | None = None) -> FileSink:
        """Build from Spark's string options (``writeStream.format("eo_files").option(...)``)."""
        sink = cls.from_parsed(FileSinkOptions.from_options(options))
        if schema is not None:
            sink._check_columns(schema)
        return sink

    def _init(self, options: FileSinkOptions) -> None:
        self.options = options  # also read as attributes: sink.format, sink.sink_id, ...
        self.storage, self.path = options.storage, options.path
        self.placement: Placement = placement_for(self.storage, self.path,
                                                  options.format.extension)

    def __repr__(self) -> str:
        return f"FileSink({self.storage.url(self.path)!r}, format={self.format.name!r})"

    # -- driver-side validation ----------------------------------------------------------
    def check_schema(self, schema: pa.Schema) -> None:
        """Columns, path and store, checked on the driver before any task writes. The path,
        the store's create-if-absent and the ownership are checked once per process (Spark
        checks a streaming sink before every micro-batch; every commit admits its batch)."""
        self._check_columns(schema)
        key = (self.storage.identity(), self.path, self.sink_id)
        if key in _CHECKED:
            return
        state = self.state
        local = isinstance(self.storage, LocalStorage)
        if local:
            self.options.check_path()  # offline, and clearer than a failed probe
        state.check_storage()  # on a remote store the probe's create is the clearest check
        if not local:
            self.options.check_path()
        state.check_owner(FAMILY, self.sink_id)
        _CHECKED.add(key)

    def _check_columns(self, schema: pa.Schema) -> None:
        check_partition_columns(schema, self.partition_by)
        data = pa.schema([f for f in schema if f.name not in self.partition_by])
        self.format.check_schema(data)

    # -- layout ---------------------------------------------------------------------------
    @property
    def state(self) -> SinkState:
        return sink_state(self.storage, self.path)

    @property
    def wal(self) -> WriteAheadLog:
        """``_eo_log``: the plans and commit records."""
        return self.state.log

    def staging_dir(self, batch_id: int) -> str:
        return self.placement.staging_dir(batch_id)

    def final_name(self, batch_id: int, writer_id: int, n: int) -> str:
        return f"part-{batch_id:012d}-{writer_id:05d}-{n:03d}{self.format.extension}"

    def _spark_log(self) -> Any:
        from connectors.files.spark_metadata import SparkMetadataLog

        return SparkMetadataLog(self.storage, self.path)

    # -- task side --------------------------------------------------------------------------
    def stage(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> StagedFiles:
        """Write this task's rows as new files (staged or in place); list them."""
        batch_id = task.batch_id
        # The executor's share of step 0: a foreign path or a lower batch id fails the task
        # before it writes; a replay of the committed batch writes nothing.
        if not self.admit(batch_id):
            return StagedFiles(batch_id, task.writer_id, task.attempt, ())
        files_of = self.placement.task(task)
        writer = RollingWriter(
            self.format,
            files_of.open,
            partition_by=self.partition_by,
            max_records=self.max_records_per_file,
            max_bytes=self.max_bytes_per_file,
            announce=files_of.announce,
        )
        try:
            for batch in batches:
                writer.write(batch)
            files = writer.close()
        except BaseException as e:
            files_of.discard(writer.abort())
            if isinstance(e, (FileSinkError, StorageError)) or not isinstance(e, Exception):
                raise
            raise FileSinkError(
                f"eo_files: writer {task.writer_id} of batch {batch_id} failed writing to "
                f"{self.storage.url(self.path)!r}: {e}"
            ) from e
        failpoints.hit("files.task_staged", batch_id)
        log.debug(
            "eo_files: batch %d writer %d staged %d files, %d rows",
            batch_id,
            task.writer_id,
            len(files),
            sum(f.rows for f in files),
        )
        return StagedFiles(batch_id, task.writer_id, task.attempt, tuple(files))

    # -- driver side ---------------------------------------------------------------------------
    def last_committed(self) -> int | None:
        return self.state.last_committed()

    def is_committed(self, batch_id: int) -> bool:
        return self.state.is_committed(batch_id)

    def admit(self, batch_id: int, state: SinkState | None = None) -> bool:
        return (state or self.state).admit(FAMILY, self.sink_id, batch_id)

    def batch_offset(self) -> int:
        return self.state.batch_offset()

    def commit(self, batch_id: int, messages: Sequence[Any]) -> None:
        """Make batch ``batch_id`` visible exactly once (see the class docstring's steps)."""
        started = time.perf_counter()
        state = self.state
        wal = state.log
        failpoints.hit("files.after_stage", batch_id)
        # 0. Ownership first: another sink's commit of this batch id is not ours to skip.
        if not self.admit(batch_id, state):
            log.info("eo_files: batch %d already committed; dropping what its replay wrote",
                     batch_id)
            self._cleanup(batch_id, wal.get(batch_id))
            channel.replay_event(FAMILY, self.sink_id, batch_id)
            return
        # 1.
        plan = self._plan(batch_id, messages)
        existing = wal.create(batch_id, plan)
        if existing is not None:
            if existing.get("sink_id") != self.sink_id:
                raise FileSinkError(
                    f"eo_files: batch {batch_id} at {self.storage.url(self.path)} has a plan "
                    f"of sink_id {existing.get('sink_id')!r}, not {self.sink_id!r}: two "
                    "sinks write to this path; nothing was committed")
            log.warning(
                "eo_files: batch %d has a plan from an earlier attempt; finishing that "
                "plan and discarding this attempt's files",
                batch_id,
            )
            plan = existing
        failpoints.hit("files.after_plan", batch_id)
        # 2.
        self.placement.publish(
            batch_id, plan, lambda i: failpoints.hit("files.mid_rename", batch_id, count=i))
        failpoints.hit("files.after_rename", batch_id)
        # 3.
        if self.spark_metadata:
            self._spark_log().add(
                batch_id,
                [(self.placement.final_path(e), e["bytes"], plan["created_ms"])
                 for e in plan["files"]],
                previous=state.last_listed,
            )
        failpoints.hit("files.before_log", batch_id)
        # 4.
        rows = sum(e["rows"] for e in plan["files"])
        size = sum(e["bytes"] for e in plan["files"])
        state.record_commit(batch_id, self.sink_id, rows, files=len(plan["files"]), bytes=size)
        failpoints.hit("files.after_log", batch_id)
        # 5.
        self._cleanup(batch_id, plan)
        state.retain(batch_id)
        log.info(
            "eo_files: committed batch %d to %s: %d files, %d rows in %.1f ms",
            batch_id,
            self.storage.url(self.path),
            len(plan["files"]),
            rows,
            (time.perf_counter() - started) * 1000,
        )
        channel.commit_event(FAMILY, self.sink_id, batch_id, rows=rows, bytes=size,
                             steps={"commit": time.perf_counter() - started})

    def _plan(self, batch_id: int, messages: Sequence[Any]) -> dict[str, Any]:
        staged: dict[int, StagedFiles] = {}
        for m in messages:
            if m is None:
                continue
            if not isinstance(m, StagedFiles):
                raise FileSinkError(
                    f"eo_files: batch {batch_id}: unexpected stage message {type(m).__name__}"
                )
            if m.batch_id != batch_id:
                raise FileSinkError(
                    f"eo_files: a message of batch {m.batch_id} reached the commit of batch "
                    f"{batch_id}"
                )
            staged[m.writer_id] = m
        files = []
        in_place = self.placement.in_place
        for writer_id in sorted(staged):
            for n, f in enumerate(staged[writer_id].files):
                if in_place:
                    final = f.name  # written under its final name (with its partition dir)
                else:
                    name = self.final_name(batch_id, writer_id, n)
                    final = f"{f.partition}/{name}" if f.partition else name
                files.append({"staged": f.name, "final": final, "rows": f.rows, "bytes": f.bytes})
        return {
            "batch": batch_id,
            "sink_id": self.sink_id,
            "format": self.format.name,
            "created_ms": int(time.time() * 1000),
            "files": files,
        }

    def _cleanup(self, batch_id: int, plan: dict[str, Any] | None) -> None:
        """5. What attempts of ``batch_id`` and older batches left that no plan names."""
        wal = self.wal
        self.placement.cleanup(batch_id, plan, wal.get)

    def abort(self, batch_id: int, messages: Sequence[Any | None]) -> None:
        """Remove this batch's files, keeping those a pending plan needs."""
        if self.is_committed(batch_id):
            self._cleanup(batch_id, self.wal.get(batch_id))
            return
        self.placement.abort(batch_id, self.wal.get(batch_id))

    # -- inspection ----------------------------------------------------------------------------
    def committed_files(self) -> list[str]:
        """Every committed data file (paths), for tests and tools: from ``_spark_metadata``
        on object stores (where listing also shows files in flight), else by listing."""
        if self.placement.in_place:
            return sorted(committed_paths(self.storage, self.path))
        hidden = (STAGING_DIR, LOG_DIR, "_spark_metadata")
        out: list[str] = []
        for name in self.storage.list(self.path):
            if name in hidden or name.startswith("_"):
                continue
            full = self.storage.join(self.path, name)
            if self.storage.is_dir(full):
                out.extend(self.storage.walk_files(full))
            else:
                out.append(full)
        return sorted(out)


def sink_state(storage: Storage, path: str) -> SinkState:
    """The file sink's state under its output path: the log ``_eo_log`` (rename plans and
    commit records, the newest ``LOG_RETENTION`` kept); the owner is the newest commit's."""
    return SinkState(storage, path, log_kind=LOG_DIR, keep=LOG_RETENTION,
                     reset_file=RESET_FILE, what="output path", family=FAMILY,
                     reset_flag="--path")


def committed_paths(storage: Storage, path: str) -> list[str]:
    """The committed data files under ``path`` (paths in ``storage``), from Spark's
    ``_spark_metadata`` log: the latest compaction plus the deltas after it, as Spark reads
    it. Files in flight or left by failed attempts are not in it."""
    from urllib.parse import unquote

    from connectors.files.spark_metadata import SparkMetadataLog

    log_ = SparkMetadataLog(storage, path)
    prefix = storage.url("").rstrip("/") if not storage.scheme == "file" else "file://"
    out = []
    for entry in log_.all_entries():
        url = str(entry["path"])
        out.append(unquote(url[len(prefix):]) if url.startswith(prefix) else unquote(url))
    return out


def committed_files(path: str, *, storage_options: Mapping[str, Any] | None = None,
                    webhdfs_url: str | None = None, hdfs_user: str | None = None) -> list[str]:
    """The URLs of every committed data file of the ``eo_files`` output at ``path``, for
    readers that do not read ``_spark_metadata`` themselves (pyarrow, DuckDB, pandas):
    exactly the files of committed batches, never files in flight or of failed attempts.
    See docs/file-sink.md for the pyarrow and DuckDB recipes."""
    from connectors.core.storage import storage_options_from

    storage, root = storage_for(path, webhdfs_url=webhdfs_url, hdfs_user=hdfs_user,
                                options=storage_options_from(storage_options, FAMILY),
                                family=FAMILY)
    return sorted(storage.url(p) for p in committed_paths(storage, root))


def committed_batches(path: str, **storage_kwargs: Any) -> list[dict[str, Any]]:
    """The committed batches still in ``<path>/_eo_log`` (the newest ``LOG_RETENTION``):
    ``[{"batch_id", "files": [final paths], "rows", "bytes", "sink_id"}]``, oldest first.
    ``storage_kwargs``: ``webhdfs_url``, ``hdfs_user``, ``options`` (``StorageOptions``)."""
    return batches_in(sink_state(*storage_for(path, **storage_kwargs)))


def batches_in(state: SinkState) -> list[dict[str, Any]]:
    """:func:`committed_batches` of a sink state already opened."""
    wal = state.log
    out: list[dict[str, Any]] = []
    for seq in wal.committed_seqs():
        info = wal.commit_info(seq) or {}
        plan = wal.get(seq) or {}
        out.append(
            {
                "batch_id": seq,
                "files": [e["final"] for e in plan.get("files", [])],
                "rows": info.get("rows"),
                "bytes": info.get("bytes"),
                "sink_id": info.get("sink_id"),
            }
        )
    return out
