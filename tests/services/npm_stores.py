"""Two more real object stores for the test tier, from the npm registry:

- **Azurite** (``azurite``, Microsoft's Azure Storage emulator, MIT): Azure Blob's REST API,
  signed with the well-known development account. It enforces ``If-None-Match: *`` on Put
  Blob (checked here: 8 concurrent creates of one blob, one winner), so the connectors'
  Azure path (``abfss://``/``az://`` URLs through obstore's Azure client) runs against it.
- **s3rver** (``s3rver``, MIT): a small S3 server for Node. It ignores ``If-None-Match``: a
  second create of one key overwrites it. That makes it the real "store without conditional
  writes" the capability probe must refuse (it is never used for anything else).

Both are installed once with ``npm install`` into ``~/.cache/eo-connectors/npm``
(``$EO_CONNECTORS_CACHE``); ``python -m tests.services.npm_stores --prepare`` does it ahead
(``scripts/run-tests`` runs that). Each server runs on a free loopback port with its data in
a temp directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.demo.services.kafka import free_port
from connectors.demo.services.maven import cache_root, locked

PACKAGES = {"azurite": "3.35.0", "s3rver": "3.7.1"}
BINARIES = {"azurite": "azurite-blob", "s3rver": "s3rver"}
#: Azurite's well-known development account (public, documented by Microsoft)
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
           "KBHBeksoGMGw==")


def npm_bin(package: str) -> Path:
    """The binary of ``package`` at its pinned version, installed once from npm."""
    version = PACKAGES[package]
    root = cache_root() / "npm" / f"{package}-{version}"
    binary = root / "node_modules" / ".bin" / BINARIES[package]
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise ConnectorError(f"cannot install {package}: node and npm are not on PATH")
    with locked(root.with_suffix(".lock")):
        if binary.exists():
            return binary
        staging = Path(tempfile.mkdtemp(prefix=f".{package}-", dir=root.parent))
        done = subprocess.run(  # noqa: S603 - fixed argv
            [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(staging),
             f"{package}@{version}"],
            capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise ConnectorError(f"npm install {package}@{version} failed: "
                                 f"{(done.stdout + done.stderr)[-1500:]}")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)
    return binary


def _wait_port(proc: subprocess.Popen[bytes], port: int, what: str, log: str,
               timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConnectorError(f"{what} exited with {proc.returncode} (log: {log})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise ConnectorError(f"{what} did not listen on {port} within {timeout:.0f}s (log: {log})")


class _Server:
    name = ""

    def __init__(self, workdir: str | None = None) -> None:
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"eo-{self.name}-")
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(self.workdir, f"{self.name}.log")

    def _start(self, argv: list[str]) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_port(self.proc, self.port, self.name, self.log_path)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, 9)


@dataclass(frozen=True)
class AzureService:
    """The session's Azure Blob endpoint (Azurite) and its development account."""

    endpoint: str  # http://127.0.0.1:<port>/devstoreaccount1
    account: str
    key: str
    version: str
    log_path: str | None

    def python_options(self) -> dict[str, str]:
        """``storage_options`` of a connector writing here."""
        return {"endpoint": self.endpoint, "accountName": self.account,
                "accountKey": self.key}

    def options(self) -> dict[str, str]:
        return {f"storage.{k}": v for k, v in self.python_options().items()}

    def url(self, container: str, path: str) -> str:
        return f"abfss://{container}@{self.account}.dfs.core.windows.net/{path.lstrip('/')}"

    def _client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.endpoint};")

    def new_container(self) -> str:
        name = f"eo-{uuid.uuid4().hex[:12]}"
        self._client().create_container(name)
        return name

    def drop_container(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self._client().delete_container(name)


class LocalAzurite(_Server):
    """``azurite-blob`` on a free loopback port."""

    name = "azurite"

    def start(self) -> LocalAzurite:
        binary = npm_bin("azurite")
        self._start([str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                     "--location", os.path.join(self.workdir, "data"), "--skipApiVersionCheck",
                     "--disableTelemetry", "--silent"])
        return self

    def service(self) -> AzureService:
        return AzureService(f"http://127.0.0.1:{self.port}/{DEV_ACCOUNT}", DEV_ACCOUNT, DEV_KEY,
                            f"Azurite {PACKAGES['azurite']}", self.log_path)


class LocalS3rver(_Server):
    """``s3rver`` on a free loopback port, with one bucket: an S3 API that ignores
    ``If-None-Match`` (see the module docstring)."""

    name = "s3rver"
    bucket = "no-conditional-writes"

    def start(self) -> LocalS3rver:
        binary = npm_bin("s3rver")
        self._start([str(binary), "-d", os.path.join(self.workdir, "data"), "-a", "127.0.0.1",
                     "-p", str(self.port), "--configure-bucket", self.bucket, "--silent"])
        return self

    def python_options(self) -> dict[str, str]:
        # s3rver's own fixed development credentials
        return {"endpoint": f"http://127.0.0.1:{self.port}", "region": "us-east-1",
                "accessKeyId": "S3RVER", "secretAccessKey": "S3RVER"}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--prepare"]:
        for package in PACKAGES:
            print(f"{package} {PACKAGES[package]}: {npm_bin(package)}")
        return 0
    print("usage: python -m tests.services.npm_stores --prepare", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
