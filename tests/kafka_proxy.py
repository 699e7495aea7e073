"""A loopback TCP proxy that reads Kafka's framing, to make one request late or one answer
lost, as a slow network, a broker in a GC pause or a dropped packet does.

Every client connection gets its own upstream connection to ``target_port``; the proxy
forwards bytes unchanged and reads each frame's header on the way (size, API key, version,
correlation id). A :class:`Fault` picks requests (``api`` and ``min_size``) and does one of:

- ``hold``: the request (and everything after it on that connection, as TCP would) reaches
  the broker ``seconds`` late. A client that gives up and closes meanwhile does not stop
  it: the held bytes are still delivered, then the upstream connection is closed (if the
  broker closed it meanwhile, idle, they go on a new connection of their own). This is
  the late Produce of issue 34.
- ``drop_answer``: the request is delivered, its answer never reaches the client (the
  connection stays open: the client sees only its own timeout).
- ``reset``: half of the request is delivered, then both connections are reset.

Brokers advertise the proxy's port (``advertised_port``) so every connection a client makes
goes through it. It listens on 127.0.0.1; the broker may be on a host of its own
(``target_host``: a network namespace's address, tests/services/netns.py).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from tests.tcp_proxy import TcpProxy, _hard_close

PRODUCE, FETCH, METADATA, INIT_PRODUCER_ID, END_TXN = 0, 1, 3, 22, 26


@dataclass
class Fault:
    """What to do to the next ``times`` requests of ``api`` at least ``min_size`` bytes."""

    action: str  # "hold" | "drop_answer" | "reset"
    api: int = PRODUCE
    min_size: int = 0
    seconds: float = 0.0
    times: int = 1
    fired: list[float] = field(default_factory=list)  # when each firing began
    delivered: list[float] = field(default_factory=list)  # when held requests went on

    def matches(self, api: int, size: int) -> bool:
        return len(self.fired) < self.times and api == self.api and size >= self.min_size

    def settled(self, timeout: float) -> bool:
        """Wait until every held request went on to the broker (True), then give the broker
        a moment to append it; False if that did not happen within ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.action == "hold" and len(self.delivered) < len(self.fired):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        time.sleep(1.0)
        return True


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: KafkaProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.dropped_ids: set[int] = set()
        self.lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._requests, daemon=True).start()
        threading.Thread(target=self._answers, daemon=True).start()

    def _requests(self) -> None:
        """Client -> broker, frame by frame; closes upstream when the client is done and
        every held request has been delivered."""
        try:
            while True:
                head = _read(self.client, 4)
                if head is None:
                    break
                size = struct.unpack(">i", head)[0]
                first = _read(self.client, min(size, 8))
                if first is None:
                    break
                api, _version, corr = struct.unpack(">hhi", first.ljust(8, b"\0"))
                fault = self.proxy.fault_for(api, size + 4)
                if fault is not None and fault.action == "reset":
                    rest = _read(self.client, max(0, size - len(first))) or b""
                    frame = head + first + rest
                    self.upstream.sendall(frame[: len(frame) // 2])
                    time.sleep(0.05)
                    self.close()
                    return
                if fault is not None and fault.action == "drop_answer":
                    with self.lock:
                        self.dropped_ids.add(corr)
                if fault is not None and fault.action == "hold":
                    # Read the whole request first (the client's send completes), then sit.
                    rest = _read(self.client, max(0, size - len(first))) or b""
                    time.sleep(fault.seconds)
                    try:
                        self.upstream.sendall(head + first + rest)
                    except OSError:
                        # The broker closed the connection while it sat idle
                        # (connections.max.idle.ms shorter than the hold, as on the cluster
                        # tier): the late copy still reaches it, on a connection of its own.
                        _deliver_alone(self.proxy.target, head + first + rest)
                        fault.delivered.append(time.monotonic())
                        break
                    fault.delivered.append(time.monotonic())
                    continue
                self.upstream.sendall(head + first)
                left = size - len(first)
                while left > 0:
                    chunk = self.client.recv(min(left, 1 << 16))
                    if not chunk:
                        raise ConnectionError("client closed mid-request")
                    self.upstream.sendall(chunk)
                    left -= len(chunk)
        except OSError:
            pass
        # The client is gone (or sent everything): the broker still gets what was sent.
        with contextlib.suppress(OSError):
            self.upstream.shutdown(socket.SHUT_WR)
        time.sleep(0.5)
        self.close()

    def _answers(self) -> None:
        """Broker -> client, frame by frame, leaving out dropped answers."""
        try:
            while True:
                head = _read(self.upstream, 4)
                if head is None:
                    break
                size = struct.unpack(">i", head)[0]
                body = _read(self.upstream, size)
                if body is None:
                    break
                corr = struct.unpack_from(">i", body)[0]
                with self.lock:
                    drop = corr in self.dropped_ids
                    self.dropped_ids.discard(corr)
                if not drop:
                    try:
                        self.client.sendall(head + body)
                    except OSError:
                        continue  # the client left: keep reading so the broker can finish
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self.client.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.proxy.forget(self.client, self.upstream)
        _hard_close(self.client)
        _hard_close(self.upstream)


class KafkaProxy(TcpProxy):
    """A proxy in front of one broker port; ``faults`` act on the requests passing
    (``drop_all`` and ``pause`` work as :class:`~tests.tcp_proxy.TcpProxy`'s)."""

    def __init__(self, target_port: int, listen_port: int = 0,
                 target_host: str = "127.0.0.1") -> None:
        super().__init__(target_port, listen_port, target_host)
        self.faults: list[Fault] = []

    def start(self) -> KafkaProxy:
        super().start()
        return self

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def fault_for(self, api: int, size: int) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.matches(api, size):
                    f.fired.append(time.monotonic())
                    return f
        return None

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _Link(self, client, upstream).start()

    def __enter__(self) -> KafkaProxy:
        return self.start()


def _deliver_alone(target: tuple[str, int], frame: bytes) -> None:
    """Send one request on a new connection and wait for its answer (so the broker has
    handled it), then close."""
    with socket.create_connection(target, timeout=30) as late:
        late.sendall(frame)
        head = _read(late, 4)
        if head is not None:
            _read(late, struct.unpack(">i", head)[0])


def _read(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or None at a clean end of stream before the first byte."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if not buf:
                return None
            raise ConnectionError("connection closed mid-frame")
        buf += chunk
    return bytes(buf)
