"""Every connector on a secured listener (SASL_SSL, SCRAM-SHA-512, ACLs enforced).

Each role runs with exactly the ACLs docs/security.md lists for it (``access.ROLES``, from
which that page's tables are generated) and must give exactly-once output; then each of
those ACLs is removed in turn, and the role must fail within 30 s with an error naming the
principal, the resource and the operation, with nothing written and nothing committed.
Bad credentials (password, CA, SASL mechanism) fail within 30 s without a secret in the
message. Set-up and checks use the broker's PLAINTEXT listener (a super user); the
connectors under test only ever see the secured one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from connectors.core import failpoints
from connectors.core.errors import ConnectorError, FailpointError
from connectors.demo.services.kafka import create_topic, produce_records
from connectors.kafka.access import ROLES, Acl
from tests.helpers import announce, assert_exact, group_offsets, read_topic, unavailable

#: A missing ACL or a failed login must surface within this many seconds.
FAIL_WITHIN = 30.0


@pytest.fixture(scope="module")
def secured(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from connectors.demo.services import maven
    from tests.services.kafka_secured import SecuredKafka

    missing = maven.java_and_maven()
    if missing is not None:
        unavailable("secured Apache Kafka", missing)
    try:
        import cryptography  # noqa: F401 - the throwaway CA is made with it
    except ImportError:
        unavailable("secured Apache Kafka", 'no cryptography package: pip install -e ".[dev]"')
    kafka = SecuredKafka(str(tmp_path_factory.mktemp("kafka-secured"))).start()
    announce(request, f"kafka (secured): Apache Kafka {kafka.version} SASL_SSL/SCRAM-SHA-512 "
                      f"on {kafka.bootstrap}, log {kafka.log_path}")
    try:
        yield kafka
    finally:
        from connectors.kafka import close_cached_clients

        close_cached_clients()
        kafka.stop()


def _records(n: int, partitions: int) -> list[tuple[bytes, bytes, int]]:
    return [(f"k{i}".encode(), f"v{i}".encode(), i % partitions) for i in range(n)]


def _user(secured: Any, role: str) -> str:
    name = f"{role}-{uuid.uuid4().hex[:8]}"
    secured.add_user(name)
    return name


def _grant(secured: Any, user: str, acls: list[Acl]) -> None:
    secured.grant(user, [a.key() for a in acls])


def _role_acls(role: str, **names: str) -> list[Acl]:
    return [a.bind(**names) for a in ROLES[role]]


def _ids(role: str) -> list[str]:
    return [f"{a.resource}-{a.operation}" for a in ROLES[role]]


def _group_offsets(secured: Any, group: str) -> dict[tuple[str, int], int]:
    return group_offsets(secured.setup_bootstrap, group)


def _assert_names(message: str, user: str, acl: Acl) -> None:
    assert f"User:{user}" in message, message
    assert acl.operation in message, message
    assert acl.name in message, message
    assert "grant" in message, message


def _assert_no_secret(message: str, secured: Any) -> None:
    for password in secured.passwords.values():
        assert password not in message, "a password leaked into an error message"


# -- the source: streaming ------------------------------------------------------------------
def _stream_to_memory(spark: Any, secured: Any, user: str, topic: str, group: str,
                      tmp_path: Any, **extra: str) -> tuple[str, Any]:
    reader = spark.readStream.format("eo_kafka")
    options = {**secured.spark_options(user), "subscribe": topic, "kafka.group.id": group,
               "startingOffsets": "earliest", "maxOffsetsPerTrigger": "15",
               "connectTimeout": "20s", **extra}
    for k, v in options.items():
        reader = reader.option(k, v)
    name = f"m_{uuid.uuid4().hex[:8]}"
    query = (reader.load().selectExpr("key", "value").writeStream.format("memory")
             .queryName(name).option("checkpointLocation", str(tmp_path / f"chk-{name}"))
             .trigger(availableNow=True).start())
    return name, query


def _source_topic(secured: Any, n: int = 40) -> str:
    topic = f"src-{uuid.uuid4().hex[:8]}"
    create_topic(secured.setup_bootstrap, topic, 2)
    produce_records(secured.setup_bootstrap, topic, _records(n, 2))
    return topic


def test_source_streaming_with_exactly_its_acls(spark: Any, secured: Any, tmp_path: Any) -> None:
    topic, group = _source_topic(secured), f"g-{uuid.uuid4().hex[:8]}"
    user = _user(secured, "source")
    _grant(secured, user, _role_acls("source", topic=topic, group=group))
    name, query = _stream_to_memory(spark, secured, user, topic, group, tmp_path)
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    rows = spark.table(name).select("key", "value").collect()
    assert_exact([(bytes(r.key), bytes(r.value)) for r in rows],
                 [(k, v) for k, v, _ in _records(40, 2)])
    # three windows of 15: the first two ends were committed to the group
    assert _group_offsets(secured, group), "the source committed nothing to its group"


@pytest.mark.parametrize("dropped", range(len(ROLES["source"])), ids=_ids("source"))
def test_source_streaming_fails_fast_without_each_acl(spark: Any, secured: Any, tmp_path: Any,
                                                      dropped: int) -> None:
    topic, group = _source_topic(secured), f"g-{uuid.uuid4().hex[:8]}"
    user = _user(secured, "source")
    acls = _role_acls("source", topic=topic, group=group)
    _grant(secured, user, [a for i, a in enumerate(acls) if i != dropped])
    started = time.monotonic()
    name, query = _stream_to_memory(spark, secured, user, topic, group, tmp_path)
    with pytest.raises(Exception) as raised:  # noqa: B017, PT011 - Spark wraps it
        query.awaitTermination(FAIL_WITHIN + 30)
        raise AssertionError("the query ran without a required ACL")
    took = time.monotonic() - started
    assert took < FAIL_WITHIN, f"the missing ACL took {took:.0f}s to surface"
    _assert_names(str(raised.value), user, acls[dropped])
    written = [t.name for t in spark.catalog.listTables() if t.name == name]
    assert not written or spark.table(name).count() == 0
    assert _group_offsets(secured, group) == {}


def test_source_starting_offsets_group(spark: Any, secured: Any, tmp_path: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic, group = _source_topic(secured), f"g-{uuid.uuid4().hex[:8]}"
    setup = Consumer({"bootstrap.servers": secured.setup_bootstrap, "group.id": group})
    try:  # a synchronous commit waits out a coordinator that is still loading
        setup.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 5)],
                     asynchronous=False)
    finally:
        setup.close()
    user = _user(secured, "source")
    _grant(secured, user, _role_acls("source-group", topic=topic, group=group))
    name, query = _stream_to_memory(spark, secured, user, topic, group, tmp_path,
                                    startingOffsets="group")
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    rows = spark.table(name).select("key", "value").collect()
    expected = [(k, v) for i, (k, v, _) in enumerate(_records(40, 2)) if i // 2 >= 5]
    assert_exact([(bytes(r.key), bytes(r.value)) for r in rows], expected)


# -- the source: KafkaWindows --------------------------------------------------------------
def _windows(spark: Any, secured: Any, user: str, topic: str, group: str, wal: str) -> Any:
    from connectors import KafkaWindows

    return KafkaWindows(spark, walPath=wal, **secured.spark_options(user), subscribe=topic,
                        **{"kafka.group.id": group, "connectTimeout": "20s"})


def test_kafka_windows_with_exactly_its_acls(spark: Any, secured: Any, tmp_path: Any) -> None:
    topic, group = _source_topic(secured), f"g-{uuid.uuid4().hex[:8]}"
    user = _user(secured, "windows")
    _grant(secured, user, _role_acls("windows", topic=topic, group=group))
    windows = _windows(spark, secured, user, topic, group, str(tmp_path / "wal"))
    seen = []
    for w in windows:
        seen += [(bytes(r.key), bytes(r.value)) for r in w.df.select("key", "value").collect()]
    windows.close()
    assert_exact(seen, [(k, v) for k, v, _ in _records(40, 2)])
    assert _group_offsets(secured, group) == {(topic, 0): 20, (topic, 1): 20}


@pytest.mark.parametrize("dropped", range(len(ROLES["windows"])), ids=_ids("windows"))
def test_kafka_windows_fails_fast_without_each_acl(spark: Any, secured: Any, tmp_path: Any,
                                                   dropped: int) -> None:
    topic, group = _source_topic(secured), f"g-{uuid.uuid4().hex[:8]}"
    user = _user(secured, "windows")
    acls = _role_acls("windows", topic=topic, group=group)
    _grant(secured, user, [a for i, a in enumerate(acls) if i != dropped])
    wal = tmp_path / "wal"
    started = time.monotonic()
    with pytest.raises(ConnectorError) as raised:
        windows = _windows(spark, secured, user, topic, group, str(wal))
        for w in windows:
            w.df.collect()
    assert time.monotonic() - started < FAIL_WITHIN
    _assert_names(str(raised.value), user, acls[dropped])
    assert not list((wal / "source").glob("*")) if (wal / "source").exists() else True
    assert _group_offsets(secured, group) == {}


# -- the recovery-key sink ------------------------------------------------------------------
# The sink's protocol without Spark (check_schema on the driver, stage per task, commit):
# the ACLs are the same, and the cases stay fast.
ROWS = pa.table({"key": [f"k{i}".encode() for i in range(30)],
                 "value": [f"v{i}".encode() for i in range(30)]})


def _target(secured: Any) -> str:
    topic = f"out-{uuid.uuid4().hex[:8]}"
    create_topic(secured.setup_bootstrap, topic, 2)
    return topic


def _kafka_sink(secured: Any, user: str, topic: str, wal: str, **kw: Any) -> Any:
    from connectors import KafkaSink

    return KafkaSink(f"s-{uuid.uuid4().hex[:8]}", wal, topic=topic,
                     kafka_options=secured.client_conf(user), connect_timeout=20, **kw)


def _write(sink: Any, batch: int, writer: int = 0, attempt: int = 0) -> Any:
    from connectors.core.sink import TaskInfo

    sink.check_schema(ROWS.schema)
    sink.check_service()  # the driver's checks before any task
    return sink.stage(TaskInfo(batch, writer, attempt=attempt), iter(ROWS.to_batches()))


def _output(secured: Any, topic: str) -> list[tuple[bytes, bytes]]:
    return [(m.key(), m.value()) for m in read_topic(secured.setup_bootstrap, topic)]


@pytest.mark.parametrize("wire", [False, True], ids=["librdkafka", "wire"])
def test_recovery_key_sink_with_exactly_its_acls(secured: Any, tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 wire: bool) -> None:
    topic = _target(secured)
    user = _user(secured, "sink")
    _grant(secured, user, _role_acls("sink", topic=topic))
    sink = _kafka_sink(secured, user, topic, str(tmp_path / "wal"), wire_produce=wire)
    # The first attempt dies after 10 records: its retry needs the recovery scan, and with
    # it READ on the target topic.
    monkeypatch.setenv(failpoints.ENV, "kafka_sink.mid_produce@0#10!raise")
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            _write(sink, 0)
    finally:
        monkeypatch.delenv(failpoints.ENV)
        failpoints.reload()
    retry = _write(sink, 0, attempt=1)
    assert retry.retry and retry.skipped >= 10
    sink.commit(0, [retry])
    assert_exact(_output(secured, topic), list(zip(ROWS["key"].to_pylist(),
                                                   ROWS["value"].to_pylist(), strict=True)))
    assert sink.last_committed() == 0


@pytest.mark.parametrize("dropped", range(len(ROLES["sink"])), ids=_ids("sink"))
def test_recovery_key_sink_fails_fast_without_each_acl(secured: Any, tmp_path: Any,
                                                       dropped: int) -> None:
    topic = _target(secured)
    user = _user(secured, "sink")
    acls = _role_acls("sink", topic=topic)
    _grant(secured, user, [a for i, a in enumerate(acls) if i != dropped])
    sink = _kafka_sink(secured, user, topic, str(tmp_path / "wal"))
    started = time.monotonic()
    with pytest.raises(ConnectorError) as raised:
        _write(sink, 0)
    assert time.monotonic() - started < FAIL_WITHIN
    _assert_names(str(raised.value), user, acls[dropped])
    assert _output(secured, topic) == []
    assert sink.last_committed() is None


# -- the transactional sink -----------------------------------------------------------------
def _txn_names(topic: str) -> dict[str, str]:
    # a facts topic of its own per case, so the CREATE case finds it missing
    return {"topic": topic, "sink_id": f"tx-{uuid.uuid4().hex[:8]}",
            "facts_topic": f"facts-{uuid.uuid4().hex[:8]}"}


def _txn_sink(secured: Any, user: str, names: dict[str, str], wal: str,
              wire: bool = False) -> Any:
    from connectors import KafkaSink

    return KafkaSink(names["sink_id"], wal, topic=names["topic"], transactional=True,
                     facts_topic=names["facts_topic"], kafka_options=secured.client_conf(user),
                     connect_timeout=20, wire_produce=wire)


def _fact_offsets(secured: Any, names: dict[str, str]) -> dict[tuple[str, int], int]:
    return _group_offsets(secured, f"eo-sink-{names['sink_id']}-w0")


@pytest.mark.parametrize("wire", [False, True], ids=["librdkafka", "wire"])
def test_transactional_sink_with_exactly_its_acls(secured: Any, tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  wire: bool) -> None:
    names = _txn_names(_target(secured))
    user = _user(secured, "txn")
    _grant(secured, user, _role_acls("transactional-sink", **names))
    sink = _txn_sink(secured, user, names, str(tmp_path / "wal"), wire)
    # The first attempt fails after its transaction committed: the retry fences it, finds
    # its commit fact (OffsetFetch) and writes nothing.
    monkeypatch.setenv(failpoints.ENV, "kafka_sink.after_txn_commit@0!raise")
    failpoints.reload()
    try:
        with pytest.raises(FailpointError):
            _write(sink, 0)
    finally:
        monkeypatch.delenv(failpoints.ENV)
        failpoints.reload()
    retry = _write(sink, 0, attempt=1)
    sink.commit(0, [retry])
    assert_exact(_output(secured, names["topic"]), list(zip(
        ROWS["key"].to_pylist(), ROWS["value"].to_pylist(), strict=True)))
    assert sink.last_committed() == 0
    assert _fact_offsets(secured, names) == {(names["facts_topic"], 0): 0}


@pytest.mark.parametrize("dropped", range(len(ROLES["transactional-sink"])),
                         ids=_ids("transactional-sink"))
def test_transactional_sink_fails_fast_without_each_acl(secured: Any, tmp_path: Any,
                                                        dropped: int) -> None:
    names = _txn_names(_target(secured))
    acls = _role_acls("transactional-sink", **names)
    if acls[dropped].operation != "CREATE":
        # the facts topic exists (an operator made it): CREATE is not needed, the rest is
        create_topic(secured.setup_bootstrap, names["facts_topic"], 1)
    user = _user(secured, "txn")
    _grant(secured, user, [a for i, a in enumerate(acls) if i != dropped])
    sink = _txn_sink(secured, user, names, str(tmp_path / "wal"))
    started = time.monotonic()
    with pytest.raises(ConnectorError) as raised:
        _write(sink, 0)
    assert time.monotonic() - started < FAIL_WITHIN
    _assert_names(str(raised.value), user, acls[dropped])
    assert _output(secured, names["topic"]) == []
    # not even an aborted transaction's records: the denial came before the first produce
    assert read_topic(secured.setup_bootstrap, names["topic"], isolation="read_uncommitted") == []
    assert sink.last_committed() is None
    assert _fact_offsets(secured, names) == {}


# -- bad credentials --------------------------------------------------------------------------
BAD_INPUT = {
    "wrong-password": {"password": "not-the-password"},
    "wrong-mechanism": {"mechanism": "SCRAM-SHA-256"},
    "wrong-ca": {},  # a CA of its own, filled in by the test
}
#: The setting each case's error must point at.
BAD_INPUT_NAMES = {"wrong-password": "kafka.sasl.password",
                   "wrong-mechanism": "kafka.sasl.mechanism",
                   "wrong-ca": "kafka.ssl.ca.location"}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_credentials_fail_fast_without_secrets(secured: Any, tmp_path: Any,
                                                   case: str) -> None:
    from connectors.kafka.source.options import KafkaSourceOptions
    from connectors.kafka.source.planner import KafkaPlanner
    from tests.services.kafka_secured import make_tls

    topic = _source_topic(secured, 4)
    user = _user(secured, "bad")
    _grant(secured, user, _role_acls("source", topic=topic, group="g"))
    override = dict(BAD_INPUT[case])
    if case == "wrong-ca":
        override["ca"] = str(make_tls(tmp_path / "other-ca", "other")[0])
    options = {**secured.spark_options(user, **override), "subscribe": topic,
               "kafka.group.id": "g", "connectTimeout": "8s"}
    started = time.monotonic()
    with pytest.raises(ConnectorError) as raised:
        KafkaPlanner(KafkaSourceOptions.from_options(options, batch=True)).partitions()
    message = str(raised.value)
    assert time.monotonic() - started < FAIL_WITHIN
    _assert_no_secret(message, secured)
    assert BAD_INPUT_NAMES[case] in message, message

    from connectors import KafkaSink

    sink = KafkaSink(f"s-{uuid.uuid4().hex[:8]}", str(tmp_path / "wal"), topic=topic,
                     kafka_options=secured.client_conf(user, **override), connect_timeout=8)
    started = time.monotonic()
    with pytest.raises(ConnectorError) as raised:
        _write(sink, 0)
    assert time.monotonic() - started < FAIL_WITHIN
    _assert_no_secret(str(raised.value), secured)
    assert BAD_INPUT_NAMES[case] in str(raised.value), raised.value


# -- the CLI: lag ---------------------------------------------------------------------------
def _lag(secured: Any, user: str, group: str, topic: str, tmp_path: Any,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from connectors.cli import main

    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in secured.client_conf(user).items()
                              if k != "bootstrap.servers"))
    code = main(["lag", "--bootstrap", secured.bootstrap, "--group", group, "--json",
                 "--timeout", "10", "--kafka-config", str(config), "--topic", topic])
    out, err = capsys.readouterr()
    return code, out, err


def _committed_group(secured: Any, topic: str) -> str:
    from confluent_kafka import Consumer, TopicPartition

    group = f"g-{uuid.uuid4().hex[:8]}"
    setup = Consumer({"bootstrap.servers": secured.setup_bootstrap, "group.id": group})
    try:
        setup.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 7)],
                     asynchronous=False)
    finally:
        setup.close()
    return group


def test_lag_with_exactly_its_acls(secured: Any, tmp_path: Any,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    import json

    topic = _source_topic(secured)
    group = _committed_group(secured, topic)
    user = _user(secured, "lag")
    _grant(secured, user, _role_acls("lag", topic=topic, group=group))
    code, out, err = _lag(secured, user, group, topic, tmp_path, capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert {(p["partition"], p["committed"], p["lag"]) for p in doc["partitions"]} == {
        (0, 5, 15), (1, 7, 13)}


@pytest.mark.parametrize("dropped", range(len(ROLES["lag"])), ids=_ids("lag"))
def test_lag_fails_fast_without_each_acl(secured: Any, tmp_path: Any, dropped: int,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    topic = _source_topic(secured)
    group = _committed_group(secured, topic)
    user = _user(secured, "lag")
    acls = _role_acls("lag", topic=topic, group=group)
    _grant(secured, user, [a for i, a in enumerate(acls) if i != dropped])
    started = time.monotonic()
    code, _out, err = _lag(secured, user, group, topic, tmp_path, capsys)
    assert time.monotonic() - started < FAIL_WITHIN
    assert code == 2
    _assert_names(err, user, acls[dropped])
    _assert_no_secret(err, secured)


# -- the CLI: transactions ------------------------------------------------------------------
_HOLD = """
import os, signal, sys
from confluent_kafka import Producer
bootstrap, topic, tid = sys.argv[1:]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
p.init_transactions(30)
p.begin_transaction()
for i in range(20):
    p.produce(topic, b"held-%d" % i, None, i % 2)
p.flush(30)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _held_topic(secured: Any, sink_id: str) -> str:
    """A topic whose partitions a transaction of ``<sink_id>-0`` holds: its producer (set-up
    listener) was SIGKILLed inside it, as a task killed mid-transaction would be."""
    import subprocess
    import sys

    topic = f"held-{uuid.uuid4().hex[:8]}"
    create_topic(secured.setup_bootstrap, topic, 2)
    done = subprocess.run([sys.executable, "-c", _HOLD, secured.setup_bootstrap, topic,
                           f"{sink_id}-0"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == -9, done.stderr[-2000:]
    return topic


def _transactions(secured: Any, user: str, topic: str, sink_id: str, tmp_path: Any,
                  capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    from connectors.cli import main

    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in secured.client_conf(user).items()
                              if k != "bootstrap.servers"))
    code = main(["transactions", "--bootstrap", secured.bootstrap, "--topic", topic,
                 "--sink-id", sink_id, "--json", "--timeout", "10", "--kafka-config",
                 str(config), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_transactions_with_exactly_its_acls(secured: Any, tmp_path: Any,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import json

    sink_id = f"held-{uuid.uuid4().hex[:8]}"
    topic = _held_topic(secured, sink_id)
    user = _user(secured, "transactions")
    _grant(secured, user, _role_acls("transactions", topic=topic, sink_id=sink_id))
    code, out, err = _transactions(secured, user, topic, sink_id, tmp_path, capsys)
    assert code == 0, err
    assert any(p["held"] for p in json.loads(out)["partitions"]), out
    code, out, err = _transactions(secured, user, topic, sink_id, tmp_path, capsys,
                                   "--abort", "--writers", "1", "--yes")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["aborted"] == [f"{sink_id}-0"] and not any(p["held"] for p in doc["partitions"])


@pytest.mark.parametrize("dropped", range(len(ROLES["transactions"])), ids=_ids("transactions"))
def test_transactions_fails_fast_without_each_acl(secured: Any, tmp_path: Any, dropped: int,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sink_id = f"held-{uuid.uuid4().hex[:8]}"
    topic = _held_topic(secured, sink_id)
    user = _user(secured, "transactions")
    acls = _role_acls("transactions", topic=topic, sink_id=sink_id)
    _grant(secured, user, [a for i, a in enumerate(acls) if i != dropped])
    started = time.monotonic()
    code, _out, err = _transactions(secured, user, topic, sink_id, tmp_path, capsys,
                                    "--abort", "--writers", "1", "--yes")
    assert time.monotonic() - started < FAIL_WITHIN
    assert code == 2
    _assert_names(err, user, acls[dropped])
    _assert_no_secret(err, secured)
    # Nothing aborted: the transaction still holds its readers.
    from connectors.kafka.sink.transactions import partition_states

    conf = {"bootstrap.servers": secured.setup_bootstrap}
    assert any(s.held for s in partition_states(conf, topic, 15))


# -- a denial while running: READ revoked after the start's check ------------------------------
def test_a_fetch_denied_mid_run_names_the_acl(secured: Any) -> None:
    """The start's check passed, then READ went (an operator revoked it): the executor's
    read fails at once, not after pollTimeoutMs, naming the ACL."""
    from connectors.core.errors import KafkaSourceError
    from connectors.kafka.source.offsets import OffsetRange
    from connectors.kafka.source.range_reader import read_range

    topic = _source_topic(secured, 4)
    user = _user(secured, "reader")
    _grant(secured, user, [Acl("TOPIC", topic, "LITERAL", "DESCRIBE", "metadata")])
    conf = {**secured.client_conf(user), "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": "false", "enable.partition.eof": "true"}
    started = time.monotonic()
    with pytest.raises(KafkaSourceError) as raised:
        list(read_range(OffsetRange("", topic, 0, 0, 2), conf, poll_timeout_s=60))
    assert time.monotonic() - started < FAIL_WITHIN
    _assert_names(str(raised.value), user, Acl("TOPIC", topic, "LITERAL", "READ", ""))


@pytest.mark.parametrize("transactional", [False, True], ids=["recovery-keys", "transactional"])
@pytest.mark.parametrize("wire", [False, True], ids=["librdkafka", "wire"])
def test_a_sasl_session_that_expires_between_tasks_is_renewed(secured: Any, tmp_path: Any,
                                                              transactional: bool,
                                                              wire: bool) -> None:
    """The listener ends SASL sessions after 4 s (``connections.max.reauth.ms``, KIP-368):
    a worker's cached producer and fact client must log in again, not fail the next task."""
    from tests.services.kafka_secured import REAUTH_MS

    names = _txn_names(_target(secured))
    user = _user(secured, "reauth")
    role = "transactional-sink" if transactional else "sink"
    _grant(secured, user, _role_acls(role, **names))
    if transactional:
        sink = _txn_sink(secured, user, names, str(tmp_path / "wal"), wire)
    else:
        sink = _kafka_sink(secured, user, names["topic"], str(tmp_path / "wal"),
                           wire_produce=wire)
    sink.commit(0, [_write(sink, 0)])
    time.sleep(REAUTH_MS / 1000 + 1.5)
    sink.commit(1, [_write(sink, 1)])
    expected = list(zip(ROWS["key"].to_pylist(), ROWS["value"].to_pylist(), strict=True))
    assert_exact(_output(secured, names["topic"]), expected * 2)
