"""The operator's first commands against a real broker (issue 36): they never change the
cluster they look at, never crash, and say what they found.

- ``lag`` right after a broker starts (its group coordinator still loading) answers instead
  of dying: it used librdkafka's admin ``ListConsumerGroupOffsets``, which dereferences a
  NULL group on ``NOT_COORDINATOR`` (SIGSEGV, librdkafka #5040). It runs as a subprocess,
  so a crash shows as a negative return code instead of taking pytest down.
- ``lag --topic`` and ``transactions`` on a topic that does not exist fail, naming it, and
  the topic stays absent (the broker's ``auto.create.topics.enable`` is Kafka's default,
  true).
- ``lag`` of a group with no committed offsets is an error, not "total lag 0".
- ``wal show`` on a source's real WAL: the newest window pending after a finished run says
  why; the parent of the walPath, or ``--kind sink``, is an error that names what is there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest

from connectors import cli
from connectors.demo.services.kafka import create_topic, produce_records


def _lag(bootstrap: str, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "connectors", "lag", "--bootstrap", bootstrap, "--timeout", "60",
         *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=180)
    return proc.returncode, out, err


def _topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_absent(bootstrap: str, topic: str) -> None:
    """``topic`` does not exist. A topic created after the commands is listed first: topic
    creations go through the one controller in order, so one a command had set off would
    be there too."""
    later = f"later-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, later, 1)
    topics = _topics(bootstrap)
    assert later in topics and topic not in topics, sorted(t for t in topics if "missing" in t)


# -- item 0: no crash while the coordinator loads ------------------------------------------------
def test_lag_right_after_a_broker_starts_answers_instead_of_crashing(broker_factory: Any) -> None:
    broker = broker_factory()
    bootstrap = broker.bootstrap
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    # At once, before any client has asked for a group coordinator: three lags at the same
    # moment meet the offsets topic being created and its partitions loading.
    procs = [_lag(bootstrap, "--group", "g-first"), _lag(bootstrap, "--group", "g-second"),
             _lag(bootstrap, "--group", "g-third", "--topic", missing)]
    results = [_finish(p) for p in procs]
    for code, _out, err in results:
        assert code >= 0, f"lag died with signal {-code}: {err[-2000:]}"
        assert code == 2, err
    assert "group 'g-first' has no committed offsets" in results[0][2]
    assert "group 'g-second' has no committed offsets" in results[1][2]
    assert f"topic {missing!r} does not exist" in results[2][2]

    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    produce_records(bootstrap, topic, [(None, b"x", 0)] * 10 + [(None, b"y", 1)] * 4)
    _commit(bootstrap, "g-first", {(topic, 0): 3})
    code, out, err = _finish(_lag(bootstrap, "--group", "g-first", "--json"))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["total_lag"] == 7
    assert [(p["topic"], p["partition"], p["committed"], p["end"], p["lag"])
            for p in doc["partitions"]] == [(topic, 0, 3, 10, 7)]
    _assert_absent(bootstrap, missing)


# -- item 1: no topic created ---------------------------------------------------------------------
def test_read_only_commands_leave_a_missing_topic_missing(
        kafka_bootstrap: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    commands = [
        ["lag", "--bootstrap", kafka_bootstrap, "--group", group, "--topic", missing],
        ["lag", "--bootstrap", kafka_bootstrap, "--group", group, "--topic", missing, "--json"],
        ["transactions", "--bootstrap", kafka_bootstrap, "--topic", missing, "--sink-id", "s1"],
        ["transactions", "--bootstrap", kafka_bootstrap, "--topic", missing, "--sink-id", "s1",
         "--writers", "1", "--abort", "--yes"],
    ]
    for argv in commands:
        code, out, err = _cli(capsys, *argv)
        assert code == 2, (argv, out, err)
        assert f"topic {missing!r} does not exist at {kafka_bootstrap}" in err, err
        assert "UNKNOWN_TOPIC_OR_PART" not in err and out == ""
    _assert_absent(kafka_bootstrap, missing)


# -- item 2: an unknown group is not a healthy one --------------------------------------------
def test_lag_of_a_group_without_committed_offsets_is_an_error(
        kafka_bootstrap: str, new_topic: Any, capsys: pytest.CaptureFixture[str]) -> None:
    topic = new_topic(partitions=2)
    group = f"nosuchgroup-{uuid.uuid4().hex[:8]}"
    code, out, err = _cli(capsys, "lag", "--bootstrap", kafka_bootstrap, "--group", group)
    assert code == 2 and out == ""
    assert f"group {group!r} has no committed offsets on any of the" in err, err
    code, out, err = _cli(capsys, "lag", "--bootstrap", kafka_bootstrap, "--group", group,
                          "--topic", topic, "--json")
    assert code == 2 and out == ""
    assert f"group {group!r} has no committed offsets on topic {topic!r}" in err, err


def test_lag_shows_each_committed_partition_against_its_end(
        kafka_bootstrap: str, filled_topic: Any, new_topic: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    topic = filled_topic([(None, b"v", p) for p in range(3) for _ in range(5 + p)], partitions=3)
    other = new_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _commit(kafka_bootstrap, group, {(topic, 0): 5, (topic, 2): 2, (other, 0): 0})
    code, out, err = _cli(capsys, "lag", "--bootstrap", kafka_bootstrap, "--group", group,
                          "--json")
    assert code == 0, err
    rows = [(p["topic"], p["partition"], p["committed"], p["end"], p["lag"])
            for p in json.loads(out)["partitions"]]
    assert sorted(rows) == sorted([(topic, 0, 5, 5, 0), (topic, 2, 2, 7, 5), (other, 0, 0, 0, 0)])
    code, out, err = _cli(capsys, "lag", "--bootstrap", kafka_bootstrap, "--group", group,
                          "--topic", topic)
    assert code == 0, err
    assert f"group {group} @ {kafka_bootstrap}: total lag 5" in out
    assert f"{topic}[2] committed 2 end 7 lag 5" in out and other not in out


# -- item 3: wal show on a real source WAL --------------------------------------------------------
def test_wal_show_explains_a_finished_runs_pending_window_and_refuses_other_directories(
        kafka_bootstrap: str, filled_topic: Any, tmp_path: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.kafka.source.options import KafkaSourceOptions
    from connectors.kafka.source.planner import KafkaPlanner

    topic = filled_topic([(None, b"v", 0)] * 6, partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    wal = str(tmp_path / "wal" / "source-a")
    planner = KafkaPlanner(KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": topic, "walPath": wal,
         "kafka.group.id": group}, batch=True))
    try:
        first = planner.next_window()
        assert first is not None
        planner.commit(first.end)  # window 0 done; its end committed to the group
        produce_records(kafka_bootstrap, topic, [(None, b"w", 0)] * 4)
        assert planner.next_window() is not None  # window 1 planned, the run ends here
    finally:
        planner.close()

    code, out, err = _cli(capsys, "wal", "show", wal)
    assert code == 0, err
    assert "[source] last committed: 0" in out and "PENDING" in out
    assert "stays PENDING, and shows as lag, until the next run commits it" in out
    code, out, err = _cli(capsys, "lag", "--bootstrap", kafka_bootstrap, "--group", group)
    assert code == 0 and "total lag 4" in out, err

    code, out, err = _cli(capsys, "wal", "show", str(tmp_path / "wal"))
    assert code == 2 and out == ""
    assert "holds no write-ahead log itself; it is the parent of 1 walPath(s)" in err
    assert f"{wal} (source)" in err, err
    code, out, err = _cli(capsys, "wal", "show", wal, "--kind", "sink")
    assert code == 2 and "holds no 'sink' log; it holds source/ (eo_kafka source" in err, err


# -- issue 41, item 1: no group, no offset -------------------------------------------------------
def _states(bootstrap: str, groups: list[str]) -> dict[str, str]:
    """Each group's state as its coordinator has it: ``DEAD`` for a group it does not know
    (no member, no offset), ``EMPTY`` for one with offsets and no member."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until every answer is in
    futures = admin.describe_consumer_groups(groups, request_timeout=30)
    return {g: f.result(timeout=60).state.name for g, f in futures.items()}


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                 timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got}


def test_the_kafka_commands_commit_no_offset_and_leave_no_group(
        kafka_bootstrap: str, filled_topic: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``lag``, ``transactions`` (its held partitions read by a consumer of its own) and
    ``doctor --group`` on a real broker: the group looked at keeps its offsets, and no
    group appears, neither the one asked about nor the lookups' own."""
    from confluent_kafka import Producer

    topic = filled_topic([(None, b"v", p) for p in range(2) for _ in range(6)], partitions=2)
    group, unknown = f"g-{uuid.uuid4().hex[:8]}", f"nosuchgroup-{uuid.uuid4().hex[:8]}"
    _commit(kafka_bootstrap, group, {(topic, 0): 2})
    before = _committed(kafka_bootstrap, group, topic, 2)
    # an open transaction holds both partitions: transactions reads past their LSO
    holder = Producer({"bootstrap.servers": kafka_bootstrap,
                       "transactional.id": f"hold-{uuid.uuid4().hex[:8]}"})
    holder.init_transactions(30)
    holder.begin_transaction()
    for p in range(2):
        holder.produce(topic, b"held", None, p)
    holder.flush(30)
    try:
        for argv, expected in (
                (["lag", "--bootstrap", kafka_bootstrap, "--group", group], 0),
                (["lag", "--bootstrap", kafka_bootstrap, "--group", group, "--topic", topic], 0),
                (["lag", "--bootstrap", kafka_bootstrap, "--group", unknown], 2),
                (["transactions", "--bootstrap", kafka_bootstrap, "--topic", topic,
                  "--sink-id", "s1"], 0),
                (["doctor", "--bootstrap", kafka_bootstrap, "--group", unknown,
                  "--topic", topic], None)):
            code, out, err = _cli(capsys, *argv)
            assert expected is None or code == expected, (argv, out, err)
        assert "readers held at" in " ".join(_cli(capsys, "transactions", "--bootstrap",
                                                  kafka_bootstrap, "--topic", topic,
                                                  "--sink-id", "s1")[1:])
    finally:
        holder.abort_transaction(30)
    assert _committed(kafka_bootstrap, group, topic, 2) == before
    looked = [unknown, "eo-connectors-cli", "eo-connectors-cli-transactions"]
    for g in looked:
        assert all(o < 0 for o in _committed(kafka_bootstrap, g, topic, 2).values()), g
    states = _states(kafka_bootstrap, [group, *looked])
    assert states == {group: "EMPTY", **{g: "DEAD" for g in looked}}, states
