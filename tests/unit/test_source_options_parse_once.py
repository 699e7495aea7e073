"""The ``eo_kafka`` source parses a query's options once.

``schema()`` parses them at ``load()``; Spark then pickles the DataSource, with the parsed
spec, to each process that makes a reader of it: a stream has two (the source runner's, which
plans the batches, and the one whose ``read()`` the tasks run), a batch read one. No reader
parses again; each only takes its kind of read (:meth:`KafkaSourceOptions.for_read`).

The tests play the steps of pyspark's worker modules on pyspark's classes, without a JVM:
pyspark.sql.worker.create_data_source (make the DataSource, ask its schema, pickle it), then
pyspark.sql.streaming.python_streaming_source_runner and
pyspark.sql.worker.plan_data_source_read (unpickle it, make a reader with ``_streamReader``
or ``reader``).
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.serializers import CPickleSerializer
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.datasource_internal import _streamReader
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from connectors.core.errors import OptionError
from connectors.kafka.source.options import KafkaSourceOptions, StartSpec
from connectors.kafka.source.records import arrow_schema
from connectors.spark.datasources import EoKafkaDataSource
from connectors.spark.kafka_source import KafkaBatchReader, KafkaStreamReader

OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "orders",
           "maxOffsetsPerTrigger": "100"}
PICKLE = CPickleSerializer()  # what Spark's Python workers pickle a DataSource with
#: the schema Spark hands back to reader()/streamReader()
SCHEMA: StructType = from_arrow_schema(arrow_schema(False, False))


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The options of every parse of the source's options, in order."""
    seen: list[dict[str, Any]] = []
    parse = KafkaSourceOptions.parse.__func__  # type: ignore[attr-defined]

    def counted(cls: type[KafkaSourceOptions], options: Any) -> KafkaSourceOptions:
        seen.append(dict(options))
        return parse(cls, options)  # type: ignore[no-any-return]

    monkeypatch.setattr(KafkaSourceOptions, "parse", classmethod(counted))
    return seen


def created(options: dict[str, str], schema: bool = True) -> bytes:
    """create_data_source: the DataSource from Spark's options, asked for its schema
    (unless the user gave one), pickled back to the JVM."""
    ds = EoKafkaDataSource(options=CaseInsensitiveDict(options))
    if schema:
        ds.schema()
    return PICKLE.dumps(ds)


def loaded(pickled: bytes) -> EoKafkaDataSource:
    return PICKLE.loads(pickled)  # type: ignore[no-any-return]


def test_a_stream_parses_its_options_once(parses: list[dict[str, Any]]) -> None:
    pickled = created(OPTIONS)
    assert len(parses) == 1  # at load()
    planner = _streamReader(loaded(pickled), SCHEMA)  # python_streaming_source_runner
    tasks = _streamReader(loaded(pickled), SCHEMA)  # plan_data_source_read, streaming
    assert isinstance(planner, KafkaStreamReader) and isinstance(tasks, KafkaStreamReader)
    PICKLE.loads(PICKLE.dumps(tasks))  # to the executors, with the spec
    assert len(parses) == 1
    # the stream's defaults, as if its options had been parsed for a stream
    assert planner.opts.clusters[0].starting == StartSpec("latest")
    assert planner.opts.ending is None and planner.opts.max_offsets_per_trigger == 100
    assert planner.opts == tasks.opts == KafkaSourceOptions.from_options(OPTIONS)


def test_a_batch_read_parses_its_options_once(parses: list[dict[str, Any]]) -> None:
    reader = loaded(created(OPTIONS)).reader(SCHEMA)  # plan_data_source_read, batch
    assert isinstance(reader, KafkaBatchReader)
    assert len(parses) == 1
    assert reader.opts.clusters[0].starting == StartSpec("earliest")
    assert reader.opts.ending == StartSpec("latest")
    assert reader.opts == KafkaSourceOptions.from_options(OPTIONS, batch=True)


def test_a_stream_refuses_ending_offsets_from_the_one_parse(
        parses: list[dict[str, Any]]) -> None:
    pickled = created({**OPTIONS, "endingOffsets": "latest"})  # a batch read would take it
    with pytest.raises(OptionError, match="endingOffsets' is only valid for batch reads"):
        _streamReader(loaded(pickled), SCHEMA)
    assert len(parses) == 1


def test_without_schema_the_reader_parses(parses: list[dict[str, Any]]) -> None:
    """A schema the user gave: Spark never asks for one, so each reader parses (Spark gives
    no earlier hook but the DataSource's constructor, which writes run too)."""
    reader = loaded(created(OPTIONS, schema=False)).reader(SCHEMA)
    assert isinstance(reader, KafkaBatchReader) and len(parses) == 1


def test_a_write_s_options_are_not_parsed_as_the_source_s(
        parses: list[dict[str, Any]]) -> None:
    ds = EoKafkaDataSource(options=CaseInsensitiveDict(
        {"kafka.bootstrap.servers": "h:9092", "topic": "t", "sinkId": "s"}))
    assert ds.schema() and ds.source_options is None and not parses
