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
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading

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


_COMMIT_TABLES: dict[tuple[str, str | None], CommitsTable] = {}
_LOCK = threading.Lock()


class CommitsTable:
    """``eo_sink_commits(sink_id, batch_id, rows, committed_at)`` in one database."""

    @classmethod
    def of(cls, name: str = DEFAULT_NAME, schema: str | None = None) -> CommitsTable:
        """The commit table of that name, one object per process: SQLAlchemy's statement
        cache keys on the table object, so a new one per batch (Spark makes the sink anew
        for each) would compile every statement again (``tables._named`` says more)."""
        with _LOCK:
            found = _COMMIT_TABLES.get((name, schema))
            if found is None:
                found = _COMMIT_TABLES[(name, schema)] = cls(name, schema)
        return found

    def __init__(self, name: str = DEFAULT_NAME, schema: str | None = None) -> None:
        self.name = name
        self.schema = schema
        self.table = sa.Table(
            name,
            sa.MetaData(),
            # VARCHAR, not TEXT: MySQL/MariaDB cannot index an unbounded TEXT primary key.
            sa.Column("sink_id", sa.String(255), primary_key=True),
            sa.Column("batch_id", sa.BigInteger, nullable=False),
            sa.Column("rows", sa.BigInteger),
            sa.Column("committed_at", sa.DateTime),
            schema=schema,
        )

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
