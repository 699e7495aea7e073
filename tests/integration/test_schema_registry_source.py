"""The eo_kafka source reading Avro in the Confluent wire format, against a real broker, a
real registry (tests/services/registry.py) and real Spark. The records are written by a
client we did not write: confluent-kafka's own ``AvroSerializer``."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pytest

from connectors.core.errors import ConnectorError
from connectors.demo.services.kafka import produce_records

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc

TRADE_V1 = {
    "type": "record", "name": "Trade", "namespace": "eo.test", "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "symbol", "type": "string"},
        {"name": "price", "type": "double"},
        {"name": "active", "type": "boolean"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 12, "scale": 2}},
        {"name": "side", "type": {"type": "enum", "name": "Side", "symbols": ["BUY", "SELL"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    ]}
#: v2 adds a field with a default and drops the optional ``note``: BACKWARD compatible.
TRADE_V2 = {**TRADE_V1, "fields": [
    *[f for f in TRADE_V1["fields"] if f["name"] != "note"],
    {"name": "venue", "type": "string", "default": "XNAS"}]}


def _trade(i: int) -> dict[str, Any]:
    return {
        "id": i, "qty": i % 1000, "symbol": f"S{i % 7}", "price": i * 0.25,
        "active": i % 2 == 0, "note": None if i % 3 else f"n{i}",
        "ts": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=i * 1001),
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=i % 30),
        "amount": decimal.Decimal(i) / 4 if i % 2 else decimal.Decimal("-12.50"),
        "side": "BUY" if i % 2 else "SELL", "tags": [f"t{j}" for j in range(i % 3)],
        "attrs": {"a": i, "b": -i} if i % 4 else {},
        "ref": str(uuid.UUID(int=i)),
    }


def _serializer(registry_url: str, schema: dict[str, Any]) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(schema),
                          conf={"auto.register.schemas": True})


def _serialize(ser: Any, topic: str, records: list[dict[str, Any]]) -> list[bytes]:
    from confluent_kafka.serialization import MessageField, SerializationContext

    ctx = SerializationContext(topic, MessageField.VALUE)
    return [ser(r, ctx) for r in records]


def _read(spark: Any, bootstrap: str, topic: str, registry_url: str, **options: str) -> Any:
    reader = (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("valueFormat", "avro")
              .option("schemaRegistry.url", registry_url))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _expected(rec: dict[str, Any]) -> dict[str, Any]:
    out = dict(rec)
    out["ts"] = rec["ts"].replace(tzinfo=None)  # Spark's session time zone is UTC here
    out["attrs"] = dict(rec["attrs"])
    return out


def test_avro_written_by_confluents_serializer_reads_as_typed_columns(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str) -> None:
    topic = new_topic(partitions=2)
    records = [_trade(i) for i in range(400)]
    values = _serialize(_serializer(registry_url, TRADE_V1), topic, records)
    produce_records(kafka_bootstrap, topic, [(None, v, i % 2) for i, v in enumerate(values)])

    df = _read(spark, kafka_bootstrap, topic, registry_url)
    value_type = df.schema["value"].dataType.simpleString()
    assert value_type == (
        "struct<id:bigint,qty:int,symbol:string,price:double,active:boolean,note:string,"
        "ts:timestamp,day:date,amount:decimal(12,2),side:string,tags:array<string>,"
        "attrs:map<string,bigint>,ref:string>")
    rows = df.select("value.*", "partition", "offset").collect()
    got = {r["id"]: {**r.asDict(recursive=True)} for r in rows}
    assert len(rows) == 400 and sorted(got) == list(range(400))
    spark_tz = spark.conf.get("spark.sql.session.timeZone")
    for rec in records:
        row = got[rec["id"]]
        want = _expected(rec)
        if spark_tz not in ("UTC", "Etc/UTC", "GMT"):
            want["ts"] = row["ts"]  # shown in the session zone; the instant is checked below
        assert {k: row[k] for k in want} == want, rec["id"]
    assert df.selectExpr("max(unix_millis(value.ts))").first()[0] == int(
        records[-1]["ts"].timestamp() * 1000)


def test_a_union_of_several_types_reads_as_sparks_member_struct(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        jvm_spark: Any) -> None:
    """``["null", "string", "long", record]`` written by confluent-kafka's serializer reads
    as ``struct<member0, member1, member2>``, as Spark's own ``from_avro`` reads it (JVM,
    same topic, the header cut off)."""
    from tests.services.spark_jvm import run_job, with_avro

    point = {"type": "record", "name": "Pt", "fields": [{"name": "x", "type": "int"}]}
    schema = {"type": "record", "name": "U", "namespace": "t", "fields": [
        {"name": "id", "type": "long"},
        {"name": "u", "type": ["null", "string", "long", point]}]}
    topic = new_topic(partitions=1)
    records = [{"id": i, "u": [None, f"s{i}", i * 10, {"x": i}][i % 4]} for i in range(40)]
    values = _serialize(_serializer(registry_url, schema), topic, records)
    produce_records(kafka_bootstrap, topic, [(None, v, 0) for v in values])
    df = _read(spark, kafka_bootstrap, topic, registry_url)
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,u:struct<member0:string,member1:bigint,member2:struct<x:int>>>")
    ours = sorted((r["id"], None if r["u"] is None else tuple(
        r["u"].asDict(recursive=True).values())) for r in df.select("value.*").collect())
    assert ours[:4] == [(0, None), (1, ("s1", None, None)), (2, (None, 20, None)),
                        (3, (None, None, {"x": 3}))]
    result = run_job(with_avro(jvm_spark), {"action": "read_avro", "bootstrap": kafka_bootstrap,
                                            "topic": topic, "schema": json.dumps(schema)})
    # to_json leaves null fields out: compare the set members only
    theirs = sorted((d["id"], None if d.get("u") is None else d["u"]) for d in (
        json.loads(j) for j, _ in result["rows"]))
    mine = sorted((i, None if u is None else {k: v for k, v in zip(
        ("member0", "member1", "member2"), u, strict=True) if v is not None}) for i, u in ours)
    assert theirs == mine


def test_records_of_an_older_and_a_newer_schema_resolve_to_the_reader_schema(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str) -> None:
    """v1 and v2 records in one topic: pinned to v1 or reading latest (v2), each record is
    resolved to the reader schema (defaults filled in, removed fields gone)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    topic = new_topic()
    old = _serialize(_serializer(registry_url, TRADE_V1), topic, [_trade(i) for i in range(5)])
    SchemaRegistryClient({"url": registry_url}).set_compatibility(f"{topic}-value", "BACKWARD")
    v2_records = [{k: v for k, v in _trade(i).items() if k != "note"} | {"venue": "XLON"}
                  for i in range(5, 10)]
    new = _serialize(_serializer(registry_url, TRADE_V2), topic, v2_records)
    produce_records(kafka_bootstrap, topic, [(None, v, 0) for v in old + new])

    latest = _read(spark, kafka_bootstrap, topic, registry_url)
    assert "venue" in latest.schema["value"].dataType.names
    assert "note" not in latest.schema["value"].dataType.names
    venues = [(r[0], r[1]) for r in latest.select("value.id", "value.venue").collect()]
    assert sorted(venues) == [(i, "XNAS") for i in range(5)] + [(i, "XLON") for i in range(5, 10)]

    pinned = _read(spark, kafka_bootstrap, topic, registry_url, valueSchemaVersion="1")
    notes = sorted((r[0], r[1]) for r in pinned.select("value.id", "value.note").collect())
    assert notes == [(i, _trade(i)["note"]) for i in range(5)] + [(i, None) for i in range(5, 10)]


def test_a_poison_record_fails_the_read_naming_topic_partition_offset_and_schema_id(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str) -> None:
    topic = new_topic()
    good = _serialize(_serializer(registry_url, TRADE_V1), topic, [_trade(i) for i in range(6)])
    schema_id = int.from_bytes(good[0][1:5], "big")
    poison = good[3][:5] + b"\xff\xff\xff"  # a valid header, then bytes that are no Trade
    produce_records(kafka_bootstrap, topic,
                    [(None, v, 0) for v in good[:3] + [poison] + good[3:]])
    with pytest.raises(Exception) as e:
        _read(spark, kafka_bootstrap, topic, registry_url).collect()
    text = str(e.value)
    assert f"topic {topic} partition 0 offset 3" in text, text[-2000:]
    assert f"schema id {schema_id}" in text


def test_bad_registry_options_fail_at_load_naming_the_option(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str) -> None:
    topic = new_topic()
    with pytest.raises(Exception, match="no subject"):
        _read(spark, kafka_bootstrap, topic, registry_url)  # nothing registered for it yet
    with pytest.raises(Exception, match="schemaRegistry.url"):
        (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
         .option("subscribe", topic).option("valueFormat", "avro").load())
    with pytest.raises(Exception, match="schemaRegistry.bogus"):
        _read(spark, kafka_bootstrap, topic, registry_url, **{"schemaRegistry.bogus": "1"})
    assert issubclass(ConnectorError, Exception)


def test_a_running_stream_keeps_its_reader_schema_while_the_subject_evolves(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    """The query is typed with v1 (latest at start). v2 (a field added with a default, the
    optional ``note`` removed) is registered and written while it runs: its records are
    resolved to v1, none is lost, and an incompatible v3 is refused by the registry."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    topic = new_topic()
    subject = f"{topic}-value"
    v1 = _serializer(registry_url, TRADE_V1)
    produce_records(kafka_bootstrap, topic,
                    [(None, v, 0) for v in _serialize(v1, topic, [_trade(i) for i in range(5)])])
    client = SchemaRegistryClient({"url": registry_url})
    client.set_compatibility(subject, "BACKWARD")
    df = (spark.readStream.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest")
          .option("valueFormat", "avro").option("schemaRegistry.url", registry_url).load())
    name = f"m_{uuid.uuid4().hex[:8]}"
    q = (df.select("value.id", "value.note").writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "chk")).start())
    try:
        q.processAllAvailable()
        v2_records = [{k: v for k, v in _trade(i).items() if k != "note"} | {"venue": "XLON"}
                      for i in range(5, 9)]
        produce_records(kafka_bootstrap, topic, [
            (None, v, 0) for v in _serialize(_serializer(registry_url, TRADE_V2), topic,
                                             v2_records)])
        assert client.get_latest_version(subject).version == 2
        q.processAllAvailable()
        rows = sorted((r[0], r[1]) for r in spark.table(name).collect())
        assert rows == [(i, _trade(i)["note"]) for i in range(5)] + [(i, None) for i in range(5, 9)]
    finally:
        q.stop()
    bad = {**TRADE_V1, "fields": [{"name": "id", "type": "string"}]}
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(bad), "AVRO"))
    assert refused.value.http_status_code == 409


def test_an_unreachable_registry_fails_the_load_in_time_naming_the_url_not_the_password(
        spark: Any, kafka_bootstrap: str, new_topic: Any) -> None:
    import socket
    import time

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    topic = new_topic()
    began = time.monotonic()
    with pytest.raises(Exception) as e:
        (spark.read.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
         .option("subscribe", topic).option("valueFormat", "avro")
         .option("schemaRegistry.url", f"http://eo:s3cr3t-pw@127.0.0.1:{port}")
         .option("schemaRegistry.timeout", "5").load())
    assert time.monotonic() - began < 30
    text = str(e.value)
    assert "unreachable" in text and f"127.0.0.1:{port}" in text
    assert "s3cr3t-pw" not in text


def test_dlq_keeps_the_poison_record_with_its_error_and_bytes(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str) -> None:
    topic = new_topic()
    good = _serialize(_serializer(registry_url, TRADE_V1), topic, [_trade(i) for i in range(4)])
    poison = good[2][:5] + b"\xff\xff\xff"
    produce_records(kafka_bootstrap, topic,
                    [(None, v, 0) for v in good[:2] + [poison] + good[2:]])
    df = _read(spark, kafka_bootstrap, topic, registry_url, onDecodeError="dlq")
    rows = df.select("offset", "value.id", "decodeError", "rawValue").orderBy("offset").collect()
    assert [(r[0], r[1]) for r in rows] == [(0, 0), (1, 1), (2, None), (3, 2), (4, 3)]
    assert [r[0] for r in rows if r[2] is not None] == [2]
    assert f"topic {topic} partition 0 offset 2" in rows[2][2]
    assert bytes(rows[2][3]) == poison and rows[0][3] is None


ORDER_JSON = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {"id": {"type": "integer"}, "item": {"type": "string"},
                   "price": {"type": "number"}, "tags": {"type": "array",
                                                          "items": {"type": "string"}}},
    "required": ["id"]}


def test_json_schema_written_by_confluents_serializer_reads_as_typed_columns(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = new_topic()
    ser = JSONSerializer(json.dumps(ORDER_JSON), SchemaRegistryClient({"url": registry_url}),
                         conf={"auto.register.schemas": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    records = [{"id": i, "item": f"i{i}", "price": i / 2, "tags": ["x"] * (i % 3)}
               for i in range(50)]
    produce_records(kafka_bootstrap, topic, [(None, ser(r, ctx), 0) for r in records])
    df = _read(spark, kafka_bootstrap, topic, registry_url, valueFormat="json-schema")
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,item:string,price:double,tags:array<string>>")
    got = sorted((r.asDict(recursive=True) for r in df.select("value.*").collect()),
                 key=lambda r: r["id"])
    assert got == records
    with pytest.raises(Exception, match="holds a JSON schema, but valueFormat is avro"):
        _read(spark, kafka_bootstrap, topic, registry_url, valueFormat="avro")
