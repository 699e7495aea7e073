"""The Spark adapter's driver-side helpers on a Spark Connect session: configuration only,
never the JVM (``_jdf``, ``sparkContext``), which a Connect session does not have. Fakes
stand in for Connect objects; no Spark runs."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from connectors.spark import sink_adapter
from connectors.spark.sink_adapter import is_connect, planned_partitions, warn_if_speculative
from tests.helpers import RecordingSink


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class ConnectSession:
    def __init__(self, **conf: str) -> None:
        self.conf = _Conf(conf)

    @property
    def sparkContext(self) -> Any:  # noqa: N802 - Spark's name
        raise AssertionError("a Connect session has no SparkContext")


class ConnectFrame:
    def __init__(self, session: ConnectSession) -> None:
        self.sparkSession = session

    @property
    def _jdf(self) -> Any:
        raise AssertionError("a Connect DataFrame has no JVM object")


ConnectSession.__module__ = ConnectFrame.__module__ = "pyspark.sql.connect.fake"


def test_planned_partitions_on_connect_reads_the_configuration_only() -> None:
    session = ConnectSession(**{"spark.sql.shuffle.partitions": "8",
                                "spark.default.parallelism": "12"})
    assert is_connect(session) and is_connect(ConnectFrame(session))
    assert planned_partitions(ConnectFrame(session)) == 12
    assert planned_partitions(ConnectFrame(ConnectSession())) == 200  # Spark's default


def test_speculation_warning_reads_the_session_conf(tmp_path, caplog,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_adapter, "_SPECULATION_WARNED", False)
    sink = RecordingSink(str(tmp_path))
    warn_if_speculative(sink, ConnectSession(**{"spark.speculation": "true"}))
    assert not caplog.records  # a sink without a zombie risk: nothing to say
    monkeypatch.setattr(type(sink), "zombie_risk", property(lambda self: "zombies write"))
    with caplog.at_level(logging.WARNING, logger=sink_adapter.__name__):
        warn_if_speculative(sink, ConnectSession(**{"spark.speculation": "false"}))
        assert not caplog.records
        warn_if_speculative(sink, ConnectSession(**{"spark.speculation": "true"}))
    assert "spark.speculation=true: zombies write" in caplog.text
