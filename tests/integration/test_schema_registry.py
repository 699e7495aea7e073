"""The schema registry of the test tier, and our registry client against it.

The fixture has already checked the registry with confluent-kafka's own client (register,
latest, by id, an incompatible change refused); these tests hold our client
(:mod:`connectors.kafka.registry.client`) to the same registry.
"""

from __future__ import annotations

import json
import uuid

import pytest

from connectors.kafka.registry.client import RegistryClient, RegistryError, RegistrySpec

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "Item", "fields": [{"name": "id", "type": "long"}]}


def _register(url: str, subject: str, schema: dict[str, object]) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    sid: int = SchemaRegistryClient({"url": url}).register_schema(
        subject, Schema(json.dumps(schema), "AVRO"))
    return sid


def test_our_client_reads_what_confluents_client_registered(registry_url: str) -> None:
    subject = f"t-{uuid.uuid4().hex[:8]}-value"
    sid = _register(registry_url, subject, V1)
    client = RegistryClient(RegistrySpec.parse("eo_kafka", {"url": registry_url}))
    latest = client.subject_version(subject)
    assert (latest.id, latest.version, latest.schema_type) == (sid, 1, "AVRO")
    assert json.loads(latest.schema)["fields"] == V1["fields"]
    by_id = client.schema_by_id(sid)
    assert by_id is not None and json.loads(by_id.schema) == json.loads(latest.schema)
    assert client.schema_by_id(2_000_000_000) is None


def test_a_missing_subject_is_named_with_the_fix(registry_url: str) -> None:
    client = RegistryClient(RegistrySpec.parse("eo_kafka", {"url": registry_url}))
    with pytest.raises(RegistryError, match="no subject 'nope-value'; register the schema"):
        client.subject_version("nope-value")


def test_an_unreachable_registry_fails_in_time_without_its_password() -> None:
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = RegistrySpec.parse("eo_kafka", {"url": f"http://user:hunter22@127.0.0.1:{port}",
                                           "timeout": "2"})
    with pytest.raises(RegistryError) as e:
        RegistryClient(spec).subject_version("x-value")
    text = str(e.value)
    assert "unreachable" in text and f"127.0.0.1:{port}" in text
    assert "hunter22" not in text
