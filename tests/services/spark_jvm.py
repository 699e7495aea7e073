"""Spark's own JVM Kafka connector, run beside our connectors for the cross-client tests.

Spark's Kafka connector (``spark-sql-kafka-0-10_2.13``) must run with the Spark it was
built for. :func:`jvm_spark` decides where that is:

- the connector for the installed pyspark resolves from Maven Central: the current
  interpreter, with the connector of the same version;
- otherwise (Maven Central serves no connector for pyspark 4.3.0 yet): a virtualenv with
  ``pyspark==<pom's spark.kafka.version>`` plus pyarrow, pandas and numpy, built once under
  ``<cache_root>/spark-venv-<version>`` behind a lock file, with that version's connector.
  A connector jar is never mixed with a different Spark version.

:func:`run_job` runs ``tests/integration/pipelines/spark_kafka_job.py`` in that interpreter
(``local[2]``, UI off, ``spark.jars`` = the resolved connector jars) and returns the JSON
result, which names both Spark versions (the JVM side's and ours); :func:`start_job`
starts it without waiting (a streaming job).

``python -m tests.services.spark_jvm --prepare`` builds the virtualenv and resolves the jars
ahead of a test run.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.demo.services import maven

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "integration" / "pipelines" / "spark_kafka_job.py"
CONNECTOR = "spark-sql-kafka-0-10_2.13"
#: What a Spark job needs besides pyspark; pinned to this interpreter's versions when it
#: has them, so the virtualenv matches the test session and pip reuses cached wheels.
JOB_DEPENDENCIES = ("pyarrow", "pandas", "numpy")
#: A connector version Maven Central did not serve is asked about again after this long.
UNSERVED_TTL_S = 24 * 3600.0
_READY = ".ready"
#: How Maven says an artifact is not there (first try; later tries from its local cache).
_NOT_SERVED = ("Could not find artifact", "was not found in")


@dataclass(frozen=True)
class JvmSpark:
    """Where Spark's JVM Kafka connector runs: an interpreter and its connector jars."""

    python: str  # an interpreter whose pyspark is ``spark_version``
    spark_version: str  # pyspark in ``python`` (= the connector's version)
    ours: str  # the pyspark the project runs
    jars: Path  # the resolved connector and its runtime dependencies
    separate_venv: bool

    @property
    def kafka_clients(self) -> str:
        return maven.jar_version(self.jars, "kafka-clients") or "?"

    def describe(self) -> str:
        where = (f"virtualenv {Path(self.python).parent.parent}" if self.separate_venv
                 else "this interpreter")
        return (f"JVM-side Spark {self.spark_version} ({where}) with {CONNECTOR} "
                f"{self.spark_version} and kafka-clients {self.kafka_clients}")


def our_pyspark() -> str:
    return dist_version("pyspark")


def _unserved_marker(version: str) -> Path:
    return maven.cache_root() / "jvm" / f"{CONNECTOR}-{version}.unserved"


def _resolve_same_version(version: str) -> Path | None:
    """The connector jars of ``version``, or None when they cannot be resolved.

    Maven's "not found" is remembered for a day, so that a test session does not pay
    a failing Maven run every time."""
    marker = _unserved_marker(version)
    with contextlib.suppress(OSError):
        if time.time() - marker.stat().st_mtime < UNSERVED_TTL_S:
            return None
    try:
        return maven.resolve("spark-kafka", {"spark.kafka.version": version})
    except ConnectorError as e:
        log.info("no %s %s from Maven Central: %s", CONNECTOR, version, e)
        if any(m in str(e) for m in _NOT_SERVED):  # not a network failure: remember it
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(e) + "\n")
        return None


def jvm_spark() -> JvmSpark:
    """The JVM-side Spark for the cross-client tests (resolves and builds on first use).

    Raises :class:`ConnectorError` when Java or Maven is missing, the pom's connector
    cannot be resolved, or the virtualenv cannot be built."""
    ours = our_pyspark()
    missing = maven.java_and_maven()
    if missing is not None:
        raise ConnectorError(f"Spark's JVM Kafka connector needs Java and Maven: {missing}")
    jars = _resolve_same_version(ours)
    if jars is not None:
        return JvmSpark(sys.executable, ours, ours, jars, separate_venv=False)
    served = maven.pom_property("spark.kafka.version")
    jars = maven.resolve("spark-kafka")
    return JvmSpark(str(spark_venv(served)), served, ours, jars, separate_venv=True)


# -- the virtualenv --------------------------------------------------------------------------
def _pinned(dist: str) -> str:
    try:
        return f"{dist}=={dist_version(dist)}"
    except Exception:  # noqa: BLE001 - not installed here: let pip choose
        return dist


def spark_venv(version: str, timeout: float = 1800.0) -> Path:
    """The python of ``<cache_root>/spark-venv-<version>``, built once (pyspark==version and
    :data:`JOB_DEPENDENCIES`). A second call costs a file check."""
    root = maven.cache_root() / f"spark-venv-{version}"
    python = root / "bin" / "python"

    def ready() -> bool:  # and its base interpreter still there (the link resolves)
        return (root / _READY).exists() and python.exists()

    if ready():
        return python
    # maven.py's lock: one builder at a time (two test sessions, --prepare beside a run).
    with maven.locked(root.with_name(root.name + ".lock")):
        if ready():
            return python
        shutil.rmtree(root, ignore_errors=True)  # a build that died half-way
        started = time.monotonic()
        # No system site-packages: the project's pyspark must stay invisible in there.
        _run([sys.executable, "-m", "venv", str(root)], timeout, "creating the virtualenv")
        wanted = [f"pyspark=={version}", *(_pinned(d) for d in JOB_DEPENDENCIES)]
        _run([str(python), "-m", "pip", "install", "-q", *wanted], timeout,
             f"pip install {' '.join(wanted)}")
        got = subprocess.run(
            [str(python), "-c", "import pyspark, pyarrow; print(pyspark.__version__)"],
            capture_output=True, text=True, timeout=120, check=False,
        )
        if got.returncode != 0 or got.stdout.strip() != version:
            raise ConnectorError(
                f"the virtualenv {root} has pyspark {got.stdout.strip()!r}, not {version}: "
                f"{got.stderr[-1000:]}"
            )
        (root / _READY).write_text(
            json.dumps({"pyspark": version, "packages": wanted,
                        "built_seconds": round(time.monotonic() - started, 1)}) + "\n"
        )
        log.info("built %s in %.0fs", root, time.monotonic() - started)
    return python


def _run(cmd: list[str], timeout: float, what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise ConnectorError(f"{what} took over {timeout:.0f}s") from e
    if done.returncode != 0:
        raise ConnectorError(f"{what} failed ({done.returncode}): "
                             f"{(done.stdout + done.stderr)[-2000:]}")


# -- running a job ---------------------------------------------------------------------------
def job_env(jvm: JvmSpark) -> dict[str, str]:
    """The job's environment: its own interpreter for driver and workers, nothing of ours."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SPARK_HOME", "PYSPARK_SUBMIT_ARGS")}
    env["PYSPARK_PYTHON"] = jvm.python
    env["PYSPARK_DRIVER_PYTHON"] = jvm.python
    return env


def run_job(jvm: JvmSpark, spec: Mapping[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """Run :data:`JOB` with ``spec`` (see that script) in the JVM-side interpreter and
    return its JSON result (which carries ``spark_version``, the JVM side's Spark)."""
    jars = sorted(str(j) for j in jvm.jars.glob("*.jar"))
    with tempfile.TemporaryDirectory(prefix="eo-spark-job-") as tmp:
        out, spec_file = Path(tmp) / "result.json", Path(tmp) / "spec.json"
        # A file, not argv: one argument is capped at 128 KiB on Linux.
        spec_file.write_text(json.dumps(
            {**spec, "jars": jars, "out": str(out), "expect_spark": jvm.spark_version}))
        try:
            done = subprocess.run(
                [jvm.python, str(JOB), str(spec_file)], env=job_env(jvm), cwd=tmp,
                capture_output=True, text=True, timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise ConnectorError(f"Spark JVM job {spec.get('action')} took over {timeout}s") \
                from e
        if done.returncode != 0 or not out.exists():
            raise ConnectorError(
                f"Spark JVM job {spec.get('action')} failed ({done.returncode}) in "
                f"{jvm.describe()}:\n{(done.stdout + done.stderr)[-4000:]}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
    if result.get("spark_version") != jvm.spark_version:
        raise ConnectorError(
            f"the JVM side ran Spark {result.get('spark_version')}, expected "
            f"{jvm.spark_version} (the connector's version)"
        )
    result["our_pyspark"] = jvm.ours
    print(f"spark_kafka_job {spec.get('action')}: JVM-side Spark {result['spark_version']}, "
          f"our pyspark {jvm.ours}", flush=True)
    return result


def start_job(jvm: JvmSpark, spec: Mapping[str, Any], workdir: Path,
              log: Any) -> subprocess.Popen[bytes]:
    """Start :data:`JOB` with ``spec`` in the JVM-side interpreter without waiting (a
    streaming job the caller stops: ``fault_copy``), its output into ``log``, in a process
    group of its own (the caller may SIGKILL it); the JSON result goes to
    ``workdir/result.json``."""
    jars = sorted(str(j) for j in jvm.jars.glob("*.jar"))
    workdir.mkdir(parents=True, exist_ok=True)
    spec_file = workdir / "spec.json"
    spec_file.write_text(json.dumps({**spec, "jars": jars, "out": str(workdir / "result.json"),
                                     "expect_spark": jvm.spark_version}))
    return subprocess.Popen([jvm.python, str(JOB), str(spec_file)], env=job_env(jvm),
                            cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def with_avro(jvm: JvmSpark) -> JvmSpark:
    """``jvm`` with Spark's own ``spark-avro`` (``from_avro``/``to_avro``, pom profile
    ``spark-avro``) at its Spark version beside the Kafka connector: one directory of links
    to both, kept in the cache."""
    import dataclasses

    props = ({} if jvm.spark_version == maven.pom_property("spark.kafka.version")
             else {"spark.kafka.version": jvm.spark_version})
    avro = maven.resolve("spark-avro", props)
    merged = maven.cache_root() / "jvm" / f"{jvm.jars.name}+{avro.name}"
    if not (merged / ".linked").exists():
        merged.mkdir(parents=True, exist_ok=True)
        for jar in [*jvm.jars.glob("*.jar"), *avro.glob("*.jar")]:
            target = merged / jar.name
            if not target.exists():
                target.symlink_to(jar)
        (merged / ".linked").write_text("")
    return dataclasses.replace(jvm, jars=merged)


def jvm_read_topic(jvm: JvmSpark, bootstrap: str, topic: str,
                   isolation: str = "read_committed") -> tuple[list[tuple[Any, ...]], str]:
    """Spark's JVM Kafka source, batch, the whole topic: ``(key, value, partition, offset,
    headers)`` rows (headers a tuple of pairs, None when the record has none) and the Spark
    version the job reported."""

    def unb64(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    from tests.helpers import TEST_JVM_FLAGS  # flags only: the archive is of our pyspark's jars

    result = run_job(jvm, {"action": "read", "bootstrap": bootstrap, "topic": topic,
                           "options": {"kafka.isolation.level": isolation},
                           "java_options": TEST_JVM_FLAGS})
    rows = []
    for key, value, part, offset, headers in result["rows"]:
        hs = tuple((k, unb64(v)) for k, v in headers) if headers else None
        rows.append((unb64(key), unb64(value), part, offset, hs))
    return rows, str(result["spark_version"])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.services.spark_jvm", description=__doc__)
    p.add_argument("--prepare", action="store_true",
                   help="resolve the connector jars and build the virtualenv now")
    args = p.parse_args(argv)
    if not args.prepare:
        p.print_help()
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    try:
        jvm = jvm_spark()
    except ConnectorError as e:
        print(f"spark_jvm: cannot prepare the JVM side: {e}", file=sys.stderr)
        return 1
    print(f"spark_jvm: our pyspark {jvm.ours}; {jvm.describe()}; jars {jvm.jars}; "
          f"ready in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
