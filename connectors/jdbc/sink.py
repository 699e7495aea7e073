"""``eo_jdbc``: the transactional JDBC sink (DESIGN.md section 7).

Use it as ``writeStream.format("eo_jdbc")``, as ``writeStream.foreachBatch(JdbcSink(...))``
or as ``JdbcSink(...).write(df, batch_id)``. The exactly-once mechanism is Apex Malhar's
JdbcTransactionalStore: the last committed batch id of each sink lives in a metadata table
(``eo_sink_commits``) and moves in the *same* database transaction as the rows.
"""

from __future__ import annotations

import copy
import io
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, TypeVar

import pyarrow as pa
import sqlalchemy as sa

from connectors.core import failpoints
from connectors.core.errors import ConnectorError, JdbcSinkError, OptionError
from connectors.core.options import OptionReader, redact_url, stringify_options
from connectors.core.sink import BatchSink, TaskInfo
from connectors.jdbc import pgbinary
from connectors.jdbc.dialects import (
    TAG_COLUMNS,
    ColumnSpec,
    Dialect,
    arrow_category,
    arrow_to_sql_type,
    check_compatible,
    column_spec,
    dialect_for,
    first_rows,
    normalize_url,
)
from connectors.jdbc.metadata import DEFAULT_NAME, CommitsTable

log = logging.getLogger(__name__)

MODES = ("append", "upsert", "accumulate", "sql")
# Spark's JDBC spellings -> SQLAlchemy's.
ISOLATION_LEVELS = {
    "READ_UNCOMMITTED": "READ UNCOMMITTED",
    "READ_COMMITTED": "READ COMMITTED",
    "REPEATABLE_READ": "REPEATABLE READ",
    "SERIALIZABLE": "SERIALIZABLE",
}
_IDENT = r'(?:"(?:[^"]|"")+"|[^."\s]+)'
_QUALIFIED = re.compile(rf"^\s*(?:({_IDENT})\.)?({_IDENT})\s*$")
T = TypeVar("T")


def parse_table_name(text: str, option: str) -> tuple[str | None, str]:
    """``table`` / ``schema.table`` / ``"My Schema"."My Table"`` -> (schema, name)."""
    m = _QUALIFIED.match(text)
    if not m:
        raise OptionError(
            f"eo_jdbc: option '{option}' is not a table name: {text!r}; use table, "
            'schema.table or "Quoted Schema"."Quoted Table"',
            option=option,
        )

    def unquote(part: str | None) -> str | None:
        if part is None:
            return None
        return part[1:-1].replace('""', '"') if part.startswith('"') else part

    name = unquote(m.group(2))
    if name is None:  # the regex always captures group 2; this keeps mypy precise
        raise OptionError(f"eo_jdbc: option '{option}' has an empty table name", option=option)
    return unquote(m.group(1)), name


def staging_name(sink_id: str) -> str:
    """``eo_stage_<sink>``: deterministic, a plain identifier, at most 63 characters."""
    clean = re.sub(r"[^a-z0-9_]", "_", sink_id.lower())
    if clean == sink_id and len(clean) <= 40:
        return f"eo_stage_{clean}"
    # Different sink ids must not share a staging table after sanitizing ("a-b" vs "a_b").
    return f"eo_stage_{clean[:40]}_{sha256(sink_id.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class JdbcSinkOptions:
    """Parsed options of one JDBC sink (a picklable spec; no connections)."""

    url: str = field(repr=False)
    sink_id: str
    mode: str
    table: str | None
    table_schema: str | None
    keys: tuple[str, ...] = ()
    accumulate: tuple[str, ...] = ()
    statement: str | None = None
    create_table: bool = False
    batch_size: int = 10_000
    retry_deadline: float = 30.0
    isolation_level: str | None = None
    metadata_table: str = DEFAULT_NAME
    metadata_schema: str | None = None
    staging_table: str = ""
    staging_schema: str | None = None
    small_batch_rows: int = 10_000
    stage_blocks: bool = True

    @property
    def redacted_url(self) -> str:
        return redact_url(self.url)

    @property
    def blocks_table(self) -> str:
        """``<staging table>_blocks``: PostgreSQL append stages binary COPY blocks here."""
        name = f"{self.staging_table}_blocks"
        if len(name) <= 63:
            return name
        digest = sha256(self.staging_table.encode()).hexdigest()[:8]
        return f"{self.staging_table[:46]}_{digest}_blocks"

    @property
    def qualified_table(self) -> str:
        if self.table is None:
            return "(statement)"
        return f"{self.table_schema}.{self.table}" if self.table_schema else self.table

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> JdbcSinkOptions:
        r = OptionReader(options, family="eo_jdbc")
        url = normalize_url(r.required("url", "a SQLAlchemy URL such as "
                                       "postgresql+psycopg://user@host/db or sqlite:///path.db"))
        sink_id = r.string("sink_id") or r.string("sinkId")
        if not sink_id:
            raise r.error(
                "sink_id", "is required but was not set",
                "set a stable name for this sink, unique per target table; it keys the "
                "commit table, so it must stay the same across restarts",
            )
        if len(sink_id) > 255:
            raise r.error("sink_id", f"is {len(sink_id)} characters long", "use at most 255")
        mode = r.choice("mode", MODES, default="append") or "append"
        table_text = r.string("table")
        schema, table = (None, None)
        if table_text is not None:
            schema, table = parse_table_name(table_text, "table")
        elif mode != "sql":
            raise r.error("table", "is required but was not set",
                          "name the target table (schema.table allowed)")
        keys = tuple(r.csv_list("keys"))
        acc = tuple(r.csv_list("accumulate"))
        statement = r.string("statement")
        if mode in ("upsert", "accumulate") and not keys:
            raise r.error("keys", f"is required with mode '{mode}'",
                          "list the key columns, e.g. keys=word (comma-separated)")
        if mode == "accumulate" and not acc:
            raise r.error("accumulate", "is required with mode 'accumulate'",
                          "list the columns to add to, e.g. accumulate=count")
        if mode != "accumulate" and acc:
            raise r.error("accumulate", f"is only used with mode 'accumulate', not '{mode}'",
                          "remove it or set mode=accumulate")
        if set(keys) & set(acc):
            raise r.error("accumulate", f"repeats key columns {sorted(set(keys) & set(acc))}",
                          "a column is either a key or accumulated")
        if mode == "sql" and not statement:
            raise r.error("statement", "is required with mode 'sql'",
                          "give SQL with named parameters, e.g. INSERT INTO t (w, n) VALUES "
                          "(:w, :n) ON CONFLICT (w) DO UPDATE SET n = t.n + excluded.n")
        if mode != "sql" and statement:
            raise r.error("statement", f"is only used with mode 'sql', not '{mode}'",
                          "remove it or set mode=sql")
        create_table = r.boolean("createTable", False)
        if create_table and table is None:
            raise r.error("createTable", "needs option 'table'", "name the table to create")
        batch_size = r.integer("batchSize", 10_000, minimum=1) or 10_000
        deadline = r.duration("retryDeadline", 30.0, minimum=0.0)
        iso_raw = r.string("isolationLevel")
        iso = None
        if iso_raw is not None:
            key = iso_raw.strip().upper().replace(" ", "_")
            if key not in ISOLATION_LEVELS:
                valid = list(ISOLATION_LEVELS)
                why = (" (NONE would commit without a transaction, which breaks exactly-once)"
                       if key == "NONE" else "")
                raise r.error("isolationLevel", f"has invalid value {iso_raw!r}{why}",
                              f"valid values: {valid}")
            iso = ISOLATION_LEVELS[key]
        meta_schema, meta_name = parse_table_name(
            r.string("metadataTable", DEFAULT_NAME) or DEFAULT_NAME, "metadataTable")
        staging_text = r.string("stagingTable")
        if staging_text:
            stage_schema, stage_name = parse_table_name(staging_text, "stagingTable")
        else:
            stage_schema, stage_name = (schema if table else meta_schema), staging_name(sink_id)
        small = r.integer("smallBatchRows", 10_000, minimum=0)
        stage_blocks = r.boolean("stageBlocks", True)
        r.warn_unknown(ignore=("batchId",))
        return cls(
            url=url.render_as_string(hide_password=False),
            sink_id=sink_id,
            mode=mode,
            table=table,
            table_schema=schema,
            keys=keys,
            accumulate=acc,
            statement=statement,
            create_table=create_table,
            batch_size=batch_size,
            retry_deadline=30.0 if deadline is None else deadline,
            isolation_level=iso,
            metadata_table=meta_name,
            metadata_schema=meta_schema,
            staging_table=stage_name,
            staging_schema=stage_schema,
            small_batch_rows=10_000 if small is None else small,
            stage_blocks=bool(stage_blocks),
        )


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


@dataclass(frozen=True)
class StagedRows:
    """Stage message: this attempt's rows are in the staging table under ``token``."""

    writer_id: int
    token: int
    rows: int


@dataclass(frozen=True)
class StagedBlocks:
    """Stage message: this attempt's rows are binary COPY blocks under ``token``."""

    writer_id: int
    token: int
    rows: int
    blocks: int


@dataclass(frozen=True)
class InlineRows:
    """foreachBatch path: a small partition's rows travel to the driver (Arrow IPC)."""

    writer_id: int
    rows: int
    data: bytes = field(repr=False)

    def batches(self) -> list[pa.RecordBatch]:
        return list(pa.ipc.open_stream(self.data))


# Per-process caches: what the driver prepared (keyed by options + schema) and the SQLAlchemy
# table objects. Python workers and the driver keep them across batches.
_PREPARED: dict[Any, Layout] = {}
_META_READY: set[Any] = set()
_TABLES: dict[Any, sa.Table] = {}
_CACHE_LOCK = threading.Lock()


class JdbcSink(BatchSink):
    """Writes DataFrame rows into a PostgreSQL, SQLite or MySQL/MariaDB table, exactly once.

    - **Writes**: each batch's rows into ``table``, by ``mode``: ``append``; ``upsert`` on
      ``keys``; ``accumulate`` (``col = col + new`` for the ``accumulate`` columns, the
      non-idempotent increment of a word count); or ``sql`` (your statement, once per row).
    - **Guarantee**: exactly-once per ``(sink_id, batch_id)``: a batch's rows and the
      advance of ``eo_sink_commits.batch_id`` commit in one database transaction, and a
      batch id at or below the committed one is a no-op. It holds when ``sink_id`` is stable
      across restarts and unique per target, the batch ids are stable on replay (Spark's
      ``batchId``, or a ``KafkaWindows`` window id) and increase, and nothing else writes
      the sink's commit row or staging table.
    - **Parallelism**: one staging transaction per Spark task (writer partition) into the
      staging table ``eo_stage_<sink_id>`` (UNLOGGED, filled with COPY on PostgreSQL); then
      one commit transaction per batch on the driver. In ``foreachBatch`` a small batch
      (``smallBatchRows``) skips the staging transactions: its rows go to the driver and are
      written in the commit transaction alone.

    Commit protocol of one batch ``B`` (driver; mirrored by ``# 1.``... in ``_commit_once``):

    1. ``SELECT batch_id FROM eo_sink_commits WHERE sink_id = ... FOR UPDATE``. If it is
       ``>= B``, this is a replay: delete the staged rows of ``<= B`` and return.
    2. Driver-side (inline) rows: append writes them straight into the target, the other
       modes stage them, all inside this transaction.
    3. Check that the staging table holds exactly the rows each winning attempt reported.
    4. Apply the winning attempts' rows to the target, set-based (``INSERT ... SELECT``).
       PostgreSQL append stages binary COPY blocks instead: check each attempt's row and
       block counts, then stream its blocks into one ``COPY target FROM STDIN``.
    5. Move the commit row to ``B``.
    6. Delete staged rows of batches ``<= B`` (losing attempts, orphans of crashed runs).
    7. COMMIT. Failpoints: ``jdbc.after_stage`` (task), ``jdbc.before_commit``,
       ``jdbc.after_commit`` (after the database commit, before Spark's commit log).
    """

    family = "jdbc"

    def __init__(
        self,
        url: str,
        table: str | None = None,
        sink_id: str | None = None,
        *,
        mode: str = "append",
        keys: Sequence[str] | str | None = None,
        accumulate: Sequence[str] | str | None = None,
        statement: str | None = None,
        create_table: bool = False,
        batch_size: int = 10_000,
        retry_deadline: float = 30.0,
        isolation_level: str | None = None,
        metadata_table: str = DEFAULT_NAME,
        staging_table: str | None = None,
        small_batch_rows: int = 10_000,
        stage_blocks: bool = True,
    ) -> None:
        raw = stringify_options({
            "url": url,
            "table": table,
            "sink_id": sink_id,
            "mode": mode,
            "keys": _csv(keys),
            "accumulate": _csv(accumulate),
            "statement": statement,
            "createTable": create_table,
            "batchSize": batch_size,
            "retryDeadline": retry_deadline,
            "isolationLevel": isolation_level,
            "metadataTable": metadata_table,
            "stagingTable": staging_table,
            "smallBatchRows": small_batch_rows,
            "stageBlocks": stage_blocks,
        })
        self._init(JdbcSinkOptions.from_options(raw))

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: pa.Schema | None = None) -> JdbcSink:
        """Build from Spark's (case-insensitive) option map, e.g. ``createTable=true``."""
        sink = cls.__new__(cls)
        sink._init(JdbcSinkOptions.from_options(options))
        return sink

    def _init(self, options: JdbcSinkOptions) -> None:
        self.options = options
        self._layout: Layout | None = None
        self._inline_limit: int | None = None
        self._dialect: Dialect | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dialect"] = None
        return state

    def __repr__(self) -> str:
        o = self.options
        return (f"JdbcSink(url={o.redacted_url!r}, table={o.qualified_table!r}, "
                f"sink_id={o.sink_id!r}, mode={o.mode!r})")

    # -- runtime helpers ------------------------------------------------------------------
    @property
    def dialect(self) -> Dialect:
        if self._dialect is None:
            self._dialect = dialect_for(sa.engine.make_url(self.options.url),
                                        self.options.retry_deadline)
        return self._dialect

    @property
    def commits(self) -> CommitsTable:
        return CommitsTable(self.options.metadata_table, self.options.metadata_schema)

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn``; retry transient database errors with backoff until the deadline."""
        deadline = time.monotonic() + self.options.retry_deadline
        delay = 0.1
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except ConnectorError:
                raise
            except Exception as e:
                transient = self.dialect.is_transient(e)
                if not transient or time.monotonic() + delay > deadline:
                    raise self._wrap(what, e, gave_up=transient, attempts=attempt) from e
                log.warning("eo_jdbc sink %s: %s failed (attempt %d, transient: %s); retrying "
                            "in %.1fs", self.options.sink_id, what, attempt,
                            self.dialect.describe(e), delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _wrap(self, what: str, e: Exception, gave_up: bool = False,
              attempts: int = 1) -> JdbcSinkError:
        o = self.options
        column = self.dialect.column_of(e)
        where = f"table {o.qualified_table!r}"
        if column:
            spec = self._spec_for(column)
            typ = f" ({spec.sql_type}, DataFrame type {spec.arrow_type})" if spec else ""
            where += f", column {column!r}{typ}"
        retry = (f" (transient; gave up after {attempts} attempts within retryDeadline="
                 f"{o.retry_deadline:g}s)" if gave_up else "")
        return JdbcSinkError(
            f"eo_jdbc sink {o.sink_id!r}: {what} failed on {where} at {o.redacted_url}: "
            f"{self.dialect.describe(e)}{retry}"
        )

    def _spec_for(self, column: str) -> ColumnSpec | None:
        if self._layout is None:
            return None
        for spec in self._layout.columns:
            if column in (spec.name, spec.column):
                return spec
        return None

    def _connect(self, isolation: bool = False) -> sa.Connection:
        conn = self.dialect.engine().connect()
        if isolation:
            opts = self.dialect.isolation(self.options.isolation_level)
            if opts:
                conn = conn.execution_options(**opts)
        return conn

    def _target(self, conn: sa.Connection) -> sa.Table:
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

    def _target_names(self) -> sa.Table:
        """The target by column names only: enough to build statements, and it spares a
        reflection in a fresh Python process (Spark may run the commit in one)."""
        o = self.options
        cols = [sa.Column(c.column, sa.types.NullType()) for c in self._require_layout().columns]
        return sa.Table(o.table or "", sa.MetaData(), *cols, schema=o.table_schema)

    def _stage(self, conn: sa.Connection | None, typed: bool) -> sa.Table:
        """The staging table object. Only SQLAlchemy's bind processing needs real types
        (SQLite dates...), so PostgreSQL (COPY) and statement building use names alone."""
        o = self.options
        layout = self._require_layout()
        if typed and conn is not None:
            key = ("stage", o.url, o.staging_schema, o.staging_table, tuple(layout.names))
            with _CACHE_LOCK:
                cached = _TABLES.get(key)
            if cached is None:
                cached = sa.Table(o.staging_table, sa.MetaData(), schema=o.staging_schema,
                                  autoload_with=conn)
                with _CACHE_LOCK:
                    _TABLES[key] = cached
            return cached
        return self.dialect.stage_table(o.staging_table, o.staging_schema,
                                        [(c.column, sa.types.NullType()) for c in layout.columns])

    def _blocks(self) -> sa.Table:
        return sa.Table(self.options.blocks_table, sa.MetaData(),
                        schema=self.options.staging_schema)

    def _require_layout(self) -> Layout:
        if self._layout is None:
            raise ConnectorError(
                "eo_jdbc: the sink was used before check_schema() prepared it; this is a bug "
                "in the caller (the Spark adapter calls it on the driver before any task)"
            )
        return self._layout

    # -- driver-side preparation ----------------------------------------------------------
    def _ensure_metadata(self) -> None:
        o = self.options
        key = (o.url, o.metadata_schema, o.metadata_table, o.sink_id)
        if key in _META_READY:
            return

        def work() -> None:
            with self._connect() as conn, conn.begin():
                self.commits.create(conn)
                self.commits.register(conn, o.sink_id)

        self._retrying(f"preparing metadata table {self.commits.qualified!r}", work)
        _META_READY.add(key)

    def check_schema(self, schema: pa.Schema) -> None:
        """Driver, before any task: create/verify metadata, target and staging tables, and
        refuse a DataFrame column the table lacks or a type it cannot take."""
        o = self.options
        key = (o, schema.to_string(show_field_metadata=False, show_schema_metadata=False))
        with _CACHE_LOCK:
            layout = _PREPARED.get(key)
        if layout is None:
            self._ensure_metadata()
            layout = self._retrying("preparing tables", lambda: self._prepare(schema))
            with _CACHE_LOCK:
                _PREPARED[key] = layout
        self._layout = layout

    def _prepare(self, schema: pa.Schema) -> Layout:
        o = self.options
        with self._connect() as conn, conn.begin():
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
                target = self._target(conn)
            specs = self._column_specs(conn, schema, target)
            if target is not None and o.mode in ("upsert", "accumulate"):
                self._check_keys(insp, target, specs)
            if o.mode == "sql":
                self._check_statement(schema)
            self._ensure_stage(conn, insp, target, specs, schema)
            stage_types, target_types = self._column_types(conn, target, specs)
            blocks = (o.mode == "append" and o.stage_blocks and self.dialect.name == "postgresql"
                      and target_types is not None and pgbinary.kinds_for(
                          schema, [s.name for s in specs], target_types) is not None)
            if blocks and not insp.has_table(o.blocks_table, schema=o.staging_schema):
                self.dialect.create_blocks(  # type: ignore[attr-defined]
                    conn, self._blocks())
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
        keys = set(o.keys)
        cols = [
            sa.Column(f.name, arrow_to_sql_type(f.type, self.dialect.name, f.name in keys),
                      primary_key=f.name in keys, nullable=f.name not in keys)
            for f in schema
        ]
        missing = [k for k in o.keys if k not in schema.names]
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

    def _check_keys(self, insp: Any, target: sa.Table, specs: list[ColumnSpec]) -> None:
        o = self.options
        names = {s.name: s for s in specs}
        for what, cols in (("keys", o.keys), ("accumulate", o.accumulate)):
            missing = [c for c in cols if c not in names]
            if missing:
                raise OptionError(
                    f"eo_jdbc: option '{what}' names {missing}, which are not DataFrame "
                    f"columns {list(names)}; list columns the DataFrame has", option=what)
        for a in o.accumulate:
            if names[a].category not in ("int", "float", "decimal"):
                raise OptionError(
                    f"eo_jdbc: option 'accumulate' names column {a!r} of table "
                    f"{o.qualified_table!r}, type {names[a].sql_type}: only numeric columns "
                    "can be added to", option="accumulate")
        wanted = {names[k].column for k in o.keys}
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
                f"eo_jdbc sink {o.sink_id!r}: mode {o.mode!r} needs a primary key or unique "
                f"index on exactly the keys {sorted(wanted)} of table {o.qualified_table!r} "
                "(ON CONFLICT / ON DUPLICATE KEY matches on it); add one, or create the table "
                "with createTable=true"
            )

    def _check_statement(self, schema: pa.Schema) -> None:
        o = self.options
        params = sorted(sa.text(o.statement or "").compile().params)
        missing = [p for p in params if p not in schema.names]
        if missing:
            raise JdbcSinkError(
                f"eo_jdbc sink {o.sink_id!r}: the statement's parameters {missing} are not "
                f"DataFrame columns {schema.names}; name each :param after a column"
            )

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
                return
            log.info("eo_jdbc sink %s: recreating staging table %s (columns changed)",
                     o.sink_id, o.staging_table)
            wanted.drop(conn)
        d.create_stage(conn, wanted, target)
        with _CACHE_LOCK:
            for key in [k for k in _TABLES if k[0] == "stage" and k[3] == o.staging_table]:
                del _TABLES[key]

    # -- the protocol ---------------------------------------------------------------------
    def last_committed(self) -> int | None:
        self._ensure_metadata()

        def work() -> int | None:
            with self._connect() as conn:
                return self.commits.last_committed(conn, self.options.sink_id)

        return self._retrying("reading the last committed batch", work)

    def stage(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> Any:
        """Executor: write this task's rows into the staging table in one transaction."""
        layout = self._require_layout()
        if self._inline_limit is not None:
            held: list[pa.RecordBatch] = []
            n = 0
            it = iter(batches)
            for b in it:
                held.append(b)
                n += b.num_rows
                if n > self._inline_limit:
                    batches = _chain(held, it)
                    break
            else:
                return InlineRows(task.writer_id, n, _to_ipc(held, layout))
        token = new_token()
        # Durability of this staging transaction is not what exactly-once rests on. On
        # PostgreSQL it writes only to an UNLOGGED table, so it writes no WAL but its commit
        # record, and the server already skips the WAL flush for such a transaction: it is
        # asynchronous whatever synchronous_commit says (measured: setting it off gains
        # nothing). A server crash before the batch commits therefore loses staged rows
        # (crash recovery also empties UNLOGGED tables); the commit then finds fewer rows
        # than the tasks reported (append: the INSERT's row count; other modes: the
        # per-attempt count in _verify_staged), fails the batch without touching the target,
        # and Spark replays it. A lost staging commit is a failed batch, never silent loss.
        tags = (task.batch_id, task.writer_id, token)
        kinds = None
        if layout.blocks and layout.target_types is not None:
            first, batches = first_rows(batches)
            if first is None:
                return StagedRows(task.writer_id, token, 0)
            # The schema the driver checked; a batch that differs stages rows instead.
            kinds = pgbinary.kinds_for(first.schema, layout.names, layout.target_types)
        conn = self._retrying("connecting to stage rows", self._connect)
        try:
            with conn.begin():
                if kinds is not None:
                    rows, n_blocks = self.dialect.write_blocks(  # type: ignore[attr-defined]
                        conn, self._blocks(), layout.columns, batches, tags,
                        self.options.qualified_table, kinds)
                else:
                    stage = self._stage(conn, typed=self.dialect.name != "postgresql")
                    rows = self.dialect.write_rows(
                        conn, stage, layout.columns, batches, tags, self.options.batch_size,
                        self.options.qualified_table, layout.stage_types)
                failpoints.hit("jdbc.before_stage_commit", task.batch_id)
        except ConnectorError:
            raise
        except Exception as e:
            raise self._wrap(f"staging batch {task.batch_id} (writer {task.writer_id})", e) from e
        finally:
            conn.close()
        failpoints.hit("jdbc.after_stage", task.batch_id)
        log.debug("eo_jdbc sink %s: staged %d rows of batch %d writer %d", self.options.sink_id,
                  rows, task.batch_id, task.writer_id)
        if kinds is not None:
            return StagedBlocks(task.writer_id, token, rows, n_blocks)
        return StagedRows(task.writer_id, token, rows)

    def commit(self, batch_id: int, messages: Sequence[Any]) -> None:
        """Driver: apply the batch in one transaction; a no-op for a committed batch."""
        self._require_layout()
        msgs = [m for m in messages if m is not None]
        writers = [m.writer_id for m in msgs]
        if len(writers) != len(set(writers)):
            raise JdbcSinkError(
                f"eo_jdbc sink {self.options.sink_id!r}: batch {batch_id} got two messages for "
                f"one writer partition ({sorted(writers)}); exactly one attempt per partition "
                "may win"
            )
        started = time.perf_counter()
        rows = self._retrying(f"committing batch {batch_id}",
                              lambda: self._commit_once(batch_id, msgs))
        if rows is None:
            log.info("eo_jdbc sink %s: batch %d was already committed; replay is a no-op",
                     self.options.sink_id, batch_id)
            return
        failpoints.hit("jdbc.after_commit", batch_id)
        log.info("eo_jdbc sink %s: committed batch %d (%d rows, %d writers) into %s in %.1f ms",
                 self.options.sink_id, batch_id, rows, len(msgs), self.options.qualified_table,
                 (time.perf_counter() - started) * 1000)

    def _commit_once(self, batch_id: int, msgs: Sequence[Any]) -> int | None:
        o = self.options
        d = self.dialect
        layout = self._require_layout()
        with self._connect(isolation=True) as conn, conn.begin():
            stage = self._stage(conn, typed=False)
            # 1.
            last = self.commits.lock(conn, o.sink_id)
            if last is not None and last >= batch_id:
                self._clear(conn, stage, batch_id, sum(m.rows for m in msgs))
                return None
            # 2.
            expected: dict[int, int] = {}
            direct = 0
            inline = [m for m in msgs if isinstance(m, InlineRows) and m.rows > 0]
            if inline and o.mode == "append":
                # Appended rows need no set-based step: COPY/insert them into the target
                # right here, inside the same transaction.
                target = (self._target_names() if d.name == "postgresql"
                          else self._target(conn))
                for m in inline:
                    direct += d.write_rows(conn, target, layout.columns, m.batches(), None,
                                           o.batch_size, o.qualified_table,
                                           layout.target_types)
            elif inline:
                typed = self._stage(conn, typed=d.name != "postgresql")
                for m in inline:
                    token = new_token()
                    expected[token] = d.write_rows(
                        conn, typed, layout.columns, m.batches(), (batch_id, m.writer_id, token),
                        o.batch_size, o.qualified_table, layout.stage_types)
            for m in msgs:
                if isinstance(m, StagedRows) and m.rows > 0:
                    expected[m.token] = m.rows
            blocks = {m.token: (m.rows, m.blocks) for m in sorted(msgs, key=lambda m: m.writer_id)
                      if isinstance(m, StagedBlocks) and m.rows > 0}
            if blocks:
                # 3. + 4. for PostgreSQL append: COPY the attempts' blocks into the target.
                direct += self._apply_blocks(conn, batch_id, blocks)
            staged_total = sum(expected.values())
            total = staged_total + direct
            if expected:
                where = sa.and_(stage.c.eo_batch == batch_id,
                                stage.c.eo_attempt.in_(list(expected)))
                # 3. (append checks the INSERT's row count instead: one scan less)
                if o.mode != "append":
                    self._verify_staged(conn, stage, batch_id, expected)
                # 4.
                if o.mode == "sql":
                    self._apply_statement(conn, stage, where, layout)
                else:
                    applied = d.apply(conn, o.mode, self._target_names(), stage,
                                      [c.column for c in layout.columns],
                                      [self._col(k) for k in o.keys],
                                      [self._col(a) for a in o.accumulate], where)
                    if o.mode == "append" and applied is None:
                        self._verify_staged(conn, stage, batch_id, expected)
                    elif o.mode == "append" and applied != staged_total:
                        self._verify_staged(conn, stage, batch_id, expected)
                        raise JdbcSinkError(
                            f"eo_jdbc sink {o.sink_id!r}: batch {batch_id}: applied {applied} "
                            f"staged rows, the tasks reported {staged_total}; nothing was "
                            "committed")
            # 5.
            self.commits.record(conn, o.sink_id, batch_id, total)
            # 6.
            self._clear(conn, stage, batch_id, sum(rows for rows, _ in blocks.values()))
            failpoints.hit("jdbc.before_commit", batch_id)
        # 7. (the context manager committed)
        return total

    def _col(self, name: str) -> str:
        spec = self._spec_for(name)
        return spec.column if spec else name

    def _verify_staged(self, conn: sa.Connection, stage: sa.Table, batch_id: int,
                       expected: dict[int, int]) -> None:
        """The staging table must hold exactly what each winning attempt reported: a
        mismatch means staged rows were lost (or a second writer uses this sink_id), and
        committing anyway would drop or double rows silently."""
        counts: dict[int, int] = dict(conn.execute(  # type: ignore[arg-type]
            sa.select(stage.c.eo_attempt, sa.func.count())
            .where(stage.c.eo_batch == batch_id, stage.c.eo_attempt.in_(list(expected)))
            .group_by(stage.c.eo_attempt)
        ).all())
        self._check_staged(batch_id, self.options.staging_table, expected, counts)

    def _check_staged(self, batch_id: int, table: str, expected: dict[int, Any],
                      counts: dict[int, Any]) -> None:
        bad = {t: (n, counts.get(t, 0)) for t, n in expected.items() if counts.get(t, 0) != n}
        if bad:
            raise JdbcSinkError(
                f"eo_jdbc sink {self.options.sink_id!r}: batch {batch_id}: staging table "
                f"{table!r} does not hold the rows the tasks reported "
                f"(attempt: (reported, found) = {bad}); is another query using the same "
                "sink_id? Nothing was committed"
            )

    def _apply_blocks(self, conn: sa.Connection, batch_id: int,
                      expected: dict[int, tuple[int, int]]) -> int:
        """Check the staged (rows, blocks) of each attempt, then COPY the blocks into the
        target inside the commit transaction; the server must report exactly the rows the
        tasks staged."""
        d: Any = self.dialect
        blocks = self._blocks()
        counts = d.block_counts(conn, blocks, batch_id, list(expected))
        self._check_staged(batch_id, self.options.blocks_table, expected, counts)
        with self._connect() as reader:  # closed (locks released) before step 6's TRUNCATE
            copied = d.copy_blocks(conn, reader, self._target_names(),
                                   self._require_layout().columns, blocks, batch_id,
                                   list(expected))
        staged = sum(rows for rows, _ in expected.values())
        if copied != staged:
            raise JdbcSinkError(
                f"eo_jdbc sink {self.options.sink_id!r}: batch {batch_id}: COPY into "
                f"{self.options.qualified_table!r} took {copied} rows, the tasks staged "
                f"{staged}; nothing was committed")
        return copied

    def _clear(self, conn: sa.Connection, stage: sa.Table, batch_id: int,
               block_rows: int = 0) -> None:
        self.dialect.clear_stage(conn, stage, batch_id)
        if self._require_layout().blocks:
            self.dialect.clear_blocks(  # type: ignore[attr-defined]
                conn, self._blocks(), batch_id, block_rows)

    def _apply_statement(self, conn: sa.Connection, stage: sa.Table, where: Any,
                         layout: Layout) -> None:
        stmt = sa.text(self.options.statement or "")
        names = [c.name for c in layout.columns]
        result = conn.execute(sa.select(*[stage.c[c.column] for c in layout.columns])
                              .where(where).order_by(stage.c.eo_writer))
        while True:
            chunk = result.fetchmany(self.options.batch_size)
            if not chunk:
                break
            conn.execute(stmt, [dict(zip(names, r, strict=True)) for r in chunk])

    def abort(self, batch_id: int, messages: Sequence[Any | None]) -> None:
        """Delete this batch's staged rows. Best effort: whatever is left is an orphan that
        the next commit removes, so a failing cleanup must not hide the original error."""
        o = self.options
        try:
            with self._connect() as conn, conn.begin():
                stage = sa.Table(o.staging_table, sa.MetaData(),
                                 sa.Column("eo_batch", sa.BigInteger), schema=o.staging_schema)
                insp = sa.inspect(conn)
                if insp.has_table(o.staging_table, schema=o.staging_schema):
                    conn.execute(stage.delete().where(stage.c.eo_batch == batch_id))
                if insp.has_table(o.blocks_table, schema=o.staging_schema):
                    blocks = sa.Table(o.blocks_table, sa.MetaData(),
                                      sa.Column("eo_batch", sa.BigInteger),
                                      schema=o.staging_schema)
                    conn.execute(blocks.delete().where(blocks.c.eo_batch == batch_id))
        except Exception as e:  # noqa: BLE001 - see docstring
            log.warning("eo_jdbc sink %s: could not remove staged rows of aborted batch %d "
                        "(the next commit removes them): %s", o.sink_id, batch_id,
                        self.dialect.describe(e))

    # -- foreachBatch ---------------------------------------------------------------------
    def write(self, df: Any, batch_id: int) -> None:
        """Write ``df`` as batch ``batch_id`` exactly once (``foreachBatch`` and batch jobs).

        One pass over ``df``: each task holds up to ``smallBatchRows / partitions`` rows.
        A partition that fits is sent to the driver (Arrow IPC) and written by the commit
        transaction itself; a larger one is staged by its task. A small batch therefore
        costs exactly one database transaction, and a large one is never collected on the
        driver and never computed twice.
        """
        sink: JdbcSink = self
        limit = self.options.small_batch_rows
        if limit > 0:
            sink = copy.copy(self)
            sink._inline_limit = max(1, limit // _planned_partitions(df))
        BatchSink.write(sink, df, batch_id)
        self._layout = sink._layout


def _planned_partitions(df: Any) -> int:
    """The number of partitions ``df`` will have, without running it.

    Under adaptive execution ``df.rdd.getNumPartitions()`` *executes* the shuffle stages
    (measured: it ran a job), and the adaptive plan's own partitioning is unknown until
    then; the plan AQE starts from gives an upper bound (AQE only coalesces), which is what
    keeps the driver's share of a batch under ``smallBatchRows``.
    """
    try:
        plan = df._jdf.queryExecution().executedPlan()
        if plan.nodeName() == "AdaptiveSparkPlan":
            plan = plan.inputPlan()
        n = int(plan.outputPartitioning().numPartitions())
        if n >= 1:
            return n
    except Exception:  # noqa: BLE001 - Spark Connect or an unexpected plan: be conservative
        log.debug("could not read the planned partition count", exc_info=True)
    session = df.sparkSession
    return max(1, int(session.conf.get("spark.sql.shuffle.partitions", "200")),
               session.sparkContext.defaultParallelism)


def new_token() -> int:
    """An attempt token: random, 62 bits (a bigint column, cheaper to COPY than a uuid).
    It only tells attempts of one batch apart; it is never an identity across retries."""
    return uuid.uuid4().int >> 66


def _csv(value: Sequence[str] | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return ",".join(value)


def _chain(held: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from held
    yield from rest


def _to_ipc(batches: list[pa.RecordBatch], layout: Layout) -> bytes:
    buf = io.BytesIO()
    if not batches:
        return b""
    with pa.ipc.new_stream(buf, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return buf.getvalue()


def _type_text(t: Any, conn: sa.Connection) -> str:
    try:
        return str(t.compile(dialect=conn.dialect)).upper()
    except Exception:  # noqa: BLE001 - NullType and exotic types have no DDL form
        return type(t).__name__.upper()


def _same_columns(expected: list[tuple[str, str]], actual: list[tuple[str, str]]) -> bool:
    if [n for n, _ in expected] != [n for n, _ in actual]:
        return False
    # Reflection spells some types differently from DDL (INTEGER vs INT, TEXT vs VARCHAR on
    # SQLite, domains on PostgreSQL); compare where both sides are known.
    return all(e == a or "NULL" in e or "NULL" in a for (_, e), (_, a) in zip(expected, actual,
                                                                               strict=True))
