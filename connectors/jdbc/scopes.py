"""How much one database transaction makes visible: the JDBC sink's commit scopes
(``commitScope``; docs/design.md "JDBC sink", steps 4, 5 and 2g; docs/jdbc-sink.md
"Commit scopes").

- ``batch`` (the default): the strategies of ``connectors.jdbc.staging``. The tasks stage
  their rows; the driver's one commit transaction applies them all and moves the commit row:
  a batch becomes visible at once, but every row is written twice and the second write is
  the driver's alone.
- ``task``: :class:`TaskCommit`. Each task writes its rows straight into the target and
  commits them in its own transaction, with its *claim* ``(sink_id, batch, writer)`` in
  ``<commit table>_tasks``; a later attempt of the task finds the claim and writes nothing.
  The driver's commit checks the claims and moves the commit row. Each row is written once,
  by the task that holds it, in parallel; a reader sees the batch arrive task by task.
- ``prepared`` (PostgreSQL, append): :class:`PreparedCommit`. Each task writes its rows
  straight into the target and ``PREPARE TRANSACTION``s them; the driver records the
  winners' prepared transactions with the commit row's move, then ``COMMIT PREPARED`` each.
  A failed batch shows nothing; a committed one appears writer by writer within
  milliseconds, or, after a crash between the record and those commits, when the query
  runs again (each commit and replay first finishes what the record names).

Both are :class:`~connectors.jdbc.staging.Staging` strategies: the protocol in
``connectors.jdbc.sink`` calls ``stage``, ``verify``, ``apply``, ``clear`` and ``finish`` the
same way for every scope.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from connectors.core import failpoints
from connectors.core.errors import JdbcSinkError
from connectors.core.sink import TaskInfo
from connectors.jdbc import pgcopy
from connectors.jdbc.columns import Layout, first_rows
from connectors.jdbc.database import Database
from connectors.jdbc.metadata import TasksTable
from connectors.jdbc.staging import (
    BlockStaging,
    InlineStaging,
    RowStaging,
    Staging,
    new_token,
)

log = logging.getLogger(__name__)


# -- stage messages (picklable, small) -------------------------------------------------------
@dataclass(frozen=True)
class Written:
    """Stage message (``commitScope=task``): the task's rows are committed in the target."""

    writer_id: int
    rows: int
    #: an earlier attempt of this task committed the rows (its claim says how many); this
    #: one wrote nothing
    earlier: bool = False
    #: the batch was committed when the task looked: it wrote nothing (a replay)
    committed: bool = False


@dataclass(frozen=True)
class Prepared:
    """Stage message (``commitScope=prepared``): the task's rows wait in the prepared
    transaction ``txn`` (None: nothing prepared, no rows or the batch committed)."""

    writer_id: int
    rows: int
    txn: str | None
    committed: bool = False


def claim_mismatches(reported: dict[int, int],
                     claims: dict[int, int]) -> dict[int, tuple[int, int | None]]:
    """``writer -> (reported rows, recorded rows)`` where a batch's claims and its tasks'
    reports differ: a task with rows and no claim (or another count), or a claim with rows
    of a writer that reported none (an earlier run split the batch otherwise)."""
    return {w: (reported.get(w, 0), claims.get(w)) for w in sorted({*reported, *claims})
            if reported.get(w, 0) != claims.get(w, 0)}


class TaskCommit(Staging):
    """``commitScope=task``: each task commits its rows into the target (step 4)."""

    def __init__(self, db: Database, layout: Layout, rows: RowStaging) -> None:
        super().__init__(db, layout)
        self.rows = rows
        self.tasks = db.tables.tasks
        self.commits = db.commits

    # -- executor -------------------------------------------------------------------------
    def stage(self, task: TaskInfo, batches: Iterable[pa.RecordBatch]) -> Any:
        first, _ = first_rows(batches)  # a peek: every attempt below reads from the start
        if first is None:
            return Written(task.writer_id, 0)  # nothing to write, nothing to claim
        sink_id, batch, writer = self.options.sink_id, task.batch_id, task.writer_id

        def write(conn: sa.Connection) -> Written:
            # 4a. Read the commit row under a shared lock, held to this transaction's end: a
            #     commit of the sink waits for this transaction, and this one for a commit
            #     under way. The batch committed (a replay, a late attempt): write nothing.
            last = self.commits.lock_shared(conn, sink_id)
            if last is not None and last >= batch:
                return Written(writer, 0, committed=True)
            # 4b. Claim (batch, writer). A claim an attempt committed: its rows are in the
            #     target; write nothing and report its count. A claim an attempt holds
            #     uncommitted makes this insert wait for that attempt to end.
            earlier = self.tasks.claim(conn, sink_id, batch, writer)
            if earlier is not None:
                log.info("eo_jdbc sink %s: batch %d writer %d was written by an earlier "
                         "attempt (%d rows); this attempt writes nothing", sink_id, batch,
                         writer, earlier)
                return Written(writer, earlier, earlier=True)
            # 4c. Write the rows into the target, in this transaction.
            rows = self.write(conn, task, batches)
            failpoints.hit("jdbc.task_written", batch)
            # 4d. Count them on the claim; leaving the block commits rows and claim at once.
            self.tasks.count(conn, sink_id, batch, writer, rows)
            return Written(writer, rows)

        return self.db.task_transaction(task, write, self.layout)

    def write(self, conn: sa.Connection, task: TaskInfo,
              batches: Iterable[pa.RecordBatch]) -> int:
        """The task's rows into the target, inside ``conn``'s transaction: appended rows
        straight (COPY on PostgreSQL); the other modes through a temporary table and the
        mode's set-based statement, in key order (two tasks of a batch that touch the same
        keys take their row locks in one order, so they wait for each other but never
        deadlock)."""
        o, layout = self.options, self.layout
        if self.mode.as_is:
            return self.dialect.write_rows(
                conn, self.tables.target_for_rows(conn, layout), layout.columns, batches,
                None, o.batch_size, o.qualified_table, layout.target_types)
        scratch = self.dialect.scratch(conn, self.tables.stage_for_rows(conn, layout))
        rows = self.dialect.write_rows(
            conn, scratch, layout.columns, batches, (task.batch_id, task.writer_id, 0),
            o.batch_size, o.qualified_table, layout.stage_types)
        self.mode.apply(conn, self.dialect, self.tables.target_names(layout), scratch, layout,
                        sa.true(), o.batch_size, ordered=True)
        return rows

    # -- driver ---------------------------------------------------------------------------
    def verify(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        """2b. The claims of the batch are exactly the tasks' reports: every task with rows
        has its claim with its count, and no other task of the batch has one."""
        reported = {m.writer_id: m.rows for m in messages
                    if isinstance(m, Written) and not m.committed and m.rows > 0}
        claims = {w: n for w, (n, _) in
                  self.tasks.of_batch(conn, self.options.sink_id, batch_id).items()}
        self.check_claims(batch_id, reported, claims)
        self.rows.verify(conn, batch_id, messages)

    def check_claims(self, batch_id: int, reported: dict[int, int],
                     claims: dict[int, int]) -> None:
        bad = claim_mismatches(reported, claims)
        if bad:
            o = self.options
            raise JdbcSinkError(
                f"eo_jdbc sink {o.sink_id!r}: batch {batch_id}: the tasks' records in "
                f"{self.tasks.qualified!r} do not match what the tasks reported (writer: "
                f"(reported rows, recorded rows) = {bad}). With commitScope=task every task "
                f"commits its own rows into {o.qualified_table!r}, so an earlier run of this "
                "batch whose rows were split into other partitions (a changed number of "
                "partitions, or input that is not the same on replay) has left rows there "
                "that this run's tasks do not account for: the batch may be doubled or "
                "incomplete in the table. The commit row was not moved. Check the table for "
                "this batch's rows, then run `eo-connectors sink reset` and restart, or use "
                "commitScope=batch, which never shows a batch before its commit"
            )

    def apply(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> int:
        """2c. The tasks' rows are in the target already; rows the commit holds itself (the
        foreachBatch path's small partitions, landed in the staging table) are applied by
        the mode's statement."""
        written = sum(m.rows for m in messages if isinstance(m, Written) and not m.committed)
        return written + self.rows.apply(conn, batch_id, messages)

    def clear(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        """2e. Delete the claims of batches up to this one, and whatever a batch scope left
        in the staging tables (a previous release's or a previous scope's staged batch,
        which this scope's replay wrote itself)."""
        self.tasks.delete_up_to(conn, self.options.sink_id, batch_id)
        self.rows.clear(conn, batch_id, messages)
        store = self.dialect.block_store()
        if self.layout.blocks and store is not None:
            store.clear_blocks(conn, self.tables.blocks(), batch_id, 0)


# -- two-phase commit (PostgreSQL) -------------------------------------------------------------
@dataclass(frozen=True)
class PreparedTxn:
    """One of the sink's prepared transactions, named ``eo_<sink digest>_<B>_<w>_<token>``."""

    txn: str
    batch_id: int
    writer_id: int


def txn_prefix(sink_id: str) -> str:
    """``eo_<16 hex>_``: the sink's prepared transactions (a gid is at most 200 bytes;
    a sink id may be 128 characters)."""
    return f"eo_{hashlib.sha256(sink_id.encode()).hexdigest()[:16]}_"


def txn_name(sink_id: str, batch_id: int, writer_id: int, token: int) -> str:
    return f"{txn_prefix(sink_id)}{batch_id}_{writer_id}_{token}"


def prepared_txns(conn: sa.Connection, sink_id: str) -> list[PreparedTxn]:
    """The sink's prepared transactions in this database (``pg_prepared_xacts``)."""
    prefix = txn_prefix(sink_id)
    out = []
    for gid in pgcopy.prepared_gids(conn, prefix):
        parts = gid[len(prefix):].split("_")
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            out.append(PreparedTxn(gid, int(parts[0]), int(parts[1])))
    return out


class PreparedCommit(TaskCommit):
    """``commitScope=prepared``: each task prepares its rows; the driver records the batch,
    then commits what it recorded (steps 5 and 2g)."""

    def stage(self, task: TaskInfo, batches: Iterable[pa.RecordBatch]) -> Any:
        first, _ = first_rows(batches)
        if first is None:
            return Prepared(task.writer_id, 0, None)
        sink_id, batch, writer = self.options.sink_id, task.batch_id, task.writer_id

        def write(conn: sa.Connection) -> Prepared:
            # 5a. In a transaction of its own (a prepared transaction keeps its locks, and
            #     one on the commit row would keep the driver out until it is committed):
            #     the commit row under a shared lock; the batch committed: write nothing.
            #     Else roll back what earlier attempts of this task prepared (their rows
            #     would hold this attempt's unique keys) and orphans of committed batches.
            if self.roll_back_stale(batch, writer):
                return Prepared(writer, 0, None, committed=True)
            # 5b. Write the rows into the target, in this transaction.
            rows = self.write(conn, task, batches)
            failpoints.hit("jdbc.task_written", batch)
            # 5c. PREPARE TRANSACTION: the rows wait, durable, for the driver's commit.
            txn = txn_name(sink_id, batch, writer, new_token())
            pgcopy.prepare_transaction(conn, txn)
            return Prepared(writer, rows, txn)

        try:
            return self.db.task_transaction(task, write, self.layout)
        except JdbcSinkError as e:
            if "prepared transactions" in str(e).lower():
                raise JdbcSinkError(
                    f"{e}. commitScope=prepared holds one prepared transaction per running "
                    "task until the batch commits: raise max_prepared_transactions (a "
                    "server restart) to at least the query's tasks, or use commitScope=task"
                ) from e
            raise

    def roll_back_stale(self, batch_id: int, writer_id: int) -> bool:
        """5a; True when the batch is committed already."""
        sink_id = self.options.sink_id
        with self.db.connect() as side, side.begin():
            last = self.commits.lock_shared(side, sink_id)
            if last is not None and last >= batch_id:
                return True
            recorded = self.tasks.recorded(side, sink_id)
            stale = [x.txn for x in prepared_txns(side, sink_id) if x.txn not in recorded and (
                (x.batch_id == batch_id and x.writer_id == writer_id)
                or (last is not None and x.batch_id <= last))]
            if stale:
                with self.db.connect().execution_options(isolation_level="AUTOCOMMIT") as auto:
                    for txn in stale:
                        pgcopy.end_prepared(auto, txn, commit=False)
                log.info("eo_jdbc sink %s: rolled back %d stale prepared transactions "
                         "before writing batch %d writer %d", sink_id, len(stale), batch_id,
                         writer_id)
        return False

    def verify(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        """2b. Every winning attempt's prepared transaction is still there."""
        wanted = {m.txn for m in messages if isinstance(m, Prepared) and m.txn is not None}
        if wanted:
            there = {x.txn for x in prepared_txns(conn, self.options.sink_id)}
            gone = sorted(wanted - there)
            if gone:
                raise JdbcSinkError(
                    f"eo_jdbc sink {self.options.sink_id!r}: batch {batch_id}: prepared "
                    f"transactions {gone} of the winning task attempts are gone (rolled back "
                    "by another attempt of the same task: is Spark speculation on?); nothing "
                    "was committed: the batch written again (restart the query) is exact")
        self.rows.verify(conn, batch_id, messages)

    def apply(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> int:
        """2c. Record the winners' prepared transactions, in the commit transaction: what
        2g commits, now or after a crash."""
        won = [(m.writer_id, m.rows, m.txn) for m in messages
               if isinstance(m, Prepared) and m.txn is not None]
        self.tasks.record(conn, self.options.sink_id, batch_id, won)
        return sum(n for _, n, _ in won) + self.rows.apply(conn, batch_id, messages)

    def clear(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        """2e. The record stays until 2g committed what it names."""
        self.rows.clear(conn, batch_id, messages)

    def finish(self, batch_id: int) -> None:
        """2g. After the commit (or finding the batch committed): ``COMMIT PREPARED`` every
        recorded transaction still prepared, roll back the sink's other prepared
        transactions of committed batches (losers, orphans), delete the records."""
        failpoints.hit("jdbc.before_finish", batch_id)
        sink_id = self.options.sink_id
        with self.db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            last = self.commits.last_committed(conn, sink_id)
            if last is not None:
                settle(conn, self.tasks, sink_id, last, batch_id)


def settle(conn: sa.Connection, tasks: TasksTable, sink_id: str, up_to: int | None,
           batch_id: int | None = None) -> tuple[int, int]:
    """On an autocommit connection: ``COMMIT PREPARED`` the sink's recorded transactions,
    ``ROLLBACK PREPARED`` its unrecorded ones of batches up to ``up_to`` (None: all, the
    query being stopped: ``sink reset``), delete those records. ``(committed, rolled
    back)``."""
    recorded = tasks.recorded(conn, sink_id)
    done = dropped = 0
    for x in prepared_txns(conn, sink_id):
        if x.txn in recorded:
            pgcopy.end_prepared(conn, x.txn, commit=True)
            done += 1
            if done == 1:
                failpoints.hit("jdbc.mid_finish", batch_id)
        elif up_to is None or x.batch_id <= up_to:
            pgcopy.end_prepared(conn, x.txn, commit=False)
            dropped += 1
    # What the record names and is no longer prepared is committed: only 2g commits a
    # recorded transaction, and nothing rolls one back.
    tasks.delete_txns(conn, sink_id,
                      [t for t, b in recorded.items() if up_to is None or b <= up_to])
    return done, dropped


def roll_back_batch(db: Database, batch_id: int) -> int:
    """3. Abort (``commitScope=prepared``): roll back what the batch's attempts prepared."""
    sink_id = db.options.sink_id
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        recorded = db.tables.tasks.recorded(conn, sink_id)
        mine = [x.txn for x in prepared_txns(conn, sink_id)
                if x.batch_id == batch_id and x.txn not in recorded]
        for txn in mine:
            pgcopy.end_prepared(conn, txn, commit=False)
    return len(mine)


def check_prepared_capacity(conn: sa.Connection, db: Database) -> None:
    """Driver, before any task: ``commitScope=prepared`` needs ``max_prepared_transactions``
    above 0 (PostgreSQL's default is 0)."""
    limit = pgcopy.max_prepared_transactions(conn)
    if limit <= 0:
        raise JdbcSinkError(
            f"eo_jdbc sink {db.options.sink_id!r}: commitScope=prepared needs prepared "
            f"transactions, and the server at {db.options.redacted_url} has "
            "max_prepared_transactions = 0 (PostgreSQL's default). Set it in postgresql.conf "
            "to at least the number of the query's tasks that run at once (a server restart), "
            "or use commitScope=task (each task commits its own rows) or batch")


def staging_for(db: Database, layout: Layout, inline_limit: int | None) -> Staging:
    """The strategy of a sink with this prepared layout and commit scope: with
    ``commitScope=batch``, blocks where the layout says so (PostgreSQL append, every column
    with a binary form), else rows; with ``task`` or ``prepared``, the tasks write into the
    target themselves (``connectors.jdbc.scopes``). Wrapped by the inline path when the
    adapter gave a limit (``foreachBatch``)."""
    rows = RowStaging(db, layout)
    chosen: Staging = rows
    store = db.dialect.block_store()
    scope = db.options.commit_scope
    if scope == "task":
        chosen = TaskCommit(db, layout, rows)
    elif scope == "prepared":
        chosen = PreparedCommit(db, layout, rows)
    elif layout.blocks and store is not None and layout.target_types is not None:
        chosen = BlockStaging(db, layout, rows, store, layout.target_types)
    if inline_limit is not None:
        chosen = InlineStaging(db, layout, rows, chosen, inline_limit)
    return chosen
