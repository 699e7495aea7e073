"""Crash recovery and task retries of the exactly-once Kafka sink (docs/design.md, "Kafka
sink: recovery keys" and "Kafka sink: transactional path"; tests/README.md, "Recovery tests").

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
from connectors.kafka.sink import KafkaSink, recovery
from tests.helpers import assert_exact, read_topic, run_pipeline
from tests.integration.pipelines.kafka_sink_copy import record
from tests.services.spark_jvm import jvm_read_topic

PIPELINE = "tests/integration/pipelines/kafka_sink_copy.py"
RETRY = "tests/integration/pipelines/kafka_sink_retry.py"
TOTAL = 20000
PER_BATCH = 4000  # 5 micro-batches
#: The failpoints the WAL-on-S3 variants run (the local store runs all of them).
S3_SUBSET = ("kafka_sink.mid_produce@2", "kafka_sink.after_flush@3", "kafka_sink.after_flush@2",
             "kafka_sink.after_txn_commit@3")
#: The failpoints the variant without a shuffle runs (a retry that must renumber its rows).
NO_SHUFFLE_SUBSET = ("kafka_sink.mid_produce@2", "kafka_sink.after_flush@3")


@pytest.mark.parametrize(
    "mode, store",
    [
        pytest.param(["--shuffle"], "local", id="shuffle"),
        pytest.param(["--shuffle", "--transactional"], "local", id="shuffle-transactional"),
        pytest.param([], "local", id="no-shuffle-deterministicOrder"),
        # the WAL (owner record, started markers, commit records) on the real S3 server,
        # its credentials and endpoint from the standard AWS environment
        pytest.param(["--shuffle"], "s3", id="shuffle-wal-on-s3"),
        pytest.param(["--shuffle", "--transactional"], "s3",
                     id="shuffle-transactional-wal-on-s3"),
    ],
)
def test_copy_pipeline_killed_at_every_failpoint_is_exactly_once(
    mode, store, kafka_bootstrap, new_topic, tmp_path, request
):
    src, dst = new_topic(partitions=4), new_topic(partitions=4)
    records = [record(i) for i in range(TOTAL)]
    produce_records(kafka_bootstrap, src, [(k, v, i % 4) for i, (k, v) in enumerate(records)])
    sink_id = f"copy-{uuid.uuid4().hex[:8]}"
    wal, env, storage_options = str(tmp_path / "wal"), None, None
    if store == "s3":
        s3 = request.getfixturevalue("s3_service")
        wal = f"s3://{request.getfixturevalue('s3_bucket')}/wal"
        env, storage_options = s3.env(), s3.python_options()
    argv = [PIPELINE, "--bootstrap", kafka_bootstrap, "--source-topic", src,
            "--sink-topic", dst, "--checkpoint", str(tmp_path / "chk"), "--wal", wal,
            "--sink-id", sink_id, "--per-batch", str(PER_BATCH), *mode]
    # About half of one writer partition's rows per batch: 2 writers after the shuffle,
    # 4 (the source partitions) without.
    half = PER_BATCH // 4 if "--shuffle" in mode else PER_BATCH // 8
    transactional = "--transactional" in mode
    if transactional:
        kills = [
            f"kafka_sink.mid_produce@1#{half}",
            "kafka_sink.after_flush@2",  # produced and flushed, the transaction still open
            "kafka_sink.after_txn_commit@3",  # one task's transaction committed
            "kafka_sink.after_commit@3",  # the restart replays batch 3: it writes nothing
        ]
    else:
        kills = [
            "kafka_sink.after_marker@1",
            f"kafka_sink.mid_produce@2#{half}",
            "kafka_sink.after_flush@3",
            "kafka_sink.after_commit@3",  # the restart replays batch 3: its tasks write nothing
        ]
    if "--shuffle" not in mode:
        # Without the shuffle only the row numbering differs (deterministicOrder): the
        # two kills whose restart must number the rows as the first attempt did.
        kills = [k for k in kills if k.startswith(NO_SHUFFLE_SUBSET)]
    if store == "s3":
        # Every failpoint runs on the local store; on S3 the two whose restart reads what
        # the WAL holds there (a retry's started marker and scan or its commit fact, and a
        # task retried after its flush), so the S3 variants cost half the restarts.
        kills = [k for k in kills if k.startswith(S3_SUBSET)]
    for failpoint in kills:
        result = run_pipeline(argv, failpoint=failpoint, timeout=300, env=env)
        assert result.killed, f"{failpoint} never fired:\n{result.output[-3000:]}"
    final = run_pipeline(argv, timeout=300, env=env)
    assert final.returncode == 0 and "PIPELINE DONE" in final.output, final.output[-5000:]

    out = read_topic(kafka_bootstrap, dst)  # read_committed, to partition EOF
    assert_exact([m.value() for m in out], [b"B:" + v for _, v in records], "topic B values")
    keys = [recovery.find_key(m.headers() or []) for m in out]
    sink = KafkaSink(sink_id, wal, bootstrap_servers=kafka_bootstrap, topic=dst,
                     storage_options=storage_options)
    assert sink.last_committed() == TOTAL // PER_BATCH - 1
    if transactional:
        # No per-record header in this mode: the proof is one commit fact per task.
        assert keys == [None] * TOTAL
        # The kills aborted batches 1 and 2's open transactions: their records are
        # invisible to read_committed readers, so the restarts wrote them again.
        assert sink.commit_info(1)["skipped"] == 0 and sink.commit_info(2)["skipped"] == 0
        # In batch 3 one task's transaction had committed: its rerun found the commit fact
        # and wrote nothing (skipped = the rows that fact recorded).
        info = sink.commit_info(3)
        assert info["retried_tasks"] >= 1 and info["skipped"] >= 1, info
        assert info["produced"] + info["skipped"] == PER_BATCH, info
        # A client we did not write agrees: Spark's own JVM Kafka source, read_committed.
        jvm_rows, version = jvm_read_topic(request.getfixturevalue("jvm_spark"),
                                           kafka_bootstrap, dst)
        print(f"Spark JVM source {version} read {len(jvm_rows)} records", flush=True)
        assert_exact([v for _, v, _, _, _ in jvm_rows], [b"B:" + v for _, v in records],
                     "topic B through Spark's JVM Kafka source")
    else:
        assert all(k is not None and k.of_sink(sink_id) for k in keys)
        # The kill in the middle of batch 2's produce left records the retry had to skip.
        info = sink.commit_info(2)
        assert info["retried_tasks"] >= 1 and info["skipped"] >= half, info
        assert sink.commit_info(3)["retried_tasks"] >= 1  # killed after its flush


@pytest.mark.parametrize("partitions", [3, 1000])
def test_spark_task_retry_after_half_the_rows_writes_no_duplicates(
    partitions, kafka_bootstrap, new_topic, tmp_path
):
    """At 1,000 partitions the 1,000 keys reach most of them: the started marker holds a
    watermark per target partition, the retry's recovery scan reads from all of them, and
    each transaction adds every partition it writes to."""
    plain, txn, after = (new_topic(partitions=partitions) for _ in range(3))
    rows = 4000  # 2 partitions of 2000: each failing attempt wrote 1000 before raising
    once = tmp_path / "once"
    once.mkdir()
    armed = ["kafka_sink.mid_produce@1#1000!raise", "kafka_sink.mid_produce@2#1000!raise",
             "kafka_sink.after_txn_commit@3!raise"]
    result = run_pipeline(
        [RETRY, "--bootstrap", kafka_bootstrap, "--topic-plain", plain, "--topic-txn", txn,
         "--topic-txn-after", after, "--wal", str(tmp_path / "wal"), "--rows", str(rows)],
        failpoint=",".join(armed),
        env={"CONNECTORS_FAILPOINTS_ONCE_DIR": str(once)},
        timeout=300,
    )
    assert result.returncode == 0, result.output[-5000:]
    assert sorted(p.name for p in once.iterdir()) == sorted(armed), "failures did not fire"
    commits = [json.loads(line.split(" ", 1)[1]) for line in result.output.splitlines()
               if line.startswith("COMMIT ")]
    assert len(commits) == 3
    plain_info, txn_info, after_info = commits
    # one task failed after 1000 records; its retry skipped at least those
    assert plain_info["retried_tasks"] == 1 and plain_info["skipped"] >= 1000, plain_info
    # the failed attempt's transaction was aborted: the retry wrote its rows again
    assert txn_info["retried_tasks"] == 1 and txn_info["skipped"] == 0, txn_info
    assert txn_info["produced"] == rows, txn_info
    # a task failed after its transaction committed: the retry found the commit fact and
    # wrote nothing (its 2000 rows are reported as skipped)
    assert after_info["retried_tasks"] == 1 and after_info["skipped"] == rows // 2, after_info
    assert after_info["produced"] == rows // 2, after_info
    assert all(info["rows"] == rows for info in commits)
    # The metrics endpoint (issue 44): each failed attempt counted as a failure, never as
    # output. Spark's retry is attempt 1 of its task; the transactional retry of batch 2
    # fenced the attempt that failed in its open transaction, which had aborted it itself
    # (in an executor worker, spooled to the endpoint); batch 3's retry found the commit
    # fact: nothing to fence.
    metrics = next(json.loads(line.split(" ", 1)[1]) for line in result.output.splitlines()
                   if line.startswith("METRICS "))
    for sink_id, fenced, aborted in (("retry-plain", 0, 0), ("retry-txn", 1, 1),
                                     ("retry-txn-after", 0, 0)):
        got = metrics[sink_id]
        assert got["eo_sink_rows_committed_total"] == rows, (sink_id, got)
        assert got["eo_sink_failed_attempts_total"] == 1, (sink_id, got)
        assert got["eo_sink_retried_tasks_total"] == 1, (sink_id, got)
        assert got.get("eo_sink_fenced_attempts_total", 0) == fenced, (sink_id, got)
        assert got.get("eo_sink_transactions_aborted_total", 0) == aborted, (sink_id, got)
    expected = [f"row-{i}".encode() for i in range(rows)]
    for topic in (plain, txn, after):
        out = read_topic(kafka_bootstrap, topic)
        assert_exact([m.value() for m in out], expected, f"topic {topic}")
        assert max(Counter((m.partition(), m.offset()) for m in out).values()) == 1
    # read_uncommitted readers also see the aborted attempt's 1000 records; Kafka keeps
    # them, marked aborted (that is why this mode needs read_committed consumers).
    assert len(read_topic(kafka_bootstrap, txn, isolation="read_uncommitted")) == rows + 1000
