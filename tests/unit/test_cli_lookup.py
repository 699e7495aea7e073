"""The read-only Kafka lookups of ``lag`` and ``transactions`` (``connectors/kafka/lookup.py``)
against a fake consumer (issue 36, items 0-2): no admin client, no topic auto-creation,
transient coordinator errors asked again, a denied group named at once, a missing topic or
an unknown group an error."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from connectors import cli, cli_kafka
from connectors.kafka import lookup
from tests.helpers import FakeGroupConsumer


def test_the_lookup_consumer_never_auto_creates_whatever_the_user_sets(monkeypatch: Any) -> None:
    import confluent_kafka

    made: list[dict[str, Any]] = []
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda conf: made.append(conf) or conf)
    lookup.consumer({"bootstrap.servers": "b:1", "allow.auto.create.topics": True,
                     "group.id": "theirs", "isolation.level": "read_committed"}, "g",
                    isolation="read_uncommitted")
    conf = made[0]
    assert conf["allow.auto.create.topics"] is False and conf["group.id"] == "g"
    assert conf["enable.auto.commit"] is False and conf["isolation.level"] == "read_uncommitted"


def test_a_missing_topic_is_not_found_and_a_denied_one_is_not_retried() -> None:
    fake = FakeGroupConsumer({"t": 3}, topic_errors={
        "secret": KafkaError.TOPIC_AUTHORIZATION_FAILED})
    assert lookup.topic_partitions(fake, "t", 5, "b:1", "lag") == [0, 1, 2]
    with pytest.raises(lookup.TopicNotFound) as missing:
        lookup.topic_partitions(fake, "typo", 5, "b:1", "lag")
    assert str(missing.value).startswith("lag: topic 'typo' does not exist at b:1")
    assert "nothing was created" in str(missing.value)
    fake.calls.clear()
    with pytest.raises(lookup.LookupFailed) as denied:
        lookup.topic_partitions(fake, "secret", 5, "b:1", "lag")
    assert lookup.error_name(denied.value) == "TOPIC_AUTHORIZATION_FAILED"
    assert fake.calls == [("list_topics", "secret")]


def test_all_topics_leaves_out_kafkas_internal_ones() -> None:
    fake = FakeGroupConsumer({"a": 1, "__consumer_offsets": 50, "__transaction_state": 50})
    assert lookup.all_topics(fake, 5) == {"a": [0]}


def test_committed_asks_again_while_the_coordinator_loads() -> None:
    fake = FakeGroupConsumer({"t": 2}, offsets={("t", 1): 7})
    fake.committed_errors = [KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR,
                             KafkaError._WAIT_COORD]
    assert lookup.committed(fake, [("t", 0), ("t", 1)], 30) == {("t", 1): 7}
    assert [c[0] for c in fake.calls] == ["committed"] * 4
    # each call gets a growing slice of the deadline, never all of it at once
    slices = [c[2] for c in fake.calls]
    assert slices[0] <= 1.0 and slices == sorted(slices)


def test_a_denied_group_coordinator_ends_the_wait_at_once() -> None:
    """librdkafka waits for a coordinator as long as committed() lets it, and reports a
    denied FindCoordinator only on the consumer's queue."""
    fake = FakeGroupConsumer({"t": 1}, offsets={("t", 0): 1})
    fake.committed_errors = [KafkaError._TIMED_OUT] * 10
    fake.events = [KafkaError.GROUP_AUTHORIZATION_FAILED]
    started = time.monotonic()
    with pytest.raises(lookup.LookupFailed) as failed:
        lookup.committed(fake, [("t", 0)], 30)
    assert time.monotonic() - started < 2
    assert lookup.error_name(failed.value) == "GROUP_AUTHORIZATION_FAILED"
    assert failed.value.attempts == 1 and not failed.value.transient


def test_committed_gives_up_at_its_deadline_with_the_last_error() -> None:
    fake = FakeGroupConsumer({"t": 1})
    fake.committed_errors = [KafkaError._WAIT_COORD] * 1000
    with pytest.raises(lookup.LookupFailed) as failed:
        lookup.committed(fake, [("t", 0)], 0.5)
    assert failed.value.transient and "_WAIT_COORD" in str(failed.value)


# -- the lag command on the fakes ---------------------------------------------------------------
@pytest.fixture
def fakes(monkeypatch: Any) -> SimpleNamespace:
    """``lag`` with fake consumers (``consumers`` by group; ``offsets``: the group's
    committed offsets) and a fake of the process's cluster object for the partitions' ends
    (``ends_asked``: what it was asked); any admin client is an error (its
    ListConsumerGroupOffsets crashes on NOT_COORDINATOR)."""
    import contextlib

    import confluent_kafka.admin

    from connectors.kafka import clients

    made: dict[str, FakeGroupConsumer] = {}
    offsets: dict[tuple[str, int], int] = {}
    ends = {("t", 0): 10, ("t", 1): 4, ("u", 0): 0}
    asked: list[list[tuple[str, int]]] = []

    class Kafka:
        def list_offsets(self, wanted: Any, **_k: Any) -> dict[tuple[str, int], int]:
            asked.append(sorted(wanted))
            return {tp: ends[tp] for tp in wanted}

    @contextlib.contextmanager
    def lease(conf: Any) -> Any:
        yield Kafka()

    monkeypatch.setattr(clients, "lease", lease)

    def consumer(conf: Any, group: str = lookup.LOOKUP_GROUP, isolation: str = "") -> Any:
        fake = FakeGroupConsumer({"t": 2, "u": 1}, offsets, {("t", 0): 10, ("t", 1): 4})
        stable = isolation == "read_committed" and group != lookup.LOOKUP_GROUP
        made[f"{group}/stable" if stable else group] = fake
        return fake

    def no_admin(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("lag must not use an admin client")

    monkeypatch.setattr(lookup, "consumer", consumer)
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", no_admin)
    return SimpleNamespace(consumers=made, offsets=offsets, ends_asked=asked)


def lag(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["lag", "--bootstrap", "b:1", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_lag_of_an_unknown_group_is_an_error(fakes: Any, capsys: Any) -> None:
    code, out, err = lag(capsys, "--group", "nosuchgroup")
    assert code == 2 and out == ""
    assert "group 'nosuchgroup' has no committed offsets on any of the 2 topics" in err
    code, out, err = lag(capsys, "--group", "nosuchgroup", "--topic", "t", "--json")
    assert code == 2 and out == "" and "no committed offsets on topic 't'" in err
    code, out, err = lag(capsys, "--group", "g", "--topic", "typo")
    assert code == 2 and "lag: topic 'typo' does not exist at b:1" in err
    assert all(f.calls[-1] == ("close",) for f in fakes.consumers.values())


def test_lag_shows_only_committed_partitions(fakes: Any, capsys: Any) -> None:
    fakes.offsets.update({("t", 0): 4, ("t", 1): 4})
    code, out, err = lag(capsys, "--group", "g", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["total_lag"] == 6
    assert [(p["partition"], p["committed"], p["end"], p["lag"]) for p in doc["partitions"]] \
        == [(0, 4, 10, 6), (1, 4, 4, 0)]
    # the group's offsets come from a consumer of that group (every partition of every
    # topic asked at once), the ends from the cluster object, all at once
    group = fakes.consumers["g"].calls
    assert [c[:2] for c in group if c[0] == "committed"] == [("committed", 3)]
    assert not any(c[0] == "end" for c in group)
    assert fakes.ends_asked == [[("t", 0), ("t", 1)]]
    # every partition of the topics it has offsets on answered: topic u, which the group
    # never read, is not asked again stably
    assert "g/stable" not in fakes.consumers


def test_lag_asks_stably_again_for_a_partition_of_a_topic_the_group_reads(
        fakes: Any, capsys: Any) -> None:
    fakes.offsets.update({("t", 0): 4})
    code, out, err = lag(capsys, "--group", "g", "--json")
    assert code == 0, err
    # t[1] had no offset in the plain answer (it may be older than the group's commits):
    # asked again stably, once; u's partition is not
    stable = fakes.consumers["g/stable"].calls
    assert [c[:2] for c in stable if c[0] == "committed"] == [("committed", 1)]
    assert stable[-1] == ("close",)


def test_lag_names_the_group_acl_when_its_coordinator_is_denied(fakes: Any, capsys: Any,
                                                                monkeypatch: Any) -> None:
    original = lookup.consumer

    def denied(conf: Any, group: str = lookup.LOOKUP_GROUP, isolation: str = "") -> Any:
        fake = original(conf, group, isolation)
        if group == "g":
            fake.committed_errors = [KafkaError._WAIT_COORD] * 100
            fake.events = [KafkaError.GROUP_AUTHORIZATION_FAILED]
        return fake

    monkeypatch.setattr(lookup, "consumer", denied)
    code, out, err = lag(capsys, "--group", "g", "--kafka", "sasl.username=alice")
    assert code == 2 and out == ""
    assert "User:alice has no DESCRIBE on Group 'g'" in err, err


# -- issue 41: the eo_kafka hint only for eo_kafka's own groups -----------------------------------
def test_lag_explains_eo_kafka_s_commit_timing_only_for_its_own_groups(
        fakes: Any, capsys: Any) -> None:
    from connectors.kafka.source.options import KafkaSourceOptions

    ours = KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": "b:1", "subscribe": "t", "walPath": "/tmp/w"}).group_id
    assert cli_kafka.source_group(ours), ours  # the name the source itself gives its group
    fakes.offsets.update({("t", 0): 4})
    for group, hinted in ((ours, True), ("g", False), ("eo-kafka-source-mine", False)):
        code, out, err = lag(capsys, "--group", group)
        assert code == 0 and "total lag 6" in out, err
        assert ("AvailableNow/Once run" in out) is hinted, (group, out)


# -- issue 50: how much of the lag is the source's pending window ---------------------------------
def test_lag_with_the_wal_path_says_the_lag_is_the_pending_last_window(
        fakes: Any, capsys: Any, tmp_path: Any) -> None:
    """After a finished AvailableNow run the group stands at the last window's start: with
    ``--wal-path`` the whole lag is named as that window, pending until the next run, not as
    data left unread; offsets beyond it are said to be unplanned."""
    from connectors.core.wal import WriteAheadLog

    wal = WriteAheadLog.open(str(tmp_path / "wal"), "source")
    wal.append(0, {"window": 0, "start": {"t": {"0": 0, "1": 0}}, "end": {"t": {"0": 4, "1": 2}}})
    wal.commit(0)
    wal.append(1, {"window": 1, "start": {"t": {"0": 4, "1": 2}}, "end": {"t": {"0": 8, "1": 4}}})
    fakes.offsets.update({("t", 0): 4, ("t", 1): 2})  # window 0's end: 6 + 2 behind
    code, out, err = lag(capsys, "--group", "g", "--wal-path", str(tmp_path / "wal"))
    assert code == 0, err
    assert "total lag 8" in out
    assert "  6 of it: window 1 of the source's WAL, PENDING." in out, out
    assert "the sinks hold the last window's rows" in out
    assert "  the other 2: offsets the query has not planned yet" in out
    code, out, err = lag(capsys, "--group", "g", "--wal-path", str(tmp_path / "wal"), "--json")
    assert json.loads(out)["pending_windows"] == [{"window": 1, "lag": 6}]
    wal.commit(1)
    code, out, err = lag(capsys, "--group", "g", "--wal-path", str(tmp_path / "wal"))
    assert "no pending window: all 8 of the lag is offsets its query has not planned" in out
    code, out, err = lag(capsys, "--group", "g", "--wal-path", str(tmp_path / "nothing"))
    assert code == 2 and "no eo_kafka source WAL there" in err, err
    # a pending window the lag does not reach (the group is past it): said, never counted
    wal.append(2, {"window": 2, "start": {"t": {"0": 8}}, "end": {"t": {"0": 9}}})
    fakes.offsets.update({("t", 0): 10, ("t", 1): 2})
    code, out, err = lag(capsys, "--group", "g", "--wal-path", str(tmp_path / "wal"))
    assert "total lag 2" in out and "(window 2 of the source's WAL PENDING; none of this " \
        "lag lies in them)" in out, out
