"""Misconfiguration and secrets against the real broker (issue 23, items 4 and 5).

The broker of the fixtures has one PLAINTEXT listener. A client configured for SASL
(``SASL_PLAINTEXT`` or ``SASL_SSL``) against it, and a client of an address where nothing
listens, must each fail with one clear error within ``connectTimeout`` (30 s, the default)
counted from the start of the call: the mismatch named first, the bootstrap address, no
secret. Then the source and the sink run in Spark with a password that is a unique marker;
the marker must appear in no error, no log record, no console output, no file under the
WAL and checkpoint directories, and no output of the CLI.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from connectors import cli
from connectors.core.errors import ConnectorError, KafkaSinkError, KafkaSourceError
from connectors.kafka.sink import KafkaSink
from connectors.kafka.source.clusters import Clusters
from connectors.kafka.source.options import KafkaSourceOptions
from connectors.kafka.source.windows import KafkaWindows

#: The product's contract is connectTimeout (30 s); one more second for the test's own work.
BOUND = 31.0
UNREACHABLE = "127.0.0.1:9"
VALUE = pa.schema([("value", pa.binary())])


@pytest.fixture
def marker() -> str:
    return f"pw-{uuid.uuid4().hex}"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    # Everything of ours and librdkafka's lines (routed through Python logging) down to DEBUG.
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="connectors")
    return caplog


def sasl(protocol: str, password: str) -> dict[str, str]:
    return {"kafka.security.protocol": protocol, "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.username": "alice", "kafka.sasl.password": password}


def timed(call: Callable[[], Any], error: type[BaseException]) -> tuple[float, str]:
    began = time.monotonic()
    with pytest.raises(error) as e:
        call()
    return time.monotonic() - began, str(e.value)


def source_first_contact(bootstrap: str, **options: str) -> None:
    opts = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": bootstrap,
                                            "subscribe": "t", **options})
    Clusters(opts).partitions()


def sink_first_contact(bootstrap: str, wal: str, **options: str) -> None:
    sink = KafkaSink.from_options({"kafka.bootstrap.servers": bootstrap, "walPath": wal,
                                   "sink_id": f"s-{uuid.uuid4().hex[:8]}", "topic": "t",
                                   **options})
    sink.check_schema(VALUE)
    sink.check_service()


def assert_no_secret(marker: str, *texts: str) -> None:
    for text in texts:
        assert marker not in text


def assert_no_secret_in_files(marker: str, *roots: str) -> int:
    """Every file under ``roots`` is free of the marker; returns how many were read."""
    read = 0
    for root in roots:
        for d, _dirs, files in os.walk(root):
            for f in files:
                with open(os.path.join(d, f), "rb") as fh:
                    assert marker.encode() not in fh.read(), os.path.join(d, f)
                read += 1
    return read


def cli_output(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        cli.main(list(argv))
    return out.getvalue() + err.getvalue()


# -- the connect bound and the diagnosis --------------------------------------------------------
@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_client_on_a_plaintext_listener_names_the_mismatch(
        protocol: str, kafka_bootstrap: str, tmp_path: Any, marker: str,
        logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    for run, error in (
            (lambda: source_first_contact(kafka_bootstrap, **sasl(protocol, marker)),
             KafkaSourceError),
            (lambda: sink_first_contact(kafka_bootstrap, str(tmp_path / "wal"),
                                        **sasl(protocol, marker)), KafkaSinkError)):
        took, message = timed(run, error)
        assert took < BOUND, f"took {took:.1f}s"
        assert "security protocol mismatch" in message.split(": ", 2)[1], message
        assert kafka_bootstrap in message and f"kafka.security.protocol={protocol}" in message
        assert "does not offer SASL" in message or "does not speak TLS" in message
        assert_no_secret(marker, message)
    out, err = capfd.readouterr()
    assert_no_secret(marker, logs.text, out, err)


@pytest.mark.parametrize("component", ["source", "sink"])
def test_an_unreachable_broker_fails_within_connect_timeout_in_total(
        component: str, tmp_path: Any, marker: str, logs: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    """The default connectTimeout (30 s), from the start of the call: options, the state
    directory's checks, the client and the waiting all count."""
    password = {"kafka.sasl.password": marker}
    if component == "source":
        took, message = timed(lambda: source_first_contact(UNREACHABLE, **password),
                              KafkaSourceError)
    else:
        took, message = timed(lambda: sink_first_contact(UNREACHABLE, str(tmp_path / "w"),
                                                         **password), KafkaSinkError)
    assert 29 < took < BOUND, f"took {took:.1f}s"
    assert f"cannot reach Kafka at {UNREACHABLE} within connectTimeout=30s" in message
    assert "Connection refused" in message  # librdkafka's own reason, not 'transport failure'
    out, err = capfd.readouterr()
    assert_no_secret(marker, message, logs.text, out, err)
    assert "Connect to ipv4#" not in err, "librdkafka's connection logs reached the console"


def test_a_misspelled_property_fails_at_load_in_spark(spark: Any, kafka_bootstrap: str) -> None:
    began = time.monotonic()
    with pytest.raises(Exception) as e:  # noqa: B017 - Spark wraps our OptionError
        (spark.readStream.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
         .option("subscribe", "t").option("kafka.fetch.max.bytez", "1").load())
    assert time.monotonic() - began < 30
    assert "kafka.fetch.max.bytez" in str(e.value) and "kafka.fetch.max.bytes" in str(e.value)


# -- no secret anywhere -------------------------------------------------------------------------
def test_the_source_in_spark_keeps_the_password_secret(
        spark: Any, kafka_bootstrap: str, new_topic: Any, tmp_path: Any, marker: str,
        logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    topic = new_topic()
    wal, checkpoint = str(tmp_path / "wal"), str(tmp_path / "chk")
    began = time.monotonic()
    q = (spark.readStream.format("eo_kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
         .option("subscribe", topic).option("walPath", wal)
         .options(**sasl("SASL_PLAINTEXT", marker)).load()
         .writeStream.format("noop").option("checkpointLocation", checkpoint).start())
    with pytest.raises(Exception) as failed:  # noqa: B017 - Spark's StreamingQueryException
        q.awaitTermination(120)
    took = time.monotonic() - began
    error = str(failed.value)
    assert "security protocol mismatch" in error and kafka_bootstrap in error, error
    assert took < BOUND, f"took {took:.1f}s"
    # KafkaWindows: the same source options, through the batch API.
    windows = KafkaWindows(spark, str(tmp_path / "wal-w"), subscribe=topic,
                           **{"kafka.bootstrap.servers": kafka_bootstrap},
                           **sasl("SASL_PLAINTEXT", marker))
    took, windows_error = timed(windows.next, KafkaSourceError)
    windows.close()
    assert "security protocol mismatch" in windows_error and took < BOUND
    shown = cli_output("wal", "show", wal) + cli_output("wal", "show", wal, "--json") \
        + cli_output("wal", "show", str(tmp_path / "wal-w"))
    out, err = capfd.readouterr()
    assert_no_secret(marker, error, windows_error, repr(windows.options), logs.text, out, err,
                     shown)
    assert assert_no_secret_in_files(marker, wal, checkpoint, str(tmp_path / "wal-w")) > 0


def test_the_sink_in_spark_keeps_the_password_secret(
        spark: Any, kafka_bootstrap: str, new_topic: Any, tmp_path: Any, marker: str,
        logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    topic = new_topic()
    df = spark.range(3).selectExpr("cast(id as string) as value")
    errors = []
    wal_ds, wal_fb, wal_stream = (str(tmp_path / n) for n in ("wal-ds", "wal-fb", "wal-st"))
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "topic": topic,
               **sasl("SASL_PLAINTEXT", marker)}
    # 1. The DataSource (df.write.format("eo_kafka")).
    with pytest.raises(Exception) as e:  # noqa: B017 - Spark wraps our KafkaSinkError
        (df.write.format("eo_kafka").options(**options).option("walPath", wal_ds)
         .option("sink_id", "secret-ds").option("batchId", "0").mode("append").save())
    errors.append(str(e.value))
    # 2. foreachBatch's callable (KafkaSink.write), with its repr.
    sink = KafkaSink.from_options({**options, "walPath": wal_fb, "sink_id": "secret-fb"})
    took, message = timed(lambda: sink.write(df, 0), ConnectorError)
    assert took < BOUND
    errors += [message, repr(sink), str(sink.options)]
    # 3. A streaming query into the DataSource, with a checkpoint.
    checkpoint = str(tmp_path / "chk")
    q = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
         .selectExpr("cast(value as string) as value").writeStream.format("eo_kafka")
         .options(**options).option("walPath", wal_stream).option("sink_id", "secret-st")
         .option("checkpointLocation", checkpoint).start())
    with pytest.raises(Exception) as failed:  # noqa: B017 - Spark's StreamingQueryException
        q.awaitTermination(120)
    errors.append(str(failed.value))
    for text in errors[:2] + errors[-1:]:
        assert "security protocol mismatch" in text and kafka_bootstrap in text, text
    shown = "".join(cli_output("wal", "show", w) for w in (wal_ds, wal_fb, wal_stream)) \
        + cli_output("sink", "reset", "--wal-path", wal_fb, "--sink-id", "secret-fb")
    out, err = capfd.readouterr()
    assert_no_secret(marker, *errors, logs.text, out, err, shown)
    assert assert_no_secret_in_files(marker, wal_ds, wal_fb, wal_stream, checkpoint) > 0
