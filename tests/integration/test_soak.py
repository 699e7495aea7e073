"""Soak and fault tests of the whole suite: the demo's three-sink pipeline
(``eo_kafka`` -> word count per batch -> ``eo_jdbc`` + ``eo_kafka`` + ``eo_files``) under
random SIGKILLs and a broker connection loss, verified exactly. (A database outage longer
than the JDBC sink's retry budget is test_jdbc_faults.py's, with every other database fault.)

Short by default so CI stays in budget; ``--soak-minutes N`` scales the work up.
The CLI is then exercised against the state these pipelines left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from connectors.core.options import redact_url
from connectors.demo import app as demo
from connectors.demo.services.kafka import create_topic, free_port
from tests.helpers import REPO, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.soak


def _scale(request: pytest.FixtureRequest, base: int) -> int:
    minutes = request.config.getoption("--soak-minutes")
    return base if not minutes else int(base * max(1.0, minutes))


def _cfg(tmp_path, bootstrap: str, db_url: str, batch_size: int = 1000) -> dict:
    tag = uuid.uuid4().hex[:8]
    return {
        "bootstrap": bootstrap, "in_topic": f"soak-in-{tag}", "out_topic": f"soak-out-{tag}",
        "checkpoint": str(tmp_path / "chk"), "wal": str(tmp_path / "wal"),
        "files": str(tmp_path / "files"), "db_url": db_url, "table": f"soak_{tag}",
        "sink_id": f"soak-{tag}", "batch_size": batch_size, "naive_jdbc": False,
    }


def _produce(cfg: dict, lines: int, seed: int = 5):
    import random

    create_topic(cfg["bootstrap"], cfg["in_topic"], 4)
    create_topic(cfg["bootstrap"], cfg["out_topic"], 2)
    return demo.produce_lines(cfg["bootstrap"], cfg["in_topic"], lines, 4, random.Random(seed))


def _assert_exact(cfg: dict, truth) -> None:
    checks = demo.verify(cfg, truth)
    bad = [c for c in checks if not c.ok]
    assert not bad, [(c.name, c.duplicates, c.missing, c.wrong_words[:5]) for c in bad]


def _committed_batches(checkpoint: str) -> int:
    d = os.path.join(checkpoint, "commits")
    return len([n for n in os.listdir(d) if n.isdigit()]) if os.path.isdir(d) else 0


def _start_pipeline(cfg: dict, log_path: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO, "PYSPARK_PYTHON": sys.executable}
    env.pop("CONNECTORS_FAILPOINTS", None)
    log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "connectors.demo.pipeline", json.dumps(cfg)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                            start_new_session=True)


def _reap(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "connectors", *args, "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_random_kills_then_cli_reads_the_real_state(request, kafka_bootstrap, postgres_url,
                                                    tmp_path):
    """Kill the driver at 2 random moments mid-stream; every sink ends exact. Then the
    operator CLI reads the WALs, the JDBC metadata, the group lag and the file log that
    this run produced. (Every protocol step's kill is the recovery tests'; these land
    wherever the clock puts them.)"""
    kills = _scale(request, 2)
    workdir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "connectors", "demo", "--json", "--bootstrap", kafka_bootstrap,
         "--db-url", postgres_url, "--workdir", str(workdir), "--kills", str(kills),
         # 8 batches: room for 2 kills that each land 1-3 batches further on
         "--lines", str(_scale(request, 8000)), "--batch-size", "1000", "--seed", "1234"],
        capture_output=True, text=True, cwd=REPO, timeout=1500,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["kills"] == kills, report["crashes"]
    for sink in report["sinks"]:
        assert sink["duplicates"] == 0 and sink["missing"] == 0, sink
        assert sink["total_got"] == report["words_in"]

    sink_id = report["sink_id"]
    # wal show: the source's windows and the Kafka sink's batches, all committed at the end
    wal = _cli("wal", "show", str(workdir / "wal" / "source"))
    entries = [e for log in wal["logs"].values() for e in log["entries"]]
    assert entries and all(e["committed"] for e in entries[:-1])
    # sink status: the JDBC sink's last committed batch, from eo_sink_commits
    status = _cli("sink", "status", "--url", postgres_url, "--sink-id", sink_id)
    assert len(status["sinks"]) == 1 and status["sinks"][0]["batch_id"] >= 7
    assert status["url"] == redact_url(postgres_url)
    # lag: the source commits each committed window's end to its consumer group. Spark calls
    # a source's commit(end) only when it plans the next batch, so after an AvailableNow run
    # the group trails by the last window (at most one batch of lag).
    lag = _cli("lag", "--bootstrap", kafka_bootstrap, "--group", sink_id)
    last_done = [e for e in entries if e["committed"]][-1]["record"]["end"]
    assert lag["partitions"]
    for p in lag["partitions"]:
        assert p["committed"] == last_done[p["topic"]][str(p["partition"])], (p, last_done)
    assert 0 <= lag["total_lag"] <= 1000
    # files status: one committed entry per batch, files listed
    files = _cli("files", "status", str(workdir / "files-out"))
    assert len(files["batches"]) == status["sinks"][0]["batch_id"] + 1
    assert files["files"] >= len(files["batches"])


def test_protection_disabled_demo_detects_duplicates(kafka_bootstrap, tmp_path):
    """Proof that the demo's check can fail: with the JDBC sink swapped for a naive
    accumulate and a crash after its DB commit, the replayed batch is counted twice."""
    proc = subprocess.run(
        [sys.executable, "-m", "connectors", "demo", "--json", "--bootstrap", kafka_bootstrap,
         "--workdir", str(tmp_path), "--kills", "1", "--lines", "3000", "--seed", "99",
         "--naive-jdbc", "--crash-at", "jdbc.after_commit@1"],
        capture_output=True, text=True, cwd=REPO, timeout=900,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    jdbc = next(s for s in report["sinks"] if s["name"].startswith("eo_jdbc"))
    assert jdbc["duplicates"] > 0 and not jdbc["ok"]
    assert all(s["ok"] for s in report["sinks"] if not s["name"].startswith("eo_jdbc"))


def test_broker_connection_loss_recovers_exactly(request, tmp_path, broker_factory):
    """All client connections to the broker go through a TCP proxy we control (the broker
    advertises the proxy's port). Cutting them mid-stream must not lose or double a record:
    the pipeline recovers by itself or fails clearly and recovers on restart."""
    proxy_port = free_port()
    broker = broker_factory(advertised_port=proxy_port)
    proxy = TcpProxy(broker.port, listen_port=proxy_port).start()
    try:
        cfg = _cfg(tmp_path, f"127.0.0.1:{proxy_port}", f"sqlite:///{tmp_path / 'wc.db'}")
        truth = _produce(cfg, _scale(request, 10000))
        log = str(tmp_path / "pipeline.log")
        restarts = 0
        drops = 0
        proc = _start_pipeline(cfg, log)
        try:
            wait_for(lambda: _committed_batches(cfg["checkpoint"]) >= 2 or proc.poll() is not None,
                     300, what="two committed batches before the cut")
            for _ in range(2):
                if proc.poll() is not None:
                    break
                drops += proxy.pause(2.0)
                done = _committed_batches(cfg["checkpoint"])
                wait_for(lambda d=done: _committed_batches(cfg["checkpoint"]) > d
                         or proc.poll() is not None, 300, what="progress after the cut")
            while proc.wait(timeout=900) != 0:
                restarts += 1
                assert restarts <= 3, open(log, errors="replace").read()[-3000:]
                proc = _start_pipeline(cfg, log)
        finally:
            _reap(proc)
        assert drops > 0, "the proxy never carried a connection"
        _assert_exact(cfg, truth)
    finally:
        proxy.stop()
