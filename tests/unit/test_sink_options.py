"""Each sink's options are declared once (connectors/core/declared.py); what is written
elsewhere for people, the constructor's signature and the docs table, is held against it.

``UPDATE_DOCS=1 pytest tests/unit/test_sink_options.py`` rewrites the docs tables from the
declarations (between the ``<!-- options: NAME -->`` and ``<!-- end of options -->`` lines).
"""

from __future__ import annotations

import os
import re

import pytest

from connectors.core.declared import DURATION, Opt, docs_table, signature_mismatches
from connectors.files.options import FILE_SINK_OPTIONS
from connectors.files.sink import FileSink
from connectors.jdbc.options import JDBC_SINK_OPTIONS
from connectors.jdbc.sink import JdbcSink
from connectors.kafka.sink import KafkaSink
from connectors.kafka.sink.format_options import SINK_FORMAT_OPTIONS
from connectors.kafka.sink.options import KAFKA_SINK_OPTIONS

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "docs")
SINKS = [
    (KafkaSink, "KAFKA_SINK_OPTIONS", KAFKA_SINK_OPTIONS, "kafka-sink.md"),
    (JdbcSink, "JDBC_SINK_OPTIONS", JDBC_SINK_OPTIONS, "jdbc-sink.md"),
    (FileSink, "FILE_SINK_OPTIONS", FILE_SINK_OPTIONS, "file-sink.md"),
]
IDS = [s[0].__name__ for s in SINKS]


@pytest.mark.parametrize(("sink", "name", "table", "doc"), SINKS, ids=IDS)
def test_the_constructor_s_signature_is_the_declaration(sink: type, name: str,
                                                       table: tuple[Opt, ...], doc: str) -> None:
    if sink is KafkaSink:  # and its Schema Registry formats (docs/schema-registry.md)
        table = table + SINK_FORMAT_OPTIONS
    assert signature_mismatches(sink.__init__, table) == []


@pytest.mark.parametrize(("sink", "name", "table", "doc"), SINKS, ids=IDS)
def test_the_docs_table_is_generated_from_the_declaration(sink: type, name: str,
                                                         table: tuple[Opt, ...],
                                                         doc: str) -> None:
    path = os.path.join(DOCS, doc)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    marks = re.compile(rf"(<!-- options: {name} [^\n]*-->\n)(.*?)(<!-- end of options -->)",
                       re.S)
    found = marks.search(text)
    assert found, f"docs/{doc} has no '<!-- options: {name} ... -->' block"
    generated = docs_table(table)
    if os.environ.get("UPDATE_DOCS") == "1" and found.group(2) != generated:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:found.start(2)] + generated + text[found.end(2):])
        return
    assert found.group(2) == generated, (
        f"docs/{doc}'s options table differs from {name}; rewrite it with UPDATE_DOCS=1")


@pytest.mark.parametrize(("sink", "name", "table", "doc"), SINKS, ids=IDS)
def test_every_sink_follows_the_same_name_rules(sink: type, name: str, table: tuple[Opt, ...],
                                               doc: str) -> None:
    (sink_id,) = [o for o in table if o.arg == "sink_id"]
    assert (sink_id.spark, sink_id.aliases) == ("sink_id", ("sinkId",))
    for o in table:
        if o.kind is DURATION:  # seconds in Python, no unit in either name
            for n in (o.arg, o.spark, *o.aliases):
                assert not re.search(r"(_s|_ms|_seconds|Ms|Seconds)$", n), n
                assert "deadline" not in n.lower(), n
