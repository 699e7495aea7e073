"""A real scrape (issue 44): Debian's Prometheus scrapes ``connectors.monitoring.serve`` every
second while an ``eo_kafka`` -> ``eo_jdbc`` query runs, is killed (driver, JVM and the
committing worker, with batch 2's commit open) and restarted; the values read back through
Prometheus' HTTP API are checked against the known input:

- rows committed, summed over both driver runs (a counter starts again with its process),
  equal the rows produced, and equal what the table holds;
- offsets behind latest is 40 while the first run is held at batch 2 (after batches 0-1 of
  20 records each, of 100) and back to 0 after the drain;
- the source's window commits, its WAL's files and the storage creates of both (a Python
  worker of the driver's JVM each, spooled to the endpoint) are there;
- a task attempt of batch 3 that fails once (a ``raise`` failpoint) counts as one failed
  attempt of ``family="eo_jdbc"``, the family label of every other series (issue 50: it was
  ``jdbc``), and the batch's rows once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from connectors.core.failpoints import pause_paths
from tests.helpers import REPO, unavailable, wait_for
from tests.services.prometheus import Prometheus, find_binary, free_port

pytestmark = pytest.mark.integration

RECORDS = 100
PER_BATCH = 20
HELD = "jdbc.before_commit@2!pause"


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(tmp_path: Path, metrics_port: int) -> Iterator[Prometheus]:
    binary = find_binary()
    if binary is None:
        unavailable("Prometheus", "no `prometheus` binary (Debian package prometheus; "
                    "scripts/run-tests installs it)")
    assert binary is not None
    server = Prometheus.start(binary, tmp_path / "prometheus", [f"127.0.0.1:{metrics_port}"])
    try:
        yield server
    finally:
        server.stop()


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    full = {**os.environ, **env, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen([sys.executable, *argv], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def kill_group(proc: subprocess.Popen[bytes]) -> str:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out, _ = proc.communicate(timeout=60)
    return out.decode(errors="replace")[-4000:] if out else ""


def test_prometheus_scrapes_the_committed_rows_and_the_lag_across_a_driver_kill(
        prometheus: Prometheus, metrics_port: int, filled_topic: Callable[..., str],
        kafka_bootstrap: str, postgres_url: str, postgres_dsn: str,
        pg_table: Callable[[str], str], tmp_path: Path) -> None:
    import psycopg
    from psycopg import sql

    topic = filled_topic([(None, f"v{i}".encode(), 0) for i in range(RECORDS)])
    table = pg_table("mon")
    sink_id = f"s_{table}"
    hold = tmp_path / "hold"
    argv = ["-m", "tests.integration.pipelines.monitored_pipeline",
            "--bootstrap", kafka_bootstrap, "--topic", topic, "--url", postgres_url,
            "--table", table, "--sink-id", sink_id,
            "--checkpoint", str(tmp_path / "checkpoint"), "--port", str(metrics_port),
            "--hold", str(hold), "--per-batch", str(PER_BATCH), "--wal", str(tmp_path / "wal")]
    rows = f'eo_sink_rows_committed_total{{family="eo_jdbc",sink_id="{sink_id}"}}'
    behind = "max(eo_source_offsets_behind_latest_max)"
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    reached, _ = pause_paths(HELD, str(pause_dir))

    # Run 1, held in batch 2's commit (its transaction open), then killed whole.
    first = start(argv, {"CONNECTORS_FAILPOINTS": HELD,
                         "CONNECTORS_FAILPOINTS_PAUSE_DIR": str(pause_dir)})
    try:
        wait_for(lambda: os.path.exists(reached) or first.poll() is not None, timeout=120,
                 what="batch 2's commit to be held")
        assert first.poll() is None, kill_group(first)
        # Batch 1's progress reaches the listener asynchronously (Spark's listener bus),
        # possibly after batch 2 started: both values are waited for, not read once.
        wait_for(lambda: prometheus.value(rows) == 2 * PER_BATCH
                 and prometheus.value(behind) == RECORDS - 2 * PER_BATCH, timeout=30,
                 what=f"Prometheus to scrape {2 * PER_BATCH} rows committed and "
                 f"{RECORDS - 2 * PER_BATCH} offsets behind")
        worker = int(Path(reached).read_text())
        os.kill(worker, signal.SIGKILL)  # the committing worker holds its own group
    finally:
        kill_group(first)
    wait_for(lambda: prometheus.value(f'up{{instance="127.0.0.1:{metrics_port}"}}') == 0,
             timeout=30, what="Prometheus to see the killed driver's endpoint down")

    # Run 2: restarted from the checkpoint, batch 2 again, then 3 (whose task fails once and
    # is retried) and 4.
    once = tmp_path / "once"
    once.mkdir()
    second = start(argv, {"CONNECTORS_FAILPOINTS": "jdbc.after_stage@3!raise",
                          "CONNECTORS_FAILPOINTS_ONCE_DIR": str(once)})
    try:
        wait_for(lambda: second.poll() is not None or (
            prometheus.value(rows) == RECORDS - 2 * PER_BATCH
            and prometheus.value(behind) == 0), timeout=150,
            what="Prometheus to scrape the rest of the rows and no lag")
        assert second.poll() is None, kill_group(second)
        assert 2 * PER_BATCH + prometheus.value(rows) == RECORDS
        assert prometheus.value(behind) == 0
        assert prometheus.value(f'eo_sink_last_committed_batch_id{{sink_id="{sink_id}"}}') == 4
        sink = f'{{family="eo_jdbc",sink_id="{sink_id}"}}'
        assert os.listdir(once), "batch 3's failpoint never fired"
        wait_for(lambda: prometheus.value(f"eo_sink_failed_attempts_total{sink}") == 1,
                 timeout=30, what="Prometheus to scrape batch 3's failed attempt as eo_jdbc's")
        assert prometheus.value(f"count(eo_sink_failed_attempts_total{sink})") == 1
        assert prometheus.value(
            'count({__name__=~"eo_sink_.*",family!~"eo_jdbc|eo_kafka|eo_files"})') is None
        assert prometheus.value("sum(eo_query_input_rows_total)") == RECORDS - 2 * PER_BATCH
        wal = f'{{wal_path="{tmp_path / "wal"}"}}'
        assert (prometheus.value(f"eo_source_windows_committed_total{wal}") or 0) >= 1
        assert (prometheus.value(f"eo_source_window_commit_seconds_count{wal}") or 0) >= 1
        # a listing saw at least one window record and its marker
        assert (prometheus.value(f"eo_source_wal_files{wal}") or 0) >= 2
        creates = 'sum(eo_storage_operations_total{store="file",op="create"})'
        assert (prometheus.value(creates) or 0) >= 2
        hold.write_text("read")
        second.wait(timeout=60)
    finally:
        output = kill_group(second)
    assert second.returncode == 0, output
    with psycopg.connect(postgres_dsn) as conn:
        query = sql.SQL('SELECT count(*), count(DISTINCT "offset") FROM {}')
        count, distinct = conn.execute(query.format(sql.Identifier(table))).fetchone()
    assert (count, distinct) == (RECORDS, RECORDS)


def test_the_documented_attempts_alert_counts_each_failed_attempt_once(tmp_path: Path) -> None:
    """docs/monitoring.md's ``EoSinkAttemptsFailing``, evaluated by Prometheus' own rule
    tester (``promtool test rules``, Debian's prometheus package) on three sinks over 10
    minutes: 3 failed transactional attempts, each counted as failed and as fenced, must not
    fire (their sum, 6, did, issue 50); 6 failed JDBC attempts fire; 6 attempts fenced across
    driver restarts (which restart the failed count) fire too. Every other rule of the page
    must load."""
    import json
    import shutil

    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable("promtool", "not on PATH (Debian package prometheus; scripts/run-tests "
                    "installs it)")
    assert promtool is not None
    page = (Path(REPO) / "docs" / "monitoring.md").read_text()
    (tmp_path / "rules.yml").write_text(page.split("```yaml", 1)[1].split("```", 1)[0])

    def series(name: str, family: str, sink_id: str, n: int) -> dict[str, str]:
        # 0 for 5 minutes, then n for the rest: n attempts failed at minute 6
        return {"series": f'{name}{{family="{family}",sink_id="{sink_id}"}}',
                "values": f"0x5 {n}x20"}

    failed, fenced = "eo_sink_failed_attempts_total", "eo_sink_fenced_attempts_total"
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [series(failed, "eo_kafka", "txn", 3), series(fenced, "eo_kafka", "txn", 3),
                         series(failed, "eo_jdbc", "j", 6),
                         series(fenced, "eo_kafka", "restarted", 6)],
        "alert_rule_test": [{"eval_time": "10m", "alertname": "EoSinkAttemptsFailing",
                             "exp_alerts": [
                                 {"exp_labels": {"family": "eo_jdbc", "sink_id": "j"}},
                                 {"exp_labels": {"family": "eo_kafka", "sink_id": "restarted"}}]}],
    }]}
    (tmp_path / "test.yml").write_text(json.dumps(spec))  # YAML is a superset of JSON
    done = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
