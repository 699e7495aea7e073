"""Protobuf in the Confluent wire format against a real broker, a real registry and real
Spark. The source reads records written by confluent-kafka's ``ProtobufSerializer`` (a
message class made at test time by protoc from ``grpcio-tools``, not by our code); what the
sink writes is read back by confluent-kafka's ``ProtobufDeserializer`` and by our source."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import pytest

from connectors.demo.services.kafka import produce_records
from tests.helpers import read_topic

pytestmark = pytest.mark.integration
pytest.importorskip("grpc_tools")

UTC = dt.timezone.utc
TRADE_PROTO = """
syntax = "proto3";
package eo.test.v{version};
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Trade {{
  int64 id = 1;
  int32 qty = 2;
  string symbol = 3;
  double price = 4;
  bool active = 5;
  optional string note = 6;
  google.protobuf.Timestamp ts = 7;
  enum Side {{ BUY = 0; SELL = 1; }}
  Side side = 8;
  repeated string tags = 9;
  map<string, int64> attrs = 10;
  message Leg {{ uint64 size = 1; bytes raw = 2; }}
  Leg leg = 11;
  google.protobuf.StringValue venue = 12;
  {extra}
}}
"""


def _classes(tmp_path: Any, version: int, extra: str = "") -> Any:
    """The Trade class of a .proto compiled by protoc into a Python module (grpc_tools)."""
    out = tmp_path / f"gen{version}"
    out.mkdir()
    (out / f"trade_v{version}.proto").write_text(
        TRADE_PROTO.format(version=version, extra=extra), encoding="utf-8")
    import importlib.resources

    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"-I{well_known}",
                    f"--python_out={out}", f"trade_v{version}.proto"], check=True)  # noqa: S603
    sys.path.insert(0, str(out))
    try:
        module = __import__(f"trade_v{version}_pb2")
    finally:
        sys.path.remove(str(out))
    return module.Trade


def _trade(cls: Any, i: int, **extra: Any) -> Any:
    msg = cls(id=i, qty=i % 1000, symbol=f"S{i % 7}", price=i * 0.25, active=i % 2 == 0,
              side=i % 2, tags=[f"t{j}" for j in range(i % 3)],
              attrs={"a": i} if i % 4 else {},
              leg={"size": 2**64 - 1 - i, "raw": b"\x00" * (i % 3)},
              **extra)
    if i % 3 == 0:
        msg.note = f"n{i}"
    if i % 5:
        msg.venue.value = "XNAS"
    msg.ts.FromDatetime(dt.datetime(2024, 1, 1) + dt.timedelta(milliseconds=i * 1001))
    return msg


def _serialize(registry_url: str, topic: str, msgs: list[Any]) -> list[bytes]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser = ProtobufSerializer(type(msgs[0]), SchemaRegistryClient({"url": registry_url}),
                             {"auto.register.schemas": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [ser(m, ctx) for m in msgs]


def _reader(spark: Any, bootstrap: str, topic: str, registry_url: str,
            stream: bool = False) -> Any:
    r = spark.readStream if stream else spark.read
    r = (r.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("valueFormat", "protobuf")
         .option("schemaRegistry.url", registry_url))
    return (r.option("startingOffsets", "earliest") if stream else r).load()


def _expected(i: int) -> dict[str, Any]:
    return {"id": i, "qty": i % 1000, "symbol": f"S{i % 7}", "price": i * 0.25,
            "active": i % 2 == 0, "note": f"n{i}" if i % 3 == 0 else None,
            "ts": dt.datetime(2024, 1, 1) + dt.timedelta(milliseconds=i * 1001),
            "side": "SELL" if i % 2 else "BUY", "tags": [f"t{j}" for j in range(i % 3)],
            "attrs": {"a": i} if i % 4 else {},
            "leg": {"size": 2**64 - 1 - i, "raw": bytearray(b"\x00" * (i % 3))},
            "venue": "XNAS" if i % 5 else None}


def test_confluents_protobuf_records_read_exactly_batch_and_stream_with_evolution(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    """v1 records (the reader schema), then v2 records of a compatible schema with a field
    added, read by a batch and a streaming query: every record once, exactly."""
    if spark.conf.get("spark.sql.session.timeZone") not in ("UTC", "Etc/UTC", "GMT"):
        pytest.skip("the expected timestamps are UTC wall clock")
    topic = new_topic(partitions=2)
    v1 = _classes(tmp_path, 1)
    values = _serialize(registry_url, topic, [_trade(v1, i) for i in range(200)])
    assert values[0][5] == 0  # the first message: the single index byte 0
    produce_records(kafka_bootstrap, topic, [(None, v, i % 2) for i, v in enumerate(values)])

    df = _reader(spark, kafka_bootstrap, topic, registry_url)
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,qty:int,symbol:string,price:double,active:boolean,note:string,"
        "ts:timestamp,side:string,tags:array<string>,attrs:map<string,bigint>,"
        "leg:struct<size:decimal(20,0),raw:binary>,venue:string>")
    # v2 (a field added) is written after the query's schema is fixed
    v2 = _classes(tmp_path, 2, "string added = 13;")
    later = _serialize(registry_url, topic, [_trade(v2, i, added="z") for i in range(200, 220)])
    produce_records(kafka_bootstrap, topic, [(None, v, 0) for v in later])
    rows = [r.asDict(recursive=True) for r in df.select("value.*").collect()]
    got = {r["id"]: r for r in rows}
    assert len(rows) == 220 and sorted(got) == list(range(220))
    for i in range(220):
        row = got[i]
        row["leg"]["size"] = int(row["leg"]["size"])
        assert row == _expected(i), i

    name = f"pb_{uuid.uuid4().hex[:8]}"
    q = (_reader(spark, kafka_bootstrap, topic, registry_url, stream=True)
         .select("value.id", "value.venue").writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "chk")).start())
    try:
        q.processAllAvailable()
        streamed = sorted((r[0], r[1]) for r in spark.table(name).collect())
    finally:
        q.stop()
    assert streamed == [(i, "XNAS" if i % 5 else None) for i in range(220)]


def test_sink_protobuf_reads_back_with_confluents_deserializer_in_both_modes(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    """The proto3 of the column's Spark type registered (autoRegister) and written in both
    delivery modes (a replayed batch once); confluent-kafka's ``ProtobufDeserializer``, with
    a class built from the registered descriptor, and our source read the rows back."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    from connectors.kafka.sink import KafkaSink

    df = spark.range(0, 40, numPartitions=2).selectExpr(
        "named_struct('id', id, 'name', if(id % 3 = 0, null, concat('n', cast(id as string))), "
        "'price', cast(id as double) / 4, 'ts', timestamp_seconds(1700000000 + id), "
        "'tags', array(cast(id % 3 as string)), 'attrs', map('a', cast(id as int)), "
        "'inner', named_struct('x', id * 2, 'ok', id % 2 = 0)) as value")
    want = Counter(repr(r) for r in df.select("value.*").collect())
    for transactional in (False, True):
        topic = new_topic(partitions=2)
        sink = KafkaSink(f"pb-{uuid.uuid4().hex[:8]}", str(tmp_path / f"wal-{topic}"),
                         bootstrap_servers=kafka_bootstrap, topic=topic,
                         transactional=transactional, value_format="protobuf",
                         auto_register=True, avro_record_namespace="eo.sink",
                         schema_registry={"url": registry_url})
        sink.write(df, 0)
        sink.write(df, 0)  # a replay of batch 0: nothing again
        messages = read_topic(kafka_bootstrap, topic)
        assert len(messages) == 40, transactional
        # the registered schema, as confluent-kafka's client fetches it, makes the class
        client = SchemaRegistryClient({"url": registry_url})
        registered = client.get_latest_version(f"{topic}-value").schema
        assert registered.schema_type == "PROTOBUF"
        import base64

        fdp = descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(registered.schema_str))
        pool = descriptor_pool.DescriptorPool()
        ts_file = descriptor_pb2.FileDescriptorProto()
        timestamp_pb2.DESCRIPTOR.CopyToProto(ts_file)
        pool.Add(ts_file)
        pool.Add(fdp)
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(
            "eo.sink.topLevelRecord"))
        de = ProtobufDeserializer(cls, {"use.deprecated.format": False})
        ctx = SerializationContext(topic, MessageField.VALUE)
        decoded = sorted((de(m.value(), ctx) for m in messages), key=lambda m: m.id)
        assert [m.id for m in decoded] == list(range(40))
        m3, m4 = decoded[3], decoded[4]
        assert not m3.HasField("name") and m4.name == "n4" and m4.price == 1.0
        assert m4.ts.seconds == 1700000004 and list(m4.tags) == ["1"]
        assert dict(m4.attrs) == {"a": 4} and m4.inner.x == 8 and m4.inner.ok
        back = _reader(spark, kafka_bootstrap, topic, registry_url)
        assert Counter(repr(r) for r in back.select("value.*").collect()) == want


def test_spark_writer_with_use_latest_version_writes_confluents_registered_message(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_url: str,
        tmp_path: Any) -> None:
    """The subject's latest schema is the one confluent-kafka's ``ProtobufSerializer``
    registered; Spark's ``df.write.format("eo_kafka")`` with ``valueFormat=protobuf`` and
    ``useLatestVersion=true`` writes a subset of its fields (the rest take their defaults),
    read back by the serializer's own class and by our source; a column the message lacks
    is refused before anything is written."""
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = new_topic()
    v1 = _classes(tmp_path, 1)
    _serialize(registry_url, topic, [_trade(v1, 0)])  # registers the subject's schema only
    df = spark.range(0, 30, numPartitions=2).selectExpr(
        "named_struct('id', id, 'symbol', concat('S', cast(id as string)), "
        "'note', if(id % 2 = 0, null, 'x'), 'ts', timestamp_seconds(1700000000 + id)) as value")

    def write(frame: Any) -> None:
        (frame.write.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
         .option("topic", topic).option("sink_id", f"s{uuid.uuid4().hex[:8]}")
         .option("walPath", str(tmp_path / f"wal-{uuid.uuid4().hex[:6]}"))
         .option("batchId", 0).option("valueFormat", "protobuf")
         .option("useLatestVersion", "true").option("schemaRegistry.url", registry_url)
         .mode("append").save())

    from connectors.core.errors import ConnectorError

    with pytest.raises(Exception, match=r"value\.nope has no field in the Protobuf message"
                       ) as refused:
        write(df.selectExpr("named_struct('id', 1L, 'nope', 2) as value"))
    assert isinstance(refused.value, ConnectorError) or "KafkaSinkError" in str(refused.value)
    assert read_topic(kafka_bootstrap, topic) == []
    write(df)
    messages = read_topic(kafka_bootstrap, topic)
    de = ProtobufDeserializer(v1, {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    got = sorted((de(m.value(), ctx) for m in messages), key=lambda m: m.id)
    assert [(m.id, m.symbol, m.note if m.HasField("note") else None, m.ts.seconds, m.qty)
            for m in got] == [(i, f"S{i}", None if i % 2 == 0 else "x", 1700000000 + i, 0)
                              for i in range(30)]
    back = _reader(spark, kafka_bootstrap, topic, registry_url).select(
        "value.id", "value.note", "value.qty", "value.side").collect()
    assert sorted(tuple(r) for r in back) == [
        (i, None if i % 2 == 0 else "x", 0, "BUY") for i in range(30)]
