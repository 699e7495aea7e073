"""One small storage interface for every piece of state and output, on local disks, HDFS
and object stores (S3, GCS, Azure Blob).

The commit point of every protocol is :meth:`Storage.create`, a create-if-absent:
``link()`` of a complete temp file on local disks, RENAME of one on HDFS, a conditional PUT
on object stores. :func:`check_create_if_absent` proves it once per store and process.
See :mod:`connectors.core.storage.base` for the guarantees each operation gives.

Backends are small picklable values (the sinks ship them to executors); their clients are
created lazily on first use in each process.
"""

from connectors.core.storage.base import (
    PROBE_PREFIX,
    TEMP_PREFIX,
    TEMP_SUFFIX,
    CountingStream,
    Storage,
    check_create_if_absent,
    forget_probes,
    is_hidden,
    temp_name,
)
from connectors.core.storage.local import LocalStorage
from connectors.core.storage.object_store import (
    ObjectStoreStorage,
    request_counts,
    reset_request_counts,
)
from connectors.core.storage.options import (
    STORAGE_OPTIONS,
    StorageOptions,
    parse_storage_options,
    storage_options_from,
)
from connectors.core.storage.urls import (
    check_state_path,
    is_object_store,
    require_directory,
    storage_for,
)
from connectors.core.storage.webhdfs import DEFAULT_WEBHDFS_PORT, WebHdfsStorage

__all__ = [
    "DEFAULT_WEBHDFS_PORT", "PROBE_PREFIX", "STORAGE_OPTIONS", "TEMP_PREFIX", "TEMP_SUFFIX",
    "CountingStream", "LocalStorage", "ObjectStoreStorage", "Storage", "StorageOptions",
    "WebHdfsStorage", "check_create_if_absent", "check_state_path", "forget_probes", "is_hidden",
    "is_object_store", "parse_storage_options", "request_counts", "require_directory",
    "reset_request_counts", "storage_for", "storage_options_from", "temp_name",
]
