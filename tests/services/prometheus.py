"""A real Prometheus server (Debian's ``prometheus`` package; scripts/run-tests installs it)
scraping given targets every second, with its HTTP API for the tests to read back.

``Prometheus.start(tmpdir, targets)`` writes a config, starts the binary on a free port of
127.0.0.1 with its data in ``tmpdir``, and returns once ``/-/ready`` answers. ``query(expr)``
is an instant query (``/api/v1/query``) returning ``{labels: value}``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARY_CANDIDATES = ("prometheus", "/usr/bin/prometheus")


def find_binary() -> str | None:
    for name in BINARY_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes] = field(repr=False)
    log_path: Path = field(repr=False)

    @classmethod
    def start(cls, binary: str, workdir: Path, targets: Sequence[str],
              timeout: float = 30.0) -> Prometheus:
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        # YAML is a superset of JSON: no YAML writer needed
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "eo", "static_configs": [{"targets": list(targets)}]}],
        }))
        port = free_port()
        log_path = workdir / "prometheus.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT)
        server = cls(f"http://127.0.0.1:{port}", proc, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({proc.returncode}): {server.log()}")
            try:
                with urllib.request.urlopen(server.url + "/-/ready", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        return server
            except OSError:
                pass
            time.sleep(0.1)  # polling the readiness endpoint within the deadline
        server.stop()
        raise RuntimeError(f"prometheus not ready after {timeout}s: {server.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query: ``{sorted label pairs (without __name__): value}``."""
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(  # noqa: S310 - our own http:// URL
                f"{self.url}/api/v1/query?{q}", timeout=5) as r:
            body: dict[str, Any] = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query {expr!r}: {body}")
        out = {}
        for sample in body["data"]["result"]:
            labels = tuple(sorted((k, v) for k, v in sample["metric"].items()
                                  if k != "__name__"))
            out[labels] = float(sample["value"][1])
        return out

    def value(self, expr: str) -> float | None:
        """The single value of ``expr`` (None when it has no sample)."""
        result = self.query(expr)
        if len(result) > 1:
            raise AssertionError(f"{expr!r} has {len(result)} series: {result}")
        return next(iter(result.values()), None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
