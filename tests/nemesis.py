"""Faults a test does to a service the connectors use: one vocabulary for every tier.

A :class:`Nemesis` (Jepsen's name for the fault injector) acts on one service: a
database server today, a Kafka broker or a storage server later. Each verb is one fault,
done on the real service, and returns when the fault has happened:

- ``kill()``: the server ends its clients' sessions (``pg_terminate_backend``,
  ``KILL CONNECTION``); the server itself stays up;
- ``crash()``: SIGKILL every process of the server, then start it again (crash recovery);
- ``down(seconds)``: a clean stop, that long down, then a start (a maintenance restart or a
  failover as the clients see it);
- ``pause(seconds)``, ``cut()``, ``fill()``, ``throttle()``, ``drop_answer()``: SIGSTOP,
  a network cut, a full disk, a slow or refusing server, a lost answer. A service that
  cannot suffer one raises :class:`Unsupported`; the databases' network faults are the
  :class:`~tests.sql_proxy.SqlProxy` in front of them.

Storage adds its own (:class:`DiskNemesis`, :class:`SeaweedNemesis`, :class:`HdfsNemesis`):
``fill()``/``free()`` a small tmpfs the test mounts (as root) to the last byte, and remount it
read-only; ``crash()``/``down()`` the S3 server or one HDFS daemon on the same ports and data;
``throttle()`` (503 SlowDown, 500, resets, 10 s delays) and ``drop_answer()`` through the
:class:`~tests.http_proxy.HttpProxy` in front of a store.

Database servers add the faults of concurrent sessions: :meth:`DatabaseNemesis.row_lock`
(another session holds rows), :meth:`DatabaseNemesis.session` (a second writer, for a
deadlock or a concurrent update).

The servers are the throwaway ones of ``tests/services`` (:class:`TempPostgres`,
:class:`TempMariaDB`): a fault test owns its server and disturbs no other test.

:class:`HeldStep` lands a fault at one step of a protocol: it runs the step on a thread
with a ``pause`` failpoint armed (``connectors/core/failpoints.py``), waits until the step
stands at the point, lets the test act (kill the connection, lock a row, update behind the
step's snapshot), then lets the step go on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from connectors.core import failpoints
from connectors.core.retry import poll_until


class Unsupported(NotImplementedError):
    """This service cannot suffer this fault (yet)."""


class Nemesis:
    """The faults of one service. Subclasses implement what their service can suffer."""

    #: the service, in messages: ``postgresql``, ``mariadb``, ``kafka``, ``s3``...
    name = "service"

    def kill(self) -> int:
        """The server ends every client session; returns how many it ended."""
        raise Unsupported(f"{self.name}: kill")

    def crash(self) -> None:
        """SIGKILL the server, then start it again."""
        raise Unsupported(f"{self.name}: crash")

    def stop(self) -> None:
        """Stop the server cleanly."""
        raise Unsupported(f"{self.name}: stop")

    def start(self) -> None:
        """Start the server; return when it answers."""
        raise Unsupported(f"{self.name}: start")

    def halt(self) -> None:
        """SIGKILL the server and leave it down (the machine losing it)."""
        raise Unsupported(f"{self.name}: halt")

    def down(self, seconds: float, *, kill: bool = False) -> float:
        """Stop cleanly (SIGKILL it with ``kill``), stay down ``seconds`` (the fault's
        length), start; returns the seconds it was down, until it answered again."""
        if kill:
            self.halt()
        else:
            self.stop()
        began = time.monotonic()
        # The outage's length is the fault itself, not a wait for a condition.
        poll_until(lambda: time.monotonic() - began >= seconds, timeout=seconds + 1,
                   interval=0.2)
        self.start()
        return time.monotonic() - began

    def pause(self, seconds: float) -> None:
        raise Unsupported(f"{self.name}: pause")

    def cut(self) -> int:
        raise Unsupported(f"{self.name}: cut")

    def fill(self) -> None:
        raise Unsupported(f"{self.name}: fill")

    def free(self) -> None:
        """Undo :meth:`fill`."""
        raise Unsupported(f"{self.name}: free")

    def throttle(self, share: float) -> None:
        raise Unsupported(f"{self.name}: throttle")

    def drop_answer(self, what: str) -> Any:
        raise Unsupported(f"{self.name}: drop_answer")


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid``, from /proc."""
    by_parent: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            by_parent.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _sigkill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant at once (a machine losing the server), and
    wait until they are gone."""
    pids = [pid, *_children(pid)]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)

    def gone() -> bool:
        for p in pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(p, os.WNOHANG)  # reap the ones that are our children
            if os.path.exists(f"/proc/{p}"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        return False
        return True

    if not poll_until(gone, timeout=30, interval=0.05):
        raise AssertionError(f"server processes {pids} outlived SIGKILL")


class DatabaseNemesis(Nemesis):
    """A database server's faults, and sessions of its own to act with (as an operator
    or another application would)."""

    def admin(self) -> Any:
        """A new autocommit DB-API connection as the server's superuser."""
        raise NotImplementedError

    def sessions(self) -> list[tuple[int, int]]:
        """``(session id, client port)`` of every client session but the admin's."""
        with contextlib.closing(self.admin()) as admin:
            return self._sessions(admin)

    def end_session(self, admin: Any, session: int) -> None:
        raise NotImplementedError

    def kill(self, port: int | None = None) -> int:
        """End every client session (or the one whose client port is ``port``: a
        :class:`~tests.sql_proxy.SqlProxy` upstream) from the server side."""
        with contextlib.closing(self.admin()) as admin:
            ended = 0
            for session, client_port in self._sessions(admin):
                if port is None or client_port == port:
                    self.end_session(admin, session)
                    ended += 1
        return ended

    def _sessions(self, admin: Any) -> list[tuple[int, int]]:
        raise NotImplementedError

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        """A second writer: a DB-API connection in manual-commit mode, rolled back and
        closed at the end."""
        conn = self.admin()
        self._manual(conn)
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                conn.rollback()
            with contextlib.suppress(Exception):
                conn.close()

    def _manual(self, conn: Any) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def row_lock(self, table: str, column: str, value: Any) -> Iterator[Any]:
        """Another session holds the rows of ``table`` where ``column = value`` (``SELECT
        ... FOR UPDATE``) until the block ends; yields that session."""
        with self.session() as conn:
            cur = conn.cursor()
            cur.execute(f"SELECT * FROM {table} WHERE {column} = %s FOR UPDATE",  # noqa: S608
                        (value,))
            cur.fetchall()
            yield conn

    def waiting(self) -> int:
        """How many client sessions wait for a lock now."""
        raise NotImplementedError


class PostgresNemesis(DatabaseNemesis):
    """Faults of a :class:`~tests.services.postgres.TempPostgres`."""

    name = "postgresql"

    def __init__(self, server: Any) -> None:
        self.server = server

    def admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.server.dsn, autocommit=True, connect_timeout=5)

    def _manual(self, conn: Any) -> None:
        conn.autocommit = False

    def _sessions(self, admin: Any) -> list[tuple[int, int]]:
        rows = admin.execute(
            "SELECT pid, coalesce(client_port, -1) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall()
        return [(int(p), int(port)) for p, port in rows]

    def end_session(self, admin: Any, session: int) -> None:
        # With a timeout, pg_terminate_backend returns once the backend has exited.
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", (session,))

    def waiting(self) -> int:
        with contextlib.closing(self.admin()) as admin:
            row = admin.execute("SELECT count(*) FROM pg_stat_activity "
                                "WHERE wait_event_type = 'Lock'").fetchone()
        return int(row[0]) if row else 0

    def _postmaster(self) -> int:
        with open(os.path.join(self.server.data, "postmaster.pid")) as f:
            return int(f.readline())

    def crash(self) -> None:
        _sigkill_tree(self._postmaster())
        # As after a machine's crash, no process of the old server is left. Until init
        # reaps it, the postmaster is a zombie whose pid, in the lock files, a new
        # postmaster takes for a live server: remove them, as the reboot would have.
        for lock in (os.path.join(self.server.data, "postmaster.pid"),
                     os.path.join(self.server.base, f".s.PGSQL.{self.server.port}.lock")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock)
        self.start()

    def stop(self) -> None:
        self.server.stop("fast")

    def start(self) -> None:
        self.server.start()


class MariaDbNemesis(DatabaseNemesis):
    """Faults of a :class:`~tests.services.mariadb.TempMariaDB`."""

    name = "mariadb"

    def __init__(self, server: Any) -> None:
        self.server = server

    def admin(self) -> Any:
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.server.port, user="root",
                               database="test", autocommit=True, connect_timeout=5)

    def _manual(self, conn: Any) -> None:
        conn.autocommit(False)

    def _sessions(self, admin: Any) -> list[tuple[int, int]]:
        cur = admin.cursor()
        cur.execute("SELECT id, host FROM information_schema.processlist "
                    "WHERE id <> connection_id() AND command <> 'Daemon' "
                    "AND user <> 'system user'")
        out = []
        for session, host in cur.fetchall():
            port = host.rsplit(":", 1)[1] if host and ":" in host else "-1"
            out.append((int(session), int(port) if port.isdigit() else -1))
        return out

    def end_session(self, admin: Any, session: int) -> None:
        import pymysql

        with contextlib.suppress(pymysql.err.OperationalError):  # 1094: already gone
            admin.cursor().execute(f"KILL CONNECTION {int(session)}")

    def waiting(self) -> int:
        with contextlib.closing(self.admin()) as admin:
            cur = admin.cursor()
            cur.execute("SELECT count(*) FROM information_schema.innodb_trx "
                        "WHERE trx_state = 'LOCK WAIT'")
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def crash(self) -> None:
        proc = self.server._proc
        if proc is None:
            raise AssertionError("mariadbd is not running")
        _sigkill_tree(proc.pid)
        proc.wait(30)
        self.server._proc = None
        self.start()

    def stop(self) -> None:
        proc = self.server._proc
        if proc is None:
            return
        proc.terminate()  # SIGTERM: mariadbd shuts down cleanly
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        self.server._proc = None

    def start(self) -> None:
        self.server.start()


class HeldStep:
    """``call()`` on a thread, held at the failpoint ``point`` (``name@batch``) until
    :meth:`go`: ``with HeldStep(point, tmp_dir).start(call) as step: step.reached(); <fault>;
    step.go(); step.result()``. The point fires once (a retry passes it)."""

    def __init__(self, point: str, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.spec = f"{point}!pause"
        self.directory = directory
        (parsed,) = [s for specs in failpoints.parse(self.spec).values() for s in specs]
        self._reached, self._go = failpoints.pause_paths(parsed.key, directory)
        self._saved: dict[str, str | None] = {}
        self._out: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    def start(self, call: Callable[[], Any]) -> HeldStep:
        for name, value in ((failpoints.ENV, self.spec),
                            (failpoints.ENV_PAUSE_DIR, self.directory),
                            (failpoints.ENV_ONCE_DIR, self.directory)):
            self._saved[name] = os.environ.get(name)
            os.environ[name] = value
        failpoints.reload()

        def run() -> None:
            try:
                self._out["value"] = call()
            except BaseException as e:  # noqa: BLE001 - handed to result()
                self._out["error"] = e

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def reached(self, timeout: float = 60.0) -> None:
        """Return once the step stands at the point; fail if it ended first."""
        thread = self._thread
        if thread is None:
            raise AssertionError("HeldStep.reached() before start()")

        def there() -> bool:
            return os.path.exists(self._reached) or not thread.is_alive()

        poll_until(there, timeout=timeout, interval=0.02)
        if not os.path.exists(self._reached):
            raise AssertionError(f"{self.spec} was never reached: {self._out}")

    def go(self) -> None:
        open(self._go, "w").close()

    def result(self, timeout: float = 180.0) -> Any:
        """The step's value (or its error, raised), once it ended."""
        self.go()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise AssertionError(f"the step held at {self.spec} did not end in {timeout}s")
        self._restore()
        if "error" in self._out:
            raise self._out["error"]
        return self._out.get("value")

    def _restore(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()
        failpoints.reload()

    def __enter__(self) -> HeldStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.go()
        if self._thread is not None:
            self._thread.join(60)
        self._restore()


# -- storage ----------------------------------------------------------------------------------
class DiskNemesis(Nemesis):
    """A tmpfs of ``size_mb`` the test mounts at ``directory`` (needs root: ``mount -t
    tmpfs``), filled to the last byte by :meth:`fill` and kept full (anything a writer frees
    is taken again at once, as a runaway log would) until :meth:`free`. Use it as a context
    manager: it is unmounted at the end, whatever happened."""

    name = "disk"

    def __init__(self, directory: str, size_mb: int = 16) -> None:
        self.directory = directory
        self.size_mb = size_mb
        self.filler = os.path.join(directory, ".filler")
        self._keep_full: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self.mounted = False

    def __enter__(self) -> DiskNemesis:
        os.makedirs(self.directory, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs",  # noqa: S607
                        self.directory], check=True, capture_output=True, timeout=30)
        self.mounted = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()
        if self.mounted:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(["umount", "-l", self.directory], check=True,  # noqa: S607
                               capture_output=True, timeout=30)
            self.mounted = False

    def free_bytes(self) -> int:
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize

    def _top_up(self) -> int:
        """Append to the filler until not one more byte fits; returns the bytes added."""
        added = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = 1 << 20
            while size >= 1:
                try:
                    added += os.write(fd, b"\0" * size)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    size //= 2
        finally:
            os.close(fd)
        return added

    def fill(self, leave: int = 0) -> int:
        """Fill the filesystem to the last byte (``leave``: that many bytes stay free, for a
        write to run out of space half-way) and keep it so until :meth:`free`; returns the
        filler's size."""
        self._top_up()
        if leave:
            os.truncate(self.filler, max(0, os.path.getsize(self.filler) - leave))
            return os.path.getsize(self.filler)
        stop = self._keep_full = threading.Event()

        def keep_full() -> None:
            while not stop.wait(0.02):
                with contextlib.suppress(OSError):
                    self._top_up()

        self._thread = threading.Thread(target=keep_full, daemon=True)
        self._thread.start()
        return os.path.getsize(self.filler)

    def free(self) -> None:
        if self._keep_full is not None:
            self._keep_full.set()
            if self._thread is not None:
                self._thread.join(10)
            self._keep_full = self._thread = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.filler)

    def read_only(self, on: bool = True) -> None:
        """Remount the filesystem read-only (``EROFS`` for every write), or back."""
        subprocess.run(["mount", "-o", f"remount,{'ro' if on else 'rw'}",  # noqa: S607
                        self.directory], check=True, capture_output=True, timeout=30)


class _ProxiedStore(Nemesis):
    """The network faults of a store with a :class:`~tests.http_proxy.HttpProxy` in front."""

    proxy: Any = None

    def _proxy(self) -> Any:
        if self.proxy is None:
            raise Unsupported(f"{self.name}: this fault needs an HttpProxy in front")
        return self.proxy

    def throttle(self, share: float, kinds: tuple[str, ...] = ("slowdown", "error", "reset"),
                 delay: float = 10.0) -> None:
        """``share`` of the requests answered with one of ``kinds`` (tests/http_proxy.py)."""
        self._proxy().faults(share, kinds, delay)

    def delay(self, n: int, seconds: float = 10.0) -> None:
        """The next ``n`` requests answered ``seconds`` late."""
        self._proxy().delay_next(n, seconds)

    def drop_answer(self, what: Any = None, how: str = "close") -> Any:
        """Lose the answer of the first request of each key that ``what`` matches (default:
        the conditional creates, ``If-None-Match: *``)."""
        proxy = self._proxy()
        if what is None:
            proxy.drop_answers(how=how)
        else:
            proxy.drop_answers(what, how=how)
        return proxy

    def cut(self) -> int:
        return int(self._proxy().drop_all())

    def calm(self) -> None:
        """No more proxy faults."""
        self._proxy().clear()


class SeaweedNemesis(_ProxiedStore):
    """The S3 server of :class:`~tests.services.s3.LocalSeaweed`, restarted on its port and
    data directory, and the :class:`~tests.http_proxy.HttpProxy` in front of it, if any."""

    name = "s3"

    def __init__(self, server: Any, proxy: Any = None) -> None:
        self.server = server
        self.proxy = proxy

    def crash(self) -> None:
        self.halt()
        self.start()

    def halt(self) -> None:
        self.server.halt(kill=True)

    def stop(self) -> None:
        self.server.halt()

    def start(self) -> None:
        self.server.start()


class HdfsNemesis(_ProxiedStore):
    """One daemon (``namenode`` or ``datanode``) of a :class:`~tests.services.hdfs.LocalHdfs`,
    restarted on its ports and data directories; a NameNode comes back in safe mode for
    ``safe_mode_seconds`` (what a production one does after a restart)."""

    def __init__(self, hdfs: Any, daemon: str, *, safe_mode_seconds: float = 0.0,
                 proxy: Any = None) -> None:
        self.hdfs = hdfs
        self.daemon = daemon
        self.name = f"hdfs {daemon}"
        self.safe_mode_seconds = safe_mode_seconds
        self.proxy = proxy

    def crash(self) -> None:
        self.hdfs.stop_daemon(self.daemon, kill=True)
        self.start()

    def stop(self) -> None:
        self.hdfs.stop_daemon(self.daemon)

    def start(self) -> None:
        self.hdfs.start_daemon(self.daemon, safe_mode_seconds=self.safe_mode_seconds)
