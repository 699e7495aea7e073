"""The ``eo_kafka`` source's options are declared once (connectors/kafka/source/declaration.py),
like the sinks': docs/kafka-source.md's table is generated from the declaration, the source
takes exactly the declared options (an unknown one is refused naming the closest declared
one), and a parsed option left unset has the declared default.

``UPDATE_DOCS=1 pytest tests/unit/test_source_options_doc.py`` rewrites the table (between
``<!-- options: KAFKA_SOURCE_OPTIONS ... -->`` and ``<!-- end of options -->``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from connectors.core.declared import docs_table
from connectors.core.errors import OptionError
from connectors.core.options import OptionReader
from connectors.core.storage import STORAGE_OPTIONS
from connectors.kafka.source.declaration import (
    GROUP_ID,
    GROUP_ID_PREFIX,
    IGNORE_UNKNOWN_OPTIONS,
    KAFKA_SOURCE_OPTIONS,
    READ_OPTIONS,
    WINDOW,
)
from connectors.kafka.source.format_options import FORMAT_OPTIONS
from connectors.kafka.source.options import DEFAULT_GROUP_PREFIX, KafkaSourceOptions

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka-source.md"
MINIMAL = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}


def test_the_docs_table_is_generated_from_the_declaration() -> None:
    text = DOC.read_text()
    found = re.search(r"(<!-- options: KAFKA_SOURCE_OPTIONS [^\n]*-->\n)(.*?)"
                      r"(<!-- end of options -->)", text, re.S)
    assert found, "docs/kafka-source.md has no '<!-- options: KAFKA_SOURCE_OPTIONS ... -->' block"
    generated = docs_table(KAFKA_SOURCE_OPTIONS, common=False, python=False)
    if os.environ.get("UPDATE_DOCS") == "1" and found.group(2) != generated:
        DOC.write_text(text[:found.start(2)] + generated + text[found.end(2):])
        return
    assert found.group(2) == generated, (
        "docs/kafka-source.md's options table differs from KAFKA_SOURCE_OPTIONS; rewrite it "
        "with UPDATE_DOCS=1")


def _asked(monkeypatch: pytest.MonkeyPatch, options: dict[str, str], batch: bool) -> set[str]:
    """Every option name the source's parser asked for: what it takes."""
    seen: dict[str, str] = {}
    original = OptionReader.refuse_unknown

    def record(self: OptionReader, *args: Any, **kwargs: Any) -> list[str]:
        unknown = original(self, *args, **kwargs)
        seen.update(self._asked)
        return unknown

    monkeypatch.setattr(OptionReader, "refuse_unknown", record)
    KafkaSourceOptions.from_options(options, batch=batch)
    return set(seen.values())


@pytest.mark.parametrize("batch", [False, True], ids=["stream", "batch"])
def test_the_source_takes_exactly_the_declared_options(monkeypatch: pytest.MonkeyPatch,
                                                       batch: bool) -> None:
    asked = _asked(monkeypatch, MINIMAL, batch) | _asked(
        monkeypatch, {"clusters": '[{"bootstrap": "b:9092", "subscribe": "t"}]'}, batch)
    declared = {o.spark + "*" if o.kind.prefix else o.spark for o in KAFKA_SOURCE_OPTIONS}
    # declared elsewhere: the Schema Registry's, the storage.* named options (the docs name
    # them as storage.*), KafkaWindows' internal window pin
    elsewhere = ({o.spark + "*" if o.kind.prefix else o.spark for o in FORMAT_OPTIONS}
                 | {f"storage.{o.name}" for o in STORAGE_OPTIONS} | {WINDOW.spark})
    # kafka.group.id is one of the kafka.* settings, named in the table for what it means
    assert asked - elsewhere == declared - {"kafka.group.id"}
    # ... and the source reads what it declares, nothing besides
    read = {o.spark + "*" if o.kind.prefix else o.spark for o in READ_OPTIONS}
    assert read == declared - {GROUP_ID.spark} | elsewhere - {
        f"storage.{o.name}" for o in STORAGE_OPTIONS}


# ignoreUnknownOptions is never suggested: a typo of it is only ever an unknown option
@pytest.mark.parametrize("o", [o for o in READ_OPTIONS
                               if not o.kind.prefix and o is not IGNORE_UNKNOWN_OPTIONS],
                         ids=lambda o: o.spark)
def test_a_misspelled_option_is_refused_naming_the_declared_one(o: Any) -> None:
    typo = o.spark[:-1]  # startingOffset, failOnDataLos, eo.windo, ...
    with pytest.raises(OptionError) as e:
        KafkaSourceOptions.from_options({**MINIMAL, typo: "1"})
    # (kafka.bootstrap.server is a kafka.* setting: librdkafka's check names it)
    assert f"'{typo}'" in str(e.value) and f"did you mean '{o.spark}'" in str(e.value)


def test_an_unset_option_has_its_declared_default() -> None:
    parsed = KafkaSourceOptions.from_options(MINIMAL)
    fields = set(KafkaSourceOptions.__dataclass_fields__)
    checked = 0
    for o in KAFKA_SOURCE_OPTIONS:
        if o.default is None or o.arg not in fields or o.arg in ("group_id", "poll_timeout"):
            continue
        assert getattr(parsed, o.arg) == o.default, o.spark
        checked += 1
    assert checked >= 8
    # Spark's name and unit (milliseconds) for the poll timeout; the spec keeps seconds
    (poll,) = [o for o in KAFKA_SOURCE_OPTIONS if o.arg == "poll_timeout"]
    assert parsed.poll_timeout == poll.default / 1000
    # groupIdPrefix declares no default (set with kafka.group.id it is an error); its table
    # shows the one the source takes
    assert GROUP_ID_PREFIX.default is None
    assert GROUP_ID_PREFIX.shown_default == f"`{DEFAULT_GROUP_PREFIX}`"
    assert parsed.group_id.startswith(DEFAULT_GROUP_PREFIX + "-")


def test_an_object_store_wal_path_is_taken_as_the_docs_say() -> None:
    (wal,) = [o for o in KAFKA_SOURCE_OPTIONS if o.spark == "walPath"]
    assert "s3://" in wal.help and "refused" not in wal.help
    parsed = KafkaSourceOptions.from_options({**MINIMAL, "walPath": "s3://bucket/wal",
                                              "storage.region": "us-east-1"})
    assert parsed.wal_path == "s3://bucket/wal"
