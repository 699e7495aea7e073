"""The write modes of the JDBC sink: what a batch's rows do to the target table.

The option ``mode`` names one of four types, chosen once when the options are parsed
(:meth:`WriteMode.from_values`); everything that differs between them lives in its class:

- :class:`Append`: ``INSERT ... SELECT`` of the staged rows as they are. The only mode whose
  rows may go into the target unchanged, so binary COPY blocks and the driver's own rows can
  be written straight into it, and the INSERT's row count checks the staged rows;
- :class:`Upsert` (``keys``): ``INSERT ... SELECT ... ON CONFLICT (keys) DO UPDATE`` (``ON
  DUPLICATE KEY UPDATE`` on MySQL); the table needs a unique key on exactly the keys;
- :class:`Accumulate` (``keys``, ``accumulate`` columns): the staged rows summed per key,
  then ``col = coalesce(col, 0) + coalesce(new, 0)`` on conflict; the columns must be
  numeric;
- :class:`CustomSql` (``statement``): the user's statement once per staged row, in writer
  order; the target table is optional, and each ``:param`` must name a DataFrame column.

Each builds its SQL with SQLAlchemy Core against the dialect's ``insert``/``on_conflict``
(``connectors.jdbc.dialects``), so identifiers are quoted by the database's own rules. The
modes are frozen dataclasses: part of the picklable options, they travel to the tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
import sqlalchemy as sa

from connectors.core.declared import Values
from connectors.core.errors import JdbcSinkError, OptionError
from connectors.jdbc.columns import ColumnSpec, Layout
from connectors.jdbc.dialects import Dialect


class WriteMode(ABC):
    """What a batch's staged rows do to the target (see the module docstring)."""

    #: the value of the ``mode`` option
    name: ClassVar[str]
    #: The mode writes into the ``table`` option's table (``sql`` may write anywhere).
    needs_table: ClassVar[bool] = True
    #: The mode matches rows on ``keys``, so it cannot run without them.
    needs_keys: ClassVar[bool] = False
    #: Rows enter the target unchanged (a plain INSERT: no conflict handling, aggregation or
    #: statement), so binary COPY blocks and driver-side rows may go straight into it.
    as_is: ClassVar[bool] = False
    #: ``apply`` returns how many staged rows its INSERT read; that check replaces the
    #: count of the staged rows in the commit's verify step (one scan less).
    counted_by_apply: ClassVar[bool] = False

    #: Key columns (DataFrame names): the conflict target of upsert and accumulate, and the
    #: primary key of a table that ``createTable`` makes, in every mode.
    keys: tuple[str, ...] = ()
    #: accumulate: the numeric columns added to
    columns: tuple[str, ...] = ()
    #: sql: the user's statement
    statement: str | None = None

    # -- chosen once, from the options ----------------------------------------------------
    @classmethod
    def from_values(cls, v: Values) -> WriteMode:
        """This mode from the options ``keys``, ``accumulate`` and ``statement``, each refused
        where this mode does not use it or lacks it, with the option named."""
        keys, columns, statement = v["keys"], v["accumulate"], v["statement"]
        adds = cls is Accumulate
        runs_statement = cls is CustomSql
        if cls.needs_keys and not keys:
            raise v.error("keys", f"is required with mode '{cls.name}'",
                          "list the key columns, e.g. keys=word (comma-separated)")
        if adds and not columns:
            raise v.error("accumulate", "is required with mode 'accumulate'",
                          "list the columns to add to, e.g. accumulate=count")
        if not adds and columns:
            raise v.error("accumulate", f"is only used with mode 'accumulate', not '{cls.name}'",
                          "remove it or set mode=accumulate")
        if set(keys) & set(columns):
            raise v.error("accumulate", f"repeats key columns {sorted(set(keys) & set(columns))}",
                          "a column is either a key or accumulated")
        if runs_statement and not statement:
            raise v.error("statement", "is required with mode 'sql'",
                          "give SQL with named parameters, e.g. INSERT INTO t (w, n) VALUES "
                          "(:w, :n) ON CONFLICT (w) DO UPDATE SET n = t.n + excluded.n")
        if not runs_statement and statement:
            raise v.error("statement", f"is only used with mode 'sql', not '{cls.name}'",
                          "remove it or set mode=sql")
        return cls._build(keys, columns, statement or "")

    @classmethod
    @abstractmethod
    def _build(cls, keys: tuple[str, ...], columns: tuple[str, ...],
               statement: str) -> WriteMode:
        """The mode from the checked option values (each takes what it uses)."""

    # -- driver, before any task ----------------------------------------------------------
    def check(self, insp: Any, target: sa.Table | None, specs: Sequence[ColumnSpec],
              schema: pa.Schema, sink_id: str, table: str) -> None:
        """Refuse, on the driver, a table or DataFrame this mode cannot write (``insp`` is
        the connection's SQLAlchemy inspector, ``table`` the target's name for messages).
        Append needs nothing beyond the column checks every mode gets."""
        return None

    # -- the commit's apply step (2c) -----------------------------------------------------
    @abstractmethod
    def apply(self, conn: sa.Connection, dialect: Dialect, target: sa.Table, stage: sa.Table,
              layout: Layout, where: Any, batch_size: int, ordered: bool = False) -> int | None:
        """Apply the staged rows selected by ``where`` to ``target`` inside the caller's
        transaction; the number of staged rows read when the database says so exactly
        (``counted_by_apply``), else None. ``ordered``: touch the target's rows in key order,
        so that transactions applying rows of one batch side by side (``commitScope=task``)
        take their row locks in one order and never deadlock on each other."""


@dataclass(frozen=True)
class Append(WriteMode):
    """``INSERT INTO target SELECT ... FROM staging``: every row is added."""

    name = "append"
    as_is = True
    counted_by_apply = True

    keys: tuple[str, ...] = ()

    @classmethod
    def _build(cls, keys: tuple[str, ...], columns: tuple[str, ...], statement: str) -> Append:
        return cls(keys)

    def apply(self, conn: sa.Connection, dialect: Dialect, target: sa.Table, stage: sa.Table,
              layout: Layout, where: Any, batch_size: int, ordered: bool = False) -> int | None:
        columns = layout.table_columns
        sel = sa.select(*[stage.c[c] for c in columns]).where(where)
        stmt = target.insert().from_select(columns, sel)
        # SQLAlchemy only keeps an INSERT's row count when asked to.
        result = conn.execute(stmt.execution_options(preserve_rowcount=True))
        count = result.rowcount
        return int(count) if count is not None and count >= 0 else None


class _Merge(WriteMode):
    """Upsert and accumulate: one ``INSERT ... SELECT`` that updates the rows whose keys
    exist; the table needs a unique key on exactly the keys for the database to match."""

    needs_keys = True

    def check(self, insp: Any, target: sa.Table | None, specs: Sequence[ColumnSpec],
              schema: pa.Schema, sink_id: str, table: str) -> None:
        if target is None:
            return
        names = {s.name: s for s in specs}
        for what, cols in (("keys", self.keys), ("accumulate", self.columns)):
            missing = [c for c in cols if c not in names]
            if missing:
                raise OptionError(
                    f"eo_jdbc: option '{what}' names {missing}, which are not DataFrame "
                    f"columns {list(names)}; list columns the DataFrame has", option=what)
        for a in self.columns:
            if names[a].category not in ("int", "float", "decimal"):
                raise OptionError(
                    f"eo_jdbc: option 'accumulate' names column {a!r} of table "
                    f"{table!r}, type {names[a].sql_type}: only numeric columns "
                    "can be added to", option="accumulate")
        wanted = {names[k].column for k in self.keys}
        unique_sets = []
        pk = insp.get_pk_constraint(target.name, schema=target.schema)
        unique_sets.append(set(pk.get("constrained_columns") or []))
        for uc in insp.get_unique_constraints(target.name, schema=target.schema):
            unique_sets.append(set(uc.get("column_names") or []))
        for ix in insp.get_indexes(target.name, schema=target.schema):
            if ix.get("unique"):
                unique_sets.append({c for c in ix.get("column_names") or [] if c})
        if wanted not in unique_sets:
            raise JdbcSinkError(
                f"eo_jdbc sink {sink_id!r}: mode {self.name!r} needs a primary key or unique "
                f"index on exactly the keys {sorted(wanted)} of table {table!r} "
                "(ON CONFLICT / ON DUPLICATE KEY matches on it); add one, or create the table "
                "with createTable=true"
            )

    def statement_for(self, dialect: Dialect, target: sa.Table, stage: sa.Table,
                      layout: Layout, where: Any, ordered: bool = False) -> Any:
        """The set-based statement: ``INSERT ... SELECT`` and the dialect's conflict clause,
        which sets the other columns to the new values and adds the accumulated ones."""
        keys = [layout.column(k) for k in self.keys]
        added = [layout.column(a) for a in self.columns]
        others = [c for c in layout.table_columns if c not in keys and c not in added]
        sel, cols = self._select(stage, layout.table_columns, keys, added, others, where)
        if ordered:
            sel = sel.order_by(*[stage.c[k] for k in keys])
        ins = dialect.insert(target).from_select(cols, sel)
        new = dialect.excluded(ins)
        updates: dict[str, Any] = {o: new[o] for o in others}
        for a in added:
            zero: Any = sa.literal_column("0")
            updates[a] = sa.func.coalesce(target.c[a], zero) + sa.func.coalesce(new[a], zero)
        return dialect.on_conflict(ins, target, keys, updates)

    @abstractmethod
    def _select(self, stage: sa.Table, columns: list[str], keys: list[str], added: list[str],
                others: list[str], where: Any) -> tuple[Any, list[str]]:
        """The SELECT of the staged rows and the target columns it fills, in its order."""

    def apply(self, conn: sa.Connection, dialect: Dialect, target: sa.Table, stage: sa.Table,
              layout: Layout, where: Any, batch_size: int, ordered: bool = False) -> int | None:
        conn.execute(self.statement_for(dialect, target, stage, layout, where, ordered))
        return None


@dataclass(frozen=True)
class Upsert(_Merge):
    """Insert new keys; for an existing key, the row's other columns take the new values
    (a key with no other columns is left as it is)."""

    name = "upsert"

    keys: tuple[str, ...]

    @classmethod
    def _build(cls, keys: tuple[str, ...], columns: tuple[str, ...], statement: str) -> Upsert:
        return cls(keys)

    def _select(self, stage: sa.Table, columns: list[str], keys: list[str], added: list[str],
                others: list[str], where: Any) -> tuple[Any, list[str]]:
        return sa.select(*[stage.c[c] for c in columns]).where(where), list(columns)


@dataclass(frozen=True)
class Accumulate(_Merge):
    """Add the batch's ``columns`` to the existing row of each key (``count = count + new``,
    the non-idempotent write that exactly-once is for); other columns take the new values."""

    name = "accumulate"

    keys: tuple[str, ...]
    columns: tuple[str, ...]

    @classmethod
    def _build(cls, keys: tuple[str, ...], columns: tuple[str, ...],
               statement: str) -> Accumulate:
        return cls(keys, columns)

    def _select(self, stage: sa.Table, columns: list[str], keys: list[str], added: list[str],
                others: list[str], where: Any) -> tuple[Any, list[str]]:
        # Pre-aggregate per key: a batch may hold a key twice, and ON CONFLICT may not
        # touch one row twice in one statement (PostgreSQL refuses, MySQL/SQLite would
        # apply the rows one after the other, which is the same sum but not portable).
        sel = (
            sa.select(
                *[stage.c[k] for k in keys],
                *[sa.func.sum(stage.c[a]).label(a) for a in added],
                *[sa.func.max(stage.c[o]).label(o) for o in others],
            )
            .where(where)
            .group_by(*[stage.c[k] for k in keys])
        )
        return sel, [*keys, *added, *others]


@dataclass(frozen=True)
class CustomSql(WriteMode):
    """The user's ``statement`` (named parameters, one per DataFrame column it uses), run
    once per staged row inside the commit transaction."""

    name = "sql"
    needs_table = False

    statement: str
    keys: tuple[str, ...] = ()

    @classmethod
    def _build(cls, keys: tuple[str, ...], columns: tuple[str, ...],
               statement: str) -> CustomSql:
        return cls(statement, keys)

    def check(self, insp: Any, target: sa.Table | None, specs: Sequence[ColumnSpec],
              schema: pa.Schema, sink_id: str, table: str) -> None:
        params = sorted(sa.text(self.statement).compile().params)
        missing = [p for p in params if p not in schema.names]
        if missing:
            raise JdbcSinkError(
                f"eo_jdbc sink {sink_id!r}: the statement's parameters {missing} are not "
                f"DataFrame columns {schema.names}; name each :param after a column"
            )

    def apply(self, conn: sa.Connection, dialect: Dialect, target: sa.Table, stage: sa.Table,
              layout: Layout, where: Any, batch_size: int, ordered: bool = False) -> int | None:
        stmt = sa.text(self.statement)
        names = layout.names
        result = conn.execute(sa.select(*[stage.c[c] for c in layout.table_columns])
                              .where(where).order_by(stage.c.eo_writer))
        while True:
            chunk = result.fetchmany(batch_size)
            if not chunk:
                break
            conn.execute(stmt, [dict(zip(names, r, strict=True)) for r in chunk])
        return None


#: the ``mode`` option's values and their types
MODES: dict[str, type[WriteMode]] = {
    m.name: m for m in (Append, Upsert, Accumulate, CustomSql)
}
