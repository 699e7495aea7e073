"""The demo, run once as a new user would (issues 35, 36, 50; one run, for CI's time budget):
in CI by scripts/release_check.py, from the wheel installed on the lowest Python declared with
the lowest pyspark, from a directory the repository cannot be imported from
(``EO_TEST_INSTALLED=1``); marked ``release``, so scripts/run-tests' tiers leave it to that.
Run by hand in a checkout, it runs the checkout's code.

- with ``--keep-broker`` it leaves its own broker running and its work directory in place,
  and every command it prints for them runs and answers (lag and transactions included);
  the printed stop command stops the broker;
- ``--format avro``: lines written by confluent-kafka's AvroSerializer, read by the source
  into a typed column, counts written by the sink as Avro and checked by confluent-kafka's
  AvroDeserializer, against a registry the demo starts itself;
- its console, as into a pipe or a CI log: with ``--json`` the report alone is on stdout
  and the progress lines on stderr, where it says what it is doing before each long wait
  (starting the broker and the registry, producing, starting Spark; nothing of Maven when
  the jars are cached), in plain lines (no carriage-return frames), with no raw librdkafka
  line (``%4|...|GETPID|...``);
- what it leaves in ``/tmp`` (issue 50): it runs with a ``/tmp`` of its own
  (tests/private_tmp.py), which holds nothing once it has ended, though one pipeline run was
  SIGKILLed and its broker still runs: Spark's scratch and the metrics spool went under its
  work directory, and its JVMs write no perf data."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import private_tmp
from tests.helpers import REPO, REQUIRE, unavailable, wait_for


def _alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for whoever adopted it to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A directory not under /tmp (the demo's own /tmp hides that one), removed after."""
    root = Path(tempfile.mkdtemp(prefix="eo-demo-test-",
                                 dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


#: Run as an installed user: the package from site-packages, from a directory without the
#: repository (scripts/release_check.py sets it).
INSTALLED = os.environ.get("EO_TEST_INSTALLED") == "1"

pytestmark = pytest.mark.release


def test_demo_keep_broker_prints_commands_that_all_answer(outside_tmp: Path) -> None:
    workdir = outside_tmp / "demo"
    listing = outside_tmp / "tmp-after-demo"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} if INSTALLED else {
        **os.environ, "PYTHONPATH": REPO}
    cwd = str(outside_tmp) if INSTALLED else REPO
    argv = [sys.executable, "-m", "connectors", "demo", "--json", "--keep-broker", "--workdir",
            str(workdir), "--kills", "1", "--lines", "3000", "--batch-size", "500", "--seed",
            "36", "--format", "avro"]
    private = private_tmp.available()
    if not private and REQUIRE:  # elsewhere the demo runs, its /tmp unchecked
        unavailable("a mount namespace (unshare -m)", "needed to see what the demo leaves in "
                    "/tmp, as root")
    proc = subprocess.run(private_tmp.wrap(argv, listing) if private else argv,
                          capture_output=True, text=True, cwd=cwd, timeout=900, env=env,
                          check=False)
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    inspect = report.get("inspect") or {}
    stop = inspect.get("stop_broker")
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # nothing in its /tmp: not the killed run's spark-*/blockmgr-*, the metrics spool,
        # lz4-java's liblz4-java-*.so, nor the kept broker's JVM perf data
        assert not private or private_tmp.left(listing) == [], private_tmp.left(listing)
        assert not (workdir / "scratch").exists()  # the runs' scratch went with the demo
        assert report["ok"] and inspect["broker_running"] and stop, inspect
        assert report["format"] == "avro" and all(
            s["missing"] == 0 and s["duplicates"] == 0 for s in report["sinks"]), report
        assert inspect["workdir"] == str(workdir)
        _assert_plain_progress(proc.stderr, proc.stdout)
        assert "metrics: http://127.0.0.1:" in proc.stderr  # where its metrics can be seen
        _assert_wire_format(inspect["bootstrap"], report["sink_id"])
        for command in inspect["commands"]:
            argv = shlex.split(command)
            assert argv[:3] == ["python", "-m", "connectors"]
            done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                                  cwd=cwd, timeout=120, env=env, check=False)
            assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
            assert done.stdout.strip(), command
            _assert_truthful(argv[3], done.stdout)
        # every 5 s line names every sink (eo_jdbc was missing)
        lines = [line for line in proc.stderr.splitlines() if "Spark committed batch" in line]
        assert all("eo_jdbc last batch" in line and "eo_kafka last batch" in line
                   and "eo_files " in line for line in lines), lines
    finally:
        if stop:
            pid = int(stop.rsplit("-", 1)[1])
            subprocess.run(shlex.split(stop), check=False)
            assert wait_for(lambda: not _alive(pid), 60, what="the kept broker to stop")



def _assert_truthful(command: str, out: str) -> None:
    """What a newcomer reads right after the demo (issue 50): ``lag`` names its whole lag as
    the source's last window, pending after the finished AvailableNow run, not as unread
    data; ``wal show`` prints what each entry holds, never ``{}``."""
    if command == "lag":
        total = re.search(r"total lag (\d+)", out)
        assert total and int(total.group(1)) > 0, out
        assert f"\n  {total.group(1)} of it: window " in out and "PENDING" in out, out
        assert "the other" not in out, out
    if command == "wal":
        assert "{}" not in out, out
        assert "sink_id demo-" in out or "[source]" in out, out


def _assert_wire_format(bootstrap: str, sink_id: str) -> None:
    """What the sink wrote is the Confluent wire format (magic byte 0, a schema id), not
    JSON text."""
    from confluent_kafka import Consumer, TopicPartition

    topic = f"demo-counts-{sink_id.removeprefix('demo-')}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-avro-check",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        first = next(m for m in iter(lambda: consumer.poll(10), None) if m.error() is None)
        assert first.value()[:1] == b"\x00" and len(first.value()) > 5, first.value()[:20]
    finally:
        consumer.close()


def _assert_plain_progress(err: str, out: str) -> None:
    assert "\r" not in out and "\r" not in err
    raw = [line for line in (out + err).splitlines() if re.match(r"%\d\|", line)]
    assert raw == [], raw
    # the jars are cached (scripts/run-tests resolves them first): no word of Maven
    assert "Maven" not in err, err
    steps = ["starting a local Kafka broker", "Apache Kafka ",
             "Schema Registry", "producing 3000 lines", "produced 3000/3000 lines",
             "the pipeline runs Spark in a child process", "run 1: pipeline with",
             "final run: restart from the checkpoint", "work directory kept"]
    at = [err.find(s) for s in steps]
    assert -1 not in at and at == sorted(at), dict(zip(steps, at, strict=True))
