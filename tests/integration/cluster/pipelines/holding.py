"""Test-only sinks that hold one task open *after* its stage step, so a test can kill the
executor JVM, the worker or the driver at a known point of a batch (cluster fault tests).

``EO_TEST_HOLD=<family>@<batch>`` (``kafka``, ``files`` or ``jdbc``) and
``EO_TEST_HOLD_DIR=<dir>`` reach the executors through ``spark.executorEnv.*``. The first
attempt of writer 0 of that batch stages as usual (the Kafka sink has produced and flushed
its rows; the file sink has its files on HDFS), then writes ``<dir>/held`` with its pid and
sleeps until it is killed. The file is created with O_EXCL, so the task holds once only:
its retry, or the same batch after a driver restart, runs straight through.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from connectors.core.sink import TaskInfo
from connectors.files.sink import FileSink
from connectors.jdbc.sink import JdbcSink
from connectors.kafka.sink import KafkaSink

HELD = "held"


def _hold(family: str, task: TaskInfo) -> None:
    spec = os.environ.get("EO_TEST_HOLD", "")
    where = os.environ.get("EO_TEST_HOLD_DIR")
    if not spec or not where or spec != f"{family}@{task.batch_id}":
        return
    if task.writer_id != 0 or task.attempt != 0:
        return
    try:
        fd = os.open(os.path.join(where, HELD + ".tmp"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()} {family} {task.batch_id} {task.writer_id}".encode())
    os.close(fd)
    os.rename(os.path.join(where, HELD + ".tmp"), os.path.join(where, HELD))
    deadline = time.monotonic() + 300  # the test kills us long before
    while time.monotonic() < deadline:
        time.sleep(0.5)


class HoldingKafkaSink(KafkaSink):
    def stage(self, task: TaskInfo, batches: Iterator[Any]) -> Any:
        report = super().stage(task, batches)
        _hold("kafka", task)
        return report


class HoldingFileSink(FileSink):
    def stage(self, task: TaskInfo, batches: Iterator[Any]) -> Any:
        message = super().stage(task, batches)
        _hold("files", task)
        return message


class HoldingJdbcSink(JdbcSink):
    def stage(self, task: TaskInfo, batches: Iterator[Any]) -> Any:
        message = super().stage(task, batches)
        _hold("jdbc", task)
        return message
