"""The tables of one JDBC sink and their preparation on the driver (docs/jdbc-sink.md,
"How a batch is written").

- the **target** (``table``): created from the DataFrame schema with ``createTable``, else
  checked: every DataFrame column must exist and take the DataFrame's type, and the write
  mode checks what it needs (``connectors.jdbc.modes``: upsert and accumulate need a unique
  key on exactly the ``keys``);
- the **staging table** ``eo_stage_<sink>``: the target's column types plus the tags
  ``(eo_batch, eo_writer, eo_attempt)``; recreated when the columns change;
- the **block table** ``eo_stage_<sink>_blocks`` (PostgreSQL append, binary COPY blocks);
- the **commit table** ``eo_sink_commits`` (``connectors.jdbc.metadata``).

What the driver learned is a :class:`Layout`: picklable, it travels to the tasks. SQLAlchemy
table objects (reflection is slow) and layouts are cached per process.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from connectors.core.errors import JdbcSinkError
from connectors.jdbc import pgbinary
from connectors.jdbc.columns import (
    TAG_COLUMNS,
    ColumnSpec,
    Layout,
    arrow_category,
    arrow_to_sql_type,
    check_compatible,
    column_spec,
)
from connectors.jdbc.dialects import Dialect
from connectors.jdbc.metadata import CommitsTable, TasksTable
from connectors.jdbc.options import JdbcSinkOptions

log = logging.getLogger(__name__)


# Per-process caches: what the driver prepared (keyed by options + schema) and the SQLAlchemy
# table objects. Python workers and the driver keep them across batches.
_PREPARED: dict[Any, Layout] = {}
_META_READY: set[Any] = set()
_TABLES: dict[Any, sa.Table] = {}
_CACHE_LOCK = threading.Lock()


def _schema_key(options: JdbcSinkOptions, schema: pa.Schema) -> Any:
    return (options, schema.to_string(show_field_metadata=False, show_schema_metadata=False))


def prepared_layout(options: JdbcSinkOptions, schema: pa.Schema) -> Layout | None:
    with _CACHE_LOCK:
        return _PREPARED.get(_schema_key(options, schema))


def remember_layout(options: JdbcSinkOptions, schema: pa.Schema, layout: Layout) -> None:
    with _CACHE_LOCK:
        _PREPARED[_schema_key(options, schema)] = layout


def _named(key: tuple[Any, ...], build: Callable[[], sa.Table]) -> sa.Table:
    """A table object built from names alone, one per process and ``key``. Spark makes the
    sink anew for every batch, and SQLAlchemy's statement cache keys on the table object: a
    new object per batch compiled every statement again and filled the engine's cache (500
    entries, about 50 MB) within a hundred batches (bench/endurance.py)."""
    with _CACHE_LOCK:
        table = _TABLES.get(key)
        if table is None:
            table = _TABLES[key] = build()
    return table


class Tables:
    """The target, staging, block and commit tables of one sink, as SQLAlchemy objects."""

    def __init__(self, options: JdbcSinkOptions, dialect: Dialect) -> None:
        self.options = options
        self.dialect = dialect
        self.commits = CommitsTable.of(options.metadata_table, options.metadata_schema)
        self.tasks = TasksTable.of(options.tasks_table, options.metadata_schema)

    # -- table objects ----------------------------------------------------------------------
    def target(self, conn: sa.Connection) -> sa.Table:
        """The target, reflected (cached per process)."""
        o = self.options
        key = ("target", o.url, o.table_schema, o.table)
        with _CACHE_LOCK:
            cached = _TABLES.get(key)
        if cached is not None:
            return cached
        table = sa.Table(o.table or "", sa.MetaData(), schema=o.table_schema,
                         autoload_with=conn)
        with _CACHE_LOCK:
            _TABLES[key] = table
        return table

    def target_names(self, layout: Layout) -> sa.Table:
        """The target by column names only: enough to build statements, and it spares a
        reflection in a fresh Python process (Spark may run the commit in one)."""
        o = self.options
        names = tuple(c.column for c in layout.columns)
        return _named(("target names", o.table_schema, o.table, names), lambda: sa.Table(
            o.table or "", sa.MetaData(), *[sa.Column(n, sa.types.NullType()) for n in names],
            schema=o.table_schema))

    def target_for_rows(self, conn: sa.Connection, layout: Layout) -> sa.Table:
        """The target as ``Dialect.write_rows`` needs it (reflected types only for binds)."""
        return self.target(conn) if self.dialect.binds_types else self.target_names(layout)

    def stage(self, conn: sa.Connection, layout: Layout, typed: bool = False) -> sa.Table:
        """The staging table object. Only SQLAlchemy's bind processing needs real types
        (SQLite dates...), so COPY and statement building use names alone."""
        o = self.options
        if typed:
            key = ("stage", o.url, o.staging_schema, o.staging_table, tuple(layout.names))
            with _CACHE_LOCK:
                cached = _TABLES.get(key)
            if cached is None:
                cached = sa.Table(o.staging_table, sa.MetaData(), schema=o.staging_schema,
                                  autoload_with=conn)
                with _CACHE_LOCK:
                    _TABLES[key] = cached
            return cached
        names = tuple(c.column for c in layout.columns)
        d = self.dialect
        return _named(("stage names", d.name, getattr(d, "durable_staging", True),
                       o.staging_schema, o.staging_table, names),
                      lambda: d.stage_table(o.staging_table, o.staging_schema,
                                            [(n, sa.types.NullType()) for n in names]))

    def stage_for_rows(self, conn: sa.Connection, layout: Layout) -> sa.Table:
        """The staging table as ``Dialect.write_rows`` needs it."""
        return self.stage(conn, layout, typed=self.dialect.binds_types)

    def blocks(self) -> sa.Table:
        o = self.options
        return _named(("blocks", o.staging_schema, o.blocks_table), lambda: sa.Table(
            o.blocks_table, sa.MetaData(), schema=o.staging_schema))

    def delete_batch(self, conn: sa.Connection, batch_id: int) -> None:
        """Delete what ``batch_id`` staged, from whichever staging tables exist (abort runs
        without a prepared layout)."""
        o = self.options
        insp = sa.inspect(conn)
        for name in (o.staging_table, o.blocks_table):
            if insp.has_table(name, schema=o.staging_schema):
                table = _named(("batch column", o.staging_schema, name),
                               functools.partial(sa.Table, name, sa.MetaData(),
                                                 sa.Column("eo_batch", sa.BigInteger),
                                                 schema=o.staging_schema))
                conn.execute(table.delete().where(table.c.eo_batch == batch_id))

    # -- preparation (driver, before any task) -------------------------------------------------
    def _meta_key(self) -> Any:
        o = self.options
        return (o.url, o.metadata_schema, o.metadata_table, o.sink_id, o.commit_scope != "batch")

    def metadata_ready(self) -> bool:
        return self._meta_key() in _META_READY

    def prepare_metadata(self, conn: sa.Connection) -> None:
        """Create the commit table if missing and register the sink's row; the tasks table
        too where the commit scope records tasks (``task``, ``prepared``)."""
        self.commits.create(conn)
        self.commits.register(conn, self.options.sink_id)
        if self.options.commit_scope != "batch":
            self.tasks.create(conn)

    def metadata_prepared(self) -> None:
        _META_READY.add(self._meta_key())

    def prepare(self, conn: sa.Connection, schema: pa.Schema) -> Layout:
        """Create or check the target and the staging tables for ``schema``; refuse a
        DataFrame column the table lacks or a type it cannot take."""
        o = self.options
        insp = sa.inspect(conn)
        target: sa.Table | None = None
        if o.table is not None:
            exists = insp.has_table(o.table, schema=o.table_schema)
            if not exists and o.create_table:
                self._create_target(conn, schema)
            elif not exists:
                raise JdbcSinkError(
                    f"eo_jdbc sink {o.sink_id!r}: table {o.qualified_table!r} does not exist "
                    f"at {o.redacted_url}; create it, or set createTable=true to create it "
                    "from the DataFrame schema"
                )
            with _CACHE_LOCK:
                _TABLES.pop(("target", o.url, o.table_schema, o.table), None)
            target = self.target(conn)
        specs = self._column_specs(conn, schema, target)
        o.write_mode.check(insp, target, specs, schema, o.sink_id, o.qualified_table)
        self._ensure_stage(conn, insp, target, specs, schema)
        stage_types, target_types = self._column_types(conn, target, specs)
        store = self.dialect.block_store()
        blocks = (o.write_mode.as_is and o.stage_blocks and store is not None
                  and target_types is not None and pgbinary.kinds_for(
                      schema, [s.name for s in specs], target_types) is not None)
        if store is not None and blocks:
            if insp.has_table(o.blocks_table, schema=o.staging_schema):
                store.ensure_durability(conn, self.blocks())
            else:
                store.create_blocks(conn, self.blocks())
        return Layout(tuple(specs), stage_types, target_types, blocks)

    def _column_types(self, conn: sa.Connection, target: sa.Table | None,
                      specs: list[ColumnSpec]) -> tuple[tuple[int, ...] | None,
                                                         tuple[int, ...] | None]:
        """The database's type ids of the staging table's and the target's data columns
        (the staging table's tags must be bigint, integer, bigint)."""
        o = self.options
        d = self.dialect
        names = [s.column for s in specs]
        stage = sa.Table(o.staging_table, sa.MetaData(), schema=o.staging_schema)
        stage_types = d.column_types(conn, stage, [*TAG_COLUMNS, *names])
        if stage_types is not None:
            tags, stage_types = stage_types[:len(TAG_COLUMNS)], stage_types[len(TAG_COLUMNS):]
            if tags != d.tag_types:
                stage_types = None
        target_types = d.column_types(conn, target, names) if target is not None else None
        return stage_types, target_types

    def _create_target(self, conn: sa.Connection, schema: pa.Schema) -> None:
        o = self.options
        keys = set(o.write_mode.keys)
        cols = [
            sa.Column(f.name, arrow_to_sql_type(f.type, self.dialect.name, f.name in keys),
                      primary_key=f.name in keys, nullable=f.name not in keys)
            for f in schema
        ]
        missing = [k for k in o.write_mode.keys if k not in schema.names]
        if missing:
            raise JdbcSinkError(
                f"eo_jdbc sink {o.sink_id!r}: key columns {missing} are not DataFrame columns "
                f"{schema.names}; cannot create table {o.qualified_table!r}"
            )
        sa.Table(o.table or "", sa.MetaData(), *cols, schema=o.table_schema).create(conn)
        log.info("eo_jdbc sink %s: created table %s", o.sink_id, o.qualified_table)

    def _column_specs(self, conn: sa.Connection, schema: pa.Schema,
                      target: sa.Table | None) -> list[ColumnSpec]:
        o = self.options
        dialect = conn.dialect
        specs: list[ColumnSpec] = []
        if target is None:  # mode sql: the staging table takes the DataFrame's own types
            for f in schema:
                if arrow_category(f.type) == "nested":
                    raise JdbcSinkError(
                        f"eo_jdbc sink {o.sink_id!r}: column {f.name!r} has type {f.type}, "
                        "which the JDBC sink does not support; convert it (e.g. to_json)"
                    )
                specs.append(column_spec(f.name, f.name, f.type,
                                         arrow_to_sql_type(f.type, self.dialect.name), dialect))
            return specs
        by_lower: dict[str, list[str]] = {}
        for c in target.columns:
            by_lower.setdefault(c.name.lower(), []).append(c.name)
        for f in schema:
            if f.name in target.columns:
                col = f.name
            elif len(by_lower.get(f.name.lower(), [])) == 1:
                col = by_lower[f.name.lower()][0]  # PostgreSQL folds unquoted names
            else:
                raise JdbcSinkError(
                    f"eo_jdbc sink {o.sink_id!r}: table {o.qualified_table!r} has no column "
                    f"{f.name!r} for DataFrame column {f.name!r} (type {f.type}); table "
                    f"columns: {[c.name for c in target.columns]}; add the column to the "
                    "table or drop it from the DataFrame"
                )
            spec = column_spec(f.name, col, f.type, target.c[col].type, dialect)
            check_compatible(o.qualified_table, f, spec)
            specs.append(spec)
        return specs

    def _ensure_stage(self, conn: sa.Connection, insp: Any, target: sa.Table | None,
                      specs: list[ColumnSpec], schema: pa.Schema) -> None:
        """Create the staging table, or recreate it when the columns changed since it was
        made (a new DataFrame schema or altered target types). Its rows are only ever
        needed by the batch that staged them, and a replayed batch stages again."""
        o = self.options
        d = self.dialect
        if target is not None:
            typed = [(s.column, target.c[s.column].type) for s in specs]
        else:
            typed = [(s.column, arrow_to_sql_type(schema.field(s.name).type, d.name))
                     for s in specs]
        wanted = d.stage_table(o.staging_table, o.staging_schema, typed)
        if insp.has_table(o.staging_table, schema=o.staging_schema):
            have = insp.get_columns(o.staging_table, schema=o.staging_schema)
            expected = [(c.name, _type_text(c.type, conn)) for c in wanted.columns]
            actual = [(c["name"], _type_text(c["type"], conn)) for c in have]
            if _same_columns(expected, actual):
                d.ensure_durability(conn, wanted)
                return
            log.info("eo_jdbc sink %s: recreating staging table %s (columns changed)",
                     o.sink_id, o.staging_table)
            wanted.drop(conn)
        d.create_stage(conn, wanted, target)
        with _CACHE_LOCK:
            for key in [k for k in _TABLES if k[0] == "stage" and k[3] == o.staging_table]:
                del _TABLES[key]


# MariaDB reflects integer columns with a display width (BIGINT(20), INT(11)) that the DDL
# SQLAlchemy compiles does not spell (BIGINT, INTEGER); the width changes nothing stored.
_INT_WIDTH = re.compile(r"^(TINYINT|SMALLINT|MEDIUMINT|INT|INTEGER|BIGINT)\(\d+\)")


def _type_text(t: Any, conn: sa.Connection) -> str:
    try:
        text = str(t.compile(dialect=conn.dialect)).upper()
    except Exception:  # noqa: BLE001 - NullType and exotic types have no DDL form
        return type(t).__name__.upper()
    text = _INT_WIDTH.sub(r"\1", text)
    return "INT" + text[len("INTEGER"):] if text.startswith("INTEGER") else text


def _same_columns(expected: list[tuple[str, str]], actual: list[tuple[str, str]]) -> bool:
    if [n for n, _ in expected] != [n for n, _ in actual]:
        return False
    # Reflection spells some types differently from DDL (INTEGER vs INT, TEXT vs VARCHAR on
    # SQLite, domains on PostgreSQL); compare where both sides are known.
    return all(e == a or "NULL" in e or "NULL" in a for (_, e), (_, a) in zip(expected, actual,
                                                                               strict=True))
