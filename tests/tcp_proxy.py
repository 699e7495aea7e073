"""A loopback TCP proxy we control, to cut every connection between clients and a broker.

``drop_all()`` closes every open connection at once (both directions, RST-like), and
``pause(seconds)`` additionally refuses new connections for a while: a network partition
as clients see it. It listens on 127.0.0.1 (``target_host``: where the server is).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from typing import TypeVar

#: ``start`` and ``with`` give back the subclass (``typing.Self`` is Python 3.11+)
_P = TypeVar("_P", bound="LoopbackProxy")


class LoopbackProxy:
    """What every proxy of the tests shares: a listener on 127.0.0.1 (``listen_port`` 0: a
    free one), the open sockets to cut, ``start``/``stop`` and the context manager. A
    subclass writes ``_accept_loop``, registering the sockets it opens in ``_conns``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1",
                 listen_port: int = 0, backlog: int = 128) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(backlog)
        self.port: int = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    def start(self: _P) -> _P:
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        raise NotImplementedError

    def drop_all(self) -> int:
        """Reset every open connection (both sides); returns how many sockets were cut."""
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for s in conns:
            _hard_close(s)
        return len(conns)

    def stop(self) -> None:
        self._stopped = True
        _hard_close(self._listener)
        self.drop_all()

    def __enter__(self: _P) -> _P:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TcpProxy(LoopbackProxy):
    def __init__(self, target_port: int, listen_port: int = 0,
                 target_host: str = "127.0.0.1") -> None:
        super().__init__(target_port, target_host, listen_port)
        self._refuse_until = 0.0
        self.drops = 0
        self.accepted = 0

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                _hard_close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _hard_close(client)
                continue
            upstream.settimeout(None)
            self.accepted += 1
            with self._lock:
                self._conns.update((client, upstream))
            self._serve(client, upstream)

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        """Carry one accepted connection (a subclass may read what passes)."""
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def forget(self, *socks: socket.socket) -> None:
        with self._lock:
            self._conns.difference_update(socks)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with self._lock:
                    self._conns.discard(s)
                _hard_close(s)

    def drop_all(self) -> int:
        """Reset every open connection; returns how many sockets were cut."""
        self.drops += 1
        return super().drop_all()

    def pause(self, seconds: float) -> int:
        """Cut everything and refuse new connections for ``seconds``."""
        self._refuse_until = time.monotonic() + seconds
        return self.drop_all()


def _hard_close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        # SO_LINGER 0: close sends RST, as a dropped connection looks to the peer.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.close()
