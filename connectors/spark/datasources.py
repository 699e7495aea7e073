"""The Python DataSources this package registers: ``eo_kafka``, ``eo_jdbc``, ``eo_files``.

Each class only routes Spark's calls to the family that owns the logic; families are
imported lazily so that ``import connectors`` stays cheap and a missing optional piece
fails only the format that needs it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from connectors.core.sink import BatchSink
from connectors.spark.sink_adapter import (
    SinkBatchWriter,
    SinkStreamWriter,
    arrow_schema,
    batch_id_option,
    check_sink,
    refuse_overwrite,
)

if TYPE_CHECKING:
    from connectors.kafka.source.options import KafkaSourceOptions

SinkFactory = Callable[[dict[str, str], pa.Schema], BatchSink]


def _jdbc_sink(options: dict[str, str], schema: pa.Schema) -> BatchSink:
    from connectors.jdbc.sink import JdbcSink

    return JdbcSink.from_options(options, schema)


def _files_sink(options: dict[str, str], schema: pa.Schema) -> BatchSink:
    from connectors.files.sink import FileSink

    return FileSink.from_options(options, schema)


def _kafka_sink(options: dict[str, str], schema: pa.Schema) -> BatchSink:
    from connectors.kafka.sink import KafkaSink

    return KafkaSink.from_options(options, schema)

log = logging.getLogger(__name__)


class _SinkDataSource(DataSource):
    """Shared writer plumbing: options -> sink spec -> Spark writer adapter."""

    family = "sink"
    factory: SinkFactory

    def _sink(self, schema: StructType) -> BatchSink:
        sink = type(self).factory(dict(self.options), arrow_schema(schema))
        check_sink(sink, arrow_schema(schema))
        return sink

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        refuse_overwrite(overwrite, self.family)
        batch_id = batch_id_option(self.options, self.family)
        return SinkBatchWriter(self._sink(schema), batch_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        refuse_overwrite(overwrite, self.family)
        return SinkStreamWriter(self._sink(schema))


class EoJdbcDataSource(_SinkDataSource):
    """``eo_jdbc``: transactional JDBC sink (docs/design.md, "JDBC sink")."""

    family = "eo_jdbc"
    factory = staticmethod(_jdbc_sink)

    @classmethod
    def name(cls) -> str:
        return "eo_jdbc"


class EoFilesDataSource(_SinkDataSource):
    """``eo_files``: the exactly-once file sink (docs/design.md, "File sink")."""

    family = "eo_files"
    factory = staticmethod(_files_sink)

    @classmethod
    def name(cls) -> str:
        return "eo_files"


class EoKafkaDataSource(_SinkDataSource):
    """``eo_kafka``: idempotent Kafka source (section 5) and exactly-once sink (section 6)."""

    family = "eo_kafka"
    factory = staticmethod(_kafka_sink)
    #: The source's options as ``schema()`` parsed them, once per query; Spark pickles this
    #: DataSource, with them, to each process that makes a reader (None: a write's options,
    #: or a schema the user gave, so that Spark never asked).
    source_options: KafkaSourceOptions | None = None

    @classmethod
    def name(cls) -> str:
        return "eo_kafka"

    def schema(self) -> StructType | str:
        from connectors.spark import kafka_source

        schema, self.source_options = kafka_source.source_schema(dict(self.options))
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        from connectors.spark import kafka_source

        return kafka_source.batch_reader(dict(self.options), schema, self.source_options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from connectors.spark import kafka_source

        return kafka_source.stream_reader(dict(self.options), schema, self.source_options)


DATA_SOURCES: tuple[type[DataSource], ...] = (
    EoKafkaDataSource,
    EoJdbcDataSource,
    EoFilesDataSource,
)


def register(spark: Any) -> None:
    """Register every DataSource of this package with a SparkSession."""
    for cls in DATA_SOURCES:
        spark.dataSource.register(cls)
        _settle_environment(spark, cls.name())


#: The environment variables Spark's ``PythonStreamingSourceRunner.init`` puts into a
#: registered Python data source's environment map when a streaming query starts.
_RUNNER_ENVIRONMENT = ("SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE")


def _settle_environment(spark: Any, name: str) -> None:
    """Put the keys Spark's streaming source runner adds into the data source's environment
    map now, while one thread registers it (a Spark race, docs/deploying.md, "Starting many
    queries at once"): every function Spark makes from a registered Python data source
    shares that one ``java.util.HashMap``, and each streaming query's start puts these keys
    into it from its own thread. The first puts resize the map; two queries starting at once
    can corrupt it, and every task serialized from it then fails with
    ``java.io.OptionalDataException`` in ``HashMap.readObject``. With the keys present, a
    query's start only replaces values, which never restructures the map. Classic Spark
    only (a Spark Connect client has no JVM here; the server registers the source)."""
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        return
    try:
        function = jsession.sessionState().dataSourceManager().lookupDataSource(name)
        env = function.dataSourceCls().envVars()
        conf = spark.sparkContext.getConf()
        # Values as Spark sets them; every runner puts its own before it starts a worker.
        values = {
            "SPARK_LOCAL_DIRS": str(conf.get("spark.local.dir", tempfile.gettempdir())),
            "SPARK_AUTH_SOCKET_TIMEOUT": str(_seconds(
                conf.get("spark.python.authenticate.socketTimeout", "15s"))),
            "SPARK_BUFFER_SIZE": str(conf.get("spark.buffer.size", "65536")),
        }
        for key in _RUNNER_ENVIRONMENT:
            if not env.containsKey(key):
                env.put(key, values[key])
    except Exception as e:  # noqa: BLE001 - a Spark without these internals: nothing to settle
        log.debug("cannot settle the environment map of data source %s: %s", name, e)


def _seconds(text: str) -> int:
    """A Spark time string in seconds (``15s``, ``2m``, ``15``)."""
    text = text.strip().lower()
    for suffix, factor in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(suffix) and text[:-len(suffix)].strip().isdigit():
            return max(1, int(int(text[:-len(suffix)]) * factor))
    return int(text) if text.isdigit() else 15
