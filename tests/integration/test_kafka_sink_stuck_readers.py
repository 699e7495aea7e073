"""Readers held by a killed task's open transaction are bounded and visible (issue 23,
item 7).

A process runs one transactional task and is SIGKILLed with its transaction open (after
its flush, before its commit: failpoint ``kafka_sink.after_flush``). ``read_committed``
readers of the partitions it wrote then stop at the last stable offset until the
transaction ends. ``eo-connectors transactions`` shows the held partitions and for how long,
and ``--abort`` ends it at once; left alone, the broker aborts it ``transaction.timeout.ms``
after it began (plus its own check interval).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

from connectors import cli
from connectors.kafka.sink import transactions
from tests.helpers import read_topic, wait_for

ROWS = 2000

_TASK = """
import sys
import pyarrow as pa
from connectors.core.sink import TaskInfo
from connectors.kafka.sink import KafkaSink
bootstrap, topic, sink_id, wal, timeout_ms, n = sys.argv[1:]
sink = KafkaSink(sink_id, wal, bootstrap_servers=bootstrap, topic=topic, transactional=True,
                 kafka_options={"transaction.timeout.ms": timeout_ms})
sink.check_service()
rows = pa.table({"value": [b"v%d" % i for i in range(int(n))]})
sink.stage(TaskInfo(0, 0), iter(rows.to_batches()))
"""


def _killed_inside_its_transaction(bootstrap: str, topic: str, sink_id: str, tmp_path,
                                   timeout_ms: int) -> None:
    env = {**os.environ, "CONNECTORS_FAILPOINTS": "kafka_sink.after_flush@0!kill"}
    done = subprocess.run(
        [sys.executable, "-c", _TASK, bootstrap, topic, sink_id, str(tmp_path / "wal"),
         str(timeout_ms), str(ROWS)],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9, (done.returncode, done.stderr[-3000:])


def _cli_json(capsys, *argv: str) -> dict:
    assert cli.main(["transactions", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_shows_held_readers_and_its_abort_frees_them(
    kafka_bootstrap, new_topic, tmp_path, capsys
):
    topic = new_topic(partitions=3)
    sink_id = f"stuck-{uuid.uuid4().hex[:8]}"
    _killed_inside_its_transaction(kafka_bootstrap, topic, sink_id, tmp_path, 600_000)
    time.sleep(1.0)
    doc = _cli_json(capsys, "--bootstrap", kafka_bootstrap, "--topic", topic,
                    "--sink-id", sink_id)
    held = [p for p in doc["partitions"] if p["held"]]
    assert held, doc  # the open transaction holds read_committed readers
    assert all(p["lso"] == 0 and p["high_watermark"] > 0 for p in held), doc
    assert all(p["held_for_s"] is not None and p["held_for_s"] < 60 for p in held), doc
    assert sum(p["high_watermark"] for p in held) >= ROWS

    doc = _cli_json(capsys, "--bootstrap", kafka_bootstrap, "--topic", topic,
                    "--sink-id", sink_id, "--writers", "1", "--abort", "--yes")
    assert doc["aborted"] == [f"{sink_id}-0"]
    assert not any(p["held"] for p in doc["partitions"]), doc
    assert read_topic(kafka_bootstrap, topic) == []  # aborted: nothing visible


def test_without_a_retry_the_broker_frees_readers_after_the_transaction_timeout(
    kafka_bootstrap, new_topic, tmp_path
):
    topic = new_topic(partitions=2)
    sink_id = f"stuck-{uuid.uuid4().hex[:8]}"
    timeout_s = 5
    began = time.monotonic()
    _killed_inside_its_transaction(kafka_bootstrap, topic, sink_id, tmp_path, timeout_s * 1000)
    conf = {"bootstrap.servers": kafka_bootstrap}
    assert any(s.held for s in transactions.partition_states(conf, topic, 15))
    # The broker looks for timed-out transactions every 10 s by default
    # (transaction.abort.timed.out.transaction.cleanup.interval.ms).
    wait_for(lambda: not any(s.held for s in transactions.partition_states(conf, topic, 15)),
             timeout=timeout_s + 10 + 15, interval=0.5, what="the broker to abort it")
    print(f"read_committed readers held for {time.monotonic() - began:.1f} s "
          f"(transaction.timeout.ms={timeout_s * 1000})", flush=True)
    assert read_topic(kafka_bootstrap, topic) == []
