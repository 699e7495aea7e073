"""A loopback TCP proxy in front of PostgreSQL or MariaDB that can hold one COMMIT, or its
answer: the two halves of "the connection died during COMMIT".

Every client connection gets its own upstream connection; bytes pass unchanged. The proxy
recognises a transaction's ``COMMIT`` in the client's stream (psycopg sends it as a simple
``Query`` message, pymysql as ``COM_QUERY``) and, when a :class:`CommitFault` is armed, does
one of:

- ``hold_commit``: the COMMIT does not reach the server until :meth:`CommitFault.release`.
  Meanwhile the client waits for its answer and the test ends the session on the server
  (``pg_terminate_backend``, ``KILL CONNECTION``): the server rolls the transaction back,
  the client reads the end of its session where it expected the COMMIT's answer.
- ``hold_answer``: the COMMIT goes on; the server's answer (the transaction is committed)
  is held. The test ends the session on the server, then :meth:`CommitFault.release`
  drops the answer and resets the client's connection: the server committed and the
  client cannot know it.

In both the client sees the same thing, an error while it waited for the COMMIT's answer;
only the server knows the outcome. ``arm(action, statement="COMMIT PREPARED")`` holds a
PostgreSQL ``COMMIT PREPARED '<gid>'`` instead (a simple Query message that starts with it):
a killed session does not end a prepared transaction, so with ``hold_commit`` it is still
prepared afterwards, and with ``hold_answer`` committed.

``CommitFault.port`` is the proxy's local port of the upstream connection, which the server
shows as the session's client port (``pg_stat_activity.client_port``, the processlist's
``host``): the session to end.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

from tests.tcp_proxy import TcpProxy, _hard_close

#: How each protocol sends a plain ``COMMIT``: PostgreSQL's simple Query message ('Q', its
#: length 11, the text and NUL); MySQL's packet header (payload length 7, sequence 0) and
#: COM_QUERY (3).
COMMIT_BYTES = {
    "postgresql": b"Q\x00\x00\x00\x0bCOMMIT\x00",
    "mysql": b"\x07\x00\x00\x00\x03COMMIT",
}


@dataclass
class CommitFault:
    """One armed fault on the next COMMIT any connection sends."""

    action: str  # "hold_commit" | "hold_answer"
    #: set when the COMMIT is held (hold_commit) or its answer is (hold_answer)
    held: threading.Event = field(default_factory=threading.Event)
    _go: threading.Event = field(default_factory=threading.Event)
    #: the upstream connection's local port: the server's name for the session
    port: int = 0

    def wait_held(self, timeout: float = 60.0) -> int:
        if not self.held.wait(timeout):
            raise AssertionError(f"no COMMIT reached the proxy within {timeout}s ({self.action})")
        return self.port

    def release(self) -> None:
        self._go.set()


class _Link:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.answer_fault: CommitFault | None = None


class SqlProxy(TcpProxy):
    """``SqlProxy(server_port, "postgresql" | "mysql")``; :meth:`arm` the next COMMIT."""

    def __init__(self, target_port: int, protocol: str) -> None:
        super().__init__(target_port)
        self.protocol = protocol
        self.commit_bytes = COMMIT_BYTES[protocol]
        self._fault: CommitFault | None = None
        self._match = self.commit_bytes
        self._fault_lock = threading.Lock()

    def arm(self, action: str, statement: str = "COMMIT") -> CommitFault:
        if action not in ("hold_commit", "hold_answer"):
            raise ValueError(f"unknown COMMIT fault {action!r}")
        if statement != "COMMIT" and self.protocol != "postgresql":
            raise ValueError(f"{statement!r}: only PostgreSQL's COMMIT PREPARED is known")
        fault = CommitFault(action)
        with self._fault_lock:
            self._fault = fault
            # The statement's text, as a simple Query message carries it.
            self._match = (self.commit_bytes if statement == "COMMIT"
                           else statement.encode() + b" '")
        return fault

    def _take_fault(self, data: bytes) -> CommitFault | None:
        with self._fault_lock:
            fault = self._fault
            if fault is None or self._match not in data:
                return None
            self._fault = None
            return fault

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        link = _Link(client, upstream)
        threading.Thread(target=self._to_server, args=(link,), daemon=True).start()
        threading.Thread(target=self._to_client, args=(link,), daemon=True).start()

    def _to_server(self, link: _Link) -> None:
        try:
            while True:
                data = link.client.recv(65536)
                if not data:
                    break
                fault = self._take_fault(data)
                if fault is not None:
                    fault.port = link.upstream.getsockname()[1]
                    if fault.action == "hold_commit":
                        fault.held.set()
                        fault._go.wait(120)
                    else:
                        link.answer_fault = fault  # before the COMMIT can be answered
                link.upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._close(link)

    def _to_client(self, link: _Link) -> None:
        try:
            while True:
                data = link.upstream.recv(65536)
                if not data:
                    break
                fault = link.answer_fault
                if fault is not None:
                    # The server answered the COMMIT: it is committed. The answer is lost.
                    fault.held.set()
                    fault._go.wait(120)
                    break
                link.client.sendall(data)
        except OSError:
            pass
        finally:
            self._close(link)

    def _close(self, link: _Link) -> None:
        self.forget(link.client, link.upstream)
        for sock in (link.client, link.upstream):
            # The other direction's thread may be blocked in recv() on this socket, which
            # keeps close() from tearing it down: shutdown() ends it for both.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            _hard_close(sock)
