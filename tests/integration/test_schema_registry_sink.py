"""The eo_kafka sink writing Avro in the Confluent wire format, against a real broker, a
real registry and real Spark; what it writes is read back by clients we did not write
(confluent-kafka's ``AvroDeserializer``) and by our source."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest

from tests.helpers import read_topic

pytestmark = pytest.mark.integration

ROWS = 300


def _df(spark: Any, n: int = ROWS) -> Any:
    return spark.range(0, n, numPartitions=3).selectExpr(
        "cast(id % 7 as string) as key",
        "named_struct('id', id, 'name', concat('n', cast(id as string)), "
        "'price', cast(id as double) / 4, 'day', date_add(date'2024-01-01', cast(id % 30 as int)),"
        " 'amount', cast(id as decimal(12, 2)), 'tags', array(cast(id % 3 as string)),"
        " 'attrs', map('a', id), 'note', if(id % 3 = 0, null, 'x')) as value")


def _write(df: Any, bootstrap: str, topic: str, registry_url: str, tmp_path: Any,
           batch_id: int = 0, **options: str) -> None:
    w = (df.write.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).option("sink_id", f"s{uuid.uuid4().hex[:8]}")
         .option("walPath", str(tmp_path / f"wal-{topic}")).option("batchId", batch_id)
         .option("valueFormat", "avro").option("schemaRegistry.url", registry_url))
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()


def _deserialize(registry_url: str, topic: str, messages: list[Any]) -> list[dict[str, Any]]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    de = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [de(m.value(), ctx) for m in messages]


def test_written_avro_reads_back_with_confluents_deserializer_and_our_source(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    topic = new_topic(partitions=2)
    _write(_df(spark), kafka_bootstrap, topic, registry_url, tmp_path, autoRegister="true")
    messages = read_topic(kafka_bootstrap, topic)
    assert len(messages) == ROWS
    assert {m.value()[0] for m in messages} == {0}
    decoded = _deserialize(registry_url, topic, messages)
    got = sorted((r["id"], r["name"], r["price"], str(r["amount"]), r["tags"], r["attrs"],
                  r["note"], r["day"].isoformat()) for r in decoded)
    want = [r.asDict(recursive=True) for r in _df(spark).select("value.*").collect()]
    assert got == sorted((r["id"], r["name"], r["price"], str(r["amount"]), r["tags"],
                          r["attrs"], r["note"], r["day"].isoformat()) for r in want)
    # our source reads the same subject back as the same struct
    back = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic).option("valueFormat", "avro")
            .option("schemaRegistry.url", registry_url).load())
    assert Counter(repr(r) for r in back.select("value.*").collect()) == Counter(
        repr(r) for r in _df(spark).select("value.*").collect())


def test_an_unregistered_schema_is_refused_without_auto_register_and_nothing_is_written(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    topic = new_topic()
    with pytest.raises(Exception, match="not registered under subject") as e:
        _write(_df(spark, 5), kafka_bootstrap, topic, registry_url, tmp_path)
    assert "autoRegister=true" in str(e.value)
    assert read_topic(kafka_bootstrap, topic) == []


def test_an_incompatible_schema_is_refused_by_the_registry_and_the_sink_says_so(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = new_topic()
    _write(_df(spark, 5), kafka_bootstrap, topic, registry_url, tmp_path, autoRegister="true")
    SchemaRegistryClient({"url": registry_url}).set_compatibility(f"{topic}-value", "BACKWARD")
    # id becomes a string: no reader of version 1 can read it
    changed = _df(spark, 5).selectExpr("named_struct('id', cast(value.id as string)) as value")
    with pytest.raises(Exception, match="refused the value schema .* as incompatible"):
        _write(changed, kafka_bootstrap, topic, registry_url, tmp_path, batch_id=1,
               autoRegister="true")
    assert len(read_topic(kafka_bootstrap, topic)) == 5


def test_use_latest_version_writes_with_the_registered_schema(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    topic = new_topic()
    registered = {"type": "record", "name": "Item", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "extra", "type": "string", "default": "-"}]}
    sid = SchemaRegistryClient({"url": registry_url}).register_schema(
        f"{topic}-value", Schema(json.dumps(registered), "AVRO"))
    df = spark.range(4).selectExpr("named_struct('id', id, 'name', 'x') as value")
    _write(df, kafka_bootstrap, topic, registry_url, tmp_path, useLatestVersion="true")
    messages = read_topic(kafka_bootstrap, topic)
    assert {int.from_bytes(m.value()[1:5], "big") for m in messages} == {sid}
    assert sorted(r["id"] for r in _deserialize(registry_url, topic, messages)) == [0, 1, 2, 3]


def test_the_python_constructor_writes_avro_once_per_batch_in_both_modes(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    """``KafkaSink(..., value_format="avro")`` as a foreachBatch writer: the batch written
    twice (a replay) is in the topic once, in both delivery modes, and reads back with
    confluent-kafka's deserializer."""
    from connectors.kafka.sink import KafkaSink

    for transactional in (False, True):
        topic = new_topic(partitions=2)
        sink = KafkaSink(f"py-{uuid.uuid4().hex[:8]}", str(tmp_path / f"wal-{topic}"),
                         bootstrap_servers=kafka_bootstrap, topic=topic,
                         transactional=transactional, value_format="avro",
                         auto_register=True, schema_registry={"url": registry_url})
        df = _df(spark, 40)
        sink.write(df, 0)
        sink.write(df, 0)  # a replay of batch 0: nothing again
        messages = read_topic(kafka_bootstrap, topic)
        assert len(messages) == 40, transactional
        assert sorted(r["id"] for r in _deserialize(registry_url, topic, messages)) == list(
            range(40))


def test_json_schema_records_read_back_with_confluents_deserializer_and_our_source(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    """``valueFormat=json-schema``: the schema of the column's Spark type registered as a
    JSON Schema; confluent-kafka's ``JSONDeserializer`` (which validates each record against
    the writer schema it fetches by id) and our source read the rows back."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = new_topic(partitions=2)
    df = spark.range(0, 60, numPartitions=2).selectExpr(
        "named_struct('id', id, 'name', concat('n', cast(id as string)), "
        "'price', cast(id as double) / 4, 'day', date_add(date'2024-01-01', cast(id as int)), "
        "'tags', array(cast(id % 3 as string)), 'note', if(id % 3 = 0, null, 'x')) as value")
    _write(df, kafka_bootstrap, topic, registry_url, tmp_path, autoRegister="true",
           valueFormat="json-schema")
    messages = read_topic(kafka_bootstrap, topic)
    assert len(messages) == 60
    de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient(
        {"url": registry_url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    decoded = sorted((de(m.value(), ctx) for m in messages), key=lambda r: r["id"])
    assert [(r["id"], r["name"], r["price"], r["day"], r["tags"], r.get("note"))
            for r in decoded[:4]] == [
        (0, "n0", 0.0, "2024-01-01", ["0"], None), (1, "n1", 0.25, "2024-01-02", ["1"], "x"),
        (2, "n2", 0.5, "2024-01-03", ["2"], "x"), (3, "n3", 0.75, "2024-01-04", ["0"], None)]
    back = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", topic).option("valueFormat", "json-schema")
            .option("schemaRegistry.url", registry_url).load())
    assert Counter(repr(r) for r in back.select("value.*").collect()) == Counter(
        repr(r) for r in df.select("value.*").collect())


def test_bad_sink_format_options_name_the_option(spark: Any, kafka_bootstrap: str,
                                                  new_topic: Any, registry_url: str,
                                                  tmp_path: Any) -> None:
    topic = new_topic()
    df = _df(spark, 2)
    with pytest.raises(Exception, match="autoRegister.*cannot be used together"):
        _write(df, kafka_bootstrap, topic, registry_url, tmp_path, autoRegister="true",
               useLatestVersion="true")
    with pytest.raises(Exception, match="subjectNameStrategy"):
        _write(df, kafka_bootstrap, topic, registry_url, tmp_path, subjectNameStrategy="nope")


def test_what_the_sink_writes_reads_back_with_sparks_own_from_avro(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str, tmp_path: Any,
        jvm_spark: Any) -> None:
    """Spark's JVM Kafka source + ``substring`` + ``from_avro`` (the schema from the
    registry): a client we did not write reads every row as the DataFrame had it."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from tests.services.spark_jvm import run_job, with_avro

    topic = new_topic(partitions=2)
    df = _df(spark, 50).selectExpr("named_struct('id', value.id, 'name', value.name, "
                                   "'price', value.price, 'note', value.note, "
                                   "'day', value.day) as value")
    _write(df, kafka_bootstrap, topic, registry_url, tmp_path, autoRegister="true")
    latest = SchemaRegistryClient({"url": registry_url}).get_latest_version(f"{topic}-value")
    result = run_job(with_avro(jvm_spark), {"action": "read_avro", "bootstrap": kafka_bootstrap,
                                            "topic": topic, "schema": latest.schema.schema_str})
    got = sorted((json.loads(j)["id"], json.loads(j)) for j, _ in result["rows"])
    assert {h for _, h in result["rows"]} == {f"00{latest.schema_id:08X}"}
    want = sorted((r["id"], {k: v for k, v in r.asDict().items() if v is not None})
                  for r in df.selectExpr("value.id", "value.name", "value.price", "value.note",
                                         "cast(value.day as string) as day").collect())
    assert got == want
