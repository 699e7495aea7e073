"""Resolve the JVM services declared in ``pom.xml`` (beside this file) from Maven Central.

``resolve("kafka")`` runs ``mvn -B dependency:copy-dependencies -Pkafka`` once into a
cache directory and returns it; a second call with the same pom and properties costs a
directory check. The cache lives under ``$EO_CONNECTORS_CACHE`` (default
``~/.cache/eo-connectors``), one directory per (profile, pom content, properties), so a
version bump in the pom resolves afresh instead of mixing jars.

Maven's output goes to a log beside that directory (``<profile>-<key>.log``), which an error
names; :func:`run_maven` reads it while Maven runs to say every
:data:`~connectors.demo.services.progress.PERIOD` seconds how many files it has downloaded
and which plugin runs (a first resolution is a minute or more of downloads).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from connectors.core.errors import ConnectorError
from connectors.demo.services.progress import Say, heartbeat, say_or_log

log = logging.getLogger(__name__)

POM = Path(__file__).with_name("pom.xml")
_DONE = ".resolved"


def cache_root() -> Path:
    return Path(os.environ.get("EO_CONNECTORS_CACHE") or Path.home() / ".cache" / "eo-connectors")


def java_and_maven() -> str | None:
    """None when ``java`` and ``mvn`` are both on PATH, else what is missing (a sentence)."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if not missing:
        return None
    return f"{' and '.join(missing)} not on PATH (needs Java 17 and Maven 3.8+)"


def pom_property(name: str) -> str:
    """A ``<properties>`` value of the pom (the pinned versions)."""
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", POM.read_text())
    if match is None:
        raise ConnectorError(f"{POM}: no property {name!r}")
    return match.group(1).strip()


def _key(profile: str, properties: Mapping[str, str]) -> str:
    digest = hashlib.sha256(POM.read_bytes())
    for k, v in sorted(properties.items()):
        digest.update(f"\0{k}={v}".encode())
    return f"{profile}-{digest.hexdigest()[:12]}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One resolver at a time per cache entry (parallel test sessions, a demo beside them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached(profile: str, properties: Mapping[str, str] | None = None) -> Path | None:
    """The directory of ``profile``'s jars when an earlier run resolved them, else None."""
    target = cache_root() / "jvm" / _key(profile, dict(properties or {}))
    return target if (target / _DONE).exists() else None


def resolve(profile: str, properties: Mapping[str, str] | None = None,
            timeout: float = 1200.0, progress: Say | None = None) -> Path:
    """The directory holding every runtime jar of ``profile``, resolved once.

    ``properties`` override the pom's ``<properties>`` (``{"spark.kafka.version": "4.3.0"}``).
    ``progress`` gets a line at least every 10 s while Maven runs (default: logged at INFO).
    Raises :class:`ConnectorError` naming the profile, Maven's log and its last lines when
    Java or Maven is missing or an artifact cannot be resolved.
    """
    props = dict(properties or {})
    done = cached(profile, props)
    if done is not None:
        return done
    target = cache_root() / "jvm" / _key(profile, props)
    missing = java_and_maven()
    if missing:
        raise ConnectorError(f"cannot resolve the {profile!r} jars: {missing}")
    with locked(target.with_suffix(".lock")):
        if (target / _DONE).exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{profile}-", dir=target.parent))
        args = [
            "-f", str(POM), f"-P{profile}", "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
            *(f"-D{k}={v}" for k, v in props.items()),
        ]
        log.info("resolving the %s jars from Maven Central into %s", profile, target)
        maven_log = target.with_suffix(".log")
        try:
            code = run_maven(args, maven_log, timeout=timeout,
                             doing=f"resolving the {profile!r} jars from Maven Central",
                             progress=progress)
        except ConnectorError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if code != 0 or not any(staging.glob("*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            raise ConnectorError(
                f"cannot resolve the {profile!r} jars from Maven Central (mvn exit {code}; "
                f"Maven's log: {maven_log}):\n{log_tail(maven_log)}")
        (staging / _DONE).write_text(" ".join(["mvn", *args]) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return target


class MavenLog:
    """What a running Maven has done so far, read from its ``-B`` log as it grows: files
    downloaded ("Downloaded from central: ...") and the plugin goal it runs now."""

    _GOAL = re.compile(rb"--- ([\w.-]+):[\w.-]+:([\w.-]+)")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.downloaded = 0
        self.goal: str | None = None
        self._offset = 0

    def read(self) -> MavenLog:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:  # not created yet: nothing done yet
            return self
        chunk = chunk[:chunk.rfind(b"\n") + 1]  # whole lines only; the rest next time
        self._offset += len(chunk)
        self.downloaded += chunk.count(b"Downloaded from ")
        goals = self._GOAL.findall(chunk)
        if goals:
            plugin, goal = goals[-1]
            self.goal = f"{plugin.decode()}:{goal.decode()}"
        return self

    def status(self, doing: str, elapsed: float) -> str:
        self.read()
        running = f", running {self.goal}" if self.goal else ""
        return (f"still {doing} ({elapsed:.0f} s; {self.downloaded} files downloaded so far"
                f"{running})")


def run_maven(args: list[str], log_path: Path, *, timeout: float, doing: str,
              progress: Say | None = None, env: Mapping[str, str] | None = None) -> int:
    """``mvn -B <args>``, its output into ``log_path`` (replaced); its exit code.

    While it runs, ``progress`` (default: logged at INFO) gets ``still <doing> (...)`` at
    least every 10 s, with the files downloaded so far. Over ``timeout`` seconds Maven and
    its JVM are killed and :class:`ConnectorError` names ``doing`` and the log."""
    say = say_or_log(progress, log)
    cmd = ["mvn", "-B", *args]
    watched = MavenLog(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out, \
            heartbeat(say, lambda elapsed: watched.status(doing, elapsed)):
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            cmd, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
            start_new_session=True)  # its own group: a timeout kills the JVM mvn starts too
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise ConnectorError(f"{doing} took over {timeout:.0f}s (Maven's log: {log_path}):"
                                 f"\n{log_tail(log_path)}") from None
        except BaseException:  # Ctrl-C: no Maven left running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise


def log_tail(path: Path, lines: int = 8) -> str:
    """Maven's ``[ERROR]`` lines of ``path`` (its last ``lines``), else its last lines."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    errors = [line for line in text if line.startswith("[ERROR]")]
    return "\n".join((errors or text)[-lines:])


def classpath(directory: Path) -> str:
    """A ``java -cp`` value with every jar of a resolved profile."""
    return str(directory / "*")


def jar_version(directory: Path, artifact: str) -> str | None:
    """The version of ``artifact`` in a resolved profile (``kafka_2.13`` -> ``4.1.2``)."""
    for jar in directory.glob(f"{artifact}-*.jar"):
        rest = jar.name[len(artifact) + 1:-len(".jar")]
        if rest and rest[0].isdigit():
            return rest
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m connectors.demo.services.maven PROFILE...``: resolve ahead of time."""
    import sys

    profiles = sys.argv[1:] if argv is None else argv
    for profile in profiles or ["kafka"]:
        began = time.monotonic()
        print(f"{profile}: resolving (from Maven Central the first time, then cached in "
              f"{cache_root()})...", flush=True)
        where = resolve(profile, progress=lambda line: print(f"  {line}", flush=True))
        print(f"{profile}: {where} ({time.monotonic() - began:.0f}s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
