"""Kafka's own command-line tools, from the Maven-resolved ``kafka`` profile jars (the
``kafka-tools`` artifact is there), without a broker instance: the cross-client tests ask
them about brokers they did not start."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from connectors.core.errors import ConnectorError
from connectors.demo.services import maven

CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"

# The tools log through Log4j 2; warnings only, on stderr, so stdout is just the answer.
_LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    Console:
      name: stderr
      target: SYSTEM_ERR
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: stderr
"""


def kafka_tool(main_class: str, *args: str, timeout: float = 120.0) -> str:
    """Run a Kafka command-line class (e.g. :data:`CONSUMER_GROUPS`); its stdout."""
    jars = maven.resolve("kafka")
    with tempfile.TemporaryDirectory(prefix="eo-kafka-tool-") as tmp:
        config = Path(tmp) / "log4j2.yaml"
        config.write_text(_LOG4J2)
        cmd = ["java", "-Xmx256m", "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={config}",
               "-cp", maven.classpath(jars), main_class, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              check=False)
    if done.returncode != 0:
        raise ConnectorError(
            f"{main_class} {' '.join(args)} failed ({done.returncode}): "
            f"{(done.stdout + done.stderr)[-2000:]}"
        )
    return done.stdout


def describe_group(bootstrap: str, group: str) -> tuple[str, list[dict[str, str]]]:
    """``kafka-consumer-groups --describe``: its text and one row per partition, keyed by
    the tool's column names (``TOPIC``, ``PARTITION``, ``CURRENT-OFFSET``, ``LAG``, ...)."""
    return _table(kafka_tool(CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--describe",
                             "--group", group))


def describe_all_groups(bootstrap: str) -> tuple[str, list[dict[str, str]]]:
    """``kafka-consumer-groups --describe --all-groups``, as :func:`describe_group`."""
    return _table(kafka_tool(CONSUMER_GROUPS, "--bootstrap-server", bootstrap, "--describe",
                             "--all-groups"))


def _table(text: str) -> tuple[str, list[dict[str, str]]]:
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        if cells[0] == "GROUP":
            header = cells
        elif header is not None and len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
    return text, rows
