"""The source's group commits run on the committer's thread (``Clusters.commit_group_soon``):
in order, at most one under way, a denial raised at the next commit, the last one waited for
by ``close``. No broker: ``commit_group`` itself is replaced (its real round trips are the
integration tier's, test_cross_clients.py and test_kafka_source_recovery.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from connectors.core.errors import KafkaSourceError
from connectors.kafka.source.clusters import Clusters
from connectors.kafka.source.options import KafkaSourceOptions


def _clusters() -> Clusters:
    return Clusters(KafkaSourceOptions.from_options(
        {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}, batch=False))


def test_commits_run_in_order_one_at_a_time_and_close_waits_for_the_last() -> None:
    clusters, done, busy = _clusters(), [], threading.Lock()

    def slow(offsets: dict[Any, int]) -> None:
        assert busy.acquire(blocking=False), "two group commits under way at once"
        time.sleep(0.02)
        done.append(offsets)
        busy.release()

    clusters.commit_group = slow  # type: ignore[method-assign]
    started = time.perf_counter()
    clusters.commit_group_soon({("", "t", 0): 1})
    assert time.perf_counter() - started < 0.02  # the planner does not wait
    clusters.commit_group_soon({("", "t", 0): 2})
    clusters.commit_group_soon({("", "t", 0): 3})
    clusters.close()
    assert done == [{("", "t", 0): 1}, {("", "t", 0): 2}, {("", "t", 0): 3}]
    assert not [t for t in threading.enumerate() if t.name.startswith("eo-kafka-group")]


def test_a_denial_is_raised_at_the_next_commit() -> None:
    clusters = _clusters()

    def denied(offsets: dict[Any, int]) -> None:
        raise KafkaSourceError("eo_kafka: GROUP READ denied for group 'g'")

    clusters.commit_group = denied  # type: ignore[method-assign]
    clusters.commit_group_soon({("", "t", 0): 1})
    with pytest.raises(KafkaSourceError, match="GROUP READ denied"):
        clusters.commit_group_soon({("", "t", 0): 2})
    clusters.close()  # the second's denial: logged, not raised, on stop
