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
    reader._CONSUMERS.put(reader.conf_key(conf), fake)
    try:
        r = OffsetRange("", fake.topic, 0, start, end)
        batches = list(reader.read_range(r, conf, batch_records=batch, **kw))
    finally:
        reader._CONSUMERS.discard(reader.conf_key(conf))
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
    reader._CONSUMERS.put(reader.conf_key(conf), fake)
    try:
        states = [gc.isenabled() for _ in reader.read_range(
            OffsetRange("", "t", 0, 0, 20), conf, batch_records=6)]
    finally:
        reader._CONSUMERS.discard(reader.conf_key(conf))
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
    assert c["fetch.wait.max.ms"] == "10"  # a parked fetch would delay the next task
    assert c["isolation.level"] == "read_committed"
    assert conf(**{"kafka.fetch.queue.backoff.ms": "500"})["fetch.queue.backoff.ms"] == "500"


# -- grouped reads: one consumer, many ranges ------------------------------------------------
def _read_group(fake: FakeConsumer, ranges: list[OffsetRange], batch: int = 1000,
                **kw: object) -> list[pa.RecordBatch]:
    conf = {"bootstrap.servers": f"fake-{id(fake)}"}
    reader._CONSUMERS.put(reader.conf_key(conf), fake)
    try:
        return list(reader.read_ranges(ranges, conf, batch_records=batch, **kw))
    finally:
        reader._CONSUMERS.discard(reader.conf_key(conf))


def _rows(batches: list[pa.RecordBatch]) -> list[tuple[str, int, int]]:
    t = pa.Table.from_batches(batches, reader.arrow_schema(False, False))
    return list(zip(t.column("topic").to_pylist(), t.column("partition").to_pylist(),
                    t.column("offset").to_pylist(), strict=True))


def _logs(n_parts: int, high: int, topics: tuple[str, ...] = ("t",)) -> dict:
    return {(t, p): ({i: b"%d" % i for i in range(high)}, high)
            for t in topics for p in range(n_parts)}


def test_a_group_comes_out_range_after_range_whatever_order_the_fetches_arrive_in():
    # Fetches interleave partitions in reverse order, 3 records at a time; the rows still
    # come out range by range in the group's order, each in offset order: a replay gives
    # the same rows in the same order (deterministicOrder=true downstream relies on it).
    fake = FakeConsumer.partitions(_logs(5, 40, ("a", "b")), chunk=3, reverse=True)
    ranges = [OffsetRange("", t, p, 5, 30) for t in ("a", "b") for p in range(5)]
    rows = _rows(_read_group(fake, ranges))
    assert rows == [(r.topic, r.partition, o) for r in ranges for o in range(5, 30)]
    # every range was unassigned once it was complete: nothing past its end is fetched,
    # and no pause outlives the read in the consumer
    assert sorted(fake.unassigned) == sorted((r.topic, r.partition) for r in ranges)
    assert fake.pauses == [] and not any(p.paused for p in fake.parts.values())


def test_a_group_batches_are_few_and_bounded():
    fake = FakeConsumer.partitions(_logs(50, 30), chunk=7, reverse=True)
    ranges = [OffsetRange("", "t", p, 0, 30) for p in range(50)]
    batches = _read_group(fake, ranges, batch=400)
    assert sum(b.num_rows for b in batches) == 1500
    assert max(b.num_rows for b in batches) <= 400
    assert len(batches) <= 10  # not one per partition and fetch


def test_early_records_past_the_buffer_bound_pause_the_later_ranges(monkeypatch):
    monkeypatch.setattr(reader, "BUFFER_BYTES", 2000)
    fake = FakeConsumer.partitions(_logs(6, 200), chunk=10, reverse=True)
    ranges = [OffsetRange("", "t", p, 0, 200) for p in range(6)]
    rows = _rows(_read_group(fake, ranges, batch=100))
    assert rows == [("t", r.partition, o) for r in ranges for o in range(200)]
    assert fake.pauses, "the later ranges were never held back"
    assert not any(p.paused for p in fake.parts.values())  # all resumed


def test_a_group_finishes_ranges_that_end_in_a_gap_and_cuts_past_the_end():
    logs = {("t", 0): ({i: b"x" for i in range(7)}, 10),     # markers at 7..9: EOF ends it
            ("t", 1): ({i: b"x" for i in range(50)}, 50)}    # records past end 12 are cut
    fake = FakeConsumer.partitions(logs, chunk=4)
    rows = _rows(_read_group(fake, [OffsetRange("", "t", 0, 0, 10),
                                    OffsetRange("", "t", 1, 3, 12)]))
    assert rows == [("t", 0, o) for o in range(7)] + [("t", 1, o) for o in range(3, 12)]


def test_a_group_reports_data_loss_in_one_of_its_ranges():
    logs = _logs(3, 20)
    fake = FakeConsumer.partitions(logs, chunk=5)
    fake.parts[("t", 1)].low = 8  # offsets 0..7 of partition 1 were deleted
    ranges = [OffsetRange("", "t", p, 0, 20) for p in range(3)]
    with pytest.raises(KafkaSourceError, match=r"t-1 \[0, 20\): offsets \[0, 8\) were deleted"):
        _read_group(fake, ranges)
    fake = FakeConsumer.partitions(logs, chunk=5)
    fake.parts[("t", 1)].low = 8
    rows = _rows(_read_group(fake, ranges, fail_on_data_loss=False))
    assert rows == ([("t", 0, o) for o in range(20)] + [("t", 1, o) for o in range(8, 20)]
                    + [("t", 2, o) for o in range(20)])


def test_a_group_never_holds_one_partition_twice():
    fake = FakeConsumer.partitions(_logs(1, 20))
    with pytest.raises(KafkaSourceError, match="two ranges of one Kafka partition"):
        _read_group(fake, [OffsetRange("", "t", 0, 0, 5), OffsetRange("", "t", 0, 5, 10)])
