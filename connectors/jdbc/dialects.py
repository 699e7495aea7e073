"""Database dialects of the JDBC sink: PostgreSQL (psycopg 3, COPY), SQLite, MySQL/MariaDB.

Everything that differs between databases lives here; the commit protocol in
``connectors.jdbc.sink`` is written once against this small interface:

- ``create_stage``: the staging table ``eo_stage_<sink>`` with the target's column types plus
  the tags ``(eo_batch, eo_writer, eo_attempt)``. UNLOGGED on PostgreSQL.
- ``write_rows``: append Arrow batches to the staging table inside the caller's transaction.
  PostgreSQL streams ``COPY ... FROM STDIN`` in binary format (``pgbinary``) when every
  column's type allows it, else CSV rendered by Arrow's C++ writer; the others use batched
  ``executemany`` inserts through SQLAlchemy.
- ``apply``: one set-based ``INSERT ... SELECT`` from the staging table into the target, with
  ``ON CONFLICT`` (PostgreSQL, SQLite) or ``ON DUPLICATE KEY UPDATE`` (MySQL) for upsert and
  accumulate.
- ``clear_stage``: remove staged rows of committed/aborted batches.
- PostgreSQL append only, ``*_blocks``: each task stages its rows as binary COPY data in a few
  large ``bytea`` blocks (``eo_stage_<sink>_blocks``), and the commit streams them into one
  ``COPY target FROM STDIN``. The server parses each row once, at commit, and COPY inserts
  page by page: half the WAL of ``INSERT ... SELECT`` and no row-by-row staging.
- ``is_transient``: which errors are worth retrying (lost connection, serialization failure,
  deadlock, a locked SQLite file).

Identifiers are quoted by SQLAlchemy or ``psycopg.sql``; no SQL text is built from option
strings.
"""

from __future__ import annotations

import io
import itertools
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa

from connectors.core.errors import JdbcSinkError, OptionError
from connectors.core.options import redact_url
from connectors.jdbc import pgbinary

log = logging.getLogger(__name__)

#: staging-table tag columns, in this order, before the data columns
TAG_COLUMNS = ("eo_batch", "eo_writer", "eo_attempt")

# -- type categories ------------------------------------------------------------------------
# A DataFrame column may go into a table column when its category pair is listed here. The
# database still parses every value; this check only refuses what can never be right (a
# double into an integer column would silently truncate, a timestamp into a number...).
_ALLOWED: dict[str, set[str]] = {
    "int": {"int", "float", "decimal", "string", "other"},
    "float": {"float", "decimal", "string", "other"},
    "decimal": {"decimal", "float", "string", "other"},
    "string": {"string", "json", "other"},
    "bool": {"bool", "int", "string", "other"},
    "date": {"date", "timestamp", "string", "other"},
    "timestamp": {"timestamp", "string", "other"},
    "binary": {"binary", "other"},
    "null": {"int", "float", "decimal", "string", "json", "bool", "date", "timestamp",
             "binary", "other"},
}


def arrow_category(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_null(t):
        return "null"
    return "nested"


def sql_category(t: sa.types.TypeEngine[Any]) -> str:
    # Order matters: Float subclasses Numeric, Boolean/Enum are special cases of others.
    if isinstance(t, sa.Boolean):
        return "bool"
    if isinstance(t, sa.Integer):
        return "int"
    if isinstance(t, sa.Float):
        return "float"
    if isinstance(t, sa.Numeric):
        return "decimal"
    if isinstance(t, sa.JSON):
        return "json"
    if isinstance(t, sa.String):
        return "string"
    if isinstance(t, sa.DateTime):
        return "timestamp"
    if isinstance(t, sa.Date):
        return "date"
    if isinstance(t, sa.LargeBinary) or isinstance(t, sa.types._Binary):
        return "binary"
    return "other"


def _int_bits(t: sa.types.TypeEngine[Any]) -> int | None:
    name = type(t).__name__.upper()
    if name == "TINYINT":
        return 8
    if isinstance(t, sa.SmallInteger):
        return 16
    if isinstance(t, sa.BigInteger):
        return 64
    if isinstance(t, sa.Integer):
        return 32 if name in ("INTEGER", "INT", "MEDIUMINT") else None
    return None


@dataclass(frozen=True)
class ColumnSpec:
    """One DataFrame column and the table column it lands in (picklable, goes to tasks)."""

    name: str  # the DataFrame's (Arrow) column name
    column: str  # the table's column name (may differ in case)
    arrow_type: str
    sql_type: str
    category: str  # of the table column
    int_bits: int | None = None
    max_length: int | None = None


def column_spec(name: str, column: str, arrow_t: pa.DataType,
                sql_t: sa.types.TypeEngine[Any], dialect: sa.Dialect) -> ColumnSpec:
    try:
        shown = sql_t.compile(dialect=dialect)
    except Exception:  # noqa: BLE001 - an exotic type without a compiler: show its class
        shown = type(sql_t).__name__
    category = sql_category(sql_t)
    bits = _int_bits(sql_t) if category == "int" else None
    if dialect.name == "sqlite" and bits == 32:
        bits = None  # SQLite's INTEGER is 64-bit; a declared SMALLINT is still honoured
    length = getattr(sql_t, "length", None) if category == "string" else None
    return ColumnSpec(name, column, str(arrow_t), shown, category, bits,
                      length if isinstance(length, int) else None)


def check_compatible(table: str, field: pa.Field, spec: ColumnSpec) -> None:
    """Refuse a DataFrame type that can never go into the table column."""
    cat = arrow_category(field.type)
    if cat == "nested":
        raise JdbcSinkError(
            f"eo_jdbc: table {table!r}, column {field.name!r} ({spec.sql_type}): DataFrame type "
            f"{field.type} is not supported by the JDBC sink; convert it first, e.g. with "
            "to_json(col) into a text/json column"
        )
    if spec.category not in _ALLOWED[cat]:
        raise JdbcSinkError(
            f"eo_jdbc: table {table!r}, column {field.name!r} has type {spec.sql_type}, which "
            f"cannot take DataFrame type {field.type} ({cat} -> {spec.category}); cast the "
            f"column in Spark to a type compatible with {spec.sql_type}, or change the table"
        )


def check_values(table: str, batch: pa.RecordBatch, specs: Sequence[ColumnSpec]) -> None:
    """Value checks that every dialect needs and SQLite would not do: integer range and
    string length. Vectorized: one min/max per column and batch."""
    for spec in specs:
        col = batch.column(spec.name)
        t = col.type
        if spec.int_bits is not None and pa.types.is_integer(t) and (
            t.bit_width > spec.int_bits
            or (pa.types.is_unsigned_integer(t) and t.bit_width == spec.int_bits)
        ):
            lo, hi = -(2 ** (spec.int_bits - 1)), 2 ** (spec.int_bits - 1) - 1
            mm = pc.min_max(col)
            mn, mx = mm["min"].as_py(), mm["max"].as_py()
            if mn is not None and (mn < lo or mx > hi):
                bad = mn if mn < lo else mx
                raise JdbcSinkError(
                    f"eo_jdbc: table {table!r}, column {spec.name!r} ({spec.sql_type}): value "
                    f"{bad} from DataFrame type {spec.arrow_type} is out of range "
                    f"[{lo}, {hi}]; widen the column or filter the rows"
                )
        if spec.max_length is not None and (pa.types.is_string(t) or pa.types.is_large_string(t)):
            longest = pc.max(pc.utf8_length(col)).as_py()
            if longest is not None and longest > spec.max_length:
                raise JdbcSinkError(
                    f"eo_jdbc: table {table!r}, column {spec.name!r} ({spec.sql_type}): a value "
                    f"of {longest} characters does not fit (max {spec.max_length}); widen the "
                    "column or truncate the strings in Spark"
                )


def arrow_to_sql_type(t: pa.DataType, dialect: str, key: bool = False) -> sa.types.TypeEngine[Any]:
    """Column type for ``createTable`` and for the staging table of mode ``sql``."""
    if pa.types.is_boolean(t):
        return sa.Boolean()
    if pa.types.is_integer(t):
        if t.bit_width <= 16:
            return sa.SmallInteger()
        return sa.Integer() if t.bit_width <= 32 else sa.BigInteger()
    if pa.types.is_float32(t):
        return sa.Float(24)
    if pa.types.is_floating(t):
        return sa.Double()
    if pa.types.is_decimal(t):
        return sa.Numeric(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        # MySQL cannot index TEXT without a prefix length: key columns get VARCHAR(255).
        return sa.String(255) if key and dialect == "mysql" else sa.Text()
    if pa.types.is_date(t):
        return sa.Date()
    if pa.types.is_timestamp(t):
        return sa.DateTime(timezone=t.tz is not None)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return sa.LargeBinary()
    if pa.types.is_null(t):
        return sa.Text()
    raise JdbcSinkError(
        f"eo_jdbc: cannot create a column for DataFrame type {t}; create the table yourself "
        "or convert the column (e.g. to_json)"
    )


# -- URLs and engines -----------------------------------------------------------------------
_SUPPORTED = "postgresql+psycopg://user@host:5432/db, sqlite:///path/to.db or " \
             "mysql+pymysql://user@host:3306/db"


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
    return url


_ENGINES: dict[str, sa.Engine] = {}
_ENGINES_LOCK = threading.Lock()


def dialect_for(url: sa.URL, busy_timeout: float) -> Dialect:
    backend = url.get_backend_name()
    if backend == "postgresql":
        return PostgresDialect(url, busy_timeout)
    if backend == "sqlite":
        return SqliteDialect(url, busy_timeout)
    return MysqlDialect(url, busy_timeout)


class Dialect:
    """Generic SQLAlchemy behaviour; subclasses override what their database does better."""

    name = "generic"
    tag_types: tuple[int, ...] = ()

    def __init__(self, url: sa.URL, busy_timeout: float) -> None:
        self.url = url
        self.busy_timeout = busy_timeout

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

    def apply(self, conn: sa.Connection, mode: str, target: sa.Table, stage: sa.Table,
              columns: Sequence[str], keys: Sequence[str], accumulate: Sequence[str],
              where: Any) -> int | None:
        """Apply the staged rows selected by ``where`` to the target, set-based.

        Returns the number of staged rows it read when the database says so exactly
        (append: the INSERT's row count), else None."""
        if mode == "append":
            sel = sa.select(*[stage.c[c] for c in columns]).where(where)
            stmt = target.insert().from_select(list(columns), sel)
            # SQLAlchemy only keeps an INSERT's row count when asked to.
            result = conn.execute(stmt.execution_options(preserve_rowcount=True))
            count = result.rowcount
            return int(count) if count is not None and count >= 0 else None
        others = [c for c in columns if c not in keys and c not in accumulate]
        if mode == "accumulate":
            # Pre-aggregate per key: a batch may hold a key twice, and ON CONFLICT may not
            # touch one row twice in one statement (PostgreSQL refuses, MySQL/SQLite would
            # apply the rows one after the other, which is the same sum but not portable).
            sel = (
                sa.select(
                    *[stage.c[k] for k in keys],
                    *[sa.func.sum(stage.c[a]).label(a) for a in accumulate],
                    *[sa.func.max(stage.c[o]).label(o) for o in others],
                )
                .where(where)
                .group_by(*[stage.c[k] for k in keys])
            )
            cols = [*keys, *accumulate, *others]
        else:
            sel = sa.select(*[stage.c[c] for c in columns]).where(where)
            cols = list(columns)
        ins = self.insert(target).from_select(cols, sel)
        new = self.excluded(ins)
        updates: dict[str, Any] = {o: new[o] for o in others}
        for a in accumulate:
            zero: Any = sa.literal_column("0")
            updates[a] = sa.func.coalesce(target.c[a], zero) + sa.func.coalesce(new[a], zero)
        conn.execute(self.on_conflict(ins, target, keys, updates))
        return None

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

    # -- errors ---------------------------------------------------------------------------
    def is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
            return True
        return False

    def describe(self, exc: BaseException) -> str:
        """The database's own message, without SQLAlchemy's SQL/parameter dump."""
        orig = getattr(exc, "orig", None) or exc
        return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__

    def column_of(self, exc: BaseException) -> str | None:
        return None


class PostgresDialect(Dialect):
    """PostgreSQL through psycopg 3: COPY into an UNLOGGED staging table."""

    name = "postgresql"
    #: pg_type OIDs of TAG_COLUMNS as ``create_stage`` makes them (bigint, integer, bigint)
    tag_types = (pgbinary.INT8, pgbinary.INT4, pgbinary.INT8)

    def insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects.postgresql import insert

        return insert(table)

    def stage_table(self, name: str, schema: str | None,
                    columns: Sequence[tuple[str, sa.types.TypeEngine[Any]]]) -> sa.Table:
        table = super().stage_table(name, schema, columns)
        # Staged rows are re-staged by a replay after a crash, so they need no WAL.
        table._prefixes = ["UNLOGGED"]
        return table

    def create_stage(self, conn: sa.Connection, stage: sa.Table, target: sa.Table | None) -> None:
        if target is None:
            stage.create(conn)
            return
        from psycopg import sql

        # CREATE ... AS SELECT copies the target's exact column types (domains, enums,
        # varchar(n), numeric(p,s)) without ever spelling a type name ourselves.
        data = [c.name for c in stage.columns if c.name not in TAG_COLUMNS]
        stmt = sql.SQL(
            "CREATE UNLOGGED TABLE {stage} AS SELECT CAST(NULL AS bigint) AS eo_batch, "
            "CAST(NULL AS integer) AS eo_writer, CAST(NULL AS bigint) AS eo_attempt, "
            "{cols} FROM {target} WITH NO DATA"
        ).format(
            stage=_pg_ident(stage),
            cols=sql.SQL(", ").join(sql.Identifier(c) for c in data),
            target=_pg_ident(target),
        )
        raw = conn.connection.driver_connection
        raw.execute(stmt)  # type: ignore[union-attr]

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
        from psycopg import sql

        raw = conn.connection.driver_connection
        rows = raw.execute(  # type: ignore[union-attr]
            sql.SQL("SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = "
                    "{}::regclass AND attnum > 0 AND NOT attisdropped").format(
                sql.Literal(_pg_ident(table).as_string(raw))),
        ).fetchall()
        by_name = {str(n): int(oid) for n, oid in rows}
        if any(n not in by_name for n in names):
            return None
        return tuple(by_name[n] for n in names)

    def write_rows(self, conn: sa.Connection, stage: sa.Table, specs: Sequence[ColumnSpec],
                   batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int] | None,
                   batch_size: int, table: str, types: Sequence[int] | None = None) -> int:
        """``COPY ... FROM STDIN``: tagged rows go to the staging table; with ``tags=None``
        straight into ``stage``.

        Binary format (``connectors.jdbc.pgbinary``) when ``types`` (the pg_type OIDs of
        the columns, from ``column_types``) are all ones whose binary form it renders
        exactly; else CSV rendered by Arrow's C++ writer. Arrow quotes every string
        (``quoting_style="needed"``), so an empty string is ``""`` and a null is an empty
        unquoted field, exactly PostgreSQL's CSV convention.
        """
        first, rest = first_rows(batches)
        if first is None:
            return 0
        kinds = None
        if types is not None:
            kinds = pgbinary.kinds_for(first.schema, [s.name for s in specs], types)
        if kinds is None:
            return self._copy_csv(conn, stage, specs, rest, tags, batch_size, table)
        return self._copy_binary(conn, stage, specs, rest, tags, table, kinds)

    def _copy_statement(self, stage: sa.Table, specs: Sequence[ColumnSpec], tagged: bool,
                        fmt: str) -> Any:
        from psycopg import sql

        names = [*(TAG_COLUMNS if tagged else ()), *[s.column for s in specs]]
        return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
            _pg_ident(stage), sql.SQL(", ").join(sql.Identifier(n) for n in names),
            sql.SQL(fmt))

    def _copy_binary(self, conn: sa.Connection, stage: sa.Table, specs: Sequence[ColumnSpec],
                     batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int] | None,
                     table: str, kinds: list[str]) -> int:
        tag_fields = [] if tags is None else [(">i8", tags[0]), (">i4", tags[1]),
                                              (">i8", tags[2])]
        raw = conn.connection.driver_connection
        total = 0
        copy_sql = self._copy_statement(stage, specs, tags is not None, "binary")
        with raw.cursor() as cur, cur.copy(copy_sql) as copy:  # type: ignore[union-attr]
            copy.write(pgbinary.HEADER)
            for n, buffers in _binary_batches(batches, specs, table, kinds, tag_fields):
                for buf in buffers:
                    copy.write(buf)
                total += n
            copy.write(pgbinary.TRAILER)
        return total

    def _copy_csv(self, conn: sa.Connection, stage: sa.Table, specs: Sequence[ColumnSpec],
                  batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int] | None,
                  batch_size: int, table: str) -> int:
        from pyarrow import csv as pacsv

        names = [*(TAG_COLUMNS if tags else ()), *[s.column for s in specs]]
        copy_sql = self._copy_statement(stage, specs, tags is not None, "csv")
        options = pacsv.WriteOptions(include_header=False, quoting_style="needed",
                                     batch_size=max(1024, batch_size))
        raw = conn.connection.driver_connection
        total = 0
        with raw.cursor() as cur, cur.copy(copy_sql) as copy:  # type: ignore[union-attr]
            for batch in batches:
                n = batch.num_rows
                if n == 0:
                    continue
                check_values(table, batch, specs)
                data = self.prepare_arrow(batch, specs)
                if tags is not None:
                    data = pa.RecordBatch.from_arrays(
                        [
                            pa.repeat(pa.scalar(tags[0], pa.int64()), n),
                            pa.repeat(pa.scalar(tags[1], pa.int32()), n),
                            pa.repeat(pa.scalar(tags[2], pa.int64()), n),
                            *data.columns,
                        ],
                        names=names,
                    )
                buf = io.BytesIO()
                pacsv.write_csv(data, buf, options)
                copy.write(buf.getbuffer())
                total += n
        return total

    # -- append through blocks --------------------------------------------------------
    def create_blocks(self, conn: sa.Connection, blocks: sa.Table) -> None:
        """The block table: one row per block of an attempt's binary COPY stream. EXTERNAL
        storage keeps PostgreSQL from compressing the blocks (they are read once)."""
        from psycopg import sql

        raw = conn.connection.driver_connection
        ident = _pg_ident(blocks)
        raw.execute(sql.SQL(  # type: ignore[union-attr]
            "CREATE UNLOGGED TABLE IF NOT EXISTS {} (eo_batch bigint NOT NULL, eo_writer integer "
            "NOT NULL, eo_attempt bigint NOT NULL, eo_seq integer NOT NULL, eo_rows bigint NOT "
            "NULL, eo_data bytea NOT NULL)").format(ident))
        raw.execute(sql.SQL(  # type: ignore[union-attr]
            "ALTER TABLE {} ALTER COLUMN eo_data SET STORAGE EXTERNAL").format(ident))

    def write_blocks(self, conn: sa.Connection, blocks: sa.Table, specs: Sequence[ColumnSpec],
                     batches: Iterable[pa.RecordBatch], tags: tuple[int, int, int], table: str,
                     kinds: list[str]) -> tuple[int, int]:
        """Stage ``batches`` as the binary COPY tuples of the target's columns, cut into
        blocks of ``BLOCK_BYTES`` (a cut may fall inside a tuple: the commit concatenates an
        attempt's blocks in ``eo_seq`` order). ``eo_rows`` counts the rows completed in each
        block; their sum is the attempt's row count. Returns ``(rows, blocks)``."""
        from psycopg import sql

        raw = conn.connection.driver_connection
        copy_sql = sql.SQL(
            "COPY {} (eo_batch, eo_writer, eo_attempt, eo_seq, eo_rows, eo_data) FROM STDIN "
            "(FORMAT binary)").format(_pg_ident(blocks))
        total = done = seq = 0
        block = bytearray()
        with raw.cursor() as cur, cur.copy(copy_sql) as copy:  # type: ignore[union-attr]
            copy.set_types(["int8", "int4", "int8", "int4", "int8", "bytea"])

            def put() -> None:
                nonlocal seq, done
                copy.write_row((*tags, seq, done, bytes(block)))
                seq, done = seq + 1, 0
                block.clear()

            for n, buffers in _binary_batches(batches, specs, table, kinds):
                for piece in buffers:
                    view = memoryview(piece)  # type: ignore[arg-type]
                    while len(view):
                        take = BLOCK_BYTES - len(block)
                        block += view[:take]
                        view = view[take:]
                        if len(block) >= BLOCK_BYTES:
                            put()
                done += n
                total += n
            if block or done:
                put()
        return total, seq

    def block_counts(self, conn: sa.Connection, blocks: sa.Table, batch_id: int,
                     attempts: Sequence[int]) -> dict[int, tuple[int, int]]:
        """``attempt -> (rows, blocks)`` staged for ``batch_id`` (reads no block data)."""
        from psycopg import sql

        raw = conn.connection.driver_connection
        rows = raw.execute(sql.SQL(  # type: ignore[union-attr]
            "SELECT eo_attempt, sum(eo_rows), count(DISTINCT eo_seq) FROM {} WHERE eo_batch = "
            "%s AND eo_attempt = ANY(%s) GROUP BY eo_attempt").format(_pg_ident(blocks)),
            (batch_id, list(attempts)))
        return {int(a): (int(n), int(k)) for a, n, k in rows.fetchall()}

    def copy_blocks(self, conn: sa.Connection, reader: sa.Connection, target: sa.Table,
                    specs: Sequence[ColumnSpec], blocks: sa.Table, batch_id: int,
                    attempts: Sequence[int]) -> int:
        """``COPY target FROM STDIN`` on ``conn`` (the commit transaction), fed with the
        attempts' blocks in order, streamed one block at a time from ``reader`` (a second
        connection: ``conn`` is busy with the COPY). Returns the rows the server copied."""
        from psycopg import sql

        raw = conn.connection.driver_connection
        source = reader.connection.driver_connection
        select = sql.SQL("SELECT eo_data FROM {} WHERE eo_batch = %s AND eo_attempt = %s "
                         "ORDER BY eo_seq").format(_pg_ident(blocks))
        with raw.cursor() as cur:  # type: ignore[union-attr]
            with cur.copy(self._copy_statement(target, specs, False, "binary")) as copy:
                copy.write(pgbinary.HEADER)
                for attempt in attempts:
                    with source.cursor() as rcur:  # type: ignore[union-attr]
                        for (data,) in rcur.stream(select, (batch_id, attempt)):
                            copy.write(data)
                copy.write(pgbinary.TRAILER)
            return int(cur.rowcount)

    def clear_blocks(self, conn: sa.Connection, blocks: sa.Table, up_to_batch: int,
                     rows: int) -> None:
        """Remove the blocks of batches ``<= up_to_batch``: DELETE after a small batch
        (cheaper than TRUNCATE's fixed cost; autovacuum takes the few dead rows), else
        TRUNCATE."""
        if rows > SMALL_BLOCK_ROWS:
            _truncate_unless_empty(conn, blocks)
            return
        from psycopg import sql

        raw = conn.connection.driver_connection
        raw.execute(sql.SQL("DELETE FROM {} WHERE eo_batch <= %s").format(  # type: ignore[union-attr]
            _pg_ident(blocks)), (up_to_batch,))

    def clear_stage(self, conn: sa.Connection, stage: sa.Table, up_to_batch: int) -> None:
        """TRUNCATE: O(1) where DELETE rewrites every row. The staging table only ever holds
        rows the current commit needs (Spark commits one batch at a time and a replay
        stages again); if a second writer wrongly shared this sink_id, its commit would
        find its rows missing and fail instead of losing them (see the staged-row check)."""
        _truncate_unless_empty(conn, stage)

    def is_transient(self, exc: BaseException) -> bool:
        if super().is_transient(exc):
            return True
        import psycopg

        orig = getattr(exc, "orig", None) or exc
        if not isinstance(orig, psycopg.Error):
            return False
        state = orig.sqlstate or ""
        if state == "08P01":  # protocol violation (e.g. a malformed COPY stream): a bug
            return False
        if state.startswith("08") or state in ("40001", "40P01", "57P01", "57P02", "57P03",
                                               "53300"):
            return True
        # Client-side connection loss has no SQLSTATE.
        return isinstance(orig, psycopg.OperationalError) and not state

    def column_of(self, exc: BaseException) -> str | None:
        import re

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
        if super().is_transient(exc):
            return True
        text = str(getattr(exc, "orig", None) or exc).lower()
        return "database is locked" in text or "database is busy" in text


class MysqlDialect(Dialect):
    """MySQL/MariaDB through SQLAlchemy and pymysql: ``ON DUPLICATE KEY UPDATE``."""

    name = "mysql"
    _TRANSIENT_CODES = {1205, 1213, 2003, 2006, 2013}

    def insert(self, table: sa.Table) -> Any:
        from sqlalchemy.dialects.mysql import insert

        return insert(table)

    def excluded(self, ins: Any) -> Any:
        return ins.inserted

    def on_conflict(self, ins: Any, target: sa.Table, keys: Sequence[str],
                    updates: dict[str, Any]) -> Any:
        # MySQL picks the conflicting unique key itself; a no-op update keeps the row.
        return ins.on_duplicate_key_update(updates or {keys[0]: target.c[keys[0]]})

    def is_transient(self, exc: BaseException) -> bool:
        if super().is_transient(exc):
            return True
        orig = getattr(exc, "orig", None) or exc
        args: Any = getattr(orig, "args", ())
        return bool(args) and args[0] in self._TRANSIENT_CODES


#: Size of one staged block: a task holds at most this much encoded data in memory.
BLOCK_BYTES = 8 << 20
#: Up to this many rows in a batch's blocks, the commit DELETEs them instead of TRUNCATE.
SMALL_BLOCK_ROWS = 10_000


def _binary_batches(batches: Iterable[pa.RecordBatch], specs: Sequence[ColumnSpec], table: str,
                    kinds: list[str], tags: Sequence[tuple[str, int]] = (),
                    ) -> Iterator[tuple[int, list[pa.Buffer | bytes]]]:
    """``(rows, buffers)`` per non-empty batch: its values checked against ``specs``, then
    rendered as binary COPY tuples (without header/trailer)."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        check_values(table, batch, specs)
        columns = [batch.column(s.name) for s in specs]
        yield batch.num_rows, pgbinary.encode(columns, kinds, tags)


def first_rows(batches: Iterable[pa.RecordBatch],
               ) -> tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]:
    """``(first non-empty batch or None, all batches from it on)``: a peek at the schema
    the rows actually arrive in, without losing the batch."""
    it = iter(batches)
    first = next((b for b in it if b.num_rows > 0), None)
    return first, (itertools.chain([first], it) if first is not None else it)


def _truncate_unless_empty(conn: sa.Connection, table: sa.Table) -> None:
    """TRUNCATE costs about 2 ms whatever the size (a new relfilenode); an empty table
    (a batch that staged nothing there) skips it for a one-row probe."""
    from psycopg import sql

    raw = conn.connection.driver_connection
    ident = _pg_ident(table)
    probe = raw.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(ident))  # type: ignore[union-attr]
    if probe.fetchone() is not None:
        raw.execute(sql.SQL("TRUNCATE {}").format(ident))  # type: ignore[union-attr]


def _pg_ident(table: sa.Table) -> Any:
    from psycopg import sql

    return sql.Identifier(table.schema, table.name) if table.schema else sql.Identifier(table.name)
