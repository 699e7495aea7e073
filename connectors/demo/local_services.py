"""The demo's local services: each prepared, then started, each step saying how it goes.

A first run on a fresh machine downloads from Maven Central: Apache Kafka's jars (a minute
or so) and, with ``--format avro``, the schema registry's Quarkus build (minutes). Each is
a step of its own here, announced, with a progress line at least every 10 s and a time
bound of its own, before the service starts under its start-up deadline: a download or a
build never eats the time a start is given. ``python -m connectors.demo.services.maven
kafka`` and ``python -m connectors.demo.services.registry --prepare`` prepare them ahead
of time (README, "Quick start").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from connectors.demo.services.progress import Say

if TYPE_CHECKING:
    from connectors.demo.services.kafka import LocalBroker
    from connectors.demo.services.registry import LocalRegistry


def start_broker(workdir: str, say: Say) -> LocalBroker:
    """A local Kafka broker with its files under ``workdir``: Apache Kafka's jars resolved
    first, then the broker started."""
    from connectors.demo.services import maven
    from connectors.demo.services.kafka import start_local_kafka

    # else start_local_kafka falls back to tansu, saying why; once resolved, the jars are
    # cached and a run says nothing of Maven
    if maven.java_and_maven() is None and maven.cached("kafka") is None:
        say(f"resolving Apache Kafka's jars with Maven (a first run downloads them from "
            f"Maven Central, a minute or so; cached in {maven.cache_root()})...")
        _timed(say, "resolved Apache Kafka's jars",
               lambda: maven.resolve("kafka", progress=_indented(say)))
    say("starting a local Kafka broker...")
    began = time.monotonic()
    broker = start_local_kafka(workdir, progress=_indented(say))
    kind = "tansu (fallback)" if broker.version == "tansu" else "Apache Kafka"
    say(f"  {kind} {broker.version} on {broker.bootstrap} ({time.monotonic() - began:.0f}s)")
    return broker


def start_registry(workdir: str, say: Say) -> LocalRegistry:
    """A local Apicurio registry with its files under ``workdir``: built first (on a first
    run), then started."""
    from connectors.demo.services import maven, registry

    if registry.cached() is None:
        say(f"building the Schema Registry (Apicurio) with Maven (a first run downloads it "
            f"from Maven Central, a few minutes; cached in {maven.cache_root()})...")
        _timed(say, "built the Schema Registry", lambda: registry.build(progress=_indented(say)))
    say("starting a local Schema Registry...")
    began = time.monotonic()
    local = registry.LocalRegistry(workdir=os.path.join(workdir, "registry")).start(
        progress=_indented(say))
    say(f"  Apicurio Registry {local.version} at {local.url} ({time.monotonic() - began:.0f}s)")
    return local


def _timed(say: Say, done: str, step: Callable[[], object]) -> None:
    """``step()``, then a line that says it finished and how long it took."""
    began = time.monotonic()
    step()
    say(f"  {done} in {time.monotonic() - began:.0f}s")


def _indented(say: Say) -> Say:
    return lambda line: say(f"  {line}")


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the demo's metrics endpoint)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
