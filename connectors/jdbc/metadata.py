"""The commit table of the JDBC sink: ``eo_sink_commits`` (docs/jdbc-sink.md,
"How a batch is written").

One row per sink: ``(sink_id, batch_id, rows, committed_at)``. It is Apex Malhar's
``dt_meta(app id, operator id, window)``: the last batch id whose rows are in the target,
moved in the *same* transaction as the rows themselves, so that a crash at any point leaves
the two consistent. ``batch_id = -1`` means "registered, nothing committed yet", and
``-2 - N`` "nothing committed since a reset that followed batch N" (:func:`reset_mark`): the
row exists from the first use on, so that ``SELECT ... FOR UPDATE`` always has a row to lock
and two committers of one sink serialize on it instead of racing to insert it.

The table's name (and schema) is configurable with the option ``metadataTable``. All SQL is
built with SQLAlchemy Core, so identifiers are quoted by the dialect.

Beside it, :class:`TasksTable` (``<commit table>_tasks``) holds what the commit scopes
``task`` and ``prepared`` record per writer partition of a batch in flight
(``connectors.jdbc.scopes``).
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

log = logging.getLogger(__name__)

DEFAULT_NAME = "eo_sink_commits"
#: stored batch id of a registered sink that has committed nothing yet
NOTHING_COMMITTED = -1


def reset_mark(last: int) -> int:
    """The stored batch id after a reset that followed batch ``last``: ``-2 - last``. Like
    ``-1`` it is below every batch id (nothing committed since), and it keeps ``last`` for
    ``sink status``: a reset stays visible until the restarted query's first commit."""
    return -2 - last


def reset_after(stored: int) -> int | None:
    """The batch a reset followed, if ``stored`` is a reset mark; else None."""
    return -2 - stored if stored <= -2 else None


_T = TypeVar("_T", bound="_StateTable")
_STATE_TABLES: dict[tuple[type, str, str | None], _StateTable] = {}
_LOCK = threading.Lock()


class _StateTable:
    """A table of the sink's own state, created when missing."""

    @classmethod
    def of(cls: type[_T], name: str, schema: str | None = None) -> _T:
        """The table of that name, one object per process and class: SQLAlchemy's statement
        cache keys on the table object, so a new one per batch (Spark makes the sink anew
        for each) would compile every statement again (``tables._named`` says more)."""
        with _LOCK:
            found = _STATE_TABLES.get((cls, name, schema))
            if found is None:
                found = _STATE_TABLES[(cls, name, schema)] = cls(name, schema)
        return found  # type: ignore[return-value]

    def __init__(self, name: str, schema: str | None, *columns: sa.Column[Any]) -> None:
        self.name = name
        self.schema = schema
        self.table = sa.Table(name, sa.MetaData(), *columns, schema=schema)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    def create(self, conn: sa.Connection) -> None:
        """Create the table if missing (idempotent; concurrent creators are tolerated)."""
        try:
            self.table.create(conn, checkfirst=True)
        except sa.exc.DBAPIError as e:
            # Two processes creating it at once: the loser sees "already exists".
            if "exist" not in str(e.orig).lower():
                raise
            log.debug("%s was created concurrently", self.qualified)


class CommitsTable(_StateTable):
    """``eo_sink_commits(sink_id, batch_id, rows, committed_at)`` in one database."""

    def __init__(self, name: str = DEFAULT_NAME, schema: str | None = None) -> None:
        super().__init__(
            name, schema,
            # VARCHAR, not TEXT: MySQL/MariaDB cannot index an unbounded TEXT primary key.
            sa.Column("sink_id", sa.String(255), primary_key=True),
            sa.Column("batch_id", sa.BigInteger, nullable=False),
            sa.Column("rows", sa.BigInteger),
            sa.Column("committed_at", sa.DateTime),
        )

    def register(self, conn: sa.Connection, sink_id: str) -> None:
        """Insert the sink's row (``batch_id = -1``) unless it exists."""
        if self.read(conn, sink_id) is not None:
            return
        try:
            with conn.begin_nested():
                conn.execute(
                    self.table.insert().values(
                        sink_id=sink_id, batch_id=NOTHING_COMMITTED, rows=0, committed_at=_now()
                    )
                )
        except sa.exc.IntegrityError:
            log.debug("sink %s was registered concurrently", sink_id)

    def read(self, conn: sa.Connection, sink_id: str) -> int | None:
        """The stored batch id (``-1`` when nothing committed) or None when no row exists."""
        t = self.table
        row = conn.execute(sa.select(t.c.batch_id).where(t.c.sink_id == sink_id)).first()
        return None if row is None else int(row[0])

    def last_committed(self, conn: sa.Connection, sink_id: str) -> int | None:
        stored = self.read(conn, sink_id)
        return None if stored is None or stored < 0 else stored

    def lock(self, conn: sa.Connection, sink_id: str) -> int | None:
        """``SELECT batch_id ... FOR UPDATE``: the last committed batch, row locked until the
        end of this transaction (SQLite has no row locks; its ``BEGIN IMMEDIATE`` already
        holds the database's write lock). None when nothing was committed."""
        t = self.table
        row = conn.execute(
            sa.select(t.c.batch_id).where(t.c.sink_id == sink_id).with_for_update()
        ).first()
        if row is None:
            return None
        return None if int(row[0]) < 0 else int(row[0])

    def lock_shared(self, conn: sa.Connection, sink_id: str) -> int | None:
        """``SELECT batch_id ... FOR SHARE``: the last committed batch, read under a shared
        lock until the end of this transaction, so a commit of the sink (``lock``) waits for
        this transaction and this one for a commit under way. None when nothing committed."""
        t = self.table
        row = conn.execute(
            sa.select(t.c.batch_id).where(t.c.sink_id == sink_id).with_for_update(read=True)
        ).first()
        return None if row is None or int(row[0]) < 0 else int(row[0])

    def reset(self, conn: sa.Connection, sink_id: str) -> int | None:
        """Move the sink's row below every batch id (nothing committed), locking it first:
        to :func:`reset_mark` of its last batch, with the reset's time, so that status shows
        it; a sink that committed nothing stays as it is. Returns the stored batch id it
        held, or None when the sink has no row. The row stays: it is what committers lock."""
        t = self.table
        row = conn.execute(
            sa.select(t.c.batch_id).where(t.c.sink_id == sink_id).with_for_update()
        ).first()
        if row is None:
            return None
        stored = int(row[0])
        if stored >= 0:
            conn.execute(t.update().where(t.c.sink_id == sink_id)
                         .values(batch_id=reset_mark(stored), rows=0, committed_at=_now()))
        return stored

    def record(self, conn: sa.Connection, sink_id: str, batch_id: int, rows: int) -> None:
        """Move the sink's row to ``batch_id``, inside the caller's commit transaction."""
        t = self.table
        result = conn.execute(
            t.update()
            .where(t.c.sink_id == sink_id)
            .values(batch_id=batch_id, rows=rows, committed_at=_now())
        )
        if result.rowcount == 0:
            # The row vanished since registration (someone deleted it by hand). Inserting
            # here is still atomic with the data: a concurrent inserter fails on the key.
            conn.execute(
                t.insert().values(
                    sink_id=sink_id, batch_id=batch_id, rows=rows, committed_at=_now()
                )
            )


def _now() -> _dt.datetime:
    # Naive UTC: the column is a plain TIMESTAMP/DATETIME on every dialect.
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


#: ``TasksTable.rows`` of a claim whose task has not written yet (never committed so)
CLAIMED = -1


def tasks_name(commits_name: str) -> str:
    """``<commit table>_tasks``, at most 63 characters (PostgreSQL's identifier limit)."""
    import hashlib

    name = f"{commits_name}_tasks"
    if len(name) <= 63:
        return name
    return f"{commits_name[:48]}_{hashlib.sha256(commits_name.encode()).hexdigest()[:8]}_tasks"


class TasksTable(_StateTable):
    """``<commit table>_tasks(sink_id, batch_id, writer_id, rows, txn, committed_at)``: one
    row per writer partition of a batch in flight, for the commit scopes that write straight
    into the target (``connectors.jdbc.scopes``, docs/design.md "JDBC sink", steps 4 and 5):

    - ``commitScope=task``: the task's *claim*, inserted and given its row count in the
      task's own transaction, with its rows; a later attempt of the same task finds it and
      writes nothing. The driver's commit checks the claims against the tasks' messages and
      deletes them with the commit row's move.
    - ``commitScope=prepared``: the driver's record of the winning attempts' prepared
      transactions (``txn``), written with the commit row's move; what a restart commits.
    """

    def __init__(self, name: str, schema: str | None = None) -> None:
        super().__init__(
            name, schema,
            sa.Column("sink_id", sa.String(255), primary_key=True),
            sa.Column("batch_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("writer_id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("rows", sa.BigInteger, nullable=False),
            sa.Column("txn", sa.String(200)),
            sa.Column("committed_at", sa.DateTime),
        )

    def _key(self, sink_id: str, batch_id: int, writer_id: int) -> Any:
        t = self.table
        return sa.and_(t.c.sink_id == sink_id, t.c.batch_id == batch_id,
                       t.c.writer_id == writer_id)

    def claim(self, conn: sa.Connection, sink_id: str, batch_id: int,
              writer_id: int) -> int | None:
        """Insert the claim of ``(batch_id, writer_id)``; None when this transaction now holds
        it, else the row count an earlier attempt committed with it. A claim another
        transaction inserted and has not committed makes this insert wait until it ends
        (the unique key), so two attempts never both write."""
        t = self.table
        try:
            with conn.begin_nested():
                conn.execute(t.insert().values(sink_id=sink_id, batch_id=batch_id,
                                               writer_id=writer_id, rows=CLAIMED,
                                               committed_at=_now()))
            return None
        except sa.exc.IntegrityError:
            row = conn.execute(sa.select(t.c.rows).where(
                self._key(sink_id, batch_id, writer_id))).first()
            if row is None:  # deleted since (its batch committed): the claim is taken
                return 0
            return int(row[0])

    def count(self, conn: sa.Connection, sink_id: str, batch_id: int, writer_id: int,
              rows: int) -> None:
        """Give this transaction's claim its row count."""
        conn.execute(self.table.update().where(self._key(sink_id, batch_id, writer_id))
                     .values(rows=rows, committed_at=_now()))

    def of_batch(self, conn: sa.Connection, sink_id: str,
                 batch_id: int) -> dict[int, tuple[int, str | None]]:
        """``writer -> (rows, txn)`` recorded for ``batch_id``."""
        t = self.table
        return {int(w): (int(n), x) for w, n, x in conn.execute(
            sa.select(t.c.writer_id, t.c.rows, t.c.txn)
            .where(t.c.sink_id == sink_id, t.c.batch_id == batch_id))}

    def record(self, conn: sa.Connection, sink_id: str, batch_id: int,
               entries: Sequence[tuple[int, int, str]]) -> None:
        """The driver's record of a batch's prepared transactions ``(writer, rows, txn)``."""
        if entries:
            conn.execute(self.table.insert(), [
                {"sink_id": sink_id, "batch_id": batch_id, "writer_id": w, "rows": n,
                 "txn": x, "committed_at": _now()} for w, n, x in entries])

    def recorded(self, conn: sa.Connection, sink_id: str) -> dict[str, int]:
        """``txn -> batch`` of every recorded prepared transaction of the sink."""
        t = self.table
        return {str(x): int(b) for x, b in conn.execute(
            sa.select(t.c.txn, t.c.batch_id).where(t.c.sink_id == sink_id,
                                                    t.c.txn.is_not(None)))}

    def delete_up_to(self, conn: sa.Connection, sink_id: str, batch_id: int) -> None:
        t = self.table
        conn.execute(t.delete().where(t.c.sink_id == sink_id, t.c.batch_id <= batch_id))

    def delete_txns(self, conn: sa.Connection, sink_id: str, txns: Sequence[str]) -> None:
        t = self.table
        if txns:
            conn.execute(t.delete().where(t.c.sink_id == sink_id, t.c.txn.in_(list(txns))))
