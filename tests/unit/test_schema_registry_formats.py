"""Schema Registry formats without a network: the source's options, the Avro -> Spark type
mapping, and the Avro decoder against fastavro's own writer (random schemas and records,
round trips, resolution between writer and reader schemas, bad bytes)."""

from __future__ import annotations

import io
import json
import os
import random
import re
from typing import Any

import pyarrow as pa
import pytest

from connectors.core.declared import docs_table
from connectors.core.errors import OptionError
from connectors.kafka.registry.avro import AvroDecoder
from connectors.kafka.registry.avro_schema import arrow_type
from connectors.kafka.registry.client import RegistrySpec
from connectors.kafka.registry.framing import DecodeError, SchemaNotRepresentable
from connectors.kafka.source.format_options import FORMAT_OPTIONS
from connectors.kafka.source.options import KafkaSourceOptions

fastavro = pytest.importorskip("fastavro")

BASE = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "orders"}
URL = {"schemaRegistry.url": "http://registry:8081"}


def _opts(**extra: str) -> KafkaSourceOptions:
    return KafkaSourceOptions.from_options({**BASE, **extra})


# -- options ---------------------------------------------------------------------------------
def test_binary_is_the_default_and_needs_no_registry() -> None:
    assert _opts().formats is None


def test_avro_value_defaults_to_the_topic_name_strategy_and_latest() -> None:
    f = _opts(valueFormat="AVRO", **URL).formats
    assert f is not None and [(c.column, c.kind, c.subject, c.version) for c in f.columns] == [
        ("value", "avro", "orders-value", None)]
    assert f.registry.urls == ("http://registry:8081",)


def test_key_and_value_with_subjects_and_a_pinned_version() -> None:
    f = _opts(keyFormat="avro", valueFormat="avro", keySubject="k", valueSchemaVersion="3",
              **URL).formats
    assert f is not None
    assert [(c.column, c.subject, c.version) for c in f.columns] == [
        ("key", "k", None), ("value", "orders-value", 3)]


@pytest.mark.parametrize(("extra", "message"), [
    ({"valueFormat": "avro"}, r"schemaRegistry\.url.*is required"),
    ({"valueFormat": "json", **URL},
     r"valueFormat.*\['binary', 'avro', 'json-schema', 'protobuf'\]"),
    ({"valueFormat": "avro", "valueSchemaVersion": "0", **URL}, r"valueSchemaVersion.*'latest'"),
    ({"valueSubject": "x"}, r"valueSubject.*is set but valueFormat is binary"),
    ({**URL}, r"schemaRegistry\.url.*is set but neither keyFormat nor valueFormat"),
    ({"valueFormat": "avro", "schemaRegistry.urll": "x", **URL},
     r"schemaRegistry\.urll.*did you mean 'schemaRegistry\.url'"),
    ({"valueFormat": "avro", "schemaRegistry.url": "registry:8081"}, r"http\(s\)://host"),
    ({"valueFormat": "avro", "schemaRegistry.basic.auth.user.info": "nocolon", **URL},
     r"user:password"),
    ({"valueFormat": "avro", "schemaRegistry.timeout": "-1", **URL}, r"positive number"),
    ({"valueFormat": "avro", "schemaRegistry.ssl.certificate.location": "/c.pem", **URL},
     r"ssl\.key\.location"),
    ({"valueFromat": "avro"}, r"valueFromat.*valueFormat"),
])
def test_bad_format_options_name_the_option_and_what_is_valid(extra: dict[str, str],
                                                              message: str) -> None:
    with pytest.raises(OptionError, match=message):
        _opts(**extra)


def test_a_pattern_subscription_needs_an_explicit_subject() -> None:
    opts = {"kafka.bootstrap.servers": "h:9092", "subscribePattern": "orders-.*",
            "valueFormat": "avro", **URL}
    with pytest.raises(OptionError, match="valueSubject.*topic pattern"):
        KafkaSourceOptions.from_options(opts)
    f = KafkaSourceOptions.from_options({**opts, "valueSubject": "orders"}).formats
    assert f is not None and f.columns[0].subject == "orders"


def test_registry_credentials_never_show() -> None:
    opts = _opts(valueFormat="avro", **{"schemaRegistry.basic.auth.user.info": "u:hunter22",
                                        "schemaRegistry.ssl.key.password": "k3ypass"}, **URL)
    assert opts.formats is not None
    text = repr(opts) + str(opts.formats) + repr(opts.formats.registry)
    assert "hunter22" not in text and "k3ypass" not in text
    spec = RegistrySpec.parse("eo_kafka", {"url": "http://u:pw123@r:8081"})
    assert "pw123" not in spec.shown_urls()


def test_the_docs_table_is_generated_from_the_declaration() -> None:
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "schema-registry.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found = re.search(
        r"(<!-- options: eo_kafka source formats -->\n)(.*?)(<!-- end of options -->)", text, re.S)
    assert found, "docs/schema-registry.md has no options block"
    generated = docs_table(FORMAT_OPTIONS, common=False)
    if os.environ.get("UPDATE_DOCS") == "1" and found.group(2) != generated:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:found.start(2)] + generated + text[found.end(2):])
        return
    assert found.group(2) == generated, "rewrite the table with UPDATE_DOCS=1"


# -- types -----------------------------------------------------------------------------------
def test_spark_types_of_avro_types_and_logical_types() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "fixed", "name": "F", "size": 4}},
        {"name": "b", "type": {"type": "fixed", "name": "D", "size": 8,
                               "logicalType": "decimal", "precision": 18, "scale": 4}},
        {"name": "c", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "d", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "e", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "f", "type": ["null", "F"]},
        {"name": "g", "type": {"type": "record", "name": "Inner",
                               "fields": [{"name": "x", "type": "float"}]}},
        {"name": "h", "type": "Inner"},
    ]}
    assert arrow_type(schema) == pa.struct([
        ("a", pa.binary()), ("b", pa.decimal128(18, 4)), ("c", pa.timestamp("us", "UTC")),
        ("d", pa.timestamp("us")), ("e", pa.int32()), ("f", pa.binary()),
        ("g", pa.struct([("x", pa.float32())])), ("h", pa.struct([("x", pa.float32())]))])


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]}, "recursive"),
    ({"type": "record", "name": "U", "fields": [{"name": "u", "type": ["int", "long"]}]},
     r"value\.u is a union whose branches 'int' and 'long' decode to the same kind"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}, "1..38"),
])
def test_schemas_spark_cannot_represent_are_refused_with_the_field(schema: Any,
                                                                  message: str) -> None:
    with pytest.raises(SchemaNotRepresentable, match=message):
        arrow_type(schema, "value")


# -- decoding --------------------------------------------------------------------------------
def _frame(schema_id: int, schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


_KINDS = ["boolean", "int", "long", "float", "double", "string", "bytes"]


def _random_schema(rng: random.Random, depth: int, names: list[int]) -> Any:
    pick = rng.random()
    if depth > 2 or pick < 0.45:
        return rng.choice(_KINDS)
    if pick < 0.6:
        return ["null", _random_schema(rng, depth + 1, names)]
    if pick < 0.7:
        return {"type": "array", "items": _random_schema(rng, depth + 1, names)}
    if pick < 0.8:
        return {"type": "map", "values": _random_schema(rng, depth + 1, names)}
    if pick < 0.87:
        names.append(len(names))
        return {"type": "enum", "name": f"E{len(names)}", "symbols": ["A", "B", "C"]}
    names.append(len(names))
    return {"type": "record", "name": f"R{len(names)}", "fields": [
        {"name": f"f{i}", "type": _random_schema(rng, depth + 1, names)}
        for i in range(rng.randint(1, 4))]}


def _random_value(rng: random.Random, schema: Any) -> Any:
    if isinstance(schema, list):
        return None if rng.random() < 0.3 else _random_value(rng, schema[1])
    if isinstance(schema, dict):
        t = schema["type"]
        if t == "array":
            return [_random_value(rng, schema["items"]) for _ in range(rng.randint(0, 3))]
        if t == "map":
            return {f"k{i}": _random_value(rng, schema["values"]) for i in range(rng.randint(0, 3))}
        if t == "enum":
            return rng.choice(schema["symbols"])
        return {f["name"]: _random_value(rng, f["type"]) for f in schema["fields"]}
    return {
        "boolean": lambda: rng.random() < 0.5, "int": lambda: rng.randint(-2**31, 2**31 - 1),
        "long": lambda: rng.randint(-2**63, 2**63 - 1),
        "float": lambda: float(rng.randint(-99, 99)),
        "double": lambda: rng.uniform(-1e300, 1e300),
        "string": lambda: "".join(rng.choice("aé€𝄞z ") for _ in range(rng.randint(0, 8))),
        "bytes": lambda: bytes(rng.randrange(256) for _ in range(rng.randint(0, 8))),
    }[schema]()


@pytest.mark.parametrize("seed", range(40))
def test_random_schemas_round_trip_through_fastavro_and_the_decoder(seed: int) -> None:
    rng = random.Random(seed)
    names: list[int] = []
    schema = {"type": "record", "name": "Top", "fields": [
        {"name": f"c{i}", "type": _random_schema(rng, 0, names)}
        for i in range(rng.randint(1, 6))]}
    records = [_random_value(rng, schema) for _ in range(30)]
    values = pa.array([_frame(1, schema, r) for r in records] + [None], pa.binary())
    decoder = AvroDecoder("value", json.dumps(schema), 1, lambda i: None)
    got = decoder.decode(values, lambda i: f"offset {i}")
    assert got.type == arrow_type(schema)
    assert got.to_pylist() == pa.array(records + [None], type=arrow_type(schema)).to_pylist()


def test_unions_of_several_types_read_as_spark_reads_them() -> None:
    """A union of several non-null types is a struct of ``member0``, ``member1``... (Spark's
    ``from_avro``), the decoded branch set and the others null; records in unions by name,
    in arrays, maps and nested records too, and a writer schema resolved to the reader's."""
    inner = {"type": "record", "name": "Pt", "namespace": "geo",
             "fields": [{"name": "x", "type": "int"}]}
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "u", "type": ["null", "string", "long", inner]},
        {"name": "many", "type": {"type": "array", "items": ["int", "string"]}},
        {"name": "by", "type": {"type": "map", "values": ["geo.Pt", "boolean", "null"]}},
        {"name": "one", "type": ["null", "geo.Pt"]},
    ]}
    assert arrow_type(schema) == pa.struct([
        ("u", pa.struct([("member0", pa.string()), ("member1", pa.int64()),
                         ("member2", pa.struct([("x", pa.int32())]))])),
        ("many", pa.list_(pa.struct([("member0", pa.int32()), ("member1", pa.string())]))),
        ("by", pa.map_(pa.string(), pa.struct([("member0", pa.struct([("x", pa.int32())])),
                                               ("member1", pa.bool_())]))),
        ("one", pa.struct([("x", pa.int32())]))])
    records = [
        {"u": "s", "many": [1, "a"], "by": {"k": {"x": 1}, "n": None, "b": True},
         "one": {"x": 5}},
        {"u": 7, "many": [], "by": {}, "one": None},
        {"u": {"x": 3}, "many": ["z"], "by": {"q": False}, "one": {"x": 6}},
        {"u": None, "many": [2], "by": {}, "one": None},
    ]
    decoder = AvroDecoder("value", json.dumps(schema), 1, lambda i: None)
    got = decoder.decode(pa.array([_frame(1, schema, r) for r in records]), str).to_pylist()
    assert [r["u"] for r in got] == [
        {"member0": "s", "member1": None, "member2": None},
        {"member0": None, "member1": 7, "member2": None},
        {"member0": None, "member1": None, "member2": {"x": 3}}, None]
    assert got[0]["many"] == [{"member0": 1, "member1": None}, {"member0": None, "member1": "a"}]
    assert dict(got[0]["by"]) == {"k": {"member0": {"x": 1}, "member1": None}, "n": None,
                                  "b": {"member0": None, "member1": True}}
    assert [r["one"] for r in got] == [{"x": 5}, None, {"x": 6}, None]
    # a writer with an int where the reader has a long (promotion) resolves to member1
    writer = {"type": "record", "name": "T", "fields": [
        {"name": "u", "type": ["null", "string", "int", inner]},
        {"name": "many", "type": {"type": "array", "items": ["int", "string"]}},
        {"name": "by", "type": {"type": "map", "values": ["geo.Pt", "boolean", "null"]}},
        {"name": "one", "type": ["null", "geo.Pt"]}]}
    resolving = AvroDecoder("value", json.dumps(schema), 2, {4: json.dumps(writer)}.get)
    again = resolving.decode(pa.array([_frame(4, writer, {"u": 9, "many": [], "by": {},
                                                          "one": None})]), str).to_pylist()
    assert again[0]["u"] == {"member0": None, "member1": 9, "member2": None}


def test_writer_schemas_resolve_to_the_reader_schema() -> None:
    writer = {"type": "record", "name": "T", "fields": [
        {"name": "a", "type": "int"}, {"name": "gone", "type": "string"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}}]}
    reader = {"type": "record", "name": "T", "fields": [
        {"name": "a", "type": "double"}, {"name": "new", "type": "string", "default": "d"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y", "Z"]}}]}
    lookup = {5: json.dumps(writer)}
    decoder = AvroDecoder("value", json.dumps(reader), 6, lookup.get, "t-value")
    got = decoder.decode(pa.array([_frame(5, writer, {"a": 7, "gone": "x", "e": "Y"})]),
                         lambda i: "x")
    assert got.to_pylist() == [{"a": 7.0, "new": "d", "e": "Y"}]
    incompatible = {"type": "record", "name": "T", "fields": [{"name": "b", "type": "int"}]}
    lookup[9] = json.dumps(incompatible)
    with pytest.raises(DecodeError, match=r"schema id 9, which does not resolve"):
        decoder.decode(pa.array([_frame(9, incompatible, {"b": 1})]), lambda i: "x")


@pytest.mark.parametrize(("payload", "message"), [
    (b"\x01\x00\x00\x00\x01\x02", "not in the Confluent wire format"),
    (b"\x00\x00\x00", "not in the Confluent wire format"),
    (b"\x00\x00\x00\x00\x07\x02", "schema id 7 is not in the schema registry"),
    (b"\x00\x00\x00\x00\x01", "EOFError"),
    (b"\x00\x00\x00\x00\x01\x02\x02", "1 bytes left after the record"),
])
def test_bad_bytes_fail_naming_the_record_and_schema_id(payload: bytes, message: str) -> None:
    schema = {"type": "record", "name": "T", "fields": [{"name": "a", "type": "long"}]}
    decoder = AvroDecoder("value", json.dumps(schema), 1, lambda i: None)
    with pytest.raises(DecodeError, match=message) as e:
        decoder.decode(pa.array([_frame(1, schema, {"a": 1}), payload]),
                       lambda i: f"topic t partition 0 offset {40 + i}")
    assert "topic t partition 0 offset 41" in str(e.value)


# -- the sink's side ---------------------------------------------------------------------------
def _sink_formats(**extra: str) -> Any:
    from connectors.kafka.sink.format_options import parse_formats, split

    own, mine = split({"topic": "t", "sink_id": "s", **extra})
    assert set(own) == {"topic", "sink_id"}
    return parse_formats(mine)


def test_sink_format_options() -> None:
    assert _sink_formats() is None
    f = _sink_formats(valueFormat="avro", autoRegister="true",
                      subjectNameStrategy="recordnamestrategy", **URL)
    assert (f.strategy, f.auto_register, [c.column for c in f.columns]) == (
        "RecordNameStrategy", True, ["value"])
    with pytest.raises(OptionError, match="autoRegister.*useLatestVersion"):
        _sink_formats(valueFormat="avro", autoRegister="true", useLatestVersion="true", **URL)
    with pytest.raises(OptionError, match="schemaRegistry.url.*is set but neither"):
        _sink_formats(**URL)
    with pytest.raises(OptionError, match="schemaRegistry.uri"):
        _sink_formats(valueFormat="avro", **{"schemaRegistry.uri": "x"}, **URL)


def test_the_sink_constructor_takes_the_formats_by_argument_name(tmp_path: Any) -> None:
    from connectors.core.errors import UnknownArgumentError
    from connectors.kafka.sink import KafkaSink

    def sink(**extra: Any) -> Any:
        return KafkaSink("s", str(tmp_path / "wal"), bootstrap_servers="b:1", topic="t",
                         **extra)

    assert sink().formats is None
    f = sink(value_format="avro", auto_register=True,
             schema_registry={"url": "http://r:8081", "basic.auth.user.info": "u:hunter22"}
             ).formats
    assert f is not None and f.auto_register and [c.column for c in f.columns] == ["value"]
    assert "hunter22" not in repr(f) + repr(sink(value_format="avro", schema_registry={
        "url": "http://r:8081", "basic.auth.user.info": "u:hunter22"}))
    # errors name the Python arguments
    with pytest.raises(OptionError, match=r"'schema_registry\.url' is required"):
        sink(value_format="avro")
    with pytest.raises(OptionError, match=r"schema_registry\['url'\].*neither key_format nor "
                                          r"value_format"):
        sink(schema_registry={"url": "http://r:8081"})
    with pytest.raises(OptionError, match="'auto_register' cannot be used together with "
                                          "use_latest_version"):
        sink(value_format="avro", schema_registry={"url": "http://r:8081"},
             auto_register=True, use_latest_version=True)
    with pytest.raises(UnknownArgumentError, match="did you mean 'value_format'"):
        sink(value_fromat="avro")


def test_sink_docs_table_is_generated_from_the_declaration() -> None:
    from connectors.kafka.sink.format_options import SINK_FORMAT_OPTIONS

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "schema-registry.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found = re.search(
        r"(<!-- options: eo_kafka sink formats -->\n)(.*?)(<!-- end of options -->)", text, re.S)
    assert found, "docs/schema-registry.md has no sink options block"
    generated = docs_table(SINK_FORMAT_OPTIONS, common=False)
    if os.environ.get("UPDATE_DOCS") == "1" and found.group(2) != generated:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:found.start(2)] + generated + text[found.end(2):])
        return
    assert found.group(2) == generated, "rewrite the table with UPDATE_DOCS=1"


@pytest.mark.parametrize("seed", range(20))
def test_spark_columns_encode_and_decode_back_the_same(seed: int) -> None:
    """Random nested Spark types: our encoder's bytes, decoded by fastavro itself and by our
    decoder, give the rows back."""
    from connectors.kafka.registry.avro import AvroEncoder
    from connectors.kafka.registry.avro_schema import avro_schema

    rng = random.Random(seed)
    names: list[int] = []
    schema = {"type": "record", "name": "Top", "fields": [
        {"name": f"c{i}", "type": _random_schema(rng, 0, names)} for i in range(4)]}
    t = arrow_type(schema)
    rows = pa.array([_random_value(rng, schema) for _ in range(20)] + [None], type=t)
    writer = avro_schema(t, "topLevelRecord")
    enc = AvroEncoder("value", json.dumps(writer), 4)
    framed = enc.encode(rows)
    assert framed.null_count == 1 and framed[0].as_py()[:5] == b"\x00\x00\x00\x00\x04"
    back = AvroDecoder("value", json.dumps(writer), 4, lambda i: None).decode(framed, str)
    assert back.to_pylist() == rows.to_pylist()
    parsed = fastavro.parse_schema(writer)
    first = fastavro.schemaless_reader(io.BytesIO(framed[0].as_py()[5:]), parsed, None)
    assert pa.array([first], type=t).to_pylist() == rows.to_pylist()[:1]


# -- the C fast path ---------------------------------------------------------------------------
_FLAT = ["boolean", "int", "long", "float", "double", "string", "bytes",
         {"type": "long", "logicalType": "timestamp-millis"},
         {"type": "long", "logicalType": "timestamp-micros"},
         {"type": "int", "logicalType": "date"}, {"type": "string", "logicalType": "uuid"}]


def _flat_schema(rng: random.Random) -> dict[str, Any]:
    fields = []
    for i in range(rng.randint(1, 12)):
        t: Any = rng.choice(_FLAT)
        if rng.random() < 0.4:
            t = ["null", t] if rng.random() < 0.5 else [t, "null"]
        fields.append({"name": f"f{i}", "type": t})
    return {"type": "record", "name": "Flat", "fields": fields}


def _flat_value(rng: random.Random, t: Any) -> Any:
    import datetime as dt

    if isinstance(t, list):
        return None if rng.random() < 0.3 else _flat_value(rng, [b for b in t if b != "null"][0])
    if isinstance(t, dict):
        logical = t["logicalType"]
        if logical == "date":
            return dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-20000, 40000))
        if logical == "uuid":
            return f"00000000-0000-4000-8000-{rng.getrandbits(48):012x}"
        unit = 1000 if logical == "timestamp-millis" else 1
        return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(
            microseconds=rng.randint(-10**15, 10**15) // unit * unit)
    return _random_value(rng, t)


@pytest.mark.c_extensions
@pytest.mark.parametrize("seed", range(30))
def test_the_c_fast_path_decodes_exactly_what_fastavro_decodes(seed: int) -> None:
    from connectors.kafka.registry import avro

    if avro._avro_decode is None:
        pytest.skip("the _avro_decode extension is not built")
    rng = random.Random(seed)
    schema = _flat_schema(rng)
    records = [{f["name"]: _flat_value(rng, f["type"]) for f in schema["fields"]}
               for _ in range(50)]
    framed: list[bytes | None] = [_frame(3, schema, r) for r in records]
    framed[rng.randrange(50)] = None
    values = pa.array(framed, pa.binary())
    decoder = AvroDecoder("value", json.dumps(schema), 3, lambda i: None)
    assert decoder._fast is not None
    fast = decoder._decode_fast(values)
    assert fast is not None
    slow = AvroDecoder("value", json.dumps(schema), 3, lambda i: None)
    slow._fast = None
    assert fast.equals(slow.decode(values, str))
    assert fast.slice(10, 20).equals(decoder.decode(values.slice(10, 20), str))
    # Damaged bytes: the fast path either falls back or agrees with fastavro, never differs.
    for _ in range(40):
        i = rng.randrange(50)
        payload = bytearray(framed[i] or _frame(3, schema, records[i]))
        for _ in range(rng.randint(1, 3)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        if rng.random() < 0.3:
            payload = payload[:rng.randrange(len(payload) + 1)]
        one = pa.array([bytes(payload)], pa.binary())
        got = decoder._decode_fast(one)
        if got is None:
            continue
        try:
            want = slow.decode(one, str)
        except DecodeError:
            raise AssertionError(f"the fast path decoded bytes fastavro refuses: "
                                 f"{bytes(payload)!r}") from None
        assert got.equals(want)


def test_the_fast_path_leaves_other_schema_ids_and_bad_records_to_fastavro() -> None:
    writer = {"type": "record", "name": "T", "fields": [{"name": "a", "type": "int"}]}
    reader = {"type": "record", "name": "T", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": "d"}]}
    decoder = AvroDecoder("value", json.dumps(reader), 2, {1: json.dumps(writer)}.get)
    mixed = pa.array([_frame(2, reader, {"a": 1, "b": "x"}), _frame(1, writer, {"a": 5})])
    assert decoder._decode_fast(mixed) is None if decoder._fast else True
    assert decoder.decode(mixed, str).to_pylist() == [{"a": 1, "b": "x"}, {"a": 5, "b": "d"}]
    bad = pa.array([_frame(2, reader, {"a": 1, "b": "x"}) + b"\x00"])
    with pytest.raises(DecodeError, match="1 bytes left after the record"):
        decoder.decode(bad, lambda i: f"offset {i}")


@pytest.mark.c_extensions
@pytest.mark.parametrize("seed", range(20))
def test_the_c_encoder_writes_the_bytes_fastavro_writes(seed: int) -> None:
    from connectors.kafka.registry import avro
    from connectors.kafka.registry.avro import AvroEncoder
    from connectors.kafka.registry.avro_schema import avro_schema

    if avro._avro_decode is None:
        pytest.skip("the _avro_decode extension is not built")
    rng = random.Random(seed)
    schema = _flat_schema(rng)
    t = arrow_type(schema)
    records: list[Any] = [{f["name"]: _flat_value(rng, f["type"]) for f in schema["fields"]}
                          for _ in range(40)]
    records[rng.randrange(40)] = None
    rows = pa.array(records, type=t)
    for writer in (avro_schema(t, "topLevelRecord"), schema):
        fast = AvroEncoder("value", json.dumps(writer), 11)
        slow = AvroEncoder("value", json.dumps(writer), 11)
        slow._fast = None
        try:
            want = slow.encode(rows)
        except Exception:  # noqa: BLE001 - a null in a non-null field: the C path refuses too
            assert fast._encode_fast(rows) is None
            continue
        got = fast._encode_fast(rows)
        if writer is not schema:
            assert got is not None, "the derived schema of a flat struct takes the C path"
        if got is not None:
            assert got.equals(want)
            assert got.slice(5, 20).equals(fast.encode(rows.slice(5, 20)))


def test_dlq_keeps_a_bad_record_as_a_row_with_its_error_and_bytes() -> None:
    from connectors.kafka.registry.source_formats import (
        ColumnFormat,
        SourceFormats,
        arrow_schema,
        decode_batches,
    )
    from connectors.kafka.source.records import arrow_schema as base_schema

    schema = {"type": "record", "name": "T", "fields": [{"name": "a", "type": "long"}]}
    formats = SourceFormats(
        RegistrySpec.parse("eo_kafka", {"url": "http://127.0.0.1:9"}),
        (ColumnFormat("value", "avro", "t-value", None, json.dumps(schema), 1),), "dlq")
    base = base_schema(False, False)
    good, bad = _frame(1, schema, {"a": 7}), b"\x00\x00\x00\x00\x01\xff"
    batch = pa.RecordBatch.from_pydict({
        "key": [None, None, None], "value": [good, bad, None], "topic": ["t"] * 3,
        "partition": [0] * 3, "offset": [10, 11, 12], "timestamp": [0] * 3,
        "timestampType": [0] * 3}, schema=base)
    out_schema = arrow_schema(base, formats)
    assert out_schema.names[-2:] == ["decodeError", "rawValue"]
    (out,) = list(decode_batches(iter([batch]), formats, out_schema))
    rows = out.to_pylist()
    assert [r["value"] for r in rows] == [{"a": 7}, None, None]
    assert rows[0]["decodeError"] is None and rows[2]["decodeError"] is None
    assert "topic t partition 0 offset 11" in rows[1]["decodeError"]
    assert [r["rawValue"] for r in rows] == [None, bad, None]
    with pytest.raises(OptionError, match="onDecodeError.*neither keyFormat nor valueFormat"):
        _opts(onDecodeError="dlq")


# -- JSON Schema -------------------------------------------------------------------------------
ORDER_JSON = {
    "type": "object", "properties": {
        "id": {"type": "integer"}, "item": {"type": "string"},
        "price": {"type": ["number", "null"]}, "paid": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "at": {"type": "string", "format": "date-time"},
        "ship": {"type": "object", "properties": {"city": {"type": "string"}}},
        "note": {"oneOf": [{"type": "null"}, {"type": "string"}]}}}


def _json_frame(schema_id: int, record: Any) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + json.dumps(record).encode()


def test_json_schema_records_decode_to_typed_columns() -> None:
    import datetime as dt

    from connectors.kafka.registry.json_schema import JsonSchemaDecoder

    decoder = JsonSchemaDecoder("value", json.dumps(ORDER_JSON))
    assert decoder.type == pa.struct([
        ("id", pa.int64()), ("item", pa.string()), ("price", pa.float64()),
        ("paid", pa.bool_()), ("tags", pa.list_(pa.string())),
        ("at", pa.timestamp("us", "UTC")), ("ship", pa.struct([("city", pa.string())])),
        ("note", pa.string())])
    rec = {"id": 7, "item": "é", "price": 2, "paid": True, "tags": ["a"],
           "at": "2024-01-02T03:04:05.123456Z", "ship": {"city": "Oslo", "zip": "x"},
           "extra": 1}
    got = decoder.decode(pa.array([_json_frame(4, rec), _json_frame(4, {}), None]), str)
    assert got.to_pylist()[0] == {
        "id": 7, "item": "é", "price": 2.0, "paid": True, "tags": ["a"],
        "at": dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc),
        "ship": {"city": "Oslo"}, "note": None}
    assert got.to_pylist()[1] == dict.fromkeys(decoder.type.names)
    assert got.to_pylist()[2] is None


@pytest.mark.parametrize(("payload", "message"), [
    (b"\x00\x00\x00\x00\x04{nope", "JSONDecodeError"),
    (b"\x00\x00\x00\x00\x04[1]", "expected an object"),
    (b'\x00\x00\x00\x00\x04{"id": true}', "expected an integer"),
    (b'\x00\x00\x00\x00\x04{"price": "1"}', "expected a number"),
    (b'\x00\x00\x00\x00\x04{"at": "2024-01-02T03:04:05"}', "no time zone offset"),
    (b'{"id": 1}', "not in the Confluent wire format"),
])
def test_bad_json_records_fail_naming_the_record(payload: bytes, message: str) -> None:
    from connectors.kafka.registry.json_schema import JsonSchemaDecoder

    decoder = JsonSchemaDecoder("value", json.dumps(ORDER_JSON))
    with pytest.raises(DecodeError, match=message) as e:
        decoder.decode(pa.array([_json_frame(4, {"id": 1}), payload]),
                       lambda i: f"topic t partition 0 offset {5 + i}")
    assert "offset 6" in str(e.value)


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/x"}}}, r"value\.a uses \$ref"),
    ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "one type"),
    ({"type": "object"}, "without properties"),
])
def test_json_schemas_spark_cannot_type_are_refused(schema: Any, message: str) -> None:
    from connectors.kafka.registry.json_schema import arrow_type as json_type

    with pytest.raises(SchemaNotRepresentable, match=message):
        json_type(schema)


# -- the sink's JSON Schema ---------------------------------------------------------------------
def test_json_schema_records_validate_and_read_back_through_the_source_decoder() -> None:
    """The schema of a Spark type is a valid draft-07 schema (the ``jsonschema`` library
    checks it and every record against it), and the source's decoder reads each record back
    as the row it was."""
    import datetime as dt
    from decimal import Decimal

    import jsonschema

    from connectors.kafka.registry.json_schema import JsonEncoder, JsonSchemaDecoder, json_schema

    t = pa.struct([
        pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
        pa.field("price", pa.float64()), pa.field("ok", pa.bool_()),
        pa.field("day", pa.date32()), pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("inner", pa.struct([pa.field("n", pa.int32())])),
    ])
    rows = [{"id": 1, "name": "a", "price": 2.5, "ok": True, "day": dt.date(2024, 1, 2),
             "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone.utc),
             "tags": ["x", None], "inner": {"n": 7}},
            {"id": 2, "name": None, "price": None, "ok": None, "day": None, "at": None,
             "tags": None, "inner": None}, None]
    schema = json_schema(t, "Item", "value")
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["title"] == "Item" and schema["required"] == ["id"]
    encoded = JsonEncoder("value", 9).encode(pa.array(rows, t))
    assert encoded[2].as_py() is None
    for raw in encoded.to_pylist()[:2]:
        assert raw[:5] == b"\x00\x00\x00\x00\x09"
        jsonschema.validate(json.loads(raw[5:]), schema)
    back = JsonSchemaDecoder("value", json.dumps(schema)).decode(encoded, str)
    want = pa.array(rows, t).cast(back.type)
    assert back.to_pylist() == want.to_pylist()
    # binary, maps and narrow decimals have a JSON form too (base64, objects, numbers)
    other = pa.struct([pa.field("b", pa.binary()), pa.field("m", pa.map_(pa.string(), pa.int64())),
                       pa.field("d", pa.decimal128(10, 2))])
    schema = json_schema(other, "Other", "value")
    raw = JsonEncoder("value", 1).encode(pa.array(
        [{"b": b"\x00\xff", "m": [("k", 1)], "d": Decimal("12.34")}], other))[0].as_py()
    doc = json.loads(raw[5:])
    jsonschema.validate(doc, schema)
    assert doc == {"b": "AP8=", "m": {"k": 1}, "d": 12.34}


@pytest.mark.parametrize(("t", "message"), [
    (pa.struct([pa.field("at", pa.timestamp("us"))]), "timestamp_ntz"),
    (pa.struct([pa.field("d", pa.decimal128(20, 2))]), "exact to 15 digits"),
    (pa.struct([pa.field("m", pa.map_(pa.int32(), pa.int32()))]), "string keys only"),
])
def test_json_schema_refuses_types_it_cannot_keep(t: pa.DataType, message: str) -> None:
    from connectors.core.errors import KafkaSinkError
    from connectors.kafka.registry.json_schema import json_schema

    with pytest.raises(KafkaSinkError, match=message):
        json_schema(t, "X", "value")


def test_a_nan_has_no_json_form_and_says_so() -> None:
    from connectors.core.errors import KafkaSinkError
    from connectors.kafka.registry.json_schema import JsonEncoder

    t = pa.struct([pa.field("x", pa.float64())])
    with pytest.raises(KafkaSinkError, match="NaN and infinities"):
        JsonEncoder("value", 1).encode(pa.array([{"x": float("nan")}], t))
