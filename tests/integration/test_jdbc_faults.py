"""eo_jdbc rides through its database's faults (issue 43), on PostgreSQL and MariaDB.

Each database is a throwaway server of this module's own (``tests/services``), which
``tests/nemesis.py`` kills, crashes and stops without disturbing any other test; a
``SqlProxy`` in front of it holds a COMMIT or its answer. Every result is read back with the
database's own command-line client (``psql``, ``mariadb``) and compared with the truth: the
target's rows, the commit row, and an empty staging table.

1. The connection killed by the server at every step of the protocol, on the sink's direct
   API (what Spark's tasks and driver call), the step held by a ``pause`` failpoint
   (``HeldStep``) while ``pg_terminate_backend`` / ``KILL CONNECTION`` ends the session:
   staging (``jdbc.before_stage``, ``jdbc.before_stage_commit``, ``jdbc.after_stage``) and
   commit (``jdbc.after_lock`` ... ``jdbc.before_commit``, ``jdbc.after_commit``), on both
   databases with accumulate (row staging); on PostgreSQL also append (binary COPY blocks).
2. During COMMIT, where the client cannot know the outcome: the session ended with the
   COMMIT held before the server (not committed) and with its answer held after the server
   committed; for the staging and the commit transactions.
3. Other sessions: a row lock held past ``lock_timeout``, a deadlock, a concurrent update
   under SERIALIZABLE (PostgreSQL) or snapshot isolation (MariaDB).
4. The server SIGKILLed between staging and commit (durable and, on PostgreSQL, UNLOGGED
   staging), and a server down longer than the retry budget: a clear error, then exact.
5. Streaming through real Spark (``writeStream.format("eo_jdbc")``): the query stays up
   through killed sessions, a SIGKILLed server and a stopped one (30 s on PostgreSQL), and
   its output is exact; an outage past the budget ends it with the error, and the restarted
   query is exact.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from connectors.core.errors import JdbcSinkError
from connectors.core.sink import TaskInfo
from connectors.jdbc.options import staging_name
from connectors.jdbc.scopes import Written, prepared_txns, txn_prefix
from connectors.jdbc.sink import JdbcSink
from tests.helpers import unavailable, wait_for
from tests.nemesis import DatabaseNemesis, HeldStep, MariaDbNemesis, PostgresNemesis
from tests.sql_proxy import SqlProxy

PASSWORD = "s3cret-never-logged"
SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64())])
KEYS = 12
WRITERS = (0, 1)


# -- the servers -------------------------------------------------------------------------------
@dataclass
class Server:
    """A database server of this module's, its nemesis and a proxy in front of it."""

    kind: str  # "postgresql" | "mariadb"
    port: int
    nemesis: DatabaseNemesis
    proxy: SqlProxy
    destroy: Callable[[], None]
    tables: list[str] = field(default_factory=list)

    def url(self, proxied: bool = True, **query: str) -> str:
        """The sink's URL (a user with a password), through the proxy or straight."""
        port = self.proxy.port if proxied else self.port
        if self.kind == "postgresql":
            base = f"postgresql+psycopg://eo_sink:{PASSWORD}@127.0.0.1:{port}/postgres"
        else:
            base = f"mysql+pymysql://eo_sink:{PASSWORD}@127.0.0.1:{port}/test"
        return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")

    def cli(self, statement: str) -> list[list[str]]:
        """Rows from the database's own client (psql, mariadb), as text."""
        if self.kind == "postgresql":
            argv = ["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-h", "127.0.0.1", "-p",
                    str(self.port), "-U", "postgres", "-d", "postgres", "-v",
                    "ON_ERROR_STOP=1", "-c", statement]
        else:
            argv = ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(self.port), "-u",
                    "root", "-N", "-B", "-e", statement, "test"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"{argv[0]}: {out.stderr.strip()}")
        return [line.split("\t") for line in out.stdout.splitlines() if line]

    def admin(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with contextlib.closing(self.nemesis.admin()) as conn:
            cur = conn.cursor()
            cur.execute(statement, params or None)
            return list(cur.fetchall()) if cur.description else []


def _postgres() -> Server:
    from tests.services.postgres import TempPostgres

    # Prepared transactions for commitScope=prepared (PostgreSQL's default is 0).
    pg = TempPostgres({"max_prepared_transactions": "16"}).start()
    nemesis = PostgresNemesis(pg)
    with contextlib.closing(nemesis.admin()) as conn:
        conn.execute(f"CREATE ROLE eo_sink LOGIN PASSWORD '{PASSWORD}'")
        conn.execute("GRANT ALL ON SCHEMA public TO eo_sink")
    proxy = SqlProxy(pg.port, "postgresql").start()
    return Server("postgresql", pg.port, nemesis, proxy, pg.destroy)


def _mariadb() -> Server:
    from tests.services.mariadb import TempMariaDB

    db = TempMariaDB().start()
    nemesis = MariaDbNemesis(db)
    with contextlib.closing(nemesis.admin()) as conn:
        cur = conn.cursor()
        for host in ("%", "localhost"):
            cur.execute(f"CREATE USER 'eo_sink'@'{host}' IDENTIFIED BY '{PASSWORD}'")
            cur.execute(f"GRANT ALL PRIVILEGES ON test.* TO 'eo_sink'@'{host}'")
    proxy = SqlProxy(db.port, "mysql").start()
    return Server("mariadb", db.port, nemesis, proxy, db.destroy)


@pytest.fixture(scope="module")
def servers() -> Iterator[Callable[[str], Server]]:
    """``servers(kind)``: this module's server of that kind, started on first use."""
    started: dict[str, Server] = {}

    def get(kind: str) -> Server:
        if kind not in started:
            need = "psql" if kind == "postgresql" else "mariadb"
            if shutil.which(need) is None:
                unavailable(kind, f"its command-line client {need!r} is not on PATH")
            try:
                started[kind] = _postgres() if kind == "postgresql" else _mariadb()
            except Exception as e:  # noqa: BLE001
                unavailable(kind, f"cannot start a throwaway server: {e}")
        return started[kind]

    yield get
    for s in started.values():
        s.proxy.stop()
        s.destroy()


@pytest.fixture(params=["postgresql", "mariadb"])
def server(request: pytest.FixtureRequest, servers: Callable[[str], Server]) -> Server:
    return servers(request.param)


@pytest.fixture
def postgres(servers: Callable[[str], Server]) -> Server:
    return servers("postgresql")


# -- the sink and the truth ----------------------------------------------------------------
def rows_of(batch: int, writer: int) -> pa.RecordBatch:
    return pa.record_batch({"k": [f"k{i:02d}" for i in range(KEYS)],
                            "n": [(batch + 1) * 100 + writer * 10 + i for i in range(KEYS)]},
                           schema=SCHEMA)


def truth(last: int, mode: str = "accumulate") -> dict[str, int]:
    """``k -> n`` after batches 0..last: accumulate sums; append's rows are summed too."""
    out: dict[str, int] = {}
    for b in range(last + 1):
        for w in WRITERS:
            r = rows_of(b, w).to_pydict()
            for k, n in zip(r["k"], r["n"], strict=True):
                out[k] = out.get(k, 0) + n
    return out


@dataclass
class Subject:
    server: Server
    sink: JdbcSink
    table: str
    mode: str

    def stage(self, batch: int, writer: int) -> Any:
        return self.sink.stage(TaskInfo(batch, writer), iter([rows_of(batch, writer)]))

    def stage_all(self, batch: int) -> list[Any]:
        return [self.stage(batch, w) for w in WRITERS]

    def write(self, batch: int) -> None:
        self.sink.commit(batch, self.stage_all(batch))

    def committed(self) -> int:
        where = f"sink_id = '{self.sink.options.sink_id}'"
        sql = f"SELECT batch_id FROM eo_sink_commits WHERE {where}"  # noqa: S608
        (row,) = self.server.cli(sql)
        return int(row[0])

    def assert_exact(self, last: int) -> None:
        """The target holds exactly batches 0..last (read by the database's own client),
        the commit row says ``last``, and no staged row is left behind."""
        got = {k: int(n) for k, n in self.server.cli(
            f"SELECT k, sum(n) FROM {self.table} GROUP BY k ORDER BY k")}  # noqa: S608
        assert got == truth(last, self.mode), f"{self.server.kind}: not exactly 0..{last}"
        if self.mode == "append":
            (count,) = self.server.cli(f"SELECT count(*) FROM {self.table}")  # noqa: S608
            assert int(count[0]) == (last + 1) * len(WRITERS) * KEYS, "rows doubled or lost"
        assert self.committed() == last
        stage = staging_name(self.sink.options.sink_id)
        for name in (stage, f"{stage}_blocks"):
            if self.server.cli(self._exists(name)):
                (left,) = self.server.cli(f"SELECT count(*) FROM {name}")  # noqa: S608
                assert left == ["0"], f"{name} still holds staged rows"
        sink_id = self.sink.options.sink_id
        if self.sink.options.commit_scope != "batch":
            claims = f"SELECT count(*) FROM eo_sink_commits_tasks WHERE sink_id = '{sink_id}'"  # noqa: S608
            (left,) = self.server.cli(claims)
            assert left == ["0"], "claims or records of committed batches are left"
        if self.server.kind == "postgresql":
            prefix = txn_prefix(sink_id)
            xacts = f"SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE '{prefix}%'"  # noqa: S608
            (left,) = self.server.cli(xacts)
            assert left == ["0"], "prepared transactions are left"

    def _exists(self, name: str) -> str:
        if self.server.kind == "postgresql":
            return f"SELECT 1 FROM pg_tables WHERE tablename = '{name}'"  # noqa: S608
        where = f"table_name = '{name}'"
        return f"SELECT 1 FROM information_schema.tables WHERE {where}"  # noqa: S608


def subject(server: Server, mode: str = "accumulate", proxied: bool = True,
            query: dict[str, str] | None = None, **options: Any) -> Subject:
    """A new sink on a new table, with batch 0 committed."""
    table = f"f_{uuid.uuid4().hex[:10]}"
    server.tables.append(table)
    keyed = {"keys": "k", "accumulate": "n"} if mode == "accumulate" else {}
    sink = JdbcSink(server.url(proxied, **(query or {})), table, f"s_{table}", mode=mode,
                    create_table=True, retry_backoff=0.05, retry_backoff_max=0.5,
                    **keyed, **options)
    sink.check_schema(SCHEMA)
    s = Subject(server, sink, table, mode)
    s.write(0)
    return s


@pytest.fixture
def retries(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The sink's retry log lines so far (``Database.retrying``)."""
    caplog.set_level(logging.WARNING, logger="connectors.jdbc.database")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "connectors.jdbc.database" and "retrying" in r.getMessage()]

    return lines


# -- 1. the connection killed at each step -------------------------------------------------------
STAGE_POINTS = ["jdbc.before_stage", "jdbc.before_stage_commit", "jdbc.after_stage"]
COMMIT_POINTS = ["jdbc.after_lock", "jdbc.after_verify", "jdbc.after_apply",
                 "jdbc.after_record", "jdbc.before_commit", "jdbc.after_commit"]
#: Points where the killed session held the step's open transaction: the step must retry.
IN_TRANSACTION = set(STAGE_POINTS[:2] + COMMIT_POINTS[:5])


def kill_at(s: Subject, point: str, tmp_path: Any) -> None:
    """Batch 1 with the sink's sessions ended by the server while the step stands at
    ``point``; the step then goes on, and must retry when its transaction was lost."""
    held = HeldStep(f"{point}@1", str(tmp_path / f"held-{uuid.uuid4().hex[:6]}"))
    if point in STAGE_POINTS or point == "jdbc.task_written":
        with held.start(lambda: s.stage(1, 0)):
            held.reached()
            assert s.server.nemesis.kill() >= 1
            first = held.result()
        s.sink.commit(1, [first, s.stage(1, 1)])
    else:
        staged = s.stage_all(1)
        with held.start(lambda: s.sink.commit(1, staged)):
            held.reached()
            assert s.server.nemesis.kill() >= 1
            held.result()


@pytest.mark.parametrize("point", STAGE_POINTS + COMMIT_POINTS)
def test_connection_killed_at_each_step(server: Server, point: str, tmp_path: Any,
                                        retries: Callable[[], list[str]]) -> None:
    s = subject(server)
    kill_at(s, point, tmp_path)
    s.assert_exact(1)
    if point in IN_TRANSACTION:
        assert retries(), f"{point}: the lost transaction was not run again"
    else:  # nothing was open: the pool's pre-ping replaced the dead connection
        assert not retries()
    s.write(2)
    s.assert_exact(2)


@pytest.mark.parametrize("point", ["jdbc.before_stage_commit", "jdbc.after_apply",
                                   "jdbc.before_commit"])
def test_connection_killed_with_binary_copy_blocks(postgres: Server, point: str,
                                                   tmp_path: Any,
                                                   retries: Callable[[], list[str]]) -> None:
    """PostgreSQL append stages binary COPY blocks and COPYs them at commit (a second
    connection reads them): the same retries."""
    s = subject(postgres, mode="append")
    assert s.sink._require_layout().blocks
    kill_at(s, point, tmp_path)
    s.assert_exact(1)
    assert retries()


# -- 2. during COMMIT: the outcome unknown to the client -------------------------------------
@pytest.mark.parametrize("action", ["hold_commit", "hold_answer"])
@pytest.mark.parametrize("step", ["stage", "commit"])
def test_connection_killed_during_commit(server: Server, step: str, action: str,
                                         retries: Callable[[], list[str]]) -> None:
    """The session ends while the client waits for its COMMIT's answer. ``hold_commit``:
    the COMMIT never reached the server, which rolled the transaction back.
    ``hold_answer``: the server committed, and the answer was lost. The client sees the
    same error in both; the retry must neither write the batch twice nor skip it: the
    commit's retry reads the outcome from the commit row, a staging retry stages again
    under a new token and the first attempt's rows (if committed) are an orphan the commit
    never reads and clears."""
    s = subject(server, mode="accumulate")
    staged = [] if step == "stage" else s.stage_all(1)
    fault = server.proxy.arm(action)
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = s.stage(1, 0) if step == "stage" else s.sink.commit(1, staged)
        except BaseException as e:  # noqa: BLE001 - raised below
            done["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    port = fault.wait_held()
    if step == "commit":
        # What the server knows, while the client waits: committed only past the COMMIT.
        assert s.committed() == (1 if action == "hold_answer" else 0)
    assert server.nemesis.kill(port=port) == 1
    fault.release()
    t.join(120)
    assert not t.is_alive() and "error" not in done, done
    if step == "stage":
        # Both attempts' rows when the first one's COMMIT went through: the orphan.
        stage = staging_name(s.sink.options.sink_id)
        (rows,) = server.cli(f"SELECT count(*) FROM {stage} WHERE eo_batch = 1")  # noqa: S608
        assert int(rows[0]) == KEYS * (2 if action == "hold_answer" else 1)
        s.sink.commit(1, [done["value"], s.stage(1, 1)])
    s.assert_exact(1)
    assert retries(), "the COMMIT's error was not retried"


# -- 3. other sessions: locks, deadlocks, serialization ----------------------------------------
def lock_timeout_query(server: Server) -> dict[str, str]:
    """The sink's sessions wait 1 s for a lock (set in the URL, as a user would)."""
    if server.kind == "postgresql":
        return {"options": "-c%20lock_timeout%3D1000"}
    return {"init_command": "SET%20innodb_lock_wait_timeout%3D1"}


def test_row_lock_held_past_lock_timeout(server: Server,
                                         retries: Callable[[], list[str]]) -> None:
    """Another session holds a target row longer than ``lock_timeout`` (55P03 / 1205),
    shorter than the retry budget: the commit waits, times out, runs again, and commits
    once the lock is gone."""
    s = subject(server, query=lock_timeout_query(server))
    staged = s.stage_all(1)
    with server.nemesis.row_lock(s.table, "k", "k03"):
        t = threading.Thread(target=lambda: s.sink.commit(1, staged), daemon=True)
        t.start()
        wait_for(lambda: len(retries()) >= 2, 60, what="two lock timeouts of the commit")
        assert s.committed() == 0
    t.join(60)
    assert not t.is_alive()
    assert any("lock" in line.lower() for line in retries()), retries()
    s.assert_exact(1)


def test_deadlock_with_a_concurrent_writer(server: Server, tmp_path: Any,
                                          retries: Callable[[], list[str]]) -> None:
    """A concurrent writer holds a target row the batch updates, then asks for the sink's
    commit row while the commit holds it and waits for that target row: a deadlock
    (40P01 / 1213). The other writer is made the survivor (PostgreSQL: its deadlock_timeout
    is longer, so the sink's backend detects the cycle; InnoDB: it has written more, and
    the lighter transaction is rolled back). The sink runs its commit again."""
    s = subject(server)
    staged = s.stage_all(1)
    held = HeldStep("jdbc.after_lock@1", str(tmp_path / "held"))
    sink_id = s.sink.options.sink_id
    with server.nemesis.session() as other, held.start(lambda: s.sink.commit(1, staged)):
        cur = other.cursor()
        if server.kind == "postgresql":
            cur.execute("SET deadlock_timeout = '60s'")
        else:
            cur.execute("CREATE TABLE IF NOT EXISTS heavy (i int)")
            cur.execute("INSERT INTO heavy SELECT seq FROM seq_1_to_500")
        held.reached()  # the commit holds its commit row
        cur.execute(f"UPDATE {s.table} SET n = n WHERE k = 'k05'")  # noqa: S608
        # The other writer waits for the commit row first, so that the sink's wait for k05
        # closes the cycle (PostgreSQL checks for a cycle once, deadlock_timeout into a wait).
        asks = threading.Thread(target=cur.execute, daemon=True, args=(
            "SELECT batch_id FROM eo_sink_commits WHERE sink_id = %s FOR UPDATE", (sink_id,)))
        asks.start()
        wait_for(lambda: server.nemesis.waiting() >= 1, 30, what="the writer waiting")
        held.go()  # the sink asks for k05: a deadlock; the sink is rolled back
        asks.join(60)
        assert not asks.is_alive(), "the concurrent writer was not let through"
        other.rollback()
        held.result()
    assert any("deadlock" in line.lower() for line in retries()), retries()
    s.assert_exact(1)


def test_concurrent_update_under_serializable_or_snapshot_isolation(
        server: Server, tmp_path: Any, retries: Callable[[], list[str]]) -> None:
    """A concurrent writer updates a target row after the commit's snapshot was taken.
    PostgreSQL with ``isolationLevel=SERIALIZABLE``: 40001 "could not serialize access".
    MariaDB's SERIALIZABLE locks instead of detecting conflicts (its conflicts are the lock
    and deadlock cases above); with ``innodb_snapshot_isolation`` (the default from 11.6)
    REPEATABLE READ reports the change as 1020. The commit runs again on a new snapshot."""
    if server.kind == "postgresql":
        s = subject(server, isolation_level="SERIALIZABLE")
        point = "jdbc.after_lock@1"  # the snapshot is the first statement's
    else:
        s = subject(server, isolation_level="REPEATABLE_READ",
                    query={"init_command": "SET%20innodb_snapshot_isolation%3DON"})
        point = "jdbc.after_verify@1"  # the read view is the first consistent read's
    staged = s.stage_all(1)
    held = HeldStep(point, str(tmp_path / "held"))
    with held.start(lambda: s.sink.commit(1, staged)):
        held.reached()
        # Changed and changed back, in two transactions: a new row version (InnoDB writes
        # none for an update that changes nothing), the truth unchanged.
        for delta in ("+ 1", "- 1"):
            server.admin(f"UPDATE {s.table} SET n = n {delta} WHERE k = 'k07'")  # noqa: S608
        held.result()
    expected = "serializ" if server.kind == "postgresql" else "record has changed"
    assert any(expected in line.lower() for line in retries()), retries()
    s.assert_exact(1)


# -- 4. the server crashes; the server stays down past the budget ------------------------------
def test_server_sigkilled_between_staging_and_commit(server: Server) -> None:
    """Every task staged, then the server is SIGKILLed and restarted before the commit:
    the staged rows survived crash recovery (durable staging) and the commit, on new
    connections, applies them once."""
    s = subject(server, proxied=False)
    staged = s.stage_all(1)
    server.nemesis.crash()
    s.sink.commit(1, staged)
    s.assert_exact(1)


def test_unlogged_staging_lost_in_a_crash_fails_the_batch_clearly(postgres: Server) -> None:
    """``durableStaging=false`` on PostgreSQL: crash recovery empties the UNLOGGED staging
    tables, so the commit finds the rows gone and fails the batch, applying nothing; the
    batch written again (the restarted query) is exact."""
    s = subject(postgres, proxied=False, durable_staging=False)
    staged = s.stage_all(1)
    postgres.nemesis.crash()
    with pytest.raises(JdbcSinkError, match="does not hold the rows the tasks reported") as e:
        s.sink.commit(1, staged)
    assert "durableStaging" in str(e.value) and PASSWORD not in str(e.value)
    assert s.committed() == 0
    s.write(1)
    s.assert_exact(1)


def test_outage_past_the_budget_fails_clearly_and_the_restart_is_exact(
        server: Server) -> None:
    """Down longer than ``retryTimeout``: the commit fails after the budget with an error
    naming the step, the database (host, port, database; never the password) and what to
    do; with the server back, the batch written again is exact."""
    s = subject(server, proxied=False, retry_timeout=2.0)
    staged = s.stage_all(1)
    server.nemesis.stop()
    try:
        began = time.monotonic()
        with pytest.raises(JdbcSinkError) as e:
            s.sink.commit(1, staged)
        took = time.monotonic() - began
    finally:
        server.nemesis.start()
    message = str(e.value)
    db = "postgres" if server.kind == "postgresql" else "test"
    assert f"127.0.0.1:{server.port}/{db}" in message and PASSWORD not in message, message
    assert "committing batch 1 (step 2)" in message and "retryTimeout=2s passed" in message
    assert "restart the query" in message
    assert 2.0 <= took < 30, took
    s.write(1)
    s.assert_exact(1)


# -- 5. streaming through real Spark --------------------------------------------------------
ROWS_PER_BATCH = 40


@dataclass
class Query:
    """``rate-micro-batch`` (values 0, 1, 2... in fixed batches) -> eo_jdbc append."""

    server: Server
    spark: Any
    table: str
    checkpoint: str
    options: dict[str, str]
    query: Any = None

    @property
    def sink_id(self) -> str:
        return f"q_{self.table}"

    def start(self) -> Query:
        df = (self.spark.readStream.format("rate-micro-batch")
              .option("rowsPerBatch", ROWS_PER_BATCH).option("numPartitions", 2).load()
              .selectExpr("value AS v"))
        writer = (df.writeStream.format("eo_jdbc")
                  .option("url", self.server.url(proxied=False))
                  .option("table", self.table).option("sink_id", self.sink_id)
                  .option("createTable", "true").option("retryBackoff", "100ms")
                  .option("checkpointLocation", self.checkpoint)
                  .trigger(processingTime="200 milliseconds"))
        for k, v in self.options.items():
            writer = writer.option(k, v)
        self.query = writer.start()
        return self

    def committed(self) -> int:
        try:
            rows = self.server.admin(
                "SELECT batch_id FROM eo_sink_commits WHERE sink_id = %s", self.sink_id)
        except Exception:  # noqa: BLE001 - the server may be down: no progress to see
            return -1
        return int(rows[0][0]) if rows else -1

    def assert_up(self) -> None:
        error = self.query.exception()
        assert error is None and self.query.isActive, f"the query terminated with error: {error}"

    def progresses(self, batches: int = 2, timeout: float = 120) -> None:
        """``batches`` more commits, the query up all along."""
        start = self.committed()

        def moved() -> bool:
            self.assert_up()
            return self.committed() >= start + batches

        wait_for(moved, timeout, what=f"{batches} more commits of {self.sink_id}")

    def stop(self) -> None:
        self.query.stop()

    def assert_exact(self) -> int:
        """Exactly the rows of batches 0..B, B the commit row's: values 0..n-1 once each.
        With ``commitScope=task`` a query stopped after some tasks of batch B+1 committed
        keeps their rows (docs/jdbc-sink.md, "Commit scopes": visible until the restarted
        query writes the rest, never twice), so rows of B+1 may stand beside them, none
        twice (a CI run stopped there, 2026-12-08: 560 rows, 560 distinct, commit row 12)."""
        last = self.committed()
        n = (last + 1) * ROWS_PER_BATCH
        counts = (f"count(*), count(DISTINCT v), sum(CASE WHEN v < {n} THEN 1 ELSE 0 END), "
                  "min(v), max(v)")
        (row,) = self.server.cli(f"SELECT {counts} FROM {self.table}")  # noqa: S608
        total, distinct, below, low, high = (int(x) if x not in ("", "NULL") else -1
                                             for x in row)
        in_flight = total - n
        assert total == distinct and below == n and low == 0, (row, last)
        if self.options.get("commitScope") == "task":
            assert 0 <= in_flight <= ROWS_PER_BATCH and high < n + ROWS_PER_BATCH, (row, last)
        else:
            assert in_flight == 0 and high == n - 1, (row, last)
        return last


@pytest.fixture
def streaming(spark: Any, tmp_path: Any) -> Iterator[Callable[..., Query]]:
    made: list[Query] = []

    def make(server: Server, **options: str) -> Query:
        table = f"q_{uuid.uuid4().hex[:10]}"
        q = Query(server, spark, table, str(tmp_path / f"chk-{table}"), options)
        made.append(q)
        return q

    yield make
    for q in made:
        with contextlib.suppress(Exception):
            if q.query is not None and q.query.isActive:
                q.query.stop()


@pytest.mark.parametrize(("kind", "scope"), [("postgresql", "batch"), ("mariadb", "task"),
                                              ("postgresql", "prepared")])
def test_streaming_query_stays_up_through_database_faults(servers: Callable[[str], Server],
                                                          kind: str, scope: str,
                                                          streaming: Callable[..., Query]
                                                          ) -> None:
    """Within the default budget (120 s) nothing ends the query: the sessions killed three
    times, the server SIGKILLed and restarted, the server stopped and started again (30 s
    down on PostgreSQL; 5 s on MariaDB, whose restart path is the same). The output is
    exactly the committed batches, read with the database's own client. Each commit scope
    on one database (MariaDB's batch scope and PostgreSQL's task scope share every fault
    path with these: the sessions, the crash, the restart)."""
    server = servers(kind)
    q = streaming(server, commitScope=scope).start()
    q.progresses(3)
    for _ in range(3):
        server.nemesis.kill()
        q.progresses()
    server.nemesis.crash()
    q.progresses()
    down = server.nemesis.down(30 if server.kind == "postgresql" else 5)
    assert down >= 5
    q.progresses()
    q.stop()
    assert q.query.exception() is None
    assert q.assert_exact() >= 10


def test_streaming_outage_past_the_budget_ends_the_query_and_the_restart_is_exact(
        postgres: Server, streaming: Callable[..., Query]) -> None:
    """``retryTimeout=3s`` and the server down for longer: the query ends with the error
    naming the database and the step; restarted from its checkpoint with the server back,
    it goes on exactly."""
    q = streaming(postgres, retryTimeout="3s").start()
    q.progresses(2)
    postgres.nemesis.stop()
    try:
        wait_for(lambda: not q.query.isActive, 120, what="the query to end")
    finally:
        postgres.nemesis.start()
    error = str(q.query.exception())
    assert "JdbcSinkError" in error and f"127.0.0.1:{postgres.port}/postgres" in error, error
    assert "retryTimeout=3s" in error and PASSWORD not in error
    q.start()  # the same checkpoint, table and sink_id
    q.progresses(2)
    q.stop()
    q.assert_exact()


# -- 6. commitScope=task and prepared: every row written once, by its task -------------------
TASK_POINTS = ["jdbc.before_stage", "jdbc.task_written", "jdbc.before_stage_commit",
               "jdbc.after_stage"]
DRIVER_POINTS = ["jdbc.after_lock", "jdbc.after_verify", "jdbc.after_apply",
                 "jdbc.after_record", "jdbc.before_commit", "jdbc.after_commit"]
#: Where the killed session held an open transaction of the scope, which must run again
#: (prepared: before_stage_commit comes after the PREPARE, which outlives its session).
RETRIED = {
    "task": {"jdbc.before_stage", "jdbc.task_written", "jdbc.before_stage_commit",
             *DRIVER_POINTS[:5]},
    "prepared": {"jdbc.before_stage", "jdbc.task_written", *DRIVER_POINTS[:5],
                 "jdbc.mid_finish"},
}
#: Every point on PostgreSQL with the mode that exercises most (task: accumulate through a
#: temporary table; prepared: append); a stated subset on MariaDB (the task's own
#: transaction, before and after its rows, and the driver's commit once).
SCOPE_CASES = (
    [("postgresql", "task", p) for p in TASK_POINTS + DRIVER_POINTS]
    + [("mariadb", "task", p) for p in ("jdbc.task_written", "jdbc.before_stage_commit",
                                        "jdbc.after_record")]
    + [("postgresql", "prepared", p) for p in TASK_POINTS + DRIVER_POINTS[:5]
       + ["jdbc.before_finish", "jdbc.mid_finish", "jdbc.after_commit"]]
)


def scoped(server: Server, scope: str, **options: Any) -> Subject:
    """A sink of ``scope`` (task: accumulate; prepared: append) with batch 0 committed."""
    return subject(server, mode="accumulate" if scope == "task" else "append",
                   commit_scope=scope, **options)


@pytest.mark.parametrize(("kind", "scope", "point"), SCOPE_CASES,
                         ids=[f"{k}-{s}-{p.split('.')[1]}" for k, s, p in SCOPE_CASES])
def test_scope_connection_killed_at_each_step(servers: Callable[[str], Server], kind: str,
                                              scope: str, point: str, tmp_path: Any,
                                              retries: Callable[[], list[str]]) -> None:
    """The server ends the sink's sessions while a task or the driver stands at ``point``
    (batch 1): the step runs again where its transaction was lost, and batch 1 is in the
    table exactly once, batch 2 after it."""
    s = scoped(servers(kind), scope)
    kill_at(s, point, tmp_path)
    s.assert_exact(1)
    assert bool(retries()) == (point in RETRIED[scope]), (point, retries())
    s.write(2)
    s.assert_exact(2)


@pytest.mark.parametrize("first", ["commits", "killed"])
def test_task_scope_two_attempts_of_one_task(server: Server, first: str, tmp_path: Any) -> None:
    """A second attempt of (batch 1, writer 0) starts while the first holds its claim with
    its rows written, uncommitted (a zombie and its retry, or a speculative copy): the
    second waits on the claim. The first commits: the second writes nothing and reports the
    first's rows. Both sessions are killed instead: each attempt runs again, one writes,
    the other finds its claim. Then an attempt of the committed batch writes nothing."""
    s = scoped(server, "task")
    held = HeldStep("jdbc.task_written@1", str(tmp_path / "held"))
    second: dict[str, Any] = {}
    with held.start(lambda: s.stage(1, 0)):
        held.reached()
        t = threading.Thread(target=lambda: second.setdefault("m", s.stage(1, 0)),
                             daemon=True)
        t.start()
        wait_for(lambda: server.nemesis.waiting() >= 1, 60, what="the second attempt waiting")
        if first == "killed":
            assert server.nemesis.kill() >= 2
        first_message = held.result()
        t.join(60)
        assert not t.is_alive() and "m" in second
    messages = sorted([first_message, second["m"]], key=lambda m: m.earlier)
    assert messages == [Written(0, KEYS), Written(0, KEYS, earlier=True)], messages
    if first == "commits":
        assert first_message == Written(0, KEYS)
    s.sink.commit(1, [second["m"], s.stage(1, 1)])
    s.assert_exact(1)
    assert s.stage(1, 0) == Written(0, 0, committed=True)
    s.assert_exact(1)


def test_prepared_scope_a_stale_prepared_attempt_is_rolled_back(postgres: Server) -> None:
    """An attempt of (1, 0) prepared its rows and its report never reached the driver (the
    task failed after its PREPARE); the retry rolls the stale prepared transaction back
    before it writes, so the target's unique keys never wait on it, and the batch is exact.
    A zombie of the committed batch prepares nothing."""
    s = scoped(postgres, "prepared")
    lost = s.stage(1, 0)
    with s.sink.database.connect() as conn:
        assert [x.txn for x in prepared_txns(conn, s.sink.options.sink_id)] == [lost.txn]
    s.sink.commit(1, [s.stage(1, 0), s.stage(1, 1)])
    s.assert_exact(1)
    assert s.stage(1, 0).committed
    s.assert_exact(1)


@pytest.mark.parametrize("action", ["hold_commit", "hold_answer"])
def test_task_scope_connection_killed_during_the_task_commit(
        server: Server, action: str, retries: Callable[[], list[str]]) -> None:
    """The session ends while a task waits for its COMMIT's answer: not committed
    (``hold_commit``), the retry writes the rows; committed and the answer lost
    (``hold_answer``), the retry finds its claim and writes nothing. Exact either way."""
    s = scoped(server, "task")
    fault = server.proxy.arm(action)
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("m", s.stage(1, 0)), daemon=True)
    t.start()
    assert server.nemesis.kill(port=fault.wait_held()) == 1
    fault.release()
    t.join(120)
    assert not t.is_alive() and "m" in out
    assert out["m"].earlier == (action == "hold_answer")
    s.sink.commit(1, [out["m"], s.stage(1, 1)])
    s.assert_exact(1)
    assert retries()


@pytest.mark.parametrize("action", ["hold_commit", "hold_answer"])
def test_prepared_scope_connection_killed_during_commit_prepared(
        postgres: Server, action: str, retries: Callable[[], list[str]]) -> None:
    """The session ends while the driver waits for a COMMIT PREPARED's answer (step 2g): a
    killed session leaves a prepared transaction prepared, so the retry commits it
    (``hold_commit``) or finds it committed (``hold_answer``). The commit row moved before
    (the driver's record first): the batch is exact, nothing prepared is left."""
    s = scoped(postgres, "prepared")
    staged = s.stage_all(1)
    fault = postgres.proxy.arm(action, statement="COMMIT PREPARED")
    t = threading.Thread(target=lambda: s.sink.commit(1, staged), daemon=True)
    t.start()
    port = fault.wait_held()
    assert s.committed() == 1  # recorded before any prepared transaction is committed
    assert postgres.nemesis.kill(port=port) == 1
    fault.release()
    t.join(120)
    assert not t.is_alive()
    s.assert_exact(1)
    assert any("step 2g" in line for line in retries()), retries()


@pytest.mark.parametrize(("kind", "scope"), [("postgresql", "task"), ("mariadb", "task"),
                                              ("postgresql", "prepared")])
def test_scope_server_sigkilled_before_the_driver_commits(servers: Callable[[str], Server],
                                                          kind: str, scope: str) -> None:
    """Every task committed (or prepared) batch 1, then the server is SIGKILLed and
    restarted: crash recovery keeps the committed rows with their claims (and the prepared
    transactions, which a restart does not end); the commit on new connections records
    the batch once."""
    server = servers(kind)
    s = scoped(server, scope, proxied=False)
    staged = s.stage_all(1)
    server.nemesis.crash()
    s.sink.commit(1, staged)
    s.assert_exact(1)


def test_prepared_scope_server_sigkilled_between_the_record_and_commit_prepared(
        postgres: Server, tmp_path: Any) -> None:
    """The driver recorded batch 1 (its COMMIT done, step 2f) and the server is SIGKILLed
    before any COMMIT PREPARED: after the restart the prepared transactions are still
    there, the driver's 2g (retried on new connections) commits them; a replay of batch 1
    has nothing left to do."""
    s = scoped(postgres, "prepared", proxied=False)
    staged = s.stage_all(1)
    held = HeldStep("jdbc.before_finish@1", str(tmp_path / "held"))
    with held.start(lambda: s.sink.commit(1, staged)):
        held.reached()
        assert s.committed() == 1
        postgres.nemesis.crash()
        held.result()
    s.assert_exact(1)
    s.sink.commit(1, staged)
    s.assert_exact(1)
