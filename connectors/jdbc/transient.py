"""Which database errors the JDBC sink retries (``retryTimeout``, ``maxRetries``).

A transient error is one after which the same transaction, run again whole on a new
connection, can succeed: the database rolled the failed one back (a serialization failure,
a deadlock victim, a lock wait that timed out), or the connection is gone and the
transaction with it (a killed session, a restarting server, a lost network). The sink
retries only from such a safe point: a task's whole staging transaction, or the driver's
whole commit transaction, whose first step reads the commit row again (a COMMIT whose
answer was lost is found there). Everything else (bad values, missing tables, failed
authentication, a missing database) fails the batch at once.

``Dialect.is_transient`` of each database is one of the functions below. :func:`silent`
tells a connection attempt that nothing answered (refused, timed out, unresolvable, closed
before the server spoke) from one the server answered, whatever it said: only the first
keeps a database unreached in a first contact (``Database.reach``).
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa

#: PostgreSQL's SQLSTATEs after which the whole transaction, run again, can succeed; with
#: them, class 08 (connection exception) but ``08P01`` (protocol violation: a bug).
PG_TRANSIENT = {
    "40001": "serialization_failure",
    "40P01": "deadlock_detected",
    "55P03": "lock_not_available (lock_timeout)",
    "57P01": "admin_shutdown (pg_terminate_backend, a fast or smart shutdown)",
    "57P02": "crash_shutdown (the server is resetting after a crash)",
    "57P03": "cannot_connect_now (the server is starting or recovering)",
    "53300": "too_many_connections",
    "25P03": "idle_in_transaction_session_timeout",
    "57P05": "idle_session_timeout",
}

#: pymysql's errors of a connection attempt that no server answered: cannot connect, lost
#: (or timed out) before the handshake, gone, an unknown host.
MYSQL_SILENT = frozenset({2002, 2003, 2005, 2006, 2013, 2055})

#: MySQL/MariaDB error numbers after which the whole transaction, run again, can succeed.
MYSQL_TRANSIENT = {
    1020: "ER_CHECKREAD: record changed since last read (snapshot isolation)",
    1053: "ER_SERVER_SHUTDOWN: server shutdown in progress",
    1205: "ER_LOCK_WAIT_TIMEOUT (innodb_lock_wait_timeout)",
    1213: "ER_LOCK_DEADLOCK",
    1927: "ER_CONNECTION_KILLED (KILL CONNECTION)",
    2003: "CR_CONN_HOST_ERROR: cannot connect",
    2006: "CR_SERVER_GONE_ERROR: server has gone away",
    2013: "CR_SERVER_LOST: lost connection during query",
    4031: "ER_CLIENT_INTERACTION_TIMEOUT: disconnected for inactivity",
}

# A refused connection may carry no SQLSTATE: the server's message tells these apart.
_PG_FATAL = re.compile(r"authentication failed|role \"[^\"]*\" does not exist|"
                       r"database \"[^\"]*\" does not exist|no pg_hba\.conf entry", re.I)


def _orig(exc: BaseException) -> Any:
    """The driver's own exception under SQLAlchemy's wrapper (or ``exc`` itself)."""
    return getattr(exc, "orig", None) or exc


def invalidated(exc: BaseException) -> bool:
    """SQLAlchemy saw the connection die (any database)."""
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def postgres(exc: BaseException) -> bool:
    """psycopg 3: the SQLSTATEs above, or a connection lost on the client's side."""
    import psycopg

    orig = _orig(exc)
    if not isinstance(orig, psycopg.Error):
        return invalidated(exc)
    state = orig.sqlstate or ""
    # Authentication and a missing role or database do not heal by waiting: fail now
    # instead of retrying until the budget runs out.
    if state == "08P01" or state.startswith("28") or state == "3D000" \
            or _PG_FATAL.search(str(orig)):
        return False
    if state.startswith("08") or state in PG_TRANSIENT or invalidated(exc):
        return True
    # Client-side connection loss (the server closed the socket, a reset) has no SQLSTATE.
    return isinstance(orig, psycopg.OperationalError) and not state


def silent(exc: BaseException) -> bool:
    """Nothing answered the connection attempt (any database's driver)."""
    orig = _orig(exc)
    import psycopg

    if isinstance(orig, psycopg.Error):
        # The server's own refusals carry a SQLSTATE, or at least its FATAL message.
        text = str(orig)
        return isinstance(orig, psycopg.OperationalError) and not orig.sqlstate \
            and "FATAL" not in text and not _PG_FATAL.search(text)
    if type(orig).__module__.startswith("pymysql"):
        args: Any = getattr(orig, "args", ())
        return bool(args) and args[0] in MYSQL_SILENT
    return isinstance(orig, (ConnectionError, TimeoutError, OSError))


def mysql(exc: BaseException) -> bool:
    """pymysql: the error numbers above."""
    if invalidated(exc):
        return True
    args: Any = getattr(_orig(exc), "args", ())
    return bool(args) and args[0] in MYSQL_TRANSIENT


def sqlite(exc: BaseException) -> bool:
    """Another writer holds the database file's lock."""
    if invalidated(exc):
        return True
    text = str(_orig(exc)).lower()
    return "database is locked" in text or "database is busy" in text
