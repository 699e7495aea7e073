"""The wire client's connection discipline (connectors/kafka/wire/protocol.py) against a
scripted peer on loopback: answers matched by correlation id, a connection closed for good
on anything out of protocol, the frame size limit; SCRAM's iteration bounds, the session
lifetime, the settings it honours or routes to librdkafka, and exclusive leases of a
producer that is not thread-safe. The client's behaviour against real brokers is in the
cluster tier (tests/integration/cluster_kafka: late and lost answers through a proxy per
node, node kills) and tests/integration/test_kafka_late_answers.py (other broker versions)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

import pytest

from connectors.kafka import clients
from connectors.kafka.common import ClientCache
from connectors.kafka.wire import protocol as wire_protocol
from connectors.kafka.wire import sasl as wire_sasl
from connectors.kafka.wire.protocol import Connection, ConnectionLost
from connectors.kafka.wire.settings import Settings


def _peer(script: Callable[[socket.socket], None]) -> tuple[int, threading.Thread]:
    """A one-connection server on loopback that runs ``script(conn)``."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def run() -> None:
        conn, _ = server.accept()
        try:
            script(conn)
        finally:
            conn.close()
            server.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return port, t


def _read_request(conn: socket.socket) -> int:
    """Read one request frame; its correlation id."""
    size = struct.unpack(">i", _exactly(conn, 4))[0]
    body = _exactly(conn, size)
    return int(struct.unpack_from(">i", body, 4)[0])


def _exactly(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _answer(correlation: int, payload: bytes) -> bytes:
    body = struct.pack(">i", correlation) + payload
    return struct.pack(">i", len(body)) + body


def _settings(**conf: str) -> Settings:
    return Settings.of({"bootstrap.servers": "127.0.0.1:1", **conf})


def test_answers_are_matched_by_correlation_id_not_by_order():
    """Two pipelined requests; the caller asks for the second answer first: the first answer
    is kept for its own receive, and each caller reads its own bytes."""
    got = threading.Event()

    def script(conn: socket.socket) -> None:
        first, second = _read_request(conn), _read_request(conn)
        conn.sendall(_answer(first, b"one") + _answer(second, b"two"))
        got.wait(5)

    port, t = _peer(script)
    c = Connection("127.0.0.1", port, _settings())
    a = c.send(wire_protocol.PRODUCE, [b"x"])
    b = c.send(wire_protocol.END_TXN, [b"y"])
    assert bytes(c.receive(b).data[4:]) == b"two"
    assert bytes(c.receive(a).data[4:]) == b"one"
    assert not c.pending
    got.set()
    c.close()
    t.join(5)


def test_an_answer_to_no_waiting_request_closes_the_connection_for_good():
    def script(conn: socket.socket) -> None:
        corr = _read_request(conn)
        conn.sendall(_answer(corr + 7, b"stale"))

    port, t = _peer(script)
    c = Connection("127.0.0.1", port, _settings())
    with pytest.raises(ConnectionLost, match=r"not waiting.*1 requests unanswered"):
        c.call(wire_protocol.END_TXN, b"x")
    assert c.broken
    with pytest.raises(ConnectionLost):
        c.call(wire_protocol.END_TXN, b"x")
    t.join(5)


def test_a_frame_above_receive_message_max_bytes_is_refused_not_allocated():
    def script(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(struct.pack(">i", 2_000_000_000))

    port, t = _peer(script)
    c = Connection("127.0.0.1", port, _settings(**{"receive.message.max.bytes": "1000000"}))
    with pytest.raises(ConnectionLost, match=r"2000000000 bytes.*receive.message.max.bytes"):
        c.call(wire_protocol.METADATA, b"x")
    t.join(5)


def test_an_answer_that_never_comes_times_out_after_the_socket_timeout():
    release = threading.Event()

    def script(conn: socket.socket) -> None:
        _read_request(conn)
        release.wait(10)

    port, t = _peer(script)
    c = Connection("127.0.0.1", port, _settings(**{"socket.timeout.ms": "300",
                                                     "request.timeout.ms": "100"}))
    c.sock.settimeout(0.3)  # the floor (request.timeout.ms + 5 s) would make this test slow
    with pytest.raises(ConnectionLost, match="timed out"):
        c.call(wire_protocol.PRODUCE, b"x")
    release.set()
    t.join(5)


@pytest.mark.parametrize("peer_does", ["closes", "resets", "writes unasked", "stays"])
def test_an_idle_connection_the_broker_closed_is_found_before_a_request_goes_into_it(peer_does):
    """A broker closes idle connections (``connections.max.idle.ms``, a restart): the next
    look-up must open a new one, not send into the dead one and spend a retry (and, under a
    backoff longer than the idle limit, every retry) on it."""
    connected, done = threading.Event(), threading.Event()

    def script(conn: socket.socket) -> None:
        connected.wait(5)  # the client's connection is set up before the peer acts
        if peer_does == "resets":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif peer_does == "writes unasked":
            conn.sendall(b"\0")
        if peer_does == "stays":
            done.wait(5)

    port, t = _peer(script)
    c = Connection("127.0.0.1", port, _settings())
    connected.set()
    if peer_does != "stays":
        t.join(5)
    assert c.usable() is (peer_does == "stays")
    assert c.broken is (peer_does != "stays")
    done.set()
    c.close()
    t.join(5)


def test_settings_wait_longer_than_the_broker_may_take_and_keep_librdkafkas_defaults():
    s = _settings()
    assert (s.request_timeout, s.socket_timeout, s.delivery_timeout) == (30.0, 60.0, 300.0)
    s = _settings(**{"request.timeout.ms": "90000", "socket.timeout.ms": "10000",
                     "message.timeout.ms": "120000"})
    assert s.socket_timeout > s.request_timeout
    assert s.delivery_timeout == 120.0
    assert _settings(**{"delivery.timeout.ms": "50000"}).delivery_timeout == 50.0


@pytest.mark.parametrize("key, value", [
    ("ssl.curves.list", "P-256"), ("ssl.sigalgs.list", "RSA+SHA256"),
    ("ssl.ca.certificate.stores", "Root"), ("broker.address.family", "v6"),
    ("socket.nagle.disable", "false"), ("client.dns.lookup", "use_all_dns_ips"),
    ("connections.max.idle.ms", "1000"), ("ssl.crl.location", "/x"),
])
@pytest.mark.c_extensions
def test_a_connection_setting_the_wire_path_does_not_honour_routes_to_librdkafka(key, value):
    why = clients.produce_refusal({"bootstrap.servers": "b:9092", key: value})
    assert why is not None and key in why and "does not honour" in why


@pytest.mark.c_extensions
def test_honoured_settings_keep_the_wire_path():
    conf = {"bootstrap.servers": "b:9092", "socket.timeout.ms": "1000",
            "message.timeout.ms": "1000", "socket.keepalive.enable": "true",
            "broker.address.family": "v4", "linger.ms": "5", "batch.size": "100"}
    assert clients.produce_refusal(conf) is None


def test_a_ca_directory_and_probe_build_a_tls_context(tmp_path):
    for ca in (str(tmp_path), "probe"):
        s = _settings(**{"security.protocol": "ssl", "ssl.ca.location": ca,
                         "ssl.cipher.suites": "ECDHE+AESGCM"})
        assert s.ssl_context is not None


@pytest.mark.parametrize("iterations", ["1", "4095", "16385", "2147483648", "x"])
def test_scram_refuses_iteration_counts_no_kafka_broker_asks_for(iterations):
    login = wire_sasl.Login("SCRAM-SHA-256", "user", "secret-password")
    nonce_box: list[str] = []

    def step(payload: bytes) -> bytes:
        nonce = payload.decode().split("r=", 1)[1]
        nonce_box.append(nonce)
        return f"r={nonce}srv,s=c2FsdA==,i={iterations}".encode()

    with pytest.raises(wire_sasl.SaslFailed, match="SCRAM iterations") as e:
        wire_sasl._scram(step, login)
    assert "secret-password" not in str(e.value)
    assert len(nonce_box) == 1  # refused before any proof was sent


def test_authenticate_returns_the_session_lifetime():
    class Answer:
        def __init__(self, payload: bytes) -> None:
            self.data, self.at = memoryview(payload), 0

        def take(self, fmt: str):
            out = struct.unpack_from(fmt, self.data, self.at)
            self.at += struct.calcsize(fmt)
            return out if len(out) > 1 else out[0]

        def string(self):
            n = self.take(">h")
            if n < 0:
                return None
            s = bytes(self.data[self.at:self.at + n]).decode()
            self.at += n
            return s

        def array(self, item):
            return [item() for _ in range(self.take(">i"))]

    def call(api: int, body: bytes) -> Answer:
        if api == wire_sasl.SASL_HANDSHAKE:
            return Answer(struct.pack(">hi", 0, 1) + struct.pack(">h", 5) + b"PLAIN")
        return Answer(struct.pack(">hhiq", 0, -1, 0, 3_600_000))

    assert wire_sasl.authenticate(call, wire_sasl.Login("PLAIN", "u", "p")) == 3_600_000


def test_an_exclusive_cache_never_hands_one_client_to_two_holders():
    made: list[object] = []

    def make() -> object:
        made.append(object())
        return made[-1]

    cache: ClientCache[object] = ClientCache("test", 4, lambda c: None, exclusive=True)
    first = cache.acquire("k", make)
    second = cache.acquire("k", make)
    assert first.client is not second.client
    first.release()
    third = cache.acquire("k", make)
    assert third.client is first.client  # given back, so reused
    second.release()
    third.release()
    assert len(made) == 2
