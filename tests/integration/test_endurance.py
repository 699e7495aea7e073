"""The short endurance run (issue 52): bench/endurance.py with ``--check``, the four sinks in
one driver for 120 micro-batches per query at ``processingTime 0``, on the session's broker
and PostgreSQL. After a warm-up of 40 batches, nothing a query holds may grow with the
batches: descriptors and threads of the driver, its JVM and each Python worker, files in
the app's temp dir and the metrics spool, the sink's PostgreSQL connections, our Kafka
connections, the series on /metrics; and no WAL (the source's windows, the Kafka sinks'
commits and started markers, the file sink's logs, Spark's checkpoints) may hold more than
its retention allows once the run is past it (100 batches). Every output is checked exact
and no query may terminate. The full hour, with a driver and a broker restart, is the
benchmark's (BENCHMARKS.md, "endurance"); a leak of one descriptor per batch fails this test
(the issue's note shows it)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO, jvm_options, prepare_spark_jvms


def test_resources_stay_flat_over_hundreds_of_batches(kafka_bootstrap, postgres_dsn,
                                                     tmp_path):
    prepare_spark_jvms()
    argv = [sys.executable, "bench/endurance.py", "--check", "--bootstrap", kafka_bootstrap,
            "--dsn", postgres_dsn, "--rows", "120", "--minutes", "15", "--interval", "5",
            "--warmup", "40", "--no-restarts", "--workdir", str(tmp_path / "run"),
            "--java-options", jvm_options(),
            "--png", str(tmp_path / "endurance.png"), "--samples",
            str(tmp_path / "samples.jsonl")]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=1500)
    out = run.stdout + run.stderr
    tail = out[-6000:]
    if run.returncode != 0:
        app_log = tmp_path / "run" / "app.log"
        if app_log.exists():
            tail += "\n--- app.log (end) ---\n" + app_log.read_text(errors="replace")[-4000:]
    assert run.returncode == 0, tail
    assert "RESULT " in out and '"exact": true' in out, tail
