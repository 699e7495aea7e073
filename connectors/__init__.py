"""Exactly-once connectors for PySpark Structured Streaming, in pure Python.

``connectors.register(spark)`` registers the DataSources ``eo_kafka``, ``eo_jdbc`` and
``eo_files``. The sink classes are also ``foreachBatch`` callables.
"""

from __future__ import annotations

from typing import Any

from connectors.core import sink as _sink
from connectors.core.errors import (
    ConnectorError,
    FileSinkError,
    JdbcSinkError,
    KafkaSinkError,
    KafkaSourceError,
    OptionError,
    StorageError,
    WalError,
)

__version__ = "0.1.0"

__all__ = [
    "ConnectorError",
    "FileSinkError",
    "JdbcSinkError",
    "KafkaSinkError",
    "KafkaSourceError",
    "OptionError",
    "StorageError",
    "WalError",
    "register",
]


def register(spark: Any) -> None:
    """Register every DataSource this package provides with ``spark``."""
    from connectors.spark import register as _register

    _register(spark)


def _write_dataframe(sink: Any, df: Any, batch_id: int) -> None:
    # Imported on first use: pyspark loads only when a DataFrame is written.
    from connectors.spark.sink_adapter import write_dataframe

    write_dataframe(sink, df, batch_id)


# Every sink's ``write(df, batch_id)`` / ``__call__`` runs the Spark adapter. The families and
# core never import Spark; this package, their parent, wires the adapter in once.
_sink.set_dataframe_writer(_write_dataframe)


def __getattr__(name: str) -> Any:
    # Public classes are imported on first use so that `import connectors` stays light
    # (no pyspark import) on executors and in the CLI.
    lazy = {
        "JdbcSink": "connectors.jdbc.sink",
        "KafkaSink": "connectors.kafka.sink",
        "FileSink": "connectors.files.sink",
        "KafkaWindows": "connectors.kafka.source.windows",
    }
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module 'connectors' has no attribute {name!r}")
