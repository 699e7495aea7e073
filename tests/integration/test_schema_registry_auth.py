"""A schema registry that wants credentials: the session's real registry behind nginx with
HTTP basic auth (``registry_behind_basic_auth``, tests/services/nginx.py; Apicurio 2.4.2's
own authentication needs Keycloak). The right credentials pass the Confluent API through,
for confluent-kafka's client and for our source and sink; a wrong password, none, or a wrong
one in the URL fails the source at load and the sink before any task, with an error that
names the registry URL (never a password), says 401/unauthorized and names
``schemaRegistry.basic.auth.user.info``; nothing is written or committed."""

from __future__ import annotations

import base64
import json
import logging
import os
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

from connectors.demo.services.kafka import produce_records
from tests.helpers import group_offsets, read_topic

pytestmark = pytest.mark.integration

SCHEMA = {"type": "record", "name": "Reading", "namespace": "eo.auth", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}


def _with_user(url: str, user_info: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user_info}@{rest}"


def _confluent(proxy: Any) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": proxy.url,
                                 "basic.auth.user.info": f"{proxy.user}:{proxy.password}"})


def _avro_topic(proxy: Any, bootstrap: str, new_topic: Any, n: int = 20) -> str:
    """A topic of ``n`` records written by confluent-kafka's ``AvroSerializer`` through the
    proxy (the subject registered there)."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = new_topic()
    ser = AvroSerializer(_confluent(proxy), json.dumps(SCHEMA),
                         conf={"auto.register.schemas": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    produce_records(bootstrap, topic,
                    [(None, ser({"id": i, "name": f"n{i}"}, ctx), 0) for i in range(n)])
    return topic


def _registry(url: str, user_info: str | None) -> dict[str, str]:
    opts = {"valueFormat": "avro", "schemaRegistry.url": url}
    if user_info is not None:
        opts["schemaRegistry.basic.auth.user.info"] = user_info
    return opts


def _read(spark: Any, bootstrap: str, topic: str, stream: bool = False,
          **options: str) -> Any:
    reader = (spark.readStream if stream else spark.read).format("eo_kafka")
    reader = reader.option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _write(spark: Any, bootstrap: str, topic: str, wal: str, n: int = 10,
           **options: str) -> None:
    df = spark.range(n).selectExpr(
        "named_struct('id', id, 'name', concat('w', cast(id as string))) as value")
    w = (df.write.format("eo_kafka").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).option("sink_id", f"auth-{uuid.uuid4().hex[:8]}")
         .option("walPath", wal).option("batchId", 0))
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()


def test_the_right_credentials_pass_the_confluent_api_to_source_and_sink(
        spark: Any, kafka_bootstrap: str, new_topic: Any, registry_behind_basic_auth: Any,
        tmp_path: Any) -> None:
    proxy = registry_behind_basic_auth
    right = f"{proxy.user}:{proxy.password}"
    # the proxy really guards the registry: no credentials, a wrong password -> 401
    for header in (None, "Basic " + base64.b64encode(b"eo-registry:nope").decode()):
        req = urllib.request.Request(  # noqa: S310 - the test's proxy
            proxy.url + "/subjects", headers={"Authorization": header} if header else {})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)  # noqa: S310 - the test's proxy
        assert refused.value.code == 401

    # source: records confluent-kafka's serializer wrote through the proxy
    topic = _avro_topic(proxy, kafka_bootstrap, new_topic)
    for url, user_info in ((proxy.url, right), (_with_user(proxy.url, right), None)):
        df = _read(spark, kafka_bootstrap, topic, **_registry(url, user_info))
        assert sorted((r[0], r[1]) for r in df.select("value.id", "value.name").collect()) == [
            (i, f"n{i}") for i in range(20)]

    # sink: registers through the proxy, and confluent-kafka's deserializer reads it back
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    out = new_topic()
    _write(spark, kafka_bootstrap, out, str(tmp_path / "wal"), autoRegister="true",
           **_registry(proxy.url, right))
    de = AvroDeserializer(_confluent(proxy))
    ctx = SerializationContext(out, MessageField.VALUE)
    assert sorted((r["id"], r["name"]) for r in (
        de(m.value(), ctx) for m in read_topic(kafka_bootstrap, out))) == [
        (i, f"w{i}") for i in range(10)]


#: How the credentials go wrong: (option URL, basic.auth.user.info) from the proxy and a
#: wrong password.
CASES = {
    "wrong-password": lambda proxy, wrong: (proxy.url, f"{proxy.user}:{wrong}"),
    "no-credentials": lambda proxy, wrong: (proxy.url, None),
    "wrong-password-in-url": lambda proxy, wrong: (
        _with_user(proxy.url, f"{proxy.user}:{wrong}"), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_wrong_credentials_fail_source_and_sink_clearly_and_write_nothing(
        case: str, spark: Any, kafka_bootstrap: str, new_topic: Any,
        registry_behind_basic_auth: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    proxy = registry_behind_basic_auth
    topic = _avro_topic(proxy, kafka_bootstrap, new_topic)
    wrong = f"wrong-{uuid.uuid4().hex}"
    url, user_info = CASES[case](proxy, wrong)
    options = _registry(url, user_info)
    # Everything our code logs, down to DEBUG; other libraries from INFO (py4j's DEBUG wire
    # log echoes every argument the test hands to Spark).
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="connectors")
    capfd.readouterr()

    # source: fails at load (the reader schema, on the driver); no WAL, no group offsets
    group, wal = f"auth-{uuid.uuid4().hex[:8]}", str(tmp_path / "source-wal")
    with pytest.raises(Exception) as source_error:
        _read(spark, kafka_bootstrap, topic, stream=True, walPath=wal,
              startingOffsets="earliest", **{"kafka.group.id": group}, **options)
    # sink: fails on the driver resolving the writer schema, before any task
    out, sink_wal = new_topic(), str(tmp_path / "sink-wal")
    with pytest.raises(Exception) as sink_error:
        _write(spark, kafka_bootstrap, out, sink_wal, autoRegister="true", **options)

    for error in (source_error, sink_error):
        message = str(error.value)
        assert proxy.url in message, message
        assert "HTTP 401" in message and "unauthorized" in message.lower(), message
        assert "schemaRegistry.basic.auth.user.info" in message, message
        assert ("no credentials were sent" if case == "no-credentials"
                else "was not accepted") in message, message
    captured = capfd.readouterr()
    for text in (str(source_error.value), str(sink_error.value), caplog.text, captured.out,
                 captured.err):
        assert wrong not in text and proxy.password not in text

    assert not os.path.exists(wal) or os.listdir(wal) == []
    assert {tp: o for tp, o in group_offsets(kafka_bootstrap, group).items()
            if tp[0] == topic} == {}
    assert read_topic(kafka_bootstrap, out) == []
    assert not os.path.isdir(os.path.join(sink_wal, "commits"))
