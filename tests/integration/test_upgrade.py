"""The upgrade test (CHANGELOG.md, "State formats a release reads"): a query started under the
previous release, SIGKILLed mid-batch, finishes exactly under this checkout's code.

The previous release is the commit on the first line of ``tests/upgrade/PREVIOUS_RELEASE``
(the file says why that one and how it moves at each release). Its ``connectors/`` package
is taken from git (``git archive``), its optional C extensions built from its own sources
beside it, and it runs in this virtualenv with ``PYTHONPATH`` and the working directory at
that tree, so the driver and every Python worker import it (the application prints which
``connectors`` each side imported, and the test checks). A clone without that commit (a
shallow clone) fails the test with the way to fetch it; the test never skips.

One Spark application (``tests/upgrade/app.py``) runs the ``eo_kafka`` source, with a window
WAL, into the four sinks: the Kafka sink with recovery keys, the Kafka sink transactional,
the JDBC sink accumulating per key on PostgreSQL and the file sink on the local disk. Under
the previous release, every query is held at batch 3 in the middle of its commit protocol
(``pause`` failpoints, which that release has), while a producer keeps writing to the source
topic:

- the recovery-key sink after 2,900 of the batch's 3,000 records are acknowledged, its
  started marker written (``kafka_sink.mid_produce``);
- the transactional sink after its tasks committed their transactions and commit facts,
  before the driver's commit record (``kafka_sink.before_commit``);
- the JDBC sink with the batch applied in the driver's open database transaction, the
  commit row not moved (``jdbc.after_apply``); this checkout finishes it with
  ``commitScope=task``, whose tasks write into the table themselves and whose commit clears
  the batch the previous release staged;
- the file sink with its plan created and one planned file renamed (``files.mid_rename``).

Then the whole application is SIGKILLed (every process of its session: the driver, the JVM
and the Python workers, which PySpark puts in a process group of their own) and started
again on the same work directory under this checkout's code, which replays batch 3 from
the state the previous release left, drains the source while the producer goes on for a
while, and is stopped. Every sink must then hold every source record exactly once: both
Kafka topics read ``read_committed`` to the end of every partition, the JDBC counts per key
equal to the source's, the Parquet files read through pyarrow; and neither run's log may
show a query terminated.

That the previous release's state was really read, not rewritten: before the second run
the test checks that batch 3 is in flight in every sink as that release left it (the
recovery-key sink's started markers and 2,900 of its records, the transactional sink's
commit facts of batch 3, the JDBC commit row at batch 2, the file sink's plan of batch 3
without its commit record). Batch 3 of the recovery-key sink is bigger than this checkout's
null-key run (``nullKeyRunBytes``, 10 MB): the previous release's markers route null keys in
runs of 100,000 rows, so its retry must send every row to the one partition the first
attempt used, where the 2,900 already are; a retry that routed by this checkout's budget
would send the last rows to the next partition and write 400 of them twice. The test
checks that batch 3 is in one partition and that a batch written by this checkout alone is
in two.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from tests.helpers import (
    REPO,
    jdbc_counts,
    jvm_options,
    prepare_spark_jvms,
    scan_topic,
    wait_for,
)

BASELINE_FILE = Path(REPO) / "tests" / "upgrade" / "PREVIOUS_RELEASE"
APP = str(Path(REPO) / "tests" / "upgrade" / "app.py")
QUERIES = ("rk", "txn", "jdbc", "files")
PER_BATCH = 3000
#: The batch every query is held in when the previous release is killed.
IN_FLIGHT = 3
#: Records in the source before the application starts: batches 0-3 are full.
FIRST = (IN_FLIGHT + 1) * PER_BATCH
#: Recovery-key records of batch 3 acknowledged when that sink is held.
ACKED = 2900
#: Bytes added to every value the recovery-key sink writes: 3,000 rows of about 4 KB make a
#: batch of 12 MB, more than this checkout's null-key run of 10 MB.
PAD = 4000
PAUSES = (f"kafka_sink.mid_produce@{IN_FLIGHT}#{ACKED}!pause",
          f"kafka_sink.before_commit@{IN_FLIGHT}!pause",
          f"jdbc.after_apply@{IN_FLIGHT}!pause",
          f"files.mid_rename@{IN_FLIGHT}#1!pause")
TERMINATIONS = ("QUERY FAILED", "terminated with error")
#: Source records a second while the producer runs.
RATE = 160


def previous_release() -> str:
    """The commit ``PREVIOUS_RELEASE`` names; fails the test when the clone lacks it."""
    lines = [line.strip() for line in BASELINE_FILE.read_text().splitlines()]
    sha = next(line for line in lines if line and not line.startswith("#"))
    def present() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{sha}^{{commit}}"],
                              capture_output=True, text=True, check=False)

    found = present()
    if found.returncode != 0:  # a shallow clone: its origin may serve the commit
        subprocess.run(["git", "-C", REPO, "fetch", "--quiet", "--depth=1", "origin", sha],
                       capture_output=True, text=True, check=False, timeout=120)
        found = present()
    if found.returncode != 0:
        pytest.fail(
            f"the previous release's commit {sha} (tests/upgrade/PREVIOUS_RELEASE) is not in "
            f"the clone at {REPO} ({found.stderr.strip() or 'git cat-file failed'}): the "
            "upgrade test runs that commit's code. Clone with history, or fetch it in this "
            "clone: git fetch --unshallow", pytrace=False)
    return sha


def extract_release(sha: str, dest: Path) -> Path:
    """``connectors/`` of ``sha`` under ``dest``, with the C extensions this checkout has
    built, built from that commit's own sources (its ``setup.py``), as its install would."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", REPO, "archive", sha, "connectors", "setup.py"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=dest, capture_output=True, text=True, check=False)
    ours = {p.name.split(".")[0] for p in Path(REPO, "connectors").rglob("*.so")}
    # By name, wherever the release kept its source (a module may have moved since).
    for source in (dest / "connectors").rglob("*.c"):
        if source.stem in ours and not list(source.parent.glob(f"{source.stem}.*.so")):
            where = source.parent.relative_to(dest)
            pytest.fail(f"the previous release's C extension {where}/{source.stem} did not "
                        f"build (this checkout's did), so it would not run as installed:\n"
                        f"{built.stdout[-3000:]}{built.stderr[-3000:]}", pytrace=False)
    return dest


def session_processes(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies left out)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) != sid:
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            pids.append(int(entry))
    return pids


class App:
    """The application, started in a session of its own; ``kill`` SIGKILLs every process of
    that session, the Python workers too (PySpark's daemon moves them to a process group of
    their own, which a kill of the driver's group would miss: a held task would then go on
    writing after the next run started)."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.began = 0

    def start(self, what: str, env: dict[str, str], cwd: str) -> None:
        self.began = len(self.output())
        with open(self.log, "ab") as out:
            out.write(f"\n=== {what} ===\n".encode())
            out.flush()
            self.proc = subprocess.Popen([sys.executable, *self.argv], env=env, cwd=cwd,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def run_output(self) -> str:
        """The log of the current run."""
        return self.output()[self.began:]

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def excerpt(self) -> str:
        """What a failure report needs of the log: the lines naming an error, then the log
        from the first sign of a termination (else its end)."""
        text = self.output()
        errors = [line for line in text.splitlines()
                  if "Error" in line and not line.startswith("\t")]
        first = min((i for i in (text.find(s) for s in TERMINATIONS) if i >= 0),
                    default=max(0, len(text) - 4000))
        return ("\n".join(dict.fromkeys(errors)) + f"\n--- {self.log} ---\n"
                + text[max(0, first - 1000):first + 3000])

    def alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, (
            f"the application ended ({None if self.proc is None else self.proc.returncode})"
            f":\n{self.excerpt()}")
        self.no_termination()

    def no_termination(self) -> None:
        for sign in TERMINATIONS:
            assert sign not in self.output(), f"{sign!r} in {self.log}:\n{self.excerpt()}"

    def kill(self) -> None:
        if self.proc is None:
            return
        sid = self.proc.pid
        deadline = time.monotonic() + 60
        while pids := session_processes(sid):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            assert time.monotonic() < deadline, f"processes of session {sid} live on: {pids}"
            time.sleep(0.1)
        self.proc.wait(60)


def committed_batches(work: Path, query: str) -> list[int]:
    """The batches in the query's Spark commit log."""
    d = work / query / "checkpoint" / "commits"
    return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if d.exists() else []



def jdbc_commit_row(dsn: str, sink_id: str) -> int | None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("select batch_id from eo_sink_commits where sink_id = %s",
                           (sink_id,)).fetchone()
    return None if row is None else int(row[0])


def jdbc_staged(dsn: str, sink_id: str) -> int:
    """Rows in the sink's staging table (``eo_stage_<sink>``)."""
    import psycopg
    from psycopg import sql

    from connectors.jdbc.options import staging_name

    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql.SQL("select count(*) from {}").format(
            sql.Identifier(staging_name(sink_id)))).fetchone()
    return int(row[0]) if row else 0


def files_values(path: Path) -> list[bytes]:
    if not path.exists():
        return []
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table()
    return [v.encode() for v in table.column("value").to_pylist()]


def commit_fact_batch(bootstrap: str, sink_id: str, writer: int) -> int | None:
    """The batch of the transactional sink's commit fact of ``writer`` (the offset metadata
    of group ``eo-sink-<sink_id>-w<w>`` on the facts topic), None without one."""
    from confluent_kafka import Consumer, TopicPartition

    from connectors.kafka.sink.commit_facts import DEFAULT_FACTS_TOPIC, CommitFact

    consumer = Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                         "group.id": f"eo-sink-{sink_id}-w{writer}",
                         "isolation.level": "read_committed"})
    try:
        [tp] = consumer.committed([TopicPartition(DEFAULT_FACTS_TOPIC, 0)], timeout=30)
    finally:
        consumer.close()
    fact = CommitFact.decode(tp.metadata) if tp.offset >= 0 else None
    return None if fact is None else fact.batch_id


def end_offsets(bootstrap: str, topic: str) -> list[int]:
    """The high watermarks of ``topic``'s partitions (without transactions: its records)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4()}"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in sorted(parts)]
    finally:
        consumer.close()


def rk_batches(messages: list[Any], sink_id: str) -> dict[int, Counter[int]]:
    """Per batch, the partitions its recovery-key records are in (from their ``eo-rk``
    headers)."""
    from connectors.kafka.sink import recovery

    out: dict[int, Counter[int]] = defaultdict(Counter)
    for m in messages:
        key = recovery.find_key(m.headers())
        assert key is not None and key.of_sink(sink_id), f"a record without our key: {m}"
        out[key.batch_id][m.partition()] += 1
    return out


def marker_format_crossed(markers: list[dict[str, Any]]) -> None:
    """The state-format change this baseline crosses: its started markers route null keys
    in runs of rows (``null_key_run``), before ``null_key_run_bytes`` (PREVIOUS_RELEASE says
    how this moves with the baseline)."""
    assert markers, "the previous release left no started marker of the recovery-key sink"
    for m in markers:
        assert "null_key_run_bytes" not in m and m.get("null_key_run") == 100_000, (
            f"the previous release's started marker {m} is not the format this baseline "
            "crosses (runs of null_key_run rows, no null_key_run_bytes): PREVIOUS_RELEASE "
            "moved past the byte runs; make this check the state-format change the new "
            "baseline crosses")


# Alone: its eight query starts each start a Python source runner that must connect back
# within Spark's fixed 10 s; beside another worker's Spark tests one did not (CI, load 13).
@pytest.mark.alone
def test_a_query_killed_under_the_previous_release_finishes_exactly_on_this_one(
        kafka_bootstrap, new_topic, postgres_dsn, postgres_url, pg_table, tmp_path):
    from confluent_kafka import Producer

    from connectors.kafka.common import LIBRDKAFKA_LOG
    from connectors.kafka.sink.partitioner import NULL_KEY_RUN_BYTES

    sha = previous_release()
    old = extract_release(sha, tmp_path / "previous")
    src = new_topic(partitions=4, prefix="up-src")
    rk, txn = new_topic(partitions=4, prefix="up-rk"), new_topic(partitions=4, prefix="up-txn")
    table, files, work = pg_table("upgrade"), tmp_path / "files-out", tmp_path / "work"
    stop, pauses = tmp_path / "stop", tmp_path / "pauses"
    pauses.mkdir()
    run_id = uuid.uuid4().hex[:10]
    sink_ids = {q: f"{q}-{run_id}" for q in QUERIES}
    prepare_spark_jvms()
    app = App([APP, "--bootstrap", kafka_bootstrap, "--source-topic", src, "--rk-topic", rk,
               "--txn-topic", txn, "--jdbc-url", postgres_url, "--table", table,
               "--files", str(files), "--work", str(work), "--stop", str(stop),
               "--run-id", run_id, "--per-batch", str(PER_BATCH), "--pad", str(PAD),
               "--java-options", jvm_options()], tmp_path / "app.log")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("CONNECTORS_FAILPOINTS") and k != "PYTHONPATH"}
    base.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)

    # The source: "v-<i>" under 113 keys, written by one idempotent producer, FIRST records
    # before the application starts and RATE a second from then on.
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True,
                         "linger.ms": 20}, logger=LIBRDKAFKA_LOG)
    written = [0]
    producing = threading.Event()

    def produce(n: int) -> None:
        for i in range(written[0], written[0] + n):
            producer.produce(src, key=f"k{i % 113}".encode(), value=f"v-{i:08d}".encode(),
                             partition=i % 4)
        written[0] += n
        producer.poll(0)

    def keep_producing() -> None:
        while producing.is_set():
            produce(RATE // 4)
            time.sleep(0.25)

    produce(FIRST)
    producer.flush(60)
    producing.set()
    feeder = threading.Thread(target=keep_producing, daemon=True)
    feeder.start()
    try:
        # 1. The previous release, held at batch 3 in every sink, then SIGKILLed.
        app.start(f"the previous release {sha}", dict(
            base, PYTHONPATH=str(old), CONNECTORS_FAILPOINTS=",".join(PAUSES),
            CONNECTORS_FAILPOINTS_PAUSE_DIR=str(pauses)), cwd=str(old))
        reached = [pauses / f"{p}.reached" for p in PAUSES]

        def held() -> bool:
            app.alive()
            return all(r.exists() for r in reached)

        wait_for(held, timeout=240, interval=0.5,
                 what=f"every sink held at batch {IN_FLIGHT} under the previous release")
        assert f"CONNECTORS driver={old}/connectors/__init__.py " \
               f"worker={old}/connectors/__init__.py" in app.run_output(), app.run_output()
        before = written[0]
        wait_for(lambda: written[0] > before, timeout=10, what="more source records")
        app.kill()
        app.no_termination()

        # 2. What the previous release left: batch 3 in flight in every sink.
        for q in QUERIES:
            assert committed_batches(work, q) == list(range(IN_FLIGHT)), (
                q, committed_batches(work, q))
        started = sorted(glob.glob(str(work / "rk" / "sink-wal" / "started" / "*" / "*.json")))
        markers = [json.loads(Path(p).read_text()) for p in started]
        assert {int(Path(p).parent.name) for p in started} == {IN_FLIGHT}, started
        marker_format_crossed(markers)
        rk_before = rk_batches(scan_topic(kafka_bootstrap, rk, isolation="read_uncommitted",
                                          timeout=120)[0], sink_ids["rk"])
        assert ACKED <= sum(rk_before[IN_FLIGHT].values()) < PER_BATCH, rk_before[IN_FLIGHT]
        assert [commit_fact_batch(kafka_bootstrap, sink_ids["txn"], w) for w in (0, 1)] == [
            IN_FLIGHT, IN_FLIGHT]
        assert jdbc_commit_row(postgres_dsn, sink_ids["jdbc"]) == IN_FLIGHT - 1
        assert jdbc_staged(postgres_dsn, sink_ids["jdbc"]) > 0  # batch 3, staged
        log_dir = files / "_eo_log"
        assert (log_dir / f"{IN_FLIGHT:020d}.json").exists(), sorted(os.listdir(log_dir))
        assert not (log_dir / f"{IN_FLIGHT:020d}.commit").exists(), sorted(os.listdir(log_dir))

        # 3. This checkout on the same work directory, the producer still going. Batch 4 is
        #    full (so a batch this checkout writes alone is as big as batch 3).
        wait_for(lambda: written[0] >= FIRST + 2 * PER_BATCH, timeout=120,
                 what="two more batches of source records")
        # The JDBC query finishes batch 3 with commitScope=task: its tasks write into the
        # table themselves, and the commit clears what the previous release staged.
        app.argv += ["--jdbc-commit-scope", "task"]
        app.start("this checkout", dict(base, PYTHONPATH=REPO), cwd=REPO)
        here = Path(REPO, "connectors", "__init__.py")
        wait_for(lambda: app.alive() or "CONNECTORS " in app.run_output(), timeout=120,
                 what="the application's start")
        assert f"CONNECTORS driver={here} worker={here}" in app.run_output(), app.run_output()

        def resumed() -> bool:
            app.alive()
            return all(committed_batches(work, q)[-1] > IN_FLIGHT for q in QUERIES)

        wait_for(resumed, timeout=240, interval=1, what="every query past batch 3")
        producing.clear()
        feeder.join(30)
        producer.flush(60)
        total = written[0]
        keys = Counter(f"k{i % 113}" for i in range(total))

        def drained() -> bool:
            app.alive()
            return (sum(end_offsets(kafka_bootstrap, rk)) >= total
                    and len(scan_topic(kafka_bootstrap, txn, timeout=60)[0]) >= total
                    and sum(jdbc_counts(postgres_dsn, table).values()) >= total
                    and len(files_values(files)) >= total)

        wait_for(drained, timeout=300, interval=2, what=f"all {total} records in every sink")
        stop.touch()
        assert app.proc is not None and app.proc.wait(120) == 0, app.excerpt()
    finally:
        producing.clear()
        app.kill()
    app.no_termination()

    # 4. Every sink exact.
    truth = Counter(f"v-{i:08d}".encode() for i in range(total))
    rk_messages = scan_topic(kafka_bootstrap, rk, timeout=120)[0]
    pad = b"." * PAD
    assert all(m.value().endswith(pad) and m.key() is None for m in rk_messages)
    for topic, got in ((rk, Counter(m.value()[:-PAD] for m in rk_messages)),
                       (txn, Counter(m.value() for m in scan_topic(kafka_bootstrap, txn,
                                                                   timeout=120)[0]))):
        assert got == truth, (f"{topic}: {sum(c - 1 for c in got.values() if c > 1)} doubled, "
                              f"{len(set(truth) - set(got))} missing, "
                              f"{len(set(got) - set(truth))} unexpected")
    assert jdbc_counts(postgres_dsn, table) == dict(keys)
    assert jdbc_staged(postgres_dsn, sink_ids["jdbc"]) == 0  # cleared by commitScope=task
    assert Counter(files_values(files)) == truth

    # 5. Batch 3 of the recovery-key sink was routed by the previous release's marker: one
    #    partition for more bytes than this checkout's run; a batch of this checkout alone
    #    as big is in two.
    routed = rk_batches(rk_messages, sink_ids["rk"])
    sizes = {b: sum(parts.values()) * (len("v-00000000") + PAD) for b, parts in routed.items()}
    assert sizes[IN_FLIGHT] > NULL_KEY_RUN_BYTES
    assert len(routed[IN_FLIGHT]) == 1, routed[IN_FLIGHT]
    ours = [b for b in routed if b > IN_FLIGHT and sizes[b] > NULL_KEY_RUN_BYTES]
    assert ours, {b: dict(parts) for b, parts in routed.items()}
    assert all(len(routed[b]) == 2 for b in ours), {b: dict(routed[b]) for b in ours}
    assert "PIPELINE DONE" in app.run_output(), app.excerpt()
