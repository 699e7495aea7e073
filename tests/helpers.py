"""Shared test utilities: the crash harness for recovery tests and Kafka read-back helpers.

Recovery tests run a pipeline script in a *separate process group* (``start_new_session``)
with ``CONNECTORS_FAILPOINTS`` set and ``CONNECTORS_FAILPOINTS_SCOPE=group``, so a failpoint
reached anywhere (driver or Python worker) SIGKILLs the driver, the JVM and the workers at
once: a real application crash. The script is then started again from the same checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class RunResult:
    returncode: int
    killed: bool
    output: str
    seconds: float


def run_pipeline(
    argv: Sequence[str],
    *,
    failpoint: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
    kill_after: float | None = None,
) -> RunResult:
    """Run ``python <argv>`` as a crashable pipeline process.

    ``failpoint`` (e.g. ``"jdbc.after_stage@2"``) is armed for this run only.
    ``kill_after`` SIGKILLs the whole process group after that many seconds (random-time
    kills). Returns when the process ends; ``killed`` is True if it died of SIGKILL.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["PYSPARK_PYTHON"] = sys.executable
    full_env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    full_env.pop("CONNECTORS_FAILPOINTS", None)
    if failpoint:
        full_env["CONNECTORS_FAILPOINTS"] = failpoint
        full_env["CONNECTORS_FAILPOINTS_SCOPE"] = "group"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, *argv],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=REPO,
    )
    try:
        out, _ = proc.communicate(timeout=kill_after if kill_after is not None else timeout)
    except subprocess.TimeoutExpired:
        with _suppress():
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        if kill_after is None:
            raise AssertionError(
                f"pipeline {argv} did not finish in {timeout}s:\n{_tail(out)}"
            ) from None
    # Reap anything left in the group (Spark's JVM when only the driver Python died).
    with _suppress():
        os.killpg(proc.pid, signal.SIGKILL)
    text = out.decode(errors="replace") if out else ""
    return RunResult(
        returncode=proc.returncode,
        killed=proc.returncode == -signal.SIGKILL,
        output=text,
        seconds=time.monotonic() - started,
    )


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _tail(out: bytes | str | None, n: int = 4000) -> str:
    if not out:
        return ""
    text = out.decode(errors="replace") if isinstance(out, bytes) else out
    return text[-n:]


def assert_exact(actual: Iterable[Any], expected: Iterable[Any], what: str = "output") -> None:
    """Exact multiset comparison with a readable diff: nothing lost, nothing doubled."""
    a, e = Counter(actual), Counter(expected)
    if a == e:
        return
    missing = e - a
    extra = a - e
    raise AssertionError(
        f"{what}: {sum(missing.values())} missing, {sum(extra.values())} extra/duplicated; "
        f"missing sample {list(missing.items())[:5]}, extra sample {list(extra.items())[:5]}"
    )


def read_topic(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 60.0
) -> list[Any]:
    """Every record of every partition, read to partition EOF. Returns confluent-kafka
    Messages."""
    return scan_topic(bootstrap, topic, isolation=isolation, timeout=timeout)[0]


def scan_topic(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 60.0
) -> tuple[list[Any], dict[int, int]]:
    """``(messages, eof_offsets)``: records to partition EOF and the offset EOF was hit at
    per partition (the true end, counting transaction markers)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        done: dict[int, int] = {}
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} to EOF timed out; {len(out)} read")
            for m in consumer.consume(10000, 0.5):
                err = m.error()
                if err is None:
                    out.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    done[m.partition()] = m.offset()
                else:
                    raise AssertionError(f"reading {topic}: {err}")
        return out, done
    finally:
        consumer.close()


def end_offsets_by_scan(bootstrap: str, topic: str) -> dict[int, int]:
    """Per-partition end offsets found by reading to partition EOF (exact on any broker)."""
    return scan_topic(bootstrap, topic, isolation="read_uncommitted")[1]


class RecordingSink:
    """A tiny sink for adapter tests: stages JSON files, commits by writing a log entry.

    Built on the real sink protocol (``connectors.core.sink.BatchSink``); the class is made
    lazily so importing this module does not import pyarrow.
    """

    def __new__(cls, root: str) -> Any:
        return _recording_sink_class()(root)


def _recording_sink_class() -> Any:
    import json
    import uuid

    from connectors.core.sink import BatchSink

    class _Recording(BatchSink):
        family = "recording"

        def __init__(self, root: str) -> None:
            self.root = root

        def stage(self, task: Any, batches: Any) -> Any:
            rows: list[Any] = []
            for b in batches:
                rows.extend(b.to_pylist())
            path = os.path.join(self.root, "staging", f"{task.batch_id}-{task.writer_id}-"
                                f"{uuid.uuid4().hex}.json")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(rows, f, default=str)
            return path

        def commit(self, batch_id: int, messages: Any) -> None:
            if self.is_committed(batch_id):
                return
            rows: list[Any] = []
            for m in messages:
                with open(m) as f:
                    rows.extend(json.load(f))
            os.makedirs(os.path.join(self.root, "log"), exist_ok=True)
            with open(os.path.join(self.root, "log", f"{batch_id:06d}.json"), "w") as f:
                json.dump(rows, f, default=str)

        def abort(self, batch_id: int, messages: Any) -> None:
            return None

        def last_committed(self) -> int | None:
            d = os.path.join(self.root, "log")
            ids = [int(n.split(".")[0]) for n in os.listdir(d)] if os.path.isdir(d) else []
            return max(ids) if ids else None

        def committed_rows(self) -> list[Any]:
            d = os.path.join(self.root, "log")
            out: list[Any] = []
            for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                with open(os.path.join(d, n)) as f:
                    out.extend(json.load(f))
            return out

        @classmethod
        def from_options(cls, options: Any, schema: Any) -> Any:
            return cls(options["path"])

    return _Recording


class FakeClusters:
    """A stand-in for ``connectors.kafka.source.clusters.Clusters`` (no broker): fixed partitions
    and end offsets, earliest = 0, no group offsets; counts its metadata round trips."""

    def __init__(self, latest: dict[tuple[str, str, int], int]) -> None:
        self.ends = dict(latest)
        self.metadata_calls = 0
        self.group_commits: list[dict[tuple[str, str, int], int]] = []

    def partitions(self) -> dict[tuple[str, str, int], None]:
        self.metadata_calls += 1
        return dict.fromkeys(sorted(self.ends))

    def latest(self, tps: list[tuple[str, str, int]]) -> dict[tuple[str, str, int], int]:
        return {tp: self.ends[tp] for tp in tps}

    def earliest(self, tps: list[tuple[str, str, int]]) -> dict[tuple[str, str, int], int]:
        return dict.fromkeys(tps, 0)

    def commit_group(self, offsets: dict[tuple[str, str, int], int]) -> None:
        self.group_commits.append(dict(offsets))

    def close(self) -> None:
        pass


# confluent-kafka's Message constructor leaves a Python error set when timestamp, latency
# or delivery_count is missing (it surfaces later as a SystemError), so the fake always passes them.
_EVENT: dict[str, Any] = {"timestamp": (0, -1), "latency": 0.0, "leader_epoch": 0,
                          "delivery_count": 0}


class FakeConsumer:
    """A stand-in for a confluent-kafka ``Consumer`` of one partition (no broker), for the
    range reader: the log is ``{offset: value}`` (gaps are markers or compacted records),
    ``high`` the end of the log; ``consume`` returns records from the assigned position
    and a partition-EOF event at ``high``, as librdkafka does. Records every ``consume``
    ask in ``asks``."""

    def __init__(self, topic: str, log: dict[int, bytes], high: int, low: int = 0) -> None:
        self.topic, self.log, self.high, self.low = topic, dict(log), high, low
        self.position: int | None = None
        self.asks: list[int] = []
        self._eof_sent = False

    def assign(self, tps: list[Any]) -> None:
        self.position = tps[0].offset
        self._eof_sent = False

    def unassign(self) -> None:
        self.position = None

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        from confluent_kafka import KafkaError, Message

        self.asks.append(num_messages)
        if self.position is None:
            return []
        if self.position < self.low:
            return [Message(topic=self.topic, partition=0, offset=self.position,
                            error=KafkaError(KafkaError.OFFSET_OUT_OF_RANGE), **_EVENT)]
        out: list[Any] = []
        while len(out) < num_messages and self.position < self.high:
            off = self.position
            self.position += 1
            if off in self.log:
                out.append(Message(topic=self.topic, partition=0, offset=off, key=None,
                                   value=self.log[off], timestamp=(1, 1_700_000_000_000 + off),
                                   latency=0.0, leader_epoch=0, delivery_count=0))
        if len(out) < num_messages and self.position >= self.high and not self._eof_sent:
            self._eof_sent = True
            out.append(Message(topic=self.topic, partition=0, offset=self.high,
                               error=KafkaError(KafkaError._PARTITION_EOF), **_EVENT))
        return out

    def get_watermark_offsets(self, tp: Any, timeout: float = 0, cached: bool = False
                              ) -> tuple[int, int]:
        return self.low, self.high

    def close(self) -> None:
        pass


def _overwriting_storage_class() -> Any:
    from connectors.core.storage import LocalStorage

    class _Overwriting(LocalStorage):
        """A local disk whose "create-if-absent" overwrites: what a store that ignores
        ``If-None-Match: *`` does. Only for the probe's own unit test."""

        def create(self, path: str, data: bytes) -> None:
            self.write_atomic(path, data)

        def identity(self) -> Any:
            return ("overwriting",)

    return _Overwriting


class OverwritingStorage:
    def __new__(cls) -> Any:
        return _overwriting_storage_class()()
