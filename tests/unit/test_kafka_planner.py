"""The source's planner on typed offsets, against a fake cluster (no broker, no Spark)."""

from __future__ import annotations

import json
import os

from connectors.kafka.source.options import KafkaSourceOptions
from connectors.kafka.source.planner import KafkaPlanner
from tests.helpers import FakeClusters


def planner(tmp_path, ends, **extra):
    opts = KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "walpath": str(tmp_path),
         **extra}, batch=True)
    p = KafkaPlanner(opts)
    fake = FakeClusters(ends)
    p.clusters = fake  # type: ignore[assignment]
    return p, fake


def test_next_window_reads_the_partitions_once(tmp_path):
    """It used to list the topics once per partition (a metadata round trip each)."""
    ends = {("", "t", p): 10 for p in range(8)}
    p, fake = planner(tmp_path, ends)
    w = p.next_window()
    assert w is not None and w.window == 0
    # One listing for the starting offsets, one for the window's end; none per partition.
    assert fake.metadata_calls == 2


def test_windows_hold_typed_offsets_and_the_wal_holds_spark_json(tmp_path):
    ends = {("", "t", 0): 5, ("", "t", 1): 7}
    p, fake = planner(tmp_path, ends)
    w = p.next_window()
    assert w is not None and w.start == {("", "t", 0): 0, ("", "t", 1): 0} and w.end == ends
    assert p.next_window() == w  # uncommitted: the same window again
    with open(os.path.join(tmp_path, "source", f"{0:020d}.json")) as f:
        assert json.load(f) == {"window": 0, "start": {"t": {"0": 0, "1": 0}},
                                "end": {"t": {"0": 5, "1": 7}}}
    assert p.commit(w.end) == 0  # found by its end offsets
    assert fake.group_commits == [ends]
    assert p.wal is not None and p.wal.last_committed() == 0
    assert p.next_window() is None  # nothing new
    fake.ends[("", "t", 0)] = 9
    nxt = p.next_window()
    assert nxt is not None and nxt.window == 1 and nxt.start == ends
    assert p.record_window(nxt.start, nxt.end) == 1  # a replayed plan keeps its id


# -- an end below the start: asked again before it is data loss ---------------------------
def test_an_end_below_the_start_is_asked_again_and_the_fresh_answer_wins(tmp_path, monkeypatch):
    """A node back from a partition answered an end older than the start (CI, 2026-12-07:
    "the start offset 7150 is beyond the end of the log (6575)"); fresh leaders answer the
    real end, and the window runs to it."""
    monkeypatch.setattr("connectors.kafka.source.planner.BEHIND_INTERVAL", 0.0)
    tp = ("", "t", 0)
    p, fake = planner(tmp_path, {tp: 9000}, failondataloss="true")
    fake.stale_ends = [{tp: 6575}]  # the fresh ask's answer: still the stale node
    end = p.next_end({tp: 7150}, latest={tp: 6575}, max_records=None, max_bytes=None)
    assert end == {tp: 9000}
    assert fake.fresh_asks == 2


def test_an_end_still_below_the_start_after_three_asks_is_data_loss(tmp_path, monkeypatch):
    import pytest

    from connectors.core.errors import KafkaSourceError

    monkeypatch.setattr("connectors.kafka.source.planner.BEHIND_INTERVAL", 0.0)
    tp = ("", "t", 0)
    p, fake = planner(tmp_path, {tp: 10}, failondataloss="true")
    with pytest.raises(KafkaSourceError, match=r"t-0: the start offset 50 is beyond the end of "
                                               r"the log \(10\)"):
        p.next_end({tp: 50}, latest={tp: 10}, max_records=None, max_bytes=None)
    assert fake.fresh_asks == 3
    # failOnDataLoss=false: asked as often, then believed (the topic was recreated).
    p, fake = planner(tmp_path / "b", {tp: 10}, failondataloss="false")
    assert p.next_end({tp: 50}, latest={tp: 10}, max_records=None, max_bytes=None) == {tp: 10}
    assert fake.fresh_asks == 3
