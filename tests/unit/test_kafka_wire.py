"""The wire path's record-batch encoder and settings, without a broker
(connectors/kafka/wire/protocol.py, _record_batch.c). What a broker makes of the batches
is in tests/integration/test_kafka_sink_wire.py."""

from __future__ import annotations

import base64
import struct
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest

from connectors.kafka import clients
from connectors.kafka.wire import protocol as wire_protocol
from connectors.kafka.wire import record_batch
from connectors.kafka.wire.settings import Settings


@pytest.mark.c_extensions
def test_the_encoder_is_built():
    """setup.py builds it wherever a C compiler is, as on every machine CI runs on."""
    assert record_batch.encoder_built()


def _varint(data: bytes, at: int) -> tuple[int, int]:
    shift = z = 0
    while True:
        b = data[at]
        at += 1
        z |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (z >> 1) ^ -(z & 1), at


def _decode(batch: bytes) -> dict:
    """Kafka's DefaultRecordBatch layout, read back field by field."""
    (base, length, _epoch, magic, crc, attrs, last_delta, ts, max_ts, pid, epoch, seq,
     count) = struct.unpack_from(">qiibIhiqqqhii", batch)
    assert (base, magic, length) == (0, 2, len(batch) - 12)
    assert crc == record_batch.crc32c(batch[21:])
    at, records = 61, []
    for i in range(count):
        size, at = _varint(batch, at)
        end = at + size
        assert batch[at] == 0  # attributes
        ts_delta, at = _varint(batch, at + 1)
        delta, at = _varint(batch, at)
        assert (ts_delta, delta) == (0, i)
        klen, at = _varint(batch, at)
        key = None if klen < 0 else batch[at:at + klen]
        at += max(klen, 0)
        vlen, at = _varint(batch, at)
        value = None if vlen < 0 else batch[at:at + vlen]
        at += max(vlen, 0)
        headers, at = _varint(batch, at)
        assert headers == 0 and at == end
        records.append((key, value))
    assert at == len(batch) and last_delta == count - 1 and ts == max_ts
    return {"attrs": attrs, "pid": pid, "epoch": epoch, "seq": seq, "records": records}


@pytest.mark.c_extensions
def test_crc32c_is_castagnoli():
    assert record_batch.crc32c(b"123456789") == 0xE3069283


@pytest.mark.c_extensions
def test_batches_hold_every_row_once_per_partition_in_order():
    """Nulls, empty values, a large_binary key column, a sliced array (Arrow offsets that do
    not start at 0), long values (two-byte varints): the records come back as given."""
    n = 500
    keys = pa.array([None if i % 4 == 0 else f"k{i}".encode() for i in range(n + 7)],
                    pa.large_binary()).slice(7)
    values = pa.array([None if i % 9 == 0 else b"" if i % 10 == 0 else b"v" * (i % 300)
                       for i in range(n + 7)], pa.binary()).slice(7)
    parts = np.arange(n, dtype=np.int64) % 3
    order = np.argsort(parts, kind="stable")
    data, batches, partitions = record_batch.encode(values, keys, order, parts,
                                                    np.array([5, 0, 7]), 42, 3, 1_000_000)
    assert partitions.tolist() == [0, 1, 2] and len(batches) == 3
    for g, start, end, count in batches.tolist():
        got = _decode(bytes(data[start:end]))
        p = int(partitions[g])
        rows = [i for i in range(n) if i % 3 == p]
        assert got["records"] == [(keys[i].as_py(), values[i].as_py()) for i in rows]
        assert (got["attrs"], got["pid"], got["epoch"]) == (0x10, 42, 3)  # transactional
        assert got["seq"] == [5, 0, 7][p] and count == len(rows)
        assert record_batch.base_sequence(data, start) == got["seq"]


@pytest.mark.c_extensions
def test_a_partition_over_the_batch_limit_is_split_with_running_sequences():
    values = pa.array([b"x" * 100] * 100)
    parts = np.zeros(100, dtype=np.int64)
    data, batches, _ = record_batch.encode(values, None, np.arange(100), parts, np.zeros(1),
                                           1, 0, 2_000)
    assert len(batches) > 5 and (batches[:, 2] - batches[:, 1] <= 2_000).all()
    records, seq = [], 0
    for _, start, end, count in batches.tolist():
        got = _decode(bytes(data[start:end]))
        assert got["seq"] == seq
        seq += count
        records += got["records"]
    assert records == [(None, b"x" * 100)] * 100 and seq == 100


@pytest.mark.c_extensions
def test_unsupported_names_what_sends_through_librdkafka():
    assert clients.produce_refusal({"bootstrap.servers": "b:9092"}) is None
    assert clients.produce_refusal({"security.protocol": "SSL"}) is None
    scram = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}
    assert clients.produce_refusal(scram) is None
    assert clients.produce_refusal({**scram, "sasl.mechanism": "PLAIN"}) is None
    # librdkafka's default mechanism is GSSAPI, which the wire path does not speak.
    assert "GSSAPI" in (clients.produce_refusal({"security.protocol": "SASL_SSL"}) or "")
    why = clients.produce_refusal
    assert "OAUTHBEARER" in (why({**scram, "sasl.mechanism": "OAUTHBEARER"}) or "")
    assert "compression.type=lz4" in (why({"compression.type": "lz4"}) or "")
    assert "ssl.keystore.location" in (
        why({"security.protocol": "ssl", "ssl.keystore.location": "k.p12"}) or "")


def test_settings_read_the_librdkafka_configuration():
    s = Settings.of({"bootstrap.servers": "a:1, PLAINTEXT://b:2,[::1]:3",
                          "message.max.bytes": "5000", "transaction.timeout.ms": "90000"})
    assert s.bootstrap == (("a", 1), ("b", 2), ("::1", 3))
    assert (s.max_batch_bytes, s.transaction_timeout_ms, s.ssl_context) == (5000, 90000, None)


def test_settings_never_show_the_password():
    s = Settings.of({"bootstrap.servers": "a:1", "security.protocol": "SASL_PLAINTEXT",
                          "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
                          "sasl.password": "s3cret-pw"})
    assert s.login is not None and s.login.mechanism == "SCRAM-SHA-256"
    assert "s3cret-pw" not in repr(s)


def test_scram_proof_matches_rfc_7677():
    """RFC 7677's SCRAM-SHA-256 example, with its client nonce, against our client."""
    from connectors.kafka.wire import sasl as wire_sasl

    sent: list[bytes] = []
    server_first = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")

    def step(payload: bytes) -> bytes:
        sent.append(payload)
        return server_first if len(sent) == 1 else b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

    login = wire_sasl.Login("SCRAM-SHA-256", "user", "pencil")
    with mock.patch.object(wire_sasl.os, "urandom",
                           return_value=base64.b64decode("rOprNGfwEbeRWgbNEkqO")):
        wire_sasl._scram(step, login)
    assert sent[0] == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert sent[1] == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                       b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")


def test_a_connection_that_breaks_mid_request_names_the_broker_and_the_request():
    """A listener that accepts and closes at once: the request's outcome is unknown, so the
    error says which broker, which request and how many are unanswered, and the connection
    is closed for good (a retriable NETWORK_EXCEPTION: the producer connects again)."""
    import socket
    import threading

    from connectors.core.errors import ConnectorError

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def accept_and_close() -> None:
        conn, _ = server.accept()
        conn.close()

    threading.Thread(target=accept_and_close, daemon=True).start()
    settings = Settings.of({"bootstrap.servers": f"127.0.0.1:{port}"})
    conn = wire_protocol.Connection("127.0.0.1", port, settings)
    try:
        with pytest.raises(ConnectorError, match=rf"broker 127.0.0.1:{port} broke during "
                                                 r"InitProducerId.*1 requests unanswered") as e:
            conn.call(wire_protocol.INIT_PRODUCER_ID, b"\xff\xff\x00\x00\x00\x00")
        assert isinstance(e.value, wire_protocol.ConnectionLost)
        assert e.value.code in wire_protocol.RETRIABLE
        assert conn.broken
        with pytest.raises(wire_protocol.ConnectionLost, match="already closed"):
            conn.send(wire_protocol.METADATA, [b""])
    finally:
        conn.close()
        server.close()
