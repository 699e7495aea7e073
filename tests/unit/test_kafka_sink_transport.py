"""The Kafka sink's produce path is chosen once, on the driver, from the options and the
schema (``transport.choose``); the task driver's chunks and the transport's pieces
(docs/design.md, "Kafka sink: transports")."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from connectors.kafka import clients
from connectors.kafka.sink import KafkaSink, transport
from connectors.kafka.sink.rows import shape
from connectors.kafka.sink.writer import gather

PLAIN = pa.schema([("value", pa.binary())])
WITH_HEADERS = pa.schema([("value", pa.binary()),
                          ("headers", pa.list_(pa.struct([("key", pa.string()),
                                                          ("value", pa.binary())])))])
WIRE_HERE = clients.produce_refusal({"bootstrap.servers": "h:1"}) is None


def _options(tmp_path, **kw):
    kw.setdefault("topic", "t")
    return KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", **kw).options


@pytest.mark.parametrize(("kw", "schema", "wire_path", "headers"), [
    ({}, PLAIN, WIRE_HERE, False),
    ({"transactional": True}, PLAIN, WIRE_HERE, False),
    ({"transactional": True}, None, WIRE_HERE, False),
    ({}, WITH_HEADERS, False, True),
    ({"transactional": True}, WITH_HEADERS, False, True),
    ({"wire_produce": False}, PLAIN, False, False),
    ({"wire_produce": False}, WITH_HEADERS, False, True),
    ({"transactional": True, "topic": None}, PLAIN, False, False),
    ({"transactional": True, "recovery_key_headers": True}, PLAIN, False, False),
    ({"topic": None}, PLAIN, WIRE_HERE, False),  # recovery keys take the whole task anyway
    ({"kafka_options": {"compression.type": "lz4"}}, PLAIN, False, False),
], ids=["rk", "txn", "txn-schema-unknown", "rk-headers", "txn-headers", "wire-off",
        "wire-off-headers", "txn-topic-column", "txn-rk-headers", "rk-topic-column",
        "compressed"])
def test_the_path_follows_the_options_and_the_schema(tmp_path, kw, schema, wire_path,
                                                     headers):
    path = transport.choose(_options(tmp_path, **kw), schema)
    assert path == transport.ProducePath(wire_path, headers)


def test_check_schema_chooses_the_path_on_the_driver(tmp_path):
    sink = KafkaSink("s", str(tmp_path / "wal"), bootstrap_servers="h:1", topic="t")
    assert sink.path is None
    sink.check_schema(WITH_HEADERS)
    assert sink.path == transport.ProducePath(False, True)
    sink.check_schema(PLAIN)
    assert sink.path == transport.ProducePath(WIRE_HERE, False)


def _batch(n: int, size: int = 10) -> pa.RecordBatch:
    return pa.record_batch([pa.array([b"x" * size] * n, pa.binary())], names=["value"])


def test_gather_groups_non_empty_batches_to_the_size():
    batches = [_batch(10), _batch(0), _batch(10), _batch(10), _batch(10), _batch(0)]
    one_each = list(gather(iter(batches), 0))
    assert [[b.num_rows for b in g] for g in one_each] == [[10], [10], [10], [10]]
    size = batches[0].nbytes
    pairs = list(gather(iter(batches), 2 * size))
    assert [[b.num_rows for b in g] for g in pairs] == [[10, 10], [10, 10]]
    assert list(gather(iter([_batch(0)]), 0)) == []


def test_pieces_cut_at_topics_the_failpoint_and_the_bound():
    table = pa.table({"value": [b"v"] * 10, "topic": ["a"] * 6 + ["b"] * 4})
    rows = shape(table, None, "s")
    todo = np.arange(10)
    got = [(t, p.tolist()) for t, p in transport.pieces(rows, todo, 0, None)]
    assert got == [("a", [0, 1, 2, 3, 4, 5]), ("b", [6, 7, 8, 9])]
    # armed at 4 records of the attempt, 1 sent before: a cut after 3 of these rows
    got = [(t, p.tolist()) for t, p in transport.pieces(rows, todo, 1, 4, most=4)]
    assert got == [("a", [0, 1, 2]), ("a", [3]), ("a", [4, 5]), ("b", [6, 7, 8, 9])]
