"""KafkaSink without a broker: the dedupe decision, deterministic order, routing, options."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pyarrow as pa
import pytest

from connectors.core import contact
from connectors.core.errors import KafkaSinkError, OptionError, SinkOwnershipError
from connectors.kafka.sink import (
    KafkaSink,
    check_producer_config,
    deterministic_order,
    ordering,
    partitioner,
    recovery,
)

# -- the dedupe decision ----------------------------------------------------------------------


def test_skip_mask_skips_rows_at_or_below_the_max_seq_per_target():
    seqs = np.arange(8)
    targets = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    skip = recovery.skip_mask(seqs, targets, {0: 4, 1: 1})
    assert skip.tolist() == [True, True, True, False, True, False, False, False]
    assert not recovery.skip_mask(seqs, targets, {}).any()


def test_decide_on_a_clean_prefix_equals_the_max_rule():
    seqs = np.arange(10)
    targets = np.array([i % 3 for i in range(10)])
    present = {0: [0, 3], 1: [1, 4, 7]}  # target 2 got nothing
    skip = recovery.decide(seqs, targets, present, {})
    assert np.nonzero(skip)[0].tolist() == [0, 1, 3, 4, 7]
    assert skip.tolist() == recovery.skip_mask(seqs, targets, {0: 3, 1: 7}).tolist()


def test_decide_ignores_duplicates_found_by_the_scan():
    seqs = np.arange(4)
    targets = np.zeros(4, dtype=int)
    assert recovery.decide(seqs, targets, {0: [0, 1, 1, 0]}, {}).tolist() == [
        True, True, False, False
    ]


def test_decide_produces_a_gap_again_instead_of_skipping_it():
    seqs = np.arange(6)
    targets = np.zeros(6, dtype=int)
    skip = recovery.decide(seqs, targets, {0: [0, 1, 3]}, {0: "b[0]"})
    # seq 2 is below the max (3) but missing: it must be produced again
    assert skip.tolist() == [True, True, False, True, False, False]


def test_decide_refuses_seqs_this_attempt_routes_elsewhere():
    seqs = np.arange(4)
    targets = np.array([0, 1, 0, 1])
    with pytest.raises(KafkaSinkError, match=r"b\[0\].*not the same on replay"):
        recovery.decide(seqs, targets, {0: [0, 1]}, {0: "b[0]"})


# -- deterministic order ------------------------------------------------------------------------


def _rows(n: int = 300) -> list[dict]:
    rnd = random.Random(7)
    rows = []
    for i in range(n):
        key = None if i % 5 == 0 else f"k{rnd.randrange(20)}".encode()
        rows.append({"key": key, "value": f"v{rnd.randrange(50)}".encode()})
    return rows


@pytest.mark.parametrize("order", ordering.ORDERS)
def test_order_is_the_same_whatever_the_input_order_and_batching(order):
    rows = _rows()
    first = deterministic_order(pa.Table.from_pylist(rows), order)
    for seed in range(3):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        table = pa.Table.from_pylist(shuffled)
        again = deterministic_order(pa.Table.from_batches(table.to_batches(max_chunksize=17)),
                                    order)
        assert again.to_pylist() == first.to_pylist()


def test_order_is_by_key_then_value_nulls_first():
    table = pa.table({
        "key": [b"b", None, b"a", b"a", None],
        "value": [b"1", b"9", b"2", b"1", None],
    })
    out = deterministic_order(table, ordering.SORTED).to_pylist()
    assert [(r["key"], r["value"]) for r in out] == [
        (None, None), (None, b"9"), (b"a", b"1"), (b"a", b"2"), (b"b", b"1"),
    ]


def test_order_breaks_ties_on_topic_partition_and_headers():
    hdr = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    def row(topic, partition, header):
        headers = None if header is None else [{"key": "h", "value": header}]
        return {"key": b"k", "value": b"v", "topic": topic, "partition": partition,
                "headers": headers}

    rows = [row("t2", 0, b"2"), row("t1", 1, b"1"), row("t1", 1, b"0"), row("t1", 0, None)]
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                        ("partition", pa.int32()), ("headers", hdr)])
    a = deterministic_order(pa.Table.from_pylist(rows, schema=schema), ordering.SORTED).to_pylist()
    b = deterministic_order(pa.Table.from_pylist(rows[::-1], schema=schema),
                            ordering.SORTED).to_pylist()
    assert a == b
    assert [(r["topic"], r["partition"]) for r in a] == [("t1", 0), ("t1", 1), ("t1", 1), ("t2", 0)]
    assert a[1]["headers"][0]["value"] == b"0"


# -- routing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    # Values of Kafka's Java Utils.murmur2 (as used by its default partitioner).
    [("1", -1993445489), ("12", 126087238), ("123", -267702483), ("1234", -1614185708),
     ("12345", -1188365604)],
)
def test_murmur2_matches_the_java_client(text, expected):
    assert partitioner.murmur2(text.encode()) == expected


def test_vectorised_murmur2_equals_the_reference():
    rnd = random.Random(1)
    keys = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 70))) for _ in range(2000)]
    arr = pa.array(keys, pa.binary())
    got = partitioner.murmur2_array(arr)
    assert [int(x) for x in got] == [partitioner.murmur2(k) & 0xFFFFFFFF for k in keys]
    sliced = partitioner.murmur2_array(arr.slice(13, 50))
    assert [int(x) for x in sliced] == [partitioner.murmur2(k) & 0xFFFFFFFF for k in keys[13:63]]
    strings = partitioner.murmur2_array(pa.array(["1", "12"]))
    assert [int(x) for x in strings] == [(-1993445489) & 0xFFFFFFFF, 126087238]


def test_route_explicit_then_key_then_sticky_runs():
    keys = pa.array([b"1", None, b"12", None, b"123"], pa.binary())
    explicit = pa.array([None, None, None, 0, 2], pa.int32())
    counts = np.full(5, 3)
    sizes = lambda: np.full(5, 100)  # noqa: E731
    parts = partitioner.route(keys, explicit, counts, partitioner.ByteRuns(7, 1000), sizes)
    assert parts.tolist() == [
        partitioner.key_partition(b"1", 3),
        7 % 3,  # null key: row 1 is in the task's first run, which starts at 7
        partitioner.key_partition(b"12", 3),
        0,  # explicit
        2,  # explicit wins over the key
    ]
    # Runs of the budget's bytes, each to the next partition, wrapping around.
    n = 31
    parts = partitioner.route(None, None, np.full(n, 4), partitioner.ByteRuns(2, 1000),
                              lambda: np.full(n, 100)).tolist()
    assert parts == [2] * 10 + [3] * 10 + [0] * 10 + [1]
    # The same on a retry; another (batch, writer) starts elsewhere.
    start = partitioner.null_key_start(5, 1)
    assert start == partitioner.null_key_start(5, 1) != partitioner.null_key_start(5, 2)


# -- options --------------------------------------------------------------------------------------

BASE = {"sink_id": "s1", "walPath": "/tmp/eo-wal", "kafka.bootstrap.servers": "h:9092",
        "topic": "b"}


def _spark(options: dict) -> dict:
    """Spark hands options over with lower-cased keys."""
    return {k.lower(): v for k, v in options.items()}


def test_from_options_parses_and_keeps_safe_defaults():
    sink = KafkaSink.from_options(
        _spark({**BASE, "deterministicOrder": "true", "transactional": "true",
                "kafka.linger.ms": "20", "scanTimeout": "30s"}), None)
    assert sink.sink_id == "s1" and sink.topic == "b"
    assert sink.deterministic_order and sink.transactional
    assert sink.producer_conf["enable.idempotence"] == "true"
    assert sink.producer_conf["acks"] == "all"
    assert sink.producer_conf["linger.ms"] == "20"
    assert sink.producer_conf["bootstrap.servers"] == "h:9092"
    assert sink.scan_timeout == 30.0


@pytest.mark.parametrize("missing", ["sink_id", "walPath", "kafka.bootstrap.servers"])
def test_required_options(missing):
    opts = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(OptionError, match=f"'{missing}'"):
        KafkaSink.from_options(_spark(opts), None)


@pytest.mark.parametrize(
    "name,value",
    [("acks", "1"), ("acks", "0"), ("request.required.acks", "1"),
     ("enable.idempotence", "false")],
)
def test_unsafe_producer_settings_are_refused_by_name(name, value):
    with pytest.raises(OptionError, match=f"'kafka.{name}' breaks the exactly-once") as e:
        KafkaSink.from_options(_spark({**BASE, f"kafka.{name}": value}), None)
    assert e.value.option == f"kafka.{name}"
    assert "unsafe=true" in str(e.value)
    sink = KafkaSink.from_options(_spark({**BASE, f"kafka.{name}": value, "unsafe": "true"}), None)
    assert sink.producer_conf[name] == value


def test_python_api_refuses_unsafe_settings_too():
    with pytest.raises(OptionError, match="kafka.acks"):
        KafkaSink("s", "/tmp/w", bootstrap_servers="h:1", topic="t", kafka_options={"acks": 1})
    with pytest.raises(OptionError, match="kafka.enable.idempotence"):
        KafkaSink("s", "/tmp/w", bootstrap_servers="h:1", topic="t",
                  kafka_options={"enable.idempotence": False})
    KafkaSink("s", "/tmp/w", bootstrap_servers="h:1", topic="t", kafka_options={"acks": "-1"})


def test_transactional_id_is_never_user_set():
    with pytest.raises(OptionError, match="transactional.id"):
        check_producer_config({"transactional.id": "x"}, unsafe=True)


def test_schema_checks_name_the_column(tmp_path):
    sink = KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", topic=None)
    with pytest.raises(KafkaSinkError, match="no 'value' column"):
        sink.check_schema(pa.schema([("v", pa.binary())]))
    with pytest.raises(KafkaSinkError, match="column 'key' has type int64"):
        sink.check_schema(pa.schema([("value", pa.binary()), ("key", pa.int64())]))
    with pytest.raises(KafkaSinkError, match="no target topic"):
        sink.check_schema(pa.schema([("value", pa.binary())]))
    sink.check_schema(pa.schema([("value", pa.string()), ("topic", pa.string())]))


def test_wal_path_belongs_to_one_sink(tmp_path):
    schema = pa.schema([("value", pa.binary())])
    KafkaSink("a", str(tmp_path), bootstrap_servers="h:1", topic="t").check_schema(schema)
    with pytest.raises(SinkOwnershipError, match="belongs to sink_id .a."):
        KafkaSink("b", str(tmp_path), bootstrap_servers="h:1", topic="t").check_schema(schema)


def test_sink_pickles_without_runtime_state(tmp_path):
    sink = KafkaSink("s", str(tmp_path), bootstrap_servers="h:1", topic="t",
                     kafka_options={"sasl.password": "hunter2"})
    assert sink.last_committed() is None  # opens the WAL
    back = pickle.loads(pickle.dumps(sink))
    assert back._wal is None and back.sink_id == "s"
    assert "hunter2" not in repr(sink)


def test_recovery_key_headers_option_through_spark_options():
    sink = KafkaSink.from_options(
        _spark({**BASE, "transactional": "true", "recoveryKeyHeaders": "true"}), None)
    assert sink.transactional and sink.options.recovery_key_headers
    assert not KafkaSink.from_options(_spark(BASE), None).options.recovery_key_headers


def test_python_arguments_and_spark_options_give_the_same_spec(tmp_path):
    wal = str(tmp_path / "wal")
    a = KafkaSink("s1", wal, bootstrap_servers="h:9092", topic="b", transactional=True,
                  flush_timeout=0.5, connect_timeout="2s", kafka_options={"linger.ms": 20})
    b = KafkaSink.from_options(_spark({"sinkId": "s1", "walPath": wal, "topic": "b",
                                       "kafka.bootstrap.servers": "h:9092",
                                       "transactional": "true", "flushTimeout": "500ms",
                                       "connectTimeout": "2", "kafka.linger.ms": "20"}), None)
    assert a.options == b.options and a.producer_conf == b.producer_conf
    assert (a.flush_timeout, a.connect_timeout) == (0.5, 2.0)


def test_python_errors_name_the_python_argument():
    with pytest.raises(OptionError, match="option 'bootstrap_servers' is required") as e:
        KafkaSink("s", "/tmp/w")
    assert e.value.option == "bootstrap_servers"
    with pytest.raises(OptionError, match="option 'wal_path' is required"):
        KafkaSink("s", " ", bootstrap_servers="h:1")
    # bootstrap.servers may also come with the librdkafka settings
    assert KafkaSink("s", "/tmp/w", kafka_options={"bootstrap.servers": "h:1"}).producer_conf[
        "bootstrap.servers"] == "h:1"


# -- commit facts (transactional mode) -----------------------------------------------------------
def test_a_commit_fact_names_its_batch_in_the_metadata_and_nothing_else_passes_for_one() -> None:
    from connectors.kafka.sink.commit_facts import CommitFact

    fact = CommitFact(41, 7, {"t": {"0": 3, "2": 4}}, scope="ab12")
    assert CommitFact.decode(fact.encode()) == fact
    for metadata in (None, "", "not json", "[]", '{"rows": 3}', '{"b": "41"}'):
        assert CommitFact.decode(metadata) is None, metadata
    # Very many target partitions: the counts go, the batch stays.
    wide = CommitFact(5, 10_000, {"t": {str(p): 10 for p in range(1000)}}, scope="ab12")
    assert CommitFact.decode(wide.encode()) == CommitFact(5, 10_000, scope="ab12")
    # What confluent-kafka may append past the metadata's end (no NUL after it in
    # librdkafka's copy), and the NUL the wire path stores: the JSON's own end counts.
    for tail in ("\x00", "\x00garbage", "\u00ff\u00fe", "}}"):
        assert CommitFact.decode(fact.encode() + tail) == fact, tail


def test_the_expiry_margin_is_a_tenth_of_the_retention_at_most_ten_minutes() -> None:
    from connectors.kafka.sink.commit_facts import expiry_margin

    assert expiry_margin(60.0) == 6.0
    assert expiry_margin(7 * 24 * 3600.0) == 600.0


def test_the_cluster_check_runs_once_per_configuration_and_process_within_its_ttl(
        tmp_path, monkeypatch) -> None:
    """Spark makes the sink twice per micro-batch on the driver: the second and later
    checks of one configuration within the TTL ask nothing; a failed check is not
    remembered; another configuration, or the TTL passed, is checked again."""
    from connectors.kafka.sink import sink as sink_module
    from connectors.kafka.sink import targets

    asked: list[str] = []
    failing = {"yes": True}

    def reachable(options):
        asked.append(options.topic)
        if failing["yes"]:
            raise KafkaSinkError("not reachable")

    monkeypatch.setattr(targets, "check_reachable", reachable)
    monkeypatch.setattr(targets, "partition_counts", lambda options, topics: {})
    monkeypatch.setattr(targets, "check_access", lambda options: None)
    monkeypatch.setattr(sink_module, "_SERVICE_CHECKED", {})
    monkeypatch.setattr(contact, "_REACHED", set())

    def sink(topic: str) -> KafkaSink:
        return KafkaSink("ttl", str(tmp_path / "wal"), bootstrap_servers="127.0.0.1:9",
                         topic=topic)

    with pytest.raises(KafkaSinkError):
        sink("a").check_service()
    failing["yes"] = False
    for _ in range(3):
        sink("a").check_service()
    sink("b").check_service()
    assert asked == ["a", "a", "b"]
    monkeypatch.setattr(sink_module, "SERVICE_CHECK_TTL_S", 0.0)
    sink("a").check_service()
    assert asked == ["a", "a", "b", "a"]


def test_a_recheck_that_finds_the_cluster_down_lets_the_query_go_on(tmp_path, monkeypatch,
                                                                    caplog) -> None:
    """Past the TTL a configuration that answered before is checked again; an outage then
    (the check's connectTimeout passed without an answer) is logged and the batch goes on:
    its own requests wait within their retry budgets, as a node kill must not stop a query.
    A wrong setting still fails, and so does an outage at the first check."""
    from connectors.kafka.sink import sink as sink_module
    from connectors.kafka.sink import targets

    verdict: dict[str, KafkaSinkError | None] = {"now": None}

    def reachable(options):
        if verdict["now"] is not None:
            raise verdict["now"]

    def outage() -> KafkaSinkError:
        e = KafkaSinkError("eo_kafka sink ttl: cannot reach Kafka at 127.0.0.1:9 within "
                           "connectTimeout=30s")
        e.unreachable = True
        return e

    monkeypatch.setattr(targets, "check_reachable", reachable)
    monkeypatch.setattr(targets, "partition_counts", lambda options, topics: {})
    monkeypatch.setattr(targets, "check_access", lambda options: None)
    monkeypatch.setattr(sink_module, "_SERVICE_CHECKED", {})
    monkeypatch.setattr(contact, "_REACHED", set())
    monkeypatch.setattr(sink_module, "SERVICE_CHECK_TTL_S", 0.0)

    def sink(topic: str = "a") -> KafkaSink:
        return KafkaSink("ttl", str(tmp_path / "wal"), bootstrap_servers="127.0.0.1:9",
                         topic=topic)

    verdict["now"] = outage()
    with pytest.raises(KafkaSinkError, match="cannot reach"):
        sink().check_service()  # never answered in this process: the query stops, said why
    verdict["now"] = None
    sink().check_service()
    verdict["now"] = outage()
    with caplog.at_level("WARNING"):
        sink().check_service()  # answered before: goes on
    assert "goes on" in caplog.text
    verdict["now"] = KafkaSinkError("eo_kafka sink ttl: SASL authentication failed")
    with pytest.raises(KafkaSinkError, match="SASL"):
        sink().check_service()
    verdict["now"] = None

    def metadata_outage(options, topics):
        raise outage()

    monkeypatch.setattr(targets, "partition_counts", metadata_outage)
    sink().check_service()  # the later steps of a re-check too: metadataRetryTimeout passed


def test_metadata_still_failing_after_its_retry_timeout_is_an_outage() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from connectors.kafka.common import retrying

    def timed_out():
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    with pytest.raises(KafkaSinkError, match="still failed") as e:
        retrying(timed_out, what="metadata of topic 't'", error=KafkaSinkError, timeout=0.2)
    assert e.value.unreachable
