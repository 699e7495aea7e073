"""Batch produce's pure parts (connectors.kafka.sink.batch_produce): the client handle and
the pointers built from Arrow buffers. The produce itself is tested on Apache Kafka
(tests/integration/test_kafka_sink_transactional.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from connectors.kafka.sink import batch_produce


def test_the_client_handle_is_found_here():
    # If a confluent-kafka release changes its client layout, the sink falls back to
    # produce() silently; this test makes that visible.
    producer = Producer({"bootstrap.servers": "127.0.0.1:9"})
    assert batch_produce.handle(producer) is not None
    assert batch_produce.handle(object()) is None


def _read(column: batch_produce.BinaryColumn, rows: list[int]) -> list[bytes | None]:
    addresses, lengths = column.at(np.asarray(rows, dtype=np.int64))
    return [None if a == 0 else ctypes.string_at(int(a), int(n))
            for a, n in zip(addresses.tolist(), lengths.tolist(), strict=True)]


def test_pointers_cover_nulls_empties_slices_and_large_binary():
    items = [b"a", None, b"", b"bcd", None, b"efgh", b""]
    for kind in (pa.binary(), pa.large_binary()):
        array = pa.array(items, kind)
        assert _read(batch_produce.BinaryColumn(array, len(array)), list(range(7))) == items
        assert _read(batch_produce.BinaryColumn(array, 7), [5, 0, 3, 1]) == [
            b"efgh", b"a", b"bcd", None]
        sliced = batch_produce.BinaryColumn(array.slice(2, 4), 4)
        assert _read(sliced, [0, 1, 2, 3]) == items[2:6]
        assert _read(sliced, [3, 1]) == [b"efgh", b"bcd"]


def test_pointers_of_no_column_or_all_null_are_null():
    addresses, lengths = batch_produce.BinaryColumn(None, 3).at(np.arange(3))
    assert addresses.tolist() == lengths.tolist() == [0, 0, 0]
    assert _read(batch_produce.BinaryColumn(pa.nulls(2, pa.binary()), 2), [0, 1]) == [None, None]


def test_empty_values_without_a_data_buffer_are_not_null():
    array = pa.array([b"", b""], pa.binary())
    addresses, lengths = batch_produce.BinaryColumn(array, 2).at(np.arange(2))
    assert (addresses != 0).all() and lengths.tolist() == [0, 0]


@pytest.mark.c_extensions
def test_the_c_loop_queues_records_with_and_without_a_header():
    """The recovery-key mode's C loop, with its header or none (an empty header name, what
    bench/librdkafka_handoff.py measures against ``rd_kafka_produce_batch``). No broker: the
    records wait in librdkafka's queue, then a purge reports each one to ``on_delivery``, as
    a ``produce()`` record's would be."""
    assert batch_produce.keyed_available(), "the _keyed_produce extension was not built"
    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    rk = batch_produce.handle(producer)
    assert rk is not None
    reports: list[object] = []
    values = pa.array([b"v%d" % i for i in range(300)] + [None], pa.binary())
    parts = np.zeros(len(values), dtype=np.int32)
    order = np.arange(len(values))
    for header, prefix in (("", b""), ("eo-rk", b"p")):
        queued = batch_produce.produce_keyed(
            producer, lambda err, msg: reports.append(err), rk, "t", values, None, parts,
            order, header, prefix, lambda: producer.poll(0))
        assert queued == len(values)
    assert len(producer) >= 2 * len(values)
    producer.purge()
    producer.poll(0)
    assert len(reports) == 2 * len(values) and all(r is not None for r in reports)
