"""Options of the ``eo_jdbc`` sink: Spark's string options parsed once into a frozen spec."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any

from connectors.core.errors import OptionError
from connectors.core.options import (
    OptionReader,
    check_sink_id,
    redact_url,
    stringify_options,
)
from connectors.jdbc.dialects import normalize_url
from connectors.jdbc.metadata import DEFAULT_NAME
from connectors.jdbc.modes import WriteMode

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


@dataclass(frozen=True)
class JdbcSinkOptions:
    """Parsed options of one JDBC sink (a picklable spec; no connections)."""

    url: str = field(repr=False)
    sink_id: str
    #: ``mode`` with ``keys``, ``accumulate`` and ``statement``: chosen once, here
    write_mode: WriteMode
    table: str | None
    table_schema: str | None
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
        check_sink_id("eo_jdbc", sink_id)
        kind = WriteMode.kind(r)
        table_text = r.string("table")
        schema, table = (None, None)
        if table_text is not None:
            schema, table = parse_table_name(table_text, "table")
        elif kind.needs_table:
            raise r.error("table", "is required but was not set",
                          "name the target table (schema.table allowed)")
        write_mode = kind.from_reader(r)
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
            write_mode=write_mode,
            table=table,
            table_schema=schema,
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

    @classmethod
    def from_arguments(
        cls,
        url: str,
        table: str | None,
        sink_id: str | None,
        *,
        mode: str,
        keys: Sequence[str] | str | None,
        accumulate: Sequence[str] | str | None,
        statement: str | None,
        create_table: bool,
        batch_size: int,
        retry_deadline: float,
        isolation_level: str | None,
        metadata_table: str,
        staging_table: str | None,
        small_batch_rows: int,
        stage_blocks: bool,
    ) -> JdbcSinkOptions:
        """The Python API's arguments (``JdbcSink(...)``), checked like Spark's options."""
        return cls.from_options(stringify_options({
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
        }))


def _csv(value: Sequence[str] | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return ",".join(value)
