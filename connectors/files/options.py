"""Options of the ``eo_files`` sink: Spark's string options parsed once into a frozen spec."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connectors.core.errors import FileSinkError, OptionError, StorageError
from connectors.core.options import OptionReader, check_sink_id
from connectors.core.storage import (
    LocalStorage,
    Storage,
    StorageOptions,
    parse_storage_options,
    storage_for,
    storage_options_from,
)
from connectors.files.formats import FileFormat

PATH_HINT = ("a local path, file://, hdfs://, webhdfs://, s3:// (s3a://), gs:// or "
             "abfss:// URL")


@dataclass(frozen=True)
class FileSinkOptions:
    """The parsed options of one file sink (picklable: the storage holds no connection)."""

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
    def create(
        cls,
        path: str,
        *,
        format: str,  # noqa: A002 - Spark's option name
        compression: str | None,
        partition_by: Sequence[str] | str,
        max_records_per_file: int | None,
        max_bytes_per_file: int | None,
        sink_id: str | None,
        spark_metadata: bool,
        csv_header: bool,
        webhdfs_url: str | None,
        hdfs_user: str | None,
        storage_options: Mapping[str, Any] | StorageOptions | None = None,
    ) -> FileSinkOptions:
        """From the Python API's arguments (``FileSink(...)``, which has the defaults)."""
        if not isinstance(path, str) or not path.strip():
            raise OptionError(f"eo_files: option 'path' is required: {PATH_HINT}", option="path")
        store_options = storage_options if isinstance(storage_options, StorageOptions) \
            else storage_options_from(storage_options, "eo_files")
        try:
            storage, resolved = storage_for(path, webhdfs_url=webhdfs_url, hdfs_user=hdfs_user,
                                            options=store_options, family="eo_files")
        except StorageError as e:
            raise OptionError(f"eo_files: option 'path' is not usable: {e}", option="path") from e
        check = getattr(storage, "check_options", None)
        if check is not None:
            check()  # a storage.* key the object store client refuses fails here, offline
        if not storage.atomic_rename and not spark_metadata:
            raise OptionError(
                "eo_files: option 'sparkMetadata' cannot be false for an object-store path: "
                "without a rename, _spark_metadata is what tells readers which files are "
                "committed; remove the option", option="sparkMetadata")
        if isinstance(storage, LocalStorage) and os.path.isfile(resolved):
            raise OptionError(
                f"eo_files: option 'path' {storage.url(resolved)!r} is an existing file; give "
                "a directory (it is created if missing)", option="path")
        if sink_id is not None:
            check_sink_id("eo_files", sink_id)
        file_format = FileFormat.parse(format, compression, csv_header=csv_header)
        if isinstance(partition_by, str):
            partition_by = [p.strip() for p in partition_by.split(",") if p.strip()]
        for name, value in (
            ("maxRecordsPerFile", max_records_per_file),
            ("maxBytesPerFile", max_bytes_per_file),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise OptionError(
                    f"eo_files: option '{name}' must be an integer >= 0 (0 = no limit), "
                    f"got {value!r}",
                    option=name,
                )
        return cls(path, storage, resolved, file_format, tuple(partition_by),
                   max_records_per_file or None, max_bytes_per_file or None, sink_id,
                   spark_metadata)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> FileSinkOptions:
        """From Spark's string options (``writeStream.format("eo_files").option(...)``)."""
        r = OptionReader(options, family="eo_files")
        path = r.required("path", PATH_HINT)
        parsed = cls.create(
            path,
            format=r.string("format") or "parquet",
            compression=r.string("compression"),
            partition_by=r.csv_list("partitionBy"),
            max_records_per_file=r.integer("maxRecordsPerFile", None, minimum=0),
            max_bytes_per_file=r.integer("maxBytesPerFile", None, minimum=0),
            sink_id=r.string("sink_id") or r.string("sinkId"),
            spark_metadata=r.boolean("sparkMetadata", True),
            csv_header=r.boolean("header", True),
            webhdfs_url=r.string("webhdfsUrl"),
            hdfs_user=r.string("hdfsUser"),
            storage_options=parse_storage_options(r),
        )
        r.warn_unknown(ignore=("batchId", "checkpointLocation", "queryName"))
        return parsed

    def check_path(self) -> None:
        """The output directory exists and is writable, or can be created (driver, I/O)."""
        where = self.storage.url(self.path)
        try:
            if self.storage.exists(self.path):
                if not self.storage.is_dir(self.path):
                    raise OptionError(
                        f"eo_files: option 'path' {where!r} is a file; give a directory "
                        "(it is created if missing)",
                        option="path",
                    )
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
