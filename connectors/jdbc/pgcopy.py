"""PostgreSQL's ``COPY ... FROM STDIN`` for the JDBC sink, on psycopg 3 connections.

``PostgresDialect`` writes through these functions; they know PostgreSQL, not the protocol:

- ``copy_rows``: Arrow batches into a table (the staging table, tagged; or a target), in
  binary format (``pgbinary``) when every column's type allows it, else CSV rendered by
  Arrow's C++ writer;
- blocks (append): a task stages its rows as binary COPY data in a few large ``bytea``
  blocks (``eo_stage_<sink>_blocks``), and the commit streams them into one
  ``COPY target FROM STDIN``. The server parses each row once, at commit, and COPY inserts
  page by page: half the WAL of ``INSERT ... SELECT`` and no row-by-row staging.

Identifiers are quoted by ``psycopg.sql``; no SQL text is built from option strings.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from connectors.jdbc import pgbinary
from connectors.jdbc.columns import TAG_COLUMNS, ColumnSpec, check_values, first_rows

#: the tags of a staged row: (batch, writer, attempt token)
Tags = tuple[int, int, int]


def raw(conn: sa.Connection) -> Any:
    """The psycopg connection under a SQLAlchemy connection."""
    return conn.connection.driver_connection


def ident(table: sa.Table) -> Any:
    from psycopg import sql

    return sql.Identifier(table.schema, table.name) if table.schema else sql.Identifier(table.name)


def copy_statement(table: sa.Table, specs: Sequence[ColumnSpec], tagged: bool, fmt: str) -> Any:
    from psycopg import sql

    names = [*(TAG_COLUMNS if tagged else ()), *[s.column for s in specs]]
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
        ident(table), sql.SQL(", ").join(sql.Identifier(n) for n in names), sql.SQL(fmt))


def column_types(conn: sa.Connection, table: sa.Table, names: Sequence[str],
                 ) -> tuple[int, ...] | None:
    """pg_type OIDs of ``names`` in ``table``; None when a column is missing."""
    from psycopg import sql

    pg = raw(conn)
    rows = pg.execute(
        sql.SQL("SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = "
                "{}::regclass AND attnum > 0 AND NOT attisdropped").format(
            sql.Literal(ident(table).as_string(pg))),
    ).fetchall()
    by_name = {str(n): int(oid) for n, oid in rows}
    if any(n not in by_name for n in names):
        return None
    return tuple(by_name[n] for n in names)


def _persistence(logged: bool) -> Any:
    from psycopg import sql

    return sql.SQL("" if logged else "UNLOGGED ")


def create_stage_like(conn: sa.Connection, stage: sa.Table, target: sa.Table,
                      logged: bool) -> None:
    """``CREATE [UNLOGGED] TABLE stage AS SELECT <tags>, <columns> FROM target WITH NO
    DATA``: the target's exact column types (domains, enums, varchar(n), numeric(p,s))
    without ever spelling a type name ourselves."""
    from psycopg import sql

    data = [c.name for c in stage.columns if c.name not in TAG_COLUMNS]
    raw(conn).execute(sql.SQL(
        "CREATE {unlogged}TABLE {stage} AS SELECT CAST(NULL AS bigint) AS eo_batch, "
        "CAST(NULL AS integer) AS eo_writer, CAST(NULL AS bigint) AS eo_attempt, "
        "{cols} FROM {target} WITH NO DATA"
    ).format(
        unlogged=_persistence(logged),
        stage=ident(stage),
        cols=sql.SQL(", ").join(sql.Identifier(c) for c in data),
        target=ident(target),
    ))


def create_scratch(conn: sa.Connection, name: str, stage: sa.Table) -> None:
    """A session's temporary copy of ``stage``'s columns, emptied at every commit."""
    from psycopg import sql

    raw(conn).execute(sql.SQL(
        "CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {}) ON COMMIT DELETE ROWS").format(
        sql.Identifier(name), ident(stage)))


# -- rows -------------------------------------------------------------------------------------
def copy_rows(conn: sa.Connection, table: sa.Table, specs: Sequence[ColumnSpec],
              batches: Iterable[pa.RecordBatch], tags: Tags | None, batch_size: int,
              name: str, types: Sequence[int] | None,
              prepare: Callable[[pa.RecordBatch, Sequence[ColumnSpec]], pa.RecordBatch]) -> int:
    """COPY ``batches`` into ``table``, tagged with ``tags`` (or untagged into a target).

    Binary format when ``types`` (the pg_type OIDs of the columns) are all ones whose binary
    form ``pgbinary`` renders exactly; else CSV rendered by Arrow's C++ writer from the rows
    ``prepare`` converted. Arrow quotes every string (``quoting_style="needed"``), so an
    empty string is ``""`` and a null is an empty unquoted field, exactly PostgreSQL's CSV
    convention. Returns the rows written.
    """
    first, rest = first_rows(batches)
    if first is None:
        return 0
    kinds = None
    if types is not None:
        kinds = pgbinary.kinds_for(first.schema, [s.name for s in specs], types)
    if kinds is None:
        return _copy_csv(conn, table, specs, rest, tags, batch_size, name, prepare)
    return _copy_binary(conn, table, specs, rest, tags, name, kinds)


def _copy_binary(conn: sa.Connection, table: sa.Table, specs: Sequence[ColumnSpec],
                 batches: Iterable[pa.RecordBatch], tags: Tags | None, name: str,
                 kinds: list[str]) -> int:
    tag_fields = [] if tags is None else [(">i8", tags[0]), (">i4", tags[1]),
                                          (">i8", tags[2])]
    total = 0
    stmt = copy_statement(table, specs, tags is not None, "binary")
    with raw(conn).cursor() as cur, cur.copy(stmt) as copy:
        copy.write(pgbinary.HEADER)
        for n, buffers in binary_batches(batches, specs, name, kinds, tag_fields):
            for buf in buffers:
                copy.write(buf)
            total += n
        copy.write(pgbinary.TRAILER)
    return total


def _copy_csv(conn: sa.Connection, table: sa.Table, specs: Sequence[ColumnSpec],
              batches: Iterable[pa.RecordBatch], tags: Tags | None, batch_size: int, name: str,
              prepare: Callable[[pa.RecordBatch, Sequence[ColumnSpec]], pa.RecordBatch]) -> int:
    from pyarrow import csv as pacsv

    names = [*(TAG_COLUMNS if tags else ()), *[s.column for s in specs]]
    stmt = copy_statement(table, specs, tags is not None, "csv")
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed",
                                 batch_size=max(1024, batch_size))
    total = 0
    with raw(conn).cursor() as cur, cur.copy(stmt) as copy:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            check_values(name, batch, specs)
            data = prepare(batch, specs)
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


def binary_batches(batches: Iterable[pa.RecordBatch], specs: Sequence[ColumnSpec], name: str,
                   kinds: list[str], tags: Sequence[tuple[str, int]] = (),
                   ) -> Iterator[tuple[int, list[pa.Buffer | bytes]]]:
    """``(rows, buffers)`` per non-empty batch: its values checked against ``specs``, then
    rendered as binary COPY tuples (without header/trailer)."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        check_values(name, batch, specs)
        columns = [batch.column(s.name) for s in specs]
        yield batch.num_rows, pgbinary.encode(columns, kinds, tags)


# -- blocks -----------------------------------------------------------------------------------
def create_blocks(conn: sa.Connection, blocks: sa.Table, logged: bool) -> None:
    """The block table: one row per block of an attempt's binary COPY stream. EXTERNAL
    storage keeps PostgreSQL from compressing the blocks (they are read once)."""
    from psycopg import sql

    pg, name = raw(conn), ident(blocks)
    pg.execute(sql.SQL(
        "CREATE {}TABLE IF NOT EXISTS {} (eo_batch bigint NOT NULL, eo_writer integer "
        "NOT NULL, eo_attempt bigint NOT NULL, eo_seq integer NOT NULL, eo_rows bigint NOT "
        "NULL, eo_data bytea NOT NULL)").format(_persistence(logged), name))
    pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN eo_data SET STORAGE EXTERNAL").format(name))


def write_blocks(conn: sa.Connection, blocks: sa.Table, specs: Sequence[ColumnSpec],
                 batches: Iterable[pa.RecordBatch], tags: Tags, name: str, kinds: list[str],
                 block_bytes: int) -> tuple[int, int]:
    """Stage ``batches`` as the binary COPY tuples of the target's columns, cut into
    blocks of ``block_bytes`` (a cut may fall inside a tuple: the commit concatenates an
    attempt's blocks in ``eo_seq`` order). ``eo_rows`` counts the rows completed in each
    block; their sum is the attempt's row count. Returns ``(rows, blocks)``."""
    from psycopg import sql

    stmt = sql.SQL(
        "COPY {} (eo_batch, eo_writer, eo_attempt, eo_seq, eo_rows, eo_data) FROM STDIN "
        "(FORMAT binary)").format(ident(blocks))
    total = done = seq = 0
    block = bytearray()
    with raw(conn).cursor() as cur, cur.copy(stmt) as copy:
        copy.set_types(["int8", "int4", "int8", "int4", "int8", "bytea"])

        def put() -> None:
            nonlocal seq, done
            copy.write_row((*tags, seq, done, bytes(block)))
            seq, done = seq + 1, 0
            block.clear()

        for n, buffers in binary_batches(batches, specs, name, kinds):
            for piece in buffers:
                view = memoryview(piece)  # type: ignore[arg-type]
                while len(view):
                    take = block_bytes - len(block)
                    block += view[:take]
                    view = view[take:]
                    if len(block) >= block_bytes:
                        put()
            done += n
            total += n
        if block or done:
            put()
    return total, seq


def block_counts(conn: sa.Connection, blocks: sa.Table, batch_id: int,
                 attempts: Sequence[int]) -> dict[int, tuple[int, int]]:
    """``attempt -> (rows, blocks)`` staged for ``batch_id`` (reads no block data)."""
    from psycopg import sql

    rows = raw(conn).execute(sql.SQL(
        "SELECT eo_attempt, sum(eo_rows), count(DISTINCT eo_seq) FROM {} WHERE eo_batch = "
        "%s AND eo_attempt = ANY(%s) GROUP BY eo_attempt").format(ident(blocks)),
        (batch_id, list(attempts)))
    return {int(a): (int(n), int(k)) for a, n, k in rows.fetchall()}


def copy_blocks(conn: sa.Connection, reader: sa.Connection, target: sa.Table,
                specs: Sequence[ColumnSpec], blocks: sa.Table, batch_id: int,
                attempts: Sequence[int]) -> int:
    """``COPY target FROM STDIN`` on ``conn`` (the commit transaction), fed with the
    attempts' blocks in order, streamed one block at a time from ``reader`` (a second
    connection: ``conn`` is busy with the COPY). Returns the rows the server copied."""
    from psycopg import sql

    select = sql.SQL("SELECT eo_data FROM {} WHERE eo_batch = %s AND eo_attempt = %s "
                     "ORDER BY eo_seq").format(ident(blocks))
    with raw(conn).cursor() as cur:
        with cur.copy(copy_statement(target, specs, False, "binary")) as copy:
            copy.write(pgbinary.HEADER)
            for attempt in attempts:
                with raw(reader).cursor() as rcur:
                    for (data,) in rcur.stream(select, (batch_id, attempt)):
                        copy.write(data)
            copy.write(pgbinary.TRAILER)
        return int(cur.rowcount)


# -- two-phase commit (``connectors.jdbc.scopes.PreparedCommit``) ------------------------------
def prepare_transaction(conn: sa.Connection, txn: str) -> None:
    """``PREPARE TRANSACTION txn``: the open transaction becomes a prepared one, which
    survives this session and a server restart until ``COMMIT PREPARED``/``ROLLBACK
    PREPARED``. The session is then outside any transaction, so the COMMIT that ends the
    caller's block is a no-op (psycopg commits nothing on an idle session)."""
    from psycopg import sql

    raw(conn).execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(txn)))


def end_prepared(conn: sa.Connection, txn: str, commit: bool) -> bool:
    """``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` on an autocommit connection; False
    when ``txn`` is no longer prepared (ended by an earlier call whose answer was lost, or
    by another process)."""
    import psycopg
    from psycopg import sql

    verb = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
    try:
        raw(conn).execute(sql.SQL(verb).format(sql.Literal(txn)))
    except psycopg.errors.UndefinedObject:
        return False
    return True


def prepared_gids(conn: sa.Connection, prefix: str) -> list[str]:
    """The gids of this database's prepared transactions that start with ``prefix``."""
    rows = raw(conn).execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND left(gid, length(%s)) = %s ORDER BY prepared", (prefix, prefix))
    return [str(g) for (g,) in rows.fetchall()]


def max_prepared_transactions(conn: sa.Connection) -> int:
    row = raw(conn).execute("SHOW max_prepared_transactions").fetchone()
    return int(row[0]) if row else 0


def set_logged(conn: sa.Connection, table: sa.Table, logged: bool) -> None:
    """``ALTER TABLE ... SET LOGGED`` / ``SET UNLOGGED`` unless it is so already."""
    from psycopg import sql

    pg, name = raw(conn), ident(table)
    row = pg.execute("SELECT relpersistence FROM pg_class WHERE oid = to_regclass(%s)",
                     (name.as_string(pg),)).fetchone()
    if row is not None and (row[0] == "p") != logged:
        pg.execute(sql.SQL("ALTER TABLE {} SET {}").format(
            name, sql.SQL("LOGGED" if logged else "UNLOGGED")))


def delete_up_to(conn: sa.Connection, table: sa.Table, up_to_batch: int) -> None:
    from psycopg import sql

    raw(conn).execute(sql.SQL("DELETE FROM {} WHERE eo_batch <= %s").format(ident(table)),
                      (up_to_batch,))


def truncate_unless_empty(conn: sa.Connection, table: sa.Table) -> None:
    """TRUNCATE costs about 2 ms whatever the size (a new relfilenode); an empty table
    (a batch that staged nothing there) skips it for a one-row probe."""
    from psycopg import sql

    pg, name = raw(conn), ident(table)
    if pg.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(name)).fetchone() is not None:
        pg.execute(sql.SQL("TRUNCATE {}").format(name))
