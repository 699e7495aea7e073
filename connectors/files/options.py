"""Options of the ``eo_files`` sink, declared once (:data:`FILE_SINK_OPTIONS`): Spark's string
options and the Python API's arguments both become a frozen :class:`FileSinkOptions` through
it (docs/file-sink.md shows the table it generates)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from connectors.core.declared import (
    BOOLEAN,
    CSV_LIST,
    INTEGER,
    STORAGE,
    STRING,
    Declared,
    Opt,
    Values,
    sink_id_option,
)
from connectors.core.errors import FileSinkError, OptionError, StorageError
from connectors.core.storage import LocalStorage, Storage, StorageOptions, storage_for
from connectors.files.formats import FileFormat

FAMILY = "eo_files"
PATH_HINT = ("a local path, file://, hdfs://, webhdfs://, s3:// (s3a://), gs:// or "
             "abfss:// URL")

#: The sink's options, declared once: ``FileSink(...)``'s arguments, the DataSource's options,
#: the unknown-option check and the table in docs/file-sink.md all come from here.
FILE_SINK_OPTIONS: tuple[Opt, ...] = (
    Opt("path", "path", STRING, required=True, hint=PATH_HINT,
        help="local path, `file:///abs`, `hdfs://nn[:port]/p`, `webhdfs://nn:9870/p`, "
        "`swebhdfs://`, `s3://bucket/p` (`s3a://`), `gs://bucket/p`, "
        "`abfss://container@account.dfs.core.windows.net/p`"),
    Opt("storage.", "storage_options", STORAGE, shown_default="provider chain",
        help="object stores only: endpoint, region, credentials, timeouts "
        "([deploying.md](deploying.md#credentials-and-endpoints))"),
    Opt("format", "format", STRING, "parquet",
        help="`parquet`, `jsonl` (alias `json`) or `csv`"),
    Opt("compression", "compression", STRING, shown_default="parquet `snappy`, else `none`",
        help="parquet: `snappy`, `gzip`, `zstd`, `lz4`, `brotli`, `none`; jsonl/csv: `gzip`, "
        "`bz2`, `zstd`, `lz4`, `none`"),
    Opt("partitionBy", "partition_by", CSV_LIST, (), shown_default="none",
        help="comma-separated columns (a list in Python) -> `col=value/` directories (Spark's "
        "escaping, nulls as `__HIVE_DEFAULT_PARTITION__`); these columns are not repeated "
        "inside the files"),
    Opt("maxRecordsPerFile", "max_records_per_file", INTEGER, minimum=0,
        shown_default="no limit",
        help="a task starts a new file after this many rows (0 = no limit)"),
    Opt("maxBytesPerFile", "max_bytes_per_file", INTEGER, minimum=0, shown_default="no limit",
        help="a task starts a new file once a file holds about this many bytes (buffered rows "
        "count uncompressed, so files stay near or under it)"),
    sink_id_option(
        False, "recorded with every commit; the path then belongs to it: a different (or no) "
        "`sink_id` writing to the same path is refused with `SinkOwnershipError`, at any batch "
        "id, before anything is staged. 1-128 characters from `A-Z a-z 0-9 . _ -`, not "
        "starting with `.`, no `..`"),
    Opt("sparkMetadata", "spark_metadata", BOOLEAN, True,
        help="also maintain Spark's `_spark_metadata` log (always on for object stores: it is "
        "how readers know the committed files)"),
    Opt("header", "csv_header", BOOLEAN, True, help="CSV header line in every file"),
    Opt("webhdfsUrl", "webhdfs_url", STRING, shown_default="`http://<host>:9870`",
        help="WebHDFS endpoint for `hdfs://` paths"),
    Opt("hdfsUser", "hdfs_user", STRING, shown_default="`$HADOOP_USER_NAME`",
        help="HDFS user (insecure clusters)"),
)


@dataclass(frozen=True)
class FileSinkOptions(Declared):
    """The parsed options of one file sink (picklable: the storage holds no connection)."""

    OPTIONS: ClassVar[tuple[Opt, ...]] = FILE_SINK_OPTIONS
    FAMILY: ClassVar[str] = FAMILY

    url: str  # the ``path`` option as given
    storage: Storage
    path: str  # ``url`` on ``storage``
    format: FileFormat
    partition_by: tuple[str, ...] = ()
    max_records_per_file: int | None = None
    max_bytes_per_file: int | None = None
    sink_id: str | None = None
    spark_metadata: bool = True

    @property
    def storage_options(self) -> StorageOptions:
        options = getattr(self.storage, "options", None)
        return options if isinstance(options, StorageOptions) else StorageOptions()

    @classmethod
    def _build(cls, v: Values) -> FileSinkOptions:
        """The checks across options, for ``FileSink(...)`` and the DataSource alike."""
        path = v["path"]
        try:
            storage, resolved = storage_for(path, webhdfs_url=v["webhdfs_url"],
                                            hdfs_user=v["hdfs_user"],
                                            options=v["storage_options"], family=FAMILY)
        except StorageError as e:
            name = v.name("path")
            raise OptionError(f"{FAMILY}: option '{name}' is not usable: {e}",
                              option=name) from e
        check = getattr(storage, "check_options", None)
        if check is not None:
            check()  # a storage.* key the object store client refuses fails here, offline
        if not storage.atomic_rename and not v["spark_metadata"]:
            raise v.error(
                "spark_metadata", "cannot be false for an object-store path",
                "without a rename, _spark_metadata is what tells readers which files are "
                "committed; remove the option")
        if isinstance(storage, LocalStorage) and os.path.isfile(resolved):
            raise v.error("path", f"{storage.url(resolved)!r} is an existing file",
                          "give a directory (it is created if missing)")
        file_format = FileFormat.parse(v["format"], v["compression"], csv_header=v["csv_header"])
        return v.build(
            cls, used=("compression", "csv_header", "webhdfs_url", "hdfs_user",
                       "storage_options"),
            url=path, storage=storage, path=resolved, format=file_format,
            max_records_per_file=v["max_records_per_file"] or None,
            max_bytes_per_file=v["max_bytes_per_file"] or None)

    def check_path(self) -> None:
        """The output directory exists and is writable, or can be created (driver, I/O)."""
        where = self.storage.url(self.path)
        try:
            if self.storage.is_file(self.path):
                raise OptionError(
                    f"eo_files: option 'path' {where!r} is a file; give a directory "
                    "(it is created if missing)",
                    option="path",
                )
            if self.storage.exists(self.path):
                if isinstance(self.storage, LocalStorage) and not os.access(
                    self.path, os.W_OK | os.X_OK
                ):
                    raise OptionError(
                        f"eo_files: option 'path' {where!r} is not writable by this user",
                        option="path",
                    )
                return
            if isinstance(self.storage, LocalStorage):
                parent = os.path.dirname(self.path)
                while parent and not os.path.exists(parent):
                    parent = os.path.dirname(parent)
                if not os.path.isdir(parent):
                    raise OptionError(
                        f"eo_files: option 'path' {where!r} cannot be created: {parent!r} "
                        "is a file, not a directory",
                        option="path",
                    )
                if not os.access(parent, os.W_OK | os.X_OK):
                    raise OptionError(
                        f"eo_files: option 'path' {where!r} cannot be created: {parent!r} "
                        "is not writable by this user",
                        option="path",
                    )
        except StorageError as e:
            raise FileSinkError(f"eo_files: cannot check path {where!r}: {e}") from e
