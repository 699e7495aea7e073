"""Options of the ``eo_jdbc`` sink, declared once (:data:`JDBC_SINK_OPTIONS`): Spark's string
options and the Python API's arguments both become a frozen :class:`JdbcSinkOptions` through
it (docs/jdbc-sink.md shows the table it generates)."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from hashlib import sha256
from typing import ClassVar

from connectors.core.declared import (
    BOOLEAN,
    CHOICE,
    CSV_LIST,
    DURATION,
    INTEGER,
    STRING,
    Declared,
    Opt,
    Values,
    sink_id_option,
)
from connectors.core.errors import OptionError
from connectors.core.options import redact_url
from connectors.jdbc.dialects import normalize_url
from connectors.jdbc.metadata import DEFAULT_NAME, tasks_name
from connectors.jdbc.modes import MODES, Append, WriteMode

FAMILY = "eo_jdbc"

#: ``commitScope``: what one database transaction makes visible (docs/jdbc-sink.md, "Commit
#: scopes"); ``connectors.jdbc.scopes`` holds the types they choose.
COMMIT_SCOPES = ("batch", "task", "prepared")

# Spark's JDBC spellings -> SQLAlchemy's.
ISOLATION_LEVELS = {
    "READ_UNCOMMITTED": "READ UNCOMMITTED",
    "READ_COMMITTED": "READ COMMITTED",
    "REPEATABLE_READ": "REPEATABLE READ",
    "SERIALIZABLE": "SERIALIZABLE",
}
_IDENT = r'(?:"(?:[^"]|"")+"|[^."\s]+)'
_QUALIFIED = re.compile(rf"^\s*(?:({_IDENT})\.)?({_IDENT})\s*$")


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


#: The sink's options, declared once: ``JdbcSink(...)``'s arguments, the DataSource's options,
#: the unknown-option check and the table in docs/jdbc-sink.md all come from here.
JDBC_SINK_OPTIONS: tuple[Opt, ...] = (
    Opt("url", "url", STRING, required=True,
        hint="a SQLAlchemy URL such as postgresql+psycopg://user@host/db or sqlite:///path.db",
        help="A SQLAlchemy URL: `postgresql+psycopg://user:pw@host:5432/db`, "
        "`sqlite:///path/to.db`, `mysql+pymysql://user@host:3306/db`. `postgresql://` and "
        "`mysql://` pick psycopg and pymysql. A `jdbc:` prefix is accepted. The password never "
        "appears in logs or errors."),
    Opt("table", "table", STRING, shown_default="required (except mode `sql`)",
        help='The target table. `schema.table` and `"Quoted Schema"."Quoted Table"` work.'),
    sink_id_option(
        True, "The sink's identity in the commit table. It must be stable across restarts and "
        "unique per target. 1-128 characters from `A-Z a-z 0-9 . _ -`, not starting with `.`, "
        "no `..`.",
        hint="a stable name for this sink, unique per target table; it keys the commit table, "
        "so it must stay the same across restarts"),
    Opt("mode", "mode", CHOICE, Append.name, choices=tuple(MODES),
        help="`append`, `upsert`, `accumulate` or `sql`."),
    Opt("keys", "keys", CSV_LIST, (),
        help="Key columns (comma-separated, or a list in Python), for `upsert` and "
        "`accumulate`. The table needs a primary key or unique index on exactly these "
        "columns."),
    Opt("accumulate", "accumulate", CSV_LIST, (),
        help="Numeric columns to add to: `col = coalesce(col, 0) + coalesce(new, 0)`."),
    Opt("statement", "statement", STRING,
        help="Mode `sql`: your SQL with named parameters (`:word`, `:n`), each named after a "
        "DataFrame column. It runs once per row, inside the commit transaction."),
    Opt("createTable", "create_table", BOOLEAN, False,
        help="Create the target from the DataFrame schema if it is missing. The keys become "
        "the primary key."),
    Opt("batchSize", "batch_size", INTEGER, 10_000, minimum=1,
        help="Rows per `executemany` chunk (SQLite, MySQL, mode `sql`) and per COPY block."),
    Opt("connectTimeout", "connect_timeout", DURATION, 5.0, above=0,
        help="The bound on the first contact with a database this process has not reached "
        "yet: where nothing answers (a wrong host or port, a firewall), the sink fails in this "
        "time with an error naming the host and port, instead of waiting out `retryTimeout`. "
        "Any answer counts as reached, a refused password or a server still starting "
        "included. Tasks count the database reached: the driver's checks reached it first."),
    Opt("retryTimeout", "retry_timeout", DURATION, 120.0, minimum=0,
        deprecated=("retryDeadline",), deprecated_args=("retry_deadline",),
        help="The time budget of one step's retries: a task's staging transaction or the "
        "driver's commit transaction that fails on a transient error (a lost connection, the "
        "server restarting, a serialization failure, a deadlock, a lock timeout, a locked "
        "SQLite file) is run again, whole, until this long after its first failure. Sized for "
        "a failover (Patroni's 30 s TTL and its promotion, a managed database's 60-120 s) and "
        "a restart. Other errors fail at once."),
    Opt("maxRetries", "max_retries", INTEGER, 60, minimum=0,
        help="The count budget: one step is run again at most this many times (whichever "
        "budget runs out first ends the retries; with the default pauses 60 retries last "
        "about 5 minutes, so `retryTimeout` decides an outage). `0` never retries."),
    Opt("retryBackoff", "retry_backoff", DURATION, 0.1, above=0,
        help="The pause before the first retry; each next pause doubles, up to "
        "`retryBackoffMax`."),
    Opt("retryBackoffMax", "retry_backoff_max", DURATION, 5.0, above=0,
        help="The longest pause between two retries."),
    Opt("isolationLevel", "isolation_level", STRING, shown_default="database default",
        help="The commit transaction's level: `READ_UNCOMMITTED`, `READ_COMMITTED`, "
        "`REPEATABLE_READ`, `SERIALIZABLE`. `NONE` is refused, because it would mean no "
        "transaction."),
    Opt("metadataTable", "metadata_table", STRING, DEFAULT_NAME,
        help="The commit table's name. It may include a schema."),
    Opt("stagingTable", "staging_table", STRING, shown_default="`eo_stage_<sink_id>`",
        help="The staging table, in the target's schema."),
    Opt("smallBatchRows", "small_batch_rows", INTEGER, 10_000, minimum=0,
        help="foreachBatch only: a batch up to this size is written by the driver in one "
        "transaction. `0` always stages."),
    Opt("stageBlocks", "stage_blocks", BOOLEAN, True,
        help="PostgreSQL append: tasks stage binary COPY blocks and the commit COPYs them into "
        "the table (see Performance). `false` stages rows and commits with `INSERT ... "
        "SELECT` on the server, for a slow link between the Spark driver and the database."),
    Opt("commitScope", "commit_scope", CHOICE, "batch", choices=COMMIT_SCOPES,
        help="What one database transaction makes visible (see [Commit scopes](#commit-scopes)). "
        "`batch`: the whole batch at once, in the driver's commit transaction; the tasks stage "
        "their rows first, so every row is written twice. `task`: each task writes its rows "
        "straight into the table and commits them in its own transaction with a record of "
        "`(sink_id, batch, task)`, so a reader sees a batch arrive task by task (a batch that "
        "fails half-way stays half there until the restarted query writes the rest), each row "
        "is written once and the tasks write in parallel. `prepared` (PostgreSQL, mode "
        "`append`, `max_prepared_transactions` above 0): each task writes its rows straight "
        "into the table and PREPAREs its transaction; the driver records the batch, then "
        "commits the prepared transactions, so a failed batch shows nothing."),
    Opt("durableStaging", "durable_staging", BOOLEAN, True,
        help="PostgreSQL: the staging tables are ordinary (WAL-logged) tables, so staged rows "
        "survive a server crash between the tasks' staging and the driver's commit and the "
        "retry commits them. `false` makes them UNLOGGED: no WAL for staged rows (see "
        "Performance), but a crash, an immediate shutdown or a failover in that window "
        "empties them and the batch fails (the restarted query is exact). A change converts "
        "the existing staging tables when the query starts. Other databases' tables are "
        "always durable."),
)


@dataclass(frozen=True)
class JdbcSinkOptions(Declared):
    """Parsed options of one JDBC sink (a picklable spec; no connections)."""

    OPTIONS: ClassVar[tuple[Opt, ...]] = JDBC_SINK_OPTIONS
    FAMILY: ClassVar[str] = FAMILY

    url: str = field(repr=False)
    sink_id: str
    #: ``mode`` with ``keys``, ``accumulate`` and ``statement``: chosen once, here
    write_mode: WriteMode
    table: str | None
    table_schema: str | None
    create_table: bool = False
    batch_size: int = 10_000
    connect_timeout: float = 5.0
    retry_timeout: float = 120.0
    max_retries: int = 60
    retry_backoff: float = 0.1
    retry_backoff_max: float = 5.0
    isolation_level: str | None = None
    metadata_table: str = DEFAULT_NAME
    metadata_schema: str | None = None
    staging_table: str = ""
    staging_schema: str | None = None
    small_batch_rows: int = 10_000
    stage_blocks: bool = True
    commit_scope: str = "batch"
    durable_staging: bool = True

    # The option values as given, read from the write mode (which owns them).
    @property
    def mode(self) -> str:
        return self.write_mode.name

    @property
    def keys(self) -> tuple[str, ...]:
        return self.write_mode.keys

    @property
    def accumulate(self) -> tuple[str, ...]:
        return self.write_mode.columns

    @property
    def statement(self) -> str | None:
        return self.write_mode.statement

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
    def tasks_table(self) -> str:
        """``<commit table>_tasks``: the per-task records of commitScope task and prepared
        (``connectors.jdbc.metadata.TasksTable``), beside the commit table."""
        return tasks_name(self.metadata_table)

    @property
    def qualified_table(self) -> str:
        if self.table is None:
            return "(statement)"
        return f"{self.table_schema}.{self.table}" if self.table_schema else self.table

    @property
    def retry_deadline(self) -> float:
        """Deprecated: :attr:`retry_timeout`."""
        warnings.warn("JdbcSinkOptions.retry_deadline is deprecated; use retry_timeout",
                      DeprecationWarning, stacklevel=2)
        return self.retry_timeout

    @classmethod
    def _build(cls, v: Values) -> JdbcSinkOptions:
        """The checks across options, for ``JdbcSink(...)`` and the DataSource alike."""
        url = normalize_url(v["url"])
        kind = MODES[v["mode"]]
        schema, table = (None, None)
        if v["table"] is not None:
            schema, table = parse_table_name(v["table"], v.name("table"))
        elif kind.needs_table:
            raise v.error("table", "is required but was not set",
                          "name the target table (schema.table allowed)")
        if v["create_table"] and table is None:
            raise v.error("create_table", f"needs option '{v.name('table')}'",
                          "name the table to create")
        meta_schema, meta_name = parse_table_name(v["metadata_table"], v.name("metadata_table"))
        if v["staging_table"]:
            stage_schema, stage_name = parse_table_name(v["staging_table"],
                                                        v.name("staging_table"))
        else:
            stage_schema = schema if table else meta_schema
            stage_name = staging_name(v["sink_id"])
        if v["commit_scope"] == "prepared":
            if url.get_backend_name() != "postgresql":
                raise v.error("commit_scope", "'prepared' needs PostgreSQL (PREPARE TRANSACTION), "
                              f"not {url.get_backend_name()}", "commitScope=task or batch")
            if kind is not Append:
                raise v.error("commit_scope", f"'prepared' writes mode 'append' only, not "
                              f"'{kind.name}': prepared transactions keep their row locks until "
                              "the driver commits them, so two tasks updating one key would "
                              "wait for each other forever", "commitScope=task or batch")
        if v["retry_backoff_max"] < v["retry_backoff"]:
            raise v.error("retry_backoff_max",
                          f"({v['retry_backoff_max']:g}s) is below option "
                          f"'{v.name('retry_backoff')}' ({v['retry_backoff']:g}s)",
                          "a longest pause at least as long as the first one")
        return v.build(
            cls, used=("mode", "keys", "accumulate", "statement"),
            url=url.render_as_string(hide_password=False),
            write_mode=kind.from_values(v),
            table=table,
            table_schema=schema,
            isolation_level=_isolation_level(v),
            metadata_table=meta_name,
            metadata_schema=meta_schema,
            staging_table=stage_name,
            staging_schema=stage_schema,
        )


def _isolation_level(v: Values) -> str | None:
    """Spark's JDBC spelling (``READ_COMMITTED``, any case, spaces allowed) -> SQLAlchemy's."""
    given = v["isolation_level"]
    if given is None:
        return None
    key = given.strip().upper().replace(" ", "_")
    if key not in ISOLATION_LEVELS:
        why = (" (NONE would commit without a transaction, which breaks exactly-once)"
               if key == "NONE" else "")
        raise v.error("isolation_level", f"has invalid value {given!r}{why}",
                      f"valid values: {list(ISOLATION_LEVELS)}")
    return ISOLATION_LEVELS[key]
