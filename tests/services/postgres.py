"""A throwaway PostgreSQL cluster from the ``initdb``/``pg_ctl`` binaries on PATH.

Used by the ``postgres_dsn`` fixture when nothing else is available, and by the outage soak
test, which must stop and restart *its own* server without disturbing anything else.
Runs as user ``postgres`` when we are root (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from connectors.demo.services.kafka import free_port


class TempPostgres:
    """``settings``: server settings for ``postgres -c`` (e.g. ``max_prepared_transactions``,
    which only a server start sets)."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings = dict(settings or {})
        initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
        if not initdb or not pg_ctl:
            found = sorted(
                os.path.join("/usr/lib/postgresql", v, "bin")
                for v in (os.listdir("/usr/lib/postgresql")
                          if os.path.isdir("/usr/lib/postgresql") else [])
            )
            if not found:
                raise RuntimeError("initdb/pg_ctl not found on PATH or in /usr/lib/postgresql")
            initdb, pg_ctl = os.path.join(found[-1], "initdb"), os.path.join(found[-1], "pg_ctl")
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.base = tempfile.mkdtemp(prefix="eo-pg-")
        self.data = os.path.join(self.base, "data")
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        subprocess.run([*self.as_user, self.initdb, "-D", self.data, "-A", "trust",
                        "-U", "postgres"], check=True, capture_output=True)

    def start(self) -> TempPostgres:
        subprocess.run(
            [*self.as_user, self.pg_ctl, "-D", self.data, "-w", "-l",
             os.path.join(self.base, "log"), "-o", f"-p {self.port} -k {self.base} "
             "-h 127.0.0.1" + "".join(f" -c {k}={v}" for k, v in self.settings.items()),
             "start"],
            check=True, capture_output=True,
        )
        return self

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", self.data, "-m", mode, "-w", "stop"],
                       capture_output=True)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
