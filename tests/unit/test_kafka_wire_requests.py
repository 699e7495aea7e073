"""The request encodings (connectors/kafka/wire/requests.py), the flexible versions of
transactions v2 among them, and wire_protocol's header and compact types: bytes laid out as
Kafka's message schemas say, answers read field by field, tagged fields skipped. A real
broker speaking them is in tests/integration/test_kafka_sink_wire.py (Apache Kafka 4.1.2
with transaction.version 2) and every transactional wire test of the cluster tier."""

from __future__ import annotations

import socket
import struct

import pytest

from connectors.kafka.wire import requests
from connectors.kafka.wire.protocol import (
    API_VERSIONS,
    END_TXN,
    Connection,
    ProtocolViolation,
    Reader,
    compact,
    uvarint,
)
from tests.unit.test_kafka_wire_client import _exactly, _peer, _settings


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31 - 1])
def test_unsigned_varints_round_trip(n):
    r = Reader(uvarint(n) + b"!")
    assert r.uvarint() == n and bytes(r.data[r.at:]) == b"!"


def test_a_varint_longer_than_five_bytes_is_out_of_protocol():
    with pytest.raises(ProtocolViolation):
        Reader(b"\xff" * 6).uvarint()


def test_compact_strings_count_from_one_and_zero_is_null():
    assert compact(None) == b"\x00" and compact("") == b"\x01"
    assert compact("ab") == b"\x03ab"
    r = Reader(compact("ab") + compact(None) + compact("é"))
    assert (r.compact_string(), r.compact_string(), r.compact_string()) == ("ab", None, "é")


def test_finalized_features_are_read_from_the_tagged_fields():
    """ApiVersions v3: api keys, throttle, then tags 0 (supported features), 1 (epoch) and
    2 (finalized features): only the finalized levels count."""
    supported = uvarint(2) + compact("transaction.version") + struct.pack(">hh", 0, 2) + b"\0"
    finalized = (uvarint(3) + compact("transaction.version") + struct.pack(">hh", 2, 0)
                 + b"\0" + compact("group.version") + struct.pack(">hh", 1, 0) + b"\0")
    body = (struct.pack(">h", 0) + uvarint(3) + struct.pack(">hhh", 0, 3, 12) + b"\0"
            + struct.pack(">hhh", 26, 0, 5) + b"\0" + struct.pack(">i", 0)
            + uvarint(3) + uvarint(0) + uvarint(len(supported)) + supported
            + uvarint(1) + uvarint(8) + struct.pack(">q", 7)
            + uvarint(2) + uvarint(len(finalized)) + finalized)
    error, features = requests.read_api_versions_v3(Reader(body))
    assert error == 0
    assert features == {"transaction.version": 2, "group.version": 1}


def test_a_cluster_without_finalized_features_has_no_transactions_v2():
    body = struct.pack(">h", 0) + uvarint(1) + struct.pack(">i", 0) + b"\0"
    assert requests.read_api_versions_v3(Reader(body)) == (0, {})


def test_txn_offset_commit_v5_lays_out_one_offset_outside_a_generation():
    body = requests.txn_offset_commit_v5("tx", "g", 9, 3, "facts", 0, 5, "m")
    r = Reader(body)
    assert (r.compact_string(), r.compact_string()) == ("tx", "g")
    assert r.take(">qhi") == (9, 3, -1)  # producer id, epoch, generation
    assert (r.compact_string(), r.compact_string()) == ("", None)  # member, instance
    assert r.compact_count() == 1 and r.compact_string() == "facts"
    assert r.compact_count() == 1 and r.take(">iqi") == (0, 5, -1)
    assert r.compact_string() == "m"
    assert (r.tags(), r.tags(), r.tags()) == ({}, {}, {}) and r.at == len(body)


def test_end_txn_v5_answers_the_bumped_epoch():
    body = struct.pack(">ihqh", 0, 0, 9, 4) + b"\0"
    assert requests.read_end_txn_v5(Reader(body)) == (0, 9, 4)
    assert requests.end_txn_v5("tx", 9, 3, True) == compact("tx") + struct.pack(
        ">qhb", 9, 3, 1) + b"\0"


def test_a_flexible_request_has_header_tags_and_its_answer_header_too():
    """Request header v2 ends in a tag section; response header v1 has one after the
    correlation id, except ApiVersions' answer (header v0, whatever the version)."""
    seen: list[bytes] = []

    def script(conn: socket.socket) -> None:
        for answer_tags in (b"\x01\x05\x02hi", b""):
            size = struct.unpack(">i", _exactly(conn, 4))[0]
            request = _exactly(conn, size)
            seen.append(request)
            correlation = struct.unpack_from(">i", request, 4)[0]
            body = struct.pack(">i", correlation) + answer_tags + b"payload"
            conn.sendall(struct.pack(">i", len(body)) + body)

    port, t = _peer(script)
    c = Connection("127.0.0.1", port, _settings(**{"client.id": "me"}))
    try:
        r = c.call(END_TXN, b"body", version=5)
        assert bytes(r.data[r.at:]) == b"payload"
        r = c.call(API_VERSIONS, b"body", version=3)
        assert bytes(r.data[r.at:]) == b"payload"
    finally:
        c.close()
    t.join(5)
    end_txn, api_versions = seen
    assert end_txn[:4] == struct.pack(">hh", END_TXN, 5)
    assert end_txn[8:] == struct.pack(">h", 2) + b"me" + b"\0" + b"body"
    assert api_versions[8:] == struct.pack(">h", 2) + b"me" + b"\0" + b"body"


def test_offset_fetch_v7_asks_stable_offsets_and_reads_metadata():
    """The commit fact's read on the wire: one group, one topic, require_stable; the answer's
    offset, metadata (its NUL too, exactly as committed) and error per partition."""
    from connectors.kafka.wire import requests

    body = requests.offset_fetch_v7("eo-sink-s-w0", "facts", [0], require_stable=True)
    assert body == (compact("eo-sink-s-w0") + uvarint(2) + compact("facts") + uvarint(2)
                    + struct.pack(">i", 0) + b"\x00" + b"\x01" + b"\x00")
    answer = (struct.pack(">i", 0) + uvarint(2) + compact("facts") + uvarint(2)
              + struct.pack(">iqi", 0, 0, -1) + compact('{"b":3}\x00') + struct.pack(">h", 0)
              + b"\x00" + b"\x00" + struct.pack(">h", 0) + b"\x00")
    error, got = requests.read_offset_fetch_v7(Reader(answer))
    assert error == 0 and got == {("facts", 0): (0, '{"b":3}\x00', 0)}
