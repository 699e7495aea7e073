"""``doctor``'s checks of this install: Python, pyspark, confluent-kafka and its librdkafka,
the optional C extensions and the Kafka sink's produce path, Java and Maven."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.doctor.checks import FAIL, OK, WARN, Check

DIST = "pyspark-exactly-once"
#: Reinstalling builds the optional extensions where a C compiler and Python's headers are.
BUILD_HINT = ("install a C compiler and Python's headers (Debian: apt-get install gcc "
              "python3-dev), then reinstall: pip install --force-reinstall --no-deps "
              f"{DIST} (in a checkout: pip install -e .)")


def _required(dist: str) -> str:
    """The version specifier this package requires of ``dist`` ("" when unknown)."""
    try:
        for req in importlib.metadata.requires(DIST) or []:
            name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]
            if name.lower() == dist.lower() and ";" not in req:
                return req[len(name):].strip()
    except importlib.metadata.PackageNotFoundError:
        pass
    return ""


def _satisfies(version: str, spec: str) -> bool | None:
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:  # pragma: no cover - packaging comes with pip and setuptools
        return None
    return SpecifierSet(spec).contains(version, prereleases=True)


def _version_check(name: str, dist: str, version: str | None, extra: str = "") -> Check:
    spec = _required(dist)
    if version is None:
        return Check("install", name, FAIL, "not installed", f'pip install "{dist}{spec}"')
    fits = _satisfies(version, spec) if spec else True
    found = f"{version}{extra}" + (f" (this package requires {spec})" if spec else "")
    if fits is False:
        return Check("install", name, FAIL, found, f'pip install "{dist}{spec}"')
    return Check("install", name, OK, found)


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


#: The optional C extensions (setup.py builds each where a C compiler is; a unit test holds
#: this table to setup.py): module -> (what it does when built, what happens without it).
EXTENSIONS = {
    "connectors.kafka.wire._record_batch": (
        "Kafka record batches are encoded from Arrow buffers in C: the Kafka sink's wire path "
        "(wireProduce)",
        "the Kafka sink produces through librdkafka, whatever wireProduce says (same records, "
        "more CPU per record)"),
    "connectors.kafka.sink._keyed_produce": (
        "the recovery-key mode hands librdkafka a batch in one C loop",
        "the recovery-key mode's librdkafka path hands records to librdkafka one by one from "
        "Python (same records, more CPU per record)"),
    "connectors.kafka.registry._avro_decode": (
        "flat Avro records are decoded (the source) and encoded (the Kafka sink) column by "
        "column in C (valueFormat/keyFormat=avro)",
        "every Avro record is decoded and encoded by fastavro (same rows, more CPU per "
        "record)"),
}


def _extension(module: str) -> str | None:
    """None when the extension imports, else why not."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        return str(e) or type(e).__name__
    return None


def install_checks(kafka_conf: Mapping[str, Any] | None = None) -> list[Check]:
    checks = []
    python = ".".join(map(str, sys.version_info[:3]))
    checks.append(_python_check(python))
    checks.append(_version_check("pyspark", "pyspark", _dist_version("pyspark")))
    try:
        import confluent_kafka

        lib = confluent_kafka.libversion()[0]
        version = _dist_version("confluent-kafka") or str(confluent_kafka.__version__)
        checks.append(_version_check("confluent-kafka", "confluent-kafka", version,
                                     f", librdkafka {lib}"))
    except ImportError:
        checks.append(_version_check("confluent-kafka", "confluent-kafka", None))
        return checks
    checks += extension_checks(kafka_conf or {})
    checks += [_java(), _maven()]
    return checks


def _python_check(version: str) -> Check:
    spec = ""
    try:
        spec = importlib.metadata.metadata(DIST)["Requires-Python"] or ""
    except importlib.metadata.PackageNotFoundError:
        pass
    fits = _satisfies(version, spec) if spec else True
    found = f"{version} ({sys.executable})"
    if fits is False:
        return Check("install", "python", FAIL, f"{found}; this package requires {spec}",
                     f"use a Python {spec}")
    return Check("install", "python", OK, found)


def extension_checks(kafka_conf: Mapping[str, Any]) -> list[Check]:
    """The C extensions, and the produce path the Kafka sink takes with them."""
    from connectors.kafka import clients
    from connectors.kafka.sink import batch_produce
    from connectors.kafka.sink.options import KAFKA_SINK_OPTIONS

    checks = []
    for module, (built, without) in EXTENSIONS.items():
        name = f"C extension {module.rsplit('.', 1)[1]}"
        why = _extension(module)
        if why is not None:
            checks.append(Check("install", name, WARN, f"not built ({why}): {without}",
                                BUILD_HINT))
        elif module.endswith("_keyed_produce") and not batch_produce.keyed_available():
            checks.append(Check("install", name, WARN,
                                "built, but not usable with this confluent-kafka (it was "
                                f"checked with 2.x on CPython): {without}",
                                "use confluent-kafka 2.x on CPython"))
        else:
            checks.append(Check("install", name, OK, f"built: {built}"))
    default = next(o.default for o in KAFKA_SINK_OPTIONS if o.spark == "wireProduce")
    why = clients.produce_refusal(dict(kafka_conf))
    name = "Kafka sink produce path"
    if not default:
        checks.append(Check("install", name, OK, "librdkafka (wireProduce=false, the "
                            "default); wireProduce=true: " + (
                                "record batches on the wire" if why is None else
                                f"librdkafka too, because {why}")))
    elif why is None:
        checks.append(Check("install", name, OK,
                            "record batches on the wire (wireProduce=true, the default), for "
                            "rows without a headers column; transactions there need brokers "
                            "that verify partitions, Kafka 3.6+ (the broker lines with "
                            "--bootstrap say)"))
    else:
        checks.append(Check("install", name, WARN,
                            f"librdkafka, not the wire path (wireProduce=true, the default), "
                            f"because {why}: same records, more CPU per record",
                            BUILD_HINT if "extension" in why else
                            "nothing, if that setting is needed (docs/kafka-sink.md, "
                            "\"Produce paths\")"))
    return checks


def _run(argv: Sequence[str]) -> str | None:
    """The first lines a version command prints (None: it did not run)."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, a tool found on PATH
            list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr).strip()
    return text if done.returncode == 0 and text else None


_SERVICES = ("the demo's local Kafka broker and the tests' services (Kafka, HDFS, the schema "
             "registry) run on it; give the demo --bootstrap to use a broker of your own")


def _java() -> Check:
    java = shutil.which("java")
    if java is None:
        return Check("install", "java", WARN, f"not on PATH: {_SERVICES}",
                     "install Java 17 (Debian: apt-get install openjdk-17-jdk-headless)")
    out = _run([java, "-version"]) or ""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return Check("install", "java", WARN, f"{java} did not say its version",
                     "install Java 17")
    major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
    first = out.splitlines()[0]
    if major < 17:
        return Check("install", "java", WARN, f"{first}: Kafka 4 and the local services "
                     "need Java 17 or later", "install Java 17")
    return Check("install", "java", OK, f"{first} ({java})")


def _maven() -> Check:
    mvn = shutil.which("mvn")
    if mvn is None:
        return Check("install", "maven", WARN, "not on PATH: it resolves the local services' "
                     f"jars from Maven Central once; {_SERVICES}",
                     "install Maven 3.8+ (Debian: apt-get install maven)")
    out = _run([mvn, "-v", "-B"]) or ""
    m = re.search(r"Apache Maven (\d+)\.(\d+)(\.\d+)?", out)
    if not m:
        return Check("install", "maven", WARN, f"{mvn} did not say its version",
                     "install Maven 3.8+")
    found = m.group(0)
    if (int(m.group(1)), int(m.group(2))) < (3, 8):
        return Check("install", "maven", WARN, f"{found}: the services' pom needs 3.8+",
                     "install Maven 3.8+")
    return Check("install", "maven", OK, f"{found} ({mvn})")
