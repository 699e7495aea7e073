"""One rule for every system's retry budgets (docs/design.md, "Retry budgets: one rule"):
the tables of docs/deploying.md are generated from the declarations, every remote system has
a short first contact and a long outage budget, and the first contact itself (which answers
count, how long silence is given, what the error says) on the shared helper.

``UPDATE_DOCS=1 pytest tests/unit/test_retry_budgets.py`` rewrites the tables.
"""

from __future__ import annotations

import os
import re
import socket
import time
from typing import Any

import pytest

from connectors.core import contact
from connectors.core.declared import DURATION, Opt
from connectors.core.errors import JdbcSinkError, StorageError
from connectors.core.storage import storage_for, storage_options_from
from connectors.core.storage.options import docs_table as storage_table
from connectors.jdbc.sink import JdbcSink
from connectors.retry_budgets import BUDGETS
from connectors.retry_budgets import docs_table as budgets_table

DEPLOYING = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                         "docs", "deploying.md")


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    contact.forget()
    yield
    contact.forget()


@pytest.mark.parametrize(("kind", "name", "generate"), [
    ("budgets", "RETRY_BUDGETS", budgets_table),
    ("options", "STORAGE_OPTIONS", storage_table),
])
def test_the_deploying_tables_are_generated_from_the_declarations(kind: str, name: str,
                                                                  generate: Any) -> None:
    with open(DEPLOYING, encoding="utf-8") as f:
        text = f.read()
    marks = re.compile(rf"(<!-- {kind}: {name} [^\n]*-->\n)(.*?)(<!-- end of {kind} -->)", re.S)
    found = marks.search(text)
    assert found, f"docs/deploying.md has no '<!-- {kind}: {name} ... -->' block"
    generated = generate()
    if os.environ.get("UPDATE_DOCS") == "1" and found.group(2) != generated:
        with open(DEPLOYING, "w", encoding="utf-8") as f:
            f.write(text[:found.start(2)] + generated + text[found.end(2):])
        return
    assert found.group(2) == generated, (
        f"docs/deploying.md's {name} table differs from the declarations; rewrite it with "
        "UPDATE_DOCS=1")


def _seconds(o: Any) -> float | None:
    """A duration option's default in seconds; None for a count."""
    if isinstance(o, Opt):
        if o.spark.endswith("Ms"):
            return float(o.default) / 1000
        return float(o.default) if o.kind is DURATION else None
    return float(o.default) if o.kind == "duration" else None


def test_every_system_has_a_short_first_contact_and_a_long_outage_budget() -> None:
    assert {b.system.split(" ")[0] for b in BUDGETS} >= {
        "Kafka", "PostgreSQL,", "HDFS", "Object", "Local"}
    for b in BUDGETS:
        times = [t for t in map(_seconds, b.outage) if t is not None]
        assert times and min(times) >= 60, b.system
        assert b.sized_for, b.system
        if b.first_contact is not None:
            first = _seconds(b.first_contact)
            assert first is not None and first <= 30, b.system


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_first_contact_asks_again_until_its_bound_and_any_answer_counts() -> None:
    asked: list[float] = []

    def silence(left: float) -> None:
        asked.append(left)
        raise ConnectionRefusedError("refused")

    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"never: \d+ attempts"):
        contact.first_contact("k", silence, timeout=0.3, backoff=0.01, max_backoff=0.05,
                              fail=lambda e, n, s: RuntimeError(f"never: {n} attempts"))
    assert 0.3 <= time.monotonic() - began < 2 and len(asked) > 2
    assert asked[0] > asked[-1]  # each ask is given what is left
    assert not contact.reached("k")

    def refused_password(left: float) -> None:
        raise PermissionError("password authentication failed")

    contact.first_contact("k", refused_password, timeout=5, fail=pytest.fail,
                          answered=lambda e: isinstance(e, PermissionError))
    assert contact.reached("k")
    contact.first_contact("k", lambda left: pytest.fail("asked again"), timeout=5,
                          fail=pytest.fail)  # answered before: nothing to do


def test_a_process_that_runs_tasks_counts_everything_reached() -> None:
    assert not contact.reached(("jdbc", "x"))
    contact.in_task()
    assert contact.reached(("jdbc", "x"))
    contact.forget()
    assert not contact.reached(("jdbc", "x")) and contact.reached(None)


def test_a_database_where_nothing_answers_fails_at_its_connect_timeout() -> None:
    port = _closed_port()
    sink = JdbcSink(f"postgresql+psycopg://eo:s3cr3t@127.0.0.1:{port}/db", "t", "s",
                    connect_timeout=0.5)
    began = time.monotonic()
    with pytest.raises(JdbcSinkError) as raised:
        sink.last_committed()
    took = time.monotonic() - began
    message = str(raised.value)
    assert 0.5 <= took < 3, took
    assert f"127.0.0.1:{port}" in message and "connectTimeout=0.5s" in message, message
    assert "option 'url'" in message and "retryTimeout=120s" in message
    assert "s3cr3t" not in message and "attempts over" in message


def test_a_database_that_answered_before_gets_the_long_budget() -> None:
    port = _closed_port()
    sink = JdbcSink(f"postgresql+psycopg://eo@127.0.0.1:{port}/db", "t", "s",
                    connect_timeout=30, retry_timeout=0.4, retry_backoff=0.05)
    contact.mark(sink.database.contact_key)
    with pytest.raises(JdbcSinkError, match=r"gave up after \d+ attempts in 0\.\ds: "
                       r"retryTimeout=0.4s passed.*raise retryTimeout and maxRetries"):
        sink.last_committed()
    sqlite = JdbcSink("sqlite:////tmp/x.db", "t", "s")
    assert sqlite.database.contact_key is None  # a file: no first contact


def test_a_namenode_where_nothing_answers_fails_at_the_connect_timeout() -> None:
    port = _closed_port()
    storage, root = storage_for(f"webhdfs://127.0.0.1:{port}/wal", options=storage_options_from(
        {"connectTimeout": "300ms"}, "t"))
    began = time.monotonic()
    with pytest.raises(StorageError) as raised:
        storage.exists(root)
    assert time.monotonic() - began < 3
    message = str(raised.value)
    assert f"http://127.0.0.1:{port}" in message and "storage.connectTimeout=0.3s" in message
    assert "storage.retryTimeout=120s" in message and "webhdfsUrl" in message, message
    assert not contact.reached(storage.identity())


@pytest.mark.parametrize(("text", "is_silent", "is_answer"), [
    ("Generic S3 error: Error performing HEAD http://127.0.0.1:1/b/x in 6.2s, after 11 "
     "retries, max_retries: 100, retry_timeout: 5s  - HTTP error: error sending request",
     True, False),  # a closed port: obstore's retries of the refused connection
    ("Generic S3 error: Error performing HEAD http://127.0.0.1:2/b/x in 5.0s - HTTP error: "
     "error sending request", True, False),  # a listener that never answers: timed out
    ("Generic S3 error: Error performing HEAD http://127.0.0.1:3/b/x in 5.3s, after 24 "
     "retries, max_retries: 100, retry_timeout: 5s  - Server returned non-2xx status code: "
     "503 Service Unavailable: ", False, True),  # a store in a brownout answered
    ("Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token in "
     "2ms - HTTP error: error sending request", False, False),  # no credentials: its own words
])
def test_an_object_store_s_silence_is_told_from_its_answers(text: str, is_silent: bool,
                                                            is_answer: bool) -> None:
    from obstore.exceptions import GenericError

    from connectors.core.storage.object_store_errors import answered, silent

    assert (silent(GenericError(text)), answered(GenericError(text))) == (is_silent, is_answer)


def test_a_database_s_silence_is_told_from_its_answers() -> None:
    import psycopg
    import pymysql

    from connectors.jdbc.transient import silent

    assert silent(psycopg.OperationalError('connection failed: connection to server at '
                                           '"127.0.0.1", port 1 failed: Connection refused'))
    assert silent(psycopg.OperationalError("connection timeout expired"))
    assert not silent(psycopg.OperationalError(
        'connection failed: FATAL:  password authentication failed for user "eo"'))
    assert silent(pymysql.err.OperationalError(2003, "Can't connect to MySQL server"))
    assert silent(pymysql.err.OperationalError(2013, "Lost connection (timed out)"))
    assert not silent(pymysql.err.OperationalError(1045, "Access denied for user"))
    assert not silent(pymysql.err.OperationalError(1053, "Server shutdown in progress"))
