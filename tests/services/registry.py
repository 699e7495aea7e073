"""The schema registry of the test tier: a real, Confluent-compatible one, never a mock.

Found in the order tests/README.md gives ("How the fixtures find services"):

1. ``SCHEMA_REGISTRY_URL``: an existing registry's Confluent API base URL (Confluent's own
   ``http://host:8081``, Apicurio's ``http://host:8080/apis/ccompat/v7``, Karapace, ...);
2. Docker: skipped. testcontainers-python has no registry module, and the jar below runs
   the same kind of registry without Docker;
3. Apicurio Registry started locally (:class:`connectors.demo.services.registry.LocalRegistry`,
   in-memory storage), packaged once from Maven Central;
4. otherwise unavailable: skip, or fail under ``CI=true``.

:func:`check_ccompat` is the session's first check of whatever registry it got, through a
client we did not write (confluent-kafka's ``SchemaRegistryClient``): register, latest,
by id, and a refused incompatible change.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class RegistryService:
    url: str
    version: str
    log_path: str | None
    local: Any = None  # the LocalRegistry this session started, if any


def from_environment() -> RegistryService | None:
    url = os.environ.get("SCHEMA_REGISTRY_URL")
    return RegistryService(url.rstrip("/"), "external", None) if url else None


def check_ccompat(url: str) -> None:
    """Raise AssertionError unless the registry speaks Confluent's API as clients need."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = SchemaRegistryClient({"url": url})
    subject = f"eo-check-{uuid.uuid4().hex[:8]}-value"
    v1 = {"type": "record", "name": "Check", "fields": [{"name": "a", "type": "long"}]}
    v2 = {"type": "record", "name": "Check", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": ""}]}
    bad = {"type": "record", "name": "Check", "fields": [{"name": "a", "type": "string"}]}
    first = client.register_schema(subject, Schema(json.dumps(v1), "AVRO"))
    client.set_compatibility(subject, "BACKWARD")
    second = client.register_schema(subject, Schema(json.dumps(v2), "AVRO"))
    latest = client.get_latest_version(subject)
    if (latest.schema_id, latest.version) != (second, 2):
        raise AssertionError(f"latest of {subject} is {latest}, expected id {second} v2")
    if json.loads(client.get_schema(first).schema_str)["fields"] != v1["fields"]:
        raise AssertionError(f"schema id {first} does not read back")
    try:
        client.register_schema(subject, Schema(json.dumps(bad), "AVRO"))
    except SchemaRegistryError as e:
        if e.http_status_code != 409:
            raise AssertionError(f"an incompatible schema got HTTP {e.http_status_code}") from e
    else:
        raise AssertionError("the registry registered an incompatible schema (BACKWARD)")
