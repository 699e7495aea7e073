"""The demo's pipeline runs (``python -m connectors demo``, step 3 and 4): each in a child
process of its own session, SIGKILLed at a random moment of a chosen batch or left to finish,
saying every 5 s what each sink has committed; its temporary files under the work directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from connectors.core.errors import ConnectorError


def _pipeline_cmd(cfg: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "connectors.demo.pipeline", json.dumps(cfg)]


def last_batch(checkpoint: str) -> int | None:
    """The highest batch id Spark planned (offsets log) in a checkpoint."""
    d = os.path.join(checkpoint, "offsets")
    ids = [int(n) for n in os.listdir(d) if n.isdigit()] if os.path.isdir(d) else []
    return max(ids) if ids else None


def sink_progress(cfg: dict[str, Any]) -> str:
    """One line on what each sink has committed so far, read from each sink's own state (the
    JDBC commit table, the Kafka sink's commit log, the file sink's log), then Spark's."""
    from connectors.core.storage import storage_for
    from connectors.files.sink import committed_batches
    from connectors.jdbc import admin
    from connectors.kafka.sink.recovery import sink_state

    def jdbc() -> str:
        rows = admin.status(cfg["db_url"], sink_id=cfg["sink_id"])
        last = rows[0]["batch_id"] if rows else -1
        return f"eo_jdbc last batch {last if last >= 0 else '-'}"

    def kafka() -> str:
        last = sink_state(*storage_for(cfg["wal"] + "/kafka-sink")).last_committed()
        return f"eo_kafka last batch {last if last is not None else '-'}"

    def files() -> str:
        done = committed_batches(cfg["files"]) if os.path.isdir(cfg["files"]) else []
        return f"eo_files {len(done)} batches/{sum(b['rows'] or 0 for b in done)} rows"

    parts = []
    for name, read in (("eo_jdbc", jdbc), ("eo_kafka", kafka), ("eo_files", files)):
        try:
            parts.append(read())
        except ConnectorError:  # nothing committed yet: no table, no log
            parts.append(f"{name} last batch -")
        except Exception as e:  # noqa: BLE001 - progress only; a half-written state is fine
            parts.append(f"{name} ({type(e).__name__})")
    spark = os.path.join(cfg["checkpoint"], "commits")
    done = [int(n) for n in os.listdir(spark) if n.isdigit()] if os.path.isdir(spark) else []
    parts.append(f"Spark committed batch {max(done) if done else '-'}")
    return ", ".join(parts)


def scratch_env(scratch: str) -> dict[str, str]:
    """Where a pipeline run's temporary files go: under the work directory, not /tmp, so the
    ``spark-*`` and ``blockmgr-*`` directories of a SIGKILLed run (Spark deletes them only
    at a clean exit), Python's temporary files and the metrics spool go with it. The JVM's
    own (``java.io.tmpdir``, where lz4-java unpacks ``liblz4-java-*.so``) and
    ``spark.local.dir`` follow in :func:`connectors.demo.pipeline.main`."""
    os.makedirs(os.path.join(scratch, "tmp"), exist_ok=True)
    return {"TMPDIR": os.path.join(scratch, "tmp"),
            "EO_METRICS_SPOOL": os.path.join(scratch, "metrics-spool"),
            # spark-submit's launcher JVM: no /tmp/hsperfdata_<user> either
            "SPARK_LAUNCHER_OPTS": " ".join(filter(None, (
                os.environ.get("SPARK_LAUNCHER_OPTS"), "-XX:-UsePerfData")))}


def run_child(cfg: dict[str, Any], *, kill_at_batch: int | None, jitter: float,
              failpoint: str | None, timeout: float, log_path: str,
              progress: Any = None) -> tuple[int, bool]:
    """Run the pipeline once; returns (returncode, killed).

    ``kill_at_batch``: once Spark has planned that batch (its offsets file exists), wait
    ``jitter`` seconds and SIGKILL the whole process group: a crash mid-stream at a random
    protocol step, however fast or slow this machine is.
    """
    env = dict(os.environ)
    env.pop("CONNECTORS_FAILPOINTS", None)
    if failpoint:
        env["CONNECTORS_FAILPOINTS"] = failpoint
        env["CONNECTORS_FAILPOINTS_SCOPE"] = "group"
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.update(scratch_env(cfg["scratch"]))
    began = time.monotonic()
    deadline = began + timeout
    next_report = began + 5.0
    killed = False
    # Until it plans a batch or a sink commits one, the child is starting: a JVM, a session,
    # and on a restart the recovery from the checkpoint; say so instead of a silent wait.
    planned_before = last_batch(cfg["checkpoint"])
    committed_before = sink_progress(cfg) if progress is not None else ""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - our own module
            _pipeline_cmd(cfg), stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise ConnectorError(f"pipeline run exceeded {timeout}s (log: {log_path})")
                planned = last_batch(cfg["checkpoint"])
                if kill_at_batch is not None and (planned or -1) >= kill_at_batch:
                    time.sleep(jitter)
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        killed = True
                    break
                if progress is not None and time.monotonic() >= next_report:
                    next_report += 5.0
                    state = sink_progress(cfg)
                    if planned == planned_before and state == committed_before:
                        state = "starting Spark (its JVM and session" + (
                            ", then the recovery from the checkpoint)" if planned_before
                            is not None else ", then the first batch's plan)")
                    progress(f"  {time.monotonic() - began:.0f}s: {state}")
                time.sleep(0.05)
            proc.wait()
        finally:
            try:  # reap Spark's JVM and workers whatever happened to the driver
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if proc.returncode == -signal.SIGKILL:
        killed = True
    return proc.returncode, killed
