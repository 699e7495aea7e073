"""A local, real Schema Registry for the demo, the test tier and the benchmarks.

:class:`LocalRegistry` runs Apicurio Registry (its Confluent-compatible REST API under
``/apis/ccompat/v7``) with in-memory storage on a free loopback port. The application is
packaged once from Maven Central by :func:`build` (``apicurio/pom.xml`` beside this file:
the ``apicurio-registry-app`` module through the Quarkus Maven plugin; why that version is
in the pom) into ``$EO_CONNECTORS_CACHE`` (default ``~/.cache/eo-connectors``), one directory
per pom content, so a version bump builds afresh. It needs Java 17 and Maven.

Two phases, each with its own bound and its own log: the build (a first one downloads from
Maven Central and runs Quarkus, minutes; ``build_timeout``; Maven's log beside the cached
application) and the start (the JVM until the REST API answers; ``timeout``, counted from
the JVM's launch, never eaten by a build; the registry's log in its work directory). Both
say how they are going at least every 10 s.

``python -m connectors.demo.services.registry --prepare`` builds it ahead of time (what
``scripts/run-tests`` step 3 runs); without ``--prepare`` it starts one and prints its URL.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from connectors.core.errors import ConnectorError
from connectors.demo.services import maven
from connectors.demo.services.kafka import _stop, free_port
from connectors.demo.services.progress import Say, heartbeat, say_or_log

log = logging.getLogger(__name__)

POM = Path(__file__).with_name("apicurio") / "pom.xml"
#: Where Apicurio serves Confluent's REST API (what every client is given as its URL).
CCOMPAT_PATH = "/apis/ccompat/v7"
_DONE = ".built"


def _target() -> Path:
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return maven.cache_root() / "registry" / f"apicurio-{digest}"


def cached() -> Path | None:
    """The packaged registry when an earlier run built it, else None."""
    target = _target()
    return target if (target / _DONE).exists() else None


def build(timeout: float = 1800.0, progress: Say | None = None) -> Path:
    """The directory holding the packaged registry (``*-runner.jar`` and ``lib/``), built
    once per pom content; ``progress`` gets a line at least every 10 s of a build (default:
    logged at INFO). Raises :class:`ConnectorError` naming the build, Maven's log and its
    last lines on failure."""
    target = _target()
    if cached() is not None:
        return target
    missing = maven.java_and_maven()
    if missing:
        raise ConnectorError(f"cannot build the schema registry: {missing}")
    with maven.locked(target.with_suffix(".lock")):
        if (target / _DONE).exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".apicurio-", dir=target.parent))
        shutil.copy(POM, work / "pom.xml")
        args = ["-f", str(work / "pom.xml"), "-DskipTests", "-Dquarkus.analytics.disabled=true",
                "package"]
        maven_log = target.with_suffix(".build.log")
        log.info("building the schema registry (Apicurio) from Maven Central into %s "
                 "(Maven's log: %s)", target, maven_log)
        try:
            code = maven.run_maven(
                args, maven_log, timeout=timeout, progress=progress,
                doing="building the schema registry (Apicurio) from Maven Central",
                env={**os.environ, "MAVEN_OPTS": os.environ.get("MAVEN_OPTS", "-Xmx768m")})
        except ConnectorError:
            shutil.rmtree(work, ignore_errors=True)
            raise
        runners = list((work / "target").glob("*-runner.jar"))
        if code != 0 or not runners:
            shutil.rmtree(work, ignore_errors=True)
            raise ConnectorError(
                f"building the schema registry from {POM} failed (mvn exit {code}; Maven's "
                f"log: {maven_log}):\n{maven.log_tail(maven_log)}")
        staging = work / "app"
        staging.mkdir()
        os.replace(runners[0], staging / "registry-runner.jar")
        os.replace(work / "target" / "lib", staging / "lib")
        (staging / _DONE).write_text(" ".join(["mvn", *args]) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        shutil.rmtree(work, ignore_errors=True)
    return target


class LocalRegistry:
    """Apicurio Registry (in-memory storage) on a free loopback port.

    ``url`` is the Confluent-compatible base URL clients take
    (``http://127.0.0.1:<port>/apis/ccompat/v7``). The JVM's output goes to ``log_path``.
    """

    def __init__(self, *, heap: str = "256m", workdir: str | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + CCOMPAT_PATH
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="eo-registry-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = str(self.workdir / "registry.log")
        self.heap = heap
        self.version = "?"
        self.started_in: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0, *, build_timeout: float = 1800.0,
              progress: Say | None = None) -> LocalRegistry:
        """Build the registry if it is not built yet (up to ``build_timeout`` seconds), then
        launch it and wait up to ``timeout`` seconds from the launch until it answers.
        ``progress`` gets a line at least every 10 s of either (default: logged at INFO)."""
        app = build(build_timeout, progress)
        cmd = [
            "java", f"-Xmx{self.heap}", "-Xss512k", "-XX:+UseSerialGC",
            # C1 only: a test session's registry answers a few hundred requests.
            "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dquarkus.http.port={self.port}", "-Dquarkus.http.host=127.0.0.1",
            # no telemetry, no background phone-home; the H2 database lives in memory
            "-Dquarkus.analytics.disabled=true",
            f"-Djava.io.tmpdir={self.workdir}",
            "-jar", str(app / "registry-runner.jar"),
        ]
        # The deadline starts here, after the build: a first run's build (minutes) must not
        # leave the start no time at all.
        began = time.monotonic()
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir,
                start_new_session=True)
        say = say_or_log(progress, log)
        try:
            with heartbeat(say, lambda elapsed: f"still starting the schema registry on "
                           f"{self.base} ({elapsed:.0f} s of {timeout:.0f} s; its log: "
                           f"{self.log_path})"):
                self._wait_ready(began, timeout)
        except BaseException:
            self.stop(keep=True)
            raise
        self.started_in = time.monotonic() - began
        log.info("schema registry (Apicurio %s) at %s, up in %.1fs, log %s", self.version,
                 self.url, self.started_in, self.log_path)
        return self

    def _wait_ready(self, began: float, timeout: float) -> None:
        last = "no answer yet"
        deadline = began + timeout
        while True:  # polled at least once, however short the timeout
            if self._proc is not None and self._proc.poll() is not None:
                raise ConnectorError(
                    f"the schema registry exited with code {self._proc.returncode} during "
                    f"start-up (its log: {self.log_path}): {_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.url + "/subjects", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        self.version = _version(self.base)
                        return
                    last = f"HTTP {r.status}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise ConnectorError(
                    f"the schema registry at {self.url} did not answer within {timeout:.0f}s "
                    f"of its start (its build was done before; the start timed out): {last} "
                    f"(its log: {self.log_path}: {_tail(self.log_path) or 'empty'})")
            time.sleep(0.2)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self, keep: bool = False) -> None:
        _stop(self._proc, grace=10.0)
        self._proc = None
        if self._own_dir and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalRegistry:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _version(base: str) -> str:
    import json

    try:
        with urllib.request.urlopen(base + "/apis/registry/v2/system/info",  # noqa: S310
                                    timeout=2) as r:
            return str(json.load(r).get("version") or "?")
    except (urllib.error.URLError, OSError, ValueError):
        return "?"


def _tail(path: str, lines: int = 5) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def main(argv: list[str] | None = None) -> int:
    """``--prepare``: build only; otherwise start one, print its URL, stop on Ctrl-C."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if "--prepare" in args:
        began = time.monotonic()
        print(f"schema registry: building (from Maven Central the first time, then cached in "
              f"{maven.cache_root()})...", flush=True)
        where = build(progress=lambda line: print(f"  {line}", flush=True))
        print(f"schema registry: {where} ({time.monotonic() - began:.0f}s)")
        return 0
    with LocalRegistry() as reg:
        print(f"schema registry (Apicurio {reg.version}) at {reg.url}; Ctrl-C stops it")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
