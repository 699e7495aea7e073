"""Column types of the JDBC sink: which DataFrame type may go into which table column.

- ``column_spec``: one DataFrame column and the table column it lands in (``ColumnSpec``,
  picklable: it travels to the tasks); a :class:`Layout` is all of them, with what the
  driver learned about the tables;
- ``check_compatible``: refuse, on the driver, a type pair that can never be right;
- ``check_values``: the value checks every dialect needs and SQLite would not do (integer
  range, string length), vectorized per batch;
- ``arrow_to_sql_type``: the column type ``createTable`` (and mode ``sql``'s staging table)
  gives a DataFrame column.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa

from connectors.core.errors import JdbcSinkError

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


@dataclass(frozen=True)
class Layout:
    """What the driver learned about the tables (picklable; travels to the tasks)."""

    columns: tuple[ColumnSpec, ...]
    # PostgreSQL: pg_type OIDs of the data columns in the staging table and in the target
    # (they pick binary COPY); None elsewhere or when unknown.
    stage_types: tuple[int, ...] | None = None
    target_types: tuple[int, ...] | None = None
    # PostgreSQL append whose columns all have a binary COPY form: tasks stage blocks.
    blocks: bool = False

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def table_columns(self) -> list[str]:
        """The table columns the DataFrame columns land in, in DataFrame order."""
        return [c.column for c in self.columns]

    def spec(self, column: str) -> ColumnSpec | None:
        """The column spec of a DataFrame or table column name."""
        for spec in self.columns:
            if column in (spec.name, spec.column):
                return spec
        return None

    def column(self, name: str) -> str:
        """The table column that DataFrame column ``name`` lands in."""
        spec = self.spec(name)
        return spec.column if spec else name


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


def first_rows(batches: Iterable[pa.RecordBatch],
               ) -> tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]:
    """``(first non-empty batch or None, all batches from it on)``: a peek at the schema
    the rows actually arrive in, without losing the batch."""
    it = iter(batches)
    first = next((b for b in it if b.num_rows > 0), None)
    return first, (itertools.chain([first], it) if first is not None else it)
