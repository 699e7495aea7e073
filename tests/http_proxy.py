"""A loopback HTTP/1.1 proxy in front of one server (an S3 server, a NameNode's WebHDFS),
which answers a share of the requests with a fault instead of the server, or loses the
server's answer.

Each client connection gets its own upstream connection, opened when its first request
arrives (a server that refuses makes the proxy reset the client: what a restart looks like
through a load balancer). Requests and responses are read whole (``Content-Length`` or
chunked bodies, keep-alive) and passed on unchanged, except where a fault is armed:

- :meth:`HttpProxy.faults` (``share``, ``kinds``): each request, with probability ``share``,
  gets one of

  - ``slowdown``: ``503 Slow Down`` with S3's ``SlowDown`` error body, the request not sent
    on (S3 throttling a hot prefix);
  - ``error``: ``500 Internal Server Error`` with ``InternalError``;
  - ``reset``: the client's connection reset (RST), the request not sent on;
  - ``delay``: the request held ``delay`` seconds (10 by default), then sent on.

  :meth:`HttpProxy.delay_next` delays the next ``n`` requests only (a few slow answers,
  without a share that would slow every batch down).
- :meth:`HttpProxy.drop_answers`: the request is sent on, the server's answer is read and
  thrown away, and the client's connection closed (``how="close"``: it sees the
  connection end where the answer should be) or reset (``how="reset"``). The server did
  the work; the client cannot know. ``first_per_key`` limits it to the first matching
  request of each path: its retry gets the real answer (for a conditional PUT: 412).

``stats`` counts what happened, by fault kind and by ``(method, status)`` of answers the
client got; ``log`` keeps ``(method, path, status or fault)`` of every request.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tests.tcp_proxy import LoopbackProxy, _hard_close

_SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message></Error>")
_INTERNAL = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InternalError</Code>"
             b"<Message>We encountered an internal error. Please try again.</Message></Error>")
KINDS = ("slowdown", "error", "reset", "delay")


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # lower-case names
    raw: bytes  # the request as received (head and body)

    @property
    def conditional_create(self) -> bool:
        return self.method == "PUT" and self.headers.get("if-none-match", "").strip() == "*"


@dataclass
class _Drop:
    match: Callable[[Request], bool]
    first_per_key: bool
    how: str
    seen: set[str] = field(default_factory=set)


class _Closed(Exception):
    """The peer closed the connection."""


class _Stream:
    """Buffered reads of HTTP messages from one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise _Closed()
        self.buf += data

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line + b"\r\n"

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def until_close(self) -> bytes:
        with contextlib.suppress(_Closed):
            while True:
                self._fill()
        out, self.buf = self.buf, b""
        return out

    def head(self) -> tuple[bytes, list[bytes], dict[str, str]]:
        """The start line, the raw header lines (with the blank line) and the headers."""
        first = self.line()
        while first == b"\r\n":  # stray blank lines between messages
            first = self.line()
        lines, headers = [], {}
        while True:
            line = self.line()
            lines.append(line)
            if line == b"\r\n":
                return first, lines, headers
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()

    def body(self, headers: dict[str, str], *, to_close: bool) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out = b""
            while True:
                size_line = self.line()
                out += size_line
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers, then the blank line
                        trailer = self.line()
                        out += trailer
                        if trailer == b"\r\n":
                            return out
                out += self.exactly(size + 2)
        if "content-length" in headers:
            return self.exactly(int(headers["content-length"]))
        return self.until_close() if to_close else b""


class HttpProxy(LoopbackProxy):
    """See the module docstring. ``seed`` makes the faults' draw repeatable."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1",
                 seed: int = 43) -> None:
        super().__init__(target_port, target_host, backlog=256)
        self._random = random.Random(seed)
        self._share = 0.0
        self._kinds: tuple[str, ...] = KINDS
        self._delay = 10.0
        self._delay_next = 0
        self._drop: _Drop | None = None
        self.stats: Counter[str] = Counter()
        self.log: list[tuple[str, str, str]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- the faults ----------------------------------------------------------------------------
    def faults(self, share: float, kinds: Sequence[str] = KINDS, delay: float = 10.0) -> None:
        """From now on, answer ``share`` of the requests with one of ``kinds``."""
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {KINDS}")
        with self._lock:
            self._share, self._kinds, self._delay = share, tuple(kinds), delay

    def delay_next(self, n: int, seconds: float = 10.0) -> None:
        """Hold each of the next ``n`` requests ``seconds`` before sending it on."""
        with self._lock:
            self._delay_next, self._delay = n, seconds

    def drop_answers(self, match: Callable[[Request], bool] = lambda r: r.conditional_create,
                     *, first_per_key: bool = True, how: str = "close") -> None:
        """Lose the server's answer to matching requests (see the module docstring)."""
        if how not in ("close", "reset"):
            raise ValueError(f"how must be 'close' or 'reset', not {how!r}")
        with self._lock:
            self._drop = _Drop(match, first_per_key, how)

    def clear(self) -> None:
        """No faults from now on (what was counted stays)."""
        with self._lock:
            self._share, self._delay_next, self._drop = 0.0, 0, None

    def _decide(self, request: Request) -> str | None:
        with self._lock:
            drop = self._drop
            if drop is not None and drop.match(request):
                if not drop.first_per_key or request.path not in drop.seen:
                    drop.seen.add(request.path)
                    return f"drop_answer_{drop.how}"
            if self._delay_next > 0:
                self._delay_next -= 1
                return "delay"
            if self._share and self._random.random() < self._share:
                return self._random.choice(self._kinds)
        return None

    # -- serving -------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        up: _Stream | None = None
        down = _Stream(client)
        try:
            while not self._stopped:
                first, lines, headers = down.head()
                body = down.body(headers, to_close=False)
                method, target, _ = first.decode("latin-1").split(" ", 2)
                path, _, query = target.partition("?")
                request = Request(method, path, query, headers, first + b"".join(lines) + body)
                fault = self._decide(request)
                if fault is not None:
                    self.stats[fault] += 1
                if fault in ("slowdown", "error"):
                    self._answer(client, 503 if fault == "slowdown" else 500,
                                 _SLOWDOWN if fault == "slowdown" else _INTERNAL)
                    self.log.append((method, path, fault))
                    continue
                if fault == "reset":
                    self.log.append((method, path, fault))
                    return
                if fault == "delay":
                    # The fault is the wait itself (a server slow to answer), not a poll.
                    time.sleep(self._delay)
                if upstream is None:
                    try:
                        upstream = socket.create_connection(self.target, timeout=5)
                    except OSError:
                        self.stats["upstream_refused"] += 1
                        self.log.append((method, path, "upstream_refused"))
                        return
                    upstream.settimeout(None)
                    with self._lock:
                        self._conns.add(upstream)
                    up = _Stream(upstream)
                assert up is not None
                upstream.sendall(request.raw)
                status_line, rlines, rheaders = up.head()
                status = status_line.split(b" ", 2)[1].decode()
                no_body = method == "HEAD" or status in ("204", "304") or status.startswith("1")
                closing = rheaders.get("connection", "").lower() == "close"
                rbody = b"" if no_body else up.body(rheaders, to_close=closing)
                if fault is not None and fault.startswith("drop_answer"):
                    self.log.append((method, path, f"{fault}:{status}"))
                    if fault.endswith("reset"):
                        return  # the finally resets
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_RDWR)
                    client.close()
                    return
                client.sendall(status_line + b"".join(rlines) + rbody)
                self.stats[f"{method} {status}"] += 1
                self.log.append((method, path, status))
                if closing:
                    return
        except (_Closed, OSError, ValueError):
            pass
        finally:
            for s in (client, upstream):
                if s is not None:
                    with self._lock:
                        self._conns.discard(s)
                    _hard_close(s)

    @staticmethod
    def _answer(client: socket.socket, status: int, body: bytes) -> None:
        reason = {503: "Slow Down", 500: "Internal Server Error"}[status]
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        client.sendall(head + body)
