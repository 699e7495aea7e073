"""File formats of the ``eo_files`` sink: parquet, JSON lines and CSV through pyarrow.

Writers stream Arrow record batches into a byte stream from
:meth:`connectors.core.storage.Storage.open_write`; they never collect a whole partition.
:class:`RollingWriter` splits one task's rows into Hive-style ``partitionBy`` directories and
rolls to a new file after ``maxRecordsPerFile`` rows or about ``maxBytesPerFile`` bytes.

This module knows nothing about batches, staging or commits: it writes *new* files through
a callback and reports what it wrote (:class:`WrittenFile`). ``connectors.files.sink``
decides where those files live and when they become visible.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.core.errors import FileSinkError, OptionError
from connectors.core.storage import CountingStream

FORMATS = ("parquet", "jsonl", "csv")

# Codec name (as users spell it) -> (pyarrow codec or None, file-name suffix).
PARQUET_CODECS: dict[str, str | None] = {
    "snappy": "snappy",
    "gzip": "gzip",
    "zstd": "zstd",
    "lz4": "lz4",
    "brotli": "brotli",
    "none": None,
    "uncompressed": None,
}
STREAM_CODECS: dict[str, tuple[str | None, str]] = {
    "none": (None, ""),
    "uncompressed": (None, ""),
    "gzip": ("gzip", ".gz"),
    "bz2": ("bz2", ".bz2"),
    "zstd": ("zstd", ".zst"),
    "lz4": ("lz4", ".lz4"),
}
DEFAULT_COMPRESSION = {"parquet": "snappy", "jsonl": "none", "csv": "none"}

#: Spark's name for a null (or empty string) partition value; pyarrow's Hive partitioning
#: reads it back as null.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# Characters Spark escapes in partition directory names (ExternalCatalogUtils.escapePathName),
# so our directories are the ones Spark itself would write and read.
_ESCAPED = frozenset(
    [chr(c) for c in range(0x01, 0x20)]
    + ['"', "#", "%", "'", "*", "/", ":", "=", "?", "\\", "\x7f", "{", "[", "]", "^"]
)

# Parquet: gather rows of one file into row groups of about this size before writing, so
# that files do not get one tiny row group per Arrow batch Spark sends (10,000 rows).
ROW_GROUP_ROWS = 1024 * 1024
ROW_GROUP_BYTES = 64 * 1024 * 1024
# Above this much buffered data across all open files of a task, flush everything.
TASK_BUFFER_BYTES = 256 * 1024 * 1024
STREAM_BUFFER = 1024 * 1024


@dataclass(frozen=True)
class FileFormat:
    """A parsed ``format`` + ``compression`` (+ CSV ``header``): picklable, no I/O."""

    name: str = "parquet"
    compression: str = "snappy"
    csv_header: bool = True

    @classmethod
    def parse(
        cls, name: str | None, compression: str | None, *, csv_header: bool = True
    ) -> FileFormat:
        fmt = (name or "parquet").strip().lower()
        if fmt == "json":  # Spark's name for the same line-delimited layout
            fmt = "jsonl"
        if fmt not in FORMATS:
            raise OptionError(
                f"eo_files: option 'format' has unsupported value {name!r}; "
                f"valid values: {list(FORMATS)}",
                option="format",
            )
        codec = (compression or DEFAULT_COMPRESSION[fmt]).strip().lower()
        valid = PARQUET_CODECS if fmt == "parquet" else STREAM_CODECS
        if codec not in valid:
            raise OptionError(
                f"eo_files: option 'compression' has value {compression!r}, which format "
                f"{fmt!r} does not support; valid values: {sorted(valid)}",
                option="compression",
            )
        if codec == "uncompressed":
            codec = "none"
        return cls(fmt, codec, csv_header)

    @property
    def extension(self) -> str:
        """``.parquet`` (any codec, as Spark's readers expect), ``.jsonl.gz``, ``.csv`` ..."""
        if self.name == "parquet":
            return ".parquet" if self.compression == "none" else f".{self.compression}.parquet"
        return f".{self.name}{STREAM_CODECS[self.compression][1]}"

    def check_schema(self, schema: pa.Schema) -> None:
        """Refuse column types this format cannot hold, before any task runs."""
        if self.name != "csv":
            return
        for f in schema:
            t = f.type
            if (
                pa.types.is_nested(t)
                or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)
                or pa.types.is_fixed_size_binary(t)
                or pa.types.is_dictionary(t)
            ):
                raise FileSinkError(
                    f"eo_files: column {f.name!r} has type {t}, which CSV cannot hold; "
                    "use format 'parquet' or 'jsonl', or cast/serialize the column "
                    "(e.g. to_json, base64) before the sink"
                )

    def open(self, stream: IO[bytes], schema: pa.Schema) -> FormatWriter:
        if self.name == "parquet":
            return ParquetWriter(stream, schema, PARQUET_CODECS[self.compression])
        codec = STREAM_CODECS[self.compression][0]
        if self.name == "csv":
            return CsvWriter(stream, schema, codec, self.csv_header)
        return JsonLinesWriter(stream, schema, codec)


class FormatWriter:
    """Writes Arrow data of one schema into one file."""

    def __init__(self, stream: IO[bytes], schema: pa.Schema) -> None:
        self.counter = CountingStream(stream)
        self.schema = schema
        self._out = pa.BufferedOutputStream(pa.PythonFile(self.counter, mode="w"), STREAM_BUFFER)

    def write(self, table: pa.Table) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._out.close()

    @property
    def bytes_written(self) -> int:
        """Bytes that reached the file so far (buffers excluded)."""
        return self.counter.position


class ParquetWriter(FormatWriter):
    def __init__(self, stream: IO[bytes], schema: pa.Schema, codec: str | None) -> None:
        super().__init__(stream, schema)
        import pyarrow.parquet as pq

        self._writer = pq.ParquetWriter(self._out, schema, compression=codec or "none")

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)

    def close(self) -> None:
        self._writer.close()
        super().close()


class _CompressedTextWriter(FormatWriter):
    def __init__(self, stream: IO[bytes], schema: pa.Schema, codec: str | None) -> None:
        super().__init__(stream, schema)
        self._text: Any = pa.CompressedOutputStream(self._out, codec) if codec else self._out

    def close(self) -> None:
        if self._text is not self._out:
            self._text.close()  # writes the codec's trailer, then closes the buffered stream
        else:
            super().close()


class CsvWriter(_CompressedTextWriter):
    def __init__(
        self, stream: IO[bytes], schema: pa.Schema, codec: str | None, header: bool
    ) -> None:
        super().__init__(stream, schema, codec)
        import pyarrow.csv as pcsv

        self._writer = pcsv.CSVWriter(
            self._text, schema, write_options=pcsv.WriteOptions(include_header=header)
        )

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()
        super().close()


def _json_default(value: Any) -> Any:
    # The same text forms Spark's JSON writer uses where JSON has no type of its own.
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


class JsonLinesWriter(_CompressedTextWriter):
    """One JSON object per line; binary as base64, timestamps as ISO-8601 (like Spark)."""

    def write(self, table: pa.Table) -> None:
        encode = json.JSONEncoder(
            default=_json_default, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode
        for batch in table.to_batches():
            rows = batch.to_pylist()
            if not rows:
                continue
            try:
                text = "\n".join(encode(_finite(r)) for r in rows) + "\n"
            except (TypeError, ValueError) as e:
                raise FileSinkError(f"eo_files: a row cannot be written as JSON: {e}") from e
            self._text.write(text.encode("utf-8"))


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN/Infinity; Spark writes them as strings, and so do we.
    for k, v in row.items():
        if isinstance(v, float) and not math.isfinite(v):
            row[k] = str(v).replace("inf", "Infinity").replace("nan", "NaN")
    return row


# -- partition directories ---------------------------------------------------------------
def escape_partition_value(value: Any) -> str:
    """A partition value as Spark writes it in a directory name (``col=<this>``)."""
    if value is None:
        return NULL_PARTITION
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, _dt.datetime):
        text = value.replace(tzinfo=None).isoformat(sep=" ")
    else:
        text = str(value)
    if text == "":
        return NULL_PARTITION
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


def partition_dir(columns: Sequence[str], values: Sequence[Any]) -> str:
    pairs = zip(columns, values, strict=True)
    return "/".join(f"{c}={escape_partition_value(v)}" for c, v in pairs)


def check_partition_columns(schema: pa.Schema, columns: Sequence[str]) -> None:
    names = schema.names
    for c in columns:
        if c not in names:
            raise OptionError(
                f"eo_files: option 'partitionBy' names column {c!r}, which is not in the "
                f"input; valid columns: {names}",
                option="partitionBy",
            )
        t = schema.field(c).type
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise OptionError(
                f"eo_files: option 'partitionBy' names column {c!r} of type {t}, which cannot "
                "be a directory name; use a string, number, boolean, date or timestamp column",
                option="partitionBy",
            )
    if columns and len(set(columns)) == len(names):
        raise OptionError(
            "eo_files: option 'partitionBy' names every column; at least one column must "
            "stay in the data files",
            option="partitionBy",
        )


def split_by_partition(
    batch: pa.RecordBatch, columns: Sequence[str]
) -> Iterator[tuple[tuple[Any, ...], pa.Table]]:
    """Yield ``(partition values, rows without the partition columns)`` per distinct value."""
    table = pa.Table.from_batches([batch])
    data = table.drop_columns(list(columns))
    if len(columns) == 1:
        col = table.column(columns[0])
        uniques = pc.unique(col)
        if len(uniques) == 1:
            yield (uniques[0].as_py(),), data
            return
    indexed = table.select(list(columns)).append_column(
        "__eo_row", pa.array(range(table.num_rows), pa.int64())
    )
    groups = indexed.group_by(list(columns), use_threads=False).aggregate([("__eo_row", "list")])
    keys = [groups.column(c).to_pylist() for c in columns]
    rows = groups.column("__eo_row_list")
    for i in range(groups.num_rows):
        yield tuple(k[i] for k in keys), data.take(rows[i].values)


# -- rolling writer ------------------------------------------------------------------------
@dataclass
class WrittenFile:
    """One file a task wrote: its name in staging, its partition directory, rows, bytes."""

    name: str
    partition: str
    rows: int
    bytes: int


#: ``open_file(partition_dir) -> (name, context manager of a new byte stream)``
OpenFile = Callable[[str], tuple[str, AbstractContextManager[IO[bytes]]]]
#: ``announce([(partition_dir, name), ...])``: called before those files become durable
Announce = Callable[[list[tuple[str, str]]], None]


@dataclass
class _Open:
    name: str
    partition: str
    ctx: AbstractContextManager[IO[bytes]]
    writer: FormatWriter
    rows: int = 0
    pending: list[pa.Table] = field(default_factory=list)
    pending_rows: int = 0
    pending_bytes: int = 0


class RollingWriter:
    """Writes one task's rows into files: one open file per partition directory, a new file
    after ``max_records`` rows or once a file holds about ``max_bytes`` bytes.

    ``open_file(partition_dir)`` returns ``(name, context manager of a new byte stream)``.
    ``announce``, if given, hears of every file just before it is finished (on object
    stores, before it becomes visible), so that a task's files can be found after it died.
    ``close()`` returns the files in the order they were opened. On error, ``abort()``
    closes whatever is open; the caller deletes the partial files.
    """

    def __init__(
        self,
        fmt: FileFormat,
        open_file: OpenFile,
        *,
        partition_by: Sequence[str] = (),
        max_records: int | None = None,
        max_bytes: int | None = None,
        announce: Announce | None = None,
    ) -> None:
        self.fmt = fmt
        self.open_file = open_file
        self.announce = announce
        self.partition_by = list(partition_by)
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._open: dict[str, _Open] = {}
        self._order: list[_Open] = []
        self._done: list[WrittenFile] = []
        self._buffered = 0
        self._schema: pa.Schema | None = None

    @property
    def files(self) -> list[WrittenFile]:
        return list(self._done)

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self.partition_by:
            for values, table in split_by_partition(batch, self.partition_by):
                self._write_part(partition_dir(self.partition_by, values), table)
        else:
            self._write_part("", pa.Table.from_batches([batch]))
        if self._buffered > TASK_BUFFER_BYTES:
            for f in list(self._open.values()):
                self._flush(f)

    def _write_part(self, part: str, table: pa.Table) -> None:
        offset = 0
        while offset < table.num_rows:
            f = self._open.get(part)
            if f is None:
                f = self._new_file(part, table.schema)
            take = table.num_rows - offset
            if self.max_records is not None:
                take = min(take, self.max_records - f.rows - f.pending_rows)
            chunk = table.slice(offset, take)
            offset += take
            if chunk.schema != f.writer.schema:
                chunk = chunk.cast(f.writer.schema)
            f.pending.append(chunk)
            f.pending_rows += take
            size = chunk.nbytes
            f.pending_bytes += size
            self._buffered += size
            if self._file_full(f):
                self._finish(f)
            elif self._must_flush(f):
                self._flush(f)

    def _must_flush(self, f: _Open) -> bool:
        if self.fmt.name != "parquet":
            return True  # text formats stream through their own buffers
        return f.pending_rows >= ROW_GROUP_ROWS or f.pending_bytes >= ROW_GROUP_BYTES

    def _file_full(self, f: _Open) -> bool:
        if self.max_records is not None and f.rows + f.pending_rows >= self.max_records:
            return True
        if self.max_bytes is not None:
            # Buffered rows count uncompressed, so files stay at or under the limit unless
            # a single batch alone exceeds it.
            return f.writer.bytes_written + f.pending_bytes >= self.max_bytes
        return False

    def _new_file(self, part: str, schema: pa.Schema) -> _Open:
        if self._schema is None:
            self._schema = schema
        name, ctx = self.open_file(part)
        stream = ctx.__enter__()
        try:
            writer = self.fmt.open(stream, self._schema)
        except BaseException:
            ctx.__exit__(None, None, None)
            raise
        f = _Open(name, part, ctx, writer)
        self._open[part] = f
        self._order.append(f)
        return f

    def _flush(self, f: _Open) -> None:
        if not f.pending:
            return
        table = pa.concat_tables(f.pending) if len(f.pending) > 1 else f.pending[0]
        f.writer.write(table)
        f.rows += f.pending_rows
        self._buffered -= f.pending_bytes
        f.pending, f.pending_rows, f.pending_bytes = [], 0, 0

    def _finish(self, f: _Open, announced: bool = False) -> None:
        self._flush(f)
        if self.announce is not None and not announced:
            self.announce([(f.partition, f.name)])
        f.writer.close()
        f.ctx.__exit__(None, None, None)
        del self._open[f.partition]
        self._done.append(WrittenFile(f.name, f.partition, f.rows, f.writer.bytes_written))

    def close(self) -> list[WrittenFile]:
        """Flush and close every open file; the files in the order they were opened."""
        last = [f for f in self._order if self._open.get(f.partition) is f]
        if self.announce is not None and last:
            self.announce([(f.partition, f.name) for f in last])  # one announcement for all
        for f in last:
            self._finish(f, announced=True)
        order = {f.name: i for i, f in enumerate(self._order)}
        return sorted(self._done, key=lambda w: order[w.name])

    def abort(self) -> list[str]:
        """Close open files without finishing them; names of every file opened."""
        for f in list(self._open.values()):
            error = FileSinkError("eo_files: task failed while writing this file")
            try:
                f.ctx.__exit__(FileSinkError, error, None)  # close without making it durable
            except Exception:  # noqa: BLE001, S110 - the caller deletes the partial file
                pass
        self._open.clear()
        return [f.name for f in self._order]
