"""Option parsing of the eo_kafka source: Spark's names, clear errors, no secrets echoed."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from connectors.core.errors import OptionError
from connectors.kafka.source.options import KafkaSourceOptions, StartSpec

BASE = {"kafka.bootstrap.servers": "h1:9092", "subscribe": "orders"}


def parse(batch: bool = False, **extra: Any) -> KafkaSourceOptions:
    opts = dict(BASE)
    opts.update({k: v for k, v in extra.items() if v is not None})
    # Spark lower-cases option keys; the parser must accept that.
    return KafkaSourceOptions.from_options({k.lower(): v for k, v in opts.items()}, batch=batch)


def error(batch: bool = False, drop: tuple[str, ...] = (), **extra: Any) -> OptionError:
    opts = {k: v for k, v in BASE.items() if k not in drop}
    opts.update(extra)
    with pytest.raises(OptionError) as e:
        KafkaSourceOptions.from_options({k.lower(): v for k, v in opts.items()}, batch=batch)
    return e.value


def test_defaults_streaming_and_batch() -> None:
    o = parse()
    (c,) = o.clusters
    assert c.subscribe == ("orders",) and c.bootstrap == "h1:9092"
    assert c.starting == StartSpec("latest")
    assert o.fail_on_data_loss and not o.include_headers and not o.multi_cluster
    assert o.ending is None and o.wal_path is None
    conf = c.reader_conf(o.group_id)
    assert conf["isolation.level"] == "read_committed"
    assert conf["enable.auto.commit"] == "false" and conf["auto.offset.reset"] == "error"
    b = parse(batch=True)
    assert b.clusters[0].starting == StartSpec("earliest") and b.ending == StartSpec("latest")


def test_isolation_level_can_be_overridden() -> None:
    o = parse(**{"kafka.isolation.level": "read_uncommitted"})
    assert o.clusters[0].reader_conf(o.group_id)["isolation.level"] == "read_uncommitted"


def test_exactly_one_subscription() -> None:
    assert "one of the options" in str(error(drop=("subscribe",)))
    e = error(subscribePattern="o.*")
    assert "cannot be used together" in str(e) and "subscribePattern" in str(e)


def test_bootstrap_required() -> None:
    e = error(drop=("kafka.bootstrap.servers",))
    assert e.option == "kafka.bootstrap.servers"


def test_subscribe_pattern_and_assign() -> None:
    o = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h",
                                          "subscribepattern": "o-.*"})
    assert o.clusters[0].subscribe_pattern == "o-.*" and o.clusters[0].matches("o-1")
    assert not o.clusters[0].matches("x-1")
    o = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h",
                                          "assign": '{"a": [1, 0], "b": [2]}'})
    assert o.clusters[0].assign == (("a", 0), ("a", 1), ("b", 2))
    with pytest.raises(OptionError, match="assign"):
        KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h", "assign": '{"a": 1}'})
    with pytest.raises(OptionError, match="regular expression"):
        KafkaSourceOptions.from_options({"kafka.bootstrap.servers": "h",
                                          "subscribePattern": "(("})


@pytest.mark.parametrize(
    "value, spec",
    [
        ("earliest", StartSpec("earliest")),
        ("LATEST", StartSpec("latest")),
        ("group", StartSpec("group")),
        ('{"orders": {"0": 5, "1": -2, "2": -1}}',
         StartSpec("offsets", (("orders", 0, 5), ("orders", 1, -2), ("orders", 2, -1)))),
    ],
)
def test_starting_offsets(value: str, spec: StartSpec) -> None:
    assert parse(startingOffsets=value).clusters[0].starting == spec


def test_starting_offsets_invalid() -> None:
    e = error(startingOffsets="beginning")
    assert e.option == "startingOffsets" and "earliest" in str(e) and "group" in str(e)
    assert "-2" in str(error(startingOffsets='{"orders": {"0": -7}}'))


def test_starting_by_timestamp() -> None:
    o = parse(startingOffsetsByTimestamp='{"orders": {"0": 1000}}')
    assert o.clusters[0].starting == StartSpec("timestamps", (("orders", 0, 1000),))
    o = parse(startingTimestamp="1700000000000")
    assert o.clusters[0].starting == StartSpec("timestamp", timestamp=1700000000000)
    assert "cannot be used together" in str(
        error(startingTimestamp="1", startingOffsets="earliest")
    )
    assert error(startingTimestamp="yesterday").option == "startingTimestamp"


def test_ending_offsets_batch_only() -> None:
    assert parse(batch=True, endingOffsets='{"orders": {"0": 10, "1": -1}}').ending == StartSpec(
        "offsets", (("orders", 0, 10), ("orders", 1, -1))
    )
    assert "only valid for batch" in str(error(endingOffsets="latest"))
    assert "earliest" in str(error(batch=True, endingOffsets="earliest"))
    assert "-2" in str(error(batch=True, endingOffsets='{"orders": {"0": -2}}'))


def test_limits() -> None:
    o = parse(maxOffsetsPerTrigger="1000", minOffsetsPerTrigger="10", maxTriggerDelay="30s",
              maxBytesPerTrigger="1048576", minPartitions="8", maxRecordsPerPartition="500")
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.max_trigger_delay) == (
        1000, 10, 30.0)
    assert (o.max_bytes_per_trigger, o.min_partitions, o.max_records_per_partition) == (
        1048576, 8, 500)
    assert error(maxOffsetsPerTrigger="0").option == "maxOffsetsPerTrigger"
    assert error(maxOffsetsPerTrigger="lots").option == "maxOffsetsPerTrigger"
    assert error(minPartitions="-1").option == "minPartitions"
    assert error(maxTriggerDelay="soon").option == "maxTriggerDelay"
    e = error(minOffsetsPerTrigger="100", maxOffsetsPerTrigger="10")
    assert e.option == "minOffsetsPerTrigger"


def test_target_records_per_partition() -> None:
    assert parse().target_records_per_partition == 100_000
    assert parse(targetRecordsPerPartition="5000").target_records_per_partition == 5000
    assert parse(targetRecordsPerPartition="0").target_records_per_partition == 0  # off
    e = error(targetRecordsPerPartition="-1")
    assert e.option == "targetRecordsPerPartition" and ">= 0" in str(e)
    assert error(targetRecordsPerPartition="many").option == "targetRecordsPerPartition"
    assert "targetRecordsPerPartition" in str(error(targetRecordPerPartition="10"))


def test_booleans() -> None:
    o = parse(failOnDataLoss="false", includeHeaders="true")
    assert not o.fail_on_data_loss and o.include_headers
    assert error(failOnDataLoss="maybe").option == "failOnDataLoss"


@pytest.mark.parametrize("key", ["kafka.enable.auto.commit", "kafka.auto.offset.reset"])
def test_refused_kafka_settings(key: str) -> None:
    assert error(**{key: "true"}).option == key


def test_group_id() -> None:
    assert parse(**{"kafka.group.id": "g1"}).group_id == "g1"
    a = parse(groupIdPrefix="etl")
    assert a.group_id.startswith("etl-")
    assert parse(groupIdPrefix="etl").group_id == a.group_id  # stable across runs
    assert parse(groupIdPrefix="etl", subscribe="other").group_id != a.group_id
    assert parse(walPath="/tmp/w1").group_id != parse(walPath="/tmp/w2").group_id
    assert "cannot be used together" in str(error(groupIdPrefix="x", **{"kafka.group.id": "g"}))


@pytest.mark.parametrize("group", ["", "  "])
def test_a_blank_group_id_is_refused(group: str) -> None:
    """A blank group.id would abort the process in confluent-kafka's Consumer()."""
    e = error(**{"kafka.group.id": group})
    assert e.option == "kafka.group.id" and "is empty" in str(e)
    entry = json.dumps([{"name": "e", "bootstrap": "h", "subscribe": "a",
                         "kafka.group.id": group}])
    with pytest.raises(OptionError, match="clusters entry 'e'") as found:
        KafkaSourceOptions.from_options({"clusters": entry})
    assert "is empty" in str(found.value)


def test_wal_path_takes_object_stores_and_their_options() -> None:
    opts = parse(walPath="s3://bucket/wal", **{"storage.endpoint": "http://127.0.0.1:1",
                                                "storage.accessKeyId": "AK",
                                                "storage.secretAccessKey": "S3CR3T"})
    assert opts.wal_path == "s3://bucket/wal" and "S3CR3T" not in repr(opts)
    assert "did you mean 'storage.region'" in str(error(walPath="s3://b/w",
                                                        **{"storage.regoin": "x"}))
    assert "object store paths only" in str(error(walPath="/tmp/w", **{"storage.region": "x"}))
    half = str(error(walPath="s3://b/w", **{"storage.secretAccessKey": "S3CR3T"}))
    assert "storage.* options do not configure" in half and "S3CR3T" not in half
    assert "set but walPath is not" in str(error(**{"storage.region": "x"}))


def test_clusters() -> None:
    opts = {
        "clusters": '[{"name": "east", "bootstrap": "e:9092", "subscribe": "a,b"},'
        ' {"bootstrap": "w:9092", "assign": {"c": [0]}, "startingOffsets": "earliest",'
        ' "kafka.security.protocol": "PLAINTEXT"}]',
        "kafka.client.id": "x",
    }
    o = KafkaSourceOptions.from_options(opts)
    assert o.multi_cluster
    east, west = o.clusters
    assert (east.name, east.subscribe, east.starting.kind) == ("east", ("a", "b"), "latest")
    assert (west.name, west.assign, west.starting.kind) == ("w:9092", (("c", 0),), "earliest")
    assert west.kafka["security.protocol"] == "PLAINTEXT" and west.kafka["client.id"] == "x"
    assert west.kafka["bootstrap.servers"] == "w:9092"


@pytest.mark.parametrize(
    "clusters, fragment",
    [
        ("[]", "empty"),
        ('[{"subscribe": "a"}]', "bootstrap"),
        ('[{"bootstrap": "h"}]', "exactly one of"),
        ('[{"bootstrap": "h", "subscribe": "a", "assign": {"a": [0]}}]', "exactly one of"),
        ('[{"bootstrap": "h", "subscribe": "a"}, {"bootstrap": "h", "subscribe": "b"}]', "twice"),
        ('{"bootstrap": "h"}', "JSON list"),
    ],
)
def test_clusters_errors(clusters: str, fragment: str) -> None:
    with pytest.raises(OptionError, match=fragment):
        KafkaSourceOptions.from_options({"clusters": clusters})


def test_clusters_exclude_top_level_subscription() -> None:
    with pytest.raises(OptionError, match="clusters"):
        KafkaSourceOptions.from_options(
            {"clusters": '[{"bootstrap": "h", "subscribe": "a"}]', "subscribe": "a"}
        )


def test_secrets_not_echoed_and_spec_picklable() -> None:
    o = parse(**{"kafka.sasl.password": "hunter2", "kafka.sasl.username": "u"})
    assert "hunter2" not in repr(o)
    clone = pickle.loads(pickle.dumps(o))
    assert clone == o
    assert clone.clusters[0].kafka["sasl.password"] == "hunter2"


def test_unknown_options_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(OptionError, match="did you mean 'startingOffsets'"):
        parse(startingOffset="earliest")
    parse(startingOffset="earliest", ignoreUnknownOptions="true")
    assert "startingoffset" in caplog.text.lower()
    parse(metadataRetryTimeout="5s", checkpointLocation="/c", queryName="q")


def test_sink_only_options_are_the_sink_s_options_the_source_refuses(tmp_path) -> None:
    """The source tells a write (Spark asking a sink for its schema) by the sink's options
    it does not take; both halves of that split are held against the source's parser."""
    from connectors.core.declared import spark_names
    from connectors.kafka.sink.options import KAFKA_SINK_OPTIONS
    from connectors.spark.kafka_source import _SINK_ONLY

    assert {"recoverykeyheaders", "failonunknowntopic", "batchproduce", "sinkid"} <= _SINK_ONLY
    for name in _SINK_ONLY:
        assert "unknown option" in str(error(**{name: "x"})), name
    shared = {"walpath": str(tmp_path), "connecttimeout": "5s", "metadataretrytimeout": "5s"}
    prefixes = {n for n in spark_names(KAFKA_SINK_OPTIONS) if n.endswith(".")}
    assert spark_names(KAFKA_SINK_OPTIONS) - _SINK_ONLY - prefixes == {
        *shared, "kafka.bootstrap.servers"}
    parse(**shared)  # the source takes every shared option
