"""Database dialects of the JDBC sink: PostgreSQL (psycopg 3, COPY), SQLite, MySQL/MariaDB.

Everything that differs between databases lives here; the commit protocol in
``connectors.jdbc.sink``, the staging strategies in ``connectors.jdbc.staging`` and the write
modes in ``connectors.jdbc.modes`` are written once against this small interface:

- ``stage_table``/``create_stage``: the staging table ``eo_stage_<sink>`` with the target's
  column types plus the tags ``(eo_batch, eo_writer, eo_attempt)``. UNLOGGED on PostgreSQL.
- ``write_rows``: append Arrow batches to the staging table inside the caller's transaction.
  PostgreSQL streams ``COPY ... FROM STDIN`` (``connectors.jdbc.pgcopy``); the others use
  batched ``executemany`` inserts through SQLAlchemy, whose bind processing needs the
  tables' reflected types (``binds_types``).
- ``insert``/``on_conflict``/``excluded``: the pieces of the set-based ``INSERT ... SELECT``
  that the write modes (``connectors.jdbc.modes``) build: ``ON CONFLICT`` (PostgreSQL,
  SQLite) or ``ON DUPLICATE KEY UPDATE`` (MySQL) for upsert and accumulate.
- ``clear_stage``: remove staged rows of committed/aborted batches.
- ``block_store``: PostgreSQL's binary COPY blocks for append (None elsewhere).
- ``is_transient``: which errors are worth running the transaction again for
  (``connectors.jdbc.transient``: a lost connection, a restarting server, a serialization
  failure, a deadlock, a lock timeout, a locked SQLite file).

Identifiers are quoted by SQLAlchemy or ``psycopg.sql``; no SQL text is built from option
strings.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from connectors.core.errors import JdbcSinkError, OptionError
from connectors.core.options import redact_url
from connectors.jdbc import mysqlbulk, pgbinary, pgcopy, transient
from connectors.jdbc.columns import (  # noqa: F401 - column_spec & co. are part of this API
    TAG_COLUMNS,
    ColumnSpec,
    arrow_to_sql_type,
    check_compatible,
    check_values,
    column_spec,
    first_rows,
)

#: Seconds one attempt to connect may take (PostgreSQL; unless the URL sets
#: ``connect_timeout``): a retry must not hang on a host that does not answer.
CONNECT_TIMEOUT = 10
#: Size of one staged block: a task holds at most this much encoded data in memory.
BLOCK_BYTES = 8 << 20
#: Up to this many rows in a batch's blocks, the commit DELETEs them instead of TRUNCATE.
SMALL_BLOCK_ROWS = 10_000

# -- URLs and engines -----------------------------------------------------------------------
_SUPPORTED = "postgresql+psycopg://user@host:5432/db, sqlite:///path/to.db or " \
             "mysql+pymysql://user@host:3306/db"


def scratch_name(stage: sa.Table) -> str:
    """The temporary table of a staging table: named by its name and columns, so a changed
    staging table (new columns) never meets an old session's scratch table."""
    import hashlib

    shape = "|".join([stage.schema or "", stage.name, *[c.name for c in stage.columns]])
    return f"eo_scratch_{hashlib.sha256(shape.encode()).hexdigest()[:16]}"


def normalize_url(raw: str) -> sa.URL:
    """Parse the ``url`` option; accept ``jdbc:`` prefixes and pick our drivers by default."""
    text = raw.strip()
    if text.lower().startswith("jdbc:"):
        text = text[5:]
    try:
        url = sa.engine.make_url(text)
    except Exception:  # noqa: BLE001 - SQLAlchemy raises ArgumentError/ValueError variants
        raise OptionError(
            f"eo_jdbc: option 'url' is not a database URL: {redact_url(raw)!r}; valid forms: "
            f"{_SUPPORTED}",
            option="url",
        ) from None
    backend = url.get_backend_name()
    explicit_driver = "+" in url.drivername
    if backend == "postgresql" and not explicit_driver:
        url = url.set(drivername="postgresql+psycopg")
    elif backend in ("mysql", "mariadb") and not explicit_driver:
        url = url.set(drivername=f"{backend}+pymysql")
    elif backend not in ("postgresql", "sqlite", "mysql", "mariadb"):
        raise OptionError(
            f"eo_jdbc: option 'url' names database {backend!r}, which this sink does not "
            f"support; supported: PostgreSQL, SQLite, MySQL/MariaDB ({_SUPPORTED})",
            option="url",
        )
    if backend == "sqlite" and (not url.database or url.database == ":memory:"):
        raise OptionError(
            "eo_jdbc: option 'url' names an in-memory SQLite database, which Spark's tasks "
            "(other processes) cannot see; use a file: sqlite:///path/to.db",
            option="url",
        )
    try:
        url.get_dialect()
    except Exception:  # noqa: BLE001 - NoSuchModuleError, or a driver that fails to load
        raise OptionError(
            f"eo_jdbc: option 'url' names SQLAlchemy dialect+driver {url.drivername!r}, which "
            f"is not installed or does not exist; valid forms: {_SUPPORTED}",
            option="url",
        ) from None
    return url


_ENGINES: dict[str, sa.Engine] = {}
_ENGINES_LOCK = threading.Lock()


def dialect_for(url: sa.URL, busy_timeout: float, durable_staging: bool = True) -> Dialect:
    backend = url.get_backend_name()
    kind = {"postgresql": PostgresDialect, "sqlite": SqliteDialect}.get(backend, MysqlDialect)
    return kind(url, busy_timeout, durable_staging)


class Dialect:
    """Generic SQLAlchemy behaviour; subclasses override what their database does better."""

    name = "generic"
    tag_types: tuple[int, ...] = ()
    #: Rows go in through SQLAlchemy's bind processing, which needs the tables' reflected
    #: column types (SQLite dates, MySQL datetimes), not just their names.
    binds_types = True

    def __init__(self, url: sa.URL, busy_timeout: float, durable_staging: bool = True) -> None:
        self.url = url
        self.busy_timeout = busy_timeout
        #: ``durableStaging``: staged rows survive a server crash (PostgreSQL: LOGGED tables;
        #: the other databases' tables always do)
        self.durable_staging = durable_staging

    # -- engine ---------------------------------------------------------------------------
    def engine(self) -> sa.Engine:
        """One engine (and connection pool) per process and URL: Python workers reuse it
        across tasks, the driver across batches."""
        key = self.url.render_as_string(hide_password=False)
        with _ENGINES_LOCK:
            engine = _ENGINES.get(key)
            if engine is None:
                try:
                    engine = self._create_engine()
                except ModuleNotFoundError as e:
                    raise JdbcSinkError(
                        f"eo_jdbc: the database driver for {self.redacted} is not installed "
                        f"({e.name}); pip install \"pyspark-exactly-once[mysql]\" for MySQL, "
                        "psycopg for PostgreSQL"
                    ) from e
                _ENGINES[key] = engine
            return engine

    def _create_engine(self) -> sa.Engine:
        return sa.create_engine(self.url, pool_pre_ping=True)

    @property
    def redacted(self) -> str:
        return redact_url(self.url.render_as_string(hide_password=False))

    def isolation(self, level: str | None) -> dict[str, Any]:
        return {"isolation_level": level} if level else {}

    # -- statements -----------------------------------------------------------------------
    def insert(self, table: sa.Table) -> Any:
        return sa.insert(table)

    def on_conflict(self, ins: Any, target: sa.Table, keys: Sequence[str],
                    updates: dict[str, Any]) -> Any:
        if updates:
            return ins.on_conflict_do_update(index_elements=[target.c[k] for k in keys],
                                             set_=updates)
        return ins.on_conflict_do_nothing(index_elements=[target.c[k] for k in keys])

    def excluded(self, ins: Any) -> Any:
        return ins.excluded

    # -- staging --------------------------------------------------------------------------
    def stage_table(self, name: str, schema: str | None,
                    columns: Sequence[tuple[str, sa.types.TypeEngine[Any]]]) -> sa.Table:
        return sa.Table(
            name,
            sa.MetaData(),
            sa.Column("eo_batch", sa.BigInteger, nullable=False),
            sa.Column("eo_writer", sa.Integer, nullable=False),
            sa.Column("eo_attempt", sa.BigInteger, nullable=False),
            *[sa.Column(n, t) for n, t in columns],
            schema=schema,
        )

    def create_stage(self, conn: sa.Connection, stage: sa.Table, target: sa.Table | None) -> None:
        stage.create(conn)

    def ensure_durability(self, conn: sa.Connection, table: sa.Table) -> None:
        """Make an existing staging table as durable as ``durableStaging`` says (a no-op
        where every table is durable)."""

    def prepare_arrow(self, batch: pa.RecordBatch, specs: Sequence[ColumnSpec]) -> pa.RecordBatch:
        """Per-dialect value conversions before writing (vectorized)."""
        arrays, names = [], []
        for spec in specs:
            col = batch.column(spec.name)
            if pa.types.is_timestamp(col.type) and col.type.tz is not None:
                # Naive UTC wall time: DATETIME columns of SQLite/MySQL have no zone, and
                # the drivers would otherwise render "+00:00", which MySQL refuses.
                col = col.cast(pa.timestamp(col.type.unit))
            arrays.append(col)
            names.append(spec.column)
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def column_types(self, conn: sa.Connection, table: sa.Table,
                     names: Sequence[str]) -> tuple[int, ...] | None:
        """The database's type ids of ``names`` in ``table`` (PostgreSQL: pg_type OIDs, which
        choose the binary COPY format), or None where the dialect does not use them."""
        return None

    def write_rows(self, conn: sa.Connection, stage: sa.Table, specs: Sequence[ColumnSpec],
                   batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int] | None,
                   batch_size: int, table: str, types: Sequence[int] | None = None) -> int:
        """Append rows with batched executemany inserts: to the staging table tagged with
        ``(batch, writer, token)``, or straight into ``stage`` (a target) when ``tags`` is
        None. ``types`` (from ``column_types``) is unused here."""
        stmt = stage.insert()
        total = 0
        pending: list[dict[str, Any]] = []
        for batch in batches:
            if batch.num_rows == 0:
                continue
            check_values(table, batch, specs)
            rows = self.prepare_arrow(batch, specs).to_pylist()
            if tags is not None:
                for r in rows:
                    r["eo_batch"], r["eo_writer"], r["eo_attempt"] = tags
            pending.extend(rows)
            total += len(rows)
            while len(pending) >= batch_size:
                conn.execute(stmt, pending[:batch_size])
                del pending[:batch_size]
        if pending:
            conn.execute(stmt, pending)
        return total

    def clear_stage(self, conn: sa.Connection, stage: sa.Table, up_to_batch: int) -> None:
        conn.execute(stage.delete().where(stage.c.eo_batch <= up_to_batch))

    def scratch(self, conn: sa.Connection, stage: sa.Table) -> sa.Table:
        """An empty temporary table with the staging table's columns (``stage`` with its
        types where ``binds_types``), private to this connection: where a task of
        ``commitScope=task`` puts its rows before its write mode's set-based statement moves
        them into the target, in the same transaction (``connectors.jdbc.scopes``)."""
        name = scratch_name(stage)
        quoted = conn.dialect.identifier_preparer.quote(name)
        conn.exec_driver_sql("DROP TABLE IF EXISTS temp." + quoted)
        table = sa.Table(name, sa.MetaData(), *[sa.Column(c.name, c.type) for c in stage.columns],
                         prefixes=["TEMPORARY"])
        table.create(conn)
        return table

    def block_store(self) -> PostgresDialect | None:
        """Where append can stage binary COPY blocks (PostgreSQL); None elsewhere."""
        return None

    # -- errors ---------------------------------------------------------------------------
    def is_transient(self, exc: BaseException) -> bool:
        """Worth running the whole transaction again (``connectors.jdbc.transient``)."""
        return transient.invalidated(exc)

    def describe(self, exc: BaseException) -> str:
        """The database's own message, without SQLAlchemy's SQL/parameter dump."""
        orig = getattr(exc, "orig", None) or exc
        return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__

    def column_of(self, exc: BaseException) -> str | None:
        return None


class PostgresDialect(Dialect):
    """PostgreSQL through psycopg 3: COPY into an UNLOGGED staging table, blocks for append."""

    name = "postgresql"
    #: pg_type OIDs of TAG_COLUMNS as ``create_stage`` makes them (bigint, integer, bigint)
    tag_types = (pgbinary.INT8, pgbinary.INT4, pgbinary.INT8)
    #: COPY takes column names; no bind processing, no reflected types needed.
    binds_types = False

    def _create_engine(self) -> sa.Engine:
        # libpq waits for a connection forever by default: a host that drops packets (a
        # failover under way, a partition) would hold one retry past the whole budget.
        # pymysql's connect_timeout is 10 s already.
        args = {} if "connect_timeout" in self.url.query else {"connect_timeout":
                                                                CONNECT_TIMEOUT}
        return sa.create_engine(self.url, pool_pre_ping=True, connect_args=args)

    def insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects.postgresql import insert

        return insert(table)

    def stage_table(self, name: str, schema: str | None,
                    columns: Sequence[tuple[str, sa.types.TypeEngine[Any]]]) -> sa.Table:
        table = super().stage_table(name, schema, columns)
        if not self.durable_staging:
            # No WAL for staged rows; crash recovery empties the table (docs/jdbc-sink.md).
            table._prefixes = ["UNLOGGED"]
        return table

    def create_stage(self, conn: sa.Connection, stage: sa.Table, target: sa.Table | None) -> None:
        if target is None:
            stage.create(conn)
        else:
            pgcopy.create_stage_like(conn, stage, target, logged=self.durable_staging)

    def ensure_durability(self, conn: sa.Connection, table: sa.Table) -> None:
        """``ALTER TABLE ... SET [UN]LOGGED`` when ``durableStaging`` changed since the
        staging table was made (it rewrites the table: staged rows are few between batches)."""
        pgcopy.set_logged(conn, table, self.durable_staging)

    def prepare_arrow(self, batch: pa.RecordBatch, specs: Sequence[ColumnSpec]) -> pa.RecordBatch:
        arrays, names = [], []
        for spec in specs:
            col = batch.column(spec.name)
            t = col.type
            if pa.types.is_boolean(t) and spec.category == "int":
                col = col.cast(pa.int8())
            elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
                # bytea's text input is "\x<hex>"; Arrow's CSV writer emits raw bytes.
                col = pa.array(
                    [None if v is None else "\\x" + v.hex() for v in col.to_pylist()],
                    pa.string(),
                )
            arrays.append(col)
            names.append(spec.column)
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def column_types(self, conn: sa.Connection, table: sa.Table,
                     names: Sequence[str]) -> tuple[int, ...] | None:
        return pgcopy.column_types(conn, table, names)

    def write_rows(self, conn: sa.Connection, stage: sa.Table, specs: Sequence[ColumnSpec],
                   batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int] | None,
                   batch_size: int, table: str, types: Sequence[int] | None = None) -> int:
        """``COPY ... FROM STDIN``: tagged rows go to the staging table; with ``tags=None``
        straight into ``stage``. Binary when ``types`` allow it, else CSV (``pgcopy``)."""
        return pgcopy.copy_rows(conn, stage, specs, batches, tags, batch_size, table, types,
                                self.prepare_arrow)

    def clear_stage(self, conn: sa.Connection, stage: sa.Table, up_to_batch: int) -> None:
        """TRUNCATE: O(1) where DELETE rewrites every row. The staging table only ever holds
        rows the current commit needs (Spark commits one batch at a time and a replay
        stages again); if a second writer wrongly shared this sink_id, its commit would
        find its rows missing and fail instead of losing them (see the staged-row check)."""
        pgcopy.truncate_unless_empty(conn, stage)

    def scratch(self, conn: sa.Connection, stage: sa.Table) -> sa.Table:
        """``CREATE TEMP TABLE IF NOT EXISTS ... (LIKE stage) ON COMMIT DELETE ROWS``: made
        once per session (the pool keeps it), emptied by every commit, never WAL-logged."""
        name = scratch_name(stage)
        pgcopy.create_scratch(conn, name, stage)
        return sa.Table(name, sa.MetaData(),
                        *[sa.Column(c.name, sa.types.NullType()) for c in stage.columns])

    # -- append through binary COPY blocks (``connectors.jdbc.staging.BlockStaging``) --------
    def block_store(self) -> PostgresDialect:
        return self

    def create_blocks(self, conn: sa.Connection, blocks: sa.Table) -> None:
        pgcopy.create_blocks(conn, blocks, logged=self.durable_staging)

    def write_blocks(self, conn: sa.Connection, blocks: sa.Table, specs: Sequence[ColumnSpec],
                     batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int], table: str,
                     kinds: list[str]) -> tuple[int, int]:
        """Stage ``batches`` as binary COPY blocks of ``BLOCK_BYTES``; ``(rows, blocks)``."""
        return pgcopy.write_blocks(conn, blocks, specs, batches, tags, table, kinds,
                                   BLOCK_BYTES)

    def block_counts(self, conn: sa.Connection, blocks: sa.Table, batch_id: int,
                     attempts: Sequence[int]) -> dict[int, tuple[int, int]]:
        return pgcopy.block_counts(conn, blocks, batch_id, attempts)

    def copy_blocks(self, conn: sa.Connection, reader: sa.Connection, target: sa.Table,
                    specs: Sequence[ColumnSpec], blocks: sa.Table, batch_id: int,
                    attempts: Sequence[int]) -> int:
        return pgcopy.copy_blocks(conn, reader, target, specs, blocks, batch_id, attempts)

    def clear_blocks(self, conn: sa.Connection, blocks: sa.Table, up_to_batch: int,
                     rows: int) -> None:
        """Remove the blocks of batches ``<= up_to_batch``: DELETE after a small batch
        (cheaper than TRUNCATE's fixed cost; autovacuum takes the few dead rows), else
        TRUNCATE."""
        if rows > SMALL_BLOCK_ROWS:
            pgcopy.truncate_unless_empty(conn, blocks)
        else:
            pgcopy.delete_up_to(conn, blocks, up_to_batch)

    # -- errors ---------------------------------------------------------------------------
    def is_transient(self, exc: BaseException) -> bool:
        return transient.postgres(exc)

    def column_of(self, exc: BaseException) -> str | None:
        orig = getattr(exc, "orig", None) or exc
        diag = getattr(orig, "diag", None)
        if diag is None:
            return None
        if diag.column_name:
            return str(diag.column_name)
        m = re.search(r'column ([^:\s]+):', diag.context or "")
        return m.group(1).strip('"') if m else None


class SqliteDialect(Dialect):
    """SQLite through SQLAlchemy: the embedded default for demos and laptops.

    SQLite locks the whole database file. Every transaction starts with ``BEGIN IMMEDIATE``,
    which takes the write lock up front, so the commit's read of the last batch and its
    writes are one atomic step (the role ``FOR UPDATE`` plays elsewhere). Waiting for the
    lock is bounded by the retry deadline (``timeout``).
    """

    name = "sqlite"

    def _create_engine(self) -> sa.Engine:
        engine = sa.create_engine(
            self.url, connect_args={"timeout": max(1.0, self.busy_timeout)},
            poolclass=sa.pool.NullPool,
        )

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_tx(dbapi_conn: Any, _record: Any) -> None:
            # pysqlite's own transaction handling would BEGIN lazily (DEFERRED) before the
            # first write; we emit BEGIN IMMEDIATE ourselves.
            dbapi_conn.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine

    def isolation(self, level: str | None) -> dict[str, Any]:
        # SQLite transactions are always serializable; BEGIN IMMEDIATE is set per engine.
        return {}

    def insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects.sqlite import insert

        return insert(table)

    def is_transient(self, exc: BaseException) -> bool:
        return transient.sqlite(exc)


class MysqlDialect(Dialect):
    """MySQL/MariaDB through SQLAlchemy and pymysql: ``ON DUPLICATE KEY UPDATE``."""

    name = "mysql"

    def insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects.mysql import insert

        return insert(table)

    def excluded(self, ins: Any) -> Any:
        return ins.inserted

    def scratch(self, conn: sa.Connection, stage: sa.Table) -> sa.Table:
        """``CREATE TEMPORARY TABLE ... LIKE stage``, dropped first (neither statement ends
        the transaction, unlike TRUNCATE); InnoDB keeps a temporary table's rows past a
        commit, so every use starts from a new one."""
        name = scratch_name(stage)
        prep = conn.dialect.identifier_preparer
        conn.exec_driver_sql("DROP TEMPORARY TABLE IF EXISTS " + prep.quote(name))
        conn.exec_driver_sql("CREATE TEMPORARY TABLE " + prep.quote(name) + " LIKE "
                             + prep.format_table(stage))
        return sa.Table(name, sa.MetaData(), *[sa.Column(c.name, c.type) for c in stage.columns])

    def on_conflict(self, ins: Any, target: sa.Table, keys: Sequence[str],
                    updates: dict[str, Any]) -> Any:
        # MySQL picks the conflicting unique key itself; a no-op update keeps the row.
        return ins.on_duplicate_key_update(updates or {keys[0]: target.c[keys[0]]})

    def write_rows(self, conn: sa.Connection, stage: sa.Table, specs: Sequence[ColumnSpec],
                   batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int] | None,
                   batch_size: int, table: str, types: Sequence[int] | None = None) -> int:
        """Multi-row INSERTs rendered by Arrow (``connectors.jdbc.mysqlbulk``), or pymysql's
        ``executemany`` for a column type it does not render."""
        first, rest = first_rows(batches)
        if first is None:
            return 0
        written = mysqlbulk.write(conn, stage, specs, rest, tags, table, self.prepare_arrow)
        if written is not None:
            return written
        return super().write_rows(conn, stage, specs, batches, tags, batch_size, table, types)

    def is_transient(self, exc: BaseException) -> bool:
        return transient.mysql(exc)

