"""The operator's commands on the JDBC sink's commit table (``eo-connectors sink ...``).

- :func:`status`: the commit rows, one per sink (``sink status --url``);
- :func:`reset`: record a restart, so the sink's next query, on a new checkpoint, starts at
  batch 0 (``sink reset --url``): the sink's row goes below every batch id, to a mark that
  keeps the last batch for :func:`status` (``metadata.reset_mark``).

Both open an engine of their own on the URL as given and dispose of it after. Neither
creates a database: SQLite would create a missing file on connect, so a SQLite file must
exist, and :func:`status`, a read-only command (docs/design.md), opens it read-only. Errors
are :class:`ConnectorError` with one line for the person at the terminal, the password in
the URL redacted.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import sqlalchemy as sa

from connectors.core.errors import ConnectorError
from connectors.core.options import redact_url
from connectors.jdbc.metadata import (
    DEFAULT_NAME,
    NOTHING_COMMITTED,
    CommitsTable,
    TasksTable,
    reset_after,
    tasks_name,
)
from connectors.jdbc.options import parse_table_name


def status(url: str, table: str = DEFAULT_NAME,
           sink_id: str | None = None) -> list[dict[str, Any]]:
    """The rows of the commit table ``table`` at ``url`` (only ``sink_id``'s when given):
    ``sink_id``, ``batch_id`` (``-1``: nothing committed yet), ``rows``, ``committed_at``
    and ``reset_after``: the last batch before a ``sink reset`` when nothing was committed
    since (``committed_at`` is then the reset's time), else None."""
    shown = redact_url(url)
    engine = _engine(url, "sink status", read_only=True)
    try:
        with engine.connect() as conn:
            present = sa.inspect(conn).has_table(table)
    except Exception as e:
        engine.dispose()
        raise ConnectorError(
            f"sink status: cannot connect to {shown}: {redact_url(str(e).splitlines()[0])}"
        ) from None
    if not present:
        engine.dispose()
        raise ConnectorError(
            f"sink status: {shown} has no table {table!r}: no eo_jdbc sink has committed "
            "there (check --url, or --table if the sink sets metadataTable)")
    t = sa.table(table, sa.column("sink_id"), sa.column("batch_id"), sa.column("rows"),
                 sa.column("committed_at"))
    query = sa.select(t.c.sink_id, t.c.batch_id, t.c.rows, t.c.committed_at)
    if sink_id:
        query = query.where(t.c.sink_id == sink_id)
    try:
        with engine.connect() as conn:
            rows = conn.execute(query.order_by(t.c.sink_id)).all()
    except Exception as e:
        raise ConnectorError(
            f"sink status: cannot read {table!r} at {shown}: "
            f"{redact_url(str(e).splitlines()[0])}"
        ) from None
    finally:
        engine.dispose()
    if not rows:
        which = f"sink {sink_id!r}" if sink_id else "any sink"
        raise ConnectorError(f"sink status: table {table!r} at {shown} has no row for "
                             f"{which}: no such eo_jdbc sink has run there")
    return [{"sink_id": r[0], "batch_id": max(int(r[1]), NOTHING_COMMITTED), "rows": r[2],
             "committed_at": r[3], "reset_after": reset_after(int(r[1]))} for r in rows]


def reset(url: str, sink_id: str, table: str = DEFAULT_NAME) -> int | None:
    """Record a restart of ``sink_id``: its row in the commit table ``table`` (``schema.table``
    allowed) goes below every batch id (``metadata.reset_mark``), so the new query's batches
    from 0 are accepted instead of refused as lower than the last committed one. Run it with
    the query stopped. Returns the last committed batch before the reset (None: nothing was
    committed; after an earlier reset with nothing committed since, the batch before it)."""
    shown = redact_url(url)
    schema, name = parse_table_name(table, "--table")
    commits = CommitsTable(name, schema)
    tasks = TasksTable(tasks_name(name), schema)
    engine = _engine(url, "sink reset", read_only=False)
    try:
        with engine.begin() as conn:
            insp = sa.inspect(conn)
            if not insp.has_table(name, schema=schema):
                raise ConnectorError(f"sink reset: {shown} has no table {table!r}")
            has_tasks = insp.has_table(tasks.name, schema=schema)
            if has_tasks and engine.dialect.name == "postgresql":
                # commitScope=prepared: what the stopped query prepared is finished first,
                # as its next commit would have: recorded (its batch committed) committed,
                # the rest rolled back, so no prepared row of the old query holds a key.
                from connectors.jdbc.scopes import settle

                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as auto:
                    settle(auto, tasks, sink_id, None)
            stored = commits.reset(conn, sink_id)
            if stored is None:
                raise ConnectorError(f"sink reset: table {table!r} at {shown} has no "
                                     f"row for sink {sink_id!r}: nothing to reset")
            if has_tasks:
                # commitScope=task: the old query's claims would make the new query's tasks
                # of those batch ids write nothing.
                tasks.delete_up_to(conn, sink_id, 2**62)
    except ConnectorError:
        raise
    except Exception as e:
        raise ConnectorError(f"sink reset: cannot reset {sink_id!r} at {shown}: "
                             f"{redact_url(str(e).splitlines()[0])}") from None
    finally:
        engine.dispose()
    return stored if stored >= 0 else reset_after(stored)


def _engine(url: str, who: str, *, read_only: bool) -> sa.Engine:
    """An engine on ``url`` that cannot create a database: a SQLite file must exist (sqlite
    creates a missing one on connect), opened with ``mode=ro`` when ``read_only``."""
    try:
        parsed = sa.engine.make_url(url)
        if parsed.get_backend_name() == "sqlite":
            parsed = _existing_sqlite(parsed, who, read_only)
        return sa.create_engine(parsed)
    except ConnectorError:
        raise
    except Exception as e:
        raise ConnectorError(f"{who}: cannot use URL {redact_url(url)}: {url_problem(e)}"
                             ) from None


def _existing_sqlite(url: sa.URL, who: str, read_only: bool) -> sa.URL:
    """``url`` of a SQLite file that exists, as a read-only ``file:`` URI if asked; an
    in-memory database, or a ``file:`` URI the operator wrote (``uri=true``), as given."""
    if not url.database or url.database == ":memory:" or url.query.get("uri"):
        return url
    path = os.path.abspath(url.database)
    if not os.path.isfile(path):
        what = "is a directory, not a database file" if os.path.isdir(path) else "does not exist"
        raise ConnectorError(
            f"{who}: the SQLite database {path} {what} (nothing was created); check --url "
            "(sqlite:///relative/path.db, sqlite:////absolute/path.db)")
    if not read_only:
        return url
    return url.set(database="file:" + urllib.parse.quote(path),
                   query={**url.query, "mode": "ro", "uri": "true"})


def url_problem(e: Exception) -> str:
    """Why SQLAlchemy refused a URL, without repeating it (it may hold a password)."""
    if type(e).__name__ == "NoSuchModuleError":
        return ("unknown SQLAlchemy dialect/driver; use e.g. postgresql+psycopg://, "
                "mysql+pymysql:// or sqlite:///")
    if type(e).__name__ == "ArgumentError":
        return "not a SQLAlchemy URL (dialect+driver://user:password@host/db)"
    return type(e).__name__
