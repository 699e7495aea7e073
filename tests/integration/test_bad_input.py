"""Bad input, as a new user would type it, across every connector and the CLI (issue 14).

One case per line of ``CASES``: what the user did, the error type it must raise, the words
the message must hold (the option or object, and what is valid), and an upper bound on the
time to fail. Every case then checks that nothing was written or committed and that the
password ``s3cr3t-pw``, which the Kafka and JDBC cases carry, appears neither in the message
nor in any captured log or console output.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from connectors import cli
from connectors.core.errors import (
    BatchOrderError,
    JdbcSinkError,
    KafkaSinkError,
    KafkaSourceError,
    OptionError,
    SinkOwnershipError,
    StorageError,
    UnknownArgumentError,
)
from connectors.core.sink import TaskInfo
from connectors.files.sink import FileSink
from connectors.jdbc.sink import JdbcSink
from connectors.kafka.sink import KafkaSink
from connectors.kafka.source.clusters import Clusters
from connectors.kafka.source.options import KafkaSourceOptions
from connectors.kafka.source.windows import KafkaWindows

SECRET = "s3cr3t-pw"


class CliFailed(Exception):
    """The CLI exited non-zero; the message is what it printed on stderr."""


class SparkFailed(Exception):
    """Spark raised (its own exception type, wrapping ours); the message is Spark's."""


class Env:
    """What one case may use. Services are fixtures asked for lazily, so a case that needs
    no broker does not start one; everything a case creates is checked afterwards."""

    def __init__(self, request: pytest.FixtureRequest, tmp: str) -> None:
        self.request, self.tmp = request, tmp
        self.sink_id = f"s-{uuid.uuid4().hex[:8]}"
        self.out = os.path.join(tmp, "out")
        self.wal = os.path.join(tmp, "wal")
        self.db = os.path.join(tmp, "t.db")
        self.file = os.path.join(tmp, "a-file")
        with open(self.file, "w") as f:
            f.write("not a directory\n")
        self.pg_tables: list[str] = []
        self.topic: str | None = None
        self.missing_topic: str | None = None  # a topic the case must not create
        self.s3_bucket: str | None = None  # a bucket the case must leave empty
        self.baseline: dict[str, Any] = {}

    # -- services -----------------------------------------------------------------------------
    @property
    def spark(self) -> Any:
        return self.request.getfixturevalue("spark")

    @property
    def kafka(self) -> str:
        return self.request.getfixturevalue("kafka_bootstrap")

    def new_topic(self) -> str:
        self.topic = self.request.getfixturevalue("new_topic")()
        return self.topic

    @property
    def s3(self) -> Any:
        return self.request.getfixturevalue("s3_service")

    def s3_url(self, path: str = "out", bucket: str | None = None) -> str:
        """A URL in a fresh bucket of the session's S3 server (checked after the case)."""
        if bucket is None:
            bucket = self.request.getfixturevalue("s3_bucket")
            self.s3_bucket = bucket
        return f"s3://{bucket}/{path}"

    def s3_options(self, **kw: str) -> dict[str, str]:
        o = self.s3.options()
        o.update({f"storage.{k}": v for k, v in kw.items()})
        return {k: v for k, v in o.items() if v != "DROP"}

    def pg(self, password: str = SECRET, user: str = "eo") -> str:
        dsn = self.request.getfixturevalue("postgres_dsn")
        host = dsn.split("@", 1)[1]
        return f"postgresql+psycopg://{user}:{password}@{host}"

    def pg_table(self) -> str:
        name = self.request.getfixturevalue("pg_table")("bad")
        self.pg_tables.append(name)
        return name

    # -- option maps as users write them ------------------------------------------------------
    def ksrc(self, **kw: Any) -> dict[str, str]:
        o = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t",
             "kafka.sasl.password": SECRET}
        o.update({k: str(v) for k, v in kw.items()})
        return {k: v for k, v in o.items() if v != "DROP"}

    def ksink(self, **kw: Any) -> dict[str, str]:
        o = {"kafka.bootstrap.servers": "127.0.0.1:9", "sink_id": self.sink_id,
             "walPath": self.wal, "topic": "t", "kafka.sasl.password": SECRET}
        o.update({k: str(v) for k, v in kw.items()})
        return {k: v for k, v in o.items() if v != "DROP"}

    def jdbc(self, **kw: Any) -> dict[str, str]:
        o = {"url": f"postgresql+psycopg://eo:{SECRET}@127.0.0.1:1/eo_test",
             "table": "t", "sink_id": self.sink_id}
        o.update({k: str(v) for k, v in kw.items()})
        return {k: v for k, v in o.items() if v != "DROP"}

    def files(self, **kw: Any) -> dict[str, str]:
        o = {"path": self.out, "sink_id": self.sink_id}
        o.update({k: str(v) for k, v in kw.items()})
        return {k: v for k, v in o.items() if v != "DROP"}

    # -- helpers for stateful cases -----------------------------------------------------------
    def files_commit(self, sink_id: str, batch_id: int, n: int = 5) -> None:
        sink = FileSink(self.out, sink_id=sink_id)
        sink.commit(batch_id, [sink.stage(TaskInfo(batch_id, 0), iter([ids(n)]))])

    def kafka_commit(self, sink_id: str, batch_id: int) -> None:
        sink = KafkaSink(sink_id, self.wal, bootstrap_servers="127.0.0.1:9", topic="t")
        sink.check_schema(VALUE)
        sink.commit(batch_id, [])

    def mark_baseline(self) -> None:
        """State a stateful case set up on purpose; the check compares against it."""
        self.baseline = snapshot(self)

    # -- addresses where nothing answers (loopback only) ----------------------------------------
    def closed_port(self) -> int:
        """A loopback port nothing listens on (bound, then closed again)."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def silent_port(self) -> int:
        """A loopback listener that accepts connections (the kernel completes them) and never
        says a word, open until the case ends."""
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        self.request.addfinalizer(sock.close)
        return int(sock.getsockname()[1])

    def no_cloud_identity(self) -> None:
        """Every cloud credential chain's instance-identity endpoint at a closed loopback
        port: a case that reaches for one never leaves the machine."""
        mp = self.request.getfixturevalue("monkeypatch")
        closed = f"http://127.0.0.1:{self.closed_port()}"
        mp.setenv("AWS_METADATA_ENDPOINT", closed)
        mp.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed)
        mp.setenv("GCE_METADATA_HOST", closed.split("//", 1)[1])
        mp.setenv("IDENTITY_ENDPOINT", closed)
        mp.setenv("MSI_ENDPOINT", closed)


def ids(n: int, start: int = 100) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(start, start + n))})


VALUE = pa.schema([("value", pa.binary())])
IDS = pa.schema([("id", pa.int64())])


def cli_run(*argv: str) -> None:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(list(argv))
    if code != 2:
        raise AssertionError(f"CLI exited {code}, expected 2: {argv}")
    raise CliFailed(err.getvalue())


def spark_call(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - Spark's wrappers; the case checks the message
        raise SparkFailed(str(e)) from e


def snapshot(env: Env) -> dict[str, Any]:
    """What is committed or visible anywhere a case could have written."""
    state: dict[str, Any] = {}
    if os.path.isdir(env.out):
        visible = []
        for _root, dirs, files in os.walk(env.out):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            visible += [f for f in files if not f.startswith(("_", "."))]
        log = os.path.join(env.out, "_eo_log")
        commits = sorted(os.listdir(log)) if os.path.isdir(log) else []
        state["files"] = (sorted(visible), [c for c in commits if c.endswith(".commit")])
        staging = os.path.join(env.out, "_eo_staging")
        state["staged"] = sorted(os.listdir(staging)) if os.path.isdir(staging) else []
    if env.s3_bucket is not None:
        objects = env.s3.admin().list_objects_v2(Bucket=env.s3_bucket).get("Contents", [])
        if objects:
            state["s3"] = sorted(o["Key"] for o in objects)
    if env.missing_topic is not None:
        from confluent_kafka.admin import AdminClient

        # All topics, none named: a metadata request that names none creates none.
        admin = AdminClient({"bootstrap.servers": env.kafka})
        if env.missing_topic in admin.list_topics(timeout=10).topics:
            state["created_topic"] = env.missing_topic
    commits = os.path.join(env.wal, "commits")
    if os.path.isdir(commits):
        state["wal"] = sorted(os.listdir(commits))
    if os.path.exists(env.db):
        with sqlite3.connect(env.db) as c:
            tables = [r[0] for r in c.execute("select name from sqlite_master where type='table'")]
            # Preparing the metadata table (a row with batch_id -1) is not a commit.
            state["sqlite"] = {t: c.execute(f'select count(*) from "{t}"').fetchone()[0]  # noqa: S608
                               for t in tables if not t.startswith("eo_")}
            done = c.execute("select sink_id, batch_id from eo_sink_commits where batch_id "
                             ">= 0 order by 1").fetchall() if "eo_sink_commits" in tables else []
            if done:
                state["sqlite_commits"] = done
    if env.pg_tables:
        import psycopg
        from psycopg import sql

        with psycopg.connect(env.request.getfixturevalue("postgres_dsn")) as c:
            for t in env.pg_tables:
                if c.execute("select to_regclass(%s)", (t,)).fetchone()[0]:
                    state[f"pg:{t}"] = c.execute(sql.SQL("select count(*) from {}").format(
                        sql.Identifier(t))).fetchone()[0]
    if env.topic:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": env.kafka, "group.id": "bad-input-check"})
        try:
            state["topic"] = c.get_watermark_offsets(TopicPartition(env.topic, 0), timeout=10)[1]
        finally:
            c.close()
    return state


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Env], Any]
    raises: type[BaseException]
    says: tuple[str, ...]
    within: float = 5.0


def C(id: str, run: Callable[[Env], Any], raises: type[BaseException], *says: str,  # noqa: N802
      within: float = 5.0) -> Case:
    return Case(id, run, raises, says, within)


def ksrc(e: Env, **kw: Any) -> Any:
    return KafkaSourceOptions.from_options(e.ksrc(**kw))


def kwin(e: Env, **kw: Any) -> Any:
    wal = kw.pop("walPath", e.wal)
    return KafkaWindows(None, wal, **e.ksrc(**kw))


def ksink(e: Env, schema: pa.Schema = VALUE, **kw: Any) -> Any:
    KafkaSink.from_options(e.ksink(**kw)).check_schema(schema)


def ksink_service(e: Env, **kw: Any) -> Any:
    """The driver's checks before any task: the schema, then the cluster and topic."""
    sink = KafkaSink.from_options(e.ksink(**kw))
    sink.check_schema(VALUE)
    sink.check_service()


def ksink_unknown_topic(e: Env) -> None:
    e.missing_topic = f"missing-{uuid.uuid4().hex[:8]}"
    ksink_service(e, topic=e.missing_topic, failOnUnknownTopic="true",
                  **{"kafka.bootstrap.servers": e.kafka, "kafka.sasl.password": "DROP"})


def jdbc(e: Env, **kw: Any) -> Any:
    return JdbcSink.from_options(e.jdbc(**kw))


def files_s3(e: Env, url: str | None = None, **storage: str) -> None:
    """An ``eo_files`` sink on S3, as a user would set it up: options, then the driver's
    checks before any task (the capability probe among them)."""
    options = {"path": url or e.s3_url(), "sink_id": e.sink_id, **e.s3_options(**storage)}
    FileSink.from_options(options).check_schema(IDS)


def ksink_s3(e: Env, **storage: str) -> None:
    options = e.ksink(walPath=e.s3_url("wal"), **e.s3_options(**storage))
    KafkaSink.from_options(options).check_schema(VALUE)


def kwin_s3(e: Env, **storage: str) -> None:
    options = e.ksrc(**e.s3_options(**storage))
    KafkaWindows(None, e.s3_url("wal"), **options)


def files_no_conditional_writes(e: Env) -> None:
    server = e.request.getfixturevalue("no_conditional_s3")
    options = {f"storage.{k}": v for k, v in server.python_options().items()}
    before = list(_keys(server))
    try:
        FileSink.from_options({"path": f"s3://{server.bucket}/out-{e.sink_id}",
                               **options}).check_schema(IDS)
    finally:
        assert list(_keys(server)) == before, "the probe left objects behind"


def _keys(server: Any) -> list[str]:
    from connectors.core.storage import storage_for, storage_options_from

    storage, root = storage_for(f"s3://{server.bucket}/",
                                options=storage_options_from(server.python_options(), "t"))
    return sorted(storage.walk_files(root))


def files_write_into_a_file(e: Env) -> None:
    """What issue 21 saw a user do: write a DataFrame to a FileSink whose path is a file."""
    FileSink(e.file).write(e.spark.range(3), 0)


def files(e: Env, schema: pa.Schema = IDS, **kw: Any) -> Any:
    FileSink.from_options(e.files(**kw)).check_schema(schema)


def files_foreign(e: Env, batch_id: int) -> None:
    e.files_commit("owner-a", 0)
    e.mark_baseline()
    e.files_commit("intruder-b", batch_id)


def kafka_foreign(e: Env, batch_id: int) -> None:
    e.kafka_commit("owner-a", 0)
    e.mark_baseline()
    sink = KafkaSink("intruder-b", e.wal, bootstrap_servers="127.0.0.1:9", topic="t")
    sink.commit(batch_id, [])


def files_regress(e: Env) -> None:
    for b in range(3):
        e.files_commit(e.sink_id, b)
    e.mark_baseline()
    e.files_commit(e.sink_id, 1)


def kafka_regress(e: Env) -> None:
    for b in range(3):
        e.kafka_commit(e.sink_id, b)
    e.mark_baseline()
    e.kafka_commit(e.sink_id, 0)


def jdbc_regress(e: Env) -> None:
    sink = JdbcSink(f"sqlite:///{e.db}", "t", e.sink_id, create_table=True)
    sink.check_schema(IDS)
    for b in range(3):
        sink.commit(b, [sink.stage(TaskInfo(b, 0), iter([ids(3, b * 3)]))])
    e.mark_baseline()
    sink.commit(0, [sink.stage(TaskInfo(0, 0), iter([ids(3, 50)]))])


def jdbc_connect(e: Env, url: str) -> None:
    sink = JdbcSink(url, e.pg_table(), e.sink_id, create_table=True)
    sink.check_schema(IDS)


def jdbc_nothing_answers(e: Env, port: int, driver: str = "postgresql+psycopg") -> None:
    """A database URL whose host and port nothing answers at, as a user would mistype it:
    the driver's checks before any task, the first contact with the database."""
    JdbcSink(f"{driver}://eo:{SECRET}@127.0.0.1:{port}/eo_test", "t", e.sink_id,
             create_table=True).check_schema(IDS)


def files_s3_nothing_answers(e: Env, port: int) -> None:
    e.no_cloud_identity()
    files_s3(e, endpoint=f"http://127.0.0.1:{port}")


def sqlite_table(e: Env, ddl: str) -> None:
    with sqlite3.connect(e.db) as c:
        c.execute(ddl)
    e.mark_baseline()


def jdbc_drift(e: Env) -> None:
    sqlite_table(e, "create table t (id integer)")
    JdbcSink(f"sqlite:///{e.db}", "t", e.sink_id).check_schema(
        pa.schema([("id", pa.int64()), ("extra_col", pa.string())]))


def spark_kafka_load(e: Env, **kw: Any) -> None:
    spark_call(lambda: e.spark.readStream.format("eo_kafka").options(**e.ksrc(**kw)).load())


def spark_write(e: Env, fmt: str, opts: dict[str, str], value: bool = False) -> None:
    df = e.spark.range(3)
    if value:
        df = df.selectExpr("cast(id as string) as value")
    spark_call(lambda: df.write.format(fmt).options(**opts).option("batchId", "0")
               .mode("append").save())


LONG_ID = "x" * 129
CASES = [
    # -- eo_kafka source (options parsed once, at load) ------------------------------------------
    C("src-no-subscribe", lambda e: ksrc(e, subscribe="DROP"), OptionError, "subscribe", "assign"),
    C("src-two-subscriptions", lambda e: ksrc(e, assign='{"t":[0]}'), OptionError, "assign",
      "only one"),
    C("src-typo-startingOffset", lambda e: ksrc(e, startingOffset="earliest"), OptionError,
      "startingOffset", "did you mean 'startingOffsets'"),
    C("src-typo-failOnDataloss-value", lambda e: ksrc(e, failOnDataLoss="nope"), OptionError,
      "failOnDataLoss", "true"),
    C("src-bad-startingOffsets", lambda e: ksrc(e, startingOffsets="earliset"), OptionError,
      "startingOffsets", "earliest"),
    C("src-maxOffsets-zero", lambda e: ksrc(e, maxOffsetsPerTrigger=0), OptionError,
      "maxOffsetsPerTrigger", ">= 1"),
    C("src-min-above-max", lambda e: ksrc(e, maxOffsetsPerTrigger=5, minOffsetsPerTrigger=9),
      OptionError, "minOffsetsPerTrigger", "maxOffsetsPerTrigger"),
    C("src-bad-duration", lambda e: ksrc(e, maxTriggerDelay="soon"), OptionError,
      "maxTriggerDelay", "10s"),
    C("src-assign-not-json", lambda e: ksrc(e, subscribe="DROP", assign="t:0"), OptionError,
      "assign", "JSON"),
    C("src-auto-commit-refused", lambda e: ksrc(e, **{"kafka.enable.auto.commit": "true"}),
      OptionError, "enable.auto.commit"),
    C("src-walPath-is-file", lambda e: ksrc(e, walPath=e.file), OptionError, "walPath",
      "existing file", "directory"),
    C("src-window-without-wal", lambda e: ksrc(e, **{"eo.window": 1}), OptionError, "eo.window",
      "walPath"),
    C("src-no-servers", lambda e: ksrc(e, **{"kafka.bootstrap.servers": "DROP"}), OptionError,
      "kafka.bootstrap.servers"),
    C("src-timestamp-strategy", lambda e: ksrc(e, startingOffsetsByTimestampStrategy="guess"),
      OptionError, "startingOffsetsByTimestampStrategy", "latest"),
    C("src-s3-wal-credentials-in-url", lambda e: ksrc(e, walPath=f"s3a://AK:{SECRET}@b/wal"),
      OptionError, "walPath", "never in the URL", "storage.*"),
    C("src-spark-load-typo", lambda e: spark_kafka_load(e, maxOffsetPerTrigger=10), SparkFailed,
      "maxOffsetPerTrigger", "did you mean 'maxOffsetsPerTrigger'", within=60),
    C("src-spark-load-no-subscribe", lambda e: spark_kafka_load(e, subscribe="DROP"),
      SparkFailed, "subscribe", within=30),
    C("src-unreachable-broker", lambda e: Clusters(ksrc(e, connectTimeout="2s")).partitions(),
      KafkaSourceError, "127.0.0.1:9", "connectTimeout", "TLS/SASL", within=6),
    C("src-bad-connectTimeout", lambda e: ksrc(e, connectTimeout="0"), OptionError,
      "connectTimeout", ">= 0.1"),
    C("src-unknown-kafka-property", lambda e: ksrc(e, **{"kafka.fetch.max.bytez": "1"}),
      OptionError, "'kafka.fetch.max.bytez'", "did you mean 'kafka.fetch.max.bytes'",
      "CONFIGURATION.md"),
    C("src-bad-security-protocol", lambda e: ksrc(e, **{"kafka.security.protocol": "SASL_SSLL"}),
      OptionError, "'kafka.security.protocol'", "'SASL_SSLL'", "did you mean 'SASL_SSL'"),
    C("src-bad-sasl-mechanism", lambda e: ksrc(e, **{"kafka.sasl.mechanism": "SCRAM-SHA-999"}),
      OptionError, "'kafka.sasl.mechanism'", "SCRAM-SHA-512", "OAUTHBEARER"),
    C("src-bad-kafka-value", lambda e: ksrc(e, **{"kafka.fetch.max.bytes": "lots"}),
      OptionError, "'kafka.fetch.max.bytes'", "invalid value"),
    C("src-sasl-on-plaintext-listener", lambda e: Clusters(ksrc(e, **{
        "kafka.bootstrap.servers": e.kafka, "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.username": "u"})).partitions(),
      KafkaSourceError, "security protocol mismatch", "SASL_PLAINTEXT", "127.0.0.1:",
      within=30),
    C("src-spark-load-unknown-kafka-property", lambda e: spark_kafka_load(
        e, **{"kafka.fetch.max.bytez": "1"}), SparkFailed, "kafka.fetch.max.bytez",
      "kafka.fetch.max.bytes", within=60),
    # -- KafkaWindows ---------------------------------------------------------------------------
    C("win-endingOffsets", lambda e: kwin(e, endingOffsets="latest"), KafkaSourceError,
      "endingOffsets", "per window"),
    C("win-eo-window", lambda e: kwin(e, **{"eo.window": "3"}), KafkaSourceError, "eo.window"),
    C("win-typo", lambda e: kwin(e, maxOffsetPerTrigger="5"), OptionError,
      "maxOffsetPerTrigger", "did you mean 'maxOffsetsPerTrigger'"),
    C("win-walPath-file", lambda e: kwin(e, walPath=e.file), OptionError, "walPath",
      "existing file"),
    C("win-no-subscribe", lambda e: kwin(e, subscribe="DROP"), OptionError, "subscribe"),
    C("win-unknown-kafka-property", lambda e: kwin(e, **{"kafka.fetch.max.bytez": "1"}),
      OptionError, "'kafka.fetch.max.bytez'", "did you mean 'kafka.fetch.max.bytes'"),
    # -- eo_kafka sink --------------------------------------------------------------------------
    C("ksink-typo-transactional", lambda e: ksink(e, transactionl="true"), OptionError,
      "transactionl", "did you mean 'transactional'"),
    C("ksink-no-sink-id", lambda e: ksink(e, sink_id="DROP"), OptionError, "sink_id",
      "required"),
    C("ksink-no-walPath", lambda e: ksink(e, walPath="DROP"), OptionError, "walPath"),
    C("ksink-no-servers", lambda e: ksink(e, **{"kafka.bootstrap.servers": "DROP"}),
      OptionError, "kafka.bootstrap.servers"),
    C("ksink-sink-id-slash", lambda e: ksink(e, sink_id="a/b"), OptionError, "sink_id",
      "A-Z a-z 0-9"),
    C("ksink-sink-id-dotdot", lambda e: ksink(e, sink_id="a..b"), OptionError, "sink_id",
      "'..'"),
    C("ksink-sink-id-leading-dot", lambda e: ksink(e, sink_id=".a"), OptionError, "sink_id",
      "not starting with '.'"),
    C("ksink-sink-id-control", lambda e: ksink(e, sink_id="a\x07b"), OptionError, "sink_id"),
    C("ksink-sink-id-too-long", lambda e: ksink(e, sink_id=LONG_ID), OptionError, "sink_id",
      "1-128"),
    C("ksink-bad-flushTimeout", lambda e: ksink(e, flushTimeout="soon"), OptionError,
      "flushTimeout", "10s"),
    C("ksink-bad-boolean", lambda e: ksink(e, deterministicOrder="maybe"), OptionError,
      "deterministicOrder", "true"),
    C("ksink-unsafe-acks", lambda e: ksink(e, **{"kafka.acks": "1"}), OptionError, "acks"),
    C("ksink-walPath-is-file", lambda e: ksink(e, walPath=e.file), OptionError, "walPath",
      "existing file"),
    C("ksink-no-value-column", lambda e: ksink(e, pa.schema([("v", pa.binary())])),
      KafkaSinkError, "value"),
    C("ksink-key-type", lambda e: ksink(e, pa.schema([("value", pa.binary()),
                                                      ("key", pa.int64())])),
      KafkaSinkError, "key", "int64"),
    C("ksink-no-topic", lambda e: ksink(e, topic="DROP"), KafkaSinkError, "topic"),
    C("ksink-foreign-wal-batch0", lambda e: kafka_foreign(e, 0), SinkOwnershipError,
      "owner-a", "intruder-b", "walPath"),
    C("ksink-foreign-wal-batch7", lambda e: kafka_foreign(e, 7), SinkOwnershipError,
      "owner-a", "intruder-b"),
    C("ksink-new-checkpoint", kafka_regress, BatchOrderError, "batch 0", "last committed batch 2",
      "new checkpoint", "sink reset --wal-path"),
    C("ksink-unreachable-broker", lambda e: ksink_service(e, connectTimeout="2s"),
      KafkaSinkError, "127.0.0.1:9", "connectTimeout", "TLS/SASL", within=6),
    C("ksink-spark-unreachable", lambda e: spark_write(e, "eo_kafka", e.ksink(
        connectTimeout="2s"), value=True), SparkFailed, "127.0.0.1:9", "connectTimeout",
      within=30),
    C("ksink-bad-connectTimeout", lambda e: ksink(e, connectTimeout="0"), OptionError,
      "connectTimeout", ">= 0.1"),
    C("ksink-unknown-kafka-property", lambda e: ksink(e, **{"kafka.lingr.ms": "5"}),
      OptionError, "'kafka.lingr.ms'", "did you mean 'kafka.linger.ms'"),
    C("ksink-bad-security-protocol", lambda e: ksink(e, **{"kafka.security.protocol": "SSLL"}),
      OptionError, "'kafka.security.protocol'", "did you mean 'SSL'"),
    C("ksink-kwarg-unknown-kafka-property", lambda e: KafkaSink(
        e.sink_id, e.wal, bootstrap_servers="127.0.0.1:9",
        kafka_options={"fetch.max.bytez": 1, "sasl.password": SECRET}),
      OptionError, "kafka_options[\"fetch.max.bytez\"]", "fetch.max.bytes"),
    C("ksink-sasl-ssl-on-plaintext-listener", lambda e: ksink_service(e, **{
        "kafka.bootstrap.servers": e.kafka, "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": "u"}),
      KafkaSinkError, "security protocol mismatch", "SASL_SSL", "does not speak TLS",
      within=30),
    C("ksink-bad-flush_timeout", lambda e: KafkaSink(e.sink_id, e.wal, bootstrap_servers=e.kafka,
                                                     topic="t", flush_timeout=-5),
      OptionError, "flush_timeout", "> 0", "-5"),
    C("ksink-bad-batchProduce", lambda e: ksink(e, batchProduce="sometimes"), OptionError,
      "batchProduce", "sometimes"),
    C("ksink-unknown-topic-refused", ksink_unknown_topic, KafkaSinkError, "missing-",
      "does not exist", "failOnUnknownTopic", within=20),
    C("ksink-kwarg-typo", lambda e: KafkaSink(e.sink_id, e.wal, transactionl=True),
      UnknownArgumentError, "transactionl", "did you mean 'transactional'"),
    C("ksink-spark-typo", lambda e: spark_write(e, "eo_kafka", e.ksink(transactionl="true")),
      SparkFailed, "transactionl", "did you mean 'transactional'", within=60),
    # -- eo_jdbc --------------------------------------------------------------------------------
    C("jdbc-kwarg-typo", lambda e: JdbcSink(f"sqlite:///{e.db}", "t", e.sink_id,
                                            create_tabel=True),
      UnknownArgumentError, "create_tabel", "did you mean 'create_table'"),
    C("jdbc-no-url", lambda e: jdbc(e, url="DROP"), OptionError, "url", "SQLAlchemy URL"),
    C("jdbc-unknown-driver", lambda e: jdbc(e, url=f"postgresql+nosuch://eo:{SECRET}@h/db"),
      OptionError, "url", "nosuch", "postgresql+psycopg"),
    C("jdbc-unsupported-db", lambda e: jdbc(e, url=f"oracle://eo:{SECRET}@h/db"), OptionError,
      "url", "oracle", "PostgreSQL"),
    C("jdbc-sqlite-memory", lambda e: jdbc(e, url="sqlite://"), OptionError, "url", "in-memory"),
    C("jdbc-not-a-url", lambda e: jdbc(e, url="not a url"), OptionError, "url"),
    C("jdbc-no-sink-id", lambda e: jdbc(e, sink_id="DROP"), OptionError, "sink_id", "required"),
    C("jdbc-sink-id-slash", lambda e: jdbc(e, sink_id="../x"), OptionError, "sink_id", "1-128"),
    C("jdbc-bad-mode", lambda e: jdbc(e, mode="merge"), OptionError, "mode", "upsert"),
    C("jdbc-upsert-no-keys", lambda e: jdbc(e, mode="upsert"), OptionError, "keys"),
    C("jdbc-accumulate-no-columns", lambda e: jdbc(e, mode="accumulate", keys="id"),
      OptionError, "accumulate"),
    C("jdbc-statement-in-append", lambda e: jdbc(e, statement="insert into t values (:id)"),
      OptionError, "statement", "mode=sql"),
    C("jdbc-isolation-none", lambda e: jdbc(e, isolationLevel="NONE"), OptionError,
      "isolationLevel", "READ_COMMITTED"),
    C("jdbc-typo-createTable", lambda e: jdbc(e, createTabel="true"), OptionError, "createTabel",
      "did you mean 'createTable'"),
    C("jdbc-no-table", lambda e: jdbc(e, table="DROP"), OptionError, "table"),
    C("jdbc-bad-metadataTable", lambda e: jdbc(e, metadataTable="a b c"), OptionError,
      "metadataTable"),
    C("jdbc-batchSize-zero", lambda e: jdbc(e, batchSize=0), OptionError, "batchSize", ">= 1"),
    C("jdbc-wrong-password", lambda e: jdbc_connect(e, e.pg(password=SECRET)), JdbcSinkError,
      "password authentication failed", within=5),
    C("jdbc-unknown-role", lambda e: jdbc_connect(e, e.pg(user="no_such_role")), JdbcSinkError,
      "no_such_role", within=5),
    C("jdbc-closed-port", lambda e: jdbc_nothing_answers(e, 1), JdbcSinkError,
      "cannot reach the database", "at 127.0.0.1:1 within", "connectTimeout=5s",
      "option 'url'", within=10),
    C("jdbc-silent-host", lambda e: jdbc_nothing_answers(e, e.silent_port()), JdbcSinkError,
      "cannot reach the database", "127.0.0.1:", "connectTimeout=5s", "option 'url'",
      within=10),
    C("jdbc-mysql-silent-host", lambda e: jdbc_nothing_answers(e, e.silent_port(),
                                                              "mysql+pymysql"),
      JdbcSinkError, "cannot reach the database", "mysql+pymysql://eo:***@127.0.0.1:",
      "connectTimeout=5s", within=10),
    C("jdbc-column-not-in-table", jdbc_drift, JdbcSinkError, "extra_col", "'t'"),
    C("jdbc-new-checkpoint", jdbc_regress, BatchOrderError, "batch 0", "last committed batch 2",
      "eo_sink_commits", "sink reset --url"),
    C("jdbc-spark-no-sink-id", lambda e: spark_write(e, "eo_jdbc", e.jdbc(sink_id="DROP")),
      SparkFailed, "sink_id", within=60),
    # -- eo_files -------------------------------------------------------------------------------
    C("files-kwarg-typo", lambda e: FileSink(e.out, partitionBy="day"), UnknownArgumentError,
      "partitionBy", "did you mean 'partition_by'"),
    C("files-no-path", lambda e: files(e, path="DROP"), OptionError, "path", "hdfs://"),
    C("files-path-is-file", lambda e: files(e, path=e.file), OptionError, "path",
      "existing file", "directory"),
    C("files-bad-format", lambda e: files(e, format="xml"), OptionError, "format", "parquet"),
    C("files-typo-partitionBy", lambda e: files(e, partitonBy="id"), OptionError, "partitonBy",
      "did you mean 'partitionBy'"),
    C("files-partition-column-missing", lambda e: files(e, partitionBy="day"), OptionError,
      "partitionBy", "day", "valid columns"),
    C("files-negative-maxRecords", lambda e: files(e, maxRecordsPerFile=-1), OptionError,
      "maxRecordsPerFile", ">= 0"),
    C("files-sink-id-dotdot", lambda e: files(e, sink_id=".."), OptionError, "sink_id", "'..'"),
    C("files-path-is-file-write", files_write_into_a_file, OptionError, "option 'path'",
      "existing file", "give a directory"),
    C("files-object-store-no-conditional", lambda e: files(e, path="oss://bucket/out"),
      OptionError, "path", "Alibaba OSS", "s3://"),
    C("files-s3-no-bucket", lambda e: files_s3(e, e.s3_url(bucket=f"nope-{uuid.uuid4().hex[:8]}")),
      StorageError, "S3 bucket 'nope-", "does not exist", within=30),
    C("files-s3-wrong-credentials", lambda e: files_s3(e, secretAccessKey=SECRET), StorageError,
      "S3 bucket", "credentials were not accepted", "SignatureDoesNotMatch", within=30),
    C("files-s3-unreachable", lambda e: files_s3_nothing_answers(e, 9), StorageError,
      "S3 bucket", "unreachable", "http://127.0.0.1:9", "storage.endpoint",
      "storage.connectTimeout=5s", within=10),
    C("files-s3-silent-endpoint", lambda e: files_s3_nothing_answers(e, e.silent_port()),
      StorageError, "S3 bucket", "unreachable", "http://127.0.0.1:", "storage.endpoint",
      "storage.connectTimeout=5s", within=10),
    C("files-s3-no-conditional-writes", files_no_conditional_writes, StorageError,
      "no-conditional-writes", "does not enforce create-if-absent", "If-None-Match",
      within=30),
    C("files-s3-typo", lambda e: files_s3(e, endpiont="http://x"), OptionError,
      "storage.endpiont", "did you mean 'storage.endpoint'"),
    C("files-s3-half-credentials", lambda e: files_s3(e, accessKeyId="DROP",
                                                      secretAccessKey=SECRET),
      OptionError, "storage.* options", "AccessKeyId"),
    C("files-s3-sparkMetadata-off", lambda e: FileSink.from_options(
        {"path": e.s3_url(), "sparkMetadata": "false", **e.s3_options()}),
      OptionError, "sparkMetadata", "object-store"),
    C("files-spark-s3-wrong-credentials", lambda e: spark_write(
        e, "eo_files", {"path": e.s3_url(), "sink_id": e.sink_id,
                        **e.s3_options(secretAccessKey=SECRET)}),
      SparkFailed, "credentials were not accepted", within=60),
    C("ksink-s3-wrong-credentials", lambda e: ksink_s3(e, secretAccessKey=SECRET), StorageError,
      "S3 bucket", "credentials were not accepted", within=30),
    C("ksink-s3-no-bucket", lambda e: KafkaSink.from_options(e.ksink(
        walPath=e.s3_url("wal", bucket=f"nope-{uuid.uuid4().hex[:8]}"),
        **e.s3_options())).check_schema(VALUE), StorageError, "does not exist", within=30),
    C("kwin-s3-unreachable", lambda e: (e.no_cloud_identity(),
                                        kwin_s3(e, endpoint="http://127.0.0.1:9")),
      StorageError, "unreachable", "127.0.0.1:9", "storage.connectTimeout", within=10),
    C("ksrc-s3-typo", lambda e: ksrc(e, walPath="s3://b/wal", **{"storage.regoin": "x"}),
      OptionError, "storage.regoin", "did you mean 'storage.region'"),
    C("files-bad-compression", lambda e: files(e, compression="zip"), OptionError,
      "compression"),
    C("files-foreign-path-batch0", lambda e: files_foreign(e, 0), SinkOwnershipError, "owner-a",
      "intruder-b", "output path"),
    C("files-foreign-path-batch9", lambda e: files_foreign(e, 9), SinkOwnershipError, "owner-a",
      "intruder-b"),
    C("files-new-checkpoint", files_regress, BatchOrderError, "batch 1",
      "last committed batch 2", "sink reset --path"),
    C("files-spark-typo", lambda e: spark_write(e, "eo_files", e.files(partitonBy="id")),
      SparkFailed, "partitonBy", "did you mean 'partitionBy'", within=60),
    # -- CLI ------------------------------------------------------------------------------------
    C("cli-status-unknown-dialect", lambda e: cli_run("sink", "status", "--url",
                                                      f"nosuchdb://eo:{SECRET}@h/db"),
      CliFailed, "dialect"),
    C("cli-status-no-table", lambda e: (sqlite_table(e, "create table other (x int)"),
                                        cli_run("sink", "status", "--url",
                                                f"sqlite:///{e.db}")),
      CliFailed, "no table 'eo_sink_commits'"),
    C("cli-status-unknown-sink", lambda e: (jdbc_regress_setup(e),
                                            cli_run("sink", "status", "--url", f"sqlite:///{e.db}",
                                                    "--sink-id", "nope")),
      CliFailed, "no row for sink 'nope'"),
    C("cli-status-wrong-password", lambda e: cli_run("sink", "status", "--url",
                                                     e.pg(password=SECRET)),
      CliFailed, "password authentication failed"),
    C("cli-files-status-not-ours", lambda e: (empty_out(e), cli_run("files", "status", e.out)),
      CliFailed, "no _eo_log"),
    C("cli-lag-unreachable", lambda e: cli_run("lag", "--bootstrap", "127.0.0.1:9", "--group",
                                               "g", "--timeout", "2"),
      CliFailed, "127.0.0.1:9", "'g'", "reachable", within=8),
    C("cli-files-status-file", lambda e: cli_run("files", "status", e.file), CliFailed,
      "is a file"),
    C("cli-wal-show-file", lambda e: cli_run("wal", "show", e.file), CliFailed, "is a file"),
    C("cli-wal-show-missing", lambda e: cli_run("wal", "show", e.wal), CliFailed,
      "does not exist"),
    C("cli-reset-two-targets", lambda e: cli_run("sink", "reset", "--sink-id", "x", "--path",
                                                 e.out, "--wal-path", e.wal),
      CliFailed, "exactly one of --url"),
    C("cli-reset-foreign", lambda e: (e.kafka_commit("owner-a", 0), e.mark_baseline(),
                                      cli_run("sink", "reset", "--wal-path", e.wal,
                                              "--sink-id", "intruder-b")),
      CliFailed, "owner-a", "intruder-b"),
    C("cli-reset-nothing", lambda e: (empty_out(e), cli_run("sink", "reset", "--path", e.out)),
      CliFailed, "nothing to reset"),
]


def empty_out(e: Env) -> None:
    os.makedirs(e.out)
    e.mark_baseline()


def jdbc_regress_setup(e: Env) -> None:
    sink = JdbcSink(f"sqlite:///{e.db}", "t", e.sink_id, create_table=True)
    sink.check_schema(IDS)
    e.mark_baseline()


def test_the_table_is_big_enough():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, request: pytest.FixtureRequest, tmp_path: Any,
                   caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    env = Env(request, str(tmp_path))
    for needs, fixture in (("spark", "spark"), ("pg(", "postgres_dsn")):
        if needs in case.id or (needs == "pg(" and "password" in case.id):
            request.getfixturevalue(fixture)  # start services before the clock runs
    if "spark" in case.id:
        request.getfixturevalue("spark")
    if "-s3-" in case.id:
        request.getfixturevalue("s3_service")  # the server's start is not the case's time
    # Everything our code logs, down to DEBUG; other libraries from INFO (py4j's DEBUG wire
    # log echoes every argument the test itself hands to Spark, secrets included).
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="connectors")
    began = time.monotonic()
    with pytest.raises(case.raises) as info:
        case.run(env)
    took = time.monotonic() - began
    message = str(info.value)
    for part in case.says:
        assert part.lower() in message.lower(), f"{part!r} not in: {message}"
    assert took <= case.within, f"took {took:.1f}s (bound {case.within}s)"
    out, err = capfd.readouterr()
    for text in (message, caplog.text, out, err):
        assert SECRET not in text
    assert "Connect to ipv4#" not in err, "librdkafka's connection logs reached the console"
    assert snapshot(env) == env.baseline, "the failed input wrote or committed something"
