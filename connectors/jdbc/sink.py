"""``eo_jdbc``: the transactional JDBC sink (docs/design.md, "JDBC sink").

Use it as ``writeStream.format("eo_jdbc")``, as ``writeStream.foreachBatch(JdbcSink(...))``
or as ``JdbcSink(...).write(df, batch_id)``. The exactly-once mechanism is Apex Malhar's
JdbcTransactionalStore: the last committed batch id of each sink lives in a metadata table
(``eo_sink_commits``) and moves in the *same* database transaction as the rows.

This module is the protocol. Beside it: ``options`` (the parsed options) and ``modes``
(the write mode they choose: append, upsert, accumulate, sql); ``database`` (dialect,
tables, connections, retries, transactions), which this protocol and the ``staging``
strategies (where tasks put their rows: staging table, COPY blocks, or the driver) both
use; ``tables`` (table preparation), ``dialects``, ``pgcopy`` and ``pgbinary`` (what
differs between databases), ``metadata`` (the commit table), ``admin`` (the operator's
status and reset of the commit table, for ``eo-connectors sink``).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import sqlalchemy as sa

from connectors.core import failpoints
from connectors.core.declared import checked_arguments, given
from connectors.core.errors import ConnectorError
from connectors.core.replay import ReplayableBatches
from connectors.core.sink import BatchSink, TaskInfo, check_batch_order
from connectors.jdbc.columns import Layout
from connectors.jdbc.database import Database
from connectors.jdbc.metadata import DEFAULT_NAME
from connectors.jdbc.options import FAMILY, JDBC_SINK_OPTIONS, JdbcSinkOptions
from connectors.jdbc.scopes import check_prepared_capacity, roll_back_batch, staging_for
from connectors.jdbc.staging import Staging
from connectors.jdbc.tables import prepared_layout, remember_layout
from connectors.monitoring import channel

log = logging.getLogger(__name__)

T = TypeVar("T")


class JdbcSink(BatchSink):
    """Writes DataFrame rows into a PostgreSQL, SQLite or MySQL/MariaDB table, exactly once.

    - **Writes**: each batch's rows into ``table``, by ``mode``: ``append``; ``upsert`` on
      ``keys``; ``accumulate`` (``col = col + new`` for the ``accumulate`` columns, the
      non-idempotent increment of a word count); or ``sql`` (your statement, once per row).
    - **Guarantee**: exactly-once per ``(sink_id, batch_id)``: a batch's rows and the
      advance of ``eo_sink_commits.batch_id`` commit in one database transaction; the
      committed batch id again is a no-op (a replay), and a lower one is refused
      (``BatchOrderError``: a new checkpoint needs ``eo-connectors sink reset``). It holds
      when ``sink_id`` is stable across restarts and unique per target, the batch ids are
      stable on replay (Spark's ``batchId``, or a ``KafkaWindows`` window id) and increase,
      and nothing else writes the sink's commit row or staging table.
    - **Parallelism**: one staging transaction per Spark task (writer partition) into the
      staging table ``eo_stage_<sink_id>`` (filled with COPY on PostgreSQL); then
      one commit transaction per batch on the driver. In ``foreachBatch`` a small batch
      (``smallBatchRows``) skips the staging transactions: its rows go to the driver and are
      written in the commit transaction alone. ``commitScope=task`` and ``prepared``
      (``connectors.jdbc.scopes``): each task writes its rows into the table in its own
      transaction (committed with its claim, or prepared), and the driver's transaction
      records the batch: every row is written once, in parallel; a batch then becomes
      visible task by task (``task``) or at the driver's commit (``prepared``).

    Protocol of one batch ``B`` with ``commitScope=batch`` (docs/design.md, "JDBC sink";
    each step is marked ``# 1.``, ``# 2a.``... where it happens; steps 4, 5 and 2g, of the
    other scopes, are in ``connectors.jdbc.scopes``):

    1. Stage (each task, ``stage``): a task of a batch below the committed one fails first
       (foreachBatch admitted the batch on the driver); then the staging strategy
       (``connectors.jdbc.staging``) writes the task's rows where the commit finds them,
       tagged ``(B, writer, attempt token)``, in the task's own transaction
       (``Database.task_transaction``), and reports their count: the staging table; binary
       COPY blocks for PostgreSQL append; in ``foreachBatch``, a small partition goes to
       the driver instead, with no transaction. Failpoints ``jdbc.before_stage`` (connected,
       nothing written), ``jdbc.before_stage_commit`` (before the task's transaction
       commits) and ``jdbc.after_stage`` (after). A transient error runs the transaction
       again from the task's first row, under a new token, within the retry budget.
    2. Commit (driver, ``commit``), ONE transaction, run again whole on a transient error
       within the retry budget (the next attempt's 2a learns the outcome of a COMMIT whose
       answer was lost):

       a. Lock: ``SELECT batch_id FROM eo_sink_commits WHERE sink_id = ... FOR UPDATE``
          (SQLite: ``BEGIN IMMEDIATE``). ``B`` equal to it is a replay: clear the staged
          rows of ``<= B`` and return; ``B`` below it raises ``BatchOrderError``.
          Failpoint ``jdbc.after_lock``.
       b. Verify (``Staging.verify``): the staging tables hold exactly what each winning
          attempt reported (append checks the INSERT's row count in c instead).
          Failpoint ``jdbc.after_verify``.
       c. Apply (``Staging.apply``) the winning attempts' rows to the target: set-based
          by the write mode (``connectors.jdbc.modes``: ``INSERT ... SELECT``, ``ON
          CONFLICT`` for upsert and accumulate, the statement per row for sql), one
          ``COPY`` of the blocks, the driver's own rows directly. Failpoint
          ``jdbc.after_apply``.
       d. Record: move the commit row to ``B``. Failpoint ``jdbc.after_record``.
       e. Clear (``Staging.clear``): delete staged rows of batches ``<= B`` (losing
          attempts, orphans of crashed runs). Failpoint ``jdbc.before_commit``.
       f. COMMIT. Failpoint ``jdbc.after_commit`` (after the database commit, before
          Spark's commit log).
    3. Abort (``abort``): delete this batch's staged rows; orphans of older batches go at
       the next commit.
    """

    family = FAMILY

    @checked_arguments(JDBC_SINK_OPTIONS)
    def __init__(
        self,
        url: str,
        table: str | None = None,
        sink_id: str | None = None,
        *,
        mode: str = "append",
        keys: Sequence[str] | str = (),
        accumulate: Sequence[str] | str = (),
        statement: str | None = None,
        create_table: bool = False,
        batch_size: int = 10_000,
        connect_timeout: float = 5.0,
        retry_timeout: float = 120.0,
        max_retries: int = 60,
        retry_backoff: float = 0.1,
        retry_backoff_max: float = 5.0,
        isolation_level: str | None = None,
        metadata_table: str = DEFAULT_NAME,
        staging_table: str | None = None,
        small_batch_rows: int = 10_000,
        stage_blocks: bool = True,
        commit_scope: str = "batch",
        durable_staging: bool = True,
        retry_deadline: float | None = None,
    ) -> None:
        """The arguments are the DataSource's options in snake_case (``JDBC_SINK_OPTIONS``,
        the table in docs/jdbc-sink.md); ``keys`` and ``accumulate`` may be lists,
        durations (``connect_timeout``, ``retry_timeout``, ``retry_backoff``,
        ``retry_backoff_max``) are in
        seconds. ``retry_deadline`` is the deprecated former name of
        ``retry_timeout``."""
        self._init(JdbcSinkOptions.create(**given(locals())))

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: pa.Schema | None = None) -> JdbcSink:
        """Build from Spark's (case-insensitive) option map, e.g. ``createTable=true``."""
        return cls.from_parsed(JdbcSinkOptions.from_options(options))

    def _init(self, options: JdbcSinkOptions) -> None:
        self.options = options
        self._layout: Layout | None = None
        self._inline_limit: int | None = None
        self._db: Database | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_db"] = None  # connections and engines stay in the process that made them
        return state

    def __repr__(self) -> str:
        o = self.options
        return (f"JdbcSink(url={o.redacted_url!r}, table={o.qualified_table!r}, "
                f"sink_id={o.sink_id!r}, mode={o.mode!r})")

    # -- runtime ----------------------------------------------------------------------------
    @property
    def database(self) -> Database:
        """The sink's database in this process (built on first use, never pickled)."""
        if self._db is None:
            self._db = Database(self.options)
        return self._db

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """``Database.retrying``, its errors naming the prepared layout's column types."""
        return self.database.retrying(what, fn, self._layout)

    def _require_layout(self) -> Layout:
        if self._layout is None:
            raise ConnectorError(
                "eo_jdbc: the sink was used before check_schema() prepared it; this is a bug "
                "in the caller (the Spark adapter calls it on the driver before any task)"
            )
        return self._layout

    def _staging(self) -> Staging:
        return staging_for(self.database, self._require_layout(), self._inline_limit)

    # -- driver-side preparation ----------------------------------------------------------
    def check_schema(self, schema: pa.Schema) -> None:
        """Driver, before any task: create/verify metadata, target and staging tables, and
        refuse a DataFrame column the table lacks or a type it cannot take."""
        layout = prepared_layout(self.options, schema)
        if layout is None:
            db = self.database
            db.ensure_metadata()

            def prepare(conn: sa.Connection) -> Layout:
                if self.options.commit_scope == "prepared":
                    check_prepared_capacity(conn, db)
                return db.tables.prepare(conn, schema)

            layout = db.transaction("preparing tables", prepare, self._layout)
            remember_layout(self.options, schema, layout)
        self._layout = layout

    # -- the protocol ---------------------------------------------------------------------
    def last_committed(self) -> int | None:
        self.database.ensure_metadata()
        return self.database.last_committed()

    def admit(self, batch_id: int) -> bool:
        """The batch order against ``eo_sink_commits`` (the commit transaction checks it
        again under the row lock). Ownership needs no check: the row is keyed by sink_id."""
        return check_batch_order(FAMILY, self.options.sink_id, batch_id,
                                 self.last_committed(), self._where(), self._reset_command())

    def _meta_name(self) -> str:
        o = self.options
        return f"{o.metadata_schema}.{o.metadata_table}" if o.metadata_schema \
            else o.metadata_table

    def _where(self) -> str:
        return f"table {self._meta_name()!r} at {self.options.redacted_url}"

    def _reset_command(self) -> str:
        name = self._meta_name()
        table = "" if name == DEFAULT_NAME else f" --table {name}"
        return f"eo-connectors sink reset --url <url> --sink-id {self.options.sink_id}{table}"

    def stage(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> Any:
        """1. Executor: stage this task's rows; return the stage message."""
        # Staged rows must survive until the commit reads them. On PostgreSQL the staging
        # tables are ordinary tables by default (durableStaging): a server crash between
        # this transaction and the driver's commit keeps them, and the commit, retried
        # after the restart, applies them. With durableStaging=false they are UNLOGGED:
        # no WAL but the commit record, and no WAL flush at all (such a transaction is
        # asynchronous whatever synchronous_commit says), but crash recovery empties them;
        # the commit then finds fewer rows than the tasks reported (step 2b, or append's
        # INSERT row count in 2c), fails the batch without touching the target, and the
        # restarted query writes it again. A lost staging commit is a failed batch, never
        # silent loss.
        if self._inline_limit is None:
            # The executor's share of the batch-order rule (the foreachBatch path admitted
            # the batch on the driver already, and its inline tasks stay connection-free):
            # a lower batch id fails before it stages anything.
            last = self.database.last_committed(
                f" before staging batch {task.batch_id} (writer {task.writer_id}, step 1)")
            if last is not None and task.batch_id < last:
                check_batch_order(FAMILY, self.options.sink_id, task.batch_id, last,
                                  self._where(), self._reset_command())
        # 1. Stage the rows where the strategy keeps them, in the task's own transaction
        #    (Database.task_transaction: failpoints jdbc.before_stage,
        #    jdbc.before_stage_commit and jdbc.after_stage); the foreachBatch path may keep
        #    them for the driver instead.
        #    A transient fault runs the transaction again within the retry budget, from the
        #    task's first row: ReplayableBatches keeps what Spark handed over.
        with ReplayableBatches(batches) as rows:
            return self._staging().stage(task, rows)

    def commit(self, batch_id: int, messages: Sequence[Any]) -> None:
        """2. Driver: apply the batch in one transaction; a no-op for a committed batch."""
        staging = self._staging()
        msgs = [m for m in messages if m is not None]
        started = time.perf_counter()
        # A transient fault runs the whole transaction again, within the retry budget. When
        # it struck during COMMIT, the outcome is unknown here; the next attempt's step 2a
        # reads it from the commit row: batch_id there means it committed (a replay: no-op).
        rows = self._retrying(f"committing batch {batch_id} (step 2)",
                              lambda: self._commit_once(staging, batch_id, msgs))
        # 2g. What the commit transaction cannot do itself, run again whole on a transient
        #     error (commitScope=prepared: COMMIT PREPARED what 2c recorded; on a replay too,
        #     which finishes a commit that stopped between 2f and 2g; nothing otherwise).
        self._retrying(f"committing the prepared transactions of batch {batch_id} (step 2g)",
                       lambda: staging.finish(batch_id))
        if rows is None:
            log.info("eo_jdbc sink %s: batch %d was already committed; replay is a no-op",
                     self.options.sink_id, batch_id)
            channel.replay_event(FAMILY, self.options.sink_id, batch_id)
            return
        # 2f. (after) The batch is in the database; Spark's commit log is not written yet.
        failpoints.hit("jdbc.after_commit", batch_id)
        log.info("eo_jdbc sink %s: committed batch %d (%d rows, %d writers) into %s in %.1f ms",
                 self.options.sink_id, batch_id, rows, len(msgs), self.options.qualified_table,
                 (time.perf_counter() - started) * 1000)
        channel.commit_event(FAMILY, self.options.sink_id, batch_id, rows=rows,
                             steps={"commit": time.perf_counter() - started})

    def _commit_once(self, staging: Staging, batch_id: int, msgs: Sequence[Any]) -> int | None:
        sink_id = self.options.sink_id
        db = self.database
        with db.connect(isolation=True) as conn, conn.begin():
            # 2a. Lock the sink's commit row. The last committed batch again is a replay
            #     (clear what it staged, change nothing else); a lower id (a new checkpoint,
            #     a second writer) raises and rolls back.
            last = db.commits.lock(conn, sink_id)
            if not check_batch_order(FAMILY, sink_id, batch_id, last, self._where(),
                                     self._reset_command()):
                staging.clear(conn, batch_id, msgs)
                return None
            failpoints.hit("jdbc.after_lock", batch_id)
            # 2b. Verify: the staged rows are exactly what the winning attempts reported.
            staging.verify(conn, batch_id, msgs)
            failpoints.hit("jdbc.after_verify", batch_id)
            # 2c. Apply them to the target (the write mode's SQL, or COPY of the blocks).
            rows = staging.apply(conn, batch_id, msgs)
            failpoints.hit("jdbc.after_apply", batch_id)
            # 2d. Record: move the commit row to this batch, in the same transaction.
            db.commits.record(conn, sink_id, batch_id, rows)
            failpoints.hit("jdbc.after_record", batch_id)
            # 2e. Clear the staged rows of batches up to this one (losers, orphans).
            staging.clear(conn, batch_id, msgs)
            failpoints.hit("jdbc.before_commit", batch_id)
        # 2f. COMMIT: leaving the block committed the transaction.
        return rows

    def abort(self, batch_id: int, messages: Sequence[Any | None]) -> None:
        """3. Delete this batch's staged rows. Best effort: whatever is left is an orphan
        that the next commit removes, so a failing cleanup must not hide the original error."""
        db = self.database
        try:
            # 3. Abort: delete what this batch staged, whichever staging tables exist, and
            #    roll back what its tasks prepared (commitScope=prepared). With
            #    commitScope=task the tasks' committed rows stay, with their claims: the
            #    batch written again skips those tasks.
            with db.connect() as conn, conn.begin():
                db.tables.delete_batch(conn, batch_id)
            if self.options.commit_scope == "prepared":
                roll_back_batch(db, batch_id)
        except Exception as e:  # noqa: BLE001 - see docstring
            log.warning("eo_jdbc sink %s: could not remove staged rows of aborted batch %d "
                        "(the next commit removes them): %s", self.options.sink_id, batch_id,
                        db.dialect.describe(e))

    # -- the driver's share of a foreachBatch write (sized by the Spark adapter) -------------
    @property
    def inline_budget(self) -> int:
        """``smallBatchRows``: in ``foreachBatch``, up to this many rows of a batch (split
        over its partitions) go to the driver and are written by the commit transaction
        itself. A small batch then costs exactly one database transaction, and a large one
        is never collected on the driver and never computed twice."""
        return self.options.small_batch_rows

    def with_inline_limit(self, rows_per_partition: int) -> JdbcSink:
        sink = copy.copy(self)
        sink._inline_limit = rows_per_partition
        return sink
