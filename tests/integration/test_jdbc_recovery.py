"""Recovery: Kafka -> word count per micro-batch -> eo_jdbc accumulate (and append) into PostgreSQL.

``count = count + new`` is not idempotent: a batch applied twice would show in the table.
One pipeline per configuration is killed (SIGKILL of the whole process group: driver, JVM
and Python workers) at each JDBC failpoint in turn and restarted from the same checkpoint;
a last run without failpoints finishes. The final table must equal the true word counts.

After every crash the table must also equal the word counts of exactly the batches the
commit table says are committed (computed from Spark's own offset log): no partial batch
is ever visible, at any failpoint. At ``jdbc.before_commit`` (all tasks staged, the rows
applied inside the open transaction) the staging table must hold rows of both writer
partitions while the target shows none of them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from connectors.jdbc.options import staging_name
from tests.helpers import run_pipeline
from tests.integration.pipelines.jdbc_wordcount import line

PIPELINE = os.path.join(os.path.dirname(__file__), "pipelines", "jdbc_wordcount.py")
TOTAL = 240
PER_BATCH = 60  # 4 micro-batches (0..3)
PARTITIONS = 2


@pytest.fixture
def lines_topic(filled_topic: Any) -> str:
    # Line i goes to partition i % 2 at offset i // 2 (the topic keeps each partition's order).
    return filled_topic([(None, line(i).encode(), i % PARTITIONS) for i in range(TOTAL)],
                        partitions=PARTITIONS)


def counts_of_lines(indexes: list[int]) -> dict[str, int]:
    c: Counter[str] = Counter()
    for i in indexes:
        c.update(line(i).split(" "))
    return dict(c)


def counts_through_batch(checkpoint: str, batch: int | None) -> dict[str, int]:
    """True word counts of batches 0..batch, from the end offsets in Spark's offset log."""
    if batch is None:
        return {}
    with open(os.path.join(checkpoint, "offsets", str(batch))) as f:
        end = json.loads(f.read().strip().splitlines()[-1])
    (ends,) = end.values()  # {"<topic>": {"<partition>": next_offset}}
    lines = [2 * o + int(p) for p, next_offset in ends.items() for o in range(next_offset)]
    return counts_of_lines(lines)


class Target:
    def __init__(self, url: str, table: str, sink_id: str) -> None:
        self.url, self.table, self.sink_id = url, table, sink_id
        self.stage = staging_name(sink_id)
        self.engine = sa.create_engine(url)

    def counts(self) -> dict[str, int]:
        """word -> count (summed: append mode holds one (word, 1) row per word seen)."""
        with self.engine.connect() as c:
            if not sa.inspect(c).has_table(self.table):
                return {}
            t = sa.Table(self.table, sa.MetaData(), autoload_with=c)
            rows = c.execute(sa.select(t.c.word, sa.func.sum(t.c.n)).group_by(t.c.word))
            return {w: int(n) for w, n in rows}

    def committed(self) -> int | None:
        with self.engine.connect() as c:
            if not sa.inspect(c).has_table("eo_sink_commits"):
                return None
            t = sa.Table("eo_sink_commits", sa.MetaData(), autoload_with=c)
            row = c.execute(sa.select(t.c.batch_id).where(t.c.sink_id == self.sink_id)).first()
        return None if row is None or row[0] < 0 else int(row[0])

    def staged_writers(self, batch: int) -> set[int]:
        """Writer partitions with rows (or, for append, binary COPY blocks) staged."""
        writers: set[int] = set()
        with self.engine.connect() as c:
            for stage in (self.stage, f"{self.stage}_blocks"):
                if not sa.inspect(c).has_table(stage):
                    continue
                t = sa.Table(stage, sa.MetaData(), autoload_with=c)
                rows = c.execute(sa.select(t.c.eo_writer).where(t.c.eo_batch == batch)
                                 .distinct())
                writers.update(int(r[0]) for r in rows)
        return writers

    def drop(self) -> None:
        with self.engine.begin() as c:
            for name in (self.table, self.stage, f"{self.stage}_blocks"):
                c.execute(sa.text("DROP TABLE IF EXISTS " +
                                  self.engine.dialect.identifier_preparer.quote(name)))
        self.engine.dispose()


def crash_and_recover(argv: list[str], target: Target, checkpoint: str,
                      points: list[str], staged: bool, by_task: bool = False) -> None:
    for point in points:
        result = run_pipeline(argv, failpoint=point, timeout=240)
        assert result.killed, f"failpoint {point} never fired:\n{result.output[-3000:]}"
        last = target.committed()
        if by_task:
            # commitScope=task: the tasks of the batch in flight that committed are in the
            # table already; nothing is there twice, nothing of a committed batch missing.
            low, high = (counts_through_batch(checkpoint, last),
                         counts_through_batch(checkpoint, (last if last is not None else -1) + 1))
            got = target.counts()
            assert all(low.get(w, 0) <= got.get(w, 0) <= high.get(w, 0)
                       for w in {*low, *high, *got}), (
                f"after a crash at {point}: the table is not batches 0..{last} and part of "
                f"the next")
            if point.startswith("jdbc.before_commit@"):
                assert got == high, "both tasks committed their rows before the driver"
            continue
        assert target.counts() == counts_through_batch(checkpoint, last), (
            f"after a crash at {point}: the table is not exactly batches 0..{last}")
        if staged and point.startswith("jdbc.before_commit@"):
            batch = int(point.split("@")[1])
            assert last == batch - 1
            assert target.staged_writers(batch) == {0, 1}, "both writers staged before commit"
    result = run_pipeline(argv, timeout=240)
    assert result.returncode == 0 and "PIPELINE DONE" in result.output, result.output[-3000:]
    assert target.counts() == counts_of_lines(list(range(TOTAL)))
    planned = max(int(n) for n in os.listdir(os.path.join(checkpoint, "offsets"))
                  if n.isdigit())
    assert target.committed() == planned >= 3


@pytest.mark.parametrize(
    ("writer", "points"),
    [
        # writeStream.format("eo_jdbc"): tasks stage (COPY), the driver commits.
        ("datasource", ["jdbc.after_stage@1", "jdbc.before_commit@2", "jdbc.after_commit@3"]),
        # The same with mode append: tasks stage binary COPY blocks, the commit COPYs them
        # (the step that differs; a staged task and a replay after the commit are the
        # accumulate's above).
        ("datasource-append", ["jdbc.before_commit@1"]),
        # foreachBatch(JdbcSink): small batches, one driver transaction each.
        ("foreachbatch", ["jdbc.before_commit@1", "jdbc.after_commit@2"]),
        # commitScope=task: each task adds its rows in its own transaction. Killed after a
        # task committed (the restart's replay must skip that task) and with both
        # committed, before the driver records the batch. (A kill with a task's rows
        # written and not committed is the database's rollback: every step of each scope
        # is test_jdbc_faults.py's, on the real servers without Spark.)
        ("datasource-task", ["jdbc.after_stage@1", "jdbc.before_commit@2"]),
    ],
)
def test_word_count_exactly_once_across_crashes(writer: str, points: list[str],
                                                postgres_url: str, kafka_bootstrap: str,
                                                lines_topic: str, tmp_path: Any) -> None:
    table = f"wc_{uuid.uuid4().hex[:10]}"
    sink_id = f"wc_{writer}_{uuid.uuid4().hex[:8]}"
    checkpoint = str(tmp_path / "chk")
    argv = [PIPELINE, "--url", postgres_url, "--table", table, "--sink-id", sink_id,
            "--checkpoint", checkpoint, "--writer", writer, "--source", "kafka",
            "--bootstrap", kafka_bootstrap, "--topic", lines_topic,
            "--per-batch", str(PER_BATCH)]
    target = Target(postgres_url, table, sink_id)
    try:
        crash_and_recover(argv, target, checkpoint, points,
                          staged=writer in ("datasource", "datasource-append"),
                          by_task=writer == "datasource-task")
    finally:
        target.drop()
