"""How a task's rows reach the JDBC sink's commit: three staging strategies, one interface.

Each strategy answers, for the rows of one batch (docs/design.md, "JDBC sink"):

- ``stage(task, batches)`` (executor, step 1): put the task's rows where the commit finds
  them, in the task's own transaction, and return a small message saying what it put there;
- ``verify(conn, batch_id, messages)`` (step 2b): fail the batch when that place does not
  hold exactly what the winning attempts reported;
- ``apply(conn, batch_id, messages)`` (step 2c): move the rows into the target inside the
  commit transaction; returns the rows applied;
- ``clear(conn, batch_id, messages)`` (step 2e, and a replay's step 2a): delete what
  batches up to ``batch_id`` staged.

The strategies:

- :class:`RowStaging`: tagged rows in the staging table ``eo_stage_<sink>`` (COPY on
  PostgreSQL, executemany elsewhere), applied with one set-based ``INSERT ... SELECT``;
- :class:`BlockStaging` (PostgreSQL append): the target's binary COPY tuples in large
  ``bytea`` blocks, streamed into one ``COPY target`` at commit; a task whose rows have no
  binary form stages rows instead;
- :class:`InlineStaging` (``foreachBatch``): a partition of at most ``limit`` rows travels
  to the driver as Arrow IPC and the commit transaction writes it itself; a larger one is
  staged by its task through the strategy it wraps.

``connectors.jdbc.scopes.staging_for`` chooses, from the commit scope, the prepared layout
and the inline limit; a strategy that wraps another hands it the messages it does not own, so
the commit calls each method once.
"""

from __future__ import annotations

import io
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from connectors.core.errors import JdbcSinkError
from connectors.core.sink import TaskInfo
from connectors.jdbc import pgbinary
from connectors.jdbc.columns import Layout, first_rows
from connectors.jdbc.database import Database
from connectors.jdbc.dialects import PostgresDialect


# -- stage messages (picklable, small) -------------------------------------------------------
@dataclass(frozen=True)
class StagedRows:
    """Stage message: this attempt's rows are in the staging table under ``token``."""

    writer_id: int
    token: int
    rows: int


@dataclass(frozen=True)
class StagedBlocks:
    """Stage message: this attempt's rows are binary COPY blocks under ``token``."""

    writer_id: int
    token: int
    rows: int
    blocks: int


@dataclass(frozen=True)
class InlineRows:
    """foreachBatch path: a small partition's rows travel to the driver (Arrow IPC)."""

    writer_id: int
    rows: int
    data: bytes = field(repr=False)

    def batches(self) -> list[pa.RecordBatch]:
        return list(pa.ipc.open_stream(self.data))


def new_token() -> int:
    """An attempt token: random, 62 bits (a bigint column, cheaper to COPY than a uuid).
    It only tells attempts of one batch apart; it is never an identity across retries."""
    return uuid.uuid4().int >> 66


def check_staged(sink_id: str, batch_id: int, table: str, expected: dict[int, Any],
                 counts: dict[int, Any], why: str) -> None:
    """The staging table must hold exactly what each winning attempt reported: a mismatch
    means staged rows were lost (or a second writer uses this sink_id), and committing
    anyway would drop or double rows silently. ``why``: ``Staging.lost_rows``."""
    bad = {t: (n, counts.get(t, 0)) for t, n in expected.items() if counts.get(t, 0) != n}
    if bad:
        raise JdbcSinkError(
            f"eo_jdbc sink {sink_id!r}: batch {batch_id}: staging table {table!r} does not "
            f"hold the rows the tasks reported (attempt: (reported, found) = {bad}); {why}. "
            "Nothing was committed: the batch written again (restart the query) is exact"
        )


# -- the strategies ------------------------------------------------------------------------
class Staging(ABC):
    """Where a task's rows wait for the commit, and how the commit checks, applies and
    clears them (see the module docstring)."""

    def __init__(self, db: Database, layout: Layout) -> None:
        self.db = db
        self.layout = layout
        self.options = db.options
        self.mode = db.options.write_mode
        self.tables = db.tables
        self.dialect = db.dialect

    @property
    def lost_rows(self) -> str:
        """The causes, for an error about staged rows that are not there."""
        if self.dialect.name == "postgresql" and not self.dialect.durable_staging:
            return ("with durableStaging=false the staging tables are UNLOGGED, and a "
                    "PostgreSQL crash, immediate shutdown or failover since the tasks staged "
                    "empties them (durableStaging=true keeps them); or another query uses "
                    "the same sink_id")
        return "is another query using the same sink_id?"

    @abstractmethod
    def stage(self, task: TaskInfo, batches: Iterable[pa.RecordBatch]) -> Any:
        """Executor: stage this task's rows; return the stage message. ``batches`` may be
        read more than once, each time from the first (``ReplayableBatches``): a retried
        staging transaction writes them again."""

    @abstractmethod
    def verify(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        """Commit: raise when the staged rows are not what the messages report."""

    @abstractmethod
    def apply(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> int:
        """Commit: write the staged rows into the target; return how many."""

    @abstractmethod
    def clear(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        """Commit (or replay): delete what batches up to ``batch_id`` staged."""

    def finish(self, batch_id: int) -> None:
        """After the commit transaction (or a replay's): what must happen outside it
        (``commitScope=prepared``: COMMIT PREPARED). Nothing for the others."""
        return None


class RowStaging(Staging):
    """Tagged rows in the staging table, applied set-based by the write mode
    (``connectors.jdbc.modes``)."""

    def stage(self, task: TaskInfo, batches: Iterable[pa.RecordBatch]) -> StagedRows:
        def write(conn: sa.Connection) -> StagedRows:
            token = new_token()  # each attempt its own (see Database.task_transaction)
            rows = self.write(conn, task.batch_id, task.writer_id, token, batches)
            return StagedRows(task.writer_id, token, rows)

        return self.db.task_transaction(task, write, self.layout)

    def write(self, conn: sa.Connection, batch_id: int, writer_id: int, token: int,
              batches: Iterable[pa.RecordBatch]) -> int:
        o = self.options
        return self.dialect.write_rows(
            conn, self.tables.stage_for_rows(conn, self.layout), self.layout.columns, batches,
            (batch_id, writer_id, token), o.batch_size, o.qualified_table,
            self.layout.stage_types)

    def land(self, conn: sa.Connection, batch_id: int,
             inline: Sequence[InlineRows]) -> list[StagedRows]:
        """The commit stages driver-side rows itself, inside its own transaction."""
        landed = []
        for m in inline:
            token = new_token()
            landed.append(StagedRows(m.writer_id, token,
                                     self.write(conn, batch_id, m.writer_id, token, m.batches())))
        return landed

    @staticmethod
    def _expected(messages: Sequence[Any]) -> dict[int, int]:
        return {m.token: m.rows for m in messages if isinstance(m, StagedRows) and m.rows > 0}

    def _count(self, conn: sa.Connection, batch_id: int, expected: dict[int, int]) -> None:
        stage = self.tables.stage(conn, self.layout)
        counts: dict[int, int] = {int(t): int(n) for t, n in conn.execute(
            sa.select(stage.c.eo_attempt, sa.func.count())
            .where(stage.c.eo_batch == batch_id, stage.c.eo_attempt.in_(list(expected)))
            .group_by(stage.c.eo_attempt)
        ).all()}
        check_staged(self.options.sink_id, batch_id, self.options.staging_table, expected,
                     counts, self.lost_rows)

    def verify(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        expected = self._expected(messages)
        if expected and not self.mode.counted_by_apply:  # else apply's row count checks
            self._count(conn, batch_id, expected)

    def apply(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> int:
        o = self.options
        expected = self._expected(messages)
        if not expected:
            return 0
        staged = sum(expected.values())
        stage = self.tables.stage(conn, self.layout)
        where = sa.and_(stage.c.eo_batch == batch_id, stage.c.eo_attempt.in_(list(expected)))
        applied = self.mode.apply(conn, self.dialect, self.tables.target_names(self.layout),
                                  stage, self.layout, where, o.batch_size)
        if self.mode.counted_by_apply and applied is None:
            self._count(conn, batch_id, expected)
        elif self.mode.counted_by_apply and applied != staged:
            self._count(conn, batch_id, expected)
            raise JdbcSinkError(
                f"eo_jdbc sink {o.sink_id!r}: batch {batch_id}: applied {applied} staged "
                f"rows, the tasks reported {staged}; nothing was committed")
        return staged

    def clear(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        self.dialect.clear_stage(conn, self.tables.stage(conn, self.layout), batch_id)


class BlockStaging(Staging):
    """PostgreSQL append: binary COPY blocks, one ``COPY target`` at commit."""

    def __init__(self, db: Database, layout: Layout, rows: RowStaging, store: PostgresDialect,
                 target_types: tuple[int, ...]) -> None:
        super().__init__(db, layout)
        self.rows = rows
        self.store = store
        self.target_types = target_types

    def stage(self, task: TaskInfo, batches: Iterable[pa.RecordBatch]) -> Any:
        first, _ = first_rows(batches)  # a peek: every attempt below reads from the start
        if first is None:
            return StagedRows(task.writer_id, new_token(), 0)
        # The schema the driver checked; a batch that differs stages rows instead.
        kinds = pgbinary.kinds_for(first.schema, self.layout.names, self.target_types)
        if kinds is None:
            return self.rows.stage(task, batches)

        def write(conn: sa.Connection) -> StagedBlocks:
            token = new_token()  # each attempt its own (see Database.task_transaction)
            rows, blocks = self.store.write_blocks(
                conn, self.tables.blocks(), self.layout.columns, batches,
                (task.batch_id, task.writer_id, token), self.options.qualified_table, kinds)
            return StagedBlocks(task.writer_id, token, rows, blocks)

        return self.db.task_transaction(task, write, self.layout)

    @staticmethod
    def _expected(messages: Sequence[Any]) -> dict[int, tuple[int, int]]:
        """``token -> (rows, blocks)`` of the attempts that staged blocks, in writer order."""
        return {m.token: (m.rows, m.blocks) for m in sorted(messages, key=lambda m: m.writer_id)
                if isinstance(m, StagedBlocks) and m.rows > 0}

    def verify(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        expected = self._expected(messages)
        if expected:
            counts = self.store.block_counts(conn, self.tables.blocks(), batch_id, list(expected))
            check_staged(self.options.sink_id, batch_id, self.options.blocks_table, expected,
                         counts, self.lost_rows)
        self.rows.verify(conn, batch_id, messages)

    def apply(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> int:
        """COPY the attempts' blocks into the target; the server must report exactly the
        rows the tasks staged."""
        expected = self._expected(messages)
        copied = 0
        if expected:
            with self.db.connect() as reader:  # closed (locks released) before 2e's TRUNCATE
                copied = self.store.copy_blocks(
                    conn, reader, self.tables.target_names(self.layout), self.layout.columns,
                    self.tables.blocks(), batch_id, list(expected))
            staged = sum(rows for rows, _ in expected.values())
            if copied != staged:
                raise JdbcSinkError(
                    f"eo_jdbc sink {self.options.sink_id!r}: batch {batch_id}: COPY into "
                    f"{self.options.qualified_table!r} took {copied} rows, the tasks staged "
                    f"{staged}; nothing was committed")
        return copied + self.rows.apply(conn, batch_id, messages)

    def clear(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        self.rows.clear(conn, batch_id, messages)
        rows = sum(n for n, _ in self._expected(messages).values())
        self.store.clear_blocks(conn, self.tables.blocks(), batch_id, rows)


class InlineStaging(Staging):
    """``foreachBatch``: small partitions go to the driver; larger ones to ``fallback``."""

    def __init__(self, db: Database, layout: Layout, rows: RowStaging, fallback: Staging,
                 limit: int) -> None:
        super().__init__(db, layout)
        self.rows = rows
        self.fallback = fallback
        self.limit = limit

    def stage(self, task: TaskInfo, batches: Iterable[pa.RecordBatch]) -> Any:
        held: list[pa.RecordBatch] = []
        n = 0
        for b in batches:
            held.append(b)
            n += b.num_rows
            if n > self.limit:
                return self.fallback.stage(task, batches)  # it reads them from the start
        return InlineRows(task.writer_id, n, _to_ipc(held))

    def verify(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        self.fallback.verify(conn, batch_id, messages)  # driver-side rows need no check

    def apply(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> int:
        inline = [m for m in messages if isinstance(m, InlineRows) and m.rows > 0]
        if not self.mode.as_is:
            # The set-based step applies them with the task-staged rows, in one statement.
            landed = self.rows.land(conn, batch_id, inline)
            return self.fallback.apply(conn, batch_id, [*messages, *landed])
        # Appended rows need no set-based step: COPY/insert them into the target right here.
        o = self.options
        target = self.tables.target_for_rows(conn, self.layout)
        direct = sum(self.dialect.write_rows(
            conn, target, self.layout.columns, m.batches(), None, o.batch_size,
            o.qualified_table, self.layout.target_types) for m in inline)
        return direct + self.fallback.apply(conn, batch_id, messages)

    def clear(self, conn: sa.Connection, batch_id: int, messages: Sequence[Any]) -> None:
        self.fallback.clear(conn, batch_id, messages)

    def finish(self, batch_id: int) -> None:
        self.fallback.finish(batch_id)


def _to_ipc(batches: list[pa.RecordBatch]) -> bytes:
    if not batches:
        return b""
    buf = io.BytesIO()
    with pa.ipc.new_stream(buf, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return buf.getvalue()
