"""The short endurance run (issue 52): bench/endurance.py with ``--check``, the four sinks in
one driver for 120 micro-batches per query at ``processingTime 0``, on the session's broker
and PostgreSQL. After a warm-up of 40 batches, nothing a query holds may grow with the
batches: descriptors and threads of the driver, its JVM and each Python worker, files in
the app's temp dir and the metrics spool, the sink's PostgreSQL connections, our Kafka
connections, the series on /metrics; and no WAL (the source's windows, the Kafka sinks'
commits and started markers, the file sink's logs, Spark's checkpoints) may hold more than
its retention allows, which 120 batches are past. Every output is checked exact and no query
may terminate. The full hour, with a driver and a broker restart, is the benchmark's
(BENCHMARKS.md, "endurance"); a leak of one descriptor per batch fails this test (the
issue's note shows it).

Then the operator CLI reads the state the run left, past its retention: the source's window
WAL, the JDBC sink's commit row, the source's consumer group against the WAL, the file
sink's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from connectors.core.options import redact_url
from connectors.kafka.source.planner import WAL_KEEP_WINDOWS
from tests.helpers import REPO, jvm_options, prepare_spark_jvms

BATCHES = 120


def _cli(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "connectors", *args, "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_resources_stay_flat_over_hundreds_of_batches(kafka_bootstrap, postgres_dsn,
                                                     postgres_url, tmp_path):
    prepare_spark_jvms()
    work = tmp_path / "run"
    argv = [sys.executable, "bench/endurance.py", "--check", "--keep",
            "--bootstrap", kafka_bootstrap, "--dsn", postgres_dsn, "--rows", str(BATCHES),
            "--minutes", "15", "--interval", "5", "--warmup", "40", "--no-restarts",
            "--workdir", str(work), "--java-options", jvm_options(),
            "--png", str(tmp_path / "endurance.png"),
            "--samples", str(tmp_path / "samples.jsonl")]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=1500)
    out = run.stdout + run.stderr
    tail = out[-6000:]
    if run.returncode != 0 and (work / "app.log").exists():
        tail += "\n--- app.log (end) ---\n" + (work / "app.log").read_text(
            errors="replace")[-4000:]
    assert run.returncode == 0, tail
    result = json.loads(next(line for line in reversed(out.splitlines())
                             if line.startswith("RESULT "))[len("RESULT "):])
    assert result["exact"] and result["query_terminations"] == 0, tail
    run_id = result["run_id"]
    try:
        _cli_reads_the_state_past_retention(kafka_bootstrap, postgres_url, work, run_id)
    finally:
        _drop(postgres_dsn, run_id)


def _cli_reads_the_state_past_retention(bootstrap: str, url: str, work: Any,
                                        run_id: str) -> None:
    # wal show: the source's newest windows (older ones purged), all but the last committed
    wal = _cli("wal", "show", str(work / "app" / "jdbc" / "source-wal" / "source"))
    entries = [e for log in wal["logs"].values() for e in log["entries"]]
    assert entries and all(e["committed"] for e in entries[:-1])
    assert len(entries) <= WAL_KEEP_WINDOWS + 10 and entries[0]["seq"] > 0, len(entries)
    # sink status: the JDBC sink's last committed batch, from eo_sink_commits
    sink_id = f"endurance-{run_id}-jdbc"
    status = _cli("sink", "status", "--url", url, "--sink-id", sink_id)
    assert len(status["sinks"]) == 1 and status["sinks"][0]["batch_id"] >= BATCHES - 1
    assert status["url"] == redact_url(url)
    # lag: the source commits each committed window's end to its consumer group as it marks
    # the window committed in its WAL (Spark calls a source's commit(end) when it plans the
    # next batch, so both trail by the last window)
    lag = _cli("lag", "--bootstrap", bootstrap, "--group", f"endurance-{run_id}-jdbc")
    last_done = [e for e in entries if e["committed"]][-1]["record"]["end"]
    assert lag["partitions"]
    for p in lag["partitions"]:
        assert p["committed"] == last_done[p["topic"]][str(p["partition"])], (p, last_done)
    # files status: the committed batches the log keeps (the newest LOG_RETENTION)
    files = _cli("files", "status", str(work / "files-out"))
    batch_ids = [b["batch_id"] for b in files["batches"]]
    assert batch_ids and max(batch_ids) >= BATCHES - 1 and len(batch_ids) <= 110, batch_ids
    assert files["files"] >= len(batch_ids)


def _drop(dsn: str, run_id: str) -> None:
    import psycopg
    from psycopg import sql

    from connectors.jdbc.options import staging_name

    sink_id = f"endurance-{run_id}-jdbc"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in (f"endurance_{run_id}", staging_name(sink_id), staging_name(sink_id) + "_blocks"):
            conn.execute(sql.SQL("drop table if exists {}").format(sql.Identifier(t)))
        conn.execute("delete from eo_sink_commits where sink_id = %s", (sink_id,))
