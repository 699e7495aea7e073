"""eo_jdbc commit scopes (``commitScope``) without a network: the option, the pieces of the
task and prepared protocols, MariaDB's rendered INSERTs, and a model-based test of
``commitScope=task`` on an SQLite file (docs/design.md "JDBC sink", steps 4 and 2)."""

from __future__ import annotations

import datetime as dt
import os
import pickle
import shutil
import sqlite3
import tempfile
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from connectors.core import failpoints
from connectors.core.errors import FailpointError, JdbcSinkError, OptionError
from connectors.core.sink import TaskInfo
from connectors.jdbc import mysqlbulk
from connectors.jdbc.options import JdbcSinkOptions
from connectors.jdbc.scopes import (
    Prepared,
    Written,
    claim_mismatches,
    txn_name,
    txn_prefix,
)
from connectors.jdbc.sink import JdbcSink

BASE = {"url": "sqlite:////tmp/x.db", "table": "t", "sink_id": "s1"}
SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])


# -- the option ------------------------------------------------------------------------------
def test_commit_scope_is_declared_once_with_batch_by_default() -> None:
    assert JdbcSinkOptions.from_options(BASE).commit_scope == "batch"
    assert JdbcSinkOptions.from_options({**BASE, "commitscope": "TASK"}).commit_scope == "task"
    sink = JdbcSink("postgresql://u@h/db", "t", "s", commit_scope="prepared")
    assert sink.options.commit_scope == "prepared"
    assert sink.options.tasks_table == "eo_sink_commits_tasks"


@pytest.mark.parametrize(("options", "fragment"), [
    ({"commitScope": "row"}, "'batch', 'task', 'prepared'"),
    ({"commitScope": "prepared"}, "needs PostgreSQL"),
    ({"commitScope": "prepared", "url": "postgresql://u@h/db", "mode": "upsert", "keys": "k"},
     "writes mode 'append' only"),
])
def test_a_wrong_commit_scope_names_the_option_and_what_is_valid(options: dict[str, str],
                                                                 fragment: str) -> None:
    with pytest.raises(OptionError) as e:
        JdbcSinkOptions.from_options({**BASE, **options})
    assert "commitScope" in str(e.value) and fragment in str(e.value)


def test_the_python_argument_is_named_in_its_errors() -> None:
    with pytest.raises(OptionError, match="commit_scope"):
        JdbcSink("sqlite:////tmp/x.db", "t", "s", mode="accumulate", keys="k",
                 accumulate="n", commit_scope="prepared")


def test_messages_are_small_and_picklable() -> None:
    for m in (Written(1, 500, earlier=True), Prepared(0, 7, "eo_x_1_0_5")):
        assert pickle.loads(pickle.dumps(m)) == m


# -- the pieces --------------------------------------------------------------------------------
@pytest.mark.parametrize(("reported", "claims", "bad"), [
    ({0: 10, 1: 5}, {0: 10, 1: 5}, {}),
    ({0: 10}, {0: 10, 1: 5}, {1: (0, 5)}),  # an earlier run's writer 1: a changed split
    ({0: 10, 1: 5}, {0: 10}, {1: (5, None)}),  # a claim lost (a second writer deleted it)
    ({0: 10}, {0: 9}, {0: (10, 9)}),
    ({}, {}, {}),
])
def test_claims_must_be_exactly_the_reports(reported: dict[int, int], claims: dict[int, int],
                                            bad: dict[int, Any]) -> None:
    assert claim_mismatches(reported, claims) == bad


def test_prepared_transaction_names_are_the_sink_s_and_short() -> None:
    sink_id = "x" * 128
    name = txn_name(sink_id, 12345678901, 999, (1 << 62) - 1)
    assert name.startswith(txn_prefix(sink_id)) and len(name) < 200
    assert txn_prefix("a") != txn_prefix("b")
    assert name[len(txn_prefix(sink_id)):].split("_") == ["12345678901", "999",
                                                          str((1 << 62) - 1)]


@pytest.mark.parametrize("escapes", [True, False])
def test_mariadb_literals_escape_every_string(escapes: bool) -> None:
    strings = pa.array(["plain", "it's", "back\\slash", "nul\x00byte", "", None, "é \"q\""])
    got = mysqlbulk.literals(strings, escapes).to_pylist()
    if escapes:
        assert got == ["'plain'", "'it\\'s'", "'back\\\\slash'", "'nul\\0byte'", "''", "NULL",
                       "'é \"q\"'"]
    else:  # NO_BACKSLASH_ESCAPES: a backslash is itself, a quote is doubled
        assert got == ["'plain'", "'it''s'", "'back\\slash'", "'nul\x00byte'", "''", "NULL",
                       "'é \"q\"'"]


def test_mariadb_literals_of_other_types() -> None:
    ts = pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 600000), None],
                  pa.timestamp("us", tz="UTC"))
    assert mysqlbulk.literals(ts, True).to_pylist() == ["'2024-01-02 03:04:05.600000'", "NULL"]
    assert mysqlbulk.literals(pa.array([True, False, None]), True).to_pylist() == [
        "1", "0", "NULL"]
    assert mysqlbulk.literals(pa.array([1, -2, None], pa.int64()), True).to_pylist() == [
        "1", "-2", "NULL"]
    assert mysqlbulk.literals(pa.array([1.5, None]), True).to_pylist() == ["1.5", "NULL"]
    assert mysqlbulk.literals(pa.array([dt.date(2024, 2, 29)]), True).to_pylist() == [
        "'2024-02-29'"]
    assert not mysqlbulk.renderable(pa.binary()) and not mysqlbulk.renderable(
        pa.list_(pa.int64()))


def test_mariadb_statements_are_cut_near_their_size() -> None:
    rows = pa.array(["(" + "x" * 998 + ")"] * 10_000)  # 10 MB of rows
    pieces = list(mysqlbulk._statements(rows))
    assert len(pieces) == 3 and all(len(p) <= mysqlbulk.STATEMENT_BYTES for p in pieces)
    assert sum(p.count("(") for p in pieces) == 10_000


# -- commitScope=task on SQLite ---------------------------------------------------------------
def rows_of(batch: int, writer: int, mode: str) -> list[tuple[str, int]]:
    """Writer w's rows of batch b: append rows are all distinct; accumulate rows share keys
    across writers (both tasks add to every key) and repeat keys within a task."""
    if mode == "append":
        return [(f"b{batch}w{writer}r{i}", batch * 100 + writer * 10 + i) for i in range(3)]
    return [(f"k{i % 3}", batch * 100 + writer * 10 + i) for i in range(4)]


def arrow(rows: list[tuple[str, int]]) -> pa.RecordBatch:
    return pa.record_batch({"k": [r[0] for r in rows], "n": [r[1] for r in rows]},
                           schema=SCHEMA)


class TaskScopeModel(RuleBasedStateMachine):
    """The events Spark and the database can produce around one task-scope batch at a time:
    a task attempt that commits and reports, fails before its commit, or commits and fails
    before its report reaches the driver (the retry must not write again); a late attempt
    of a committed batch (a zombie); the driver's commit, its replay, an abort. The promise
    (the invariants): the target holds each row of the committed batches once, plus, of the
    batch in flight, exactly the rows of the writers whose attempt committed, once; the
    commit row names the last commit; no claim of a committed batch is left."""

    WRITERS = (0, 1)
    mode = "append"

    def __init__(self) -> None:
        super().__init__()
        # In memory where there is /dev/shm: SQLite fsyncs every commit (10 ms on a disk).
        self.dir = tempfile.mkdtemp(prefix="eo-scope-",
                                    dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.db = os.path.join(self.dir, "t.db")
        keyed = {"keys": "k", "accumulate": "n"} if self.mode == "accumulate" else {}
        self.sink = JdbcSink(f"sqlite:///{self.db}", "t", f"s{uuid.uuid4().hex[:6]}",
                             mode=self.mode, create_table=True, commit_scope="task",
                             retry_timeout=0, **keyed)
        self.sink.check_schema(SCHEMA)
        self.batch = 0
        self.last: int | None = None
        self.winners: dict[int, Any] = {}
        self.written: set[int] = set()  # writers of the batch in flight whose rows committed
        self.old_messages: list[Any] = []

    def teardown(self) -> None:
        self.sink.database.dialect.engine().dispose()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _attempt(self, batch: int, writer: int, fail_at: str | None = None) -> Any:
        if fail_at:
            os.environ[failpoints.ENV] = f"{fail_at}@{batch}!raise"
        failpoints.reload()
        try:
            return self.sink.stage(TaskInfo(batch, writer),
                                   iter([arrow(rows_of(batch, writer, self.mode))]))
        finally:
            os.environ.pop(failpoints.ENV, None)
            failpoints.reload()

    @rule(writer=st.sampled_from(WRITERS))
    def attempt_succeeds(self, writer: int) -> None:
        m = self._attempt(self.batch, writer)
        assert isinstance(m, Written) and m.rows == len(rows_of(self.batch, writer, self.mode))
        assert m.earlier == (writer in self.written)
        self.written.add(writer)
        self.winners.setdefault(writer, m)

    @rule(writer=st.sampled_from(WRITERS),
          point=st.sampled_from(["jdbc.before_stage", "jdbc.task_written",
                                 "jdbc.before_stage_commit"]))
    def attempt_fails_before_its_commit(self, writer: int, point: str) -> None:
        if writer in self.written and point == "jdbc.task_written":
            # The claim is found before the rows would be written: nothing to fail.
            assert self._attempt(self.batch, writer, point).earlier
            return
        with pytest.raises((JdbcSinkError, FailpointError), match=point.split(".")[1]):
            self._attempt(self.batch, writer, point)

    @rule(writer=st.sampled_from(WRITERS))
    def attempt_commits_and_its_report_is_lost(self, writer: int) -> None:
        with pytest.raises((JdbcSinkError, FailpointError), match="after_stage"):
            self._attempt(self.batch, writer, "jdbc.after_stage")
        self.written.add(writer)

    @precondition(lambda self: self.last is not None)
    @rule(writer=st.sampled_from(WRITERS))
    def zombie_of_the_committed_batch(self, writer: int) -> None:
        m = self._attempt(self.last or 0, writer)
        assert m == Written(writer, 0, committed=True)

    @precondition(lambda self: len(self.winners) == 2)
    @rule()
    def commit(self) -> None:
        messages = [self.winners[w] for w in self.WRITERS]
        self.sink.commit(self.batch, messages)
        self.old_messages = messages
        self.last, self.batch = self.batch, self.batch + 1
        self.winners, self.written = {}, set()

    @precondition(lambda self: self.last is not None)
    @rule()
    def replay_of_the_committed_batch(self) -> None:
        self.sink.commit(self.last or 0, self.old_messages)

    @rule()
    def abort(self) -> None:
        """The batch failed in Spark: its committed tasks stay; the retried batch skips them."""
        self.sink.abort(self.batch, list(self.winners.values()))
        self.winners = {}

    # -- the promises --------------------------------------------------------------------
    def _expected(self) -> Counter[tuple[str, int]]:
        rows: list[tuple[str, int]] = []
        for b in range(self.last + 1 if self.last is not None else 0):
            for w in self.WRITERS:
                rows += rows_of(b, w, self.mode)
        for w in self.written:
            rows += rows_of(self.batch, w, self.mode)
        if self.mode == "append":
            return Counter(rows)
        sums: Counter[str] = Counter()
        for k, n in rows:
            sums[k] += n
        return Counter({(k, n): 1 for k, n in sums.items()})

    @invariant()
    def target_holds_exactly_what_committed(self) -> None:
        with sqlite3.connect(self.db) as c:
            got = Counter(c.execute("select k, n from t").fetchall())
        assert got == self._expected()

    @invariant()
    def the_commit_row_names_the_last_commit_and_no_old_claim_is_left(self) -> None:
        with sqlite3.connect(self.db) as c:
            (stored,) = c.execute("select batch_id from eo_sink_commits where sink_id = ?",
                                  (self.sink.options.sink_id,)).fetchone()
            claims = c.execute("select batch_id, writer_id from eo_sink_commits_tasks where "
                               "sink_id = ?", (self.sink.options.sink_id,)).fetchall()
        assert stored == (self.last if self.last is not None else -1)
        assert sorted(claims) == sorted((self.batch, w) for w in self.written)


class AccumulateTaskScopeModel(TaskScopeModel):
    mode = "accumulate"


MODEL_SETTINGS = settings(derandomize=True, max_examples=12, stateful_step_count=20,
                          deadline=None)
TestTaskScopeAppend = TaskScopeModel.TestCase
TestTaskScopeAppend.settings = MODEL_SETTINGS
TestTaskScopeAccumulate = AccumulateTaskScopeModel.TestCase
TestTaskScopeAccumulate.settings = MODEL_SETTINGS


def test_the_model_catches_a_retry_that_writes_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break one rule on purpose (a claim that never says "taken"): the model must fail."""
    from connectors.jdbc import metadata

    monkeypatch.setattr(metadata.TasksTable, "claim", lambda *a, **k: None)
    machine = TaskScopeModel()
    try:
        machine.attempt_succeeds(0)
        machine._attempt(0, 0)  # a retry of writer 0: under the broken claim, it writes
        with pytest.raises(AssertionError):
            machine.target_holds_exactly_what_committed()
    finally:
        machine.teardown()




def test_sink_reset_forgets_the_claims_of_the_stopped_query(tmp_path: Any) -> None:
    """A task of batch 1 committed, then the query stopped for good and ``sink reset`` ran:
    the new query's batch 1 is new input, and its task 0 must write, not find the old
    claim and skip."""
    from connectors.jdbc import admin

    url = f"sqlite:///{tmp_path / 't.db'}"
    sink = JdbcSink(url, "t", "s", mode="append", create_table=True, commit_scope="task")
    sink.check_schema(SCHEMA)
    sink.commit(0, [sink.stage(TaskInfo(0, w), iter([arrow(rows_of(0, w, "append"))]))
                    for w in (0, 1)])
    assert sink.stage(TaskInfo(1, 0), iter([arrow(rows_of(1, 0, "append"))])).rows == 3
    assert admin.reset(url, "s") == 0
    fresh = [sink.stage(TaskInfo(b, 0), iter([arrow([("new", b)])])) for b in (0, 1)]
    assert [m.earlier for m in fresh] == [False, False]
