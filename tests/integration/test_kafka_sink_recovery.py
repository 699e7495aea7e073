"""Crash recovery and task retries of the exactly-once Kafka sink (DESIGN.md sections 6, 10).

Copy pipeline: topic A (20,000 records, 4 partitions) ->
``value = 'B:' || value`` -> ``eo_kafka`` sink -> topic B (4 partitions). One pipeline per
configuration is killed (SIGKILL of the whole process group) at each sink failpoint in turn
and restarted from its checkpoint; topic B must then hold every input record exactly once.

Topic B is read with ``read_committed``: records of an aborted transaction are invisible
there, so a transactional retry must write them again, and does.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest

from connectors.demo.services.kafka import produce_records
from connectors.kafka import recovery
from connectors.kafka.sink import KafkaSink
from tests.helpers import assert_exact, read_topic, run_pipeline
from tests.integration.pipelines.kafka_sink_copy import record

PIPELINE = "tests/integration/pipelines/kafka_sink_copy.py"
RETRY = "tests/integration/pipelines/kafka_sink_retry.py"
TOTAL = 20000
PER_BATCH = 4000  # 5 micro-batches


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(["--shuffle"], id="shuffle"),
        pytest.param(["--shuffle", "--transactional"], id="shuffle-transactional"),
        pytest.param([], id="no-shuffle-deterministicOrder"),
    ],
)
def test_copy_pipeline_killed_at_every_failpoint_is_exactly_once(
    mode, kafka_bootstrap, new_topic, tmp_path
):
    src, dst = new_topic(partitions=4), new_topic(partitions=4)
    records = [record(i) for i in range(TOTAL)]
    produce_records(kafka_bootstrap, src, [(k, v, i % 4) for i, (k, v) in enumerate(records)])
    sink_id = f"copy-{uuid.uuid4().hex[:8]}"
    wal = str(tmp_path / "wal")
    argv = [PIPELINE, "--bootstrap", kafka_bootstrap, "--source-topic", src,
            "--sink-topic", dst, "--checkpoint", str(tmp_path / "chk"), "--wal", wal,
            "--sink-id", sink_id, "--per-batch", str(PER_BATCH), *mode]
    # About half of one writer partition's rows per batch: 2 writers after the shuffle,
    # 4 (the source partitions) without.
    half = PER_BATCH // 4 if "--shuffle" in mode else PER_BATCH // 8
    kills = [
        "kafka_sink.after_marker@1",
        f"kafka_sink.mid_produce@2#{half}",
        "kafka_sink.after_flush@3",
        "kafka_sink.after_commit@3",  # the restart replays batch 3: its tasks write nothing
    ]
    for failpoint in kills:
        result = run_pipeline(argv, failpoint=failpoint, timeout=300)
        assert result.killed, f"{failpoint} never fired:\n{result.output[-3000:]}"
    final = run_pipeline(argv, timeout=300)
    assert final.returncode == 0 and "PIPELINE DONE" in final.output, final.output[-5000:]

    out = read_topic(kafka_bootstrap, dst)  # read_committed, to partition EOF
    assert_exact([m.value() for m in out], [b"B:" + v for _, v in records], "topic B values")
    keys = [recovery.find_key(m.headers()) for m in out]
    assert all(k is not None and k.sink_id == sink_id for k in keys)
    sink = KafkaSink(sink_id, wal, bootstrap_servers=kafka_bootstrap, topic=dst)
    assert sink.last_committed() == TOTAL // PER_BATCH - 1
    info = sink.commit_info(2)
    if "--transactional" in mode:
        # The kill aborted batch 2's open transaction: its records are invisible to
        # read_committed readers, so the retry wrote them again instead of skipping.
        assert info["retried_tasks"] >= 1 and info["skipped"] == 0, info
    else:
        # The kill in the middle of batch 2's produce left records the retry had to skip.
        assert info["retried_tasks"] >= 1 and info["skipped"] >= half, info
    assert sink.commit_info(3)["retried_tasks"] >= 1  # killed after its flush


def test_spark_task_retry_after_half_the_rows_writes_no_duplicates(
    kafka_bootstrap, new_topic, tmp_path
):
    plain, txn = new_topic(partitions=3), new_topic(partitions=3)
    rows = 4000  # 2 partitions of 2000: each failing attempt wrote 1000 before raising
    once = tmp_path / "once"
    once.mkdir()
    result = run_pipeline(
        [RETRY, "--bootstrap", kafka_bootstrap, "--topic-plain", plain, "--topic-txn", txn,
         "--wal", str(tmp_path / "wal"), "--rows", str(rows)],
        failpoint="kafka_sink.mid_produce@1#1000!raise,kafka_sink.mid_produce@2#1000!raise",
        env={"CONNECTORS_FAILPOINTS_ONCE_DIR": str(once)},
        timeout=300,
    )
    assert result.returncode == 0, result.output[-5000:]
    assert sorted(p.name for p in once.iterdir()) == [
        "kafka_sink.mid_produce@1#1000!raise", "kafka_sink.mid_produce@2#1000!raise"
    ], "the injected task failures did not fire"
    commits = [json.loads(line.split(" ", 1)[1]) for line in result.output.splitlines()
               if line.startswith("COMMIT ")]
    assert len(commits) == 2
    plain_info, txn_info = commits
    # one task failed after 1000 records; its retry skipped at least those
    assert plain_info["retried_tasks"] == 1 and plain_info["skipped"] >= 1000, plain_info
    # the failed attempt's transaction was aborted: the retry wrote its rows again
    assert txn_info["retried_tasks"] == 1 and txn_info["skipped"] == 0, txn_info
    assert all(info["rows"] == rows for info in commits)
    expected = [f"row-{i}".encode() for i in range(rows)]
    for topic in (plain, txn):
        out = read_topic(kafka_bootstrap, topic)
        assert_exact([m.value() for m in out], expected, f"topic {topic}")
        assert max(Counter((m.partition(), m.offset()) for m in out).values()) == 1
