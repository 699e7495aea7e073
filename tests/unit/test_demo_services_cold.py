"""A first run on a cold machine (issue 41, "Cold first runs work and speak").

- The schema registry's build (minutes from Maven Central on a first run) happens before its
  start and does not eat the start's readiness deadline; a failure names its phase and the
  right log: Maven's for the build, the registry's for the start.
- Every long step says how it is going at least every ``progress.PERIOD`` seconds (the
  heartbeat's cadence on a fake clock; Maven's downloads read from its log).

No network and no real JVM: ``mvn`` and ``java`` are doubles on ``PATH`` (a slow Maven that
logs downloads and writes what the real one would; a "registry" that answers Confluent's
``/subjects`` over loopback HTTP), so the real code paths (subprocesses, logs, deadlines)
run as they do on a fresh machine.
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.core.errors import ConnectorError
from connectors.demo.services import kafka, maven, progress, registry
from connectors.demo.services.progress import Heartbeat, heartbeat

FAKE_MVN = """\
    import os, sys, time
    args = sys.argv[1:]
    for name in ("kafka-clients-4.1.2.pom", "kafka-clients-4.1.2.jar"):
        print(f"Downloading from central: https://repo.maven.apache.org/{name}", flush=True)
        print(f"Downloaded from central: https://repo.maven.apache.org/{name} (1 kB)", flush=True)
    print("[INFO] --- quarkus-maven-plugin:3.15.1:build (default) @ app ---", flush=True)
    time.sleep(float(os.environ.get("FAKE_MVN_SECONDS", "0")))
    if os.environ.get("FAKE_MVN_FAIL"):
        print("[ERROR] Failed to execute goal: Could not resolve dependencies", flush=True)
        sys.exit(1)
    flag = lambda name: next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))
    if "package" in args:  # the registry's build: a runner jar and its lib/
        target = os.path.join(os.path.dirname(args[args.index("-f") + 1]), "target")
        os.makedirs(os.path.join(target, "lib"))
        open(os.path.join(target, "registry-runner.jar"), "w").close()
    else:  # dependency:copy-dependencies
        open(os.path.join(flag("-DoutputDirectory"), "kafka_2.13-4.1.2.jar"), "w").close()
"""

FAKE_JAVA = """\
    import http.server, json, os, sys, time
    args = sys.argv[1:]
    if os.environ.get("FAKE_JAVA_FAIL"):
        print("fake JVM: cannot start (FAKE_JAVA_FAIL)", flush=True)
        sys.exit(3)
    if "kafka.tools.StorageTool" in args:  # a slow format that fails
        time.sleep(float(os.environ.get("FAKE_JAVA_SECONDS", "0")))
        print("fake StorageTool: no storage here", flush=True)
        sys.exit(2)
    if os.environ.get("FAKE_JAVA_SILENT"):  # a JVM that never listens
        time.sleep(600)
    port = int(next(a.split("=", 1)[1] for a in args if a.startswith("-Dquarkus.http.port=")))

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"version": "fake"} if "system/info" in self.path else [])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

    http.server.HTTPServer(("127.0.0.1", port), Registry).serve_forever()
"""


@pytest.fixture
def cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache and the ``mvn``/``java`` doubles first on PATH; progress lines every
    0.2 s instead of 10 s."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("mvn", FAKE_MVN), ("java", FAKE_JAVA)):
        tool = bin_dir / name
        tool.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("EO_CONNECTORS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(progress, "PERIOD", 0.2)
    return tmp_path


class Lines(list[str]):
    """A ``say`` that keeps what it was told (called from the heartbeat's thread too)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            self.append(line)

    def saying(self, text: str) -> list[str]:
        with self._lock:
            return [line for line in self if text in line]


# -- the registry: build, then start ---------------------------------------------------------
def test_a_slow_build_does_not_eat_the_start_deadline(cold: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN_SECONDS", "4")  # the build alone outlasts the start's 3 s
    said = Lines()
    reg = registry.LocalRegistry(workdir=str(cold / "reg"))
    began = time.monotonic()
    try:
        reg.start(timeout=3.0, progress=said)
        took = time.monotonic() - began
    finally:
        reg.stop()
    assert took > 4.0, took  # the build ran inside this start ...
    assert reg.started_in is not None and reg.started_in < 3.0  # ... and the start had its 3 s
    assert reg.version == "fake"
    built = registry.build()  # cached: no second build
    assert (built / "registry-runner.jar").exists() and (built / "lib").is_dir()
    building = said.saying("still building the schema registry (Apicurio) from Maven Central")
    assert building, list(said)
    assert "2 files downloaded so far, running quarkus-maven-plugin:build" in building[-1]


def test_a_failed_build_names_the_build_and_maven_s_log(cold: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN_FAIL", "1")
    reg = registry.LocalRegistry(workdir=str(cold / "reg"))
    with pytest.raises(ConnectorError) as e:
        reg.start(timeout=3.0, progress=Lines())
    message = str(e.value)
    [maven_log] = (cold / "cache" / "registry").glob("apicurio-*.build.log")
    assert message.startswith("building the schema registry from ")
    assert f"mvn exit 1; Maven's log: {maven_log}" in message
    assert "[ERROR] Failed to execute goal" in message and "registry.log" not in message
    assert "Could not resolve dependencies" in maven_log.read_text()
    assert reg.pid is None  # nothing was launched


def test_a_registry_that_dies_at_start_names_the_registry_s_log(
        cold: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.build(progress=Lines())
    monkeypatch.setenv("FAKE_JAVA_FAIL", "1")
    reg = registry.LocalRegistry(workdir=str(cold / "reg"))
    with pytest.raises(ConnectorError) as e:
        reg.start(timeout=30.0, progress=Lines())
    assert f"exited with code 3 during start-up (its log: {reg.log_path})" in str(e.value)
    assert "cannot start (FAKE_JAVA_FAIL)" in str(e.value)


def test_a_registry_that_never_answers_names_the_start_and_its_log(
        cold: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.build(progress=Lines())
    monkeypatch.setenv("FAKE_JAVA_SILENT", "1")
    said = Lines()
    reg = registry.LocalRegistry(workdir=str(cold / "reg"))
    with pytest.raises(ConnectorError) as e:
        reg.start(timeout=1.0, progress=said)
    message = str(e.value)
    assert "did not answer within 1s of its start (its build was done before" in message
    assert f"its log: {reg.log_path}" in message and "not polled yet" not in message
    assert said.saying("still starting the schema registry on http://127.0.0.1:")
    assert reg.pid is None  # stopped, its work directory kept for the log
    assert Path(reg.log_path).exists()


# -- Maven: resolution into a log, with progress ----------------------------------------------
def test_resolve_says_how_many_files_maven_downloaded(cold: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN_SECONDS", "1")
    said = Lines()
    jars = maven.resolve("kafka", progress=said)
    assert maven.jar_version(jars, "kafka_2.13") == "4.1.2"
    assert said.saying("still resolving the 'kafka' jars from Maven Central ("), list(said)
    assert "2 files downloaded so far" in said[-1]
    assert jars.with_suffix(".log").read_text().count("Downloaded from central") == 2


def test_a_failed_resolution_names_maven_s_log_and_its_errors(
        cold: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN_FAIL", "1")
    with pytest.raises(ConnectorError) as e:
        maven.resolve("kafka", progress=Lines())
    message = str(e.value)
    assert ("cannot resolve the 'kafka' jars from Maven Central (mvn exit 1; Maven's log: "
            in message)
    assert message.endswith("[ERROR] Failed to execute goal: Could not resolve dependencies")
    assert not [p for p in (cold / "cache" / "jvm").iterdir() if p.is_dir()]  # no half result


def test_maven_over_its_bound_is_killed_and_named(cold: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN_SECONDS", "60")
    began = time.monotonic()
    with pytest.raises(ConnectorError, match=r"resolving the 'kafka' jars from Maven Central "
                       r"took over 1s \(Maven's log: .*kafka-\w+\.log\)"):
        maven.resolve("kafka", timeout=1.0, progress=Lines())
    assert time.monotonic() - began < 30


def test_maven_log_counts_whole_lines_and_names_the_running_goal(tmp_path: Path) -> None:
    path = tmp_path / "mvn.log"
    watched = maven.MavenLog(path)
    assert watched.status("resolving x", 12.3) == (
        "still resolving x (12 s; 0 files downloaded so far)")
    path.write_bytes(b"Downloaded from central: a.pom\n[INFO] --- maven-dependency-plugin:3.8.1"
                     b":copy-dependencies (default-cli) @ eo ---\nDownloaded from cen")
    assert watched.read().downloaded == 1
    assert watched.goal == "maven-dependency-plugin:copy-dependencies"
    with open(path, "ab") as f:
        f.write(b"tral: b.jar\n")
    assert watched.status("resolving x", 20) == (
        "still resolving x (20 s; 2 files downloaded so far, running "
        "maven-dependency-plugin:copy-dependencies)")


# -- the broker start says how it goes too ------------------------------------------------------
def test_a_slow_broker_start_says_what_it_is_doing(cold: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_JAVA_SECONDS", "1.5")
    said = Lines()
    broker = kafka.ApacheKafka(workdir=str(cold / "kafka"))
    with pytest.raises(ConnectorError, match="formatting Kafka storage in .* failed: fake"):
        broker.start(progress=said)
    assert said.saying(f"still starting Apache Kafka 4.1.2 on {broker.bootstrap} ("), list(said)
    assert "s; formatting its storage; its log: " in said[-1]


def test_the_demo_speaks_of_maven_only_while_it_resolves(cold: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A first run says it resolves Apache Kafka's jars and when that finished; a run on the
    cache says nothing of Maven (issue 50: the first-run line came on every run)."""
    from connectors.demo.local_services import start_broker

    monkeypatch.setenv("FAKE_JAVA_FAIL", "1")  # the broker's start fails at once after
    for run in ("first", "cached"):
        said = Lines()
        with pytest.raises(ConnectorError):
            start_broker(str(cold / run), said)
        resolving = said.saying("resolving Apache Kafka's jars with Maven")
        finished = said.saying("  resolved Apache Kafka's jars in ")
        assert (len(resolving), len(finished)) == ((1, 1) if run == "first" else (0, 0)), said
        assert said.saying("starting a local Kafka broker..."), said
    assert maven.cached("kafka") is not None


# -- the heartbeat --------------------------------------------------------------------------------
class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_heartbeat_speaks_every_period_and_never_between() -> None:
    clock, said = FakeClock(), Lines()
    beat = Heartbeat(said, lambda elapsed: f"{elapsed:.1f}", period=10.0, clock=clock)
    spoke_at = []
    for _ in range(130):  # 65 s, a beat asked for every 0.5 s
        clock.now += 0.5
        if beat.beat():
            spoke_at.append(clock.now - 1000.0)
    assert spoke_at == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert said == ["10.0", "20.0", "30.0", "40.0", "50.0", "60.0"]
    assert beat.due_in() == pytest.approx(5.0)


def test_a_late_beat_says_one_line_and_keeps_the_grid() -> None:
    clock, said = FakeClock(), Lines()
    beat = Heartbeat(said, lambda elapsed: f"{elapsed:.0f}", period=10.0, clock=clock)
    clock.now += 9.9
    assert not beat.beat() and beat.due_in() == pytest.approx(0.1)
    clock.now += 35.1  # 45 s: a suspended machine, or a beat asked for late
    assert beat.beat() and said == ["45"]
    assert not beat.beat()
    assert beat.due_in() == pytest.approx(5.0)  # next at 50 s, not at 55 s
    with pytest.raises(ValueError, match="period must be positive"):
        Heartbeat(said, str, period=0)


def test_the_heartbeat_thread_speaks_while_the_block_runs_and_stops_with_it() -> None:
    said = Lines()
    with heartbeat(said, lambda elapsed: f"still waiting ({elapsed:.2f} s)", period=0.05):
        deadline = time.monotonic() + 30
        while len(said.saying("still waiting")) < 3:
            assert time.monotonic() < deadline, list(said)
            time.sleep(0.01)
    assert not [t for t in threading.enumerate() if t.name == "eo-progress"]
    with pytest.raises(RuntimeError, match="the step failed"), \
            heartbeat(said, str, period=0.05):
        raise RuntimeError("the step failed")
    assert not [t for t in threading.enumerate() if t.name == "eo-progress"]


def test_say_or_log_logs_at_info_without_a_say(caplog: Any) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="eo.test")
    progress.say_or_log(None, logging.getLogger("eo.test"))("still here (10 s)")
    assert [r.getMessage() for r in caplog.records] == ["still here (10 s)"]
