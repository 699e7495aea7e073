"""The executors' range reader (connectors/kafka/source/range_reader.py) on a fake consumer:
reads stop on position, never on a count, and yield exactly the records of ``[start, end)``."""

from __future__ import annotations

import gc

import pyarrow as pa
import pytest

from connectors.core.errors import KafkaSourceError
from connectors.kafka.source import range_reader as reader
from connectors.kafka.source.offsets import OffsetRange
from tests.helpers import FakeConsumer


def _read(fake: FakeConsumer, start: int, end: int, batch: int = 4, **kw: object) -> pa.Table:
    conf = {"bootstrap.servers": f"fake-{id(fake)}"}
    reader._CONSUMERS[tuple(sorted(conf.items()))] = fake
    try:
        r = OffsetRange("", fake.topic, 0, start, end)
        batches = list(reader.read_range(r, conf, batch_records=batch, **kw))  # type: ignore[arg-type]
    finally:
        reader._CONSUMERS.pop(tuple(sorted(conf.items())), None)
    schema = reader.arrow_schema(False, False)
    for b in batches:
        assert b.schema == schema
    return pa.Table.from_batches(batches, schema)


def test_reads_exactly_the_range_and_sizes_consume_to_it():
    fake = FakeConsumer("t", {i: b"v%d" % i for i in range(100)}, high=100)
    t = _read(fake, 10, 23, batch=5)
    assert t.column("offset").to_pylist() == list(range(10, 23))
    assert t.column("value").to_pylist() == [b"v%d" % i for i in range(10, 23)]
    assert set(t.column("partition").to_pylist()) == {0}
    assert t.column("key").null_count == 13
    assert t.column("timestampType").to_pylist() == [0] * 13
    # asks never exceed what the range still holds
    assert fake.asks == [5, 5, 3]


def test_gaps_at_the_end_finish_on_eof_and_records_past_end_are_cut():
    # markers at 7, 8, 9 (end of log 10): the range [0, 10) ends in a gap
    fake = FakeConsumer("t", {i: b"x" for i in range(7)}, high=10)
    assert _read(fake, 0, 10, batch=100).column("offset").to_pylist() == list(range(7))
    # a gap inside the range makes the ask too large: records past end are not returned
    log = {i: b"x" for i in range(50) if i not in (3, 4)}
    fake = FakeConsumer("t", log, high=50)
    assert _read(fake, 0, 10, batch=100).column("offset").to_pylist() == [
        0, 1, 2, 5, 6, 7, 8, 9]


def test_gc_is_back_on_between_batches_and_after():
    fake = FakeConsumer("t", {i: b"x" for i in range(20)}, high=20)
    conf = {"bootstrap.servers": "fake-gc"}
    reader._CONSUMERS[tuple(sorted(conf.items()))] = fake
    try:
        states = [gc.isenabled() for _ in reader.read_range(
            OffsetRange("", "t", 0, 0, 20), conf, batch_records=6)]
    finally:
        reader._CONSUMERS.pop(tuple(sorted(conf.items())), None)
    assert states == [True] * 4
    assert gc.isenabled()


def test_deleted_offsets_are_data_loss():
    fake = FakeConsumer("t", {i: b"x" for i in range(5, 20)}, high=20, low=5)
    with pytest.raises(KafkaSourceError, match=r"offsets \[0, 5\) were deleted"):
        _read(fake, 0, 10)
    fake = FakeConsumer("t", {i: b"x" for i in range(5, 20)}, high=20, low=5)
    t = _read(fake, 0, 10, fail_on_data_loss=False)
    assert t.column("offset").to_pylist() == list(range(5, 10))


def test_reader_fetch_defaults_are_bounded_and_overridable():
    from connectors.kafka.source.options import KafkaSourceOptions

    def conf(**extra: str) -> dict[str, str]:
        o = KafkaSourceOptions.from_options(
            {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", **extra})
        return o.clusters[0].reader_conf(o.group_id)

    c = conf()
    assert c["queued.max.messages.kbytes"] == "32768"  # the prefetch bound per partition
    assert c["max.partition.fetch.bytes"] == str(10 * 1024 * 1024)
    assert c["fetch.queue.backoff.ms"] == "10"
    assert c["isolation.level"] == "read_committed"
    assert conf(**{"kafka.fetch.queue.backoff.ms": "500"})["fetch.queue.backoff.ms"] == "500"
