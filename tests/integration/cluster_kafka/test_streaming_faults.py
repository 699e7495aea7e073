"""A long-running Spark application on the replicated cluster through node kills and a
rolling restart of every node (issue 34): the ``eo_kafka`` source and four ``eo_kafka`` sink
queries (each delivery mode on each produce path) must never fail, and each output topic
must hold every input value once.

The test keeps producing to the source topic while it SIGKILLs the leader of the output
topics' first partition (restarted 10 s later) and then restarts the three nodes one by one
with a controlled shutdown, as a rolling upgrade does, all with default settings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

from connectors.demo.services.kafka import produce_records
from tests.helpers import REPO, assert_topic_exact, scan_topic
from tests.integration.cluster_kafka.conftest import VARIANTS

APP = "tests/integration/cluster_kafka/pipelines/fault_app.py"
BEFORE, DURING = 12_000, 24_000


def _records(start: int, n: int) -> list[tuple[bytes | None, bytes, int]]:
    return [(f"k{i % 113}".encode(), f"v-{i:08d}".encode(), i % 4)
            for i in range(start, start + n)]


def _distinct(bootstrap: str, topic: str) -> int:
    messages, _ = scan_topic(bootstrap, topic, isolation="read_committed", timeout=60)
    return len(Counter(m.value() for m in messages))


def test_queries_ride_through_node_kills_and_a_rolling_restart(cluster, cluster_topic,
                                                               tmp_path):
    src = cluster_topic(4, "src")
    sinks = {name: cluster_topic(4, name) for name in VARIANTS}
    produce_records(cluster.bootstrap, src, _records(0, BEFORE))
    stop = tmp_path / "stop"
    argv = [sys.executable, APP, "--bootstrap", cluster.bootstrap, "--source-topic", src,
            "--work", str(tmp_path / "work"), "--stop", str(stop)]
    for name, topic in sinks.items():
        transactional, wire = VARIANTS[name]
        argv += ["--sink", f"{name}:{topic}:{str(transactional).lower()}:{str(wire).lower()}"]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("CONNECTORS_FAILPOINTS", None)
    log = open(tmp_path / "app.log", "wb")  # noqa: SIM115 - closed below
    app = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                           start_new_session=True)

    def output() -> str:
        return (tmp_path / "app.log").read_text(errors="replace")

    def alive() -> None:
        assert app.poll() is None, f"the application ended ({app.returncode}):\n" \
                                   f"{output()[-5000:]}"

    try:
        deadline = time.monotonic() + 240
        while min(_distinct(cluster.bootstrap, t) for t in sinks.values()) < 2_000:
            alive()
            assert time.monotonic() < deadline, f"no query wrote 2,000 rows:\n{output()[-5000:]}"
            time.sleep(2)
        producer = threading.Thread(target=lambda: [
            produce_records(cluster.bootstrap, src, _records(BEFORE + k * 1000, 1000))
            or time.sleep(1) for k in range(DURING // 1000)], daemon=True)
        producer.start()
        victim = cluster.leader(next(iter(sinks.values())), 0)
        cluster.kill(victim)
        time.sleep(10)
        alive()
        cluster.restart(victim)
        cluster.wait_in_sync()
        cluster.rolling_restart(between=lambda _node: alive())
        producer.join(300)
        total = BEFORE + DURING
        deadline = time.monotonic() + 300
        while True:
            alive()
            done = {name: _distinct(cluster.bootstrap, t) for name, t in sinks.items()}
            if min(done.values()) >= total:
                break
            assert time.monotonic() < deadline, f"not all rows copied: {done}"
            time.sleep(3)
        stop.touch()
        assert app.wait(120) == 0, output()[-5000:]
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait(30)
        log.close()
    assert "QUERY FAILED" not in output()
    for topic in sinks.values():
        assert_topic_exact(cluster.bootstrap, topic, {"v": BEFORE + DURING})
