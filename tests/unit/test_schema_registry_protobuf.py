"""Protobuf in the Confluent wire format, without a registry or a broker: the framing (message
indexes), the Spark types of messages (from .proto text compiled by protoc), the sink's
proto3 of a Spark type, round trips through upb, refusals, and a micro benchmark."""

from __future__ import annotations

import datetime as dt
import io
import time
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, message_factory

from connectors.core.errors import KafkaSinkError
from connectors.kafka.registry import protobuf as pb
from connectors.kafka.registry import protobuf_schema as ps
from connectors.kafka.registry.framing import DecodeError, SchemaNotRepresentable

pytest.importorskip("grpc_tools")

ALL_TYPES = """
syntax = "proto3";
package t.v1;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Rec {
  int32 i32 = 1; sint32 s32 = 2; sfixed32 f32 = 3;
  int64 i64 = 4; sint64 s64 = 5; sfixed64 f64 = 6;
  uint32 u32 = 7; fixed32 x32 = 8; uint64 u64 = 9; fixed64 x64 = 10;
  float fl = 11; double db = 12; bool b = 13; string s = 14; bytes by = 15;
  enum Color { RED = 0; GREEN = 1; }
  Color color = 16;
  message Inner { int64 x = 1; repeated string tags = 2; }
  Inner inner = 17;
  repeated Inner inners = 18;
  map<string, int32> counts = 19;
  map<int64, Inner> by_id = 20;
  google.protobuf.Timestamp ts = 21;
  google.protobuf.StringValue maybe = 22;
  google.protobuf.Int64Value maybe_n = 23;
  oneof choice { string name = 24; int32 number = 25; }
  optional int32 opt = 26;
}
message Other { string z = 1; message Deep { int32 d = 1; } }
"""


def _compiled(text: str = ALL_TYPES) -> Any:
    return ps.build_pool(ps.file_proto(text))


def _class(file: Any, path: list[int]) -> Any:
    return message_factory.GetMessageClass(ps.message_at(file, path))


def _framed(schema_id: int, path: list[int], msg: Any) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + pb.encode_indexes(path) \
        + msg.SerializeToString()


def _where(i: int) -> str:
    return f"topic t partition 0 offset {i}"


# -- framing --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [[0], [1], [0, 0], [1, 0], [3, 2, 1], [200, 70000]])
def test_message_indexes_round_trip_and_match_confluent_kafka(path: list[int]) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    raw = pb.encode_indexes(path)
    theirs = io.BytesIO()
    if path == [0]:
        theirs.write(b"\x00")  # confluent-kafka's shortcut for the first message
    else:
        ProtobufSerializer._encode_varints(theirs, path)
    assert raw == theirs.getvalue()
    data = b"\x00\x00\x00\x00\x01" + raw + b"payload"
    got, start = pb.decode_indexes(data)
    assert got == path and data[start:] == b"payload"


def test_message_index_paths_name_nested_messages() -> None:
    file = _compiled()
    assert ps.message_at(file, [0]).full_name == "t.v1.Rec"
    assert ps.message_at(file, [0, 0]).full_name == "t.v1.Rec.Inner"
    assert ps.message_at(file, [1, 0]).full_name == "t.v1.Other.Deep"
    for path in ([0], [0, 0], [1], [1, 0]):
        assert ps.index_path(ps.message_at(file, path)) == path
    with pytest.raises(IndexError, match="names no message"):
        ps.message_at(file, [2])


def test_truncated_indexes_are_an_error() -> None:
    with pytest.raises(ValueError, match="varint"):
        pb.decode_indexes(b"\x00\x00\x00\x00\x01\x04\x80")


# -- types ----------------------------------------------------------------------------------
def test_spark_types_of_protobuf_types() -> None:
    t = ps.arrow_type(ps.message_at(_compiled(), [0]))
    want = {"i32": pa.int32(), "s32": pa.int32(), "f32": pa.int32(), "i64": pa.int64(),
            "s64": pa.int64(), "f64": pa.int64(), "u32": pa.int64(), "x32": pa.int64(),
            "u64": pa.decimal128(20, 0), "x64": pa.decimal128(20, 0), "fl": pa.float32(),
            "db": pa.float64(), "b": pa.bool_(), "s": pa.string(), "by": pa.binary(),
            "color": pa.string(),
            "inner": pa.struct([("x", pa.int64()), ("tags", pa.list_(pa.string()))]),
            "counts": pa.map_(pa.string(), pa.int32()),
            "ts": pa.timestamp("us", tz="UTC"), "maybe": pa.string(), "maybe_n": pa.int64(),
            "name": pa.string(), "number": pa.int32(), "opt": pa.int32()}
    for name, typ in want.items():
        assert t.field(name).type == typ, name
    assert t.field("inners").type == pa.list_(want["inner"])
    assert t.field("by_id").type == pa.map_(pa.int64(), want["inner"])


def test_recursive_messages_are_refused_naming_the_message() -> None:
    file = _compiled('syntax = "proto3"; package r; message Node { int32 v = 1; '
                     'repeated Node kids = 2; }')
    with pytest.raises(SchemaNotRepresentable, match=r"r\.Node.*recursi"):
        ps.arrow_type(ps.message_at(file, [0]))


def test_a_proto_that_does_not_compile_names_protocs_complaint() -> None:
    with pytest.raises(SchemaNotRepresentable, match="protoc cannot compile"):
        ps.file_proto('syntax = "proto3"; message M { nosuchtype x = 1; }')


def test_a_base64_file_descriptor_as_confluent_kafka_registers_it_is_read() -> None:
    from confluent_kafka.schema_registry.protobuf import _schema_to_str

    file = _compiled()
    text = _schema_to_str(file)
    assert ps.message_at(ps.build_pool(ps.file_proto(text)), [0]).full_name == "t.v1.Rec"


# -- decoding -------------------------------------------------------------------------------
def _decoder(text: str = ALL_TYPES, schema_id: int = 1, writers: dict[int, Any] | None = None
             ) -> pb.ProtobufDecoder:
    files = ps.file_proto(text)
    return pb.ProtobufDecoder("value", pb.pack(files), schema_id,
                              lambda i: (writers or {}).get(i))


def test_every_type_decodes_with_proto3_defaults_and_presence() -> None:
    file = _compiled()
    rec = _class(file, [0])
    full = rec(i32=-5, s32=-6, f32=7, i64=-(2**40), s64=3, f64=4, u32=2**32 - 1, x32=9,
               u64=2**64 - 1, x64=10, fl=1.5, db=2.25, b=True, s="é", by=b"\x00\x01",
               color=1, inner={"x": 1, "tags": ["a"]}, inners=[{"x": 2}, {"x": 3}],
               counts={"k": 1}, by_id={5: {"x": 6}}, maybe={"value": "m"},
               maybe_n={"value": 0}, number=4, opt=0)
    full.ts.FromDatetime(dt.datetime(2024, 5, 6, 7, 8, 9, 123456))
    empty = rec()
    values = pa.array([_framed(1, [0], full), None, _framed(1, [0], empty)], pa.binary())
    got = _decoder().decode(values, _where).to_pylist()
    a, b, c = got
    assert b is None
    assert a["i32"] == -5 and a["u32"] == 2**32 - 1 and int(a["u64"]) == 2**64 - 1
    assert a["color"] == "GREEN" and a["s"] == "é" and a["by"] == b"\x00\x01"
    assert a["inner"] == {"x": 1, "tags": ["a"]}
    assert a["inners"] == [{"x": 2, "tags": []}, {"x": 3, "tags": []}]
    assert a["counts"] == [("k", 1)] and a["by_id"] == [(5, {"x": 6, "tags": []})]
    assert a["ts"] == dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone.utc)
    assert a["maybe"] == "m" and a["maybe_n"] == 0
    assert a["name"] is None and a["number"] == 4 and a["opt"] == 0
    # proto3: an absent scalar reads as its default, a field with presence as null
    assert c["i32"] == 0 and c["s"] == "" and c["b"] is False and c["color"] == "RED"
    assert c["inner"] is None and c["ts"] is None and c["maybe"] is None
    assert c["opt"] is None and c["name"] is None and c["inners"] == [] and c["counts"] == []


def test_a_nested_message_index_decodes_the_writers_message_by_field_name() -> None:
    # the writer wrote Rec.Inner (path [0, 0]); the reader's Rec has x and tags too? no:
    # fields are matched by name, so Inner's x fills nothing of Rec but its own name
    text = 'syntax = "proto3"; message R { int64 x = 1; string y = 2; message N { int64 x = 1; } }'
    file = _compiled(text)
    inner = _class(file, [0, 0])(x=42)
    got = _decoder(text).decode(pa.array([_framed(1, [0, 0], inner)]), _where).to_pylist()
    assert got == [{"x": 42, "y": ""}]


def test_writer_schemas_evolve_by_field_name() -> None:
    old = 'syntax = "proto3"; message R { int64 id = 1; }'
    new = 'syntax = "proto3"; message R { int64 id = 1; string added = 2; }'
    writers = {2: _compiled(new)}
    rec_new = _class(writers[2], [0])(id=5, added="a")
    rec_old = _class(_compiled(old), [0])(id=4)
    # the old reader drops the added field; the new reader reads it from new records and
    # the default from old ones
    got = _decoder(old, 1, writers).decode(
        pa.array([_framed(2, [0], rec_new), _framed(1, [0], rec_old)]), _where)
    assert got.to_pylist() == [{"id": 5}, {"id": 4}]
    writers_old = {1: _compiled(old)}
    got = _decoder(new, 2, writers_old).decode(
        pa.array([_framed(2, [0], rec_new), _framed(1, [0], rec_old)]), _where)
    assert got.to_pylist() == [{"id": 5, "added": "a"}, {"id": 4, "added": ""}]


@pytest.mark.parametrize(("data", "match"), [
    (b"\x01\x00\x00\x00\x01\x00", "not in the Confluent wire format"),
    (b"\x00\x00\x00\x00\x09\x00\x08\x01", "schema id 9"),
    (b"\x00\x00\x00\x00\x01\x00\xff\xff", "schema id 1"),
    (b"\x00\x00\x00\x00\x01\x02\x0a\x08\x01", "names no message"),
])
def test_bad_records_fail_naming_topic_partition_offset_and_schema_id(data: bytes,
                                                                      match: str) -> None:
    with pytest.raises(DecodeError, match=match) as e:
        _decoder().decode(pa.array([data]), _where)
    assert "topic t partition 0 offset 0" in str(e.value)


def test_onDecodeError_dlq_keeps_the_bad_row() -> None:
    from connectors.kafka.registry.source_formats import DECODE_ERROR, _decode_keeping_errors

    dec = _decoder('syntax = "proto3"; message R { int64 id = 1; }')
    good = _framed(1, [0], _class(_compiled('syntax = "proto3"; message R { int64 id = 1; }'),
                                  [0])(id=3))
    batch = pa.RecordBatch.from_arrays(
        [pa.array([good, b"junk"]), pa.array(["t", "t"]), pa.array([0, 0]), pa.array([5, 6])],
        names=["value", "topic", "partition", "offset"])
    schema = pa.schema([pa.field("value", dec.type), pa.field("topic", pa.string()),
                        pa.field("partition", pa.int64()), pa.field("offset", pa.int64()),
                        pa.field(DECODE_ERROR, pa.string()), pa.field("rawValue", pa.binary())])

    def where(i: int) -> str:
        return f"topic t partition 0 offset {batch.column('offset')[i].as_py()}"

    out = _decode_keeping_errors(batch, list(batch.columns), {"value": dec}, where, schema)
    rows = out.to_pylist()
    assert rows[0]["value"] == {"id": 3} and rows[0][DECODE_ERROR] is None
    assert rows[1]["value"] is None and "offset 6" in rows[1][DECODE_ERROR]
    assert rows[1]["rawValue"] == b"junk"


# -- the sink's schema and encoding --------------------------------------------------------
SPARK = pa.struct([
    pa.field("id", pa.int64(), False), pa.field("small", pa.int16()),
    pa.field("name", pa.string()), pa.field("f", pa.float32()), pa.field("ok", pa.bool_()),
    pa.field("blob", pa.binary()), pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("tags", pa.list_(pa.string())), pa.field("m", pa.map_(pa.string(), pa.int64())),
    pa.field("inner", pa.struct([pa.field("x", pa.float64()), pa.field("y", pa.string())])),
    pa.field("items", pa.list_(pa.struct([pa.field("q", pa.int32())]))),
])


def test_the_sinks_proto3_of_a_spark_type_compiles_and_reads_back_as_the_same_type() -> None:
    fdp = ps.file_descriptor(SPARK, "Trade", "eo.test", "value")
    desc = pb.message_of(ps.registered_text(fdp))
    assert desc.full_name == "eo.test.Trade"
    assert desc.fields_by_name["name"].has_presence  # proto3 optional
    assert not desc.fields_by_name["id"].has_presence
    back = ps.arrow_type(desc)
    assert [f.name for f in back] == [f.name for f in SPARK]
    assert back.field("small").type == pa.int32()
    for name in ("id", "name", "f", "ok", "blob", "ts", "tags", "m", "items"):
        assert back.field(name).type == SPARK.field(name).type, name


@pytest.mark.parametrize(("t", "match"), [
    (pa.struct([("d", pa.date32())]), r"value\.d has type date32"),
    (pa.struct([("d", pa.decimal128(10, 2))]), r"value\.d .*decimal"),
    (pa.struct([("t", pa.timestamp("us"))]), r"value\.t is a timestamp without a time zone"),
    (pa.struct([("l", pa.list_(pa.list_(pa.int32())))]), r"value\.l\[\] .*wrap"),
    (pa.struct([("m", pa.map_(pa.float64(), pa.int32()))]), r"value\.m is a map with double"),
    (pa.int64(), "needs a struct value column"),
])
def test_types_protobuf_cannot_express_are_refused_naming_the_column(t: pa.DataType,
                                                                     match: str) -> None:
    with pytest.raises(KafkaSinkError, match=match):
        ps.file_descriptor(t, "R", "", "value")


def _rows(n: int) -> list[dict[str, Any]]:
    stamp = dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)
    return [{"id": i, "small": None if i % 3 else i % 100, "name": f"n{i}" if i % 2 else None,
             "f": 0.5, "ok": bool(i % 2), "blob": b"\x00b", "ts": stamp if i % 4 else None,
             "tags": ["a", "b"][: i % 3], "m": [("k", i)] if i % 2 else [],
             "inner": None if i % 5 == 0 else {"x": float(i), "y": None},
             "items": [{"q": i}]} for i in range(n)]


def test_sink_records_round_trip_through_the_source_decoder_exactly() -> None:
    fdp = ps.file_descriptor(SPARK, "Trade", "eo.test", "value")
    text = ps.registered_text(fdp)
    enc = pb.ProtobufEncoder("value", text, 12)
    rows: list[Any] = _rows(50)
    rows[7] = None
    arr = pa.array(rows, SPARK)
    framed = enc.encode(arr.slice(1))  # a slice: offsets are honoured
    assert framed[0].as_py()[:6] == b"\x00\x00\x00\x00\x0c\x00"
    dec = pb.ProtobufDecoder("value", pb.pack([fdp]), 12, lambda i: None)
    got = dec.decode(framed, _where).to_pylist()
    want = arr.slice(1).cast(dec.type).to_pylist()
    assert got == want


def test_a_null_array_element_fails_naming_the_column_and_the_schema_id() -> None:
    t = pa.struct([("tags", pa.list_(pa.string()))])
    enc = pb.ProtobufEncoder("value", ps.registered_text(ps.file_descriptor(t, "R", "", "v")), 3)
    with pytest.raises(KafkaSinkError, match=r"id 3\).*value\.tags holds a null element"):
        enc.encode(pa.array([{"tags": ["a", None]}], t))


def test_use_latest_version_refuses_a_column_the_message_does_not_have() -> None:
    desc = pb.message_of(ps.registered_text(ps.file_descriptor(
        pa.struct([("a", pa.int64())]), "R", "", "value")))
    with pytest.raises(KafkaSinkError, match=r"value\.b has no field in the Protobuf message R"):
        pb.plan(desc, pa.struct([("a", pa.int64()), ("b", pa.string())]), "value")


# -- micro benchmark (a figure for the docs, no target) ------------------------------------
def test_micro_benchmark_ten_field_message(capsys: pytest.CaptureFixture[str]) -> None:
    t = pa.struct([("id", pa.int64()), ("n", pa.int32()), ("s1", pa.string()),
                   ("s2", pa.string()), ("d", pa.float64()), ("b", pa.bool_()),
                   ("o", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                   ("f", pa.float32()), ("l", pa.int64())])
    stamp = dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)
    n = 50_000
    arr = pa.array([{"id": i, "n": i % 1000, "s1": "symbol", "s2": f"account-{i % 97}",
                     "d": i * 0.5, "b": i % 2 == 0, "o": None if i % 3 else "x", "ts": stamp,
                     "f": 1.25, "l": None if i % 5 else i} for i in range(n)], t)
    fdp = ps.file_descriptor(t, "Ten", "", "value")
    enc = pb.ProtobufEncoder("value", ps.registered_text(fdp), 1)
    began = time.perf_counter()
    framed = enc.encode(arr)
    enc_rate = n / (time.perf_counter() - began)
    dec = pb.ProtobufDecoder("value", pb.pack([fdp]), 1, lambda i: None)
    began = time.perf_counter()
    out = dec.decode(framed, _where)
    dec_rate = n / (time.perf_counter() - began)
    assert out.to_pylist()[:100] == arr.slice(0, 100).to_pylist()
    with capsys.disabled():
        print(f"\nprotobuf 10-field: decode {dec_rate:,.0f} records/s, "
              f"encode {enc_rate:,.0f} records/s")


def test_descriptor_proto_names_are_fully_qualified() -> None:
    fdp = ps.file_descriptor(SPARK, "Trade", "eo.test", "value")
    msg = fdp.message_type[0]
    inner = next(f for f in msg.field if f.name == "inner")
    assert inner.type == descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    assert inner.type_name == ".eo.test.Trade.Inner"


def test_a_writer_field_of_another_type_fails_naming_the_record() -> None:
    reader = 'syntax = "proto3"; message R { int64 id = 1; }'
    writer = 'syntax = "proto3"; message R { string id = 1; }'
    writers = {2: _compiled(writer)}
    good = _framed(1, [0], _class(_compiled(reader), [0])(id=1))
    bad = _framed(2, [0], _class(writers[2], [0])(id="x"))
    with pytest.raises(DecodeError, match=r"value\.id at topic t partition 0 offset 1"):
        _decoder(reader, 1, writers).decode(pa.array([good, bad]), _where)


def test_proto_text_with_a_registry_reference_compiles_with_its_import() -> None:
    """A schema in .proto text whose import is a registry reference: the reference is
    fetched by subject and version and given to protoc as the imported file."""
    from types import SimpleNamespace

    common = 'syntax = "proto3"; package c; message Money { int64 units = 1; }'
    main = ('syntax = "proto3"; package m; import "c/money.proto"; '
            'import "google/protobuf/timestamp.proto"; '
            'message Order { c.Money total = 1; google.protobuf.Timestamp at = 2; }')
    subjects = {("money", 1): SimpleNamespace(schema=common, references=())}

    class Registry:  # answers subject_version as the registry does
        def subject_version(self, subject: str, version: Any) -> Any:
            return subjects[(subject, version)]

    found = SimpleNamespace(schema=main, references=(
        {"name": "c/money.proto", "subject": "money", "version": 1},))
    files = ps.registered_files(Registry(), found)
    desc = ps.message_at(pb.unpack(pb.pack(files)), [0])
    assert ps.arrow_type(desc) == pa.struct([("total", pa.struct([("units", pa.int64())])),
                                             ("at", pa.timestamp("us", tz="UTC"))])
