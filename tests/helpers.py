"""Shared test utilities: the crash harness for recovery tests, Kafka read-back helpers, and
what fixtures and tests both use (``REQUIRE``/:func:`unavailable`, :func:`announce`,
:func:`wait_for`, the one local :func:`spark_builder`). Tests import these from here, never
from ``tests.conftest``.

Recovery tests run a pipeline script in a *separate process group* (``start_new_session``)
with ``CONNECTORS_FAILPOINTS`` set and ``CONNECTORS_FAILPOINTS_SCOPE=group``, so a failpoint
reached anywhere (driver or Python worker) SIGKILLs the driver, the JVM and the workers at
once: a real application crash. The script is then started again from the same checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

log = logging.getLogger("tests.services")

#: Under ``CI=true`` or ``CONNECTORS_REQUIRE_SERVICES=1`` a missing service fails the test.
REQUIRE = os.environ.get("CI", "").lower() == "true" or os.environ.get(
    "CONNECTORS_REQUIRE_SERVICES", ""
) in ("1", "true")


def unavailable(what: str, why: str) -> None:
    """Skip, or fail under CI=true / CONNECTORS_REQUIRE_SERVICES=1."""
    import pytest

    message = f"{what} unavailable: {why}"
    if REQUIRE:
        pytest.fail(message + " (required: CI=true or CONNECTORS_REQUIRE_SERVICES=1)",
                    pytrace=False)
    pytest.skip(message)


def announce(request: Any, line: str) -> None:
    """One line in pytest's own output (the CI log), not swallowed by output capture."""
    workeroutput = getattr(request.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller prints it (conftest.py)
        workeroutput.setdefault("announce", []).append(line)
        log.info(line)
        return
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None:
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            reporter.write_line(line)
    log.info(line)


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2,
             what: str = "condition") -> Any:
    """Poll ``condition`` until truthy or fail after ``timeout`` seconds (never a fixed sleep):
    the product's ``poll_until``, failing the test at the timeout."""
    from connectors.core.retry import poll_until

    value = poll_until(condition, timeout=timeout, interval=interval)
    if not value:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
    return value


#: The JVM flags of every Spark JVM the tests start (drivers, executors, the Connect server):
#: C1 only and the serial collector. A test's JVM lives for seconds to a few minutes and its
#: rows' work runs in Python workers, so C2's compile threads and G1's parallel threads are
#: spent on a JVM that ends before they pay back. Measured on this 2-core machine: a local
#: session's start, one shuffle and one Arrow UDF over 20,000 rows took 24-28 s of CPU with
#: the defaults and 11.5-17 s with these. ``EO_TEST_JVM_OPTIONS`` replaces them (set it empty
#: for the JDK's defaults). Not for the benchmarks, which measure long runs with the defaults.
TEST_JVM_FLAGS = os.environ.get("EO_TEST_JVM_OPTIONS",
                                "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def jvm_options() -> str:
    """The options of a Spark JVM of this virtualenv's pyspark: :data:`TEST_JVM_FLAGS`, and
    the class-data-sharing archive of Spark's classes once a test made it
    (tests/services/spark_cds.py; not when ``EO_TEST_JVM_OPTIONS`` chose the flags)."""
    if "EO_TEST_JVM_OPTIONS" in os.environ:
        return TEST_JVM_FLAGS
    from tests.services import spark_cds

    path = spark_cds.archive_path()
    if path is None or not path.exists():
        return TEST_JVM_FLAGS
    return f"{TEST_JVM_FLAGS} -XX:SharedArchiveFile={path}"


def prepare_spark_jvms() -> None:
    """Make the archive :func:`jvm_options` names, if it is missing, and have Spark's Python
    workers import pyspark from site-packages (tests/services/spark_workers.py); in a test's
    process, before it starts Spark: never inside a pipeline that may be killed."""
    from tests.services import spark_workers

    spark_workers.ensure()
    if "EO_TEST_JVM_OPTIONS" not in os.environ:
        from tests.services import spark_cds

        spark_cds.ensure(TEST_JVM_FLAGS)


def spark_builder(app: str = "eo-tests", master: str = "local[2]", **conf: str) -> Any:
    """The one local SparkSession builder of the tests and their pipeline scripts: UI off,
    2 shuffle partitions, Arrow on, 2 GiB driver, :func:`jvm_options`; ``conf`` adds or
    overrides settings."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.memory": "2g",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.driver.extraJavaOptions": jvm_options(),
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder


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
    prepare_spark_jvms()
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
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 60.0,
    now: bool = False,
) -> list[Any]:
    """Every record of every partition, read to partition EOF. Returns confluent-kafka
    Messages. ``now``: see :func:`scan_topic`."""
    return scan_topic(bootstrap, topic, isolation=isolation, timeout=timeout, now=now)[0]


def scan_topic(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 60.0,
    now: bool = False,
) -> tuple[list[Any], dict[int, int]]:
    """``(messages, eof_offsets)``: records to partition EOF and the offset EOF was hit at
    per partition (the true end, counting transaction markers).

    ``read_committed`` ends a partition only where its EOF reaches the high watermark the
    partition had when the read began: ``EndTxn`` is answered once the coordinator logged
    the commit, before it writes the markers, so right after a commit a ``read_committed``
    EOF can still stand at the last stable offset, short of the committed records (CI saw
    20,004 of 100,000 unread that way). A transaction left open never reaches it: the read
    times out. ``now=True`` reads what a ``read_committed`` reader sees at this moment, to
    each partition's last stable offset, while a transaction is deliberately open."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    def consumer_of(level: str) -> Any:
        return Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": level, "auto.offset.reset": "earliest"})

    deadline = time.monotonic() + timeout
    consumer = consumer_of(isolation)
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        ends = {p: 0 for p in parts}
        if isolation == "read_committed" and not now:
            # The watermark query speaks the consumer's isolation level: ask uncommitted.
            probe = consumer_of("read_uncommitted")
            try:
                ends = {p: _high_watermark(probe, TopicPartition(topic, p), deadline)
                        for p in parts}
            finally:
                probe.close()
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        done: dict[int, int] = {}
        out: list[Any] = []
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                short = {p: (done.get(p), ends[p]) for p in parts if p not in done}
                raise AssertionError(f"reading {topic} to EOF timed out; {len(out)} read; "
                                     f"partitions short of their end (eof, end): {short}")
            for m in consumer.consume(10000, 0.5):
                err = m.error()
                if err is None:
                    out.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= ends[m.partition()]:
                        done[m.partition()] = m.offset()
                else:
                    raise AssertionError(f"reading {topic}: {err}")
        return out, done
    finally:
        consumer.close()


def _high_watermark(consumer: Any, tp: Any, deadline: float) -> int:
    """``tp``'s high watermark, asked again until ``deadline`` while librdkafka has no
    answer: right after a node stopped or came back it answers a partition it has just
    listed ``_UNKNOWN_PARTITION`` or ``LEADER_NOT_AVAILABLE`` while the leader moves."""
    from confluent_kafka import KafkaException

    while True:
        try:
            return int(consumer.get_watermark_offsets(
                tp, timeout=max(1.0, min(10.0, deadline - time.monotonic())), cached=False)[1])
        except KafkaException as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"the high watermark of {tp.topic}[{tp.partition}]: "
                                     f"{e}") from e
            time.sleep(0.5)


def group_offsets(bootstrap: str, group: str, timeout: float = 30.0,
                  conf: dict[str, Any] | None = None) -> dict[tuple[str, int], int]:
    """``group``'s committed offsets on every topic, read as ``lag`` reads them: a consumer
    of the group (``kafka/lookup``), with ``require_stable``. Never the admin's
    ListConsumerGroupOffsets: librdkafka dereferences a NULL group when it is answered
    NOT_COORDINATOR (a coordinator still loading on a new broker; librdkafka #5040) and the
    test process dies of SIGSEGV, as the secured tier's did."""
    from connectors.kafka import lookup

    settings = {**(conf or {}), "bootstrap.servers": bootstrap}
    looker = lookup.consumer(settings)
    client = lookup.consumer(settings, group, isolation="read_committed")
    try:
        topics = lookup.all_topics(looker, timeout)
        return lookup.committed(client, [(t, p) for t, parts in topics.items() for p in parts],
                                timeout)
    finally:
        client.close()
        looker.close()


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
        #: ends answered (one per ask, first first) before ``ends``: a stale node's answers
        self.stale_ends: list[dict[tuple[str, str, int], int]] = []
        self.fresh_asks = 0

    def partitions(self) -> dict[tuple[str, str, int], None]:
        self.metadata_calls += 1
        return dict.fromkeys(sorted(self.ends))

    def latest(self, tps: list[tuple[str, str, int]],
               fresh: bool = False) -> dict[tuple[str, str, int], int]:
        self.fresh_asks += fresh
        ends = self.stale_ends.pop(0) if self.stale_ends else self.ends
        return {tp: ends.get(tp, self.ends[tp]) for tp in tps}

    def earliest(self, tps: list[tuple[str, str, int]]) -> dict[tuple[str, str, int], int]:
        return dict.fromkeys(tps, 0)

    def commit_group(self, offsets: dict[tuple[str, str, int], int]) -> None:
        self.group_commits.append(dict(offsets))

    def commit_group_soon(self, offsets: dict[tuple[str, str, int], int]) -> None:
        self.commit_group(offsets)

    def settle_group_commit(self) -> None:
        pass

    def close(self) -> None:
        pass


# confluent-kafka's Message constructor leaves a Python error set when timestamp, latency
# or delivery_count is missing (it surfaces later as a SystemError), so the fake always passes them.
_EVENT: dict[str, Any] = {"timestamp": (0, -1), "latency": 0.0, "leader_epoch": 0,
                          "delivery_count": 0}


class _FakePartition:
    def __init__(self, log: dict[int, bytes], high: int, low: int) -> None:
        self.log, self.high, self.low = dict(log), high, low
        self.position: int | None = None
        self.paused = False
        self.eof_sent = False
        self.failed = False  # an offset error stops the partition until it is assigned again


class FakeConsumer:
    """A stand-in for a confluent-kafka ``Consumer`` (no broker), for the range reader.

    ``FakeConsumer(topic, log, high, low=0)`` holds partition 0 of ``topic``;
    :meth:`partitions` makes one of several: each log is ``{offset: value}`` (gaps are
    markers or compacted records), ``high`` the end of the log. ``consume`` serves the
    assigned, unpaused partitions in rounds of up to ``chunk`` records each, in
    ``reversed`` partition order when asked (as fetch responses interleave), with a
    partition-EOF event at ``high``, as librdkafka does. Records every ``consume`` ask in
    ``asks``, every pause in ``pauses`` and every incremental unassign in ``unassigned``."""

    def __init__(self, topic: str, log: dict[int, bytes], high: int, low: int = 0,
                 *, chunk: int = 1 << 30, reverse: bool = False) -> None:
        self.parts = {(topic, 0): _FakePartition(log, high, low)}
        self.topic = topic
        self.chunk, self.reverse = chunk, reverse
        self.asks: list[int] = []
        self.pauses: list[tuple[str, int]] = []
        self.unassigned: list[tuple[str, int]] = []

    @classmethod
    def partitions(cls, logs: dict[tuple[str, int], tuple[dict[int, bytes], int]],
                   **kw: Any) -> FakeConsumer:
        """``{(topic, partition): (log, high)}``."""
        fake = cls("", {}, 0, **kw)
        fake.parts = {tp: _FakePartition(log, high, 0) for tp, (log, high) in logs.items()}
        return fake

    def assign(self, tps: list[Any]) -> None:
        self.unassign()
        self.incremental_assign(tps)

    def incremental_assign(self, tps: list[Any]) -> None:
        for tp in tps:
            part = self.parts[(tp.topic, tp.partition)]
            part.position, part.eof_sent, part.failed = tp.offset, False, False

    def incremental_unassign(self, tps: list[Any]) -> None:
        for tp in tps:
            self.parts[(tp.topic, tp.partition)].position = None
            self.unassigned.append((tp.topic, tp.partition))

    def unassign(self) -> None:
        for part in self.parts.values():
            part.position = None

    def pause(self, tps: list[Any]) -> None:
        for tp in tps:
            self.parts[(tp.topic, tp.partition)].paused = True
            self.pauses.append((tp.topic, tp.partition))

    def resume(self, tps: list[Any]) -> None:
        for tp in tps:
            self.parts[(tp.topic, tp.partition)].paused = False

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        from confluent_kafka import KafkaError, Message

        self.asks.append(num_messages)
        out: list[Any] = []
        order = sorted(self.parts, reverse=self.reverse)
        progress = True
        while len(out) < num_messages and progress:
            progress = False
            for (topic, partition) in order:
                part = self.parts[(topic, partition)]
                if (part.position is None or part.paused or part.failed
                        or len(out) >= num_messages):
                    continue
                if part.position < part.low:
                    part.failed = True
                    out.append(Message(topic=topic, partition=partition, offset=part.position,
                                       error=KafkaError(KafkaError.OFFSET_OUT_OF_RANGE),
                                       **_EVENT))
                    continue
                served = 0
                while (len(out) < num_messages and served < self.chunk
                       and part.position < part.high):
                    off = part.position
                    part.position += 1
                    if off in part.log:
                        served += 1
                        out.append(Message(topic=topic, partition=partition, offset=off,
                                           key=None, value=part.log[off],
                                           timestamp=(1, 1_700_000_000_000 + off),
                                           latency=0.0, leader_epoch=0, delivery_count=0))
                progress = progress or served > 0
                if (len(out) < num_messages and part.position >= part.high
                        and not part.eof_sent):
                    part.eof_sent = True
                    out.append(Message(topic=topic, partition=partition, offset=part.high,
                                       error=KafkaError(KafkaError._PARTITION_EOF), **_EVENT))
        return out

    def get_watermark_offsets(self, tp: Any, timeout: float = 0, cached: bool = False
                              ) -> tuple[int, int]:
        part = self.parts[(tp.topic, tp.partition)]
        return part.low, part.high

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


class FakeGroupConsumer:
    """A stand-in for the consumer of ``connectors.kafka.lookup`` (no broker).

    ``topics``: ``{name: partition count}``; ``topic_errors``: ``{name: KafkaError code}``
    for topics whose metadata carries an error (a name in neither is unknown);
    ``offsets``: the group's committed ``{(topic, partition): offset}``; ``ends``:
    ``{(topic, partition): end}`` (0 when absent). ``committed_errors`` are raised by the
    next ``committed()`` calls, one each, and ``events`` are the errors ``poll()`` returns
    from the consumer's queue (where a denied FindCoordinator lands). Calls are recorded in
    ``calls``."""

    def __init__(self, topics: dict[str, int], offsets: dict[tuple[str, int], int] | None = None,
                 ends: dict[tuple[str, int], int] | None = None,
                 topic_errors: dict[str, int] | None = None) -> None:
        self.topics, self.topic_errors = dict(topics), dict(topic_errors or {})
        self.offsets, self.ends = dict(offsets or {}), dict(ends or {})
        self.committed_errors: list[int] = []
        self.events: list[int] = []
        self.calls: list[tuple[Any, ...]] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        from types import SimpleNamespace

        from confluent_kafka import KafkaError

        self.calls.append(("list_topics", topic))

        def meta(name: str) -> Any:
            if name in self.topics:
                return SimpleNamespace(topic=name, error=None,
                                       partitions=dict.fromkeys(range(self.topics[name])))
            code = self.topic_errors.get(name, KafkaError.UNKNOWN_TOPIC_OR_PART)
            return SimpleNamespace(topic=name, partitions={}, error=KafkaError(code))

        names = [topic] if topic is not None else list(self.topics)
        return SimpleNamespace(topics={n: meta(n) for n in names})

    def committed(self, partitions: list[Any], timeout: float = -1) -> list[Any]:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        self.calls.append(("committed", len(partitions), timeout))
        if self.committed_errors:
            raise KafkaException(KafkaError(self.committed_errors.pop(0)))
        return [TopicPartition(tp.topic, tp.partition,
                               self.offsets.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def poll(self, timeout: float = -1) -> Any:
        from confluent_kafka import KafkaError, Message

        if not self.events:
            return None
        return Message(error=KafkaError(self.events.pop(0)), **_EVENT)

    def get_watermark_offsets(self, tp: Any, timeout: float = -1,
                              cached: bool = False) -> tuple[int, int]:
        self.calls.append(("end", tp.topic, tp.partition))
        return 0, self.ends.get((tp.topic, tp.partition), 0)

    def close(self) -> None:
        self.calls.append(("close",))


#: Spark's ``spark.task.maxFailures``: attempts of one task before the job fails.
SPARK_TASK_ATTEMPTS = 4


def run_task_as_spark(sink: Any, batch_id: int, rows: Any, writer: int = 0) -> list[str]:
    """Stage one task of ``sink`` as Spark does (a failed attempt is retried with the next
    attempt number, up to :data:`SPARK_TASK_ATTEMPTS`), then commit the batch; the errors
    of the failed attempts."""
    from connectors.core.sink import TaskInfo

    errors = []
    for attempt in range(SPARK_TASK_ATTEMPTS):
        try:
            report = sink.stage(TaskInfo(batch_id, writer, attempt),
                                iter(rows.to_batches(max_chunksize=10_000)))
        except Exception as e:  # noqa: BLE001 - Spark retries any task failure
            errors.append(f"attempt {attempt}: {type(e).__name__}: {e}")
            if attempt == SPARK_TASK_ATTEMPTS - 1:
                raise
            continue
        sink.commit(batch_id, [report])
        return errors
    raise AssertionError("unreachable")


def assert_topic_exact(bootstrap: str, topic: str, tags: dict[str, int]) -> None:
    """Every ``<tag>-<i:08d>`` value for ``i < n`` once in ``topic``, read
    ``read_committed`` to the end of every partition (a hanging transaction fails the
    read)."""
    messages, _ = scan_topic(bootstrap, topic, isolation="read_committed", timeout=120)
    counts = Counter(m.value() for m in messages)
    expected = {f"{tag}-{i:08d}".encode() for tag, n in tags.items() for i in range(n)}
    doubled = sum(c - 1 for c in counts.values() if c > 1)
    missing = len(expected - set(counts))
    stray = len(set(counts) - expected)
    assert (doubled, missing, stray) == (0, 0, 0), (
        f"{topic}: {len(messages)} records for {len(expected)} values: {doubled} doubled, "
        f"{missing} missing, {stray} unexpected")


def jdbc_counts(dsn: str, table: str) -> dict[str, int]:
    """``key -> n`` of an accumulating JDBC sink's table, read with psycopg ({} while the
    sink has not made it yet)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        try:
            rows = conn.execute(sql.SQL("select key, n from {}").format(
                sql.Identifier(table))).fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    return {k: int(n) for k, n in rows}
