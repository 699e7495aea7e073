"""A throwaway MariaDB server from the ``mariadb-install-db``/``mariadbd`` binaries on PATH.

Used by the ``mysql_url`` fixture when no ``MYSQL_URL``, no Docker and no server on
127.0.0.1:3306 is there (``.ci/run`` installs and starts the Debian one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from connectors.demo.services.kafka import free_port


def _binary(*names: str) -> str:
    for name in names:
        for where in (shutil.which(name), os.path.join("/usr/sbin", name)):
            if where and os.path.exists(where):
                return where
    raise RuntimeError(f"none of {', '.join(names)} found on PATH or in /usr/sbin")


class TempMariaDB:
    def __init__(self) -> None:
        self.install = _binary("mariadb-install-db", "mysql_install_db")
        self.server = _binary("mariadbd", "mysqld")
        self.base = tempfile.mkdtemp(prefix="eo-mariadb-")
        self.data = os.path.join(self.base, "data")
        self.socket = os.path.join(self.base, "sock")
        self.port = free_port()
        self.url = f"mysql+pymysql://root@127.0.0.1:{self.port}/test"
        self._proc: subprocess.Popen[bytes] | None = None
        self._install_db()

    def _install_db(self) -> None:
        """``mariadb-install-db`` into a new data directory; asked once more if it fails
        (seen once with two test workers bootstrapping at the same moment), then an error
        with its own last words."""
        argv = [self.install, "--no-defaults", f"--datadir={self.data}", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db"]
        for attempt in (1, 2):
            out = subprocess.run(argv, capture_output=True, text=True)
            if out.returncode == 0:
                return
            shutil.rmtree(self.data, ignore_errors=True)
            if attempt == 2:
                said = (out.stderr or out.stdout).strip().splitlines()[-8:]
                raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): "
                                   + " | ".join(said))

    def start(self, timeout: float = 60.0) -> TempMariaDB:
        import pymysql

        with open(os.path.join(self.base, "server.log"), "ab") as out:
            self._proc = subprocess.Popen(
                [self.server, "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
                 "--bind-address=127.0.0.1", f"--socket={self.socket}", "--user=root"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root")
                conn.cursor().execute("CREATE DATABASE IF NOT EXISTS test")
                conn.close()
                return self
            except pymysql.err.OperationalError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.destroy()
                    raise RuntimeError(
                        f"mariadbd did not start (log: {self.base}/server.log)"
                    ) from None
                time.sleep(0.2)

    def destroy(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None
        shutil.rmtree(self.base, ignore_errors=True)
