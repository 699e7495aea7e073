"""jdbc/transient.py: which database errors the sink runs a transaction again for."""

from __future__ import annotations

import psycopg
import pymysql
import pytest
import sqlalchemy as sa

from connectors.jdbc import transient


def wrapped(orig: Exception, invalidated: bool = False) -> sa.exc.DBAPIError:
    """As SQLAlchemy raises it."""
    return sa.exc.OperationalError("COMMIT", None, orig,
                                   connection_invalidated=invalidated)


@pytest.mark.parametrize("state", ["40001", "40P01", "55P03", "57P01", "57P02", "57P03",
                                   "53300", "25P03", "08006", "08001"])
def test_postgres_transient_states(state: str) -> None:
    error = psycopg.errors.lookup(state)("x")
    assert transient.postgres(wrapped(error)) and transient.postgres(error)


@pytest.mark.parametrize("state", ["23505", "22P02", "42P01", "57014", "08P01", "28P01",
                                   "3D000", "25006"])
def test_postgres_errors_that_fail_at_once(state: str) -> None:
    # a duplicate key, bad input, a missing table, a statement timeout, a protocol
    # violation, bad password, missing database, a read-only server
    assert not transient.postgres(wrapped(psycopg.errors.lookup(state)("x")))


def test_postgres_connection_lost_without_sqlstate_is_transient() -> None:
    lost = psycopg.OperationalError("consuming input failed: server closed the connection "
                                    "unexpectedly")
    assert transient.postgres(wrapped(lost))
    refused = psycopg.OperationalError('connection failed: FATAL:  password authentication '
                                       'failed for user "eo"')
    assert not transient.postgres(wrapped(refused))
    assert not transient.postgres(ValueError("not a database error"))


@pytest.mark.parametrize("code", [1020, 1053, 1205, 1213, 1927, 2003, 2006, 2013, 4031])
def test_mysql_transient_codes(code: int) -> None:
    assert transient.mysql(wrapped(pymysql.err.OperationalError(code, "x")))


@pytest.mark.parametrize("code", [1045, 1049, 1062, 1146, 1366, 1406])
def test_mysql_errors_that_fail_at_once(code: int) -> None:
    # access denied, unknown database, duplicate key, no such table, bad value, too long
    assert not transient.mysql(wrapped(pymysql.err.OperationalError(code, "x")))


def test_an_invalidated_connection_is_transient_everywhere() -> None:
    gone = wrapped(pymysql.err.InterfaceError(0, ""), invalidated=True)
    assert transient.mysql(gone) and transient.sqlite(gone)
    assert transient.postgres(wrapped(psycopg.InterfaceError("closed"), invalidated=True))


def test_sqlite_lock_is_transient() -> None:
    import sqlite3

    assert transient.sqlite(wrapped(sqlite3.OperationalError("database is locked")))
    assert not transient.sqlite(wrapped(sqlite3.OperationalError("no such table: t")))
