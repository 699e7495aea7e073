"""Resolve the JVM services declared in ``pom.xml`` (beside this file) from Maven Central.

``resolve("kafka")`` runs ``mvn -q -B dependency:copy-dependencies -Pkafka`` once into a
cache directory and returns it; a second call with the same pom and properties costs a
directory check. The cache lives under ``$EO_CONNECTORS_CACHE`` (default
``~/.cache/eo-connectors``), one directory per (profile, pom content, properties), so a
version bump in the pom resolves afresh instead of mixing jars.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from connectors.core.errors import ConnectorError

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


def resolve(profile: str, properties: Mapping[str, str] | None = None,
            timeout: float = 1200.0) -> Path:
    """The directory holding every runtime jar of ``profile``, resolved once.

    ``properties`` override the pom's ``<properties>`` (``{"spark.kafka.version": "4.3.0"}``).
    Raises :class:`ConnectorError` naming the profile and Maven's last lines when Java or
    Maven is missing or an artifact cannot be resolved.
    """
    props = dict(properties or {})
    target = cache_root() / "jvm" / _key(profile, props)
    if (target / _DONE).exists():
        return target
    missing = java_and_maven()
    if missing:
        raise ConnectorError(f"cannot resolve the {profile!r} jars: {missing}")
    with locked(target.with_suffix(".lock")):
        if (target / _DONE).exists():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{profile}-", dir=target.parent))
        cmd = [
            "mvn", "-q", "-B", "-f", str(POM), f"-P{profile}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
            *(f"-D{k}={v}" for k, v in props.items()),
        ]
        log.info("resolving the %s jars from Maven Central into %s", profile, target)
        try:
            done = subprocess.run(  # noqa: S603 - fixed argv
                cmd, capture_output=True, text=True, timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise ConnectorError(f"resolving the {profile!r} jars took over {timeout:.0f}s") from e
        if done.returncode != 0 or not any(staging.glob("*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise ConnectorError(
                f"cannot resolve the {profile!r} jars from Maven Central "
                f"(mvn exit {done.returncode}):\n{tail}"
            )
        (staging / _DONE).write_text(" ".join(cmd) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return target


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
        print(f"{profile}: {resolve(profile)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
