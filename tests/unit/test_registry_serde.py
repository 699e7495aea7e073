"""serde.FORMATS: a format whose dependencies are an extra is refused, when they are missing,
with the install command and the option that chose it (source and sink alike)."""

from __future__ import annotations

import dataclasses

import pytest

from connectors.core.errors import KafkaSinkError, OptionError
from connectors.kafka.registry import serde, sink_formats, source_formats


@pytest.fixture
def protobuf_missing(monkeypatch):
    def load() -> serde.Format:
        raise ImportError("No module named 'google.protobuf'")

    entry = dataclasses.replace(serde.FORMATS["protobuf"], load=load)
    monkeypatch.setattr(serde, "FORMATS", {**serde.FORMATS, "protobuf": entry})


def test_the_source_names_the_option_and_the_extra(protobuf_missing):
    with pytest.raises(OptionError, match=r'valueFormat=protobuf needs the protobuf package: '
                                          r'pip install "pyspark-exactly-once\[protobuf\]"'):
        source_formats._format("protobuf", "value")


def test_the_sink_names_the_options_and_the_extra(protobuf_missing):
    with pytest.raises(KafkaSinkError, match=r"keyFormat=protobuf needs the protobuf package"):
        sink_formats._format("protobuf")


def test_a_base_format_that_fails_to_import_is_not_called_an_extra(monkeypatch):
    def load() -> serde.Format:
        raise ImportError("broken install")

    entry = dataclasses.replace(serde.FORMATS["avro"], load=load)
    monkeypatch.setattr(serde, "FORMATS", {**serde.FORMATS, "avro": entry})
    with pytest.raises(ImportError, match="broken install"):
        source_formats._format("avro", "value")
