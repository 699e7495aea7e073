"""The Spark adapter's driver-side helpers on a Spark Connect session: configuration only,
never the JVM (``_jdf``, ``sparkContext``), which a Connect session does not have. Fakes
stand in for Connect objects; no Spark runs."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from connectors.core.sink import BatchSink
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


class _Offset(BatchSink):
    """A sink a reset moved 10 batches on; it records what the adapter hands it."""

    family = "offset"

    def __init__(self, root: str) -> None:
        self.seen: list[tuple[str, int]] = []

    def abort(self, batch_id: int, messages: Any) -> None:
        self.seen.append(("abort", batch_id))

    def last_committed(self) -> int | None:
        return None

    def batch_offset(self) -> int:
        return 10

    def admit(self, batch_id: int) -> bool:
        self.seen.append(("admit", batch_id))
        return False  # a replay: the adapter must stop before touching the DataFrame

    def stage(self, task: Any, batches: Any) -> Any:
        self.seen.append(("stage", task.batch_id))
        return "m"

    def commit(self, batch_id: int, messages: Any) -> None:
        self.seen.append(("commit", batch_id))


def test_adapter_admits_in_the_sinks_numbering_before_touching_the_dataframe(tmp_path):
    sink = _Offset(str(tmp_path))
    sink_adapter.write_dataframe(sink, ConnectFrame(ConnectSession()), 3)
    assert sink.seen == [("admit", 13)]


def test_foreach_batch_refusal_comes_before_any_spark_work(tmp_path):
    from connectors.core.errors import SinkOwnershipError
    from connectors.core.sink import TaskInfo
    from connectors.files.sink import FileSink

    out = str(tmp_path / "out")
    a = FileSink(out, sink_id="a")
    a.commit(0, [a.stage(TaskInfo(0, 0), iter([]))])
    with pytest.raises(SinkOwnershipError):
        sink_adapter.write_dataframe(FileSink(out, sink_id="b"), ConnectFrame(ConnectSession()), 0)


def test_stream_writer_maps_spark_batch_ids_on_both_planes(tmp_path, monkeypatch):
    class Ctx:
        def getLocalProperty(self, key: str) -> str:  # noqa: N802 - Spark's name
            assert key == sink_adapter.BATCH_ID_PROPERTY
            return "3"

        def partitionId(self) -> int:  # noqa: N802
            return 0

        def attemptNumber(self) -> int:  # noqa: N802
            return 0

    monkeypatch.setattr(sink_adapter.TaskContext, "get", staticmethod(lambda: Ctx()))
    sink = _Offset(str(tmp_path))
    writer = sink_adapter.SinkStreamWriter(sink)
    message = writer.write(iter([]))
    writer.commit([message], 3)
    assert sink.seen == [("stage", 13), ("commit", 13)]
