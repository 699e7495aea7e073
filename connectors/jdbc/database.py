"""One JDBC sink's database at runtime: dialect, tables, connections, retries, transactions.

The commit protocol (``connectors.jdbc.sink``) and the staging strategies
(``connectors.jdbc.staging``) both reach the database through a :class:`Database`, and
neither calls into the other. A ``Database`` is built from the picklable options in the
process that needs it (the driver, a Python worker) and is never pickled: it holds the
dialect, whose engine and connection pool are per process.

Every call goes through :meth:`Database.retrying`, which first makes sure the database
answered this process once (:meth:`Database.reach`, docs/design.md "Retry budgets: one
rule"): a database where nothing answers fails within ``connectTimeout``, naming its host
and port; once it answered, an outage is ridden through within ``retryTimeout``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import sqlalchemy as sa

from connectors.core import contact, failpoints
from connectors.core.errors import JdbcSinkError
from connectors.core.retry import retry_until
from connectors.core.sink import TaskInfo
from connectors.jdbc import transient
from connectors.jdbc.columns import Layout
from connectors.jdbc.dialects import Dialect, dialect_for
from connectors.jdbc.metadata import CommitsTable
from connectors.jdbc.options import JdbcSinkOptions
from connectors.jdbc.tables import Tables

log = logging.getLogger(__name__)

T = TypeVar("T")


class Database:
    """The database of one sink: what differs per database (``dialect``), its tables
    (``tables``, ``commits``), connections, and the retry and error rules of every call.

    ``layout`` (where a method takes one) only sharpens error messages: a database error
    that names a column is reported with its SQL and DataFrame types."""

    def __init__(self, options: JdbcSinkOptions) -> None:
        self.options = options
        self.dialect: Dialect = dialect_for(sa.engine.make_url(options.url),
                                            options.retry_timeout, options.durable_staging)
        self.tables = Tables(options, self.dialect)

    @property
    def commits(self) -> CommitsTable:
        return self.tables.commits

    def connect(self, isolation: bool = False) -> sa.Connection:
        """A connection from the process's pool; with ``isolation``, at the commit
        transaction's level (``isolationLevel``)."""
        conn = self.dialect.engine().connect()
        if isolation:
            opts = self.dialect.isolation(self.options.isolation_level)
            if opts:
                conn = conn.execution_options(**opts)
        return conn

    # -- first contact ----------------------------------------------------------------------
    @property
    def contact_key(self) -> Hashable | None:
        """What "answered this process" is kept by: the server and database (a SQLite file
        has no address: never a first contact)."""
        url = self.dialect.url
        if url.get_backend_name() == "sqlite":
            return None
        return ("jdbc", url.render_as_string(hide_password=True))

    def reach(self) -> None:
        """The first contact (:func:`connectors.core.contact.first_contact`), unless the
        database answered this process before: a connection of its own (outside the pool),
        each attempt bounded by what is left of ``connectTimeout``; any answer counts (a
        refused password fails next, in the call that follows, with its own words)."""
        if contact.reached(self.contact_key):
            return
        o = self.options
        timeout = min(o.connect_timeout, o.retry_timeout) or 0.1
        contact.first_contact(self.contact_key, self._probe, timeout=timeout,
                              answered=lambda e: not transient.silent(e),
                              fail=self._never_reached, backoff=o.retry_backoff,
                              max_backoff=min(1.0, o.retry_backoff_max))

    def _probe(self, seconds: float) -> None:
        engine = self.dialect.engine()
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        cparams.update(_probe_timeouts(engine.url, seconds))
        engine.dialect.connect(*cargs, **cparams).close()

    def _never_reached(self, e: Exception, attempts: int, seconds: float) -> JdbcSinkError:
        o = self.options
        url = self.dialect.url
        where = f"{url.host or 'localhost'}:{url.port or 'the default port'}"
        return JdbcSinkError(
            f"eo_jdbc sink {o.sink_id!r}: cannot reach the database at {o.redacted_url}: "
            f"nothing answered this process's first contact at {where} within "
            f"connectTimeout={o.connect_timeout:g}s ({attempts} attempt"
            f"{'s' if attempts != 1 else ''} over {seconds:.1f}s; last: "
            f"{self.dialect.describe(e)}). Check the host and port in option 'url', and that "
            "the server runs and accepts connections from the Spark driver and executors "
            "(listen_addresses and pg_hba.conf, bind-address, a firewall). A database that "
            "never answered is not waited for; once it has answered, an outage (a restart, a "
            f"failover) is ridden through for retryTimeout={o.retry_timeout:g}s")

    # -- retries and errors -----------------------------------------------------------------
    def retrying(self, what: str, fn: Callable[[], T], layout: Layout | None = None) -> T:
        """Run ``fn``; run it again on transient database errors (``Dialect.is_transient``)
        with backoff (``retryBackoff`` doubling up to ``retryBackoffMax``), within the budget
        (``retryTimeout`` from the first failure, ``maxRetries``):
        :func:`connectors.core.retry.retry_until`. ``fn`` must be a safe point to start
        again from: a whole transaction, which a lost connection rolls back. The database's
        first contact (:meth:`reach`) comes first."""
        self.reach()
        o = self.options
        started = time.monotonic()

        def give_up(e: Exception, attempts: int, transient: bool) -> Exception:
            return self.error(what, e, layout, gave_up=transient, attempts=attempts,
                              seconds=time.monotonic() - started)

        def on_retry(e: Exception, attempt: int, pause: float) -> None:
            log.warning("eo_jdbc sink %s: %s failed (attempt %d, transient: %s); retrying "
                        "in %.1fs", o.sink_id, what, attempt, self.dialect.describe(e), pause)

        return retry_until(fn, timeout=o.retry_timeout, transient=self.dialect.is_transient,
                           give_up=give_up, on_retry=on_retry, first_backoff=o.retry_backoff,
                           max_backoff=o.retry_backoff_max, max_retries=o.max_retries)

    def error(self, what: str, e: Exception, layout: Layout | None = None,
              gave_up: bool = False, attempts: int = 1, seconds: float = 0.0) -> JdbcSinkError:
        """The sink's error for a failed database call: the step, the table (and column), the
        database (redacted URL: host, port, database, never the password), the database's
        own message and, for a transient error that outlived the retry budget, what to do."""
        o = self.options
        column = self.dialect.column_of(e)
        where = f"table {o.qualified_table!r}"
        if column:
            spec = layout.spec(column) if layout is not None else None
            typ = f" ({spec.sql_type}, DataFrame type {spec.arrow_type})" if spec else ""
            where += f", column {column!r}{typ}"
        advice = ""
        if gave_up:
            spent = (f"maxRetries={o.max_retries} reached" if attempts > o.max_retries
                     else f"retryTimeout={o.retry_timeout:g}s passed")
            advice = (
                f" (transient; gave up after {attempts} attempts in {seconds:.1f}s: {spent}; "
                f"the retry budget is retryTimeout={o.retry_timeout:g}s and maxRetries="
                f"{o.max_retries}). The database did not recover within the budget: check "
                "that it is running and reachable from the Spark driver and executors, then "
                "restart the query from its checkpoint. The restarted query is exact: the "
                "commit row says whether this batch committed, so it is neither written "
                "twice nor skipped. To ride through longer outages, raise retryTimeout and "
                "maxRetries"
            )
        return JdbcSinkError(
            f"eo_jdbc sink {o.sink_id!r}: {what} failed on {where} at {o.redacted_url}: "
            f"{self.dialect.describe(e)}{advice}"
        )

    # -- transactions -----------------------------------------------------------------------
    def transaction(self, what: str, fn: Callable[[sa.Connection], T],
                    layout: Layout | None = None) -> T:
        """``fn`` in one transaction, retried as a whole on transient errors."""
        def work() -> T:
            with self.connect() as conn, conn.begin():
                return fn(conn)

        return self.retrying(what, work, layout)

    def task_transaction(self, task: TaskInfo, write: Callable[[sa.Connection], T],
                         layout: Layout) -> T:
        """Step 1 of the protocol (``connectors.jdbc.sink``): a task's own staging
        transaction around ``write`` (a staging strategy's), run again whole on a transient
        error within the retry budget. ``write`` must read the task's rows from the start on
        every call (``ReplayableBatches``) and stage them under a new attempt token: a
        transaction whose COMMIT answer was lost may have committed, and its rows, under
        their own token, are then an orphan the commit never reads and step 2e deletes."""
        def attempt() -> T:
            with self.connect() as conn, conn.begin():
                failpoints.hit("jdbc.before_stage", task.batch_id)
                message = write(conn)
                failpoints.hit("jdbc.before_stage_commit", task.batch_id)
            # 1. The task's rows are staged: leaving the block committed its transaction.
            return message

        message = self.retrying(f"staging batch {task.batch_id} (writer {task.writer_id}, "
                                "step 1)", attempt, layout)
        failpoints.hit("jdbc.after_stage", task.batch_id)
        log.debug("eo_jdbc sink %s: staged %d rows of batch %d writer %d", self.options.sink_id,
                  getattr(message, "rows", 0), task.batch_id, task.writer_id)
        return message

    # -- the commit table -------------------------------------------------------------------
    def ensure_metadata(self) -> None:
        """Create the commit table if missing and register the sink's row (once per
        process)."""
        t = self.tables
        if not t.metadata_ready():
            self.transaction(f"preparing metadata table {t.commits.qualified!r}",
                             t.prepare_metadata)
            t.metadata_prepared()

    def last_committed(self, why: str = "") -> int | None:
        """The sink's last committed batch from its commit row, retried; ``why`` names the
        step that asks, in errors."""
        def work() -> int | None:
            with self.connect() as conn:
                return self.commits.last_committed(conn, self.options.sink_id)

        return self.retrying(f"reading the last committed batch{why}", work)


def _probe_timeouts(url: sa.URL, seconds: float) -> dict[str, Any]:
    """A first contact's connection waits at most ``seconds`` (and no longer than the URL's
    own ``connect_timeout``): libpq counts whole seconds, 2 at least; pymysql also bounds
    the reads of the server's greeting, which a listener that never answers never sends."""
    own = url.query.get("connect_timeout")
    if own is not None:
        seconds = min(seconds, float(own if isinstance(own, str) else own[0]))
    if url.get_backend_name() == "postgresql":
        return {"connect_timeout": max(2, math.ceil(seconds))}
    seconds = max(0.5, seconds)
    return {"connect_timeout": seconds, "read_timeout": seconds, "write_timeout": seconds}
